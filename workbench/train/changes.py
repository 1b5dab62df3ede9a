"""Settings changes on a live Session: which pieces a setting rebuilds, and what a session
can run beyond what `TrainConfig` checks itself.

A change is validated when `update()` is called (every problem at once, the session
untouched) and applied at the next optimizer-step boundary by `Runtime.rebuild`: the data
loader is rebuilt for `DATA_FIELDS`, the backend (optimizer, precision policy, schedule,
DeepSpeed engine) for `BACKEND_FIELDS`, carrying weights and optimizer state; activation
checkpointing and the attention kernel are switched on the model, and activation offload
on the runtime's forward (`activation_offload`: its saved-tensor hooks on or off, nothing
rebuilt). `ChangeQueue` holds a Session's queue of
changes between the two. What a session cannot run is a list of `SettingProblem`s (the
setting, its value, why; other settings named between backticks), raised in one
`ConfigError`.
"""

from __future__ import annotations

import importlib.util
import threading
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader

from workbench.config import (
    SETTINGS,
    ConfigError,
    Device,
    Engine,
    FsdpMode,
    Precision,
    SettingProblem,
    TrainConfig,
    plain_value,
    runtime_problems,
    setting_value,
    value_problem,
)
from workbench.engines import ENGINES, engine_for, engine_problems
from workbench.export.job_parallel import fsdp_units, tied_split, units_problem
from workbench.inputs import shown
from workbench.train.records import Event
from workbench.train.techniques.attention import attention_problem
from workbench.train.techniques.lora import lora_problem
from workbench.train.techniques.pipeline_plan import pp_model_problem
from workbench.train.techniques.precision import amp_supported
from workbench.train.techniques.recompute import checkpointable_modules, selective_supported
from workbench.train.techniques.tensor_plan import tp_model_problem

#: Settings read by the data loader / the backend (each field's `Setting.rebuilds`); a
#: change to any rebuilds that piece. The LoRA settings rebuild the backend: the adapters
#: change the parameters the optimizer steps.
DATA_FIELDS = frozenset(n for n, spec in SETTINGS.items() if "data" in spec.rebuilds)
BACKEND_FIELDS = frozenset(n for n, spec in SETTINGS.items() if "backend" in spec.rebuilds)
_LOADER_FIELDS = ("micro_batch", "num_workers", "pin_memory")
#: The batch shape an out-of-memory retry changes (`ChangeQueue.after_oom`).
_BATCH_FIELDS = ("micro_batch", "grad_accum")


def needs_deepspeed(config: TrainConfig, world_size: int) -> bool:
    """Whether a DeepSpeed engine trains `config` (`engine_for`)."""
    return engine_for(config, world_size) is Engine.DEEPSPEED


def engine_copies_model(config: TrainConfig, world_size: int) -> bool:
    """Whether the engine for `config` trains its own copy of your module (DeepSpeed,
    FSDP) rather than your module itself (the plain loop)."""
    return engine_for(config, world_size).copies_model


def _deepspeed_fp16_on_cpu() -> bool:
    """Whether DeepSpeed's CPU accelerator runs fp16 (it asks oneDNN, as here)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:
        return False


def _deepspeed_backend_available() -> bool:
    try:
        module = ENGINES[Engine.DEEPSPEED].backend.partition(":")[0]
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def session_problems(
    config: TrainConfig,
    changed: set[str],
    *,
    model: nn.Module,
    device: torch.device,
    world_size: int,
    data: Any,
) -> list[SettingProblem]:
    """What a session on `device` with `world_size` ranks, training `model` from `data`,
    cannot run of a valid `config`, one problem each (`changed`: the settings an update
    changes; a user's DataLoader refuses loader settings only when they change)."""
    p = runtime_problems(config)  # optimizers it cannot train, NVMe paths
    p += engine_problems(config, world_size)  # pure bf16, amp-fp16 on DeepSpeed
    prec = Precision(config.precision)
    deepspeed = needs_deepspeed(config, world_size)
    if deepspeed and not _deepspeed_backend_available():
        p.append(
            SettingProblem(
                "precision",
                prec.value,
                f"with `zero_stage`={config.zero_stage} needs the DeepSpeed backend "
                "(workbench.train.backends.deepspeed), which this installation does not "
                "have; use precision fp32, amp-bf16 or amp-fp16 with `zero_stage`=0",
            )
        )
    if prec is Precision.FP16 and device.type == "cpu" and not _deepspeed_fp16_on_cpu():
        p.append(
            SettingProblem(
                "precision",
                prec.value,
                "DeepSpeed's fp16 does not run on this CPU (no oneDNN fp16 support); use "
                "precision 'amp-bf16' or 'bf16'",
            )
        )
    reason = amp_supported(prec, device.type)
    if reason:
        p.append(
            SettingProblem("precision", prec.value, f"not available on {device.type}: {reason}")
        )
    mode = str(config.activation_checkpointing)
    if mode == "full" and not checkpointable_modules(model):
        p.append(
            SettingProblem(
                "activation_checkpointing",
                mode,
                "the model has no checkpointable blocks; mark them with "
                "workbench.train.techniques.recompute.mark_checkpointable(model, [names])",
            )
        )
    if mode == "selective" and not selective_supported(model):
        p.append(
            SettingProblem(
                "activation_checkpointing",
                mode,
                "selective recomputation needs an attention core to recompute (the "
                "built-in GPT's, or a transformers model's attention function); for your "
                "own module use 'full'",
            )
        )
    lora = lora_problem(model, config)
    if lora is not None:
        p.append(lora)
    kernel = attention_problem(model, config.attention)
    if kernel is not None:
        p.append(kernel)
    if Device(config.device) is not Device.AUTO and Device(config.device).value != device.type:
        p.append(
            SettingProblem(
                "device",
                Device(config.device).value,
                f"this session runs on {device.type}; the device cannot change on a live "
                "session (create a new Session)",
            )
        )
    tp = tp_model_problem(model, int(config.tp), bool(config.sequence_parallel))
    if tp is not None:
        p.append(tp)
    stages = pp_model_problem(model, int(config.pp))
    if stages is not None:
        p.append(stages)
    tied = _tied_units(model, config)
    if tied is not None:
        p.append(tied)
    p += [fixed_problem(n, plain_value(getattr(config, n))) for n in LIVE_FIXED if n in changed]
    if isinstance(data, DataLoader):
        for name in _LOADER_FIELDS:
            current = {
                "micro_batch": data.batch_size,
                "num_workers": data.num_workers,
                "pin_memory": data.pin_memory,
            }[name]
            if name in changed and getattr(config, name) != current:
                p.append(
                    SettingProblem(
                        name,
                        getattr(config, name),
                        f"data is a DataLoader you built (`{name}`={shown(current)}); change it "
                        "there, or pass a Dataset so the session builds the loader",
                    )
                )
    if (config.checkpoint_every_steps or config.checkpoint_every_seconds) and not (
        config.checkpoint_dir
    ):
        p.append(
            SettingProblem(
                "checkpoint_dir",
                None,
                "`checkpoint_every_steps` / `checkpoint_every_seconds` need a `checkpoint_dir`",
            )
        )
    return p


#: Settings a live session cannot change, and why (`fixed_problem`).
LIVE_FIXED = {
    "pp": "the stage count decides which ranks hold which layers and read which samples; "
    "create a new Session (or launch) with it",
    "tp": "the tensor-parallel layout decides which ranks read which samples and how each "
    "layer is split; create a new Session (or launch) with it",
    "documents": "the layout decides the samples, their number (the data position) and the "
    "vocabulary (the end-of-document token); create a new Session",
}
LIVE_FIXED["sequence_parallel"] = LIVE_FIXED["tp"]


def fixed_problem(name: str, value: Any) -> SettingProblem:
    """`name` (one of `LIVE_FIXED`) asked to change to `value` on a live session."""
    return SettingProblem(name, value, f"cannot change on a live session: {LIVE_FIXED[name]}")


def _tied_units(model: nn.Module, config: TrainConfig) -> SettingProblem | None:
    """FSDP units that split a tied weight over two units (`job_parallel.tied_split`) or
    name no module of the model (`job_parallel.units_problem`), refused before anything is
    built; with LoRA the names are checked when the engine is built
    (`job_parallel.resolve_units`), on the module with the adapters in it."""
    if FsdpMode(config.fsdp) is FsdpMode.OFF:
        return None
    spec = str(config.fsdp_units)
    units, missing = fsdp_units(model, spec, checkpointable_modules(model))
    if missing:
        if int(config.lora_rank or 0) > 0:
            return None  # the adapters' names exist once they are added
        return SettingProblem("fsdp_units", spec, units_problem(model, missing))
    problem = tied_split(model, units)
    return None if problem is None else SettingProblem("fsdp_units", spec, problem)


class OomQueue(NamedTuple):
    """What `ChangeQueue.after_oom` did with the changes queued at an out-of-memory step."""

    queued: dict[str, Any]  # the micro_batch / grad_accum changes queued then
    asked: TrainConfig  # the settings asked for now (in effect from the next step)
    refused: dict[str, Any]  # the queued changes refused (never applied), with `why`
    why: str


class ChangeQueue:
    """A Session's settings changes between `update()` and the step boundary.

    `requested`: the settings asked for (those in effect and every queued change);
    `request` checks a change against them and queues it, `apply` rebuilds what the
    queued changes need at a step boundary (all together, or none), and `for_record`
    hands the applied changes to the next StepRecord, once. `lock`: the session's state
    lock, held for every read and write of the queue.
    """

    def __init__(self, config: TrainConfig, lock: threading.RLock) -> None:
        self.requested = config
        self._lock = lock
        self._pending: dict[str, Any] = {}
        self._for_record: dict[str, Any] = {}

    def pending(self) -> dict[str, Any]:
        """The queued changes (setting -> value), a copy."""
        with self._lock:
            return dict(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def request(
        self,
        changes: dict[str, Any],
        problems: Callable[[TrainConfig, set[str]], list[SettingProblem]],
    ) -> dict[str, Any]:
        """Queue `changes` on top of the settings asked for; ConfigError naming every
        problem (TrainConfig's own, then `problems(new, changed)`), nothing queued. Returns
        what was queued before, for `withdraw`."""
        with self._lock:
            self._refuse_fixed(changes)
            new = self.requested.replace(**changes)  # ConfigError: names, types, ranges
            # a setting given its present value changes nothing, and nothing is refused of it
            changed = {k for k in changes if getattr(new, k) != getattr(self.requested, k)}
            found = problems(new, changed)
            if found:
                raise ConfigError(found)
            before = dict(self._pending)
            self.requested = new
            for name in changes:
                self._pending[name] = plain_value(getattr(new, name))
            return before

    def _refuse_fixed(self, changes: dict[str, Any]) -> None:
        """A change to a setting a live session cannot change (`LIVE_FIXED`) is refused as
        that, with the other changes' own problems, not as what it would need of the other
        settings (`pp`=2 needing `grad_accum` >= 2). A value that is none of the setting's
        (`pp`='x') is refused as that, with the rest, by TrainConfig's own checks."""
        fixed = [
            n
            for n in LIVE_FIXED
            if n in changes
            and value_problem(n, changes[n]) is None
            and setting_value(n, changes[n]) != getattr(self.requested, n)
        ]
        if not fixed:
            return
        found = [fixed_problem(n, changes[n]) for n in fixed]
        try:
            self.requested.replace(**{k: v for k, v in changes.items() if k not in fixed})
        except ConfigError as exc:
            found += exc.problems
        raise ConfigError(found)

    def withdraw(self, names: set[str], before: dict[str, Any], current: TrainConfig) -> None:
        """Take back the request of `names` (`request` returned `before`, what was queued
        then) that was never applied (an interrupted `update`): those settings queued as
        before it, the settings asked for `current` (those in effect) with the queue."""
        with self._lock:
            for name in names:
                if name in before:
                    self._pending[name] = before[name]
                else:
                    self._pending.pop(name, None)
            try:
                self.requested = current.replace(**self._pending)
            except ConfigError:  # (another thread's request built on this one)
                self.requested, self._pending = current, {}

    def after_oom(self, ran_out: TrainConfig, retry: TrainConfig) -> OomQueue:
        """The session retries a step that ran out of memory at `ran_out` with `retry` (its
        micro-batch halved, grad_accum doubled): ask for that shape too, never dropping a
        queued `micro_batch` / `grad_accum` change silently. A queued micro_batch below the
        one that ran out stays queued as asked; a queued grad_accum alone is doubled with
        the retry's (the effective batch asked for, at the micro-batch that fits); a queued
        micro_batch at or above the one that ran out would run out again, and is refused
        with the grad_accum queued beside it (so is every queued change when the retry's
        shape cannot take one of them)."""
        with self._lock:
            asked = self.requested
            queued = {k: self._pending[k] for k in _BATCH_FIELDS if k in self._pending}
            want = {"micro_batch": retry.micro_batch, "grad_accum": retry.grad_accum}
            refused, why = dict(queued), ""
            if "micro_batch" not in queued:
                refused = {}
                if "grad_accum" in queued:  # the effective batch asked for, at half the micro-batch
                    want["grad_accum"] = asked.grad_accum * 2
            elif asked.micro_batch < ran_out.micro_batch:  # as asked
                want, refused = {k: getattr(asked, k) for k in _BATCH_FIELDS}, {}
            else:
                why = (
                    f"micro_batch={asked.micro_batch} would run out of memory too: "
                    f"micro_batch={ran_out.micro_batch} did"
                )
            try:
                new = asked.replace(**want)
            except ConfigError:  # a doubled grad_accum over its maximum, or a queued change
                new, why = self._fit(retry, want, refused, why)  # the retry's shape refuses
            self.requested = new
            for name in _BATCH_FIELDS:
                if getattr(new, name) != getattr(retry, name):
                    self._pending[name] = getattr(new, name)
                else:
                    self._pending.pop(name, None)
            return OomQueue(queued, new, refused, why)

    def _fit(
        self, retry: TrainConfig, want: dict[str, Any], refused: dict[str, Any], why: str
    ) -> tuple[TrainConfig, str]:
        """`retry` with each queued change it can take, then the batch shape `want`; the
        others are refused (added to `refused`, their problems to `why`). The caller holds
        the lock."""
        new, whys = retry, [why] if why else []
        for name, value in list(self._pending.items()):
            if name in _BATCH_FIELDS:
                continue
            try:
                new = new.replace(**{name: value})
            except ConfigError as exc:
                refused[name] = self._pending.pop(name)
                whys += [str(p) for p in exc.problems]
        try:
            new = new.replace(**want)
        except ConfigError as exc:
            refused.update({k: self._pending[k] for k in _BATCH_FIELDS if k in self._pending})
            whys += [str(p) for p in exc.problems]
        return new, "; ".join(whys)

    def apply(
        self,
        current: TrainConfig,
        rebuild: Callable[[TrainConfig, set[str]], None],
        *,
        first_step: int,
        event: Callable[..., Event],
        raise_errors: bool,
        problems: Callable[[TrainConfig, set[str]], list[SettingProblem]],
    ) -> None:
        """Apply the queued changes that differ from `current` with `rebuild(target,
        changed)` (which takes `target` as the settings in effect and calls `applied`);
        an Event "change" says from which step, "change-failed" why nothing changed
        (raised as ValueError too with `raise_errors`). A failed build drops its own
        changes only: those queued while it ran stay queued (`requeue`)."""
        with self._lock:
            if not self._pending:
                return
            changes, self._pending = self._pending, {}
            target = self.requested
        diff = {k: v for k, v in changes.items() if getattr(current, k) != getattr(target, k)}
        if not diff:
            return
        try:
            rebuild(target, set(diff))
        except BaseException as exc:
            if not isinstance(exc, Exception):  # KeyboardInterrupt: nothing was applied,
                with self._lock:  # the changes stay queued (under those queued meanwhile)
                    self._pending = {**changes, **self._pending}
                raise
            with self._lock:
                kept, dropped, why = self._requeue(current, problems)
            after = f"; still queued: {kept}" if kept else ""
            if dropped:
                after = (
                    f"; also dropped {dropped}, queued meanwhile, which the settings in "
                    f"effect cannot take: {why}"
                )
            event(
                "change-failed",
                f"could not apply {diff}: {type(exc).__name__}: {exc}; kept the previous "
                f"settings{after}",
                "error",
                changes=diff,
                dropped=dropped,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            if raise_errors:
                raise ValueError(f"could not apply {diff}: {exc}{after}") from exc
            return
        event(
            "change",
            f"applied {diff} from step {first_step}",
            step=first_step,
            changes=diff,
            effective_step=first_step,
        )

    def _requeue(
        self,
        current: TrainConfig,
        problems: Callable[[TrainConfig, set[str]], list[SettingProblem]],
    ) -> tuple[dict[str, Any], dict[str, Any], str]:
        """After a failed build (`current` still in effect): the changes queued while it
        ran stay queued, on top of `current` (returned as kept); if `current` cannot take
        them (one made for the failed change), they are dropped, returned with why. The
        caller holds the lock."""
        queued = dict(self._pending)
        try:
            new = current.replace(**queued)
            changed = {k for k in queued if getattr(new, k) != getattr(current, k)}
            found = problems(new, changed) if changed else []
        except ConfigError as exc:
            found = exc.problems
        if not found:
            self.requested = new
            return queued, {}, ""
        self.requested, self._pending = current, {}
        return {}, queued, "; ".join(str(p) for p in found)

    def applied(self, target: TrainConfig, changed: set[str]) -> None:
        """`target` is in effect now; the next record names `changed`."""
        with self._lock:
            if not self._pending:
                self.requested = target
            self._for_record.update({k: plain_value(getattr(target, k)) for k in changed})

    def for_record(self) -> dict[str, Any]:
        """The changes applied since the last record (then none)."""
        with self._lock:
            out, self._for_record = self._for_record, {}
            return out


def checked_config(config: TrainConfig | None) -> TrainConfig:
    """`config`, or the defaults for None; ValueError for anything but a TrainConfig."""
    if config is None:
        return TrainConfig()
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={shown(config)}: must be a workbench.TrainConfig")
    return config


def check_sampler(sampler: Any) -> None:
    """ValueError naming `sampler` unless it is None or a `workbench.monitor.Sampler` (its
    latest reading goes with each step record)."""
    if sampler is not None and not hasattr(sampler, "latest"):
        raise ValueError(
            f"sampler={shown(sampler)}: must be a workbench.monitor.Sampler (its latest "
            "reading goes with each step record) or None"
        )
