"""LadderPanel: a view over `workbench.ladder`: what each optimization buys on this machine.

Set the baseline's steps, the repeats, an optional target loss, the LR rule of the
accumulation rung and which optional rungs to add (data parallel, torch.compile,
activation checkpointing), press **run ladder**: the panel checks the ladder at once (bad
settings show their message in the status line and nothing runs), then runs it in a
background thread ("workbench-ladder") with a progress bar, and shows its table and the
speed-up chart. **cancel** stops it at the next step; `close()` cancels and waits.

With a session, the ladder trains the session's built-in model from the session's basic
settings (micro-batch, learning rate, optimizer, seed): the rungs add the optimizations.
The session itself is not touched, but a session training at the same time shares the
machine with the ladder and slows it: pause it for clean figures (the status says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets

from workbench.ui.fields import Field, parse_float, parse_int, text_field
from workbench.ui.panel import JobPanel

#: The TrainConfig settings the ladder takes from a session: the model's training basics,
#: not the optimizations the rungs measure.
BASE_SETTINGS = ("micro_batch", "lr", "optimizer", "weight_decay", "momentum", "seed")


def base_of(config: Any) -> Any:
    """A TrainConfig with only `config`'s basic settings (`BASE_SETTINGS`)."""
    from workbench.config import TrainConfig

    return TrainConfig(**{name: getattr(config, name) for name in BASE_SETTINGS})


class LadderPanel(JobPanel):
    """Run an optimization ladder and show its table and chart (module docstring).

    `session`: take the model and basic settings from it (optional). Without one, `model`
    (a built-in name or a factory, default "tiny-gpt"), `model_options` and `base` (a
    TrainConfig) say what to train. `rungs`: a custom ladder (default: the built-in one,
    shaped by the panel's checkboxes). `steps`, `repeats`: the fields' starting values.
    `ladder_options` go to `workbench.ladder` (`device`, `launcher`, `memory`, `timeout`).
    """

    def __init__(
        self,
        session: Any | None = None,
        *,
        model: str | None = None,
        model_options: dict[str, Any] | None = None,
        base: Any | None = None,
        rungs: Sequence[Any] | None = None,
        steps: int = 16,
        repeats: int = 1,
        **ladder_options: Any,
    ) -> None:
        super().__init__(
            "ladder",
            "Train the same samples with each rung of settings, repeated and interleaved, "
            "and see what each one buys here.",
        )
        self.session = session
        self._model = model
        self._model_options = model_options
        self._base = base
        self._rungs = rungs
        self._options = dict(ladder_options)
        self.result: Any | None = None

        self.steps = text_field("baseline steps", str(steps), "wb-ladder-steps")
        self.repeats = text_field("repeats", str(repeats), "wb-ladder-repeats")
        self.target = text_field("target loss", "", "wb-ladder-target", placeholder="none")
        self.lr_scaling = widgets.Dropdown(
            options=["linear", "sqrt", "none"], value="linear", description="LR rule"
        )
        self.lr_scaling.add_class("wb-ladder-lr-scaling")
        self.kind = widgets.Dropdown(
            options=[("speed (the default ladder)", "speed"), ("memory techniques", "memory")],
            value="speed",
            description="ladder",
        )
        self.kind.add_class("wb-ladder-kind")
        self.kind.disabled = rungs is not None
        self.data_parallel = widgets.Checkbox(value=True, description="data parallel")
        self.compile = widgets.Checkbox(value=False, description="torch.compile")
        self.checkpointing = widgets.Checkbox(value=False, description="act. checkpointing")
        for key, box in (
            ("data-parallel", self.data_parallel),
            ("compile", self.compile),
            ("checkpointing", self.checkpointing),
        ):
            box.add_class(f"wb-ladder-{key}")
            box.disabled = rungs is not None  # a custom ladder names its own rungs
        self.button = widgets.Button(description="run ladder", button_style="primary", icon="play")
        self.button.add_class("wb-ladder-run")
        self.button.on_click(lambda _: self.run())
        self.cancel_button = widgets.Button(description="cancel", icon="stop", disabled=True)
        self.cancel_button.add_class("wb-ladder-cancel")
        self.cancel_button.on_click(lambda _: self.cancel())
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="")
        self.progress.add_class("wb-ladder-progress")
        self.progress_label = widgets.HTML("")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.steps.box, self.repeats.box]),
                widgets.HBox([self.target.box, self.lr_scaling, self.kind]),
                widgets.HBox([self.data_parallel, self.compile, self.checkpointing]),
                widgets.HBox([self.button, self.cancel_button]),
                widgets.HBox([self.progress, self.progress_label]),
                self.status,
                self.table,
                self.chart.image,
            ],
            layout=widgets.Layout(padding="6px"),
        )
        self.widget.add_class("wb-ladder-panel")

    # ------------------------------------------------------------------ view
    def _fields(self) -> dict[str, Any] | None:
        """The fields' values, or None (each bad field showing its message)."""
        values: dict[str, Any] = {}
        ok = True
        parsers: tuple[tuple[str, Field, Any], ...] = (
            ("steps", self.steps, lambda t: parse_int("baseline steps", t, minimum=1)),
            ("repeats", self.repeats, lambda t: parse_int("repeats", t, minimum=1, maximum=20)),
            ("target_loss", self.target, lambda t: parse_float("target loss", t, optional=True)),
        )
        for name, fld, parse in parsers:
            try:
                values[name] = parse(fld.value)
                fld.set_error(None)
            except ValueError as exc:
                fld.set_error(str(exc))
                ok = False
        return values if ok else None

    def _what_to_train(self) -> tuple[str, dict[str, Any] | None, Any]:
        """(model, model options, base config) from the session or the panel's arguments."""
        s = self.session
        if s is None:
            return self._model or "tiny-gpt", self._model_options, self._base
        name = getattr(s, "model_name", None)
        if not name:
            raise ValueError(
                "the session trains your own module; the ladder trains a model it can rebuild "
                "for every rung and rank: LadderPanel(model='pkg.module:function')"
            )
        return name, dict(getattr(s, "model_options", None) or {}) or None, base_of(s.config)

    # ------------------------------------------------------------------ actions
    def run(self, *, wait: bool = False) -> Any:
        """Check the settings and start the ladder in a background thread (`wait=True`:
        block until done and return the result, or None on an error or a cancel)."""
        from workbench.train.ladder import plan_ladder

        if self.closed:
            return None
        if self.running:
            self._show_status("warning", "already running; wait for it or cancel it")
            return None
        values = self._fields()
        if values is None:
            self.error = "check the fields marked in red"
            self._show_status("error", self.error)
            return None
        try:
            model, options, base = self._what_to_train()
            plan = plan_ladder(
                self._rungs,
                model,
                values["steps"],
                values["target_loss"],
                base=base,
                model_options=options,
                repeats=values["repeats"],
                lr_scaling=self.lr_scaling.value,
                ranks=None if self.data_parallel.value else 1,
                compile=self.compile.value and self.kind.value == "speed",
                checkpointing=self.checkpointing.value and self.kind.value == "speed",
                kind=self.kind.value,
                **self._options,
            )
        except ValueError as exc:
            self.error = " ".join(str(exc).split())
            self._show_status("error", self.error)
            return None
        self.error = None
        self.button.disabled = True
        self.cancel_button.disabled = False
        self.progress.max = max(1, plan.total_steps)
        self.progress.value = 0
        busy = getattr(self.session, "state", None) == "running"
        self._show_status(
            "warning" if busy else "info",
            f"running {len(plan.rungs)} rungs x {plan.repeats} repeat(s) on {plan.device}"
            + ("; the session is training too and slows the ladder: pause it" if busy else ""),
        )
        self._start(self._run, (plan,), "workbench-ladder", wait)
        return self.result if wait else None

    def _on_progress(self, p: Any) -> None:
        self.progress.max = max(1, p.total)
        self.progress.value = min(p.done, p.total)
        loss = "" if p.loss is None else f", loss {p.loss:.4g}"
        self.progress_label.value = (
            f"{p.done}/{p.total} steps: {p.rung} (repeat {p.repeat + 1}/{p.repeats}){loss}"
        )

    def _run(self, plan: Any) -> None:
        from workbench.train.ladder.run import LadderCancelled, run_plan

        try:
            result = run_plan(
                plan, progress=False, on_progress=self._on_progress, cancel=self._cancel
            )
            self.result = result
            self.table.value = result._repr_html_()
            self.chart.show(result.chart_png())
            helped = [r.name for r in result.rungs[1:] if r.helped]
            failed = [r.name for r in result.rungs if r.error]
            self._show_status(
                "warning" if failed else "ok",
                f"done; helped here: {', '.join(helped) or 'none'}"
                + (f"; failed: {', '.join(failed)}" if failed else ""),
            )
        except LadderCancelled:
            self.error = "cancelled"
            self._show_status("warning", "cancelled; nothing measured is shown")
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self._show_status("error", self.error)
        finally:
            self.button.disabled = False
            self.cancel_button.disabled = True

    def cancel(self) -> None:
        """Stop the ladder at the next step (the ranks of a launch at once)."""
        self._cancel.set()

    def __repr__(self) -> str:
        state = "running" if self.running else ("measured" if self.result else "idle")
        return f"LadderPanel({state})"
