"""Records a Session publishes: one `StepRecord` per optimizer step, and `Event`s.

Plain dataclasses with `to_dict()`, so panels, the CLI (JSON lines) and the advisor
read the same thing. "Not known" is `None`, never -1.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    step: int  # optimizer steps completed, 1-based
    micro_steps: int  # micro-batches in this optimizer step (= grad_accum used)
    loss: float  # mean loss over the micro-batches of this step
    samples_per_s: float
    tokens_per_s: float | None  # for token models, else None
    step_seconds: float  # wall time of the whole optimizer step
    data_seconds: float  # time waiting for the data loader
    compute_seconds: float  # forward + backward + optimizer
    lr: float
    grad_norm: float | None  # total norm before clipping; None when not computed
    scale: float | None  # loss scale (GradScaler / DeepSpeed fp16), None without scaling
    skipped: bool  # optimizer step skipped (overflow or non-finite loss)
    precision: str
    micro_batch: int
    grad_accum: int
    zero_stage: int
    world_size: int = 1
    rank: int = 0
    clip_grad_norm: float | None = None
    activation_checkpointing: bool = False
    num_workers: int = 0
    changes: dict[str, Any] = field(default_factory=dict)  # settings applied at this step
    # measured memory, bytes (None where not measurable on this device)
    params_bytes: int | None = None
    grads_bytes: int | None = None
    optimizer_bytes: int | None = None
    cuda_allocated_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    rss_bytes: int | None = None
    # latest hardware sample when a monitor is attached
    gpu_util_percent: float | None = None
    gpu_memory_used_bytes: int | None = None
    cpu_util_percent: float | None = None
    wall_time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Event:
    """Something the user should know: a fault, an applied or rolled-back change, advice."""

    kind: str  # e.g. "change", "change-failed", "nan-loss", "oom", "error", "checkpoint", "state"
    message: str
    step: int
    severity: str = "info"  # "info" | "warning" | "error"
    details: dict[str, Any] = field(default_factory=dict)
    wall_time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
