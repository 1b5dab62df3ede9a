"""CompressionPanel: a view over `workbench.compress.compress` for a session's model.

Pick methods (INT8 dynamic quantization, unstructured pruning, structured pruning of
channels or heads), a sparsity and the int8 engine, press **measure**: the panel takes the
session's current trained weights (`session.state_dict()`, between steps; a running
session keeps running), compresses copies of the model in a background thread
("workbench-compress"), and shows the report's table and chart. The session's model is
never changed. Bad settings show their message in the status line and nothing runs.

The model measured: a built-in model is rebuilt from `session.model_name` and
`session.model_options` with the trained weights; your own module is copied. Held-out
data: `held_out=` when given, else the last `held_out_fraction` of `session.data` (which
the session may have trained on: the status says so).

A method pays when it is smaller or faster and keeps its held-out quality within the
report's tolerance (`max_loss_ratio=`, `max_accuracy_drop=` among the measure options;
1.05x the loss before and 1 accuracy point by default); the status names the methods that
pay and those that are smaller or faster but lose more quality (retraining recovers it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from workbench.ui.panel import JobPanel

METHOD_CHOICES = (
    ("int8", "INT8 dynamic quantization"),
    ("prune", "unstructured pruning"),
    ("channels", "structured: channels"),
    ("heads", "structured: attention heads"),
)


def model_of_session(session: Any) -> Any:
    """A copy of the session's model with its current trained weights: a built-in model
    rebuilt from its name and options, or your module copied. The session's own module is
    not touched."""
    return _rebuilt(session)[0]


def _rebuilt(session: Any) -> tuple[Any, Any]:
    """(a copy of the session's model with its trained weights, the built-in model's loss
    or None), through the one resolver of model specs (`workbench.models.spec`)."""
    weights = session.state_dict()
    name = getattr(session, "model_name", None)
    loss_fn = None
    if name:
        from workbench.models.spec import resolve_model

        made = resolve_model(name, model_options=dict(session.model_options or {}))
        module, loss_fn = made.module, made.loss_fn
    else:
        module = copy.deepcopy(session.model)
    module.load_state_dict(weights)
    return module, loss_fn


def _paying(report: Any) -> str:
    """Which methods pay, and which gain but lose more quality than the tolerance allows."""
    verdicts = report.verdicts()
    paying = [v.method for v in verdicts if v.pays]
    text = f"pays here: {', '.join(paying) or 'none'}"
    lossy = [
        f"{v.method} ({v.lost})"
        for v in verdicts
        if v.quality == "lost" and v.outcome != "does not pay here"
    ]
    if lossy:
        text += (
            f"; smaller or faster but losing quality beyond the tolerance: {'; '.join(lossy)} "
            "(training the smaller model further can recover it)"
        )
    return text


class CompressionPanel(JobPanel):
    """Compress the session's model and show before/after (module docstring).

    `loss_fn`: the task's loss; needed for your own module (a built-in model brings its
    own). `held_out`: a held-out Dataset (default: the tail of `session.data`).
    `measure_options` go to `compress` (`batch_size`, `repeats`, `eval_samples`,
    `max_loss_ratio`, `max_accuracy_drop`).
    """

    def __init__(
        self,
        session: Any,
        *,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        held_out: Any | None = None,
        held_out_fraction: float = 0.1,
        **measure_options: Any,
    ) -> None:
        super().__init__(
            "compress",
            "Compress copies of the session's model and measure them; the session keeps training.",
        )
        self.session = session
        self._loss_fn = loss_fn
        self._held_out = held_out
        self._fraction = held_out_fraction
        self._options = {"repeats": 20, "eval_samples": 2048, **measure_options}
        self.report: Any | None = None

        self.methods = {
            key: widgets.Checkbox(value=key in ("int8", "prune", "channels"), description=label)
            for key, label in METHOD_CHOICES
        }
        for key, box in self.methods.items():
            box.add_class(f"wb-compress-{key}")
        self.sparsity = widgets.FloatSlider(
            value=0.5, min=0.0, max=0.95, step=0.05, description="sparsity", readout_format=".2f"
        )
        self.engine = widgets.Dropdown(
            options=["torchao", "torch.ao"], value="torchao", description="int8 engine"
        )
        self.button = widgets.Button(description="measure", button_style="primary", icon="compress")
        self.button.add_class("wb-compress-measure")
        self.button.on_click(lambda _: self.measure())
        self.widget = widgets.VBox(
            [
                widgets.HBox(list(self.methods.values())[:2]),
                widgets.HBox(list(self.methods.values())[2:]),
                widgets.HBox([self.sparsity, self.engine, self.button]),
                self.status,
                self.table,
                self.chart.image,
            ],
            layout=widgets.Layout(padding="6px"),
        )
        self.widget.add_class("wb-compress-panel")

    # ------------------------------------------------------------------ view
    def selected(self) -> list[str]:
        return [key for key, box in self.methods.items() if box.value]

    # ------------------------------------------------------------------ actions
    def measure(self, *, wait: bool = False) -> Any:
        """Check the settings and start measuring in a background thread (`wait=True`:
        block until done and return the report, or None on an error)."""
        from workbench.compress.compare import method_problems
        from workbench.compress.layers import sparsity_problem
        from workbench.compress.report import (
            MAX_ACCURACY_DROP,
            MAX_LOSS_RATIO,
            tolerance_problems,
        )

        if self.closed:
            return None
        if self.running:
            self._show_status("warning", "already measuring; wait for it to finish")
            return None
        methods = self.selected()
        problems = method_problems(methods)
        bad = sparsity_problem(self.sparsity.value)
        if bad:
            problems.append(bad)
        problems += tolerance_problems(
            self._options.get("max_loss_ratio", MAX_LOSS_RATIO),
            self._options.get("max_accuracy_drop", MAX_ACCURACY_DROP),
        )
        if problems:
            self.error = "; ".join(str(p) for p in problems)
            self._show_status("error", self.error)
            return None
        self.error = None
        self.button.disabled = True
        self._show_status("info", f"measuring {', '.join(methods)} ...")
        args = (methods, float(self.sparsity.value), self.engine.value)
        self._start(self._run, args, "workbench-compress", wait)
        return self.report if wait else None

    def _source(self) -> tuple[Any, Any, Any, str]:
        """(model copy, held-out data, loss, a note on where the held-out data came from)."""
        from workbench.compress.measure import held_out_split

        model, builtin_loss = _rebuilt(self.session)
        loss_fn = self._loss_fn if self._loss_fn is not None else builtin_loss
        if loss_fn is None:
            raise ValueError(
                "loss_fn=None: the session trains your own module; pass "
                "CompressionPanel(session, loss_fn=...) (the task's loss)"
            )
        if self._held_out is not None:
            return model, self._held_out, loss_fn, "held-out data as given"
        _, held = held_out_split(self.session.data, self._fraction)
        note = (
            f"held-out: the last {self._fraction:.0%} of the session's data, which it may "
            "have trained on"
        )
        return model, held, loss_fn, note

    def _run(self, methods: list[str], sparsity: float, engine: str) -> None:
        from workbench.compress import CompressionCancelled, compress

        try:
            model, held_out, loss_fn, note = self._source()
            if self._cancel.is_set():
                return
            report = compress(
                model,
                held_out,
                loss_fn,
                methods=methods,
                sparsity=sparsity,
                engine=engine,
                title=f"compression of {self.session.model_name or type(model).__name__}",
                cancel=self._cancel,
                # the tail of the session's data is "eval" data: the session may have seen it
                **{"held_out_unseen": self._held_out is not None, **self._options},
            )
            if self._cancel.is_set():
                return
            self.report = report
            self.table.value = report._repr_html_()
            self.chart.show(report.chart_png())
            self._show_status("ok", f"measured; {_paying(report)}. {note}.")
        except CompressionCancelled:
            self._show_status("info", "cancelled")
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self._show_status("error", self.error)
        finally:
            self.button.disabled = False

    def __repr__(self) -> str:
        state = "measuring" if self.running else ("measured" if self.report else "idle")
        return f"CompressionPanel({state}, methods={self.selected()})"
