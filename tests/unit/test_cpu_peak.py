"""`StoragePeak`: the most tensor memory a block's operations hold at once on the CPU."""

from __future__ import annotations

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from workbench.train.measure.cpu_peak import StoragePeak


def test_a_freed_transient_sets_the_peak_and_leaves_the_held_bytes():
    with StoragePeak() as peak:
        a = torch.empty(1_000_000, dtype=torch.uint8)
        del a
        b = torch.empty(200_000, dtype=torch.float32)  # 800 KB
        c = torch.empty(100_000, dtype=torch.uint8)
        del c
    assert peak.peak_bytes == 1_000_000
    assert peak.held_bytes == 800_000  # b, still alive
    assert b.nbytes == 800_000


def test_views_and_in_place_changes_of_earlier_tensors_allocate_nothing():
    x = torch.ones(1000, 100)
    with StoragePeak() as peak:
        x.view(100, 1000).t().add_(1)
        x[:10].mul_(2)
        del x  # freeing a tensor from before the block does not lower the count
        y = torch.zeros(10)
    assert peak.peak_bytes == peak.held_bytes == 40 == y.nbytes


def _allocator_peak(fn) -> int:
    """The peak the CPU allocator reports to torch's profiler over `fn()` (the running sum
    of its memory events), for comparison."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = top = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        held += e.nbytes()
        top = max(top, held)
    return top


def test_a_forward_and_backward_peak_equals_the_allocators():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 8))
    x = torch.randn(512, 64)

    def step() -> None:
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)

    step()
    expected = _allocator_peak(step)
    with StoragePeak() as peak:
        step()
    assert expected > 512 * 256 * 4 * 3  # a few activations of 512 x 256
    assert abs(peak.peak_bytes - expected) <= 0.02 * expected, (peak.peak_bytes, expected)
