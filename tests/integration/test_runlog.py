"""The run's log: every record and event as JSON lines off the training thread,
TensorBoard scalars on request, a resumed run's lines, a bounded history."""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from pathlib import Path

import pytest

from workbench import Session, TrainConfig
from workbench.train import runlog
from workbench.train.history import RECENT_RECORDS, THINNED_BUCKETS
from workbench.train.records import Event


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_every_record_and_event_goes_to_the_log_from_the_writer_thread(tmp_path, tiny, monkeypatch):
    writers: set[str] = set()
    real_write = runlog.RunLog._write

    def spy(self, items):
        writers.add(threading.current_thread().name)
        real_write(self, items)

    monkeypatch.setattr(runlog.RunLog, "_write", spy)
    cfg = TrainConfig(micro_batch=2, checkpoint_dir=str(tmp_path))
    trainers: set[str] = set()
    with Session(cfg, model_options=tiny) as s:
        s.on_record(lambda r: trainers.add(threading.current_thread().name))
        s.run(3)
        s.update(grad_accum=2)
        s.start(2)
        s.wait()
        s.save_checkpoint()
        records = [r.to_dict() for r in s.history]
        events = [e.to_dict() for e in s.events]
        assert s.log_path == str(tmp_path / "log.jsonl")
    lines = _lines(tmp_path / "log.jsonl")
    assert [
        {k: v for k, v in x.items() if k != "type"} for x in lines if x["type"] == "record"
    ] == (records)
    assert [x["kind"] for x in lines if x["type"] == "event"] == [e["kind"] for e in events]
    assert "change" in [e["kind"] for e in events] and "checkpoint" in [e["kind"] for e in events]
    assert writers == {f"workbench-log-{s.id}"}  # never the training threads
    assert writers.isdisjoint(trainers) and len(trainers) == 2  # run() here, start() in one


def test_a_resumed_run_logs_again_after_its_checkpoint_and_the_newest_line_counts(tmp_path, tiny):
    cfg = TrainConfig(micro_batch=2, seed=1, checkpoint_dir=str(tmp_path))
    with Session(cfg, model_options=tiny) as a:
        a.run(2)
        a.save_checkpoint()
        a.run(3)  # steps 3-5, never saved: the run "crashes" here
    with Session.resume_from(tmp_path) as b:
        assert [r.step for r in b.history] == [1, 2]
        resumed = b.run(4)  # steps 3-6
    log_file = tmp_path / runlog.LOG_NAME
    steps = [x["step"] for x in _lines(log_file) if x["type"] == "record"]
    assert steps == [1, 2, 3, 4, 5, 3, 4, 5, 6]
    whole = runlog.read_records(log_file)
    assert [r.step for r in whole] == [1, 2, 3, 4, 5, 6]
    assert [r.wall_time for r in whole[2:]] == [r.wall_time for r in resumed]
    tail = runlog.tail_records(log_file, up_to_step=4, limit=3)
    assert [(r.step, r.wall_time) for r in tail] == [(r.step, r.wall_time) for r in whole[1:4]]
    assert [e.kind for e in runlog.read_events(log_file)].count("resumed") == 1


def test_tail_reads_back_across_blocks_and_skips_a_torn_line(tmp_path, tiny):
    cfg = TrainConfig(micro_batch=2, checkpoint_dir=str(tmp_path))
    with Session(cfg, model_options=tiny) as s:
        s.run(1)
        first = s.history[-1]
    log_file = tmp_path / runlog.LOG_NAME
    line = next(x for x in _lines(log_file) if x["type"] == "record")
    with open(log_file, "a") as f:  # 300 steps (many 64 KiB blocks), then a torn line
        for step in range(2, 302):
            f.write(json.dumps({**line, "step": step, "loss": float(step)}) + "\n")
        f.write(json.dumps({**line, "step": 302})[:40])
    tail = runlog.tail_records(log_file, up_to_step=10_000, limit=250)
    assert [r.step for r in tail] == list(range(52, 302))
    assert [r.step for r in runlog.tail_records(log_file, up_to_step=3, limit=9)] == [1, 2, 3]
    assert runlog.tail_records(log_file, up_to_step=1, limit=9)[0].loss == first.loss
    assert [r.step for r in runlog.read_records(log_file)][-1] == 301


def test_tensorboard_to_a_folder_of_its_own_and_its_errors(tmp_path, tiny, monkeypatch):
    with Session(TrainConfig(micro_batch=2), model_options=tiny, tensorboard=tmp_path / "tb") as s:
        s.run(1)
        assert s.log_path is None  # no run folder: no JSON lines, TensorBoard only
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    with pytest.raises(ValueError, match="tensorboard=True: needs a run folder"):
        Session(TrainConfig(micro_batch=2), model_options=tiny, tensorboard=True)
    with pytest.raises(ValueError, match="tensorboard=3: must be True, False or a folder path"):
        Session(TrainConfig(micro_batch=2), model_options=tiny, tensorboard=3)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'workbench\[tensorboard\]'"):
        Session(TrainConfig(micro_batch=2), model_options=tiny, tensorboard=tmp_path / "tb")


def test_the_log_follows_a_change_of_run_folder(tmp_path, tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.run(1)  # no run folder yet: nothing written
        s.update(checkpoint_dir=str(tmp_path / "a"))
        s.run(1)
        s.update(checkpoint_dir=str(tmp_path / "b"))
        s.run(1)
    steps = {
        d: [x["step"] for x in _lines(tmp_path / d / "log.jsonl") if x["type"] == "record"]
        for d in ("a", "b")
    }
    assert steps == {"a": [2], "b": [3]}


def test_a_failing_disk_does_not_stop_training(tmp_path, tiny, monkeypatch, caplog):
    """The disk fills after the log's first write: the Session trains every step it was
    asked for, the failure is said once on the `workbench` logger, waiting for the log
    (flush_log, close) does not hang, and the log keeps what was written before."""
    real_write = runlog.RunLog._write
    calls = []

    def fills_up(self, items):
        calls.append(len(items))
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        real_write(self, items)

    monkeypatch.setattr(runlog.RunLog, "_write", fills_up)
    cfg = TrainConfig(micro_batch=2, checkpoint_dir=str(tmp_path))
    with (
        caplog.at_level(logging.WARNING, logger="workbench"),
        Session(cfg, model_options=tiny) as s,
    ):
        s.run(1)
        s.flush_log()  # the first write went through
        records = s.run(20)
        s.flush_log()
        assert [r.step for r in records] == list(range(2, 22))
        assert all(math.isfinite(r.loss) for r in records)
        assert s.state == "idle" and s.step == 21
        assert not [e for e in s.events if e.kind == "error"]
    assert len(calls) > 1  # the disk really failed under the running session
    assert sum("No space left" in r.message for r in caplog.records) == 1  # said once
    logged = [x["step"] for x in _lines(tmp_path / "log.jsonl") if x["type"] == "record"]
    assert logged == [1]


def test_tensorboard_has_every_scalar_the_records_carry(tmp_path, tiny):
    """Every tag of `runlog.SCALARS` whose record field is a number is written with the
    records' values at their steps; a field a CPU run does not have (CUDA memory, GPU
    utilization, the loss scale) writes no tag; events go in as text."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = TrainConfig(micro_batch=2, checkpoint_dir=str(tmp_path), clip_grad_norm=1.0)
    with Session(cfg, model_options=tiny, tensorboard=True) as s:
        s.run(2)
        s.update(grad_accum=2)  # an event
        s.run(2)
        history = list(s.history)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    written, absent = set(), set()
    for tag, name in runlog.SCALARS.items():
        values = [getattr(r, name) for r in history]
        if all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            written.add(tag)
            got = acc.Scalars(tag)
            assert [e.step for e in got] == [r.step for r in history], tag
            assert [e.value for e in got] == pytest.approx(values, rel=1e-6), tag  # float32
        elif all(v is None for v in values):
            absent.add(tag)
    assert tags == written
    assert {"train/loss", "train/lr", "train/grad_norm", "memory/params_bytes"} <= written
    assert {"memory/cuda_allocated_bytes", "train/loss_scale"} <= absent
    assert written | absent == set(runlog.SCALARS)  # every tag judged, none half-written
    assert any(t.startswith("events/change") for t in acc.Tags()["tensors"])


#: the built-in MLP at its smallest: a step in about a millisecond
SMALL_MLP = {"in_features": 2, "hidden": 4, "depth": 1, "out_features": 1, "samples": 64}


def test_a_long_session_keeps_a_bounded_history_and_a_resumed_one_reloads_2048(tmp_path):
    """The history a Session builds itself (docs/checkpoints.md, "Memory on long runs"):
    the newest 2,048 records at full resolution, the older ones thinned into at most 1,024
    buckets; a run longer than 2,048 + 2 x 1,024 steps keeps fewer records than it
    published. The log has every step; a session resumed from the last checkpoint starts
    with the newest 2,048 records of the log up to its step."""
    steps = RECENT_RECORDS + 2 * THINNED_BUCKETS + 200
    assert (RECENT_RECORDS, THINNED_BUCKETS) == (2048, 1024)  # the figures the docs give
    cfg = TrainConfig(micro_batch=4, checkpoint_dir=str(tmp_path), seed=2)
    with Session(cfg, model="mlp", model_options=SMALL_MLP) as s:
        records = s.run(steps)
        history = s.history
        assert history.total == steps and history.thinned == steps - RECENT_RECORDS
        assert len(history) <= RECENT_RECORDS + 2 * THINNED_BUCKETS < steps
        assert history.stride >= 2  # the buckets ran out once and merged
        assert [r.step for r in history[-RECENT_RECORDS:]] == list(
            range(steps - RECENT_RECORDS + 1, steps + 1)
        )
        assert [r.step for r in history] == sorted({r.step for r in history})  # in order
        # the lowest loss of the run survives the thinning
        lowest = min(records, key=lambda r: r.loss)
        assert lowest in list(history)
        path = s.save_checkpoint()
    logged = runlog.read_records(tmp_path / runlog.LOG_NAME)
    assert [r.step for r in logged] == list(range(1, steps + 1))
    with Session.resume_from(path) as r:
        assert r.step == steps
        assert len(r.history) == r.history.total == RECENT_RECORDS
        assert [x.step for x in r.history] == list(range(steps - RECENT_RECORDS + 1, steps + 1))
        assert [x.loss for x in r.history] == [x.loss for x in records[-RECENT_RECORDS:]]


def test_close_on_the_writer_thread_itself_ends_it_after_writing_what_is_queued(tmp_path):
    """A dropped Session's finalizer closes its log on whichever thread the garbage collector
    ran, the writer's own included: there it cannot wait for itself."""
    log = runlog.RunLog(tmp_path / runlog.LOG_NAME, name="own")

    class ClosesTheLog:  # written as str() on the writer thread, as a finalizer runs there
        def __str__(self) -> str:
            log.close()
            return "closed"

    log.put(Event(kind="a", message="first", step=1, details={"x": ClosesTheLog()}))
    log.put(Event(kind="b", message="second", step=1))
    writer = next(t for t in threading.enumerate() if t.name == "workbench-log-own")
    writer.join()  # it ends
    closer = [t for t in threading.enumerate() if t.name == "workbench-log-own-close"]
    for t in closer:
        t.join()
    assert log.error is None
    assert [(e.kind, e.details) for e in runlog.read_events(log.path)] == [
        ("a", {"x": "closed"}),
        ("b", {}),
    ]
    assert log._file.closed
