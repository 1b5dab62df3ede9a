"""`WorkbenchLightningCallback`: a Lightning `Trainer` run recorded by an `Observer`.

    cb = WorkbenchLightningCallback()
    L.Trainer(max_steps=100, callbacks=[cb]).fit(module, loader)
    workbench.dashboard(cb.observer)

What it reads, from Lightning's hooks and objects:
* the settings, at `on_train_start` (`settings_from_trainer`): `precision` ("32-true",
  "bf16-mixed", "16-mixed", "bf16-true"), `accumulate_grad_batches`, `gradient_clip_val`,
  the strategy (a `DeepSpeedStrategy`'s config through `workbench.from_deepspeed`, an
  `FSDPStrategy`'s sharding), the train loader's `batch_size`, `num_workers` and
  `pin_memory`, and the first optimizer's kind, learning rate and weight decay;
* each batch at `on_train_batch_start` (after Lightning fetched it: the time since the
  previous step ended is the wait for data) and its loss at `on_train_batch_end`
  (`training_step`'s loss divided by `accumulate_grad_batches`, as Lightning hands it
  back, kept on the device: the step's loss is their sum);
* the gradient norm in `on_before_optimizer_step` (before Lightning clips), with the
  model states' bytes on the first steps; the record is published at the end of the
  batch whose optimizer step ran.

A `training_step` that returns no loss (manual optimization needs none) leaves the
records' loss None (unknown): the observer says once how to expose it (`NO_LOSS_NOTE`) and
the advisor says nothing about it.

What it costs a step (benchmarks/observe.py): Lightning dispatches every hook of every
callback, an empty one included, at a few microseconds each; it skips a hook that is not
callable. So the per-step hooks this callback has no use for are None, and without
accumulation under automatic optimization (every batch ends in an optimizer step)
`on_before_optimizer_step` is None too on the steps that read no gradients: a step pays
for two hooks. Under manual optimization that hook says which batches stepped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from workbench.config import ConfigError, TrainConfig
from workbench.inputs import shown
from workbench.integrations.observer import Observer
from workbench.integrations.step_values import grad_norm_every
from workbench.optimizers import OPTIMIZERS

#: The workbench's settings as Lightning names them, for the advice.
ARG_NAMES: dict[str, Any] = {
    "micro_batch": "DataLoader(batch_size=...): batch_size=",
    "grad_accum": "Trainer(accumulate_grad_batches=...): accumulate_grad_batches=",
    "num_workers": "DataLoader(num_workers=...): num_workers=",
    "pin_memory": "DataLoader(pin_memory=...): pin_memory=",
    "clip_grad_norm": "Trainer(gradient_clip_val=...): gradient_clip_val=",
    "lr": "your configure_optimizers: lr=",
    "precision": {
        "fp32": 'Trainer(precision="32-true")',
        "amp-bf16": 'Trainer(precision="bf16-mixed")',
        "amp-fp16": 'Trainer(precision="16-mixed")',
        "bf16-true": 'Trainer(precision="bf16-true")',
        "bf16": 'Trainer(precision="bf16-mixed", strategy=DeepSpeedStrategy(...))',
        "fp16": 'Trainer(precision="16-mixed", strategy=DeepSpeedStrategy(...))',
    },
    "optimizer": {r.name: r.lightning_hint for r in OPTIMIZERS if r.lightning_hint},
    "activation_checkpointing": "torch.utils.checkpoint around your blocks (or FSDPStrategy("
    "activation_checkpointing_policy=...)): ",
    "zero_stage": "DeepSpeedStrategy(stage=...): stage=",
    "fsdp": "FSDPStrategy(sharding_strategy=...): ",
}

#: An optimizer's class name, lowercased -> the workbench's optimizer (the first row that
#: builds that class: torch's SGD is sgd)
_BY_CLASS: dict[str, str] = {}
for _row in OPTIMIZERS:
    for _path in (_row.factory, _row.fallback_factory):
        if _path:
            _BY_CLASS.setdefault(_path.partition(":")[2].lower(), _row.name)

#: What the observer says when `training_step` hands back no loss.
NO_LOSS_NOTE = (
    "the loss is not visible to the callback: training_step returned no loss (manual "
    "optimization needs none; automatic optimization steps without one); return it, "
    "`return loss` or `return {'loss': loss}`, and the callback reads it"
)

_PRECISION = {
    "32-true": "fp32",
    "32": "fp32",
    "bf16-mixed": "amp-bf16",
    "16-mixed": "amp-fp16",
    "bf16-true": "bf16-true",
}
_FSDP = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": "no_shard"}


def settings_from_trainer(trainer: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(TrainConfig settings, what they were read from, notes on what could not be
    mapped) of a running Lightning `Trainer`."""
    read: dict[str, Any] = {}
    notes: list[str] = []
    settings: dict[str, Any] = {}
    precision = str(getattr(trainer, "precision", "32-true"))
    read["precision"] = precision
    if precision in _PRECISION:
        settings["precision"] = _PRECISION[precision]
    else:
        notes.append(f"precision={shown(precision)}: counted as fp32 (no mapping)")
    settings["grad_accum"] = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
    read["accumulate_grad_batches"] = settings["grad_accum"]
    clip = getattr(trainer, "gradient_clip_val", None)
    read["gradient_clip_val"] = clip
    settings["clip_grad_norm"] = float(clip) if clip else None
    loader = getattr(trainer, "train_dataloader", None)
    for attr, name in (("batch_size", "micro_batch"), ("num_workers", "num_workers")):
        value = getattr(loader, attr, None)
        read[f"DataLoader.{attr}"] = value
        if isinstance(value, int) and value >= (1 if name == "micro_batch" else 0):
            settings[name] = value
    settings["pin_memory"] = bool(getattr(loader, "pin_memory", False))
    optimizers = getattr(trainer, "optimizers", None) or []
    if optimizers:
        opt = optimizers[0]
        kind = type(opt).__name__.lower()
        read["optimizer"] = type(opt).__name__
        found = _BY_CLASS.get(kind)  # the row whose class it is
        if found is None and "8bit" in kind:
            found = "paged-adam8bit" if "paged" in kind else "adam8bit"
        if found is None:
            notes.append(f"optimizer {type(opt).__name__}: counted as AdamW (no mapping)")
        else:
            settings["optimizer"] = found
        group = opt.param_groups[0] if opt.param_groups else {}
        lr = group.get("lr")
        if isinstance(lr, torch.Tensor):
            lr = lr.item()
        if isinstance(lr, (int, float)) and lr > 0:
            settings["lr"] = float(lr)
        if isinstance(group.get("weight_decay"), (int, float)):
            settings["weight_decay"] = float(group["weight_decay"])
        if found == "sgd" and isinstance(group.get("momentum"), (int, float)):
            settings["momentum"] = float(group["momentum"])
            if group["momentum"] == 0:
                settings["optimizer"] = "sgd-nomomentum"
                settings.pop("momentum")
    strategy = getattr(trainer, "strategy", None)
    name = type(strategy).__name__
    read["strategy"] = name
    if name == "DeepSpeedStrategy":
        settings.update(_deepspeed(getattr(strategy, "config", None), notes))
    elif name in ("FSDPStrategy", "ModelParallelStrategy"):
        mode = str(getattr(getattr(strategy, "sharding_strategy", None), "name", "FULL_SHARD"))
        settings["fsdp"] = _FSDP.get(mode, "full_shard")
    return settings, read, notes


def _deepspeed(config: Any, notes: list[str]) -> dict[str, Any]:
    from workbench.deepspeed import from_deepspeed

    if not isinstance(config, Mapping):
        return {}
    try:
        parsed = from_deepspeed(dict(config))
    except ValueError as exc:
        notes.append(f"DeepSpeed config not read ({exc}); counted without")
        return {}
    keep = ("zero_stage", "offload_optimizer", "offload_params", "precision", "nvme_path")
    return {k: getattr(parsed, k) for k in keep}


class WorkbenchLightningCallback(Callback):
    """A Lightning `Callback` that records the run into `self.observer` (an `Observer`,
    made with the callback; the model, optimizer and settings attached at
    `on_train_start`; see the module docstring)."""

    # Lightning calls a callback's hook only where it is callable (`_call_callback_hooks`):
    # the per-step hooks this callback has no use for are None, so a step pays nothing
    # for them (an empty hook costs its dispatch, a few microseconds each)
    on_before_backward = None  # type: ignore[assignment]
    on_after_backward = None  # type: ignore[assignment]
    on_before_zero_grad = None  # type: ignore[assignment]

    def __init__(self, *, grad_norm: bool | int | str = "auto") -> None:
        grad_norm_every(grad_norm)  # ValueError naming the value
        # made now, so a dashboard of it can be shown before `fit()`; the model, optimizer
        # and settings are attached when training starts
        self.observer = Observer(
            None,
            trainer="lightning",
            arg_names=ARG_NAMES,
            grad_norm=grad_norm,
            no_loss_note=NO_LOSS_NOTE,
        )
        self._stepped = False
        self._on = False  # a model attached: the run has started
        self._accum = 1
        self._manual = False
        self._each_batch = False
        self._scaler: Any = None
        self._hooked = True  # Lightning calls `on_before_optimizer_step`

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        settings, read, notes = settings_from_trainer(trainer)
        try:
            config = TrainConfig(**settings)
        except ConfigError as exc:
            notes.append(f"settings not all mappable ({exc}); predicted with the defaults")
            config = TrainConfig()
        model = _inner_model(pl_module)
        optimizers = getattr(trainer, "optimizers", None) or [None]
        self.observer.attach(model, optimizers[0], config=config, read_from=read, notes=notes)
        # read once, not on the hot path: 16-mixed's GradScaler
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        self._scaler = scaler if hasattr(scaler, "_scale") else None
        self._on = True
        # with manual optimization the module steps when it chooses: the hook says when
        self._manual = not getattr(pl_module, "automatic_optimization", True)
        self._read_accumulation(trainer)

    def _read_accumulation(self, trainer: Any) -> None:
        """The accumulation, read at each epoch's first batch (a GradientAccumulationScheduler
        changes it when the epoch starts), not on every step."""
        self._accum = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        self._each_batch = self._accum == 1 and not self._manual  # each batch steps
        self._dispatch_optimizer_hook(not self._each_batch or self.observer.grads_due)

    def _dispatch_optimizer_hook(self, on: bool) -> None:
        """Whether Lightning calls `on_before_optimizer_step` on the next steps: without
        accumulation (and under automatic optimization) every batch ends in an optimizer
        step, and the hook is needed only
        on the steps that read the gradients (their norm, the states' bytes); elsewhere
        it is None on this instance, which Lightning skips (as the unused hooks above)."""
        if on is self._hooked:
            return
        self._hooked = on
        if on:
            self.__dict__.pop("on_before_optimizer_step", None)
        else:
            self.__dict__["on_before_optimizer_step"] = None

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._on:
            if batch_idx == 0:
                self._read_accumulation(trainer)
            self.observer.batch_start(batch, batch_idx % self._accum == 0)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._on:
            self._stepped = True
            if self.observer.grads_due:  # the norm or the states' bytes are taken this step
                self.observer.before_optimizer_step(optimizer)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._on:
            return
        # Lightning hands back the loss divided by accumulate_grad_batches: the step's is
        # the sum of its micro-batches'
        loss = (
            outputs.get("loss")
            if type(outputs) is dict or isinstance(outputs, Mapping)
            else outputs
        )
        if not isinstance(loss, torch.Tensor):
            loss = None
        observer = self.observer
        if self._each_batch or self._stepped:  # this batch ended in an optimizer step
            self._stepped = False
            # 16-mixed's loss scale from Lightning's GradScaler (its tensor, read with the loss)
            scaler = self._scaler
            observer.end_step(
                loss, summed=True, scale=scaler._scale if scaler is not None else None
            )
            if self._each_batch:
                self._dispatch_optimizer_hook(observer.grads_due)
        else:
            observer.micro_batch(loss=loss, summed=True)


def _inner_model(pl_module: Any) -> Any:
    """The LightningModule's wrapped model when it holds exactly one (`self.model`, the
    common layout; what the prediction reads a shape from), else the module itself."""
    inner = getattr(pl_module, "model", None)
    return inner if isinstance(inner, torch.nn.Module) else pl_module
