"""The Session's tools: measuring, predicting and profiling a live run, launching its
config on several ranks, its weights as a file and continuing a checkpoint, each through
the Session's public methods and between its steps.

`SessionTools` is a base class of `workbench.train.session.Session`: `memory()` measures
one probe micro-batch next to the estimator's prediction (`workbench.train.measure.memory`),
`predict()` is the one prediction path (`workbench.prediction.predict_memory`),
`profile()` pauses a running session for torch.profiler (`workbench.train.measure.profiler`) and
resumes it, `phase_labels()` labels the loop's phases while a block runs, `launch()` runs
the config on N processes, `save_weights()` writes `state_dict()`, and
`Session.resume_from(path)` builds a Session continuing a checkpoint.

Of the Session's private state the tools use only the narrow interface declared on
`SessionTools` (its own module `_model`, its runtime `_rt`, the loop's phase label
`_label`, and three hooks: `_check_open`, `_between_steps` and `_interrupted`); the rest
is the Session's public API.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Self

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench.config import TrainConfig
from workbench.inputs import shown
from workbench.modelstats import count_parameters
from workbench.train import checkpoints as ckpt
from workbench.train.resume import check_checkpoint_arg, resume_settings
from workbench.train.runtime import Runtime
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

    # The Session's side of the tools' interface (workbench.train.session defines them).
    _model: nn.Module  # your module
    _rt: Runtime  # the data stream and backend the settings in effect are built into
    _label: Label  # the loop's phase labels

    def _check_open(self, action: str) -> None:
        """SessionStateError naming `action` when the session is closed."""
        raise NotImplementedError

    def _between_steps(
        self, action: str, *, apply_pending: bool = False
    ) -> AbstractContextManager[Runtime]:
        """A block between two steps, torch's RNG untouched; yields the runtime."""
        raise NotImplementedError

    def _interrupted(self, action: str) -> AbstractContextManager[None]:
        """A block with the loop paused, resumed after (a paused run stays paused);
        SessionStateError naming `action` from the loop's own thread."""
        raise NotImplementedError

    def layout(self) -> dict[str, Any] | None:
        """Where this rank sits when the model is split (`tp` or `pp` > 1; None otherwise):
        the tensor-parallel size and this rank's place in its group, the pipeline's stages,
        this rank's stage, its layers, the schedule and the last step's bubble (measured
        next to the ideal), the data-parallel size and rank."""
        cfg = self.config
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
        report = self.backend.pipeline_report()
        if report is not None:
            layout.update(report)
        return layout

    def memory(self, snapshot: bool = False, *, cpu_peak: bool = False) -> Any:
        """Measured memory of the current settings on one probe micro-batch, next to the
        estimator's prediction (`workbench.train.measure.memory.MemoryReport`). Runs between
        steps (a running session keeps running); the probe does not change training.

        `snapshot=True` (CUDA only; elsewhere a ValueError naming the argument): the probe
        step is recorded with `torch.cuda.memory._record_memory_history` (`report.snapshot`,
        the pickle torch's memory viewer opens) and `report.picture()` draws it beside the
        dry run's picture of the same settings (`simulate()`, run when none is cached).

        `cpu_peak=True` (on a CPU): also the most tensor memory the probe step held at
        once (`report.cpu_peak_bytes`, `workbench.train.measure.cpu_peak`), the twin of
        the CUDA peak a GPU session always measures. Off by default: it sees every
        operation of the probe from Python, which slows it.

        The estimator predicts activations for transformer shapes only (tiny-gpt); for
        the mlp, the cnn and your own modules the report's notes say so and
        `predicted_activation_bytes` is None."""
        from workbench.train.measure.memory import measure, snapshot_refusal

        if snapshot and (not torch.cuda.is_available() or self.device.type != "cuda"):
            raise ValueError(snapshot_refusal(self.device))
        with self._between_steps("measure memory", apply_pending=True) as rt:
            report = measure(
                rt,
                predict=self.predict,
                no_activation_note=NO_ACTIVATION_PREDICTION,
                snapshot=snapshot,
                cpu_peak=cpu_peak,
            )
        dry = self.cached_dry_run()
        if dry is None and snapshot:
            dry = self.simulate()
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
        its dry run runs in a child process (`workbench.train.dry_run.child`: tens of
        seconds more, and a model or loss defined in the notebook cannot cross)."""
        from workbench.train.dry_run import simulate_memory

        self._check_open("simulate memory")
        cfg = self.config
        key = (cfg, self.world_size, steps)
        cache: dict[Any, Any] = self.__dict__.setdefault("_dry_runs", {})
        if key in cache:
            return cache[key]
        with self._between_steps("simulate memory") as rt:
            batch = rt.data.peek()
            model = self.info.name if self.info is not None else self._model
            options = self.model_options if self.info is not None else None
        if self.info is not None:
            batch = None  # a built-in model: its own dataset's samples
        simulate: Any = simulate_memory
        if _holds_a_process_group():  # a distributed engine's: the dry run forms its own
            from workbench.train.dry_run.child import simulate_in_child

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
            if cfg == self.config and world == self.world_size:
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
        with self._between_steps("save adapters", apply_pending=True) as rt:
            return rt.save_adapters(path)

    def lora(self) -> dict[str, Any] | None:
        """The LoRA adapters in numbers (`workbench.train.techniques.lora.lora_summary`: rank,
        targets, adapter and base parameters, the trainable fraction, 4-bit layers), None
        without LoRA."""
        from workbench.train.techniques.lora import lora_summary

        with self._between_steps("read the adapters") as rt:
            return lora_summary(rt.lora)

    def predict(self, config: TrainConfig | None = None) -> Any:
        """The estimator's prediction (`workbench.estimate.MemoryEstimate`) for this
        session's model and world size with `config` (default: the settings in effect),
        from `workbench.prediction.predict_memory`, the one path every view uses. Raises
        ValueError when the estimator cannot predict the setup."""
        from workbench.prediction import predict_memory

        cfg = self.config if config is None else config
        if not isinstance(cfg, TrainConfig):
            raise ValueError(f"config={shown(cfg)}: must be a workbench.TrainConfig or None")
        adapters, four_bit = self._lora_counts(cfg)
        return predict_memory(
            cfg,
            self._model_description(),
            self.world_size,
            lora_params=adapters,
            qlora_params=four_bit,
            device=self.device.type,  # the attention kernel torch picks on it
            qlora_bytes=self._four_bit_bytes(cfg) if four_bit is not None else None,
        )

    def _four_bit_bytes(self, config: TrainConfig) -> int | None:
        """The bytes bitsandbytes holds this session's 4-bit base in (QLoRA's)."""
        from workbench.train.techniques.lora import four_bit_weight_bytes

        return four_bit_weight_bytes(self._model, config)

    def _lora_counts(self, config: TrainConfig) -> tuple[int | None, int | None]:
        """(the adapters LoRA of `config` puts on this session's module, the weights QLoRA
        holds in 4 bits); None where not set, or for targets that pick no layer, which the
        session refuses anyway."""
        from workbench.train.techniques.lora import adapter_parameter_count, four_bit_weight_count

        if int(config.lora_rank) == 0:
            return None, None
        try:
            adapters = adapter_parameter_count(self._model, config)
        except ValueError:
            return None, None
        return adapters, four_bit_weight_count(self._model) if config.qlora else None

    def utilisation(self, gpu: str | None = None) -> Any:
        """This session's measured MFU and HFU (`workbench.train.measure.utilisation`):
        its own steps' tokens/s over the peak of `gpu` (a catalog name; the CUDA device's
        when not given), with the one FLOP count of its model. ValueError naming the input
        when there is no measured step or no GPU to read a peak of."""
        from workbench.train.measure.utilisation import measured_utilisation

        return measured_utilisation(self, gpu=gpu, **flop_inputs(self._model_description()))

    def memory_advice(self) -> list[Any]:
        """The memory technique that frees the most of this session's predicted peak, as
        an `Advice` whose `apply` is the change for `update(**apply)`
        (`workbench.train.measure.memory_advice`); [] when none frees anything."""
        from workbench.train.measure.memory_advice import memory_advice

        return memory_advice(
            self.config, self._model_description(), self.world_size, device=self.device
        )

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
        `workbench.train.measure.profiler.ProfileResult`."""
        from workbench.train.measure.profiler import check_profile_args, profile_session

        check_profile_args(steps, record_memory)
        self._check_open("profile")
        with self._interrupted("profile"):
            return profile_session(
                self, steps=steps, record_memory=record_memory, trace_path=trace_path
            )

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

        return launch_like(self.config, self.model_name, self.model_options, ranks, steps, **kwargs)

    def data_report(self) -> Any | None:
        """The built-in text's document layout and the padding it costs (a
        `workbench.models.gpt.DocumentReport`: padding_fraction, real and slot tokens per
        epoch) when `config.documents` is "padded" or "packed"; None for other data."""
        from workbench.models.gpt import DocumentDataset

        data = self.data
        return data.report() if isinstance(data, DocumentDataset) else None

    def save_weights(self, path: str | os.PathLike[str]) -> str:
        """Write `state_dict()` (on the CPU) to `path` with `torch.save`, atomically; plain
        `torch.load(path)` (weights_only) reads it back. Returns the path."""
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                f"path={shown(path)}: must be a file path (a non-empty str or os.PathLike)"
            )
        if os.path.isdir(name):
            raise ValueError(f"path={shown(name, 1000)}: is a folder; give a file path in it")
        weights = {k: v.cpu() for k, v in self.state_dict().items()}
        return str(ckpt.write_atomic(weights, path))

    @classmethod
    def resume_from(
        cls,
        path_or_dir: str | os.PathLike[str],
        *,
        model: str | nn.Module | None = None,
        data: Dataset[Any] | DataLoader[Any] | None = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        sampler: Any | None = None,
        device: str | torch.device | None = None,
        tensorboard: bool | str | os.PathLike[str] = False,
        model_options: dict[str, Any] | None = None,
        **config_changes: Any,
    ) -> Self:
        """A new Session continuing the checkpoint (a file, or the newest complete one in a
        directory), checked against its manifest and read with `weights_only=True`.

        Built-in models are rebuilt from the checkpoint; for your own module pass `model`
        (same architecture), `data` and `loss_fn`. `config_changes` override the saved
        settings; `model_options` replace the saved options of a built-in model (a saved
        tiny-gpt `text` is not read unless you pass it here: a file never chooses which other
        file is read). A run that saved checkpoints goes on saving them beside the one it resumed
        from (not where the file says it was saved). A truncated, altered or unsafe file
        raises `workbench.train.checkpoints.CheckpointError` (a ValueError) naming it; a
        file never chooses code to run (docs/checkpoints.md).
        """
        check_checkpoint_arg("path_or_dir", path_or_dir)
        payload = ckpt.load(path_or_dir)
        config, model, options = resume_settings(payload, model, config_changes, model_options)
        return cls(
            config,
            model=model,
            data=data,
            loss_fn=loss_fn,
            sampler=sampler,
            device=device,
            model_options=options,
            resume=payload,
            tensorboard=tensorboard,
        )


def flop_inputs(description: Any) -> dict[str, Any]:
    """The estimator's keywords for the FLOP count of a run's model: its parameter count
    and the shape a prediction description carries (`workbench.prediction.shape_of`; a
    bare count gives the count alone)."""
    from workbench.prediction import shape_of

    if isinstance(description, int):
        return {"n_params": description}
    return {"n_params": description.n_params, **shape_of(description)}


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
