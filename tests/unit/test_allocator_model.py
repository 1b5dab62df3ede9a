"""The caching allocator model (`workbench.estimate.allocator`), rule by rule, against
torch's documented behaviour (c10/cuda/CUDACachingAllocator.cpp and notes/cuda.rst's
"Memory management"): sizes, pools, segments, best fit, splitting, oversize blocks,
max_split_size, expandable segments, the garbage collection threshold, freeing and
retrying before an out-of-memory, and PYTORCH_CUDA_ALLOC_CONF's keys and ranges."""

from __future__ import annotations

import pytest

from workbench.estimate.allocator import (
    AllocatorConfigError,
    AllocEvent,
    AllocTrace,
    CachingAllocator,
    OutOfMemory,
    best_setting,
    parse_alloc_conf,
    replay,
    with_setting,
)

KIB = 1024
MIB = 1024 * KIB


def _model(conf: str = "", capacity: int | None = None) -> CachingAllocator:
    return CachingAllocator(parse_alloc_conf(conf), capacity)


def _trace(*steps: tuple[str, int, int]) -> AllocTrace:
    """("alloc" | "free", block, nbytes) in order."""
    events = tuple(
        AllocEvent(kind, nbytes, block, 0, 0, "forward", None, "activations", None)
        for kind, block, nbytes in steps
    )
    return AllocTrace(events)


# ---------------------------------------------------------------------- sizes and pools
@pytest.mark.parametrize(
    ("request_bytes", "rounded"),
    [(0, 512), (1, 512), (512, 512), (513, 1024), (1000, 1024), (3 * MIB + 1, 3 * MIB + 512)],
)
def test_requests_round_up_to_512_bytes(request_bytes: int, rounded: int) -> None:
    assert _model().round_size(request_bytes) == rounded


def test_roundup_power2_divisions_round_to_the_next_division() -> None:
    # 1.2 MiB lies in [1, 2) MiB; 4 divisions: 1, 1.25, 1.5, 1.75 MiB
    size = int(1.2 * MIB)
    assert _model("roundup_power2_divisions:4").round_size(size) == int(1.25 * MIB)
    assert _model().round_size(size) == size + (-size % 512)
    # a power of two stays; the list form names intervals by their MiB start
    assert _model("roundup_power2_divisions:4").round_size(2 * MIB) == 2 * MIB
    listed = _model("roundup_power2_divisions:[1:2,>:1]")
    assert listed.round_size(size) == int(1.5 * MIB)  # 2 divisions in [1, 2) MiB
    assert listed.round_size(3 * MIB + 1) == 3 * MIB + 512  # 1 division: plain rounding


@pytest.mark.parametrize(
    ("request_bytes", "segment"),
    [
        (512, 2 * MIB),  # small pool: 2 MiB segments
        (1 * MIB, 2 * MIB),  # up to 1 MiB is small
        (1 * MIB + 1, 20 * MIB),  # above: the large pool's 20 MiB segments below 10 MiB
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),  # from 10 MiB: the request rounded to 2 MiB
        (11 * MIB, 12 * MIB),
        (100 * MIB + 1, 102 * MIB),
    ],
)
def test_pools_and_segment_sizes(request_bytes: int, segment: int) -> None:
    m = _model()
    assert m.allocation_size(m.round_size(request_bytes)) == segment
    m.malloc(request_bytes)
    assert m.reserved_bytes == segment


def test_small_requests_pack_into_2_mib_segments() -> None:
    m = _model()
    for _ in range(4):
        m.malloc(512 * KIB)
    assert (m.reserved_bytes, m.segments) == (2 * MIB, 1)
    m.malloc(512 * KIB)
    assert (m.reserved_bytes, m.segments) == (4 * MIB, 2)


def test_a_large_segment_is_shared_by_requests_between_1_and_10_mib() -> None:
    m = _model()
    m.malloc(2 * MIB)
    m.malloc(3 * MIB)
    m.malloc(5 * MIB)
    assert m.reserved_bytes == 20 * MIB and m.allocated_bytes == 10 * MIB


def test_small_and_large_pools_and_streams_do_not_share_blocks() -> None:
    m = _model()
    small = m.malloc(1 * MIB)
    m.free(small)  # a free 2 MiB small segment
    m.malloc(1 * MIB + 512)  # large: a new 20 MiB segment
    assert m.reserved_bytes == 22 * MIB
    streams = _model()
    other = streams.malloc(12 * MIB, stream=1)
    streams.free(other)
    streams.malloc(12 * MIB, stream=0)  # the stream-1 block is not reused
    assert streams.reserved_bytes == 24 * MIB


# ---------------------------------------------------------------------- best fit and splitting
def test_best_fit_takes_the_smallest_free_block_that_holds_the_request() -> None:
    m = _model()
    a = m.malloc(16 * MIB)
    b = m.malloc(12 * MIB)
    c = m.malloc(14 * MIB)
    for x in (a, b, c):
        m.free(x)
    got = m.malloc(11 * MIB)
    assert got.ptr == b.ptr and m.reserved_bytes == 42 * MIB
    # the rest (1 MiB) is not more than 1 MiB: the block is not split, all of it in use
    assert m.allocated_bytes == 12 * MIB


def test_large_blocks_split_when_the_rest_is_over_1_mib() -> None:
    m = _model()
    m.malloc(2 * MIB)  # a 20 MiB segment, split: 18 MiB stay free
    assert m.allocated_bytes == 2 * MIB
    m.malloc(17 * MIB)  # the rest serves it; 1 MiB would be left: not split, all in use
    assert m.reserved_bytes == 20 * MIB and m.allocated_bytes == 20 * MIB


def test_small_blocks_split_down_to_512_bytes() -> None:
    m = _model()
    m.malloc(1 * MIB)
    m.malloc(1 * MIB - 512)
    m.malloc(512)
    assert m.reserved_bytes == 2 * MIB and m.allocated_bytes == 2 * MIB


def test_freed_neighbours_merge_back_into_one_block() -> None:
    m = _model()
    a = m.malloc(2 * MIB)
    b = m.malloc(3 * MIB)
    m.free(a)
    m.free(b)
    m.malloc(20 * MIB)  # the whole segment again: no new one
    assert m.reserved_bytes == 20 * MIB and m.segments == 1


# ---------------------------------------------------------------------- max_split_size
def test_oversize_blocks_serve_no_request_below_max_split_size() -> None:
    m = _model("max_split_size_mb:20")
    big = m.malloc(40 * MIB)
    m.free(big)
    m.malloc(12 * MIB)  # below max_split_size: the 40 MiB block is not split for it
    assert m.reserved_bytes == 52 * MIB
    plain = _model()
    big = plain.malloc(40 * MIB)
    plain.free(big)
    plain.malloc(12 * MIB)  # without max_split_size it splits the cached block
    assert plain.reserved_bytes == 40 * MIB and plain.allocated_bytes == 12 * MIB


def test_an_oversize_request_takes_a_block_within_20_mib_unsplit() -> None:
    m = _model("max_split_size_mb:20")
    big = m.malloc(40 * MIB)
    m.free(big)
    m.malloc(22 * MIB)  # 40 < 22 + 20: served whole, not split
    assert m.reserved_bytes == 40 * MIB and m.allocated_bytes == 40 * MIB
    m2 = _model("max_split_size_mb:20")
    big = m2.malloc(44 * MIB)
    m2.free(big)
    m2.malloc(22 * MIB)  # 44 >= 22 + 20: a new segment
    assert m2.reserved_bytes == 66 * MIB
    m3 = _model("max_split_size_mb:20,max_non_split_rounding_mb:30")
    big = m3.malloc(44 * MIB)
    m3.free(big)
    m3.malloc(22 * MIB)  # within 30 MiB now
    assert m3.reserved_bytes == 44 * MIB


def test_oversize_cached_segments_are_released_before_the_full_retry() -> None:
    m = _model("max_split_size_mb:20", capacity=70 * MIB)
    a = m.malloc(30 * MIB)
    b = m.malloc(24 * MIB)
    m.free(a)
    m.free(b)
    m.malloc(40 * MIB)  # 54 + 40 > 70: the largest oversize segments go first
    assert m.reserved_bytes == 40 * MIB and m.retries == 0


# ---------------------------------------------------------------------- expandable segments
def test_expandable_segments_grow_one_segment_instead_of_new_ones() -> None:
    steps: list[tuple[str, int, int]] = []
    for n, size in enumerate((12, 14, 16, 18)):
        steps += [("alloc", n, size * MIB), ("free", n, size * MIB)]
    trace = _trace(*steps)
    plain = replay(trace)
    grown = replay(trace, "expandable_segments:True")
    assert plain.reserved_peak_bytes == (12 + 14 + 16 + 18) * MIB
    assert grown.reserved_peak_bytes == 20 * MIB  # one 20 MiB page holds each in turn


def test_expandable_segments_map_pages_of_2_and_20_mib() -> None:
    m = _model("expandable_segments:True")
    m.malloc(512)
    assert m.reserved_bytes == 2 * MIB
    m.malloc(21 * MIB)
    assert m.reserved_bytes == 2 * MIB + 40 * MIB
    m.malloc(19 * MIB)  # the 19 MiB left in the mapped pages hold it
    assert m.reserved_bytes == 42 * MIB


def test_expandable_segments_unmap_free_pages_before_an_out_of_memory() -> None:
    m = _model("expandable_segments:True", capacity=80 * MIB)
    a = m.malloc(40 * MIB)  # stream 0: two 20 MiB pages
    m.malloc(2 * MIB, stream=1)  # stream 1: one 20 MiB page
    m.free(a)
    assert m.reserved_bytes == 60 * MIB
    # 60 + 50 > 80: stream 0's free pages are unmapped, stream 1's segment grows by two
    m.malloc(50 * MIB, stream=1)
    assert m.reserved_bytes == 60 * MIB and m.retries == 1


# ---------------------------------------------------------------------- GC and out of memory
def test_garbage_collection_frees_old_cached_segments_above_the_threshold() -> None:
    steps = [
        ("alloc", 0, 30 * MIB),
        ("free", 0, 30 * MIB),
        ("alloc", 1, 32 * MIB),
        ("free", 1, 32 * MIB),
        ("alloc", 2, 34 * MIB),
    ]
    trace = _trace(*steps)
    conf = "per_process_memory_fraction:1.0,garbage_collection_threshold:0.5"
    collected = replay(trace, conf, capacity_bytes=100 * MIB)
    # above 50 MiB reserved the oldest cached segment (30 MiB) is freed first
    assert collected.reserved_bytes[-1] == (32 + 34) * MIB
    kept = replay(trace, "per_process_memory_fraction:1.0", capacity_bytes=100 * MIB)
    assert kept.reserved_bytes[-1] == (30 + 32 + 34) * MIB
    # torch collects only under a memory fraction (set_per_process_memory_fraction)
    no_fraction = replay(trace, "garbage_collection_threshold:0.5", capacity_bytes=100 * MIB)
    assert no_fraction.reserved_bytes[-1] == (30 + 32 + 34) * MIB


def test_cached_segments_are_freed_and_the_allocation_retried_before_oom() -> None:
    m = _model(capacity=50 * MIB)
    a = m.malloc(30 * MIB)
    m.free(a)
    m.malloc(40 * MIB)  # 30 + 40 > 50: the cached 30 MiB go back, then it fits
    assert m.reserved_bytes == 40 * MIB and m.retries == 1
    with pytest.raises(OutOfMemory):
        m.malloc(20 * MIB)


def test_a_replay_reports_where_it_ran_out_of_memory() -> None:
    trace = _trace(("alloc", 0, 30 * MIB), ("alloc", 1, 30 * MIB), ("free", 0, 30 * MIB))
    r = replay(trace, capacity_bytes=50 * MIB)
    assert r.out_of_memory_event == 1 and r.reserved_peak_bytes == 30 * MIB
    assert replay(trace).out_of_memory_event is None


# ---------------------------------------------------------------------- replay's figures
def test_fragmentation_is_reserved_minus_allocated_at_the_reserved_peak() -> None:
    trace = _trace(("alloc", 0, 2 * MIB), ("alloc", 1, 600 * KIB), ("free", 0, 2 * MIB))
    r = replay(trace)
    assert r.reserved_peak_bytes == 22 * MIB
    assert r.allocated_at_reserved_peak_bytes == 2 * MIB + 600 * KIB
    assert r.fragmentation_bytes == 22 * MIB - (2 * MIB + 600 * KIB)
    assert r.fragmentation_share == pytest.approx(r.fragmentation_bytes / (22 * MIB))
    assert len(r.reserved_bytes) == len(trace.events) == len(r.allocated_bytes)


def test_best_setting_names_the_setting_that_lowers_the_reserved_peak_most() -> None:
    steps: list[tuple[str, int, int]] = []
    for n, size in enumerate((12, 14, 16, 18)):
        steps += [("alloc", n, size * MIB), ("free", n, size * MIB)]
    advice = best_setting(_trace(*steps))
    assert advice is not None
    assert advice.setting == "expandable_segments:True"
    assert advice.reserved_peak_bytes == 20 * MIB and advice.saves_bytes == 40 * MIB
    assert "expandable_segments:True" in str(advice)
    # nothing to gain: no advice
    assert best_setting(_trace(("alloc", 0, 512))) is None


def test_with_setting_replaces_the_same_key() -> None:
    text = "max_split_size_mb:64,roundup_power2_divisions:[1:2,>:1]"
    assert with_setting(text, "max_split_size_mb:128") == (
        "roundup_power2_divisions:[1:2,>:1],max_split_size_mb:128"
    )
    assert with_setting(None, "expandable_segments:True") == "expandable_segments:True"


# ---------------------------------------------------------------------- PYTORCH_CUDA_ALLOC_CONF
def test_the_settings_read_as_torch_reads_them() -> None:
    s = parse_alloc_conf(
        "max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:True,"
        "release_lock_on_cudamalloc:True"
    )
    assert s.max_split_size_bytes == 128 * MIB
    assert s.garbage_collection_threshold == 0.6 and s.expandable_segments
    assert parse_alloc_conf("") == parse_alloc_conf(None)


@pytest.mark.parametrize(
    ("conf", "key", "words"),
    [
        ("max_split_mb:100", "max_split_mb", "unknown key"),
        ("max_split_size_mb:10", "max_split_size_mb", "at least 20"),
        ("max_split_size_mb:lots", "max_split_size_mb", "integer"),
        ("max_non_split_rounding_mb:4", "max_non_split_rounding_mb", "at least 20"),
        ("garbage_collection_threshold:1.5", "garbage_collection_threshold", "(0.0, 1.0)"),
        ("garbage_collection_threshold:0", "garbage_collection_threshold", "(0.0, 1.0)"),
        ("expandable_segments:yes", "expandable_segments", "True or False"),
        ("roundup_power2_divisions:3", "roundup_power2_divisions", "power of two"),
        ("per_process_memory_fraction:2", "per_process_memory_fraction", "(0.0, 1.0]"),
        ("backend:cudaMallocAsync", "backend", "unknown key"),
    ],
)
def test_a_setting_the_model_does_not_know_names_its_key(conf: str, key: str, words: str) -> None:
    with pytest.raises(AllocatorConfigError, match=key) as info:
        parse_alloc_conf(conf)
    assert info.value.key == key and words in str(info.value)
    with pytest.raises(AllocatorConfigError):
        replay(_trace(("alloc", 0, 512)), conf)


def test_fragmentation_is_taken_at_the_fullest_moment_of_the_highest_reserve() -> None:
    # the 2 MiB segment is reserved by the first 512 bytes; it is fullest after the second
    trace = _trace(("alloc", 0, 512), ("alloc", 1, 1 * MIB), ("free", 1, 1 * MIB))
    r = replay(trace)
    assert r.reserved_peak_bytes == 2 * MIB and r.peak_event == 1
    assert r.fragmentation_bytes == 2 * MIB - (1 * MIB + 512)
