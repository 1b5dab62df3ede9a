"""Records a Session publishes: one `StepRecord` per optimizer step, and `Event`s.

Plain dataclasses with `to_dict()`, so panels, the CLI (JSON lines) and the advisor
read the same thing. "Not known" is `None`, never -1.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any

from workbench.display import Display, Readable, fmt_bytes, fmt_number, fmt_seconds
from workbench.inputs import shown


@dataclass(frozen=True)
class StepRecord(Readable):
    """One optimizer step: what it measured and the settings it ran with. `str(record)`
    and a notebook show it as a table with units; `to_dict()` gives the raw numbers."""

    step: int  # optimizer steps completed, 1-based
    micro_steps: int  # micro-batches in this optimizer step (= grad_accum used)
    # mean loss over the micro-batches of this step; None when an observer could not read it
    loss: float | None
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
    zero_stage: int  # the stage the engine itself ran this step with (its own, not the config)
    fsdp: str = "off"  # PyTorch FSDP's sharding mode ("off" without FSDP)
    world_size: int = 1
    rank: int = 0
    clip_grad_norm: float | None = None
    activation_checkpointing: str = "none"  # none, selective, full
    num_workers: int = 0
    changes: dict[str, Any] = field(default_factory=dict)  # settings applied at this step
    # the first step on a new engine (session start, a rebuild): carries one-off costs
    # (CUDA context and kernel selection, allocator growth, lazy optimizer state)
    warmup: bool = False
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
    # the parts of the loss, mean over the micro-batches, for a loss_fn that reports them
    # (`take_parts()`; distillation's {"soft": ..., "hard": ...}), else None
    loss_parts: dict[str, float] | None = None
    wall_time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> StepRecord:
        """A record from a value for every field, as the training step makes one each step:
        set directly, without the dataclass's per-field checks (a quarter of the cost). A
        mapping that misses a field, or has another, raises ValueError naming them."""
        if fields.keys() != _FIELD_NAMES:
            missing = sorted(_FIELD_NAMES - fields.keys())
            extra = sorted(fields.keys() - _FIELD_NAMES)
            raise ValueError(f"record fields: missing {missing}, unknown {extra}")
        record = object.__new__(cls)
        record.__dict__.update(fields)
        return record

    def _display(self) -> Display:
        share = self.data_seconds / self.step_seconds if self.step_seconds > 0 else 0.0
        speed = f"{self.samples_per_s:.1f} samples/s"
        if self.tokens_per_s is not None:
            speed += f", {self.tokens_per_s:,.0f} tokens/s"
        rows = [
            (
                "loss",
                ("unknown" if self.loss is None else fmt_number(self.loss))
                + ("  (step skipped)" if self.skipped else ""),
            ),
            *(
                [("loss parts", ", ".join(f"{k} {fmt_number(v)}" for k, v in parts.items()))]
                if (parts := self.loss_parts)
                else []
            ),
            *(
                [("warm-up", "first step on this engine: its time includes start-up")]
                if self.warmup
                else []
            ),
            ("throughput", speed),
            (
                "step time",
                f"{fmt_seconds(self.step_seconds)} (data {share:.0%}, compute "
                f"{fmt_seconds(self.compute_seconds)})",
            ),
            ("lr", fmt_number(self.lr)),
            ("grad norm", fmt_number(self.grad_norm)),
        ]
        if self.scale is not None:
            rows.append(("loss scale", fmt_number(self.scale)))
        batch = f"{self.micro_batch} x {self.grad_accum} accumulation"
        if self.world_size > 1:
            batch += f" x {self.world_size} ranks"
        rows += [
            (
                "settings",
                f"{self.precision}, "
                + (f"FSDP {self.fsdp}" if self.fsdp != "off" else f"ZeRO {self.zero_stage}")
                + f", micro-batch {batch}",
            ),
            (
                "model states",
                f"params {fmt_bytes(self.params_bytes)}, grads {fmt_bytes(self.grads_bytes)}, "
                f"optimizer {fmt_bytes(self.optimizer_bytes)}",
            ),
        ]
        if self.cuda_allocated_bytes is not None:
            rows.append(
                (
                    "CUDA memory",
                    f"{fmt_bytes(self.cuda_allocated_bytes)} allocated, peak "
                    f"{fmt_bytes(self.cuda_max_allocated_bytes)}, reserved "
                    f"{fmt_bytes(self.cuda_reserved_bytes)}",
                )
            )
        if self.rss_bytes is not None:
            rows.append(("process memory (RSS)", fmt_bytes(self.rss_bytes)))
        if self.gpu_util_percent is not None:
            rows.append(("GPU utilization", f"{self.gpu_util_percent:.0f}%"))
        if self.changes:
            rows.append(("changes applied", ", ".join(f"{k}={v}" for k, v in self.changes.items())))
        return Display(f"step {self.step}", rows)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """A record from `to_dict()`'s mapping (other keys ignored). Read from a file (a
        run's log, a checkpoint), every value must have its field's type: a ValueError
        names the first that does not, so a crafted line never becomes a record. An
        earlier record's `activation_checkpointing` True / False reads as "full" / "none"."""
        if not isinstance(data, dict):
            raise ValueError(f"record {shown(data)}: must be a mapping of record fields")
        kinds = _field_kinds()
        values = {}
        for key, value in data.items():
            if key not in kinds:
                continue
            if key == "activation_checkpointing" and isinstance(value, bool):
                value = "full" if value else "none"  # what earlier records wrote
            allowed, optional = kinds[key]
            if not (value is None and optional) and not _is_kind(value, allowed):
                raise ValueError(
                    f"record field {key}={shown(value)}: must be {' or '.join(allowed)}"
                    + (" or None" if optional else "")
                )
            values[key] = value
        return cls(**values)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(StepRecord))


def _is_kind(value: Any, allowed: tuple[str, ...]) -> bool:
    for kind in allowed:
        if kind == "bool" and isinstance(value, bool):
            return True
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind == "str" and isinstance(value, str):
            return True
        if kind.startswith("dict") and isinstance(value, dict):
            return all(isinstance(k, str) for k in value)
    return False


@functools.cache
def _field_kinds() -> dict[str, tuple[tuple[str, ...], bool]]:
    """Each StepRecord field's allowed kinds ("int", "float", ...) and whether None is
    allowed, read from the annotations."""
    kinds = {}
    for f in dataclasses.fields(StepRecord):
        parts = [p.strip() for p in str(f.type).split("|")]
        optional = "None" in parts
        kinds[f.name] = (tuple(p for p in parts if p != "None"), optional)
    return kinds


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
