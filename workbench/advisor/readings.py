"""What the advisor's rules read: step records and monitor samples, checked and normalized.

`read_records` takes StepRecords (or dicts of their fields) from any source (a Session, an
observer, a run's log) and gives each as a `Rec` of the fields the rules read, one rank's
view, in step order; `read_samples` gives each monitor `Sample` as a `Reading` of the run's
GPU and the host's CPU. A field of the wrong type is a ValueError naming the record (or
sample) and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.inputs import shown

_NUMERIC_FIELDS = (
    "loss",
    "samples_per_s",
    "step_seconds",
    "data_seconds",
    "lr",
    "grad_norm",
    "scale",
    "rss_bytes",
    "cuda_allocated_bytes",
    "gpu_util_percent",
    "gpu_memory_used_bytes",
    "cpu_util_percent",
    "wall_time",
)
_INT_FIELDS = ("step", "micro_batch", "grad_accum", "world_size", "rank", "num_workers")


@dataclass(frozen=True)
class Rec:
    """The fields of a StepRecord the rules read, checked and normalized."""

    step: int
    loss: float | None
    samples_per_s: float | None
    step_seconds: float | None
    data_seconds: float | None
    lr: float | None
    grad_norm: float | None
    scale: float | None
    skipped: bool
    warmup: bool
    precision: str | None
    micro_batch: int | None
    grad_accum: int | None
    world_size: int
    rank: int
    zero_stage: int | None
    activation_checkpointing: bool
    num_workers: int | None
    clip_grad_norm: float | None
    changes: Mapping[str, Any]
    rss_bytes: float | None
    cuda_allocated_bytes: float | None
    gpu_util_percent: float | None
    gpu_memory_used_bytes: float | None
    cpu_util_percent: float | None
    wall_time: float | None

    @property
    def effective_batch(self) -> int | None:
        if self.micro_batch is None or self.grad_accum is None:
            return None
        return self.micro_batch * self.grad_accum * self.world_size


def get_field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_record(obj: Any, i: int) -> Rec:
    where = f"records[{i}]"
    if isinstance(obj, (str, bytes)) or obj is None:
        raise ValueError(f"{where}={shown(obj)}: must be a StepRecord or a dict of its fields")
    nums: dict[str, float | None] = {}
    for name in _NUMERIC_FIELDS:
        v = get_field(obj, name)
        if v is not None and not is_number(v):
            raise ValueError(f"{where}.{name}={shown(v)}: must be a number or None")
        nums[name] = None if v is None else float(v)
    ints: dict[str, int | None] = {}
    for name in _INT_FIELDS:
        v = get_field(obj, name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise ValueError(f"{where}.{name}={shown(v)}: must be an integer or None")
        ints[name] = v
    if ints["step"] is None:
        raise ValueError(f"{where}.step=None: every record needs its step number (an integer)")
    changes = get_field(obj, "changes") or {}
    if not isinstance(changes, Mapping):
        raise ValueError(f"{where}.changes={shown(changes)}: must be a dict of applied settings")
    precision = get_field(obj, "precision")
    zero = get_field(obj, "zero_stage")
    clip = get_field(obj, "clip_grad_norm")
    return Rec(
        step=ints["step"],
        loss=nums["loss"],
        samples_per_s=nums["samples_per_s"],
        step_seconds=nums["step_seconds"],
        data_seconds=nums["data_seconds"],
        lr=nums["lr"],
        grad_norm=nums["grad_norm"],
        scale=nums["scale"],
        skipped=bool(get_field(obj, "skipped")),
        warmup=bool(get_field(obj, "warmup")),
        precision=None if precision is None else str(precision),
        micro_batch=ints["micro_batch"],
        grad_accum=ints["grad_accum"],
        world_size=ints["world_size"] or 1,
        rank=ints["rank"] or 0,
        zero_stage=zero if isinstance(zero, int) else None,
        activation_checkpointing=get_field(obj, "activation_checkpointing")
        not in (None, False, "none"),
        num_workers=ints["num_workers"],
        clip_grad_norm=float(clip) if is_number(clip) else None,
        changes=changes,
        rss_bytes=nums["rss_bytes"],
        cuda_allocated_bytes=nums["cuda_allocated_bytes"],
        gpu_util_percent=nums["gpu_util_percent"],
        gpu_memory_used_bytes=nums["gpu_memory_used_bytes"],
        cpu_util_percent=nums["cpu_util_percent"],
        wall_time=nums["wall_time"],
    )


def read_records(records: Any) -> list[Rec]:
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise ValueError(
            f"records={shown(records)}: must be a sequence of StepRecord objects or dicts"
        )
    recs = [read_record(r, i) for i, r in enumerate(records)]
    if recs:  # one rank's view: several ranks' records would count every step twice
        rank = min(r.rank for r in recs)
        recs = [r for r in recs if r.rank == rank]
    return sorted(recs, key=lambda r: r.step)


@dataclass(frozen=True)
class Reading:
    """One monitor sample as the rules read it: the run's GPU, and the host's CPU."""

    util_percent: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    time: float | None = None
    cpu_util_percent: float | None = None


def read_samples(samples: Any, gpu_uuid: str | None = None) -> list[Reading]:
    if samples is None:
        return []
    if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, Iterable):
        raise ValueError(f"samples={shown(samples)}: must be a sequence of monitor Samples or None")
    out: list[Reading] = []
    for i, s in enumerate(samples):
        gpus = get_field(s, "gpus")
        if gpus is None or isinstance(gpus, (str, bytes)):
            raise ValueError(f"samples[{i}]={shown(s)}: must be a monitor Sample (with .gpus)")
        host: list[float | None] = []
        for n in ("time", "cpu_util_percent"):
            v = get_field(s, n)
            if v is not None and not is_number(v):
                raise ValueError(f"samples[{i}].{n}={shown(v)}: must be a number or None")
            host.append(None if v is None else float(v))
        g = pick_gpu(gpus, gpu_uuid)
        vals: list[float | None] = []
        for n in ("util_percent", "memory_used_bytes", "memory_total_bytes"):
            v = None if g is None else get_field(g, n)
            if v is not None and not is_number(v):
                raise ValueError(f"samples[{i}].gpus[0].{n}={shown(v)}: must be a number or None")
            vals.append(None if v is None else float(v))
        out.append(Reading(vals[0], vals[1], vals[2], host[0], host[1]))
    return out


def pick_gpu(gpus: Sequence[Any], uuid: str | None) -> Any:
    """The GPU with `uuid` (the one the run trains on), the first without a uuid."""
    if uuid is None:
        return gpus[0] if gpus else None
    for g in gpus:
        found = get_field(g, "uuid")
        if isinstance(found, str) and found.lower() == uuid.lower():
            return g
    return None


def read_model_dims(model_dims: Any) -> dict[str, int]:
    if model_dims is None:
        return {}
    if not isinstance(model_dims, Mapping):
        raise ValueError(
            f"model_dims={shown(model_dims)}: must be a dict like {{'hidden_size': 768}} or None"
        )
    out: dict[str, int] = {}
    for k, v in model_dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"model_dims[{shown(k)}]={shown(v)}: must be an integer >= 1")
        out[str(k)] = v
    return out
