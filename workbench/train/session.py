"""`Session`: a live training loop whose settings change while it runs.

    from workbench import Session, TrainConfig

    with Session(TrainConfig(micro_batch=16)) as s:      # built-in "tiny-gpt"
        s.run(optimizer_steps=20)                        # blocking, in this thread
        s.update(precision="amp-bf16", grad_accum=4)     # applied at the next step
        s.start()                                        # background thread
        ...
        s.pause(); s.memory(); s.profile(steps=3); s.resume()

States: "idle" (nothing running; a run reached its target), "running", "paused"
(`pause()`, or a non-finite loss), "stopped" (`stop()`), "error" (an exception in the
model, loss or data; the traceback is in `events`), "closed". `start()`/`run()` work
from idle, paused, stopped and error; `resume()` continues a paused or errored run
towards its target in a background thread. Calls in the wrong state raise
`SessionStateError` and change nothing.

Changes (`update(**changes)`) are validated at once (ValueError naming every problem;
the session is untouched) and applied at the next optimizer-step boundary, all together:
the data loader is rebuilt for micro_batch / num_workers / pin_memory / seed, the
backend (optimizer, precision policy, schedule) for the optimizer settings, carrying
weights and optimizer state; activation checkpointing is switched on the model. If
anything fails to build, nothing changes and an Event("change-failed") says why. When no
loop is running, the change is applied before `update` returns (and a failure raises).
The first StepRecord after a change carries `changes={...}`.

Faults: a non-finite loss skips the step and pauses (Event "nan-loss"); out of memory
halves micro_batch and doubles grad_accum (same effective batch) and retries the same
samples (Event "oom"); any other exception moves to "error" (Event "error" with the
traceback) and the session can be `update`d and `resume`d; the weights and optimizer
state are those before the failed step, whose micro-batches are not retried (a batch
that always fails would otherwise block `resume`).

LR scaling: `lr_scaling` scales `lr` by the effective batch relative to the one the
session started with (see `workbench.train.schedule`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import threading
import time
import traceback
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench.config import Device, Precision, TrainConfig, _format, _plain, runtime_problems
from workbench.modelstats import count_parameters
from workbench.train import batches
from workbench.train import checkpoints as ckpt
from workbench.train.backends import Backend, ModelStateBytes, StepOutcome, build_backend
from workbench.train.data import DataPosition, DataStream
from workbench.train.devices import cuda_uuid, resolve_device
from workbench.train.precision import amp_supported
from workbench.train.recompute import checkpointable_modules, set_activation_checkpointing
from workbench.train.records import Event, StepRecord
from workbench.train.schedule import scaled_lr

STATES = ("idle", "running", "paused", "stopped", "error", "closed")

#: Failures of a background run are also logged here (stderr by default), so they show
#: in the notebook cell or console the user is looking at, not only in `events`.
log = logging.getLogger("workbench")

#: Settings read by the data loader / the backend; a change to any rebuilds that piece.
DATA_FIELDS = frozenset({"micro_batch", "num_workers", "pin_memory", "seed"})
BACKEND_FIELDS = frozenset(
    {
        "precision",
        "optimizer",
        "lr",
        "weight_decay",
        "momentum",
        "lr_schedule",
        "warmup_steps",
        "total_steps",
        "lr_scaling",
        "clip_grad_norm",
        "zero_stage",
        "offload_optimizer",
        "offload_params",
        "nvme_path",
        "loss_scale_init",
        "loss_scale_growth",
        "loss_scale_backoff",
        "loss_scale_interval",
        "grad_accum",
        "micro_batch",
    }
)


#: Which live Session trains which module, weakly (keeps nothing alive). Re-running a
#: notebook cell that builds a new Session on the same module closes the old one, so
#: two loops never train one module and the old thread does not linger.
_OWNERS: weakref.WeakKeyDictionary[nn.Module, weakref.ReferenceType[Session]] = (
    weakref.WeakKeyDictionary()
)

#: Sessions not yet closed, weakly. A process that ends with one still training (a script
#: that never calls close()) stops and closes it at exit: the training thread would
#: otherwise be killed inside a torch op, and the process abort.
_OPEN: weakref.WeakSet[Session] = weakref.WeakSet()


@atexit.register
def _close_open_sessions() -> None:
    for session in list(_OPEN):
        with contextlib.suppress(Exception):
            session.close()


#: Why `memory()` has no activation prediction for the mlp, the cnn and user modules.
NO_ACTIVATION_PREDICTION = (
    "no activation prediction: the estimator's activation formula (Korthikanti et al.) "
    "covers decoder-only transformers such as tiny-gpt; for other models activation_bytes "
    "is measured only (for the built-in mlp and cnn it equals a hand count of the tensors "
    "their layers save)"
)


class SessionError(RuntimeError):
    """A training step failed; the session is in state "error" (see `events`)."""


class SessionStateError(RuntimeError):
    """A call that the session's current state does not allow."""


class _NonFiniteLoss(Exception):
    def __init__(self, value: float) -> None:
        super().__init__(value)
        self.value = value


def is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or a RuntimeError whose message says out of memory."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    if isinstance(exc, RuntimeError):
        msg = str(exc).lower()
        return "out of memory" in msg or "can't allocate memory" in msg
    return False


def _world_from_env() -> tuple[int, int]:
    problems = []
    values = {}
    for name, default, minimum in (("WORLD_SIZE", "1", 1), ("RANK", "0", 0)):
        raw = os.environ.get(name, default)
        try:
            values[name] = int(raw)
            if values[name] < minimum:
                raise ValueError
        except ValueError:
            problems.append(f"environment {name}={raw!r}: must be an integer >= {minimum}")
    if not problems and values["RANK"] >= values["WORLD_SIZE"]:
        problems.append(
            f"environment RANK={values['RANK']}: must be < WORLD_SIZE={values['WORLD_SIZE']}"
        )
    if problems:
        raise ValueError(_format(problems))
    return values["WORLD_SIZE"], values["RANK"]


def _deepspeed_fp16_on_cpu() -> bool:
    """Whether DeepSpeed's CPU accelerator runs fp16 (it asks oneDNN, as here)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:
        return False


def _deepspeed_backend_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("workbench.train.backends.deepspeed") is not None
    except (ImportError, ValueError):
        return False


class Session:
    """A training run you can change while it runs (see the module docstring).

    `config`: a `TrainConfig` (its docstring lists every setting and its allowed values);
    None for the defaults.
    `model`: a built-in name, "tiny-gpt" (default), "mlp" or "cnn" (`model_options` go to
    `workbench.models.build_model`, seeded from `config.seed` unless given), or your
    `nn.Module` (then `data` is required).
    `data`: a `Dataset` (the session builds and rebuilds the DataLoader) or a `DataLoader`
    (used as is; its batch size becomes `micro_batch`). A batch is an `(inputs, targets)`
    pair, with `loss_fn(outputs, targets)`, or a mapping of the model's keyword arguments
    (Hugging Face style: `model(**batch)`; without `loss_fn` the output's `.loss` is the
    loss, with one it gets `loss_fn(outputs, batch)`); see `workbench.train.batches`. One
    batch is checked here. `loss_fn` always receives fp32 outputs.
    `sampler`: a running `workbench.monitor.Sampler` whose latest sample is attached to
    each record. `device`: "cpu", "cuda" or "cuda:N" (default: `config.device`; "auto"
    takes CUDA when available). `resume`: a checkpoint file or directory to continue from.

    Your module's weights: the plain loop trains your module itself; a DeepSpeed engine
    (ZeRO, DeepSpeed 16-bit, several ranks) trains its own copy, and your module gets the
    trained weights back, in its own dtypes, at every engine switch and at `close()`.
    `state_dict()` and `save_weights(path)` give the full weights at any time.

    Reproducibility: a new session seeds torch's global RNG with `config.seed` (dropout
    draws from it), built-in models draw their weights and data from `config.seed` too,
    and the data order is a function of (seed, epoch). A resumed session restores the
    RNG states saved in the checkpoint instead.
    """

    def __init__(
        self,
        config: TrainConfig | None = None,
        *,
        model: str | nn.Module = "tiny-gpt",
        data: Dataset[Any] | DataLoader[Any] | None = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        sampler: Any | None = None,
        device: str | torch.device | None = None,
        model_options: dict[str, Any] | None = None,
        resume: str | os.PathLike[str] | None = None,
    ) -> None:
        if config is None:
            config = TrainConfig()
        if not isinstance(config, TrainConfig):
            raise ValueError(f"config={config!r}: must be a workbench.TrainConfig")
        self.id = uuid.uuid4().hex[:8]
        self.world_size, self.rank = _world_from_env()
        self.device = resolve_device(device, Device(config.device).value)
        payload = ckpt.load(resume) if resume is not None else None

        # -- model, data, loss
        self.info: Any | None = None
        self.model_name: str | None = None
        self.model_options: dict[str, Any] = {}
        if isinstance(model, str):
            from workbench.models import build_model

            opts = dict(model_options or {})
            opts.setdefault("seed", int(config.seed))
            module, dataset, builtin_loss, info = build_model(model, **opts)
            self.model_name, self.model_options, self.info = model, opts, info
            data = dataset if data is None else data
            loss_fn = builtin_loss if loss_fn is None else loss_fn
        elif isinstance(model, nn.Module):
            if model_options:
                raise ValueError("model_options: apply only to a built-in model name")
            module = model
            if data is None:
                raise ValueError(
                    "data=None: required with your own nn.Module (a Dataset or DataLoader of "
                    "(inputs, targets) pairs with loss_fn(outputs, targets), or of mappings of "
                    "the model's keyword arguments such as {'input_ids', 'labels'})"
                )
        else:
            raise ValueError(
                f"model={model!r}: must be a built-in model name (tiny-gpt, mlp, cnn) or a "
                "torch.nn.Module"
            )
        if not isinstance(data, (Dataset, DataLoader)):
            raise ValueError(f"data={data!r}: must be a torch Dataset or DataLoader")
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(
                f"loss_fn={loss_fn!r}: must be callable(outputs, targets), or None when the "
                "model returns its own .loss"
            )
        if (
            isinstance(data, DataLoader)
            and data.batch_size
            and data.batch_size != config.micro_batch
        ):
            config = config.replace(micro_batch=int(data.batch_size))
        previous_ref = _OWNERS.get(module)
        previous = previous_ref() if previous_ref is not None else None
        if previous is not None and previous.state != "closed":
            warnings.warn(
                f"closing {previous!r}: its model is now trained by a new Session",
                stacklevel=2,
            )
            previous.close()
        self._model: nn.Module = module
        self._loss_fn = loss_fn
        self._data_source = data
        self._user_loader = isinstance(data, DataLoader)
        self._sampler = sampler

        problems = self._session_problems(config, set())
        if problems:
            raise ValueError(_format(problems))

        # -- state
        self._state_lock = threading.RLock()
        self._cond = threading.Condition(self._state_lock)
        self._step_lock = threading.RLock()
        self._state = "idle"
        self._config = config
        self._requested = config
        self._pending: dict[str, Any] = {}
        self._changes_for_next_record: dict[str, Any] = {}
        self._loop_active = False
        self._loop_thread_id: int | None = None
        self._thread: threading.Thread | None = None
        self._pause_requested = False
        self._stop_requested = False
        self._target_step: int | None = None
        self._step = 0
        self._last_error: str | None = None
        self._failure: str | None = None
        self._background = False
        self._fresh_backend = True  # the next record is the first on a new engine (warm-up)
        # the monitor's samples are matched to this GPU by UUID (None on CPU: the first GPU)
        self._gpu_uuid = cuda_uuid(self.device)
        # CUDA runs asynchronously: wait for the device before reading a step's time
        self._sync_device: Callable[[], None] = (
            (lambda dev=self.device: torch.cuda.synchronize(dev))
            if self.device.type == "cuda"
            else (lambda: None)
        )
        self.history: list[StepRecord] = []
        self.events: list[Event] = []
        self._version = 0
        self._callbacks: list[Callable[[StepRecord], None]] = []
        self._state_bytes: ModelStateBytes | None = None
        self._last_save_time = time.time()
        self.reference_batch = config.effective_batch_size(self.world_size)
        self._device_memory = self._memory_reader()
        # Phase labels of the loop: no-ops, `record_function` while profile() runs.
        self._label: Callable[[str], contextlib.AbstractContextManager[Any]] = (
            contextlib.nullcontext
        )

        position = None
        state = None
        if payload is not None:
            self._step = int(payload["step"])
            self.reference_batch = int(payload.get("reference_batch") or self.reference_batch)
            position = DataPosition(**payload["data"]) if payload.get("data") else None
            state = payload["backend"]
            self.history = [StepRecord.from_dict(r) for r in payload.get("history", [])]
        # A DeepSpeed engine trains its own copy on the device: keep yours in host memory
        # then, so the GPU never holds a second fp32 copy (see _park_user_module).
        module.to(self.device if not _needs_deepspeed(config, self.world_size) else "cpu")
        module.train()
        if payload is not None:
            self._load_buffers(payload.get("buffers") or {})
        set_activation_checkpointing(module, bool(config.activation_checkpointing))
        self._data = DataStream(
            data,
            micro_batch=int(config.micro_batch),
            num_workers=int(config.num_workers),
            pin_memory=bool(config.pin_memory),
            seed=int(config.seed),
            device=self.device,
            rank=self.rank,
            world_size=self.world_size,
            position=position,
        )
        try:
            batches.check_batch(self._data.peek(), loss_fn)  # a wrong data shape fails here
            self._announce_op_builds(config)
            self._backend: Backend = build_backend(
                self._backend_config(config),
                module,
                state=state,
                world_size=self.world_size,
                device=self.device,
            )
        except BaseException:
            self._data.close()
            raise
        self._park_user_module()
        _OWNERS[module] = weakref.ref(self)
        _OPEN.add(self)
        if payload is not None:
            ckpt.set_rng_state(payload["rng"])
            self._event("resumed", f"resumed from {payload['path']} at step {self._step}")
        else:
            torch.manual_seed(int(config.seed))  # dropout draws from torch's global RNG

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> TrainConfig:
        """The settings in effect (queued changes are in `pending_changes`)."""
        return self._config

    @property
    def model(self) -> nn.Module:
        """The module being trained now: your module, or under DeepSpeed the engine's
        working copy (16-bit, flattened, partitioned under ZeRO-3). Your own module gets the
        trained weights back at every engine switch and at `close()`; `state_dict()` gives
        the full weights at any time. After `close()` this is your module."""
        if self._state == "closed":
            return self._model
        return self._inner(self._backend)

    @property
    def gpu_uuid(self) -> str | None:
        """NVML's UUID of the GPU this session trains on (None on CPU): the monitor's
        samples and the advisor read this GPU."""
        return self._gpu_uuid

    @property
    def failure(self) -> str | None:
        """Why the last run ended early (a non-finite loss, or an exception in a step), or
        None. Cleared when a run starts."""
        return self._failure

    @property
    def pending_changes(self) -> dict[str, Any]:
        with self._state_lock:
            return dict(self._pending)

    @property
    def state(self) -> str:
        return self._state

    @property
    def step(self) -> int:
        """Optimizer steps attempted so far (records emitted, skipped steps included)."""
        return self._step

    @property
    def version(self) -> int:
        """Increases with every new record or event (cheap change detection for views)."""
        return self._version

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def lr(self) -> float:
        """Learning rate after `lr_scaling` (before the schedule)."""
        return scaled_lr(self._config, self.reference_batch, self.world_size)

    def records_since(self, index: int) -> list[StepRecord]:
        """Records `history[index:]`, copied under the lock (safe from any thread)."""
        with self._state_lock:
            return self.history[index:]

    def events_since(self, index: int) -> list[Event]:
        with self._state_lock:
            return self.events[index:]

    def on_record(self, callback: Callable[[StepRecord], None]) -> Callable[[], None]:
        """Call `callback(record)` in the training thread after each step; returns a
        function that unsubscribes. Exceptions in callbacks become warning events."""
        if not callable(callback):
            raise ValueError(f"callback={callback!r}: must be callable(record)")
        with self._state_lock:
            self._callbacks.append(callback)

        def remove() -> None:
            with self._state_lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return remove

    def __repr__(self) -> str:
        return (
            f"Session(id={self.id}, state={self._state}, step={self._step}, "
            f"model={self.model_name or type(self.model).__name__})"
        )

    # ------------------------------------------------------------------ setup helpers
    def _memory_reader(self) -> Callable[[], tuple[int | None, int | None, int | None, int | None]]:
        if self.device.type == "cuda":
            dev = self.device

            def cuda() -> tuple[int | None, int | None, int | None, int | None]:
                return (
                    torch.cuda.memory_allocated(dev),
                    torch.cuda.max_memory_allocated(dev),
                    torch.cuda.memory_reserved(dev),
                    None,
                )

            return cuda
        import psutil

        proc = psutil.Process()

        def cpu() -> tuple[int | None, int | None, int | None, int | None]:
            return None, None, None, int(proc.memory_info().rss)

        return cpu

    def _backend_config(self, config: TrainConfig) -> TrainConfig:
        lr = scaled_lr(config, self.reference_batch, self.world_size)
        return config if lr == config.lr else config.replace(lr=lr)

    def _session_problems(self, config: TrainConfig, changed: set[str]) -> list[str]:
        """Checks beyond TrainConfig's own: what this session, device and build support."""
        p: list[str] = runtime_problems(config)  # optimizers it cannot train, NVMe paths
        prec = Precision(config.precision)
        if (config.uses_deepspeed or self.world_size > 1) and not _deepspeed_backend_available():
            p.append(
                f"precision={prec.value!r}, zero_stage={config.zero_stage}: need the DeepSpeed "
                "backend (workbench.train.backends.deepspeed), which this installation does not have; use "
                "precision fp32, amp-bf16 or amp-fp16 with zero_stage=0"
            )
        if (config.uses_deepspeed or self.world_size > 1) and prec is Precision.AMP_FP16:
            p.append(
                "precision='amp-fp16': the DeepSpeed backend (zero_stage >= 1 or several ranks) "
                "does not run torch's GradScaler; use precision='fp16' (DeepSpeed's loss-scaled "
                "fp16) or 'amp-bf16'"
            )
        if prec is Precision.FP16 and self.device.type == "cpu" and not _deepspeed_fp16_on_cpu():
            p.append(
                "precision='fp16': DeepSpeed's fp16 does not run on this CPU (no oneDNN fp16 "
                "support); use precision 'amp-bf16' or 'bf16'"
            )
        reason = amp_supported(prec, self.device.type)
        if reason:
            p.append(f"precision={prec.value!r}: not available on {self.device.type}: {reason}")
        if config.activation_checkpointing and not checkpointable_modules(self._model):
            p.append(
                "activation_checkpointing=True: the model has no checkpointable blocks; mark "
                "them with workbench.train.recompute.mark_checkpointable(model, [names])"
            )
        if (
            Device(config.device) is not Device.AUTO
            and Device(config.device).value != self.device.type
        ):
            p.append(
                f"device={Device(config.device).value!r}: this session runs on "
                f"{self.device.type}; the device cannot change on a live session (create a "
                "new Session)"
            )
        if self._user_loader:
            loader = self._data_source
            for name in ("micro_batch", "num_workers", "pin_memory") if changed else ():
                current = {
                    "micro_batch": getattr(loader, "batch_size", None),
                    "num_workers": getattr(loader, "num_workers", None),
                    "pin_memory": getattr(loader, "pin_memory", None),
                }[name]
                if name in changed and getattr(config, name) != current:
                    p.append(
                        f"{name}={getattr(config, name)!r}: data is a DataLoader you built "
                        f"({name}={current!r}); change it there, or pass a Dataset so the "
                        "session builds the loader"
                    )
        if (
            config.checkpoint_every_steps or config.checkpoint_every_seconds
        ) and not config.checkpoint_dir:
            p.append(
                "checkpoint_dir=None: checkpoint_every_steps / checkpoint_every_seconds need "
                "a checkpoint_dir"
            )
        return p

    # ------------------------------------------------------------------ events
    def _event(
        self,
        kind: str,
        message: str,
        severity: str = "info",
        *,
        step: int | None = None,
        **details: Any,
    ) -> Event:
        """Record an event. `step` counts as the records do: the step it concerns (a
        failed or changed step's number); by default the last completed step."""
        ev = Event(
            kind=kind,
            message=message,
            step=self._step if step is None else step,
            severity=severity,
            details=details,
        )
        with self._state_lock:
            self.events.append(ev)
            self._version += 1
        return ev

    def _set_state(self, state: str) -> None:
        with self._cond:
            self._state = state
            self._version += 1
            self._cond.notify_all()

    # ------------------------------------------------------------------ changes
    def update(self, **changes: Any) -> None:
        """Validate `changes` now and apply them at the next optimizer-step boundary
        (at once when no loop runs). ValueError, session unchanged, if any is invalid."""
        if not changes:
            return
        with self._state_lock:
            self._check_open("update")
            new = self._requested.replace(**changes)  # ValueError: names, types, ranges
            problems = self._session_problems(new, set(changes))
            if problems:
                raise ValueError(_format(problems))
            self._requested = new
            for name in changes:
                self._pending[name] = _plain(getattr(new, name))
            apply_now = not self._loop_active
        if apply_now:
            with self._step_lock:
                self._apply_pending(raise_errors=True)

    def _apply_pending(self, *, raise_errors: bool) -> None:
        """Apply queued changes (caller holds the step lock)."""
        with self._state_lock:
            if not self._pending:
                return
            changes, self._pending = self._pending, {}
            target = self._requested
        old = self._config
        diff = {k: v for k, v in changes.items() if getattr(old, k) != getattr(target, k)}
        if not diff:
            return
        try:
            self._apply_config(target, set(diff))
        except Exception as exc:
            with self._state_lock:
                self._requested = self._config
                self._pending.clear()
            self._event(
                "change-failed",
                f"could not apply {diff}: {type(exc).__name__}: {exc}; kept the previous settings",
                "error",
                changes=diff,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            if raise_errors:
                raise ValueError(f"could not apply {diff}: {exc}") from exc
            return
        first = self._step + 1  # the first step that runs with the change
        self._event(
            "change",
            f"applied {diff} from step {first}",
            step=first,
            changes=diff,
            effective_step=first,
        )

    def _apply_config(
        self, target: TrainConfig, changed: set[str], *, release_first: bool = False
    ) -> None:
        """Build what `changed` needs, then swap; on any failure nothing is swapped.
        `release_first` (out-of-memory recovery): a DeepSpeed engine is released before
        its successor is built, since both would not fit on the device at once."""
        old = self._config
        new_data: DataStream | None = None
        new_backend: Backend | None = None
        try:
            if changed & DATA_FIELDS and not self._user_loader:
                new_data = self._data.rebuilt(
                    micro_batch=int(target.micro_batch),
                    num_workers=int(target.num_workers),
                    pin_memory=bool(target.pin_memory),
                    seed=int(target.seed),
                )
            if changed & BACKEND_FIELDS:
                new_backend = self._next_backend(target, release_first=release_first)
            if "activation_checkpointing" in changed:
                self._set_checkpointing(bool(target.activation_checkpointing), new_backend)
        except BaseException:
            if new_data is not None:
                new_data.close()
            if new_backend is not None:
                new_backend.close()
            self._set_checkpointing(bool(old.activation_checkpointing), None)
            raise
        if new_data is not None:
            self._data, old_data = new_data, self._data
            old_data.close()
        if new_backend is not None:
            self._backend, old_backend = new_backend, self._backend
            old_backend.close()  # idempotent: released already under release_first
            self._state_bytes = None
            self._fresh_backend = True
            self._park_user_module()
        self._config = target
        with self._state_lock:
            if not self._pending:
                self._requested = target
            self._changes_for_next_record.update({k: _plain(getattr(target, k)) for k in changed})

    def _next_backend(self, target: TrainConfig, *, release_first: bool) -> Backend:
        """A backend for `target` carrying the current one's weights and optimizer state."""
        state = self._backend.export_state()
        # An engine trains a copy: bring its weights home first, so the new engine starts
        # from (and a failed build leaves) your module up to date.
        self._write_back(state, self._backend)
        if not (release_first and self._inner(self._backend) is not self._model):
            return self._build_backend(target, state)
        state = _state_to_cpu(state)
        self._backend.close()
        _release_device_memory(self.device)
        try:
            return self._build_backend(target, state)
        except BaseException:
            # the previous settings again, from the same state, so the session stays usable
            self._backend = self._build_backend(self._config, state)
            self._fresh_backend = True
            raise

    def _build_backend(self, config: TrainConfig, state: dict[str, Any] | None) -> Backend:
        if _needs_deepspeed(config, self.world_size):
            self._announce_op_builds(config)
        else:
            self._model.to(self.device)  # the plain loop trains your module itself
        return build_backend(
            self._backend_config(config),
            self._model,
            state=state,
            world_size=self.world_size,
            device=self.device,
        )

    def _set_checkpointing(self, enabled: bool, new_backend: Backend | None) -> None:
        """On the base model and on the module an engine trains (DeepSpeed's copy)."""
        set_activation_checkpointing(self._model, enabled)
        for backend in (self._backend, new_backend):
            if backend is not None and self._inner(backend) is not self._model:
                set_activation_checkpointing(self._inner(backend), enabled)

    # ------------------------------------------------------------------ your module's weights
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full trained weights and buffers of your module, keyed as your module's own
        `state_dict()` (its dtypes), gathered from DeepSpeed's shards when an engine trains
        it; load with `module.load_state_dict(...)` anywhere. Taken between steps (a running
        session keeps running). Under several ranks with ZeRO-3 every rank must call it."""
        if self._state != "closed":
            with self._step_lock:
                self._sync_user_module()
                return {k: v.detach().clone() for k, v in self._model.state_dict().items()}
        return {k: v.detach().clone() for k, v in self._model.state_dict().items()}

    def save_weights(self, path: str | os.PathLike[str]) -> str:
        """Write `state_dict()` (on the CPU) to `path` with `torch.save`, atomically; plain
        `torch.load(path)` (weights_only) reads it back. Returns the path."""
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValueError(f"path={path!r}: must be a file path")
        weights = {k: v.cpu() for k, v in self.state_dict().items()}
        return str(ckpt.write_atomic(weights, path))

    def _write_back(self, state: dict[str, Any], backend: Backend) -> None:
        """Copy an engine's trained weights (`state["model"]`, fp32 by parameter name) and
        its buffers into your module, in your module's own dtypes and devices. A no-op
        when the backend trains your module itself."""
        inner = self._inner(backend)
        if inner is self._model:
            return
        weights = state["model"]
        buffers = _persistent_buffers(inner)
        with torch.no_grad():
            for name, p in self._model.named_parameters():
                if name in weights:
                    p.copy_(weights[name].to(device=p.device, dtype=p.dtype))
            own = dict(self._model.named_buffers())
            for name, b in buffers.items():
                if name in own:
                    own[name].copy_(b.to(device=own[name].device, dtype=own[name].dtype))

    def _sync_user_module(self) -> None:
        """Bring the current engine's weights into your module (caller holds the step lock)."""
        if self._inner(self._backend) is not self._model:
            self._write_back(self._backend.export_state(), self._backend)

    def _park_user_module(self) -> None:
        """While a DeepSpeed engine trains its own copy, keep your module in host memory
        so the GPU does not hold a second fp32 copy of the model."""
        if self.device.type == "cuda" and self._inner(self._backend) is not self._model:
            self._model.to("cpu")

    def _announce_op_builds(self, config: TrainConfig) -> None:
        """DeepSpeed compiles some ops the first time they are used on a machine (a
        minute or two); say so before the wait, as an event and on the console."""
        if not _needs_deepspeed(config, self.world_size):
            return
        from workbench.train.toolchain import pending_op_builds, use_interpreter_tools

        use_interpreter_tools()
        pending = pending_op_builds(config)
        if pending:
            ev = self._event(
                "op-build",
                f"DeepSpeed builds its {', '.join(pending)} op(s) on first use on this machine: "
                "expect 1-3 minutes once; later engines load the cached build "
                "(~/.cache/torch_extensions)",
                "info",
                ops=pending,
            )
            log.warning("workbench: %s", ev.message)

    def _inner(self, backend: Backend) -> nn.Module:
        """The model inside `backend.module` (itself, or a DeepSpeed engine's `.module`)."""
        outer = backend.module
        if outer is self._model:
            return outer
        inner = getattr(outer, "module", None)
        return inner if isinstance(inner, nn.Module) else outer

    # ------------------------------------------------------------------ running
    def _check_open(self, action: str) -> None:
        if self._state == "closed":
            raise SessionStateError(f"cannot {action}: the session is closed")

    def _begin(self, steps: int | None, action: str) -> None:
        with self._state_lock:
            self._check_open(action)
            if self._state == "running" or self._loop_active:
                raise SessionStateError(f"cannot {action}: the session is already running")
            if steps is not None:
                if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
                    raise ValueError(f"optimizer_steps={steps!r}: must be an integer >= 1 or None")
                self._target_step = self._step + steps
            self._pause_requested = False
            self._stop_requested = False
            self._loop_active = True
            self._failure = None
            self._background = action in ("start", "resume")
            self._set_state("running")

    def run(self, optimizer_steps: int, *, progress: bool | None = None) -> list[StepRecord]:
        """Train `optimizer_steps` steps in this thread; returns their records.

        Returns early (state "paused") on `pause()` from another thread or a non-finite
        loss; raises `SessionError` (state "error") when a step raises. `progress`: a
        progress bar (tqdm) on stderr; None shows it when stderr is a terminal.
        """
        if optimizer_steps is None:
            raise ValueError("optimizer_steps=None: run() needs a number of steps >= 1")
        if progress is not None and not isinstance(progress, bool):
            raise ValueError(f"progress={progress!r}: must be True, False or None")
        start = len(self.history)
        self._begin(optimizer_steps, "run")
        with _progress_bar(self, optimizer_steps, progress):
            self._loop()
        if self._state == "error":
            raise SessionError(self._last_error or "training step failed")
        return self.records_since(start)

    def start(self, optimizer_steps: int | None = None) -> None:
        """Train in a background thread ("workbench-session-<id>"), for `optimizer_steps`
        steps or until `pause()`/`stop()`/`close()`."""
        self._begin(optimizer_steps, "start")
        if optimizer_steps is None:
            self._target_step = None
        self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=self._loop, name=f"workbench-session-{self.id}", daemon=True
        )
        self._thread = thread
        thread.start()

    def resume(self) -> None:
        """Continue a paused (or errored) run in a background thread."""
        with self._state_lock:
            self._check_open("resume")
            if self._state not in ("paused", "error"):
                raise SessionStateError(
                    f"cannot resume: the session is {self._state} (resume needs paused or error;"
                    " use start() or run())"
                )
            target = self._target_step
            if target is not None and target <= self._step:
                raise SessionStateError(
                    f"cannot resume: the run already reached its target step {target}; use "
                    "run() or start()"
                )
        self._begin(None, "resume")
        self._target_step = target
        self._spawn()

    def pause(self, wait: bool = True) -> None:
        """Pause at the next step boundary (`wait`: return once paused)."""
        with self._cond:
            self._check_open("pause")
            if self._state != "running":
                raise SessionStateError(
                    f"cannot pause: the session is {self._state} (pause needs running)"
                )
            self._pause_requested = True
            if wait and threading.get_ident() != self._loop_thread_id:
                self._cond.wait_for(lambda: not self._loop_active)

    def stop(self) -> None:
        """Stop at the next step boundary and wait for it; the run's target is dropped."""
        with self._cond:
            self._check_open("stop")
            if self._state in ("idle", "stopped"):
                return
            if self._loop_active:
                self._stop_requested = True
                if threading.get_ident() == self._loop_thread_id:
                    return
                self._cond.wait_for(lambda: not self._loop_active)
            self._target_step = None
            self._state = "stopped"
            self._cond.notify_all()
        self._join()

    def wait(self, timeout: float | None = None) -> str:
        """Block until no loop is running (or `timeout` seconds); returns the state."""
        with self._cond:
            self._cond.wait_for(lambda: not self._loop_active, timeout=timeout)
        if not self._loop_active:
            self._join()
        return self._state

    def _join(self) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None

    def close(self) -> None:
        """Stop, bring the trained weights into your module (from a DeepSpeed engine's
        shards too), then release loader workers and the backend. Idempotent."""
        if self._state == "closed":
            return
        if self._loop_active:
            self.stop()
        self._join()
        with self._step_lock:
            try:
                self._sync_user_module()
                self._model.to(self.device)
            except Exception as exc:
                ev = self._event(
                    "weights-not-synced",
                    f"close(): could not copy the trained weights into your module: "
                    f"{type(exc).__name__}: {exc}",
                    "error",
                    traceback=traceback.format_exc(),
                )
                log.error("workbench: %s", ev.message)
            self._data.close()
            self._backend.close()
            self._set_state("closed")
            _OPEN.discard(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop
    def _loop(self, after_step: Callable[[], None] | None = None) -> None:
        self._loop_thread_id = threading.get_ident()
        final = "idle"
        try:
            while True:
                with self._state_lock:
                    if self._stop_requested:
                        final = "stopped"
                        self._target_step = None
                        break
                    if self._pause_requested:
                        final = "paused"
                        break
                    if self._target_step is not None and self._step >= self._target_step:
                        self._target_step = None
                        break
                outcome = self._guarded_step()
                if outcome is not None:
                    final = outcome
                    break
                if after_step is not None:
                    after_step()
        except BaseException as exc:  # KeyboardInterrupt, or a bug in the loop itself
            self._backend.zero_grad()
            final = "paused" if isinstance(exc, KeyboardInterrupt) else "error"
            self._last_error = f"{type(exc).__name__}: {exc}"
            self._event(
                "interrupted" if final == "paused" else "error",
                f"training interrupted: {self._last_error}",
                "warning" if final == "paused" else "error",
                traceback=traceback.format_exc(),
            )
            raise
        finally:
            if final != "error" and self._pending:
                with self._step_lock:
                    self._apply_pending(raise_errors=False)
            with self._cond:
                self._loop_active = False
                self._loop_thread_id = None
                self._pause_requested = False
                self._stop_requested = False
                if self._state != "closed":  # close() from a callback in this thread
                    self._state = final
                self._version += 1
                self._cond.notify_all()

    def _guarded_step(self) -> str | None:
        """One optimizer step with fault handling; a state name when the loop must end."""
        record: StepRecord | None = None
        with self._step_lock:
            self._apply_pending(raise_errors=False)
            try:
                record = self._step_with_oom_retry()
            except _NonFiniteLoss as nf:
                record = self._nonfinite_record(nf.value)
                cfg = self._config
                ev = self._event(
                    "nan-loss",
                    f"loss is {nf.value} at step {record.step}: the step was not applied and "
                    f"the session paused. {nan_advice(cfg)}; then resume().",
                    "error",
                    step=record.step,
                    loss=nf.value,
                    precision=str(cfg.precision),
                    lr=record.lr,
                )
                self._publish(record)
                self._fail(ev.message, announce=True)
                return "paused"
            except Exception as exc:
                self._backend.zero_grad()
                self._last_error = f"{type(exc).__name__}: {exc}"
                hint = (
                    "Fix the data (it cannot be changed on a live session: build a new Session)"
                    if isinstance(exc, batches.DataContractError)
                    else "Fix the cause, then update(...) and/or resume()"
                )
                ev = self._event(
                    "error",
                    f"step {self._step + 1} failed: {self._last_error}. The step was not "
                    f"applied and its batch is skipped. {hint}.",
                    "error",
                    step=self._step + 1,
                    error=self._last_error,
                    traceback=traceback.format_exc(),
                )
                self._fail(ev.message, announce=self._background)
                return "error"
        self._publish(record)
        self._autosave()
        return None

    def _step_with_oom_retry(self) -> StepRecord:
        while True:
            fetched: list[Any] = []
            try:
                return self._optimizer_step(fetched)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                message = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            # outside the except block, so the failed step's frames (and tensors) are freed
            self._backend.zero_grad()
            self._recover_from_oom(fetched, message)

    def _recover_from_oom(self, fetched: list[Any], message: str) -> None:
        cfg = self._config
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if cfg.micro_batch <= 1 or self._user_loader:
            why = "micro_batch is 1" if cfg.micro_batch <= 1 else "data is your own DataLoader"
            raise RuntimeError(f"out of memory and cannot halve micro_batch ({why}): {message}")
        mb, ga = cfg.micro_batch, cfg.grad_accum
        new_mb, new_ga = mb // 2, ga * 2
        self._data.requeue_split(fetched, 2)
        fetched.clear()
        target = cfg.replace(micro_batch=new_mb, grad_accum=new_ga)
        self._apply_config(target, {"micro_batch", "grad_accum"}, release_first=True)
        with self._state_lock:
            self._requested = self._requested.replace(micro_batch=new_mb, grad_accum=new_ga)
        eff_old, eff_new = mb * ga, new_mb * new_ga
        kept = "unchanged" if eff_old == eff_new else f"now {eff_new}, was {eff_old}"
        self._event(
            "oom",
            f"out of memory at micro_batch={mb}: micro_batch halved to {new_mb} and grad_accum "
            f"doubled to {new_ga} (effective batch {kept}); retrying the same batch",
            "warning",
            step=self._step + 1,
            error=message,
            micro_batch=new_mb,
            grad_accum=new_ga,
        )

    def _optimizer_step(self, fetched: list[Any]) -> StepRecord:
        cfg = self._config
        backend = self._backend
        data = self._data
        loss_fn = self._loss_fn
        module = backend.module
        label = self._label
        accum = int(cfg.grad_accum)
        t0 = perf_counter()
        data_s = 0.0
        total: torch.Tensor | None = None
        for _ in range(accum):
            t = perf_counter()
            with label("workbench.data"):
                batch = data.next()
            data_s += perf_counter() - t
            fetched.append(batch)
            with label("workbench.forward"):
                loss = batches.forward_and_loss(module, batch, loss_fn, backend.autocast)
            with label("workbench.backward"):
                backend.backward(loss)
            total = loss.detach() if total is None else total + loss.detach()
        assert total is not None
        loss_value = total.item() / accum  # host waits for the device here, once per step
        if not math.isfinite(loss_value):
            backend.zero_grad()
            raise _NonFiniteLoss(loss_value)
        first = self._state_bytes is None
        if first:
            before = backend.model_state_bytes()
        with label("workbench.optimizer"):
            outcome = backend.step()
        if first:
            after = backend.model_state_bytes()
            self._state_bytes = ModelStateBytes(
                before.params_bytes, before.grads_bytes, after.optimizer_bytes
            )
        self._sync_device()  # host waits for the device here, so step_s is the step's time
        step_s = perf_counter() - t0
        return self._make_record(cfg, loss_value, outcome, step_s, data_s)

    def _make_record(
        self, cfg: TrainConfig, loss: float, outcome: Any, step_s: float, data_s: float
    ) -> StepRecord:
        samples = cfg.micro_batch * cfg.grad_accum * self.world_size
        tokens = self.info.tokens_per_sample if self.info is not None else None
        alloc, max_alloc, reserved, rss = self._device_memory()
        sample = self._sampler.latest() if self._sampler is not None else None
        gpu = sample.gpu(self._gpu_uuid) if sample is not None else None
        sb = self._state_bytes
        warmup, self._fresh_backend = self._fresh_backend, False
        with self._state_lock:
            changes, self._changes_for_next_record = self._changes_for_next_record, {}
        return StepRecord(
            step=self._step + 1,
            micro_steps=int(cfg.grad_accum),
            loss=loss,
            samples_per_s=samples / step_s if step_s > 0 else 0.0,
            tokens_per_s=samples * tokens / step_s if tokens and step_s > 0 else None,
            step_seconds=step_s,
            data_seconds=data_s,
            compute_seconds=step_s - data_s,
            lr=float(outcome.lr),
            grad_norm=outcome.grad_norm,
            scale=outcome.scale,
            skipped=bool(outcome.skipped),
            precision=str(cfg.precision),
            micro_batch=int(cfg.micro_batch),
            grad_accum=int(cfg.grad_accum),
            zero_stage=int(cfg.zero_stage),
            world_size=self.world_size,
            rank=self.rank,
            clip_grad_norm=cfg.clip_grad_norm,
            activation_checkpointing=bool(cfg.activation_checkpointing),
            num_workers=int(cfg.num_workers),
            changes=changes,
            warmup=warmup,
            params_bytes=sb.params_bytes if sb else None,
            grads_bytes=sb.grads_bytes if sb else None,
            optimizer_bytes=sb.optimizer_bytes if sb else None,
            cuda_allocated_bytes=alloc,
            cuda_max_allocated_bytes=max_alloc,
            cuda_reserved_bytes=reserved,
            rss_bytes=rss,
            gpu_util_percent=gpu.util_percent if gpu is not None else None,
            gpu_memory_used_bytes=gpu.memory_used_bytes if gpu is not None else None,
            cpu_util_percent=sample.cpu_util_percent if sample is not None else None,
        )

    def _fail(self, message: str, *, announce: bool) -> None:
        """Remember why the run ended; say it on the console when nobody is waiting on
        the call (a background run), since `events` is not where users look first."""
        self._failure = message
        if announce:
            log.warning("workbench session %s: %s", self.id, message)

    def _nonfinite_record(self, loss: float) -> StepRecord:
        cfg = self._config
        lr = float(getattr(self._backend, "lr", scaled_lr(cfg, self.reference_batch)))
        outcome = StepOutcome(grad_norm=None, skipped=True, scale=None, lr=lr)
        return self._make_record(cfg, loss, outcome, 0.0, 0.0)

    def _publish(self, record: StepRecord) -> None:
        with self._state_lock:
            self.history.append(record)
            self._step = record.step
            self._version += 1
            callbacks = list(self._callbacks)
        for cb in callbacks:
            try:
                cb(record)
            except Exception as exc:
                self._event(
                    "callback-error", f"on_record callback {cb!r} raised {exc!r}", "warning"
                )

    # ------------------------------------------------------------------ checkpoints
    def _autosave(self) -> None:
        cfg = self._config
        if cfg.checkpoint_dir is None:
            return
        every, seconds = cfg.checkpoint_every_steps, cfg.checkpoint_every_seconds
        due = bool(every and self._step % every == 0) or bool(
            seconds and time.time() - self._last_save_time >= seconds
        )
        if due:
            try:
                self.save_checkpoint()
            except Exception as exc:
                self._event("checkpoint-failed", f"autosave failed: {exc}", "warning")

    def save_checkpoint(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write a checkpoint at the current step boundary; returns its path.

        `path`: a file name (used as is), a directory (`step-N.pt` in it, then only the
        newest `keep_checkpoints` kept), or None for `config.checkpoint_dir`.
        """
        self._check_open("save_checkpoint")
        with self._step_lock:
            self._apply_pending(raise_errors=False)
            cfg = self._config
            if path is None:
                if cfg.checkpoint_dir is None:
                    raise ValueError(
                        "path=None: pass a file or directory, or set checkpoint_dir in the config"
                    )
                path = cfg.checkpoint_dir
            p = Path(path)
            directory = p if (p.is_dir() or p.suffix == "") else None
            target = directory / ckpt.checkpoint_name(self._step) if directory else p
            payload = {
                "format": ckpt.CHECKPOINT_FORMAT,
                "step": self._step,
                "config": cfg.to_dict(),
                "backend": self._backend.export_state(),
                "buffers": _persistent_buffers(self.model),
                "rng": ckpt.rng_state(),
                "data": vars(self._data.position),
                "reference_batch": self.reference_batch,
                "model": {"name": self.model_name, "options": self.model_options},
                "history": [r.to_dict() for r in self.history],
            }
            written = ckpt.write_atomic(payload, target)
            if directory is not None:
                ckpt.prune(directory, int(cfg.keep_checkpoints))
            self._last_save_time = time.time()
        self._event("checkpoint", f"saved checkpoint {written}", path=str(written))
        return str(written)

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
        **config_changes: Any,
    ) -> Session:
        """A new Session continuing the checkpoint (a file, or the newest in a directory).

        Built-in models are rebuilt from the checkpoint; for your own module pass `model`
        (same architecture), `data` and `loss_fn`. `config_changes` override the saved
        settings.
        """
        payload = ckpt.load(path_or_dir)
        config = TrainConfig.from_dict(payload["config"])
        if config_changes:
            config = config.replace(**config_changes)
        saved = payload.get("model") or {}
        options = None
        if model is None:
            if not saved.get("name"):
                raise ValueError(
                    "model=None: the checkpoint holds a user module; pass model= (a module of "
                    "the same architecture), data= and loss_fn="
                )
            model, options = saved["name"], saved.get("options") or None
        elif isinstance(model, str) and model == saved.get("name"):
            options = saved.get("options") or None
        return cls(
            config,
            model=model,
            data=data,
            loss_fn=loss_fn,
            sampler=sampler,
            device=device,
            model_options=options,
            resume=payload["path"],
        )

    def _load_buffers(self, buffers: dict[str, torch.Tensor]) -> None:
        own = dict(self._model.named_buffers())
        with torch.no_grad():
            for name, value in buffers.items():
                if name in own:
                    own[name].copy_(value)

    # ------------------------------------------------------------------ tools
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
        from workbench.train import memory as mem

        self._check_open("measure memory")
        with self._between_steps():
            self._apply_pending(raise_errors=False)
            cfg = self._config
            batch = self._data.peek()
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            measure, states = mem.probe(self._backend, self._loss_fn, batch, model=self.model)
            cuda_peak = (
                torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
            )
            counters = mem.step_counter_bytes(getattr(self._backend, "optimizer", None))
            notes: list[str] = []
            if states.optimizer_bytes == 0 and cfg.optimizer != "sgd-nomomentum":
                notes.append("optimizer states are created at the first optimizer step; run one")
            n_params = count_parameters(self.model)  # ZeRO-3 shards at their full size
            predicted = None
            try:
                predicted = self.predict(cfg)
            except Exception as exc:  # the estimator rejects the inputs or is missing
                notes.append(f"no prediction: {type(exc).__name__}: {exc}")
            if predicted is not None and predicted.activation_bytes is None:
                notes.append(NO_ACTIVATION_PREDICTION)
            return mem.MemoryReport(
                params_bytes=states.params_bytes,
                grads_bytes=states.grads_bytes,
                optimizer_bytes=states.optimizer_bytes,
                optimizer_step_counter_bytes=counters,
                activation_bytes=measure.activation_bytes,
                parameter_saved_bytes=measure.parameter_saved_bytes,
                activation_bytes_by_dtype=measure.by_dtype,
                micro_batch=int(cfg.micro_batch),
                precision=str(cfg.precision),
                optimizer=str(cfg.optimizer),
                activation_checkpointing=bool(cfg.activation_checkpointing),
                world_size=self.world_size,
                n_params=n_params,
                cuda_max_allocated_bytes=cuda_peak,
                peak_rss_bytes=mem.peak_rss_bytes() if self.device.type == "cpu" else None,
                predicted=predicted,
                notes=tuple(notes),
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
        it and resumed after. Returns `workbench.train.profiler.ProfileResult`."""
        from workbench.train.profiler import profile_session

        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            raise ValueError(f"steps={steps!r}: must be an integer >= 1")
        if not isinstance(record_memory, bool):
            raise ValueError(f"record_memory={record_memory!r}: must be True or False")
        self._check_open("profile")
        was_running = self._state == "running"
        if was_running:
            self.pause()
        try:
            return profile_session(
                self, steps=steps, record_memory=record_memory, trace_path=trace_path
            )
        finally:
            if was_running and self._state == "paused":
                self.resume()

    def _run_with_hook(self, steps: int, after_step: Callable[[], None]) -> None:
        """Run `steps` steps in this thread calling `after_step()` after each (profiler).
        A paused session stays paused with its run's target afterwards."""
        previous_target = self._target_step
        was_paused = self._state == "paused"
        self._begin(steps, "profile")
        try:
            self._loop(after_step)
        finally:
            with self._cond:
                if was_paused and self._state == "idle":
                    self._target_step = previous_target
                    self._state = "paused"
                    self._cond.notify_all()
        if self._state == "error":
            raise SessionError(self._last_error or "training step failed")

    def launch(self, ranks: int, steps: int, **kwargs: Any) -> Any:
        """Run this config on `ranks` processes (DeepSpeed launcher); see
        `workbench.train.launch.launch_ranks`. Needs a built-in model."""
        if self.model_name is None:
            raise ValueError(
                "model: multi-rank launch needs a built-in model name (tiny-gpt, mlp, cnn) or an "
                "importable factory 'pkg.module:function'; this session trains your own module"
            )
        try:
            from workbench.train.launch import launch_ranks  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ValueError(f"ranks={ranks!r}: multi-rank launch is not available: {exc}") from exc

        kwargs.setdefault("model_options", dict(self.model_options) or None)
        return launch_ranks(self._config, ranks=ranks, model=self.model_name, steps=steps, **kwargs)


@contextlib.contextmanager
def _progress_bar(session: Session, total: int, show: bool | None) -> Iterator[None]:
    """A tqdm bar fed by the session's records while `run()` trains in this thread."""
    import sys

    if show is None:
        show = sys.stderr.isatty()
    if not show:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit="step", desc=f"session {session.id}", leave=True)

    def advance(record: StepRecord) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{record.loss:.4g}", refresh=False)

    remove = session.on_record(advance)
    try:
        yield
    finally:
        remove()
        bar.close()


def _state_to_cpu(state: Any) -> Any:
    """A backend state with every tensor copied to host memory."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _state_to_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_state_to_cpu(v) for v in state)
    return state


def _release_device_memory(device: torch.device) -> None:
    """Free what a closed engine left in the CUDA caching allocator."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def nan_advice(config: TrainConfig) -> str:
    """What to try after a non-finite loss, for this precision."""
    precision = Precision(config.precision)
    if precision in (Precision.AMP_FP16, Precision.FP16):
        bf16 = "amp-bf16" if precision is Precision.AMP_FP16 else "bf16"
        return (
            f"{precision.value} overflows above 65504: lower loss_scale_init, or use "
            f"precision={bf16!r} (fp32's exponent range) where the hardware has bf16; a lower "
            "lr or clip_grad_norm also helps"
        )
    clip = (
        "set clip_grad_norm (e.g. 1.0)"
        if config.clip_grad_norm is None
        else f"lower clip_grad_norm (now {config.clip_grad_norm:g})"
    )
    return (
        f"in {precision.value} this is divergence, not overflow: lower lr (now "
        f"{float(config.lr):g}), {clip}, and check the data for NaN/inf values"
    )


def _needs_deepspeed(config: TrainConfig, world_size: int) -> bool:
    return bool(config.uses_deepspeed) or world_size > 1


def _persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    names = {name for name, _ in model.named_buffers()}
    return {k: v.detach() for k, v in model.state_dict().items() if k in names}
