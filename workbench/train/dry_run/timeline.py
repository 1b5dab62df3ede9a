"""The picture of a step's memory: why it runs out, drawn from a dry run's allocation trace.

    run = workbench.simulate_memory("tiny-gpt", workbench.TrainConfig(micro_batch=8))
    tl = run.timeline()            # Timeline: the data (series, peak, ten largest tensors)
    tl.figure()                    # a matplotlib Figure (Agg, no pyplot)
    tl.png(), tl.html()            # the picture as PNG bytes, or an HTML page with the table
    run.memory_snapshot()          # the trace in the format torch's memory viewer opens

`timeline(trace, replay)` walks the `AllocTrace` once: after each event, the bytes alive
per group (parameters, gradients, optimizer states, activations by module, transients),
the allocator's allocated and reserved bytes (the `AllocatorReplay`'s), the highest
moment (`peak_event`) and the ten largest tensors alive then with the module and operator
that made each. `memory_snapshot(trace)` writes the same events as
`torch.cuda.memory._snapshot()` does (`{"segments": [...], "device_traces": [[...]]}`,
the addresses from `workbench.estimate.allocator.CachingAllocator`), which
`torch.cuda.memory._memory_viz.trace_plot` and https://pytorch.org/memory_viz open beside a
real GPU's snapshot. Drawing needs matplotlib (imported when drawn); the data needs neither
it nor torch.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.display import fmt_bytes
from workbench.estimate.allocator import (
    AllocatorReplay,
    AllocEvent,
    AllocTrace,
    CachingAllocator,
    parse_alloc_conf,
)
from workbench.inputs import shown

#: The files `--timeline` writes, by suffix.
TIMELINE_SUFFIXES = (".png", ".html")

#: The dry run's categories, grouped as the picture stacks them (the rest: "transients").
GROUPS = {
    "parameters": "parameters",
    "buffers": "parameters",
    "gathered parameters": "parameters",
    "ZeRO-3 gathered parameters": "parameters",
    "gradients": "gradients",
    "unsharded gradients": "gradients",
    "DeepSpeed fp32 gradient partition": "gradients",
    "DeepSpeed reduce buckets": "gradients",
    "optimizer states": "optimizer states",
}

#: How many modules' activations get their own band (the rest share one).
MODULE_BANDS = 6


@dataclass(frozen=True)
class LiveTensor:
    """One storage alive at the peak: its bytes, category, the module and operator that
    made it (None: outside every module / no operator), the step and phase it was made in."""

    nbytes: int
    category: str
    module: str | None
    op: str | None
    step: int
    phase: str


@dataclass(frozen=True)
class Timeline:
    """A step's memory over time, one value per trace event.

    `bands`: (name, bytes alive after each event) stacked bottom to top (parameters,
    gradients, optimizer states, "activations: <module>" ..., transients), in the
    allocator's 512-byte rounding on CUDA (exact bytes on a CPU); their sum is `total`.
    `allocated` and `reserved`: the allocator model's blocks in use and segments held
    after each event (empty without a replay). `peak_event`: the event of the highest
    total (`peak_bytes`, the dry run's peak); `top`: the largest tensors alive then.
    `phases`: (first event, last event, step, phase) of each stretch of the trace."""

    bands: tuple[tuple[str, tuple[int, ...]], ...]
    total: tuple[int, ...]
    allocated: tuple[int, ...]
    reserved: tuple[int, ...]
    peak_event: int
    peak_bytes: int
    reserved_peak_bytes: int | None
    top: tuple[LiveTensor, ...]
    phases: tuple[tuple[int, int, int, str], ...]
    title: str = "memory of the dry run's steps"

    def table(self) -> list[tuple[str, str, str, str, str]]:
        """The largest tensors at the peak as rows: bytes, category, module, operator,
        where made."""
        return [
            (
                fmt_bytes(t.nbytes),
                t.category,
                t.module or "(no module)",
                t.op or "(no operator)",
                f"step {t.step} {t.phase}" if t.step >= 0 else t.phase,
            )
            for t in self.top
        ]

    def figure(self) -> Any:
        """A matplotlib `Figure` (no pyplot): the stacked bands, the allocated and reserved
        lines, the peak marked, the phases shaded; below, the largest tensors at the peak."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 6.5), dpi=80)
        ax, tab = fig.subplots(2, 1, gridspec_kw={"height_ratios": [3, 2], "hspace": 0.45})
        self.draw(ax, tab)
        return fig

    def draw(self, ax: Any, tab: Any, *, legend: bool = True) -> None:
        """Draw the picture on matplotlib axes `ax` (the memory over time) and `tab` (the
        largest tensors' table)."""
        n = len(self.total)
        gib = 2**30
        unit, name = (gib, "GiB") if max(self.total, default=0) >= gib else (2**20, "MiB")
        xs = list(range(n))
        shades = ("#f4f4f4", "#ffffff")
        for i, (start, end, step, phase) in enumerate(self.phases):
            ax.axvspan(start - 0.5, end + 0.5, color=shades[i % 2], zorder=0)
            if end - start > n / 25:
                label = phase if step < 0 else f"{phase} {step}"
                ax.text(
                    (start + end) / 2,
                    1.0,
                    label,
                    transform=ax.get_xaxis_transform(),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        if n:
            ax.stackplot(
                xs,
                *[[v / unit for v in series] for _, series in self.bands],
                labels=[band for band, _ in self.bands],
                zorder=1,
            )
            for values, color, label in (
                (self.allocated, "black", "allocated (allocator's blocks)"),
                (self.reserved, "red", "reserved (segments held)"),
            ):
                if values:
                    ys = [v / unit for v in values]
                    ax.plot(range(len(ys)), ys, color=color, lw=1, label=label, zorder=2)
            ax.axvline(self.peak_event, color="black", ls="--", lw=0.8, zorder=3)
            ax.annotate(
                f"peak {fmt_bytes(self.peak_bytes)}",
                (self.peak_event, self.peak_bytes / unit),
                xytext=(5, 5),
                textcoords="offset points",
                fontsize=8,
            )
        ax.set_xlim(-0.5, max(n - 0.5, 0.5))
        ax.set_xlabel("allocations and frees, in order")
        ax.set_ylabel(name)
        ax.set_title(self.title, fontsize=9, pad=14)
        if legend:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        tab.axis("off")
        rows = self.table()
        if rows:
            t = tab.table(
                cellText=[list(r) for r in rows],
                colLabels=["bytes", "category", "module", "operator", "made in"],
                loc="upper center",
                cellLoc="left",
            )
            t.auto_set_font_size(False)
            t.set_fontsize(7)
            t.auto_set_column_width(list(range(5)))
            tab.set_title(f"the {len(rows)} largest tensors alive at the peak", fontsize=9)

    def png(self, dpi: int = 80) -> bytes:
        """`figure()` as PNG bytes."""
        from workbench.spread import figure_png

        return figure_png(self.figure(), dpi)

    def html(self) -> str:
        """A page: the picture inline (a PNG in an <img>) and the largest tensors' table."""
        img = base64.b64encode(self.png()).decode("ascii")
        head = "".join(
            f"<th>{h}</th>" for h in ("bytes", "category", "module", "operator", "made in")
        )
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self.table()
        )
        title = html.escape(self.title)
        return (
            f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body><h3>{title}</h3>\n<img alt='memory timeline' "
            f"src='data:image/png;base64,{img}'>\n"
            f"<p>the {len(self.top)} largest tensors alive at the peak "
            f"({html.escape(fmt_bytes(self.peak_bytes))})</p>\n"
            f"<table border='1'><tr>{head}</tr>{body}</table></body></html>\n"
        )


def _module_band(module: str | None) -> str:
    """The band of an activation made in `module`: its transformer block (the name up to
    the first number) or its top-level module."""
    if not module:
        return "activations: (no module)"
    parts = module.split(".")
    if len(parts) > 1 and parts[0][:1].isupper():  # the root model's class name
        parts = parts[1:]
    for i, part in enumerate(parts):
        if part.isdigit():
            return "activations: " + ".".join(parts[: i + 1])
    return "activations: " + parts[0]


def _group(e: AllocEvent) -> str:
    if e.category == "activations":
        return _module_band(e.module)
    return GROUPS.get(e.category, "transients")


def timeline(
    trace: AllocTrace, replay: AllocatorReplay | None = None, *, top: int = 10, title: str = ""
) -> Timeline:
    """The picture's data from `trace` (and the allocator `replay` of it: the allocated
    and reserved lines); `top` largest tensors at the peak."""
    rounding = 512 if trace.device == "cuda" else 1
    sizes: dict[int, int] = {}
    groups: dict[int, str] = {}
    now: dict[str, int] = {}
    history: list[dict[str, int]] = []
    total: list[int] = []
    running = peak = peak_event = 0
    for n, e in enumerate(trace.events):
        if e.kind == "alloc":
            size = -(-e.nbytes // rounding) * rounding
            sizes[e.block], groups[e.block] = size, _group(e)
            now[groups[e.block]] = now.get(groups[e.block], 0) + size
            running += size
        elif e.block in sizes:
            size, group = sizes.pop(e.block), groups.pop(e.block)
            now[group] -= size
            running -= size
        history.append(dict(now))
        total.append(running)
        if running > peak:
            peak, peak_event = running, n
    at_peak = history[peak_event] if history else {}
    fixed = ["parameters", "gradients", "optimizer states"]
    highest: dict[str, int] = {}
    for h in history:
        for g, v in h.items():
            if g.startswith("activations: "):
                highest[g] = max(highest.get(g, 0), v)
    # the most at the peak first, then the highest anywhere (a peak in the optimizer step
    # holds no activations), then by name
    modules = sorted(highest, key=lambda g: (-at_peak.get(g, 0), -highest[g], _natural(g)))
    own, rest = modules[:MODULE_BANDS], set(modules[MODULE_BANDS:])
    names = fixed + sorted(own, key=_natural) + (["activations: other modules"] if rest else [])
    names.append("transients")
    series: dict[str, list[int]] = {name: [] for name in names}
    for h in history:
        other = sum(h.get(g, 0) for g in rest)
        for name in names:
            series[name].append(other if name == "activations: other modules" else h.get(name, 0))
    bands = tuple((name, tuple(v)) for name, v in series.items() if any(v))
    return Timeline(
        bands=bands,
        total=tuple(total),
        allocated=replay.allocated_bytes if replay is not None else (),
        reserved=replay.reserved_bytes if replay is not None else (),
        peak_event=peak_event,
        peak_bytes=peak,
        reserved_peak_bytes=replay.reserved_peak_bytes if replay is not None else None,
        top=_largest_at(trace, peak_event, top),
        phases=_phases(trace),
        title=title or "memory of the dry run's steps",
    )


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.replace(".", " ").split()
    )


def _largest_at(trace: AllocTrace, peak_event: int, top: int) -> tuple[LiveTensor, ...]:
    live: dict[int, AllocEvent] = {}
    for e in trace.events[: peak_event + 1]:
        if e.kind == "alloc":
            live[e.block] = e
        else:
            live.pop(e.block, None)
    biggest = sorted(live.values(), key=lambda e: (-e.nbytes, e.block))[:top]
    return tuple(LiveTensor(e.nbytes, e.category, e.module, e.op, e.step, e.phase) for e in biggest)


def _phases(trace: AllocTrace) -> tuple[tuple[int, int, int, str], ...]:
    out: list[tuple[int, int, int, str]] = []
    for n, e in enumerate(trace.events):
        if out and out[-1][2:] == (e.step, e.phase):
            out[-1] = (out[-1][0], n, e.step, e.phase)
        else:
            out.append((n, n, e.step, e.phase))
    return tuple(out)


# ---------------------------------------------------------------------- torch's viewer
def _frames(e: AllocEvent) -> list[dict[str, Any]]:
    """The event's "stack" for the viewer: the operator in the module, then the category."""
    where = e.module or "(no module)"
    made = f"step {e.step} {e.phase}" if e.step >= 0 else e.phase
    return [
        {"filename": where, "line": 0, "name": e.op or "(no operator)"},
        {"filename": made, "line": 0, "name": e.category},
    ]


def memory_snapshot(trace: AllocTrace, alloc_conf: str | None = None) -> dict[str, Any]:
    """`trace` as `torch.cuda.memory._snapshot()` writes one (the pickle torch's memory
    viewer opens): `device_traces[0]` the events ("segment_alloc", "alloc",
    "free_requested", "free_completed", "segment_free", each with `addr`, `size`, `stream`,
    `frames`, `time_us`), `segments` what the allocator holds after the last event, with
    its blocks. Addresses and segments come from the caching allocator model under
    `alloc_conf` (PYTORCH_CUDA_ALLOC_CONF; None: torch's defaults); sizes are the
    allocator's (rounded) block sizes, `requested_size` the bytes asked for."""
    model = CachingAllocator(parse_alloc_conf(alloc_conf))
    events: list[dict[str, Any]] = []
    live: dict[int, Any] = {}
    requested: dict[int, int] = {}
    frames: dict[int, list[dict[str, Any]]] = {}
    segments = _segment_heads(model, live)
    reserved = model.reserved_bytes
    for n, e in enumerate(trace.events):
        if e.kind == "alloc":
            b = model.malloc(e.nbytes, e.stream)
            live[e.block], requested[e.block], frames[e.block] = b, e.nbytes, _frames(e)
            kind, addr, size = "alloc", b.ptr, b.size
        elif e.block in live:
            b = live.pop(e.block)
            addr, size = b.ptr, b.size
            model.free(b)
            kind = "free"
        else:
            continue
        if model.reserved_bytes != reserved:  # a segment made, grown or released
            now, reserved = _segment_heads(model, live), model.reserved_bytes
            for head, (total, stream) in segments.items():
                if now.get(head) != (total, stream):
                    events.append(_event("segment_free", head, total, stream, [], n))
            for head, (total, stream) in now.items():
                if segments.get(head) != (total, stream):
                    events.append(_event("segment_alloc", head, total, stream, [], n))
            segments = now
        f = frames[e.block]
        if kind == "alloc":
            events.append(_event("alloc", addr, size, e.stream, f, n))
        else:
            events.append(_event("free_requested", addr, size, e.stream, f, n))
            events.append(_event("free_completed", addr, size, e.stream, f, n))
    return {
        "segments": _segments(model, live, requested, frames),
        "device_traces": [events],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf or ""},
    }


def _event(
    action: str, addr: int, size: int, stream: int, frames: list[dict[str, Any]], n: int
) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "frames": frames,
        "time_us": n,
    }


def _blocks(model: CachingAllocator, live: dict[int, Any]) -> list[Any]:
    pools = [model.small, model.large]
    return [*live.values(), *(b for p in pools for b in p.blocks.values())]


def _segment_heads(model: CachingAllocator, live: dict[int, Any]) -> dict[int, tuple[int, int]]:
    """The segments held: (first address) -> (mapped size, stream)."""
    return {
        head.ptr: (sum(c.size for c in chain if c.mapped), head.stream)
        for head, chain in _segment_chains(model, live)
    }


def _segment_chains(model: CachingAllocator, live: dict[int, Any]) -> list[tuple[Any, list[Any]]]:
    """Each segment's first block and its blocks in address order (an expandable
    segment's unmapped ranges included)."""
    seen: set[int] = set()
    out: list[tuple[Any, list[Any]]] = []
    for b in _blocks(model, live):
        while b.prev is not None:
            b = b.prev
        if b.ptr in seen:
            continue
        seen.add(b.ptr)
        chain, c = [], b
        while c is not None:
            chain.append(c)
            c = c.next
        out.append((b, chain))
    return sorted(out, key=lambda hc: int(hc[0].ptr))


def _segments(
    model: CachingAllocator,
    live: dict[int, Any],
    requested: dict[int, int],
    frames: dict[int, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    by_ptr = {b.ptr: k for k, b in live.items()}
    out: list[dict[str, Any]] = []
    for start, chain in _segment_chains(model, live):
        blocks: list[dict[str, Any]] = []
        for c in chain:
            if c.mapped:
                key = by_ptr.get(c.ptr) if c.allocated else None
                blocks.append(
                    {
                        "address": c.ptr,
                        "size": c.size,
                        "requested_size": requested.get(key, c.size) if key is not None else 0,
                        "state": "active_allocated" if c.allocated else "inactive",
                        "frames": frames.get(key, []) if key is not None else [],
                    }
                )
        total, head, stream = sum(b["size"] for b in blocks), start.ptr, start.stream
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        out.append(
            {
                "device": 0,
                "address": head,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": sum(b["requested_size"] for b in blocks),
                "stream": stream,
                "segment_type": "small" if start.small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": bool(start.expandable),
                "frames": [],
                "blocks": blocks,
            }
        )
    return out


def side_by_side(left: Timeline, right: Timeline) -> Any:
    """Two pictures in one matplotlib `Figure`, left and right (a real GPU step's
    beside the dry run's): the same bands and lines, each on its own scale."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(18, 6.5), dpi=80)
    axes = fig.subplots(2, 2, gridspec_kw={"height_ratios": [3, 2], "hspace": 0.45})
    left.draw(axes[0][0], axes[1][0], legend=False)
    right.draw(axes[0][1], axes[1][1])
    return fig


def trace_of_snapshot(
    snapshot: dict[str, Any], device: int = 0, categories: dict[int, str] | None = None
) -> AllocTrace:
    """The `AllocTrace` of a snapshot `torch.cuda.memory._snapshot()` recorded (with
    `torch.cuda.memory._record_memory_history`) on CUDA device `device`: its "alloc" and
    "free_completed" events in order, the blocks that were in use before the recording
    began first (phase "setup"). `categories` files a block by its address (a parameter's,
    a gradient's, an optimizer state's `data_ptr()`); a block in use before the recording
    and not named there is filed as parameters, one made during it as activations (the
    snapshot names no module, so the real step's activations and transients share one
    band). The operator is the innermost frame's function."""
    categories = categories or {}
    traces = snapshot.get("device_traces") or [[]]
    events_in = traces[device] if device < len(traces) else []
    made = {e["addr"] for e in events_in if e.get("action") == "alloc"}
    out: list[AllocEvent] = []
    live: dict[int, tuple[int, int]] = {}  # address -> (block id, size)
    ids = 0
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        for b in seg.get("blocks", []):
            addr = b.get("address")
            if b.get("state") == "active_allocated" and addr is not None and addr not in made:
                live[addr] = (ids, int(b["size"]))
                category = categories.get(addr, "parameters")
                out.append(
                    AllocEvent(
                        "alloc",
                        int(b["size"]),
                        ids,
                        seg.get("stream", 0),
                        -1,
                        "setup",
                        None,
                        category,
                        None,
                    )
                )
                ids += 1
    for e in events_in:
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = (ids, int(e["size"]))
            frames = e.get("frames") or []
            op = frames[0].get("name") if frames else None
            category = categories.get(addr, "activations")
            out.append(
                AllocEvent(
                    "alloc", int(e["size"]), ids, e.get("stream", 0), 0, "step", None, category, op
                )
            )
            ids += 1
        elif action == "free_completed" and addr in live:
            block, size = live.pop(addr)
            out.append(
                AllocEvent("free", size, block, e.get("stream", 0), 0, "step", None, "", None)
            )
    return AllocTrace(tuple(out), "cuda")


# ---------------------------------------------------------------------- files
def timeline_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` cannot take the picture (None when it can): its suffix (PNG or HTML)."""
    suffix = Path(path).suffix.lower()
    if suffix not in TIMELINE_SUFFIXES:
        return (
            f"{shown(str(path))}: a picture is written as .png or .html "
            f"(the suffix is {shown(suffix or '(none)')})"
        )
    return None


def write_timeline(tl: Timeline, path: str | os.PathLike[str]) -> Path:
    """Write the picture to `path`: PNG, or an HTML page when it ends in .html (anything
    else is a ValueError naming the suffixes allowed). Through `workbench.outputs`."""
    from workbench.outputs import write_file

    problem = timeline_problem(path)
    if problem is not None:
        raise ValueError(f"timeline {problem}")
    data = tl.html().encode() if Path(path).suffix.lower() == ".html" else tl.png()
    write_file(path, data)
    return Path(path)


def write_snapshot(snapshot: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `snapshot` (`memory_snapshot()`'s dict) as the pickle torch's memory viewer
    opens (torch.cuda.memory._memory_viz, https://pytorch.org/memory_viz)."""
    import pickle

    from workbench.outputs import write_file

    write_file(path, pickle.dumps(snapshot))
    return Path(path)


__all__ = [
    "GROUPS",
    "TIMELINE_SUFFIXES",
    "LiveTensor",
    "Timeline",
    "memory_snapshot",
    "side_by_side",
    "timeline",
    "timeline_problem",
    "trace_of_snapshot",
    "write_snapshot",
    "write_timeline",
]
