"""`WorkbenchTrainerCallback`: a Hugging Face `Trainer` run recorded by an `Observer`.

    cb = WorkbenchTrainerCallback()
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    cb.observer.records()            # one StepRecord per optimizer step
    workbench.dashboard(cb.observer) # charts, advisor, monitor, estimator

What it reads, from the Trainer's own hooks and objects:
* the settings, at `on_train_begin`, from `TrainingArguments` (`settings_from_args`):
  `per_device_train_batch_size`, `gradient_accumulation_steps`, `bf16` / `fp16`,
  `learning_rate`, `weight_decay`, `max_grad_norm`, `optim`, `gradient_checkpointing`,
  `dataloader_num_workers`, `dataloader_pin_memory`, `seed`, `torch_compile`, and a
  `deepspeed` config (its ZeRO stage, offload and precision through
  `workbench.from_deepspeed`) or `fsdp`; what it cannot map is said in `observer.notes`;
* each micro-batch's input and loss, through a forward hook on the model (the model's
  output `.loss`, kept on the device), so the record's loss is the mean over the step's
  micro-batches and its samples and tokens are counted from `input_ids`;
* the data wait: the time from one step's end to the next step's begin, where the Trainer
  fetches the step's batches (`get_batch_samples`) and does its logging;
* the gradient norm: the Trainer's own (it logs the norm before clipping as `grad_norm`)
  when `logging_steps=1`, else the norm computed in `on_pre_optimizer_step` when the
  Trainer does not clip (`max_grad_norm=0`; under fp16 the gradients are still scaled
  there, so the norm is divided by the loss scale: `pending_scale`), else none;
* the learning rate from the optimizer, the memory as an Observer measures it.

A model whose output has no `.loss` (a Trainer subclass whose `compute_loss` computes the
loss outside the model) leaves the hook without a loss: with `logging_steps=1` the loss
the Trainer logs each step is taken instead, else the records' loss is None (unknown),
the observer says why once (`NO_LOSS_NOTE`) and the advisor says nothing about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers import TrainerCallback

from workbench.config import ConfigError, TrainConfig
from workbench.inputs import shown
from workbench.integrations.observer import Observer
from workbench.integrations.step_values import grad_norm_every
from workbench.optimizers import OPTIMIZERS

#: The workbench's settings as TrainingArguments names them, for the advice.
ARG_NAMES: dict[str, Any] = {
    "micro_batch": "per_device_train_batch_size=",
    "grad_accum": "gradient_accumulation_steps=",
    "num_workers": "dataloader_num_workers=",
    "pin_memory": "dataloader_pin_memory=",
    "activation_checkpointing": "gradient_checkpointing=",
    "clip_grad_norm": "max_grad_norm=",
    "lr": "learning_rate=",
    "weight_decay": "weight_decay=",
    "compile": "torch_compile=",
    "precision": {
        "amp-bf16": "bf16=True",
        "amp-fp16": "fp16=True",
        "fp32": "bf16=False, fp16=False",
        "bf16": 'bf16=True with DeepSpeed\'s "bf16": {"enabled": true}',
        "fp16": 'fp16=True with DeepSpeed\'s "fp16": {"enabled": true}',
        # the model's dtype is from_pretrained's argument (dtype=, torch_dtype= before
        # transformers 4.56), not a TrainingArguments one
        "bf16-true": (
            "bf16=False, and the model loaded in bf16: from_pretrained(..., "
            "dtype=torch.bfloat16) (torch_dtype= before transformers 4.56; not a "
            "TrainingArguments argument)"
        ),
    },
    "optimizer": {r.name: r.hf_hint for r in OPTIMIZERS if r.hf_hint},  # each row's
    "attention": {
        "sdpa": 'attn_implementation="sdpa" when loading the model',
        "eager": 'attn_implementation="eager" when loading the model',
    },
    "zero_stage": "the DeepSpeed config's zero_optimization.stage: ",
    "lora_rank": "a peft LoraConfig(r=...) on the model: r=",
}

#: What the observer says when the model's output carries no loss.
NO_LOSS_NOTE = (
    "the loss is not visible to the callback: the model's output has no .loss (a Trainer "
    "whose compute_loss computes it outside the model, or a model given no labels); set "
    "logging_steps=1 and the callback reads the loss the Trainer logs each step"
)

#: TrainingArguments' optim names -> the workbench's optimizer (each row's `hf_optims`)
_OPTIMIZERS = {optim: r.name for r in OPTIMIZERS for optim in r.hf_optims}


def settings_from_args(args: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(TrainConfig settings, the arguments they were read from, notes on what could not
    be mapped) of a `TrainingArguments`."""
    read: dict[str, Any] = {}
    notes: list[str] = []

    def take(arg: str) -> Any:
        value = getattr(args, arg, None)
        read[arg] = value
        return value

    settings: dict[str, Any] = {
        "micro_batch": int(take("per_device_train_batch_size") or 8),
        "grad_accum": int(take("gradient_accumulation_steps") or 1),
        "lr": float(take("learning_rate") or 5e-5),
        "weight_decay": float(take("weight_decay") or 0.0),
        "num_workers": int(take("dataloader_num_workers") or 0),
        "pin_memory": bool(take("dataloader_pin_memory")),
        "activation_checkpointing": bool(take("gradient_checkpointing")),
        "seed": int(take("seed") or 0),
        "compile": bool(take("torch_compile")),
    }
    clip = take("max_grad_norm")
    settings["clip_grad_norm"] = float(clip) if clip else None
    settings["precision"] = "amp-bf16" if take("bf16") else "amp-fp16" if take("fp16") else "fp32"
    optim = str(getattr(take("optim"), "value", take("optim")) or "adamw_torch")
    if optim in _OPTIMIZERS:
        settings["optimizer"] = _OPTIMIZERS[optim]
    else:
        notes.append(
            f"optim={shown(optim)}: counted as AdamW (the workbench has no mapping for it)"
        )
    ds = take("deepspeed")
    if ds:
        settings.update(_from_deepspeed(ds, settings, notes))
    fsdp = take("fsdp")
    if fsdp:
        modes = [str(getattr(m, "value", m)) for m in (fsdp if isinstance(fsdp, list) else [fsdp])]
        for mode in ("full_shard", "shard_grad_op", "no_shard"):
            if mode in modes:
                settings["fsdp"] = mode
        if "offload" in modes:
            settings["offload_params"] = "cpu"
    return settings, read, notes


def _from_deepspeed(ds: Any, settings: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The DeepSpeed config's stage, offload and 16-bit mode, through `from_deepspeed`
    ("auto" values filled with the TrainingArguments' own)."""
    from workbench.deepspeed import from_deepspeed

    if isinstance(ds, Mapping):
        ds = _fill_auto(dict(ds), settings)
    try:
        config = from_deepspeed(ds)
    except (ValueError, OSError) as exc:
        notes.append(f"deepspeed config not read ({type(exc).__name__}: {exc}); counted without")
        return {}
    keep = ("zero_stage", "offload_optimizer", "offload_params", "precision", "nvme_path")
    return {k: getattr(config, k) for k in keep}


def _fill_auto(ds: Any, settings: dict[str, Any]) -> Any:
    """A DeepSpeed config with the Trainer's "auto" values filled from its arguments."""
    autos = {
        "train_micro_batch_size_per_gpu": settings["micro_batch"],
        "gradient_accumulation_steps": settings["grad_accum"],
        "gradient_clipping": settings["clip_grad_norm"] or 0.0,
    }
    out: dict[str, Any] = {}
    for k, v in ds.items():
        if isinstance(v, Mapping):
            out[k] = _fill_auto(dict(v), settings)
        elif v == "auto":
            if k in autos:
                out[k] = autos[k]
        else:
            out[k] = v
    if "train_batch_size" in out and ds.get("train_batch_size") == "auto":
        out.pop("train_batch_size")
    return out


def pending_scale(optimizer: Any) -> Any:
    """The loss scale an fp16 run's gradients still carry as its optimizer step begins:
    accelerate's GradScaler's scale (its device tensor: no sync) unless `unscale_` already
    ran this step. The Trainer unscales only to clip, so with `max_grad_norm=0` the
    gradients reach `on_pre_optimizer_step` scaled (x65536 at the start, inf on an
    overflow step) and the scaler unscales them inside `optimizer.step()`. None when
    nothing scales them."""
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None or not scaler.is_enabled() or getattr(scaler, "_scale", None) is None:
        return None
    inner = getattr(optimizer, "optimizer", optimizer)
    stage = scaler._per_optimizer_states.get(id(inner), {}).get("stage")
    if getattr(stage, "name", None) == "UNSCALED":
        return None
    return scaler._scale


class WorkbenchTrainerCallback(TrainerCallback):
    """A `transformers.TrainerCallback` that records the run into `self.observer` (an
    `Observer`, made with the callback; the model, optimizer and settings attached at
    `on_train_begin`; see the module docstring)."""

    def __init__(self, *, grad_norm: bool | int | str = "auto") -> None:
        grad_norm_every(grad_norm)  # ValueError naming the value
        # made now, so a dashboard of it can be shown before `trainer.train()`; the model,
        # optimizer and settings are attached when training starts
        self.observer = Observer(
            None,
            trainer="transformers",
            arg_names=ARG_NAMES,
            grad_norm=grad_norm,
            no_loss_note=NO_LOSS_NOTE,
        )
        self._grad_norm = grad_norm
        self._hook: Any = None
        self._capture: Any = None  # the forward hook that reads each micro-batch and loss
        self._logged_norm = False
        self._logged_loss = False  # the Trainer logs each step's loss (logging_steps=1)
        self._on = False  # a model attached: the run has started

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if model is None:
            return
        settings, read, notes = settings_from_args(args)
        try:
            config = TrainConfig(**settings)
        except ConfigError as exc:
            notes.append(f"settings not all mappable ({exc}); predicted with the defaults")
            config = TrainConfig(micro_batch=settings["micro_batch"])
        strategy = getattr(args, "logging_strategy", "steps")
        self._logged_loss = (
            str(getattr(strategy, "value", strategy)) == "steps"
            and getattr(args, "logging_steps", 0) == 1
        )
        self._logged_norm = int(getattr(args, "logging_steps", 0) or 0) == 1 and bool(
            getattr(args, "max_grad_norm", 0)
        )
        observer = self.observer
        observer.attach(model, kwargs.get("optimizer"), config=config, read_from=read, notes=notes)
        # the Trainer clips first: a norm read after it would be the clipped one
        observer.want_grad_norm = grad_norm_every(self._grad_norm) != 0 and not bool(
            getattr(args, "max_grad_norm", 0)
        )

        def capture(module: Any, inputs: Any, kw: dict[str, Any], output: Any) -> None:
            if not module.training or not torch.is_grad_enabled():
                return  # evaluation and generation are not training steps
            loss = getattr(output, "loss", None)
            if loss is None and isinstance(output, Mapping):
                loss = output.get("loss")
            batch = kw.get("input_ids")
            if batch is None and inputs:
                batch = inputs[0]
            observer.micro_batch(
                batch,
                loss if isinstance(loss, torch.Tensor) else None,
                summed=kw.get("num_items_in_batch") is not None,
            )

        self._capture = capture
        self._hook = model.register_forward_hook(capture, with_kwargs=True)
        self._on = True

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._on:
            self.observer.begin_step()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._on and self.observer.grads_due:  # the norm or states' bytes
            optimizer = kwargs.get("optimizer")
            self.observer.before_optimizer_step(optimizer, grad_scale=pending_scale(optimizer))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._on:
            return
        # the lr was read when the step began, before its optimizer step, as the Trainer
        # logs it; fp16's loss scale from accelerate's GradScaler (its tensor, read with
        # the loss)
        scaler = getattr(kwargs.get("optimizer"), "scaler", None)
        self.observer.end_step(
            scale=getattr(scaler, "_scale", None) if scaler is not None else None
        )

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        logs = logs or {}
        loss = logs.get("loss")
        if self._on and self._logged_loss and type(loss) in (int, float):
            self.observer.fill_loss(loss)  # where the model's output had none
        norm = logs.get("grad_norm")
        if self.observer.attached and self._logged_norm and isinstance(norm, (int, float)):
            self.observer.replace_last(grad_norm=float(norm))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._on = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
