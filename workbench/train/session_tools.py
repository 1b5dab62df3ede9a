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
from workbench.inputs import shown
from workbench.modelstats import count_parameters
from workbench.rng import GLOBAL_RNG_LOCK
from workbench.train.step import Label

#: Why `memory()` has no activation prediction for the mlp, the cnn and user modules.
NO_ACTIVATION_PREDICTION = (
    "no activation prediction: the estimator's activation formula (Korthikanti et al.) "
    "covers transformers such as tiny-gpt and the transformers models whose config maps "
    "onto its terms; for other models activation_bytes is measured only (for the built-in "
    "mlp and cnn it equals a hand count of the tensors their layers save)"
)


class SessionTools:
    """Tools over a live Session (see the module docstring)."""

    @contextlib.contextmanager
    def _between_steps(self) -> Iterator[None]:
        """Hold the step lock and keep the RNG untouched (probes must not change training,
        this session's or another's training in a background thread: `workbench.rng`)."""
        devices = [self.device] if self.device.type == "cuda" else []
        with self._step_lock, GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=devices):
            yield

    def layout(self) -> dict[str, Any] | None:
        """Where this rank sits when the model is split (`tp` or `pp` > 1; None otherwise):
        the tensor-parallel size and this rank's place in its group, the pipeline's stages,
        this rank's stage, its layers, the schedule and the last step's bubble (measured
        next to the ideal), the data-parallel size and rank."""
        cfg = self._config
        tp, pp = int(cfg.tp), int(cfg.pp)
        if tp == 1 and pp == 1:
            return None
        rank = int(self.rank)
        layout: dict[str, Any] = {
            "tp": tp,
            "pp": pp,
            "dp": cfg.data_parallel(self.world_size),
            "tp_rank": rank % tp,
            "stage": (rank // tp) % pp,
            "dp_rank": rank // (tp * pp),
        }
        report = self._rt.backend.pipeline_report()
        if report is not None:
            layout.update(report)
        return layout

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
            report = measure(
                self._rt,
                predict=self.predict,
                no_activation_note=NO_ACTIVATION_PREDICTION,
            )
        dry = self.cached_dry_run()
        if dry is not None:
            import dataclasses

            report = dataclasses.replace(report, dry_run=dry)
        return report

    def simulate(self, steps: int = 2, *, progress: Any = None) -> Any:
        """A dry run of this session's model with the settings in effect
        (`workbench.simulate_memory`: real training steps on fake tensors, nothing
        allocated, the session untouched), on a micro-batch shaped like the session's;
        its peak is measured, the formula's beside it (`DryRun.formula`). Cached per
        setup: the same settings answer again at once; `memory()` shows the cached dry
        run's peak next to the prediction. Runs outside the training loop's lock: a
        running session keeps training (the dry run copies the module's shapes first).
        A distributed session (DeepSpeed, FSDP) holds this process's process group, so
        its dry run runs in a child process (`workbench.train.dry_run_child`: tens of
        seconds more, and a model or loss defined in the notebook cannot cross)."""
        from workbench.train.dry_run import simulate_memory

        self._check_open("simulate memory")
        cfg = self._config
        key = (cfg, self.world_size, steps)
        cache: dict[Any, Any] = self.__dict__.setdefault("_dry_runs", {})
        if key in cache:
            return cache[key]
        with self._between_steps():
            batch = self._rt.data.peek()
            model = self.info.name if self.info is not None else self._model
            options = self.model_options if self.info is not None else None
        if self.info is not None:
            batch = None  # a built-in model: its own dataset's samples
        simulate: Any = simulate_memory
        if _holds_a_process_group():  # a distributed engine's: the dry run forms its own
            from workbench.train.dry_run_child import simulate_in_child

            simulate = simulate_in_child
        run = simulate(
            model,
            cfg,
            batch=batch,
            world_size=self.world_size,
            steps=steps,
            loss_fn=None if self.info is not None else self._rt.loss_fn,
            progress=progress,
            model_options=options,
        )
        cache[key] = run
        return run

    def cached_dry_run(self) -> Any:
        """The dry run `simulate()` made for the settings in effect, or None."""
        cache = self.__dict__.get("_dry_runs", {})
        for (cfg, world, _), run in cache.items():
            if cfg == self._config and world == self.world_size:
                return run
        return None

    def save_adapters(self, path: str | os.PathLike[str]) -> Any:
        """Save the LoRA adapters alone, in peft's format (`adapter_model.safetensors`
        and `adapter_config.json`) in directory `path` (created); returns its `Path`.
        Runs between steps. ValueError when the session trains no adapters (the base
        model with the adapters merged is your module, after `close()` or a switch to
        `lora_rank=0`)."""
        if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
            raise ValueError(
                f"path={shown(path, 1000)}: must be a directory path (str or os.PathLike)"
            )
        self._check_open("save adapters")
        with self._between_steps():
            self._apply_pending(raise_errors=False)
            return self._rt.save_adapters(path)

    def lora(self) -> dict[str, Any] | None:
        """The LoRA adapters in numbers (`workbench.train.lora.lora_summary`: rank,
        targets, adapter and base parameters, the trainable fraction, 4-bit layers), None
        without LoRA."""
        from workbench.train.lora import lora_summary

        self._check_open("read the adapters")
        with self._between_steps():
            return lora_summary(self._rt.lora)

    def predict(self, config: TrainConfig | None = None) -> Any:
        """The estimator's prediction (`workbench.estimate.MemoryEstimate`) for this
        session's model and world size with `config` (default: the settings in effect),
        from `workbench.prediction.predict_memory`, the one path every view uses. Raises
        ValueError when the estimator cannot predict the setup."""
        from workbench.prediction import predict_memory

        cfg = self._config if config is None else config
        if not isinstance(cfg, TrainConfig):
            raise ValueError(f"config={shown(cfg)}: must be a workbench.TrainConfig or None")
        adapters, four_bit = self._lora_counts(cfg)
        return predict_memory(
            cfg,
            self._model_description(),
            self.world_size,
            lora_params=adapters,
            qlora_params=four_bit,
        )

    def _lora_counts(self, config: TrainConfig) -> tuple[int | None, int | None]:
        """(the adapters LoRA of `config` puts on this session's module, the weights QLoRA
        holds in 4 bits); None where not set, or for targets that pick no layer, which the
        session refuses anyway."""
        from workbench.train.lora import adapter_parameter_count, four_bit_weight_count

        if int(config.lora_rank) == 0:
            return None, None
        try:
            adapters = adapter_parameter_count(self._model, config)
        except ValueError:
            return None, None
        return adapters, four_bit_weight_count(self._model) if config.qlora else None

    def memory_advice(self) -> list[Any]:
        """The memory technique that frees the most of this session's predicted peak, as
        an `Advice` whose `apply` is the change for `update(**apply)`
        (`workbench.train.memory_advice`); [] when none frees anything."""
        from workbench.train.memory_advice import memory_advice

        return memory_advice(self._config, self._model_description(), self.world_size)

    def _model_description(self) -> Any:
        """The built-in model's shape facts; for your module with a Hugging Face `config`
        (a `transformers` model) its shape from that config at the sequence length of the
        session's batches (`module_description`); else its parameter count."""
        if self.info is not None:
            return self.info
        cached = getattr(self, "_description_cache", None)
        if cached is not None:
            return cached
        description: Any = count_parameters(self._model)
        if callable(getattr(getattr(self._model, "config", None), "to_dict", None)):
            try:
                batch = self._rt.data.peek()
            except Exception:  # no batch to read a sequence length from: count only
                batch = None
            description = module_description(self._model, batch) or description
        lora = getattr(getattr(self, "_rt", None), "lora", None)
        if lora is not None:  # the base model's count: without adapters, 4-bit as it was
            if isinstance(description, int):
                description = lora.base_parameters()
            else:
                description.n_params = lora.base_parameters()
        self._description_cache = description
        return description

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
            raise ValueError(f"label={shown(label)}: must be callable(name) -> a context manager")
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


class ModuleDescription:
    """A user's module as the prediction reads it: `n_params`, the `architecture` from its
    Hugging Face config at the batches' sequence length, and `dropout` / `attention` when
    its config says (`workbench.prediction.shape_of`)."""

    def __init__(self, n_params: int, architecture: Any, training: dict[str, Any]) -> None:
        self.n_params = n_params
        self.architecture = architecture
        self.dropout = 0.1 if training.get("dropout") else (0.0 if "dropout" in training else None)
        self.attention = training.get("attention")

    def __repr__(self) -> str:
        return f"ModuleDescription(n_params={self.n_params}, architecture={self.architecture!r})"


def sequence_length(batch: Any) -> int | None:
    """The sequence length of a batch of token ids: a 2-D integer tensor's second size,
    a dict's `input_ids`, or a tuple's first element; None for anything else."""
    if isinstance(batch, dict):
        batch = batch.get("input_ids")
    elif isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    if isinstance(batch, torch.Tensor) and batch.dim() == 2 and not batch.is_floating_point():
        return int(batch.shape[1])
    return None


def module_description(model: Any, batch: Any) -> ModuleDescription | None:
    """The description of a `transformers` module trained on `batch` (None when its config
    gives no transformer shape or the batch no sequence length)."""
    from workbench.estimate.from_module import module_facts
    from workbench.estimate.hf_shape import training_facts

    seq = sequence_length(batch)
    if seq is None:
        return None
    facts = module_facts(model)
    arch = facts.architecture()
    if arch is None or facts.counted is None:
        return None
    try:
        arch = arch.replace(seq_len=seq)
    except ValueError:  # longer than a learned position table: no activation prediction
        return None
    config = model.config
    training = training_facts(config.to_dict(), getattr(config, "_attn_implementation", None))
    return ModuleDescription(facts.counted, arch, training)


def _holds_a_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
