"""A dry run's allocation trace, and a model of PyTorch's CUDA caching allocator replaying it.

    from workbench.estimate.allocator import replay, best_setting
    r = replay(run.trace)                              # run: a DryRun
    r.reserved_peak_bytes, r.fragmentation_bytes       # what torch.cuda would reserve
    replay(run.trace, "expandable_segments:True")      # under another PYTORCH_CUDA_ALLOC_CONF
    best_setting(run.trace)                            # the setting that lowers it most

Pure: imports no torch. `AllocTrace` holds the ordered allocations and frees of a dry run's
steps (`AllocEvent`), recorded by `workbench.train.dry_run.step`. `replay` runs them
through `CachingAllocator`, a model of the native CUDA caching allocator of torch 2.13
(c10/cuda/CUDACachingAllocator.cpp, `DeviceCachingAllocator`; the constants and settings of
c10/core/AllocatorConfig.h and c10/cuda/CUDAAllocatorConfig.h):

* `round_size`: every request rounds up to a multiple of 512 bytes (kMinBlockSize), or to
  the next of `roundup_power2_divisions` divisions of its power-of-two interval
  (`roundup_power2_next_division`).
* `get_pool`: a request of up to 1 MiB (kSmallSize) comes from the small pool, a larger one
  from the large pool; each pool keeps each stream's blocks apart.
* `get_allocation_size`: a new segment is 2 MiB (kSmallBuffer) for the small pool, 20 MiB
  (kLargeBuffer, `large_segment_size_mb`) for a request below 10 MiB (kMinLargeAlloc), else
  the request rounded up to 2 MiB (kRoundLarge).
* `get_free_block`: best fit, the smallest free block of the pool and stream that holds the
  request (lowest address among equals: `BlockComparatorSize`); a block of `max_split_size`
  or more (an oversize block) serves no request below `max_split_size`, and a request of
  `max_split_size` or more only a block less than `max_non_split_rounding_mb` (20 MiB)
  larger.
* `should_split`: the found block splits when the rest is 512 bytes or more (small pool,
  or expandable segments), or, in the large pool, when the request is below
  `max_split_size` and the rest more than 1 MiB; the rest goes back to the pool.
* `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours of the
  same segment.
* `malloc`'s retries: no free block fits -> `garbage_collect_cached_blocks` (only with
  `garbage_collection_threshold` and a memory fraction, torch's `set_fraction`: frees
  whole cached large segments of at least the average age until the reserve is below
  threshold x the limit) -> `alloc_block` (a new segment; fails past the capacity) ->
  `release_available_cached_blocks` (with `max_split_size`: frees oversize cached
  segments, the smallest large enough, else the largest first) and `alloc_block` again ->
  `release_cached_blocks` (frees every whole cached segment) and `alloc_block` a last
  time -> out of memory.
* `expandable_segments:True` (`try_allocate_expandable_block`, `find_expandable_block`,
  `map_block`, `unmap_block`): one segment per pool and stream that maps pages (2 MiB
  small, 20 MiB large) at its lowest free address as it grows; releasing unmaps whole
  free pages.

Not modelled: cross-stream uses (`record_stream`'s events: a dry run's frees are
immediate), CUDA graphs' private pools, IPC, the cudaMallocAsync backend, and where
cudaMalloc puts a segment (new segments take rising addresses). `parse_alloc_conf` reads
a `PYTORCH_CUDA_ALLOC_CONF` string with torch's rules and ranges
(AcceleratorAllocatorConfig's parsers); a key it does not know or a value out of range is
an `AllocatorConfigError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any

from workbench.estimate.allocator_conf import (
    IGNORED_KEYS,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    MIB,
    MODELLED_KEYS,
    POW2_INTERVALS,
    POW2_START_LOG,
    AllocatorConfigError,
    AllocatorSettings,
    parse_alloc_conf,
    with_setting,
)


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


# ---------------------------------------------------------------------- the allocator
class _Block:
    __slots__ = (
        "size",
        "ptr",
        "stream",
        "small",
        "allocated",
        "prev",
        "next",
        "mapped",
        "expandable",
        "base",
        "origin",
    )

    def __init__(self, size: int, ptr: int, stream: int, small: bool) -> None:
        self.size = size
        self.ptr = ptr
        self.stream = stream
        self.small = small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.mapped = True
        self.expandable = False
        self.base = 0  # the pool's get_free_block count when it was cached (GC's age)
        self.origin = ptr  # the segment's first address (pages count from it)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """A BlockPool: the free mapped blocks ordered by (stream, size, address), and an
    expandable segment's unmapped ranges by (stream, address)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}
        self.unmapped: list[tuple[int, int]] = []
        self.unmapped_blocks: dict[tuple[int, int], _Block] = {}
        self.calls = 0  # get_free_blocks_call_count

    def insert(self, b: _Block) -> None:
        key = (b.stream, b.size, b.ptr)
        bisect.insort(self.keys, key)
        self.blocks[key] = b
        b.base = self.calls

    def erase(self, b: _Block) -> None:
        key = (b.stream, b.size, b.ptr)
        del self.blocks[key]
        del self.keys[bisect.bisect_left(self.keys, key)]

    def insert_unmapped(self, b: _Block) -> None:
        key = (b.stream, b.ptr)
        bisect.insort(self.unmapped, key)
        self.unmapped_blocks[key] = b

    def erase_unmapped(self, b: _Block) -> None:
        key = (b.stream, b.ptr)
        del self.unmapped_blocks[key]
        del self.unmapped[bisect.bisect_left(self.unmapped, key)]


class _NoPages(Exception):
    """map_block failed: the pages would pass the capacity."""


class OutOfMemory(Exception):
    """The model ran out of `capacity_bytes` after freeing every cached segment."""


class CachingAllocator:
    """The caching allocator's bookkeeping for one device (see the module docstring):
    `malloc(nbytes, stream)` returns a handle, `free(handle)` gives it back;
    `allocated_bytes` (the blocks in use, as torch.cuda.memory_allocated counts them),
    `reserved_bytes` (the segments held, torch.cuda.memory_reserved) and their peaks.
    `capacity_bytes` (None: unlimited) is the device memory the allocator may take
    (times `per_process_memory_fraction` where set); past it, after the frees and
    retries, `malloc` raises `OutOfMemory`."""

    def __init__(
        self, settings: AllocatorSettings | None = None, capacity_bytes: int | None = None
    ) -> None:
        self.settings = settings or AllocatorSettings()
        fraction = self.settings.memory_fraction
        self.limit = (
            None
            if capacity_bytes is None
            else int(capacity_bytes * fraction)
            if fraction is not None
            else capacity_bytes
        )
        self.gc = (
            self.settings.garbage_collection_threshold > 0
            and fraction is not None
            and self.limit is not None
        )
        self.small = _Pool(True)
        self.large = _Pool(False)
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.allocated_peak_bytes = 0
        self.reserved_peak_bytes = 0
        self.segments = 0
        self.retries = 0
        self.gc_freed_bytes = 0
        self._next_ptr = 1 << 40
        self._expandable: dict[tuple[bool, int], _Block] = {}

    # -------------------------------------------------------------- sizes (round_size ...)
    def round_size(self, size: int) -> int:
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        divisions = self._divisions(size)
        if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
            return _roundup_power2_next_division(size, divisions)
        return _round_up(size, K_MIN_BLOCK_SIZE)

    def _divisions(self, size: int) -> int:
        index = max(0, size.bit_length() - 1 - POW2_START_LOG)
        return self.settings.roundup_power2_divisions[min(index, POW2_INTERVALS - 1)]

    def allocation_size(self, size: int) -> int:
        """get_allocation_size: a new segment's bytes for a rounded request."""
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return self.settings.large_segment_bytes
        return _round_up(size, K_ROUND_LARGE)

    def _pool(self, size: int) -> _Pool:
        return self.small if size <= K_SMALL_SIZE else self.large

    # -------------------------------------------------------------- malloc
    def malloc(self, nbytes: int, stream: int = 0) -> _Block:
        size = self.round_size(max(int(nbytes), 0))
        pool = self._pool(size)
        block = self._get_free_block(pool, size, stream)
        if block is None:
            if self.gc:
                self._garbage_collect()
            block = (
                self._alloc_block(pool, size, stream)
                or (
                    self._release_available(pool, size, stream)
                    and self._alloc_block(pool, size, stream)
                )
                or self._release_all_and_retry(pool, size, stream)
            )
            if not isinstance(block, _Block):
                raise OutOfMemory(
                    f"tried to allocate {size} bytes with {self.reserved_bytes} reserved "
                    f"and {self.allocated_bytes} allocated (limit {self.limit})"
                )
        block = self._alloc_found_block(pool, block, size)
        return block

    def _release_all_and_retry(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        self._release_cached_blocks()
        self.retries += 1
        return self._alloc_block(pool, size, stream)

    def _get_free_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """get_free_block: best fit, with the oversize rules."""
        s = self.settings
        if self.gc:
            pool.calls += 1
        i = bisect.bisect_left(pool.keys, (stream, size, -1))
        if i == len(pool.keys) or pool.keys[i][0] != stream:
            return None
        b = pool.blocks[pool.keys[i]]
        if b.expandable and s.expandable_segments:
            # best fit counts what a block followed by unmapped space can grow to
            def grows(x: _Block) -> int:
                nxt = x.next
                return x.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

            j = i + 1
            while (
                b.expandable
                and j < len(pool.keys)
                and pool.keys[j][0] == stream
                and grows(pool.blocks[pool.keys[j]]) < grows(b)
            ):
                b = pool.blocks[pool.keys[j]]
                j += 1
        if size < s.max_split and b.size >= s.max_split:
            return None  # no oversize block for a request below max_split_size
        if size >= s.max_split and b.size >= size + s.max_non_split_rounding_bytes:
            return None  # an oversize block only within max_non_split_rounding
        pool.erase(b)
        return b

    def _should_split(self, b: _Block, size: int) -> bool:
        remaining = b.size - size
        if b.small or self.settings.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.settings.max_split and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, pool: _Pool, b: _Block, size: int) -> _Block:
        if self._should_split(b, size):
            rest = _Block(b.size - size, b.ptr + size, b.stream, b.small)
            rest.expandable, rest.origin = b.expandable, b.origin
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = size
            pool.insert(rest)
        b.allocated = True
        self.allocated_bytes += b.size
        self.allocated_peak_bytes = max(self.allocated_peak_bytes, self.allocated_bytes)
        return b

    def _reserve(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self.reserved_peak_bytes = max(self.reserved_peak_bytes, self.reserved_bytes)

    def _alloc_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """alloc_block: a new segment (or, expandable, new pages) within the limit."""
        alloc = self.allocation_size(size)
        if self.limit is not None and self.reserved_bytes + alloc > self.limit:
            return None  # torch checks the segment's size, expandable or not
        if self.settings.expandable_segments:
            try:
                return self._allocate_expandable(pool, size, stream)
            except _NoPages:  # the device has no more pages to map
                return None
        b = _Block(alloc, self._next_ptr, stream, pool.small)
        self._next_ptr += _round_up(alloc, K_ROUND_LARGE)
        self.segments += 1
        self._reserve(alloc)
        return b

    # -------------------------------------------------------------- freeing
    def free(self, b: _Block) -> None:
        """free_block: the block back to its pool, merged with free neighbours."""
        if not b.allocated:
            raise ValueError("block freed twice")
        b.allocated = False
        self.allocated_bytes -= b.size
        pool = self.small if b.small else self.large
        for other in (b.prev, b.next):
            self._merge(b, other, pool)
        pool.insert(b)

    def _merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> None:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _release_block(self, pool: _Pool, b: _Block) -> None:
        pool.erase(b)
        self.reserved_bytes -= b.size
        self.segments -= 1

    def _release_available(self, pool: _Pool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: oversize cached segments, the smallest that is
        large enough, else the largest first until enough is freed."""
        s = self.settings
        if s.max_split_size_bytes is None:
            return False
        key = max(size, s.max_split)
        i = bisect.bisect_left(pool.keys, (stream, key, -1))
        if i < len(pool.keys) and pool.keys[i][0] == stream:
            b = pool.blocks[pool.keys[i]]
            if b.expandable or b.is_split():
                return False
            self._release_block(pool, b)
            return True
        released = 0
        j = i - 1
        while j >= 0 and released < key:
            b = pool.blocks[pool.keys[j]]
            if b.stream != stream or b.size < s.max_split:
                break
            if not b.expandable and not b.is_split():
                released += b.size
                self._release_block(pool, b)
            j -= 1
        return released >= key

    def _release_cached_blocks(self) -> None:
        """release_cached_blocks: every whole cached segment freed, every free page of an
        expandable segment unmapped."""
        for pool in (self.large, self.small):
            for key in list(pool.keys):
                b = pool.blocks.get(key)
                if b is None:
                    continue
                if b.expandable:
                    self._unmap(pool, b)
                elif not b.is_split():
                    self._release_block(pool, b)

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: whole cached large segments of at least the
        average age freed until the reserve is below threshold x limit."""
        assert self.limit is not None
        threshold = int(self.settings.garbage_collection_threshold * self.limit)
        if self.reserved_bytes <= threshold:
            return
        target = self.reserved_bytes - threshold
        pool = self.large
        ages = {
            k: pool.calls - b.base
            for k, b in pool.blocks.items()
            if not b.is_split() and not b.expandable
        }
        if not ages:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and ages:
            average = sum(ages.values()) / len(ages)
            freed = False
            for key in list(pool.keys):
                age = ages.get(key)
                if age is not None and age >= average:
                    b = pool.blocks[key]
                    reclaimed += b.size
                    del ages[key]
                    self._release_block(pool, b)
                    freed = True
        self.gc_freed_bytes += reclaimed

    # -------------------------------------------------------------- expandable segments
    def _page(self, pool: _Pool) -> int:
        return K_SMALL_BUFFER if pool.small else self.settings.large_segment_bytes

    def _allocate_expandable(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """try_allocate_expandable_block: the lowest address with room, pages mapped."""
        c = self._find_expandable(pool, size, stream)
        if not c.mapped:
            c = self._map(pool, c, min(c.size, size))
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            c = self._map(pool, nxt, min(size - c.size, nxt.size))
        pool.erase(c)
        return c

    def _find_expandable(self, pool: _Pool, size: int, stream: int) -> _Block:
        def free(b: _Block | None) -> bool:
            return b is not None and not b.allocated

        def room(b: _Block | None) -> bool:
            total = 0
            while total < size and b is not None and free(b):
                total += b.size
                b = b.next
            return total >= size

        i = bisect.bisect_left(pool.unmapped, (stream, -1))
        while i < len(pool.unmapped) and pool.unmapped[i][0] == stream:
            c = pool.unmapped_blocks[pool.unmapped[i]]
            if c.prev is not None and free(c.prev):
                c = c.prev
            if room(c):
                return c
            i += 1
        # a new segment's address space: 2^46 bytes, far past any device
        space = 1 << 46
        c = _Block(space, self._next_ptr, stream, pool.small)
        self._next_ptr += space
        c.mapped = False
        c.expandable = True
        pool.insert_unmapped(c)
        self.segments += 1
        return c

    def _map(self, pool: _Pool, b: _Block, size: int) -> _Block:
        """map_block: the pages holding `size` bytes from `b`'s start mapped."""
        mapped = min(_round_up(size, self._page(pool)), b.size)
        if self.limit is not None and self.reserved_bytes + mapped > self.limit:
            raise _NoPages
        pool.erase_unmapped(b)
        b.mapped = True
        if mapped < b.size:
            rest = _Block(b.size - mapped, b.ptr + mapped, b.stream, b.small)
            rest.origin = b.origin
            rest.mapped = False
            rest.expandable = True
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = mapped
            pool.insert_unmapped(rest)
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert(b)
        self._reserve(mapped)
        return b

    def _unmap(self, pool: _Pool, b: _Block) -> None:
        """unmap_block: the whole pages inside free block `b` unmapped."""
        page = self._page(pool)
        start = b.origin + _round_up(b.ptr - b.origin, page)
        end = b.origin + (b.ptr + b.size - b.origin) // page * page
        if end <= start:
            return
        pool.erase(b)
        if start > b.ptr:
            before = _Block(start - b.ptr, b.ptr, b.stream, b.small)
            before.expandable, before.origin = True, b.origin
            before.prev, before.next = b.prev, b
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            pool.insert(before)
        if b.ptr + b.size > end:
            after = _Block(b.ptr + b.size - end, end, b.stream, b.small)
            after.expandable, after.origin = True, b.origin
            after.prev, after.next = b, b.next
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        b.ptr, b.size, b.mapped = start, end - start, False
        self.reserved_bytes -= end - start
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert_unmapped(b)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """roundup_power2_next_division: `size` up to the next of `divisions` equal steps
    between the powers of two around it."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


# ---------------------------------------------------------------------- replaying a trace
@dataclass(frozen=True)
class AllocatorReplay:
    """A trace replayed through `CachingAllocator` under `settings` (the
    PYTORCH_CUDA_ALLOC_CONF text; "" for torch's defaults).

    `reserved_peak_bytes`: the most the allocator held (torch.cuda.max_memory_reserved);
    `allocated_peak_bytes`: the most its blocks in use held (max_memory_allocated: the
    512-byte rounding and the unsplit rests included); `allocated_at_reserved_peak_bytes`
    the most the blocks in use held while the reserve stood at its peak (event
    `peak_event`: the fullest moment of the highest reserve);
    `fragmentation_bytes` = reserved peak - allocated then, `fragmentation_share` its share
    of the reserved peak. `reserved_bytes` and `allocated_bytes`: after each event.
    `out_of_memory_event`: the event that found no memory within `capacity_bytes` (None:
    none; the replay stops there), `retries` how often every cached segment was freed to
    retry, `segments_at_peak` the segments held then."""

    settings: str
    reserved_peak_bytes: int
    allocated_peak_bytes: int
    allocated_at_reserved_peak_bytes: int
    fragmentation_bytes: int
    fragmentation_share: float
    peak_event: int
    segments_at_peak: int
    retries: int
    capacity_bytes: int | None
    out_of_memory_event: int | None
    reserved_bytes: tuple[int, ...]
    allocated_bytes: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """The figures without the per-event series."""
        out = asdict(self)
        del out["reserved_bytes"], out["allocated_bytes"]
        return out


def replay(
    trace: AllocTrace,
    alloc_conf: str | AllocatorSettings | None = None,
    *,
    capacity_bytes: int | None = None,
) -> AllocatorReplay:
    """Replay `trace` through the caching allocator model under `alloc_conf` (a
    PYTORCH_CUDA_ALLOC_CONF string or parsed `AllocatorSettings`; None: torch's defaults),
    on a device of `capacity_bytes` (None: unlimited). Raises `AllocatorConfigError` for
    a setting the model does not know."""
    settings = (
        alloc_conf if isinstance(alloc_conf, AllocatorSettings) else parse_alloc_conf(alloc_conf)
    )
    model = CachingAllocator(settings, capacity_bytes)
    live: dict[int, _Block] = {}
    reserved: list[int] = []
    allocated: list[int] = []
    peak = -1
    at_peak = peak_event = segments = 0
    oom: int | None = None
    for n, e in enumerate(trace.events):
        if e.kind == "alloc":
            try:
                live[e.block] = model.malloc(e.nbytes, e.stream)
            except OutOfMemory:
                oom = n
                break
        else:
            b = live.pop(e.block, None)
            if b is not None:
                model.free(b)
        reserved.append(model.reserved_bytes)
        allocated.append(model.allocated_bytes)
        if model.reserved_bytes > peak or (
            model.reserved_bytes == peak and model.allocated_bytes > at_peak
        ):  # the fullest moment of the highest reserve
            peak, at_peak, peak_event = model.reserved_bytes, model.allocated_bytes, n
            segments = model.segments
    peak = max(peak, 0)
    frag = peak - at_peak
    return AllocatorReplay(
        settings=settings.text,
        reserved_peak_bytes=peak,
        allocated_peak_bytes=model.allocated_peak_bytes,
        allocated_at_reserved_peak_bytes=at_peak,
        fragmentation_bytes=frag,
        fragmentation_share=frag / peak if peak else 0.0,
        peak_event=peak_event,
        segments_at_peak=segments,
        retries=model.retries,
        capacity_bytes=capacity_bytes,
        out_of_memory_event=oom,
        reserved_bytes=tuple(reserved),
        allocated_bytes=tuple(allocated),
    )


#: The settings `best_setting` tries, in order.
CANDIDATES = ("expandable_segments:True", "max_split_size_mb:128", "max_split_size_mb:512")


@dataclass(frozen=True)
class AllocatorAdvice:
    """The setting that lowers the reserved peak most (`setting`, to add to
    PYTORCH_CUDA_ALLOC_CONF; `alloc_conf` the whole text), its reserved peak and what it
    saves against `baseline_bytes`; `tried` every candidate's reserved peak."""

    setting: str
    alloc_conf: str
    reserved_peak_bytes: int
    baseline_bytes: int
    tried: tuple[tuple[str, int], ...]

    @property
    def saves_bytes(self) -> int:
        return self.baseline_bytes - self.reserved_peak_bytes

    def __str__(self) -> str:
        saved = self.saves_bytes / MIB
        return (
            f"PYTORCH_CUDA_ALLOC_CONF={self.alloc_conf}: reserved peak "
            f"{self.reserved_peak_bytes / MIB:,.1f} MiB ({saved:,.1f} MiB less)"
        )


def best_setting(
    trace: AllocTrace,
    alloc_conf: str | None = None,
    *,
    baseline: AllocatorReplay | None = None,
    candidates: tuple[str, ...] = CANDIDATES,
) -> AllocatorAdvice | None:
    """Replay `trace` with each of `candidates` added to `alloc_conf` (in place of the
    same key) and name the one with the lowest reserved peak; None when none is lower
    than `alloc_conf`'s own (`baseline`, replayed here when not given)."""
    base = baseline if baseline is not None else replay(trace, alloc_conf)
    tried: list[tuple[str, int, str]] = []
    for setting in candidates:
        text = with_setting(alloc_conf, setting)
        if text == (alloc_conf or ""):
            continue
        tried.append((setting, replay(trace, text).reserved_peak_bytes, text))
    if not tried:
        return None
    setting, peak, text = min(tried, key=lambda t: t[1])
    if peak >= base.reserved_peak_bytes:
        return None
    return AllocatorAdvice(
        setting=setting,
        alloc_conf=text,
        reserved_peak_bytes=peak,
        baseline_bytes=base.reserved_peak_bytes,
        tried=tuple((s, p) for s, p, _ in tried),
    )


__all__ = [
    "ALL_GATHER_STREAM",
    "CANDIDATES",
    "COMPUTE_STREAM",
    "EVENT_KINDS",
    "IGNORED_KEYS",
    "MODELLED_KEYS",
    "REDUCE_SCATTER_STREAM",
    "AllocEvent",
    "AllocTrace",
    "AllocatorAdvice",
    "AllocatorConfigError",
    "AllocatorReplay",
    "AllocatorSettings",
    "CachingAllocator",
    "OutOfMemory",
    "best_setting",
    "parse_alloc_conf",
    "replay",
    "with_setting",
]
