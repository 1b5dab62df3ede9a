"""Session on the real DeepSpeed engine in this process (CPU, gloo): ZeRO stages 0-3,
live stage switches at step boundaries, RSS over repeated switches, a failed engine
build, and teardown."""

from __future__ import annotations

import gc
import os
import threading

import psutil
import pytest
import torch

from workbench import Session, TrainConfig
from workbench.train.backends import deepspeed as zero
from workbench.train.backends.deepspeed import DeepSpeedBackend
from workbench.train.backends.plain import PlainBackend
from workbench.train.records import StepRecord

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 512}
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def config(**kw: object) -> TrainConfig:
    base: dict[str, object] = {"micro_batch": 8, "grad_accum": 2, "lr": 1e-2, "seed": 1}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def session(**kw: object) -> Session:
    return Session(config(**kw), model="mlp", model_options=dict(MLP))


def losses(records: list[StepRecord]) -> list[float]:
    return [r.loss for r in records]


def switch_after(s: Session, step: int, **changes: object) -> None:
    """Queue `changes` from the training thread right after record `step`: the loop is
    active then, so they are applied at the next step boundary."""

    def callback(record: StepRecord) -> None:
        if record.step == step:
            s.update(**changes)

    s.on_record(callback)


#: Optimizer steps of the reference run every comparison below reads a prefix of.
REF_STEPS = 10


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """Losses of a run that never switched: stage 0 (no engine). One rank in fp32, ZeRO only
    changes where states live, not the arithmetic, so every stage must follow this curve."""
    with session(zero_stage=0) as s:
        return losses(s.run(optimizer_steps=REF_STEPS))


def test_each_zero_stage_trains_in_this_process_on_the_same_curve(
    reference: list[float],
) -> None:
    for stage in (0, 1, 2, 3):
        with session(zero_stage=stage) as s:
            backend = s.backend
            if stage == 0:
                assert isinstance(backend, PlainBackend)
            else:
                assert isinstance(backend, DeepSpeedBackend)
                assert backend.engine.zero_optimization_stage() == stage
                assert torch.distributed.is_initialized()
                assert torch.distributed.get_world_size() == 1
            records = s.run(optimizer_steps=8)
            assert [r.zero_stage for r in records] == [stage] * 8
            assert all(r.world_size == 1 and not r.skipped for r in records)
            assert all(r.grad_norm is not None and r.grad_norm > 0 for r in records)
            first = records[0]
            assert first.params_bytes and first.grads_bytes and first.optimizer_bytes
            assert sum(losses(records[-3:])) < sum(losses(records[:3]))  # it learns
            assert losses(records) == pytest.approx(reference[:8], rel=1e-5, abs=1e-7), stage
        assert not torch.distributed.is_initialized()


def test_live_switches_while_running_match_a_run_that_never_switched(
    reference: list[float],
) -> None:
    """One run crosses plain -> ZeRO-2 -> ZeRO-3 -> ZeRO-1 -> plain at step boundaries."""
    plan = {2: 2, 4: 3, 6: 1, 8: 0}  # after record N: switch to this stage
    with session(zero_stage=0) as s:
        for step, to in plan.items():
            switch_after(s, step, zero_stage=to)
        engine_stages: list[int] = []  # read from the engine in the training thread
        s.on_record(lambda r: engine_stages.append(s.backend.zero_stage))
        s.start(optimizer_steps=REF_STEPS)
        assert s.wait(timeout=300) == "idle"
        records = s.history
        assert engine_stages == [0, 0, 2, 2, 3, 3, 1, 1, 0, 0]
        assert [r.zero_stage for r in records] == engine_stages  # records carry the engine's
        for i, r in enumerate(records):
            assert r.changes == ({"zero_stage": plan[i]} if i in plan else {}), i
        assert [e.kind for e in s.events if e.kind.startswith("change")] == ["change"] * 4
        assert s.config.zero_stage == 0 and isinstance(s.backend, PlainBackend)
        assert not torch.distributed.is_initialized()  # the last engine gave it back
        got = losses(records)
    # the first loss after each switch, and the ones after it
    assert got == pytest.approx(reference, rel=1e-5, abs=1e-7)


def test_update_between_runs_switches_offload_and_bf16_and_continues(
    reference: list[float],
) -> None:
    expected = reference[:5]
    with session(zero_stage=1) as s:
        got = losses(s.run(optimizer_steps=3))
        s.update(zero_stage=2, offload_optimizer="cpu")  # idle: applied before it returns
        assert s.config.offload_optimizer == "cpu" and s.config.zero_stage == 2
        recs = s.run(optimizer_steps=2)
        assert recs[0].changes == {"zero_stage": 2, "offload_optimizer": "cpu"}
        got += losses(recs)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)
        # bf16 changes the arithmetic: the same steps as the fp32 reference, to bf16's
        # precision (8 significant bits: the loss within 2% here; a restart from the
        # initial weights would be far off the reference's step-6 loss)
        s.update(precision="bf16", zero_stage=3, offload_optimizer="none")
        recs = s.run(optimizer_steps=2)
        assert recs[0].precision == "bf16" and recs[0].zero_stage == 3
        assert s.backend.engine.zero_optimization_stage() == 3
        assert losses(recs) == pytest.approx(reference[5:7], rel=0.02)
        n = sum(p.ds_numel for p in s.model.parameters())  # ZeRO-3: full size in ds_numel
        assert s.backend.model_state_bytes().params_bytes == 2 * n  # bf16 weights, one rank


def test_rss_after_ten_switches_stays_within_ten_percent_of_the_first() -> None:
    proc = psutil.Process()
    with session(zero_stage=1) as s:
        s.run(optimizer_steps=1)
        rss: list[int] = []
        stages = [2, 3, 1] * 4
        for i in range(10):
            s.update(zero_stage=stages[i])
            rec = s.run(optimizer_steps=1)[0]
            assert rec.zero_stage == stages[i] and rec.changes == {"zero_stage": stages[i]}
            gc.collect()
            rss.append(proc.memory_info().rss)
        assert torch.distributed.is_initialized()
    assert not torch.distributed.is_initialized()
    assert rss[-1] <= rss[0] * 1.10, [r // 2**20 for r in rss]


def test_failed_engine_build_keeps_the_old_engine_training(
    monkeypatch: pytest.MonkeyPatch, reference: list[float]
) -> None:
    expected = reference[:6]

    real_build = DeepSpeedBackend._build

    def build(self: DeepSpeedBackend, model: torch.nn.Module, state: object) -> None:
        if self.config.zero_stage == 3:
            raise RuntimeError("engine build failed on purpose")
        real_build(self, model, state)  # type: ignore[arg-type]

    with session(zero_stage=1) as s:
        old = s.backend
        monkeypatch.setattr(zero.DeepSpeedBackend, "_build", build)
        switch_after(s, 3, zero_stage=3)
        s.start(optimizer_steps=6)
        assert s.wait(timeout=300) == "idle"
        failed = [e for e in s.events if e.kind == "change-failed"]
        assert len(failed) == 1
        assert "engine build failed on purpose" in failed[0].message
        assert "zero_stage" in failed[0].message and failed[0].severity == "error"
        assert failed[0].details["changes"] == {"zero_stage": 3}
        assert s.backend is old and s.config.zero_stage == 1 and s.pending_changes == {}
        assert [r.zero_stage for r in s.history] == [1] * 6  # the old engine's own stage
        assert s.backend.engine.zero_optimization_stage() == 1
        # the step after the failed switch is the reference's step 4, and so on
        assert losses(s.history) == pytest.approx(expected, rel=1e-5, abs=1e-7)
        # when idle, the same failure raises at once and still changes nothing
        with pytest.raises(ValueError, match="engine build failed on purpose"):
            s.update(zero_stage=3)
        assert s.backend is old and s.config.zero_stage == 1
        assert torch.distributed.is_initialized()  # the failed build did not take the group
        assert len(s.run(optimizer_steps=1)) == 1
    assert not torch.distributed.is_initialized()


def test_close_leaves_no_process_group_threads_or_environment(no_leaked_threads) -> None:
    env = {k: os.environ.get(k) for k in DIST_ENV}
    threads = set(threading.enumerate())
    s = session(zero_stage=2)
    s.start()  # runs until closed
    s.update(zero_stage=3)  # a switch while running, so two engines were built
    while len(s.history) < 4:
        assert s.state == "running", s.events
        threading.Event().wait(0.05)
    s.close()
    s.close()  # idempotent
    assert s.state == "closed"
    assert not torch.distributed.is_initialized()
    assert {k: os.environ.get(k) for k in DIST_ENV} == env
    assert [t.name for t in threading.enumerate() if t not in threads and t.is_alive()] == []
    assert any(r.zero_stage == 3 for r in s.history)


@pytest.mark.parametrize(("stage", "accum"), [(1, 1), (3, 1), (1, 2), (2, 2)])
def test_session_memory_matches_deepspeed_accounting(stage: int, accum: int) -> None:
    """In one process the Session's measured model states equal the estimator's
    "deepspeed" accounting (ZeRO-3 parameters are partitioned: counted by ds_numel), also
    with accumulation (the memory probe stops between micro-batches)."""
    from workbench.models import build_model

    config = TrainConfig(zero_stage=stage, micro_batch=4, grad_accum=accum)
    with Session(config, model="mlp") as s:
        s.run(optimizer_steps=1)
        report = s.memory()
    predicted = report.predicted
    assert predicted is not None, report.notes
    assert predicted.accounting == "deepspeed"
    assert report.n_params == sum(p.numel() for p in build_model("mlp")[0].parameters())
    assert report.params_bytes == predicted.params_bytes
    assert report.grads_bytes == predicted.grads_bytes
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == predicted.optimizer_bytes
