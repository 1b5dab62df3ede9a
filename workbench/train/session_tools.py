"""The Session's tools: measuring, predicting and profiling a live run, and launching its
config on several ranks, each through the Session's public methods and between its steps.

`SessionTools` is a base class of `workbench.train.session.Session` (the methods live
here, the state they use is the Session's): `memory()` measures one probe micro-batch next
to the estimator's prediction (`workbench.train.memory`), `predict()` is the one
prediction path (`workbench.prediction.predict_memory`), `profile()` pauses a running
session for torch.profiler (`workbench.train.profiler`) and resumes it, `phase_labels()`
labels the loop's phases while a block runs, `launch()` runs the config on N processes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from workbench.config import TrainConfig
from workbench.modelstats import count_parameters
from workbench.train.step import Label

#: Why `memory()` has no activation prediction for the mlp, the cnn and user modules.
NO_ACTIVATION_PREDICTION = (
    "no activation prediction: the estimator's activation formula (Korthikanti et al.) "
    "covers decoder-only transformers such as tiny-gpt; for other models activation_bytes "
    "is measured only (for the built-in mlp and cnn it equals a hand count of the tensors "
    "their layers save)"
)


class SessionTools:
    """Tools over a live Session (see the module docstring)."""

    @contextlib.contextmanager
    def _between_steps(self) -> Iterator[None]:
        """Hold the step lock and keep the RNG untouched (probes must not change training)."""
        devices = [self.device] if self.device.type == "cuda" else []
        with self._step_lock, torch.random.fork_rng(devices=devices):
            yield

    def memory(self) -> Any:
        """Measured memory of the current settings on one probe micro-batch, next to the
        estimator's prediction (`workbench.train.memory.MemoryReport`). Runs between
        steps (a running session keeps running); the probe does not change training.

        The estimator predicts activations for transformer shapes only (tiny-gpt); for
        the mlp, the cnn and your own modules the report's notes say so and
        `predicted_activation_bytes` is None."""
        from workbench.train.memory import measure

        self._check_open("measure memory")
        with self._between_steps():
            self._apply_pending(raise_errors=False)
            return measure(
                self._rt,
                predict=self.predict,
                no_activation_note=NO_ACTIVATION_PREDICTION,
            )

    def predict(self, config: TrainConfig | None = None) -> Any:
        """The estimator's prediction (`workbench.estimate.MemoryEstimate`) for this
        session's model and world size with `config` (default: the settings in effect),
        from `workbench.prediction.predict_memory`, the one path every view uses. Raises
        ValueError when the estimator cannot predict the setup."""
        from workbench.prediction import predict_memory

        cfg = self._config if config is None else config
        if not isinstance(cfg, TrainConfig):
            raise ValueError(f"config={cfg!r}: must be a workbench.TrainConfig or None")
        return predict_memory(cfg, self._model_description(), self.world_size)

    def _model_description(self) -> Any:
        """The built-in model's shape facts, or your module's parameter count."""
        if self.info is not None:
            return self.info
        return count_parameters(self._model)

    def profile(
        self,
        steps: int = 3,
        *,
        record_memory: bool = False,
        trace_path: str | os.PathLike[str] | None = None,
    ) -> Any:
        """Profile `steps` optimizer steps with torch.profiler (after 1 wait + 1 warmup
        step; all `steps + 2` are real training steps). A running session is paused for
        it and resumed after; a paused one stays paused with its run's target. Returns
        `workbench.train.profiler.ProfileResult`."""
        from workbench.train.profiler import check_profile_args, profile_session

        check_profile_args(steps, record_memory)
        self._check_open("profile")
        was_running = self._state == "running"
        if was_running:
            self.pause()
        was_paused, target = self._state == "paused", self._target_step
        try:
            return profile_session(
                self, steps=steps, record_memory=record_memory, trace_path=trace_path
            )
        finally:
            with self._cond:
                if was_paused and self._state == "idle":  # back to the run it interrupted
                    self._target_step = target
                    self._state = "paused"
                    self._cond.notify_all()
            if was_running and self._state == "paused":
                self.resume()

    @contextlib.contextmanager
    def phase_labels(self, label: Label) -> Iterator[None]:
        """Label the loop's phases ("workbench.data", ".forward", ".backward",
        ".optimizer") with `label(name)` context managers while this block runs (the
        profiler passes `torch.profiler.record_function`)."""
        if not callable(label):
            raise ValueError(f"label={label!r}: must be callable(name) -> a context manager")
        self._label = label
        try:
            yield
        finally:
            self._label = contextlib.nullcontext

    def launch(self, ranks: int, steps: int, **kwargs: Any) -> Any:
        """Run this config on `ranks` processes (DeepSpeed launcher); see
        `workbench.train.launch.launch_ranks`. Needs a built-in model."""
        from workbench.train.launch import launch_like

        return launch_like(
            self._config, self.model_name, self.model_options, ranks, steps, **kwargs
        )
