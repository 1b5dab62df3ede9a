"""The optimization ladder, run: every rung on the same samples (in this process and on two
ranks through the real launcher), progress that adds up, memory measured next to the
prediction, a target loss reported whether reached or not, and a cancel that stops it."""

from __future__ import annotations

import threading

import pytest

from tests.integration.ladder_factories import FAILING_BATCH
from workbench import TrainConfig, ladder
from workbench.train.ladder import LadderCancelled, LadderProgress

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 256}
BASE = TrainConfig(micro_batch=8, lr=1e-2, seed=3)


def run_order(seen: list[LadderProgress]) -> list[tuple[int, int]]:
    """(rung, repeat) in the order the runs started, from the progress reports."""
    order: list[tuple[int, int]] = []
    for p in seen:
        if not order or order[-1] != (p.rung_index, p.repeat):
            order.append((p.rung_index, p.repeat))
    return order


def test_a_tiny_ladder_in_this_process(no_leaked_threads) -> None:
    seen = []
    rungs = [
        {"name": "baseline"},
        {"name": "+ 1 loader worker", "num_workers": 1},
        {
            "name": "+ accumulation",
            "grad_accum": 2,
            "lr_scaling": "linear",
            "lr_schedule": "onecycle",
        },
    ]
    result = ladder(
        rungs,
        "mlp",
        4,
        target_loss=10.0,
        base=BASE,
        model_options=MLP,
        repeats=2,
        device="cpu",
        on_progress=seen.append,
    )
    base, workers, accum = result.rungs
    # same samples in the same order: a loader worker changes no loss
    assert workers.losses == base.losses and len(base.losses) == 4
    assert [r.samples for r in result.rungs] == [32, 32, 32]
    assert [(r.steps, r.effective_batch) for r in result.rungs] == [(4, 8), (4, 8), (2, 16)]
    assert accum.settings["lr"] == pytest.approx(2e-2) and accum.settings["total_steps"] == 2
    assert all(r.runs == 2 for r in result.rungs)
    for r in result.rungs:
        assert r.error is None
        assert r.samples_per_s_low <= r.samples_per_s <= r.samples_per_s_high
        assert r.speedup_low <= r.speedup <= r.speedup_high
        assert len(r.step_samples_per_s) == 2 * (r.steps - 1)  # every step after the first
        assert r.steps_to_target == 1 and r.time_to_target_seconds > 0  # 10.0 is reached at once
        assert r.memory_measured_bytes > 0 and r.memory_predicted_bytes > 0
        # the mlp has no activation prediction: model states, exact
        assert r.memory_measured_bytes == r.memory_predicted_bytes, r.memory_note
        assert r.memory_note.startswith("model states, counted from the tensors")
    assert base.verdict == "baseline" and {workers.verdict, accum.verdict} <= {
        "helped",
        "no gain",
        "slower",
    }
    assert seen[-1].done == seen[-1].total == 2 * (4 + 4 + 2)
    assert {p.rung for p in seen} == set(result.names)
    # interleaved: A B C, then C B A (a machine that drifts favours no rung)
    assert run_order(seen) == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    assert result.setup["samples"] == 32 and result.setup["repeats"] == 2
    assert "optimization ladder: mlp on cpu" in str(result)


def test_a_data_parallel_rung_through_the_launcher_sees_the_same_samples() -> None:
    rungs = [
        {"name": "baseline"},
        {"name": "micro-batch 16", "micro_batch": 16},
        {"name": "2 ranks x 8", "micro_batch": 8, "ranks": 2},
    ]
    result = ladder(
        rungs,
        "mlp",
        4,
        target_loss=1e-9,
        base=BASE,
        model_options=MLP,
        repeats=1,
        device="cpu",
        timeout=240,
    )
    base, wide, ranks = result.rungs
    assert ranks.error is None, ranks.error
    assert (ranks.ranks, ranks.effective_batch, ranks.steps) == (2, 16, 2)
    # the two ranks read disjoint halves of the same 16 samples one rank reads at once,
    # from the same initial weights: the mean of their losses is that rank's loss
    assert ranks.losses == pytest.approx(wide.losses, rel=1e-5)
    assert base.losses[0] != pytest.approx(wide.losses[0], rel=1e-5)
    assert ranks.memory_measured_bytes == ranks.memory_predicted_bytes  # model states per rank
    assert "model states per rank" in ranks.memory_note
    assert ranks.startup_seconds > 0 and any("launched with torchrun" in n for n in ranks.notes)
    # a target never reached is reported, not an error
    assert all(r.steps_to_target is None for r in result.rungs)
    assert str(result).count("not reached") == 3


def test_cancel_stops_the_ladder_at_the_next_step(no_leaked_threads) -> None:
    cancel = threading.Event()
    steps = []

    def progress(p) -> None:
        steps.append(p.done)
        if p.done >= 3:
            cancel.set()

    with pytest.raises(LadderCancelled):
        ladder(
            [{"name": "baseline"}, {"name": "+ accumulation", "grad_accum": 2}],
            "mlp",
            8,
            base=BASE,
            model_options=MLP,
            repeats=2,
            device="cpu",
            memory=False,
            on_progress=progress,
            cancel=cancel,
        )
    assert max(steps) == 3


FAILING = "tests.integration.ladder_factories:mlp_failing_at_batch_12"


def test_a_failing_rung_is_reported_and_the_others_run_on() -> None:
    """A rung whose model raises mid-run (a batch of 12) is reported as failed with the
    error, is not run again, and the rungs after it run every repeat: A B C, C A, A C
    (docs/ladder.md). Its steps not trained still count, so the progress ends at its
    total."""
    seen: list[LadderProgress] = []
    rungs = [
        {"name": "baseline"},
        {"name": "micro-batch 12", "micro_batch": FAILING_BATCH},
        {"name": "micro-batch 16", "micro_batch": 16},
    ]
    result = ladder(
        rungs, FAILING, 6, base=BASE, model_options=MLP, repeats=3, device="cpu",
        memory=False, on_progress=seen.append,
    )  # fmt: skip
    base, failed, wide = result.rungs
    assert failed.verdict == "failed" and failed.runs == 1
    assert failed.error is not None and f"boom: a batch of {FAILING_BATCH}" in failed.error
    assert failed.samples_per_s is None and failed.speedup is None
    assert (base.error, wide.error) == (None, None) and base.runs == wide.runs == 3
    assert len(wide.losses) == 3 and wide.speedup is not None
    # the rung after a failed one is compared with the last one that ran: the baseline
    assert wide.gain_measure == "samples/s" and wide.gain == pytest.approx(wide.speedup)
    assert run_order(seen) == [(0, 0), (1, 0), (2, 0), (2, 1), (0, 1), (0, 2), (2, 2)]
    assert seen[-1].done == seen[-1].total  # the failed rung's steps are counted as skipped
    assert "micro-batch 12: failed: " in str(result) and "boom" in str(result)


def test_a_failing_baseline_ends_the_ladder() -> None:
    """Every ratio is against the baseline: when it fails the ladder stops there, with
    the baseline's error, and no other rung runs."""
    seen: list[LadderProgress] = []
    rungs = [
        {"name": "baseline", "micro_batch": FAILING_BATCH},
        {"name": "micro-batch 16", "micro_batch": 16},
    ]
    with pytest.raises(RuntimeError, match=r"the baseline rung 'baseline' failed: .*boom"):
        ladder(
            rungs, FAILING, 8, base=BASE, model_options=MLP, repeats=2, device="cpu",
            memory=False, on_progress=seen.append,
        )  # fmt: skip
    assert run_order(seen) == [(0, 0)]
