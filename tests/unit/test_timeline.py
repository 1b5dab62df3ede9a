"""The picture of a step's memory and the snapshot for torch's memory viewer, from a trace."""

from __future__ import annotations

import base64
import json
import pickle
import re
from pathlib import Path

import pytest
from torch.cuda import _memory_viz

from workbench.estimate.allocator import AllocEvent, AllocTrace, replay
from workbench.outputs import OutputError
from workbench.train.dry_run.timeline import (
    memory_snapshot,
    side_by_side,
    timeline,
    trace_of_snapshot,
    write_snapshot,
    write_timeline,
)

MIB = 2**20


def _ev(
    kind: str,
    nbytes: int,
    block: int,
    category: str,
    module: str | None = None,
    op: str | None = None,
    phase: str = "forward",
    step: int = 0,
) -> AllocEvent:
    return AllocEvent(kind, nbytes, block, 0, step, phase, module, category, op)


def _trace() -> AllocTrace:
    events = [
        _ev("alloc", 4 * MIB, 1, "parameters", phase="setup", step=-1),
        _ev("alloc", 3 * MIB, 2, "activations", "model.layers.0.mlp", "aten.mm.default"),
        _ev("alloc", 1000, 3, "temporaries", "model.layers.0.mlp", "aten.gelu.default"),
        _ev("alloc", 5 * MIB, 4, "activations", "model.layers.1.attn", "aten.bmm.default"),
        _ev("free", 1000, 3, "temporaries"),
        _ev(
            "alloc",
            4 * MIB,
            5,
            "gradients",
            "model.layers.1.attn",
            "aten.mm.default",
            phase="backward",
        ),
        _ev("free", 5 * MIB, 4, "activations", phase="backward"),
        _ev("free", 3 * MIB, 2, "activations", phase="backward"),
        _ev("alloc", 8 * MIB, 6, "optimizer states", phase="optimizer step"),
    ]
    return AllocTrace(tuple(events), "cuda")


def test_the_bands_stack_to_the_total_and_the_peak_holds_the_largest_tensors() -> None:
    trace = _trace()
    tl = timeline(trace, replay(trace))
    names = [name for name, _ in tl.bands]
    assert names == [
        "parameters",
        "gradients",
        "optimizer states",
        "activations: model.layers.0",
        "activations: model.layers.1",
        "transients",
    ]
    for n, total in enumerate(tl.total):
        assert sum(series[n] for _, series in tl.bands) == total
    assert list(tl.total) == trace.allocated_bytes(512)
    # the highest moment: parameters, both activations, the gradient (16 MiB), before the
    # optimizer states arrive (4 + 4 + 8 = 16 MiB, later and not higher)
    assert tl.peak_event == 5 and tl.peak_bytes == 16 * MIB
    assert [(t.nbytes, t.module, t.op) for t in tl.top] == [
        (5 * MIB, "model.layers.1.attn", "aten.bmm.default"),
        (4 * MIB, None, None),
        (4 * MIB, "model.layers.1.attn", "aten.mm.default"),
        (3 * MIB, "model.layers.0.mlp", "aten.mm.default"),
    ]
    assert len(tl.reserved) == len(tl.total) and max(tl.reserved) == tl.reserved_peak_bytes
    assert tl.reserved_peak_bytes >= tl.peak_bytes
    assert [p[3] for p in tl.phases] == ["setup", "forward", "backward", "optimizer step"]
    assert timeline(trace, top=2).top == tl.top[:2] and timeline(trace).reserved == ()


def test_the_picture_is_written_as_png_or_html_and_nothing_else(tmp_path: Path) -> None:
    tl = timeline(_trace())
    png = write_timeline(tl, tmp_path / "t.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    page = write_timeline(tl, tmp_path / "t.html").read_text()
    img = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert img is not None and base64.b64decode(img.group(1)).startswith(b"\x89PNG")
    assert page.count("<tr>") == 1 + len(tl.top) and "aten.bmm.default" in page
    with pytest.raises(ValueError, match=r"\.png or \.html.*'\.svg'"):
        write_timeline(tl, tmp_path / "t.svg")
    assert not (tmp_path / "t.svg").exists()
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(OutputError, match="folder"):
        write_timeline(tl, tmp_path / "dir.png")


def _viewer_snapshot(html: str) -> dict:
    """The snapshot torch's trace_plot page carries (its base64 pickle)."""
    found = re.search(r'(\[\{"name": "snapshot.pickle", "base64": "[^"]*"\}\])', html)
    assert found is not None
    return pickle.loads(base64.b64decode(json.loads(found.group(1))[0]["base64"]))


def test_the_snapshot_opens_in_torchs_memory_viewer(tmp_path: Path) -> None:
    trace = _trace()
    path = write_snapshot(memory_snapshot(trace), tmp_path / "dry.pickle")
    snap = pickle.loads(path.read_bytes())
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("alloc") == 6 and actions.count("free_completed") == 3
    assert actions.count("segment_alloc") >= 1
    page = _memory_viz.trace_plot(snap)
    assert "Active Memory Timeline" in page
    shown_snap = _viewer_snapshot(page)
    assert [e["action"] for e in shown_snap["device_traces"][0]].count("alloc") == 6
    # the segments left: parameters, gradient, optimizer states; torch's own summary of
    # them adds up (it raises on a segment whose blocks do not fill it)
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sorted(b["requested_size"] for b in live) == [4 * MIB, 4 * MIB, 8 * MIB]
    assert "segments:" in _memory_viz.segsum(snap)
    alloc = next(e for e in snap["device_traces"][0] if e["action"] == "alloc")
    assert alloc["frames"][1]["name"] == "parameters" and alloc["size"] == 4 * MIB


def test_a_recorded_snapshot_reads_back_as_a_trace() -> None:
    """`trace_of_snapshot` reads torch's snapshot format: the dry run's own snapshot comes
    back with the same allocations (in the allocator's block sizes) and frees."""
    trace = _trace()
    snap = memory_snapshot(trace)
    params = next(e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc")
    back = trace_of_snapshot(snap, categories={params: "parameters"})
    assert [(e.kind, e.nbytes) for e in back.events] == [
        (e.kind, -(-e.nbytes // 512) * 512) for e in trace.events
    ]
    assert back.events[0].category == "parameters" and back.events[1].category == "activations"
    assert back.events[1].op == "aten.mm.default"
    # blocks in use before the recording began come first, as the setup
    first = trace_of_snapshot({"segments": snap["segments"], "device_traces": [[]]})
    assert sorted(e.nbytes for e in first.events) == [4 * MIB, 4 * MIB, 8 * MIB]
    assert {e.phase for e in first.events} == {"setup"}
    tl = timeline(back)
    assert tl.peak_bytes == 16 * MIB and len(side_by_side(tl, timeline(trace)).axes) == 4


@pytest.mark.parametrize(
    "conf", [None, "expandable_segments:True", "garbage_collection_threshold:0.5"]
)
def test_the_snapshots_segments_are_what_the_allocator_holds(conf) -> None:
    trace = _trace()
    snap = memory_snapshot(trace, conf)
    held = sum(s["total_size"] for s in snap["segments"])
    assert held == replay(trace, conf).reserved_bytes[-1]
    # the segment events add up to the same: made minus released
    events = snap["device_traces"][0]
    made = sum(e["size"] for e in events if e["action"] == "segment_alloc")
    freed = sum(e["size"] for e in events if e["action"] == "segment_free")
    assert made - freed == held
    assert [e["action"] for e in events].count("alloc") == 6
    assert "segments:" in _memory_viz.segsum(snap)
