"""Small stand-ins for a Session and a Sampler, deterministic and thread-free, so the
panels' logic can be driven step by step in tests."""

from __future__ import annotations

import time
from typing import Any

from workbench.config import TrainConfig
from workbench.monitor.types import GpuSample, Sample
from workbench.train.records import Event, StepRecord


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

    def memory(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else None
        measured = None
        if last is not None:
            measured = {
                "params_bytes": last.params_bytes,
                "grads_bytes": last.grads_bytes,
                "optimizer_bytes": last.optimizer_bytes,
            }
        return {
            "measured": measured,
            "predicted": {"params_bytes": 4000, "grads_bytes": 4000, "optimizer_bytes": 8000},
        }

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
