"""EstimatorPanel: a view over `workbench.estimate.estimate_memory` / `compare_stages`.

Inputs are text fields parsed here (typed garbage is reported beside the field) and
dropdowns for the choices. A model preset fills the shape fields (layers, hidden size,
heads, kv heads, MLP size and type, sequence length, vocabulary, tied embeddings); a
field changed afterwards overrides the preset, as `--seq-len` does with `--model`.
Tensor-parallel size, pipeline stages and sequence parallelism split the model as
`estimate_memory` describes; the GPU count is their product times the data-parallel size.

Any change recomputes the estimate and redraws one persistent figure: a stacked bar of
the peak of one training step per GPU (`MemoryEstimate.peak`: model states, activations,
the logits and loss, then each transient term in its own colour, hatched, and the CUDA
context and allocator reserve on top; its label shows the tp x pp x dp split) next to
ZeRO stages 0-3 and FSDP side by side, each with the GPU's memory as a horizontal line.
The peak's settings (attention kernel, dropout, gradient accumulation, optimizer
implementation, chunked loss) are fields too. Invalid input shows its message beside the
field and the last valid chart stays.

Past 600 lines because the fields, their parsing into `estimate_memory` arguments and the
one figure are a single view; shared helpers live in `ui/fields.py` and `ui/charts.py`,
the dry-run button's work in `ui/estimator_dry_run.py`.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets
from matplotlib.patches import Rectangle

from workbench.config import OptimizerName, Precision
from workbench.estimate import (
    DEFAULT_MFU,
    MODELS,
    Checkpointing,
    EstimateInputError,
    MemoryEstimate,
    Mlp,
    compare_engines,
    estimate_memory,
    gpu_names,
)
from workbench.estimate.schema import (
    FIELDS,
    OVERHEAD_AUTO,
    PANEL_COLUMNS,
    EstimateField,
    labels,
    panel_fields,
)
from workbench.estimate.tied_embedding import TIED_SUM_TERM
from workbench.inputs import shown
from workbench.ui.charts import Chart
from workbench.ui.estimator_dry_run import DryRunControl
from workbench.ui.fields import (
    UNITS,
    Field,
    dropdown_field,
    format_bytes,
    format_seconds,
    parse_count,
    parse_float,
    parse_int,
    status_html,
    text_field,
)
from workbench.ui.panel import PanelBase

COLUMNS = 5  # the comparison: ZeRO stages 0-3 and FSDP full_shard

#: (segment, legend label, colour, hatched: a transient of the step)
SEGMENTS = (
    ("parameters", "parameters", "#1565c0", False),
    ("gradients", "gradients", "#43a047", False),
    ("optimizer states", "optimizer states", "#fb8c00", False),
    ("activations", "activations", "#8e24aa", False),
    ("logits and loss", "logits and loss", "#ba68c8", False),
    ("optimizer step temporaries", "optimizer temporaries", "#e53935", True),
    ("autocast weight casts", "weight casts (autocast, 4-bit)", "#f06292", True),
    ("backward transient", "backward transient", "#ff8a65", True),
    ("engine buffers", "buckets / gathered params", "#6d4c41", True),
    ("reserve", "CUDA context + reserve", "#bdbdbd", False),
)
#: Peak terms drawn together as "engine buffers".
ENGINE_TERMS = (
    "DDP gradient buckets",
    "FSDP gathered parameters",
    "FSDP unsharded gradients",
    "ZeRO-3 gathered parameters",
    "DeepSpeed reduce buckets",
    "DeepSpeed flattened reduce copy",
    "DeepSpeed fp32 gradient partition",
    "DeepSpeed flattened gradient partition",
)
#: Other peak terms, drawn in the segment of their kind.
TERM_SEGMENTS = {
    "LoRA adapter activations": "activations",
    "document mask": "activations",
    "QLoRA dequantized weight": "autocast weight casts",
    TIED_SUM_TERM: "backward transient",
}
DROPOUT = {"model's": None, "on": True, "off": False}


def segment_bytes(e: MemoryEstimate) -> dict[str, int]:
    """The bytes of each chart segment of an estimate's peak (see `SEGMENTS`)."""
    terms = e.peak_terms
    out = {name: 0 for name, *_ in SEGMENTS}
    for term, value in terms.items():
        name = "engine buffers" if term in ENGINE_TERMS else TERM_SEGMENTS.get(term, term)
        out[name if name in out else "engine buffers"] += value
    out["reserve"] = e.overhead_bytes
    return out


MODE_PARAMS = "parameter count"
MODE_SHAPE = "transformer shape"
CUSTOM = "custom"

# UI labels of estimator fields (used to name fields in messages), from the schema
LABELS = labels()
SHAPE_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab")
# filled by a preset; the optional ones may be left empty (the estimator's defaults)
ARCH_FIELDS = ("kv_heads", "ffn_hidden", "mlp", "tied_embeddings")
OPTIONAL_INTS = ("kv_heads", "ffn_hidden")


def _field(spec: EstimateField, value: Any) -> Field:
    """The panel's field of estimator keyword `spec`: a dropdown of its choices (of the
    presets, the GPU catalog, the dropout's "model's"/on/off), a checkbox for a switch, a
    text field for a number or a count."""
    css = f"wb-est-{spec.name.replace('_', '-')}"
    label = spec.label or spec.name
    options: list[Any] | None = None
    if spec.kind == "model":
        options = [CUSTOM, *MODELS]
    elif spec.kind == "gpu":
        options = gpu_names()
    elif spec.name == "dropout":
        options = list(DROPOUT)
    elif spec.choices:
        options = list(spec.choices)
    if options is not None:
        return dropdown_field(label, options, value, css)
    if spec.kind == "bool":
        return Field(label, widgets.Checkbox(value=bool(value), indent=False), css)
    return text_field(label, value, css)


class EstimatorPanel(PanelBase):
    """Interactive memory / time / cost estimate.

    `fields[name]` are the inputs (names as in `estimate_memory`), `estimate` the last
    valid `MemoryEstimate`, `stages` the last valid stage 0-3 comparison, `errors()`
    the messages now shown beside fields.

    Beside a training session (the dashboard), `training_device` names the device it
    trains on ("the CPU", "NVIDIA H100 80GB HBM3") and `training_gpu` that GPU's catalog
    name, if it has one: the GPU field starts at it, and the chart says under the bars
    which GPU the estimate assumes and whether it is the one training.
    """

    def __init__(
        self,
        *,
        units: str = "GiB",
        training_device: str | None = None,
        training_gpu: str | None = None,
        **initial: Any,
    ) -> None:
        super().__init__()
        if units not in UNITS:
            raise ValueError(f"units={shown(units)}: must be one of {', '.join(UNITS)}")
        if training_device is not None and not isinstance(training_device, str):
            raise ValueError(
                f"training_device={shown(training_device)}: must be a device's name or None"
            )
        if training_gpu is not None and training_gpu not in gpu_names():
            raise ValueError(
                f"training_gpu={shown(training_gpu)}: must be None or one of "
                f"{', '.join(gpu_names())}"
            )
        self.training_device = training_device
        self.training_gpu = training_gpu
        defaults: dict[str, Any] = {
            "model": CUSTOM,
            "n_params": "7B",
            "layers": "32",
            "hidden": "4096",
            "heads": "32",
            "seq_len": "2048",
            "vocab": "32000",
            "kv_heads": "",
            "ffn_hidden": "",
            "mlp": Mlp.GELU.value,
            "tied_embeddings": True,
            "micro_batch": "1",
            "precision": Precision.AMP_BF16.value,
            "optimizer": OptimizerName.ADAMW.value,
            "zero_stage": 2,
            "gpus": "8",
            "tensor_parallel": "1",
            "pipeline_parallel": "1",
            "context_parallel": "1",
            "sequence_parallel": False,
            "offload_optimizer": False,
            "offload_params": False,
            "checkpointing": Checkpointing.SELECTIVE.value,
            "attention": "sdpa",
            "dropout": "model's",
            "grad_accum": "1",
            "optimizer_impl": "auto",
            "loss_chunks": "1",
            "compile": False,
            "gpu": training_gpu or "a100-80gb",
            "overhead_gib": OVERHEAD_AUTO,
            "tokens": "140B",
            "mfu": f"{DEFAULT_MFU:g}",
            "price_per_gpu_hour": "2.0",
            "lora_rank": "0",
            "qlora": False,
        }
        unknown = sorted(set(initial) - set(defaults) - {"mode"})
        if unknown:
            raise ValueError(
                f"{unknown[0]}={initial[unknown[0]]!r}: unknown input; known inputs: "
                + ", ".join(["mode", *defaults])
            )
        mode = initial.pop("mode", MODE_SHAPE)
        if mode not in (MODE_PARAMS, MODE_SHAPE):
            raise ValueError(f"mode={shown(mode)}: must be {MODE_PARAMS!r} or {MODE_SHAPE!r}")
        values = {**defaults, **{k: v for k, v in initial.items()}}
        if values["model"] != CUSTOM and values["model"] not in MODELS:
            raise ValueError(
                f"model={values['model']!r}: must be {CUSTOM!r} or one of {', '.join(MODELS)}"
            )
        if values["model"] != CUSTOM:  # the preset's shape, then any shape given too
            values = {**values, **self._preset_values(values["model"]), **initial}
        for k in values:
            if k in defaults and isinstance(defaults[k], str) and not isinstance(values[k], str):
                values[k] = f"{values[k]:g}" if isinstance(values[k], float) else str(values[k])

        f: dict[str, Field] = {}
        for spec in FIELDS:  # the panel's fields, declared in `workbench.estimate.schema`
            if spec.label is not None:
                f[spec.name] = _field(spec, values[spec.name])
        f["tokens"].widget.placeholder = "e.g. 300B (empty: no time)"
        f["kv_heads"].widget.placeholder = "empty: = heads"
        f["ffn_hidden"].widget.placeholder = "empty: 4h (SwiGLU 8h/3)"
        f["price_per_gpu_hour"].widget.placeholder = "USD (empty: no cost)"
        self.fields = f
        self.mode = widgets.ToggleButtons(options=[MODE_PARAMS, MODE_SHAPE], value=mode)
        self.mode.add_class("wb-est-mode")
        self.units = widgets.ToggleButtons(options=list(UNITS), value=units)
        self.units.add_class("wb-est-units")
        self.summary = widgets.HTML()
        self.summary.add_class("wb-est-summary")
        self.status = widgets.HTML()
        self.status.add_class("wb-est-status")

        self.estimate: MemoryEstimate | None = None
        self.stages: tuple[MemoryEstimate, ...] = ()
        self.recomputes = 0

        self.chart = Chart(8.5, 3.6, css="wb-est-chart")
        self._build_chart()

        column = widgets.Layout(margin="0 18px 0 0")

        def boxes(name: str) -> list[Any]:
            return [
                widgets.HTML(f"<b>{PANEL_COLUMNS[name]}</b>"),
                *(f[n].box for n in panel_fields(name)),
            ]

        model = widgets.VBox([*boxes("model")[:1], self.mode, *boxes("model")[1:]], layout=column)
        setup = widgets.VBox(boxes("setup"), layout=column)
        step = widgets.VBox(boxes("step"), layout=column)
        cost = widgets.VBox(
            [
                *boxes("cost"),
                widgets.HBox(
                    [widgets.HTML("<b>units</b>", layout=widgets.Layout(width="130px")), self.units]
                ),
            ],
            layout=column,
        )
        self.units.style.button_width = "70px"
        self.mode.style.button_width = "160px"
        wrap = widgets.Layout(flex_flow="row wrap", align_items="flex-start")
        self.dry = DryRunControl()
        self.dry.button.on_click(lambda _b: self.start_dry_run())
        top = widgets.HBox(
            [
                self.chart.image,
                widgets.VBox(
                    [
                        self.summary,
                        self.status,
                        widgets.HBox([self.dry.button, self.dry.status]),
                        self.dry.picture,
                    ]
                ),
            ],
            layout=wrap,
        )
        inputs = widgets.HBox([model, setup, step, cost], layout=wrap)
        self.widget = widgets.VBox([top, inputs], layout=widgets.Layout(padding="6px"))
        self.widget.add_class("wb-estimator-panel")

        self._filling = False
        for name, field in f.items():
            if name != "model":
                field.widget.observe(self._on_change, names="value")
        f["model"].widget.observe(self._on_model, names="value")
        self.mode.observe(self._on_mode, names="value")
        self.units.observe(self._on_units, names="value")
        self._apply_mode_visibility()
        self.recompute()

    # ------------------------------------------------------------------ chart
    def _build_chart(self) -> None:
        fig = self.chart.figure
        fig.subplots_adjust(left=0.09, right=0.98, top=0.9, bottom=0.16, wspace=0.28)
        self._ax_setup = fig.add_subplot(1, 2, 1)
        self._ax_stages = fig.add_subplot(1, 2, 2)
        self._rects: dict[str, list[Rectangle]] = {}
        for name, label, color, transient in SEGMENTS:
            hatch = "//" if transient else None
            style = dict(width=0.6, color=color, hatch=hatch, edgecolor="white", linewidth=0)
            bars = self._ax_setup.bar([0], [0.0], label=label, **style)
            sbars = self._ax_stages.bar(range(COLUMNS), [0.0] * COLUMNS, **style)
            self._rects[name] = [*bars.patches, *sbars.patches]
        self._gpu_lines = [
            ax.axhline(0.0, color="#c62828", linestyle="--", linewidth=1.5)
            for ax in (self._ax_setup, self._ax_stages)
        ]
        self._gpu_label = self._ax_setup.text(
            0.98,
            0.0,
            "",
            color="#c62828",
            fontsize=8,
            ha="right",
            va="bottom",
            transform=self._ax_setup.get_yaxis_transform(),
        )
        self._totals = [
            self._ax_setup.text(0, 0, "", ha="center", va="bottom", fontsize=8),
            *(
                self._ax_stages.text(i, 0, "", ha="center", va="bottom", fontsize=8)
                for i in range(COLUMNS)
            ),
        ]
        self.chart.animate(
            *(r for rects in self._rects.values() for r in rects),
            *self._gpu_lines,
            self._gpu_label,
            *self._totals,
            self._ax_setup.title,
        )
        self._background_key: tuple[Any, ...] | None = None
        self._ax_setup.set_xticks([0])
        self._ax_setup.set_xlim(-0.7, 0.7)
        self._ax_stages.set_xticks(range(COLUMNS))
        self._ax_stages.set_xticklabels([*(f"ZeRO {i}" for i in range(4)), "FSDP\nfull_shard"])
        self._ax_stages.set_title("the peak under ZeRO and FSDP (per GPU)", fontsize=10)
        self._ax_setup.legend(loc="upper left", fontsize=6, framealpha=0.85)
        for ax in (self._ax_setup, self._ax_stages):
            ax.grid(True, axis="y", alpha=0.3)

    def _draw(self) -> None:
        e, stages = self.estimate, self.stages
        if e is None:
            return
        unit = UNITS[self.units.value]
        columns = [e, *stages]
        tops = []
        for col, est in enumerate(columns):
            bottom = 0.0
            parts = segment_bytes(est)
            for name, *_ in SEGMENTS:
                h = parts[name] / unit
                rect = self._rects[name][col]
                rect.set_y(bottom)
                rect.set_height(h)
                bottom += h
            tops.append(bottom)
            self._totals[col].set_position((0 if col == 0 else col - 1, bottom))
            self._totals[col].set_text(f"{bottom:,.1f}")
        gpu_mem = e.gpu_memory_bytes / unit if e.gpu_memory_bytes else None
        for line in self._gpu_lines:
            line.set_visible(gpu_mem is not None)
            if gpu_mem is not None:
                line.set_ydata([gpu_mem, gpu_mem])
        self._gpu_label.set_text(
            f"{e.gpu}: {gpu_mem:,.0f} {self.units.value}" if gpu_mem is not None else ""
        )
        self._gpu_label.set_y(gpu_mem or 0.0)
        # the y-limit changes only when the bars outgrow it or shrink well below it, so
        # most changes redraw just the bars over the cached axes
        tallest = max([*tops, gpu_mem or 0.0, 1e-9])
        _, ymax = self._ax_setup.get_ylim()
        if tallest > ymax / 1.05 or tallest < 0.45 * ymax:
            ymax = tallest * 1.18
        fits = self._verdict(e, self.units.value)
        engine = f"FSDP {e.fsdp}" if e.fsdp != "off" else f"ZeRO {e.zero_stage}"
        self._ax_setup.set_title(f"peak of a step ({engine}) {fits}", fontsize=10)
        background = (
            ymax,
            self.units.value,
            e.gpus,
            e.zero_stage,
            e.tensor_parallel,
            e.pipeline_parallel,
            e.gpu,
        )
        if background != self._background_key:
            self._background_key = background
            for ax in (self._ax_setup, self._ax_stages):
                ax.set_ylim(0, ymax)
                ax.set_ylabel(f"{self.units.value} per GPU")
            self._ax_setup.set_xticklabels([_split_label(e)])
            self._ax_setup.set_xlabel(self.assumed_gpu_text(), fontsize=8, color="#616161")
            current = 4 if e.fsdp != "off" else e.zero_stage
            for i, label in enumerate(self._ax_stages.get_xticklabels()):
                label.set_fontweight("bold" if i == current else "normal")
            self.chart.invalidate()
        self.chart.render()

    def assumed_gpu_text(self) -> str:
        """Under the bars beside a training session: the GPU the estimate assumes, and
        whether the session trains on it ("" for a panel on its own, or without a GPU)."""
        e = self.estimate
        if self.training_device is None or e is None or not e.gpu:
            return ""
        if e.gpu == self.training_gpu:
            return f"{e.gpu}: the GPU this session trains on"
        return f"{e.gpu} assumed; this session trains on {self.training_device}"

    def chart_data(self) -> dict[str, list[float]]:
        """Segment heights now drawn, in the chart's units: [this setup, ZeRO 0..3, FSDP]."""
        return {name: [r.get_height() for r in rects] for name, rects in self._rects.items()}

    def gpu_line_value(self) -> float | None:
        line = self._gpu_lines[0]
        return float(line.get_ydata()[0]) if line.get_visible() else None

    def charts(self) -> list[Chart]:
        return [self.chart]

    # ------------------------------------------------------------------ inputs
    def _apply_mode_visibility(self) -> None:
        shape = self.mode.value == MODE_SHAPE
        self.fields["n_params"].box.layout.display = "none" if shape else None
        for name in ("model", *SHAPE_FIELDS, *ARCH_FIELDS):
            self.fields[name].box.layout.display = None if shape else "none"

    @staticmethod
    def _preset_values(name: str) -> dict[str, Any]:
        arch = MODELS[name].architecture
        return {
            "layers": str(arch.layers),
            "hidden": str(arch.hidden),
            "heads": str(arch.heads),
            "seq_len": str(arch.seq_len),
            "vocab": str(arch.vocab),
            "kv_heads": str(arch.kv_heads),
            "ffn_hidden": str(arch.ffn_hidden),
            "mlp": arch.mlp,
            "tied_embeddings": arch.tied_embeddings,
        }

    def set_values(self, values: dict[str, Any]) -> bool:
        """Put `values` (field name -> value as the constructor takes them, and "mode")
        into the fields, then one recompute; an unknown name is refused by name and
        nothing changes. True when the new inputs estimate."""
        unknown = sorted(set(values) - set(self.fields) - {"mode"})
        if unknown:
            raise ValueError(
                f"{unknown[0]}={shown(values[unknown[0]])}: unknown input; known inputs: "
                + ", ".join(["mode", *self.fields])
            )
        mode = values.get("mode", self.mode.value)
        if mode not in (MODE_PARAMS, MODE_SHAPE):
            raise ValueError(f"mode={shown(mode)}: must be {MODE_PARAMS!r} or {MODE_SHAPE!r}")
        self._filling = True
        try:
            for name, value in values.items():
                if name == "mode":
                    continue
                widget = self.fields[name].widget
                if isinstance(widget.value, str) and not isinstance(value, str):
                    value = f"{value:g}" if isinstance(value, float) else str(value)
                widget.value = value
            self.mode.value = mode
        finally:
            self._filling = False
        return self.recompute()

    def _on_model(self, change: dict[str, Any]) -> None:
        """A preset fills the shape fields (one recompute for all of them)."""
        name = change["new"]
        if name != CUSTOM:
            self._filling = True
            try:
                for field, value in self._preset_values(name).items():
                    self.fields[field].widget.value = value
                if self.mode.value != MODE_SHAPE:
                    self.mode.value = MODE_SHAPE
            finally:
                self._filling = False
        self.recompute()

    def _on_mode(self, _change: dict[str, Any]) -> None:
        self._apply_mode_visibility()
        if not self._filling:
            self.recompute()

    def _on_units(self, _change: dict[str, Any]) -> None:
        self._show_summary()
        self._draw()

    def _on_change(self, _change: dict[str, Any]) -> None:
        if not self._filling:
            self.recompute()

    def read_inputs(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(keyword arguments for estimate_memory, field -> parse error)."""
        f = self.fields
        kwargs: dict[str, Any] = {}
        errors: dict[str, str] = {}

        def take(name: str, fn: Any, **kw: Any) -> None:
            try:
                kwargs[name] = fn(LABELS[name], f[name].value, **kw)
            except ValueError as exc:
                errors[name] = str(exc)

        if self.mode.value == MODE_SHAPE:
            if f["model"].value != CUSTOM:
                kwargs["model"] = f["model"].value
            for name in SHAPE_FIELDS:
                take(name, parse_int, minimum=1)
            for name in OPTIONAL_INTS:
                if f[name].value.strip():
                    take(name, parse_int, minimum=1)
            kwargs["mlp"] = f["mlp"].value
            kwargs["tied_embeddings"] = f["tied_embeddings"].value
        else:
            take("n_params", parse_count)
        take("micro_batch", parse_int, minimum=1)
        take("grad_accum", parse_int, minimum=1)
        take("loss_chunks", parse_int, minimum=1)
        kwargs["compile"] = f["compile"].value
        take("lora_rank", parse_int, minimum=0, maximum=4096)
        kwargs["qlora"] = f["qlora"].value
        kwargs["dropout"] = DROPOUT[f["dropout"].value]
        take("gpus", parse_int, minimum=1)
        take("tensor_parallel", parse_int, minimum=1)
        take("pipeline_parallel", parse_int, minimum=1)
        take("context_parallel", parse_int, minimum=1)
        if f["overhead_gib"].value.strip().lower() not in ("", OVERHEAD_AUTO):
            take("overhead_gib", parse_float, minimum=0.0)  # else derived from the setup
        take("mfu", parse_float, minimum=0.0, maximum=1.0, exclusive_minimum=True)
        take("price_per_gpu_hour", parse_float, minimum=0.0, optional=True)
        tokens_text = f["tokens"].value.strip()
        if tokens_text:
            take("tokens", parse_count)
        else:
            kwargs["tokens"] = None
            kwargs["price_per_gpu_hour"] = None  # no tokens: no time, so nothing to price
        for name in (
            "precision",
            "optimizer",
            "zero_stage",
            "checkpointing",
            "attention",
            "optimizer_impl",
            "gpu",
            "offload_optimizer",
            "offload_params",
            "sequence_parallel",
        ):
            kwargs[name] = f[name].value
        return kwargs, errors

    def recompute(self) -> bool:
        """Parse the inputs, estimate, redraw. False (and messages beside the fields, the
        last valid chart kept) when an input is invalid."""
        self.recomputes += 1
        kwargs, errors = self.read_inputs()
        estimate: MemoryEstimate | None = None
        stages: tuple[MemoryEstimate, ...] = ()
        if not errors:
            try:
                estimate = estimate_memory(**kwargs)
                opts = {k: v for k, v in kwargs.items() if k != "zero_stage"}
                stages = compare_engines(**opts)
            except EstimateInputError as exc:
                other = "model" if self.mode.value == MODE_SHAPE else "n_params"
                for p in exc.problems:
                    name = p.field if p.field in self.fields else other
                    text = p.render(name=lambda n: LABELS.get(n, n))
                    errors[name] = f"{errors[name]}; {text}" if name in errors else text
            except ValueError as exc:  # any other rejection: show it, keep the chart
                errors["model" if self.mode.value == MODE_SHAPE else "n_params"] = str(exc)
        for name, field in self.fields.items():
            field.set_error(errors.get(name))
        if errors:
            self.status.value = status_html(
                "error",
                "Invalid input (see the message beside the field); the chart shows the last "
                "valid estimate.",
            )
            return False
        assert estimate is not None
        self.estimate, self.stages = estimate, stages
        self.status.value = ""
        self._show_summary()
        self._draw()
        return True

    # ------------------------------------------------------------------ the dry run
    def _dry_key(self) -> tuple[Any, ...] | None:
        """The setup a dry run is cached under (None without a valid shaped estimate)."""
        e = self.estimate
        if e is None or e.layers is None:
            return None
        kwargs, _ = self.read_inputs()
        return tuple(sorted((k, str(v)) for k, v in kwargs.items()))

    def start_dry_run(self) -> bool:
        """Run the dry run of this setup off the kernel's thread (`ui/estimator_dry_run`);
        its peak then shows in the summary. False (and why, beside the button) when the
        setup cannot be simulated."""
        kwargs, _ = self.read_inputs()
        return self.dry.start(self.estimate, kwargs, self._dry_key(), self._dry_done)

    def _dry_done(self, key: tuple[Any, ...]) -> None:
        if self._dry_key() == key:
            self._show_summary()

    def wait_for_dry_run(self, timeout: float | None = 300) -> None:
        """Wait for a running dry run to finish."""
        self.dry.wait(timeout)

    @property
    def dry_runs(self) -> dict[tuple[Any, ...], Any]:
        """Per setup: its `DryRun`, or the error that stopped it."""
        return self.dry.runs

    @property
    def dry_status(self) -> widgets.HTML:
        return self.dry.status

    def errors(self) -> dict[str, str]:
        """Messages now shown beside fields, by field name."""
        return {n: f.error_text for n, f in self.fields.items() if f.error_text}

    # ------------------------------------------------------------------ summary
    @staticmethod
    def _verdict(e: MemoryEstimate, u: str) -> str:
        """`MemoryEstimate.verdict` in the panel's units ("" without a GPU)."""
        margin = e.margin_bytes
        if margin is None:
            return ""
        if margin >= 0:
            return f"fits with {format_bytes(margin, u)} to spare" + e.without_activations
        name, value = e.largest_term
        return (
            f"does not fit: over by {format_bytes(-margin, u)}, the largest term is {name} "
            f"({format_bytes(value, u)})" + e.without_activations
        )

    @staticmethod
    def _reserve_rows(e: MemoryEstimate, u: str) -> list[tuple[str, str]]:
        """Allocated, reserved and what nvidia-smi shows: three named lines, with the
        reserve's terms between them (`MemoryEstimate.reserve`)."""
        r = e.reserve
        if r is None or r.given_bytes is not None:
            return [
                ("+ CUDA context and reserve (given)", format_bytes(e.overhead_bytes, u)),
                ("what nvidia-smi shows", format_bytes(e.required_bytes, u)),
            ]
        context = "measured" if r.context_measured else "assumed"
        reserved = e.reserved_peak_bytes or e.peak_bytes
        return [
            ("+ allocator reserve (rounding)", format_bytes(r.allocator_bytes, u)),
            ("reserved peak (max_memory_reserved)", format_bytes(reserved, u)),
            (f"+ CUDA context ({context})", format_bytes(r.context_bytes, u)),
            ("+ NCCL buffers", format_bytes(r.nccl_bytes, u)),
            ("what nvidia-smi shows", format_bytes(e.required_bytes, u)),
        ]

    def _show_summary(self) -> None:
        e = self.estimate
        if e is None:
            return
        u = self.units.value
        rows = []
        if e.model is not None:
            rows.append(("model", html.escape(e.model)))
        rows += [
            ("parameters", f"{e.n_params:,}"),
        ]
        if e.tensor_parallel > 1 or e.pipeline_parallel > 1 or e.context_parallel > 1:
            cp = e.context_parallel
            split = (
                f"tp {e.tensor_parallel} &times; pp {e.pipeline_parallel} &times; "
                + (f"cp {cp} &times; " if cp > 1 else "")
                + f"dp {e.data_parallel // cp}"
                + (" (sequence parallel)" if e.sequence_parallel else "")
            )
            rows.append(("GPU split", split))
            rows.append(("parameters per GPU before ZeRO", f"{e.shard_params:,}"))
        phase = e.peak.phase if e.peak is not None else ""
        rows += [
            (
                f"peak of a step per GPU, allocated (at the {phase})",
                f"<b>{format_bytes(e.peak_bytes, u)}</b>",
            ),
        ]
        rows += self._reserve_rows(e, u)
        for term, value in e.peak_terms.items():
            if term not in ("parameters", "gradients", "optimizer states") and value:
                label = f"{term} ({e.optimizer_impl})" if "temporaries" in term else term
                rows.append((f"· {label}", format_bytes(value, u)))
        rows += [
            ("model states at rest", format_bytes(e.model_states_bytes, u)),
            (
                "stored activations",
                format_bytes(e.activation_bytes, u)
                if e.activation_bytes is not None
                else "n/a (give a transformer shape)",
            ),
        ]
        saving = e.peak.chunked_loss_saving_bytes if e.peak is not None else None
        if saving:
            rows.append(("8 loss chunks would save", format_bytes(saving, u)))
        dry = self.dry.runs.get(self._dry_key()) if hasattr(self, "dry") else None
        if dry is not None and not isinstance(dry, Exception):
            rows.append(
                (
                    f"peak of a step, dry run (at the {dry.phase})",
                    f"<b>{format_bytes(dry.peak_bytes, u)}</b>",
                )
            )
        if e.gpu_memory_bytes is not None:
            color = "#2e7d32" if e.fits else "#c62828"
            verdict = (
                f'<span style="color:{color}"><b>{html.escape(self._verdict(e, u))}</b></span>'
            )
            rows.append((f"{e.gpu} ({format_bytes(e.gpu_memory_bytes, u)})", verdict))
            if e.activation_bytes is not None:
                rows.append(
                    (
                        "max micro-batch",
                        str(e.max_micro_batch) if e.max_micro_batch else "none (not even 1 fits)",
                    )
                )
        if e.cpu_offload_bytes:
            rows.append(("CPU offload per GPU", format_bytes(e.cpu_offload_bytes, u)))
        for term, value in (e.peak.host_terms if e.peak is not None else {}).items():
            # beside the device peak (paged states: CUDA unified memory; offloaded
            # activations: host memory), not in it nor in the verdict
            rows.append((f"{term}, beside the peak", format_bytes(value, u)))
        if e.train_flops is not None:
            rows.append(("training FLOPs", f"{e.train_flops:.3g}"))
            rows.append(
                (
                    "time",
                    format_seconds(e.train_seconds)
                    + (f" on {e.gpus} GPUs at {e.utilisation_text}" if e.train_seconds else ""),
                )
            )
            if e.cost is not None:
                rows.append(("cost", f"${e.cost:,.0f}"))
        cells = "".join(
            f"<tr><td style='padding-right:12px'>{html.escape(k)}</td><td>{v}</td></tr>"
            for k, v in rows
        )
        self.summary.value = f"<table>{cells}</table>"

    def __repr__(self) -> str:
        e = self.estimate
        if e is None:
            return "EstimatorPanel(no valid estimate)"
        return (
            f"EstimatorPanel(peak per GPU {format_bytes(e.peak_bytes, self.units.value)}, "
            f"ZeRO {e.zero_stage}, {e.gpus} GPU(s), fits={e.fits})"
        )


def _split_label(e: MemoryEstimate) -> str:
    gpus = f"{e.gpus} GPU{'s' if e.gpus > 1 else ''}"
    cp = e.context_parallel
    if e.tensor_parallel == 1 and e.pipeline_parallel == 1 and cp == 1:
        return gpus
    layout = f"tp {e.tensor_parallel} x pp {e.pipeline_parallel} x " + (
        f"cp {cp} x " if cp > 1 else ""
    )
    return f"{gpus}: {layout}dp {e.data_parallel // cp}"
