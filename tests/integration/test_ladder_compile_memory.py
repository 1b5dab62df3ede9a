"""The optimization ladder's torch.compile rung shows the memory compile saves, measured
and predicted, next to its speed (a real tiny ladder on this CPU), and the line itself from
given figures."""

from __future__ import annotations

from workbench import TrainConfig, ladder
from workbench.display import fmt_bytes
from workbench.train.ladder.report import RungPlan, RunMeasure, compile_memory_line, summarize

GPT = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16}


def _measure(measured: int, predicted: int) -> RunMeasure:
    return RunMeasure(
        (0.2, 0.1, 0.1),
        (3.0, 2.9, 2.8),
        1.0,
        memory_measured_bytes=measured,
        memory_predicted_bytes=predicted,
        memory_note="model states + one micro-batch's activations",
    )


def test_the_compile_rung_says_what_compile_saves_measured_and_predicted() -> None:
    plans = [
        RungPlan("baseline", {}, {"compile": False}, 1, 8, 3),
        RungPlan("+ torch.compile", {"compile": True}, {"compile": True}, 1, 8, 3),
    ]
    runs = [[_measure(10_000_000, 9_800_000)], [_measure(8_000_000, 7_600_000)]]
    compiled = summarize(plans, runs, setup={}).rungs[1]
    want = compile_memory_line(runs[0][0], runs[1][0], "baseline")
    assert want == (
        f"; memory vs baseline: saves {fmt_bytes(2_000_000)} measured, "
        f"saves {fmt_bytes(2_200_000)} predicted"
    )
    assert want in compiled.summary
    assert compile_memory_line(None, runs[1][0], "baseline") == "; memory not measured"


def test_a_tiny_ladder_with_a_compile_rung_shows_its_memory_beside_its_speed() -> None:
    result = ladder(
        [{"name": "baseline"}, {"name": "+ torch.compile", "compile": True}],
        "tiny-gpt",
        3,
        base=TrainConfig(micro_batch=4, seed=1),
        model_options=GPT,
        repeats=1,
        device="cpu",
    )
    base, compiled = result.rungs
    assert compiled.error is None and compiled.settings["compile"] is True
    assert "compile time" in compiled.summary  # its speed's one-off cost
    saved = base.memory_measured_bytes - compiled.memory_measured_bytes
    predicted = base.memory_predicted_bytes - compiled.memory_predicted_bytes
    assert predicted == 0  # tiny-gpt's GELU MLP: the partitioner drops none of the formula
    word = "saves" if saved >= 0 else "adds"
    assert f"memory vs baseline: {word} {fmt_bytes(abs(saved))} measured" in compiled.summary
    assert f"saves {fmt_bytes(0)} predicted" in compiled.summary
    assert "+ torch.compile" in str(result) and "memory vs baseline" in str(result)
