"""The dry run's allocation trace (`DryRun.trace`): the ordered allocations and frees of
the steps, with the step, phase, module, category and operator of each, and what the
allocator model makes of it."""

from __future__ import annotations

import collections

import pytest

from workbench import TrainConfig
from workbench.estimate.allocator import (
    ALL_GATHER_STREAM,
    AllocatorReplay,
    AllocEvent,
    AllocTrace,
    replay,
)
from workbench.train.dry_run import DryRunError, simulate_memory

TINY = {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32}


@pytest.fixture(scope="module")
def plain() -> object:
    config = TrainConfig(micro_batch=4)
    return simulate_memory("tiny-gpt", config, model_options=TINY, progress=False)


def test_the_trace_replays_to_the_measured_peak(plain: object) -> None:
    trace = plain.trace  # type: ignore[attr-defined]
    assert isinstance(trace, AllocTrace)
    assert all(isinstance(e, AllocEvent) for e in trace.events)
    rounding = 512 if trace.device == "cuda" else 1
    # the highest moment of the measured steps is the trace's allocated peak
    assert trace.allocated_peak_bytes(rounding) == plain.peak_bytes  # type: ignore[attr-defined]


def test_every_free_follows_its_allocation_with_the_same_bytes(plain: object) -> None:
    live: dict[int, int] = {}
    for e in plain.trace.events:  # type: ignore[attr-defined]
        assert e.kind in ("alloc", "free")
        if e.kind == "alloc":
            assert e.block not in live and e.nbytes > 0
            live[e.block] = e.nbytes
        else:
            assert live.pop(e.block) == e.nbytes
    # what stays: the parameters, the optimizer states, buffers and the batch
    kept = {e.category for e in plain.trace.events if e.block in live}  # type: ignore[attr-defined]
    assert kept <= {"parameters", "optimizer states", "buffers", "other"}


def test_events_name_their_step_phase_module_and_operator(plain: object) -> None:
    events = plain.trace.events  # type: ignore[attr-defined]
    phases = collections.Counter((e.step, e.phase) for e in events)
    assert phases[(-1, "setup")] > 0
    for step in (0, 1):
        for phase in ("forward", "backward", "optimizer step"):
            assert phases[(step, phase)] > 0, (step, phase)
    setup = [e for e in events if e.phase == "setup"]
    assert {e.category for e in setup} >= {"parameters"}
    assert all(e.op is None for e in setup)
    forward = [e for e in events if e.kind == "alloc" and e.phase == "forward"]
    assert any(e.module and ".blocks.1." in e.module for e in forward)
    assert any(e.op == "aten.mm.default" or (e.op or "").startswith("aten.") for e in forward)
    cats = {e.category for e in events}
    assert {"gradients", "activations", "optimizer states"} <= cats
    # Adam's moments are made in the first step and stay; its temporaries are freed
    states = [e for e in events if e.category == "optimizer states"]
    assert states and all(e.kind == "alloc" and e.step == 0 for e in states)


def test_the_trace_leaves_the_json_small(plain: object) -> None:
    out = plain.to_dict()  # type: ignore[attr-defined]
    assert "trace" not in out
    assert out["trace_events"] == len(plain.trace.events)  # type: ignore[attr-defined]


def test_fsdp_all_gathers_are_filed_on_their_own_stream() -> None:
    config = TrainConfig(micro_batch=2, fsdp="full_shard")
    run = simulate_memory("tiny-gpt", config, model_options=TINY, world_size=2, progress=False)
    streams = {e.stream for e in run.trace.events if e.category == "gathered parameters"}
    assert streams == {ALL_GATHER_STREAM}


def test_the_dry_run_carries_the_allocators_reserved_peak(plain: object) -> None:
    run = plain
    replayed = run.allocator  # type: ignore[attr-defined]
    assert isinstance(replayed, AllocatorReplay)
    assert run.reserved_peak_bytes == replayed.reserved_peak_bytes  # type: ignore[attr-defined]
    # the reserve holds at least what is allocated, and segments come in 2 MiB multiples
    assert run.reserved_peak_bytes >= run.allocated_peak_bytes >= run.peak_bytes  # type: ignore[attr-defined]
    assert run.reserved_peak_bytes % (2 * 1024 * 1024) == 0  # type: ignore[attr-defined]
    assert run.fragmentation_bytes == (  # type: ignore[attr-defined]
        replayed.reserved_peak_bytes - replayed.allocated_at_reserved_peak_bytes
    )
    # the same trace replayed again gives the same figures
    assert replay(run.trace).reserved_peak_bytes == run.reserved_peak_bytes  # type: ignore[attr-defined]
    text = str(run)
    assert "allocated peak (" in text and "reserved peak (" in text
    compared = str(run.compare())  # type: ignore[attr-defined]
    assert "allocated peak (" in compared and "reserved peak (" in compared
    out = plain.to_dict()  # type: ignore[attr-defined]
    assert out["reserved_peak_bytes"] == run.reserved_peak_bytes  # type: ignore[attr-defined]
    assert "reserved_bytes" not in out["allocator"]


def test_alloc_conf_is_replayed_and_a_bad_one_named() -> None:
    config = TrainConfig(micro_batch=4)
    grown = simulate_memory(
        "tiny-gpt",
        config,
        model_options=TINY,
        progress=False,
        alloc_conf="expandable_segments:True",
    )
    assert grown.allocator is not None
    assert grown.allocator.settings == "expandable_segments:True"
    for bad, key in (
        ("max_split_size_mb:5", "max_split_size_mb"),
        ("expandable:True", "expandable"),
        ("garbage_collection_threshold:2", "garbage_collection_threshold"),
    ):
        with pytest.raises(DryRunError, match=f"alloc_conf.*{key}") as info:
            simulate_memory("tiny-gpt", config, model_options=TINY, alloc_conf=bad)
        assert info.value.problems[0].field == "alloc_conf"


def test_the_environments_alloc_conf_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:3")
    with pytest.raises(DryRunError, match="max_split_size_mb"):
        simulate_memory("tiny-gpt", TrainConfig(micro_batch=4), model_options=TINY)


@pytest.mark.gpu
def test_the_allocator_model_meets_max_memory_reserved_on_a_gpu() -> None:
    """Two real fp32 AdamW steps of an MLP on CUDA beside the dry run's replayed reserve
    (cuBLAS's workspace, which goes through the allocator too, is not in the trace)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))

    x, y = torch.randn(256, 1024), torch.randn(256, 1024)
    run = simulate_memory(
        build,
        TrainConfig(micro_batch=256),
        batch=(x, y),
        loss_fn=F.mse_loss,
        device="cuda",
        progress=False,
    )
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    xc, yc = x.cuda(), y.cuda()
    for _ in range(2):
        loss = F.mse_loss(model(xc), yc)
        loss.backward()
        del loss
        torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_reserved()
    assert run.reserved_peak_bytes is not None
    assert abs(run.reserved_peak_bytes / measured - 1) <= 0.15, (run.reserved_peak_bytes, measured)
