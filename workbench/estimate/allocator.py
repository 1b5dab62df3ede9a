"""A dry run's allocation trace and a model of PyTorch's CUDA caching allocator replaying it.

Pure: imports no torch. `AllocTrace` holds the ordered allocations and frees of a dry run's
steps (`AllocEvent`: sizes, stream, step, phase, module, category, operator), recorded by
`workbench.train.dry_run.step`. The allocator model follows the caching allocator below.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit if unit > 1 else n


# ---------------------------------------------------------------------- the trace
#: The events' kinds: a storage made ("alloc") and a storage released ("free").
EVENT_KINDS = ("alloc", "free")

#: The streams a dry run files allocations on: the compute stream and FSDP2's all-gather
#: and reduce-scatter streams (the caching allocator keeps each stream's blocks apart).
COMPUTE_STREAM, ALL_GATHER_STREAM, REDUCE_SCATTER_STREAM = 0, 1, 2


@dataclass(frozen=True)
class AllocEvent:
    """One allocation or free of a step, in order.

    `kind`: "alloc" or "free". `nbytes`: the bytes the storage asked for (before the
    allocator's rounding; a free repeats its allocation's). `block`: the storage's id in
    this trace (an allocation and its free share it). `stream`: the stream it was made on
    (`COMPUTE_STREAM`, `ALL_GATHER_STREAM`, `REDUCE_SCATTER_STREAM`). `step`: the training
    step (0 first; -1 before the steps: the model and batch). `phase`: "setup",
    "forward", "backward" or "optimizer step". `module`: the innermost module running when
    it was made (its qualified name; None outside every module). `category`: the dry run's
    category of the storage (`DryRun.by_category`'s names: "parameters", "gradients",
    "activations", ...; the last one the memory tracker filed it under). `op`: the
    operator that made it (e.g. "aten.mm.default"; None for tensors made outside an
    operator: parameters, the batch)."""

    kind: str
    nbytes: int
    block: int
    stream: int
    step: int
    phase: str
    module: str | None
    category: str
    op: str | None


@dataclass(frozen=True)
class AllocTrace:
    """The ordered allocations and frees of a dry run on one rank (`events`), on `device`
    ("cuda" or "cpu": the device simulated). Storages alive at the end have no free."""

    events: tuple[AllocEvent, ...]
    device: str = "cuda"

    def allocated_bytes(self, rounding: int = 512) -> list[int]:
        """The bytes allocated after each event, each storage rounded up to `rounding` as
        the caching allocator rounds it (1: the exact bytes)."""
        now = 0
        out: list[int] = []
        for e in self.events:
            size = _round_up(e.nbytes, rounding)
            now += size if e.kind == "alloc" else -size
            out.append(now)
        return out

    def allocated_peak_bytes(self, rounding: int = 512) -> int:
        """The highest of `allocated_bytes()` (0 for an empty trace)."""
        return max(self.allocated_bytes(rounding), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "events": [asdict(e) for e in self.events]}


__all__ = [
    "ALL_GATHER_STREAM",
    "COMPUTE_STREAM",
    "EVENT_KINDS",
    "REDUCE_SCATTER_STREAM",
    "AllocEvent",
    "AllocTrace",
]
