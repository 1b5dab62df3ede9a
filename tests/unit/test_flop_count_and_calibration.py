"""The one FLOP count (workbench.estimate.flops), MFU and HFU on the plans, the efficiency
from published runs, --mfu and --calibrate, and a pinned layout that cannot run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.estimate import estimate_memory
from workbench.estimate.flops import FlopCount, matmul_params
from workbench.planner import plan
from workbench.planner.efficiency import PUBLISHED, default_efficiency, measured_step

SMALL = {"model": "llama-3-8b", "gpu": "h100", "gpus": 8, "seq_len": 2048, "global_batch": 16}


def test_llama3_8b_counts_as_torchtitan_does() -> None:
    """torchtitan: 6 x (params - tok_embeddings) + 12 L H Q T; the output head counts."""
    e = estimate_memory(model="llama-3-8b", seq_len=8192, tokens=1)
    c = e.flop_count
    assert c is not None
    assert c.matmul_params == 8_030_261_248 - 128_256 * 4096
    assert c.model_per_token() == 6 * c.matmul_params + 12 * 32 * 4096 * 8192
    assert e.model_flops == pytest.approx(57.91e9, rel=1e-3)
    # a tied head is multiplied at the output: counted once; the lookup is not
    assert matmul_params(1000, vocab=10, hidden=4, tied=True) == 1000
    assert matmul_params(1000, vocab=10, hidden=4, tied=False) == 960


def test_recomputation_is_hardware_flops_not_model_flops() -> None:
    c = FlopCount(matmul_params=10**9, layers=16, attention_width=2048, seq_len=2048)
    core = 4 * 16 * 2048 * 2048
    assert c.hardware_per_token("none") == c.model_per_token()
    assert c.hardware_per_token("selective") == c.model_per_token() + core
    assert c.hardware_per_token("full") == c.model_per_token() + 2 * 10**9 + core
    assert c.model_per_token(trained_params=10**7) == 4 * 10**9 + 2 * 10**7 + 3 * core
    with pytest.raises(ValueError, match="recompute='some'"):
        c.recomputed_per_token("some")


def test_plans_print_mfu_and_hfu() -> None:
    r = plan(**SMALL)
    for p in r.plans:
        if p.settings["activation_checkpointing"] == "none":
            assert p.hfu == pytest.approx(p.mfu)
        else:
            assert p.hfu > p.mfu
        # the MFU is the one count's model FLOPs over the step
        count = FlopCount(8_030_261_248 - 128_256 * 4096, 32, 4096, 2048)
        model = count.model_per_token() * p.tokens_per_step
        assert p.mfu == pytest.approx(model / (p.step_seconds * 8 * p.time.peak_flops))
    head = r.text().splitlines()[2]
    assert "MFU" in head and "HFU" in head
    assert r.to_dict()["plans"][0]["hfu"] == r.best.hfu


def test_the_default_efficiency_is_the_median_of_published_runs() -> None:
    h100 = default_efficiency("h100-80gb")
    assert h100.value == pytest.approx(0.41, abs=0.005)
    assert all(r.source for r in PUBLISHED["h100-80gb"])
    assert default_efficiency("a100-80gb").value == pytest.approx(0.52, abs=0.005)
    assert "no published run" in default_efficiency("t4").source
    r = plan(**SMALL)
    assert r.efficiency == h100.value and "published runs" in r.text()
    given = plan(**SMALL, mfu=0.3)
    assert given.efficiency == 0.3 and "given (mfu=" in given.text()
    old = plan(**SMALL, efficiency=0.3)  # the older keyword still works
    assert old.best.step_seconds == given.best.step_seconds
    with pytest.raises(ValueError, match="mfu=0.3: give it or efficiency="):
        plan(**SMALL, mfu=0.3, efficiency=0.3)
    with pytest.raises(ValueError, match="mfu=1.5: more than 1 .*from 0.001 to 1"):
        plan(**SMALL, mfu=1.5)


def _records(tokens_per_s: float, n: int = 4) -> list[dict[str, object]]:
    return [
        {"type": "record", "step": i + 1, "tokens_per_s": tokens_per_s, "world_size": 8,
         "activation_checkpointing": "none", "precision": "amp-bf16", "warmup": i == 0}
        for i in range(n)
    ]  # fmt: skip


def test_calibrate_from_a_measured_step(tmp_path: Path) -> None:
    """A run of the planned model on 8 H100 at 40,000 tokens/s is 8 x 989.5 TFLOP/s x e /
    FLOPs a token: the efficiency the next ranking uses, said on the plan."""
    count = estimate_memory(model="llama-3-8b", seq_len=2048).flop_count
    assert count is not None
    expected = 40_000 * count.model_per_token() / (8 * 989.5e12)
    log = tmp_path / "log.jsonl"
    rows = _records(40_000.0)
    rows[0]["tokens_per_s"] = 1.0  # the warm-up step is not counted
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    r = plan(**SMALL, calibrate=log)
    assert r.efficiency == pytest.approx(expected, rel=1e-3)
    assert "measured from your step" in r.text()
    assert plan(**SMALL, calibrate=tmp_path).efficiency == r.efficiency  # the run folder
    assert plan(**SMALL, calibrate=rows[1]).efficiency == pytest.approx(expected, rel=1e-3)
    faster = plan(**SMALL, calibrate=_records(80_000.0))
    assert faster.best.time.compute == pytest.approx(r.best.time.compute / 2, rel=1e-6)


def test_calibrate_without_a_measured_step_says_where_one_comes_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "log.jsonl"
    empty.write_text('{"type": "event", "kind": "checkpoint"}\n', encoding="utf-8")
    with pytest.raises(
        ValueError, match="no step record in it; a measured step comes from a Session"
    ):
        plan(**SMALL, calibrate=empty)
    with pytest.raises(ValueError, match="no such file; a measured step comes from"):
        plan(**SMALL, calibrate=tmp_path / "nothing.jsonl")
    with pytest.raises(ValueError, match="calibrate=3: not a measured step"):
        plan(**SMALL, calibrate=3)
    with pytest.raises(ValueError, match="must be from 0.001 to 1"):
        plan(**SMALL, calibrate=_records(1e9))
    with pytest.raises(ValueError, match="give it or mfu="):
        plan(**SMALL, mfu=0.3, calibrate=_records(40_000.0))
    args = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "2048",
            "--global-batch", "16"]  # fmt: skip
    assert main([*args, "--calibrate"]) == 2
    assert "--calibrate: needs a measured step" in capsys.readouterr().err
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in _records(40_000.0)), encoding="utf-8")
    assert main([*args, "--calibrate", str(log)]) == 0
    assert "measured from your step" in capsys.readouterr().out
    assert main([*args, "--mfu", "0.35"]) == 0
    assert "efficiency 0.35: given" in capsys.readouterr().out


def test_a_pinned_layout_is_the_only_one_planned() -> None:
    pin = {"tp": 2, "pp": 1, "dp": 4, "engine": "full_shard", "micro_batch": 2,
           "checkpointing": "selective"}  # fmt: skip
    r = plan(**SMALL, pin=pin, offload=False)
    assert r.plans and all(
        (
            p.tp,
            p.pp,
            p.dp,
            p.engine,
            p.settings["micro_batch"],
            p.settings["activation_checkpointing"],
        )
        == (2, 1, 4, "full_shard", 2, "selective")
        for p in r.plans
    )
    assert plan(**SMALL, pin="tp=2,pp=1,dp=4,engine=full_shard,micro_batch=2,checkpointing=selective",
                offload=False).best.label() == r.best.label()  # fmt: skip


@pytest.mark.parametrize(
    ("pin", "message"),
    [
        ({"tp": 3}, "pin tp=3: must divide the 8 GPUs of a node"),
        ({"pp": 5}, "pin pp=5: must divide layers=32"),
        ({"tp": 2, "pp": 2, "dp": 4}, r"pin tp 2 x pp 2 x dp 4 = 16: must be the 8 GPUs"),
        ({"tp": 2, "pp": 2, "dp": 2, "micro_batch": 3}, r"must divide global_batch / dp = 16 / 2"),
        ({"dp": 3}, "pin dp=3: must divide the 8 GPUs"),
        ({"engine": "zero9"}, "pin engine='zero9': must be one of ddp"),
        ({"checkpointing": "half"}, "pin checkpointing='half': must be one of none"),
        ({"tp": 0}, "pin tp=0: must be an integer >= 1"),
        ({"ep": 2}, "pin='ep': not pinnable; allowed: tp"),
        ("tp8", "each pin is KEY=VALUE"),
        ({"engine": "zero3", "tp": 2}, "the Session does not train it: .*tensor parallelism"),
    ],
)
def test_a_pinned_layout_that_cannot_run_says_why(pin: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(**SMALL, pin=pin)


def test_the_command_pins_a_layout_and_says_why_one_cannot_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "2048",
            "--global-batch", "16", "--json"]  # fmt: skip
    assert main([*args, "--pin", "tp=2,pp=1,dp=4,engine=full_shard"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and {(p["tp"], p["pp"], p["dp"], p["engine"]) for p in plans} == {
        (2, 1, 4, "full_shard")
    }
    assert all("hfu" in p for p in plans)
    assert main([*args, "--pin", "pp=3"]) == 2
    assert "--pin pp=3: must divide layers=32" in capsys.readouterr().err


def test_calibrate_reads_a_bounded_tail_of_a_regular_file_only(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file; a measured step comes from"):
        plan(**SMALL, calibrate=fifo)  # refused, never waited on
    big = tmp_path / "log.jsonl"
    row = json.dumps(_records(40_000.0)[1]) + "\n"
    with big.open("w", encoding="utf-8") as f:  # 17 MiB of junk, then the steps
        f.write(("x" * 1023 + "\n") * (17 << 10))
        f.write(row * 4)
    r = plan(**SMALL, calibrate=big)
    assert "the tokens of 4 step(s) after warm-up over their seconds" in r.efficiency_source


def test_calibrate_takes_the_tokens_over_the_seconds_of_bursty_steps() -> None:
    """A loader that hands over its batches in bursts: of every five steps of 4,096 tokens,
    three take 0.02 s and two wait 0.18 s. The median step's rate is a fast step's 204,800
    tokens/s, which the run never sustains; its tokens over its seconds are 5 x 4,096 in
    0.42 s, 48,762 tokens/s, what the efficiency is made of."""
    count = estimate_memory(model="llama-3-8b", seq_len=2048).flop_count
    assert count is not None
    times = [1.5] + [0.02, 0.18, 0.02, 0.18, 0.02] * 2  # the warm-up step first
    rows = [
        {"type": "record", "step": i + 1, "tokens_per_s": 4096 / t, "step_seconds": t,
         "world_size": 8, "activation_checkpointing": "none", "precision": "amp-bf16",
         "warmup": i == 0}
        for i, t in enumerate(times)
    ]  # fmt: skip
    step = measured_step(rows)
    assert statistics.median(r["tokens_per_s"] for r in rows[1:]) == pytest.approx(204_800)
    assert step.tokens_per_s == pytest.approx(10 * 4096 / 0.84) and step.steps == 10
    r = plan(**SMALL, calibrate=rows)
    expected = step.tokens_per_s * count.model_per_token() / (8 * 989.5e12)
    assert r.efficiency == pytest.approx(expected, rel=1e-3)
    assert "48,762 tokens/s, the tokens of 10 step(s) after warm-up" in r.efficiency_source
    # steps that do not give their time count as steps of the same tokens: the same rate
    untimed = [{k: v for k, v in row.items() if k != "step_seconds"} for row in rows]
    assert measured_step(untimed).tokens_per_s == pytest.approx(step.tokens_per_s)
