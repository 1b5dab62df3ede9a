"""PlannerPanel: `workbench.planner.plan` in a panel (the dashboard's Planner tab).

Pick a model preset, the GPU, GPUs per node and nodes, the sequence length and the
global batch, and pin what you must (the engines, one precision, the attention kernel, no
offload, a LoRA rank, a memory headroom); give the compute's MFU (blank: published runs on
the GPU) and your cluster's nccl-tests output (a file path, blank: NCCL's own model of the
network, `workbench.planner.nccl_tests`) where you have them, or tick NCCL's default IB
settings where your jobs leave NCCL's InfiniBand settings untuned, press **plan**: the panel
ranks every setup the workbench trains there (pure math, well under a second) and shows the top plans (peak per GPU, step time,
tokens/s, MFU), why the first beats the next, and the fastest plan per memory budget.
A bad value shows its message (the field, the value, what is allowed) in the status
line and the last ranking stays.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from workbench.ui.fields import status_html
from workbench.ui.panel import PanelBase

_GIB = 1 << 30


class PlannerPanel(PanelBase):
    """Which setup should I run (module docstring). `plan()` is what the button does;
    `result` holds the last ranking (a `PlanResult`, None before the first)."""

    def __init__(
        self,
        model: str = "llama-3-8b",
        gpu: str = "h100-80gb",
        *,
        gpus_per_node: int = 8,
        nodes: int = 1,
        seq_len: int = 4096,
        global_batch: int = 256,
        top: int = 10,
    ) -> None:
        from workbench.estimate import gpu_names, model_names

        super().__init__()
        self.result: Any = None
        self.top = top
        style = {"description_width": "120px"}
        self.model = widgets.Dropdown(
            options=model_names(), value=model, description="model", style=style
        )
        self.gpu = widgets.Dropdown(options=gpu_names(), value=gpu, description="GPU", style=style)
        self.gpus_per_node = widgets.IntText(
            gpus_per_node, description="GPUs per node", style=style
        )
        self.nodes = widgets.IntText(nodes, description="nodes", style=style)
        self.seq_len = widgets.IntText(seq_len, description="sequence", style=style)
        self.global_batch = widgets.IntText(global_batch, description="global batch", style=style)
        # the pins (plan()'s constraints)
        from workbench.choices import Precision
        from workbench.planner import ENGINES

        self.engines = widgets.SelectMultiple(
            options=list(ENGINES), value=list(ENGINES), description="engines", style=style,
            rows=len(ENGINES),
        )  # fmt: skip
        self.precision = widgets.Dropdown(
            options=["auto"] + [p.value for p in Precision], value="auto",
            description="precision", style=style,
        )  # fmt: skip
        self.attention = widgets.Dropdown(
            options=["sdpa", "eager"], value="sdpa", description="attention", style=style
        )
        self.optimizer = widgets.Dropdown(
            options=["adamw", "adam8bit"], value="adamw", description="optimizer", style=style
        )
        self.offload = widgets.Checkbox(True, description="CPU offload allowed", indent=False)
        self.lora_rank = widgets.IntText(0, description="LoRA rank (0 off)", style=style)
        self.headroom = widgets.FloatText(0.0, description="headroom", style=style)
        self.mfu = widgets.Text(
            "", placeholder="blank: published runs", description="MFU", style=style
        )
        self.nccl_tests = widgets.Text(
            "", placeholder="blank: NCCL's model", description="nccl-tests file", style=style
        )
        self.nccl_ib_defaults = widgets.Checkbox(
            False, description="NCCL's default IB settings (untuned)", indent=False
        )
        self.button = widgets.Button(description="plan", button_style="primary")
        self.button.on_click(lambda _: self.plan())
        self.status = widgets.HTML(status_html("info", "Rank every setup that fits: press plan."))
        self.status.add_class("wb-planner-status")
        self.table = widgets.HTML()
        self.table.add_class("wb-planner-table")
        self.why = widgets.HTML()
        self.why.add_class("wb-planner-why")
        setup = [self.model, self.gpu, self.gpus_per_node, self.nodes, self.seq_len]
        pins = [self.engines, self.precision, self.attention, self.optimizer, self.offload]
        inputs = widgets.HBox(
            [
                widgets.VBox(
                    [*setup, self.global_batch, self.mfu, self.nccl_tests, self.nccl_ib_defaults]
                ),
                widgets.VBox([*pins, self.lora_rank, self.headroom]),
            ]
        )
        self.widget = widgets.VBox([inputs, self.button, self.status, self.table, self.why])
        self.widget.add_class("wb-planner")

    def plan(self) -> Any:
        """Rank the setups for the inputs shown; the `PlanResult`, or None after showing
        why the inputs were refused (the last ranking stays)."""
        from workbench.planner import plan

        try:
            mfu, nccl_tests = self._optional_inputs()
            result = plan(
                model=self.model.value,
                gpu=self.gpu.value,
                gpus_per_node=int(self.gpus_per_node.value),
                nodes=int(self.nodes.value),
                seq_len=int(self.seq_len.value),
                global_batch=int(self.global_batch.value),
                engines=tuple(self.engines.value),
                precision=None if self.precision.value == "auto" else self.precision.value,
                attention=None if self.attention.value == "sdpa" else self.attention.value,
                optimizer=self.optimizer.value,
                offload=bool(self.offload.value),
                lora_rank=int(self.lora_rank.value),
                headroom=float(self.headroom.value),
                mfu=mfu,
                nccl_tests=nccl_tests,
                nccl_ib_defaults=bool(self.nccl_ib_defaults.value),
            )
        except ValueError as exc:
            self.status.value = status_html("error", str(exc))
            return None
        self.result = result
        c = result.cluster
        self.status.value = status_html(
            "ok",
            f"{len(result.plans)} of {result.searched} setups fit {c.nodes} x "
            f"{c.gpus_per_node} {c.gpu.name} at {result.global_batch} x {result.seq_len} "
            f"tokens a step; the fastest first; compute at {result.efficiency_source}"
            + (f"; {c.network_source}" if c.network_source else ""),
        )
        self.table.value = _table(result, self.top)
        rows = [html.escape(w) for w in result.why()]
        rows += [f"{b / _GIB:.2f} GiB: {html.escape(p.label())}" for b, p in result.by_budget()]
        self.why.value = (
            "<b>Why #1</b><br>" + "<br>".join(rows[: len(result.why())])
            + "<br><b>Fastest plan per memory budget</b><br>"
            + "<br>".join(rows[len(result.why()):])
        )  # fmt: skip
        return result

    def _optional_inputs(self) -> tuple[float | None, str | None]:
        """The MFU and the nccl-tests file as typed (None where blank); ValueError naming
        the field for an MFU that is not a number (plan() checks its range)."""
        text = self.mfu.value.strip()
        mfu = None
        if text:
            try:
                mfu = float(text)
            except ValueError:
                raise ValueError(
                    f"mfu={text!r}: must be a number, the share of the peak FLOP/s compute "
                    "reaches (e.g. 0.4), or blank for published runs on the GPU"
                ) from None
        path = self.nccl_tests.value.strip()
        return mfu, path or None

    def __repr__(self) -> str:
        best = self.result.best.label() if self.result is not None else "not planned yet"
        return f"PlannerPanel({self.model.value} on {self.gpu.value}: {best})"


def tied_ranks(step_seconds: list[float]) -> list[str]:
    """Each plan's place, "3=" where its step time as shown (0.1 ms) equals another's: the
    step-time model does not tell them apart, and the order among them is the tie-break
    (less communication, then less memory), not a predicted speed-up."""
    shown_ms = [round(s * 1e3, 1) for s in step_seconds]
    places = []
    for i, ms in enumerate(shown_ms):
        first = shown_ms.index(ms)
        tied = shown_ms.count(ms) > 1
        places.append(f"{first + 1}=" if tied else str(i + 1))
    return places


def tie_note(step_seconds: list[float]) -> str:
    """One line saying which of the shown plans tie, and why the order among them holds."""
    places = tied_ranks(step_seconds)
    groups = sorted({p for p in places if p.endswith("=")}, key=lambda p: int(p[:-1]))
    if not groups:
        return ""
    sizes = [f"{places.count(g)} plans at #{g[:-1]}" for g in groups]
    return (
        f"Tied ({', '.join(sizes)}): the same predicted step time to 0.1 ms, their compute "
        "at the same efficiency; among them the one that communicates less, then needs "
        "less memory, comes first"
    )


def _table(result: Any, top: int) -> str:
    head = ["#", "plan", "peak / GPU", "step", "tokens/s", "MFU", "HFU"]
    shown = result.plans[:top]
    places = tied_ranks([p.step_seconds for p in shown])
    rows = []
    for place, p in zip(places, shown, strict=True):
        cells = [
            place,
            html.escape(p.label()),
            f"{p.required_bytes / _GIB:.1f} GiB",
            f"{p.step_seconds * 1e3:,.1f} ms",
            f"{p.tokens_per_s:,.0f}",
            f"{p.mfu:.0%}",
            f"{p.hfu:.0%}",
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    note = tie_note([p.step_seconds for p in shown])
    caption = f"<caption>{html.escape(note)}</caption>" if note else ""
    return f"<table>{caption}{header}{''.join(rows)}</table>"


__all__ = ["PlannerPanel"]
