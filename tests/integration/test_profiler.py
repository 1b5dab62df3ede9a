"""Session.profile(): operator table, phase shares, Chrome trace, memory split."""

from __future__ import annotations

import json
import time

import pytest

from workbench import Session, TrainConfig


def _wait_for(session: Session, condition, timeout: float = 60.0) -> None:
    """Poll `condition()` while the session trains; fail at once if the loop ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert session.state == "running", (session.state, session.events[-1:])
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_profile_returns_a_table_and_writes_a_trace(tmp_path, tiny):
    trace = tmp_path / "run.trace.json"
    with Session(TrainConfig(micro_batch=4, grad_accum=2), model_options=tiny) as s:
        s.run(1)
        result = s.profile(steps=2, trace_path=trace)
        assert s.state == "idle"
        assert s.step == 1 + 2 + 2  # wait + warmup + active steps are real steps
    assert result.steps == 2 and result.step_seconds > 0
    assert result.trace_path == str(trace)
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"workbench.forward", "workbench.backward", "workbench.optimizer"} <= names
    assert len(result.operators) > 5
    assert any(row.name in ("aten::mm", "aten::addmm", "aten::bmm") for row in result.operators)
    selfs = [row.self_cpu_seconds for row in result.operators]
    assert selfs == sorted(selfs, reverse=True)
    assert "Self CPU" in result.table
    shares = result.phase_shares
    assert set(shares) == {"data", "forward", "backward", "optimizer", "other"}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert shares["forward"] > 0 and shares["backward"] > 0 and shares["optimizer"] > 0
    assert result.memory_by_category is None
    assert any("record_memory=False" in n for n in result.notes)


def test_profile_memory_split(tiny):
    with Session(TrainConfig(micro_batch=4), model_options=tiny) as s:
        result = s.profile(steps=1, record_memory=True)
        params = s.backend.model_state_bytes().params_bytes
    split = result.memory_by_category
    assert split is not None, result.notes
    assert split["parameter"] == params
    assert split["activation"] > 0
    assert result.memory_peak_bytes == sum(split.values())


def test_profile_pauses_a_running_session_and_resumes_it(tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.start()
        _wait_for(s, lambda: s.step >= 2)
        result = s.profile(steps=1)
        assert s.state == "running"
        before = s.step
        _wait_for(s, lambda: s.step >= before + 2)
        s.stop()
    assert result.steps == 1


def test_profile_keeps_a_paused_run_paused(tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.start(optimizer_steps=1000)
        s.pause()
        s.profile(steps=1)
        assert s.state == "paused"
        s.resume()
        s.stop()


def test_profile_bad_input(tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="steps="):
                s.profile(steps=bad)
        with pytest.raises(ValueError, match="record_memory="):
            s.profile(steps=1, record_memory="yes")
        assert s.step == 0 and s.state == "idle"


class _AsyncDevice:
    """A simulated CUDA device: launching queues work and returns at once; the host waits
    for the queued work only when it synchronizes (`torch.cuda.synchronize`)."""

    def __init__(self) -> None:
        self.pending = 0.0

    def launch(self, seconds: float) -> None:
        self.pending += seconds

    def synchronize(self, device: object = None) -> None:
        time.sleep(self.pending)
        self.pending = 0.0


class _CudaLoop:
    """What profile_session needs of a Session, on a simulated CUDA device: each phase
    launches its kernels inside its labelled range; the host waits for them outside every
    range (reading the loss, the end of the step), as the real loop does on CUDA."""

    def __init__(self, device: _AsyncDevice) -> None:
        import contextlib

        import torch

        self.device = torch.device("cuda", 0)
        self.id, self.step = "fake", 0
        self._device = device
        self._label = contextlib.nullcontext
        self._callbacks: list = []

    def on_record(self, callback):
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    def phase_labels(self, label):
        import contextlib

        @contextlib.contextmanager
        def scope():
            self._label = label
            try:
                yield
            finally:
                self._label = contextlib.nullcontext

        return scope()

    def run(self, steps: int, progress: bool = False) -> None:
        for _ in range(steps):
            for phase, seconds in (("forward", 0.03), ("backward", 0.06), ("optimizer", 0.03)):
                with self._label(f"workbench.{phase}"):
                    self._device.launch(seconds)
            self._device.synchronize()  # the host waits here, outside every labelled range
            self.step += 1
            for callback in list(self._callbacks):
                callback(None)


def test_on_cuda_the_phase_split_holds_the_device_time_of_each_phase(monkeypatch, tmp_path):
    """The host launches a phase's kernels and waits for them outside the labelled
    ranges; the profiler's split still puts that time in forward / backward / optimizer,
    not in "other" (simulated asynchronous device)."""
    import torch

    from workbench.train.measure.profiler import profile_session

    device = _AsyncDevice()
    monkeypatch.setattr(torch.cuda, "synchronize", device.synchronize)
    result = profile_session(
        _CudaLoop(device), steps=2, record_memory=False, trace_path=tmp_path / "t.json"
    )
    shares = result.phase_shares
    assert shares["other"] < 0.2, shares
    assert shares["backward"] > shares["forward"] > 0.1, shares
    assert shares["optimizer"] > 0.1, shares


@pytest.mark.gpu
def test_on_a_gpu_the_phase_split_is_not_mostly_other(tiny):
    cfg = TrainConfig(micro_batch=32, device="cuda")
    with Session(cfg, model_options={**tiny, "hidden": 256, "seq_len": 128}) as s:
        s.run(1)
        result = s.profile(steps=3)
    shares = result.phase_shares
    assert shares["forward"] + shares["backward"] + shares["optimizer"] > shares["other"], shares
    assert shares["backward"] > 0 and shares["forward"] > 0, shares
