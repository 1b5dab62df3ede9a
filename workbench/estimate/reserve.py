"""What the GPU holds beside the allocated peak: the CUDA context, NCCL's buffers and the
caching allocator's reserve, each derived from the setup (pure Python, no torch).

`torch.cuda.max_memory_allocated()` measures the allocated peak (`peak_bytes`); out of memory
happens against what the caching allocator has reserved from the driver, and nvidia-smi
shows that plus what the process holds outside the allocator. Three terms:

* **CUDA context** (`context_bytes`): the driver's per-process state and the kernels it has
  loaded, per GPU generation, with lazy module loading (`catalog.context_of`: each figure
  with its source, measured or assumed). Seen by nvidia-smi, not by torch.
* **NCCL's buffers** (`nccl_bytes`): each communicator of several ranks opens C channels
  and, per channel and peer it receives from, one buffer per protocol: Simple
  `NCCL_BUFFSIZE` (4 MiB default, `DEFAULT_BUFFSIZE (1 << 22)` in NCCL's src/init.cc and
  its environment-variable docs), LL128 4,915,200 bytes (120 x 640 x 8 steps x 8 bytes,
  `DEFAULT_LL128_BUFFSIZE`) and LL 524,288 bytes (8 x 512 x 8 steps x 16 bytes,
  `DEFAULT_LL_BUFFSIZE`). Counted: channels (`catalog.nccl_channels`, assumed per GPU) x 2
  peers (the ring's previous rank and the tree's parent/child) x the three buffers, for each
  parallel dimension of more than one rank (data, tensor, pipeline: one communicator each).
  Zero on one GPU. NCCL allocates them with cudaMalloc/cuMem, outside torch's allocator.
* **allocator reserve** (`allocator_bytes`): reserved minus allocated at the peak,
  fitted over dry runs whose allocation traces were replayed through the allocator model
  (`workbench.estimate.allocator`): `rounding_bytes + TRANSIENT_SHARE x transient bytes`
  (`allocator_reserve_from`). `rounding_bytes` is the segment rounding of the model states
  live at the peak, from the rules of PyTorch's caching allocator
  (c10/cuda/CUDACachingAllocator.cpp): a request is rounded to 512 bytes (kMinBlockSize);
  up to 1 MiB (kSmallSize) it is served from the small pool's 2 MiB segments (kSmallBuffer);
  below 10 MiB (kMinLargeAlloc) from 20 MiB segments (kLargeBuffer); from 10 MiB on from
  its own segment rounded up to 2 MiB (kRoundLarge); the allocator splits a cached segment
  for any request of its pool, so the blocks of each pool are packed together without gaps
  (`segments_bytes`). The model states are split per parameter tensor (the model's shapes;
  its optimizer's state tensors each). The transient bytes (`transient_bytes`) are the rest
  of the peak's terms (activations, the loss's, the backward's and the optimizer step's
  temporaries): what a step frees and makes again, leaving cached segments later requests
  cannot use (fragmentation), and their own rounding; the share of them is the fit.

`overhead_gib` given to `estimate_memory` replaces all three with one figure.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from workbench.config import Precision
from workbench.estimate.catalog import context_of, nccl_channels
from workbench.estimate.frozen import field_names, of_every_field
from workbench.estimate.inputs_check import EstimateInputs
from workbench.optimizers import row

_MIB = 1 << 20

#: The caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp, torch 2.x).
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to a multiple
SMALL_SIZE_BYTES = _MIB  # kSmallSize: requests up to this go to the small pool
SMALL_SEGMENT_BYTES = 2 * _MIB  # kSmallBuffer: the small pool's segments
MIN_LARGE_ALLOC_BYTES = 10 * _MIB  # kMinLargeAlloc: below this, a shared 20 MiB segment
LARGE_SEGMENT_BYTES = 20 * _MIB  # kLargeBuffer
ROUND_LARGE_BYTES = 2 * _MIB  # kRoundLarge: larger requests get their own segment

#: NCCL's default buffer per protocol, per channel and peer (NCCL src/init.cc):
#: Simple (NCCL_BUFFSIZE), LL128, LL.
NCCL_BUFFERS_BYTES = (1 << 22, 120 * 640 * 8 * 8, 8 * 512 * 8 * 16)
#: Peers one channel receives from (the ring's previous rank; the tree's parent or child).
NCCL_PEERS_PER_CHANNEL = 2


@dataclass(frozen=True)
class Reserve:
    """What one GPU holds beside the allocated peak (see the module docstring), in bytes.
    `given_bytes` is `overhead_gib` when given (then the three derived terms are 0 and it
    replaces them); `context_source` says where the context's figure comes from."""

    context_bytes: int
    nccl_bytes: int
    allocator_bytes: int
    given_bytes: int | None = None
    context_measured: bool = False
    context_source: str = ""
    #: the segment rounding of the tensors live at the peak (`rounding_reserve_bytes`), the
    #: first input of the fitted `allocator_bytes`
    rounding_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything beside the allocated peak (the estimate's `overhead_bytes`)."""
        if self.given_bytes is not None:
            return self.given_bytes
        return self.context_bytes + self.nccl_bytes + self.allocator_bytes

    @property
    def terms(self) -> dict[str, int]:
        """The named terms ("overhead_gib (given)" alone when given)."""
        if self.given_bytes is not None:
            return {"overhead_gib (given)": self.given_bytes}
        return {
            "CUDA context": self.context_bytes,
            "NCCL buffers": self.nccl_bytes,
            "allocator reserve": self.allocator_bytes,
        }


def segments_bytes(blocks: dict[int, int]) -> int:
    """The fewest segment bytes the live `blocks` ({block bytes: how many}) take under the
    caching allocator's rules (see the module docstring): each request rounded to 512
    bytes; from 10 MiB on, its own segment rounded up to 2 MiB; the blocks of 1-10 MiB
    packed together into 20 MiB segments and those up to 1 MiB into 2 MiB segments, with no
    gap between blocks (the allocator splits a cached segment for any request of its pool;
    a lower bound: a real step leaves gaps)."""
    large = mid = small = 0
    for size, count in blocks.items():
        if size <= 0 or count <= 0:
            continue
        r = -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
        if r >= MIN_LARGE_ALLOC_BYTES:
            large += count * (-(-r // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES)
        elif r > SMALL_SIZE_BYTES:
            mid += count * r
        else:
            small += count * r
    mid_segments = -(-mid // LARGE_SEGMENT_BYTES) * LARGE_SEGMENT_BYTES
    small_segments = -(-small // SMALL_SEGMENT_BYTES) * SMALL_SEGMENT_BYTES
    return large + mid_segments + small_segments


@lru_cache(maxsize=16)
def _counted(shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, int], ...], int]:
    counts = tuple(Counter(math.prod(s) for s in shapes).items())
    return counts, sum(n * k for n, k in counts)


#: The last shapes counted, found by identity: one estimate reads the same tuple at every
#: micro-batch it tries, and hashing a model's thousand shapes costs more than a lookup.
_LAST: list[Any] = [None, None]


def _element_counts(shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, int], ...], int]:
    """((elements, how many tensors have that many), all elements) of `shapes`."""
    if _LAST[0] is not shapes:
        _LAST[:] = [shapes, _counted(shapes)]
    return _LAST[1]  # type: ignore[no-any-return]


def _split(total: int, shapes: tuple[tuple[int, ...], ...], pieces: int) -> dict[int, int]:
    """`total` bytes split over the tensors of `shapes` in proportion to their elements,
    each `pieces` times: {block bytes: how many}."""
    counts, whole = _element_counts(shapes)
    blocks: dict[int, int] = {}
    if whole <= 0 or total <= 0:
        return blocks
    per = total / pieces
    for n, k in counts:
        size = math.ceil(per * n / whole)
        blocks[size] = blocks.get(size, 0) + pieces * k
    return blocks


def rounding_reserve_bytes(i: EstimateInputs, terms: dict[str, int]) -> int:
    """The segment rounding of the live tensors of `terms` (the peak's named terms): the
    segments they take minus their bytes (see the module docstring)."""
    shapes = i.parameter_shapes
    states = {"parameters": 1, "gradients": 1}
    states["optimizer states"] = max(1, len(row(i.optimizer).state_keys))
    arch = i.architecture
    width = 4 if i.precision is Precision.FP32 else 2
    hidden_block = 0
    if arch is not None:
        hidden_block = i.micro_batch * arch.seq_len * arch.hidden * width // i.tensor_parallel
    live: dict[int, int] = {}
    for name, value in terms.items():
        if value <= 0:
            continue
        if name in states and shapes:
            blocks = _split(value, shapes, states[name])
        elif name == "activations" and hidden_block > 0:
            n, rest = divmod(value, hidden_block)
            blocks = {hidden_block: n}
            if rest:
                blocks[rest] = blocks.get(rest, 0) + 1
        else:
            blocks = {value: 1}
        for size, n in blocks.items():
            live[size] = live.get(size, 0) + n
    return max(0, segments_bytes(live) - sum(size * n for size, n in live.items()))


#: The allocator reserve's share of the peak's transient bytes: fitted by
#: benchmarks/reserve_fit.py (least squares over 40 dry runs of the scaled tiny GPT and small
#: transformers Llama and GPT-2 models, each trace replayed through the allocator model;
#: every point in benchmarks/results/reserve_fit.json). Its error, |fitted - replayed
#: reserve| / the replayed reserved peak: 7.4% on average, 27.1% at most.
TRANSIENT_SHARE = 0.1449

_STATES = ("parameters", "gradients", "optimizer states")


def transient_bytes(terms: dict[str, int]) -> int:
    """The peak's bytes beside its model states: what a step frees and makes again (a
    negative term, torch.compile's activations not kept, is less of them)."""
    total = 0
    for k, v in terms.items():
        if k not in _STATES:
            total += v
    return max(0, total)


def allocator_reserve_from(rounding: int, transient: int) -> int:
    """The fitted allocator reserve: `rounding + TRANSIENT_SHARE x transient`."""
    return rounding + int(TRANSIENT_SHARE * transient)


def allocator_reserve_bytes(i: EstimateInputs, terms: dict[str, int]) -> int:
    """The allocator's reserve at the peak of named `terms` (the fitted form)."""
    states = {k: v for k, v in terms.items() if k in _STATES}
    return allocator_reserve_from(rounding_reserve_bytes(i, states), transient_bytes(terms))


def nccl_bytes(i: EstimateInputs) -> int:
    """NCCL's buffers on one GPU (see the module docstring): 0 on one GPU."""
    groups = sum(1 for n in (i.data_parallel, i.tensor_parallel, i.pipeline_parallel) if n > 1)
    channels = nccl_channels(i.gpu.name if i.gpu is not None else None)
    return groups * channels * NCCL_PEERS_PER_CHANNEL * sum(NCCL_BUFFERS_BYTES)


#: The last model states' rounding, with the shapes it was found for (by identity) and the
#: states and optimizer it was found for: the states do not change with the micro-batch, so
#: an estimate (which computes the peak at the micro-batches it tries for the largest that
#: fits) and a planner (many layouts of one model) round them once.
_LAST_ROUNDING: list[Any] = [None, None, 0]


def _states_rounding(i: EstimateInputs, states: dict[str, int]) -> int:
    """`rounding_reserve_bytes(i, states)` for the model-state terms `states`, remembered."""
    key = (tuple(states.items()), i.optimizer)
    if _LAST_ROUNDING[0] is i.parameter_shapes and _LAST_ROUNDING[1] == key:
        return int(_LAST_ROUNDING[2])
    value = rounding_reserve_bytes(i, states)
    _LAST_ROUNDING[:] = [i.parameter_shapes, key, value]
    return value


def allocator_at(i: EstimateInputs, terms: dict[str, int]) -> int:
    """`reserve_of(i, terms).allocator_bytes` (0 with `overhead_gib` given), without the
    rest of the `Reserve`: the search for the largest micro-batch that fits adds it to the
    context and NCCL's buffers, which the micro-batch does not change."""
    if i.overhead_gib is not None:
        return 0
    rounding = _states_rounding(i, {k: v for k, v in terms.items() if k in _STATES})
    return allocator_reserve_from(rounding, transient_bytes(terms))


def reserve_total_bytes(i: EstimateInputs, terms: dict[str, int]) -> int:
    """`reserve_of(i, terms).total_bytes`, without building the `Reserve`."""
    if i.overhead_gib is not None:
        return math.ceil(i.overhead_gib * (1 << 30))
    context = context_of(i.gpu.name if i.gpu is not None else None, lazy=i.lazy_loading)
    return context.bytes + nccl_bytes(i) + allocator_at(i, terms)


def reserve_of(i: EstimateInputs, terms: dict[str, int]) -> Reserve:
    """The reserve of checked inputs `i` whose peak has the named `terms`."""
    if i.overhead_gib is not None:
        return Reserve(0, 0, 0, given_bytes=math.ceil(i.overhead_gib * (1 << 30)))
    context = context_of(i.gpu.name if i.gpu is not None else None, lazy=i.lazy_loading)
    rounding = _states_rounding(i, {k: v for k, v in terms.items() if k in _STATES})
    return of_every_field(
        Reserve,
        _RESERVE_FIELDS,
        {
            "context_bytes": context.bytes,
            "nccl_bytes": nccl_bytes(i),
            "allocator_bytes": allocator_reserve_from(rounding, transient_bytes(terms)),
            "given_bytes": None,
            "context_measured": context.measured,
            "context_source": context.source,
            "rounding_bytes": rounding,
        },
    )


#: `Reserve`'s fields (`reserve_of` builds one in one step: `frozen.of_every_field`)
_RESERVE_FIELDS = field_names(Reserve)


__all__ = [
    "NCCL_BUFFERS_BYTES",
    "TRANSIENT_SHARE",
    "Reserve",
    "allocator_reserve_bytes",
    "allocator_at",
    "allocator_reserve_from",
    "nccl_bytes",
    "reserve_of",
    "reserve_total_bytes",
    "rounding_reserve_bytes",
    "segments_bytes",
    "transient_bytes",
]
