"""Small stand-ins for a Session and a Sampler, deterministic and thread-free, so the
panels' logic can be driven step by step in tests."""

from __future__ import annotations

import time
from typing import Any

from workbench.config import TrainConfig
from workbench.monitor.types import GpuSample, Sample
from workbench.train.records import Event, StepRecord

#: The fake model's size: fp32 AdamW states of 1000 parameters are the records' 4000 /
#: 4000 / 8000 bytes, what the paper's accounting predicts for them.
N_PARAMS = 1000


def report(session: FakeSession, *, activation_bytes: int, **measured: int) -> Any:
    """A `MemoryReport` for the fake session's settings: measured model states from its
    newest record unless given, and `session.predict()` as the prediction."""
    from workbench.train.measure.memory import MemoryReport

    last = session.history[-1] if session.history else None
    cfg = session.config

    def field(name: str) -> int:
        if name in measured:
            return measured[name]
        return int(getattr(last, name, 0) or 0)

    return MemoryReport(
        params_bytes=field("params_bytes"),
        grads_bytes=field("grads_bytes"),
        optimizer_bytes=field("optimizer_bytes"),
        optimizer_step_counter_bytes=0,
        activation_bytes=activation_bytes,
        parameter_saved_bytes=0,
        activation_bytes_by_dtype={"float32": activation_bytes},
        micro_batch=int(cfg.micro_batch),
        precision=str(cfg.precision),
        optimizer=str(cfg.optimizer),
        activation_checkpointing=str(cfg.activation_checkpointing),
        world_size=1,
        n_params=N_PARAMS,
        cuda_max_allocated_bytes=None,
        peak_rss_bytes=None,
        predicted=session.predict(),
    )


class FakeSession:
    """Follows the Session contract the panels use: validated `update()` queued and applied
    at the next step, state machine, records, events, memory, checkpoints, profile."""

    def __init__(self, config: TrainConfig | None = None) -> None:
        self.config = config or TrainConfig()
        self.state = "idle"
        self.history: list[StepRecord] = []
        self.events: list[Event] = []
        self.pending: dict[str, Any] = {}
        self.updates: list[dict[str, Any]] = []
        self.checkpoints: list[str] = []
        self.run_id = "0123456789ab"  # Session.run_id: the run's own id
        self.error: str | None = None
        self.failure: str | None = None  # why the last run ended early (Session.failure)

    @property
    def pending_changes(self) -> dict[str, Any]:
        return dict(self.pending)

    def events_since(self, i: int) -> list[Event]:
        return list(self.events[i:])

    # settings
    def update(self, **changes: Any) -> None:
        # validated against the settings as they will be once the queue is applied
        self.config.replace(**{**self.pending, **changes})  # ValueError naming the field
        self.updates.append(dict(changes))
        self.pending.update(changes)

    # lifecycle
    def start(self) -> None:
        if self.state in ("running", "paused"):
            raise RuntimeError(f"session already started (state {self.state})")
        self.state = "running"

    def pause(self, wait: bool = True) -> None:
        if self.state != "running":
            raise RuntimeError(f"cannot pause: state {self.state}")
        self.state = "paused"

    def resume(self) -> None:
        if self.state != "paused":
            raise RuntimeError(f"cannot resume: state {self.state}")
        self.state = "running"

    def stop(self) -> None:
        if self.state not in ("running", "paused"):
            raise RuntimeError(f"cannot stop: state {self.state}")
        self.state = "stopped"

    def close(self) -> None:
        self.state = "closed"

    # the loop, by hand
    def step(self, loss: float = 1.0, data_seconds: float = 0.01, compute_seconds: float = 0.04):
        changes = dict(self.pending)
        if changes:
            self.config = self.config.replace(**changes)
            self.pending = {}
            self.events.append(Event("change", f"applied {changes}", len(self.history) + 1))
        c = self.config
        rec = StepRecord(
            step=len(self.history) + 1,
            micro_steps=c.grad_accum,
            loss=loss,
            samples_per_s=c.micro_batch * c.grad_accum / (data_seconds + compute_seconds),
            tokens_per_s=None,
            step_seconds=data_seconds + compute_seconds,
            data_seconds=data_seconds,
            compute_seconds=compute_seconds,
            lr=c.lr,
            grad_norm=1.0,
            scale=None,
            skipped=False,
            precision=str(c.precision),
            micro_batch=c.micro_batch,
            grad_accum=c.grad_accum,
            zero_stage=c.zero_stage,
            changes=changes,
            params_bytes=4000,
            grads_bytes=4000,
            optimizer_bytes=8000,
        )
        self.history.append(rec)
        return rec

    def records_since(self, i: int) -> list[StepRecord]:
        return list(self.history[i:])

    def predict(self, config: TrainConfig | None = None) -> Any:
        """The real prediction path (`workbench.prediction.predict_memory`) for a model of
        N_PARAMS parameters, as a Session of one rank gives it."""
        from workbench.prediction import predict_memory

        return predict_memory(config or self.config, N_PARAMS, 1)

    def memory(self) -> Any:
        """A real `MemoryReport`: model states as the last record measured them, the
        activations given to `report()`, the prediction from `predict()`."""
        return report(self, activation_bytes=2048)

    def save_checkpoint(self, path: str | None = None) -> str:
        if path is None and self.config.checkpoint_dir is None:
            raise ValueError("path=None: pass a file or directory, or set checkpoint_dir")
        self.checkpoints.append(path or str(self.config.checkpoint_dir))
        return f"{self.checkpoints[-1]}/step-{len(self.history)}.pt"

    def profile(self, steps: int = 3) -> str:
        return f"profiled {steps} steps"


def gpu_sample(t: float, util: float = 50.0, used: int = 10 << 30) -> Sample:
    gpu = GpuSample(
        index=0,
        name="Fake H100",
        util_percent=util,
        memory_used_bytes=used,
        memory_total_bytes=80 << 30,
        power_watts=300.0,
        power_limit_watts=700.0,
        temperature_c=55.0,
        sm_clock_mhz=1500.0,
        pcie_tx_bytes_per_s=None,
        pcie_rx_bytes_per_s=None,
        process_memory_bytes=None,
    )
    return Sample(t, "nvml", (gpu,), 10.0, 100.0, 1 << 30, 4 << 30, 16 << 30)


def host_sample(t: float, cpu: float = 25.0, reason: str = "no NVIDIA driver found") -> Sample:
    return Sample(t, "host", (), cpu, 90.0, 1 << 30, 8 << 30, 16 << 30, reason=reason)


class FakeSampler:
    def __init__(self, samples: list[Sample], source: str, reason: str | None = None) -> None:
        self.samples = samples
        self.source = source
        self.reason = reason
        self.closed = False

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def history(self, since: float | None = None) -> list[Sample]:
        return [s for s in self.samples if since is None or s.time > since]

    def close(self) -> None:
        self.closed = True


def now() -> float:
    return time.time()
