"""The estimator panel's dry run: `workbench.simulate_memory` on a transformers model of the
panel's preset or shape (`workbench.estimate.hf_shape.config_of`, built on fake tensors:
nothing allocated), off the kernel's thread, its progress beside the button, cached per
setup. `DryRunControl` is the button, the status line, the picture and the cache; the panel
asks it to start and shows a finished run's peak in its summary, and below it the picture of
the step's memory over time (`DryRun.timeline()`: allocated and reserved, stacked by
category, the peak and its ten largest tensors) in `picture`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from workbench.estimate import MemoryEstimate
from workbench.ui.fields import status_html


class DryRunControl:
    """The dry-run button, its status line and the runs so far, per setup."""

    def __init__(self) -> None:
        self.button = widgets.Button(description="dry run", icon="flask")
        self.button.add_class("wb-est-dryrun")
        self.status = widgets.HTML()
        self.status.add_class("wb-est-dryrun-status")
        self.runs: dict[tuple[Any, ...], Any] = {}  # per setup: the DryRun or the error
        #: the last shown run's picture (`DryRun.timeline()` as a PNG); hidden before one
        self.picture = widgets.Image(format="png", layout=widgets.Layout(display="none"))
        self.picture.add_class("wb-est-dryrun-picture")
        self._thread: threading.Thread | None = None

    def start(
        self,
        e: MemoryEstimate | None,
        kwargs: dict[str, Any],
        key: tuple[Any, ...] | None,
        done: Callable[[tuple[Any, ...]], None],
    ) -> bool:
        """Start the dry run of estimate `e` (made from the panel's `kwargs`) under `key`;
        `done(key)` is called when it ends. False, and why in the status, when the setup
        cannot be simulated or a run is still going; True at once for a cached setup."""
        from workbench.estimate.hf_build import meta_module
        from workbench.train.dry_run.fake import shape_config

        if self._thread is not None and self._thread.is_alive():
            self.status.value = status_html("error", "a dry run is still running")
            return False
        reason = dry_run_refusal(e)
        config = None
        if reason is None and key is not None:
            config, reason = shape_config(kwargs)
        if reason is not None or key is None or config is None or e is None:
            self.status.value = status_html(
                "error", f"dry run: {reason or 'needs a transformer shape'}"
            )
            return False
        if key in self.runs:
            self.show(self.runs[key])
            done(key)
            return True
        estimate = e

        def run() -> None:
            from workbench.choices import session_recompute
            from workbench.config import TrainConfig
            from workbench.train.dry_run import simulate_memory

            try:
                module, problems = meta_module(config)
                if module is None:
                    raise ValueError("; ".join(str(p) for p in problems))
                train = TrainConfig(
                    precision=estimate.precision,
                    optimizer=estimate.optimizer,
                    micro_batch=estimate.micro_batch,
                    grad_accum=estimate.grad_accum,
                    activation_checkpointing=session_recompute(estimate.checkpointing),
                    fsdp=estimate.fsdp,
                    zero_stage=estimate.zero_stage,
                )

                def progress(phase: str, step: int, steps: int) -> None:
                    self.status.value = status_html(
                        "info", f"dry run: {phase}, step {step} of {steps} ..."
                    )

                finished = simulate_memory(
                    module,
                    train,
                    world_size=estimate.gpus,
                    seq_len=estimate.seq_len,
                    progress=progress,
                )
                self.runs[key] = finished
                self.show(finished)
                self.status.value = status_html(
                    "ok", f"dry run: {finished.wall_seconds:.1f} s, peak in the summary"
                )
            except Exception as exc:  # the model's or the setup's: say so, keep the panel
                self.runs[key] = exc
                self.show(exc)
                self.status.value = status_html("error", f"dry run: {exc}")
            done(key)

        self.status.value = status_html("info", "dry run: building the model on fake tensors")
        self._thread = threading.Thread(target=run, name="workbench-dry-run", daemon=True)
        self._thread.start()
        return True

    def show(self, run: Any) -> None:
        """Show `run`'s picture (a `DryRun`; anything else, or a run without a trace,
        hides it)."""
        timeline = getattr(run, "timeline", None)
        picture = timeline() if callable(timeline) else None
        if picture is None:
            self.picture.layout.display = "none"
            return
        self.picture.value = picture.png()
        self.picture.layout.display = None

    def wait(self, timeout: float | None = 300) -> None:
        """Wait for a running dry run to finish."""
        if self._thread is not None:
            self._thread.join(timeout)


def dry_run_refusal(e: MemoryEstimate | None) -> str | None:
    """Why the dry run cannot run a setup (None when it can)."""
    if e is None:
        return "no valid estimate"
    if e.offload_params or e.offload_optimizer:
        return "offload is not simulated (the plain loop, FSDP and DeepSpeed's ZeRO 0-3 are)"
    if e.tensor_parallel > 1 or e.pipeline_parallel > 1:
        return "tensor and pipeline parallelism are not simulated"
    if e.checkpointing not in ("none", "full"):
        return f"checkpointing {e.checkpointing!r}: it recomputes whole layers or nothing"
    return None


def architecture_of(kwargs: dict[str, Any]) -> Any:
    """The `Architecture` of the panel's inputs (a preset with its overrides, or a shape):
    the dry run's own reading (`workbench.train.dry_run.fake.architecture_of`)."""
    from workbench.train.dry_run.fake import architecture_of as read

    return read(kwargs)


__all__ = ["DryRunControl", "architecture_of", "dry_run_refusal"]
