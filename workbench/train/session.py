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
anything fails to build, nothing changes and an Event("change-failed") says why (changes
queued while it built stay queued, or are named there if they needed it). When no
loop is running, the change is applied before `update` returns (and a failure raises); a
Ctrl-C in that build leaves the session as before the call, one in the loop's leaves the
change queued.
The first StepRecord after a change carries `changes={...}`.

Faults: a non-finite loss skips the step and pauses (Event "nan-loss"); out of memory
halves micro_batch and doubles grad_accum (same effective batch) and retries the same
samples (Event "oom"; a micro_batch / grad_accum change queued meanwhile applies after it,
unless its micro_batch would run out of memory too: Event "change-refused"); any other exception moves to "error" (Event "error" with the
traceback) and the session can be `update`d and `resume`d; the weights and optimizer
state are those before the failed step, whose micro-batches are not retried (a batch
that always fails would otherwise block `resume`).

LR scaling: `lr_scaling` scales `lr` by the effective batch relative to the one the
session started with (see `workbench.train.schedule`).

This file is the Session's public surface, its setup in named steps and its state machine
(the loop thread, which fault moves it to which state, events). The pieces it drives live
beside it, one concept each (docs/architecture.md lists them): `runtime.py`, `changes.py`,
`step.py` and `session_step.py` (one step, its out-of-memory retry and its record),
`faults.py`, `resume.py` and `run_folders.py` (the run's folders and checkpoints),
`session_log.py`, `session_tools.py` (its memory, predict, profile and launch methods, its
weights file and `resume_from`), `session_saves.py` (`save_checkpoint` and the autosave). Past 700 lines because the public methods, each documented
for `help()`, and the state machine they drive share one lock and one set of states.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench.config import ConfigError, Device, Documents, SettingProblem, TrainConfig
from workbench.inputs import is_int, shown
from workbench.models.spec import resolve_model
from workbench.rng import GLOBAL_RNG_LOCK
from workbench.train import checkpoints as ckpt
from workbench.train import owners
from workbench.train.backends import Backend
from workbench.train.changes import (
    ChangeQueue,
    check_sampler,
    checked_config,
    session_problems,
)
from workbench.train.data import DataPosition
from workbench.train.devices import cuda_uuid, resolve_device
from workbench.train.history import History, Recent
from workbench.train.progress import progress_bar
from workbench.train.records import Event, StepRecord
from workbench.train.resume import (
    check_checkpoint_arg,
    check_resumed_weights,
    resumed_records,
)
from workbench.train.run_folders import RunFolders
from workbench.train.runlog import LOG_NAME
from workbench.train.runtime import RngStream, Runtime
from workbench.train.schedule import scaled_lr
from workbench.train.session_log import SessionLog, tensorboard_setting
from workbench.train.session_saves import SessionSaves
from workbench.train.session_step import SessionStep
from workbench.train.session_tools import SessionTools
from workbench.train.step import (
    Label,
    NonFiniteLoss,
    is_oom,
    nan_advice,
)
from workbench.train.world import world_from_env

__all__ = ["STATES", "Session", "SessionError", "SessionStateError", "is_oom", "nan_advice"]

STATES = ("idle", "running", "paused", "stopped", "error", "closed")

#: The most optimizer steps one `run` / `start` asks for: TrainConfig's step bound.
MAX_RUN_STEPS = 10**12

#: Failures of a background run are also logged here (stderr by default), so they show
#: in the notebook cell or console the user is looking at, not only in `events`.
log = logging.getLogger("workbench")


class SessionError(RuntimeError):
    """A training step failed; the session is in state "error" (see `events`)."""


class SessionStateError(RuntimeError):
    """A call that the session's current state does not allow."""


class Session(SessionTools, SessionSaves):
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
    takes CUDA when available). `resume`: a checkpoint file or directory to continue from
    (or the payload `workbench.train.checkpoints.load` returned for one).
    `tensorboard`: True writes TensorBoard scalars to `<checkpoint_dir>/tensorboard`, a
    path writes them there (needs `pip install 'workbench[tensorboard]'`).

    Records and logs: `history` keeps the newest steps at full resolution and older ones
    thinned, in bounded memory (`workbench.train.history`); with a run folder
    (`config.checkpoint_dir`) every record and event also goes to `<folder>/log.jsonl`,
    written off the training thread (`workbench.train.runlog`), and a resumed session's
    history starts with the newest records of that log.

    Your module's weights: the plain loop trains your module itself; a DeepSpeed engine
    (ZeRO, DeepSpeed 16-bit, several ranks) trains its own copy, and your module gets the
    trained weights back, in its own dtypes, at every engine switch and at `close()` (or,
    on one rank, when a session dropped without `close()` is garbage-collected).
    `state_dict()` and `save_weights(path)` give the full weights at any time.

    Reproducibility: each session draws its random numbers (dropout's) from its own
    stream, seeded with `config.seed` (`torch.manual_seed`'s stream) and put into torch's
    global generators only around its steps, so two sessions in one process train what
    each trains alone and your notebook's torch RNG is left as it was
    (`workbench.train.runtime.RngStream`). Built-in models draw their weights and data
    from `config.seed` too, and the data order is a function of (seed, epoch). A resumed
    session continues the stream saved in the checkpoint instead.
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
        resume: str | os.PathLike[str] | dict[str, Any] | None = None,
        tensorboard: bool | str | os.PathLike[str] = False,
    ) -> None:
        config = checked_config(config)
        check_checkpoint_arg("resume", resume, payload_too=True)
        tensorboard = tensorboard_setting(tensorboard, config)
        payload = self._setup_run(config, device, resume)
        config, module, data, loss_fn = self._setup_model(
            config, model, data, loss_fn, model_options, sampler
        )
        if payload is not None:  # before the module's old Session is closed
            check_resumed_weights(module, payload, model=model, model_options=self.model_options)
        self._setup_state(config, tensorboard)
        self._setup_runtime(config, module, data, loss_fn, payload)

    # ------------------------------------------------------------------ setup, in order
    def _setup_run(
        self,
        config: TrainConfig,
        device: str | torch.device | None,
        resume: str | os.PathLike[str] | dict[str, Any] | None,
    ) -> dict[str, Any] | None:
        """Where this session runs (id, rank, world size, device) and the run it saves as
        (new, or `resume`'s), its folder claimed before anything is written; the payload."""
        self.id = uuid.uuid4().hex[:8]
        self.world_size, self.rank = world_from_env()
        self.device = resolve_device(device, Device(config.device).value)
        payload = resume if isinstance(resume, dict) or resume is None else ckpt.load(resume)
        self._folders = RunFolders(payload)
        self.run_id = self._folders.run_id
        if config.checkpoint_dir is not None:
            start = int(payload["step"]) if payload is not None else 0
            self._folders.claim_checkpoint_dir(
                config.checkpoint_dir, start, self.world_size, self.rank
            )
        return payload

    def _setup_model(
        self,
        config: TrainConfig,
        model: str | nn.Module,
        data: Dataset[Any] | DataLoader[Any] | None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None,
        model_options: dict[str, Any] | None,
        sampler: Any | None,
    ) -> tuple[TrainConfig, nn.Module, Any, Any]:
        """The module, data and loss (`resolve_model`), this session's from now on, and
        `config` (a DataLoader's batch size as micro_batch) checked against them."""
        check_sampler(sampler)
        made = resolve_model(
            model,
            data=data,
            loss_fn=loss_fn,
            model_options=model_options,
            seed=int(config.seed),
            documents=Documents(config.documents).value,
        )
        module, data, loss_fn = made.module, made.data, made.loss_fn
        self.info: Any | None = made.info
        self.model_name: str | None = made.name
        self.model_options: dict[str, Any] = made.options
        if (
            isinstance(data, DataLoader)
            and data.batch_size
            and data.batch_size != config.micro_batch
        ):
            config = config.replace(micro_batch=int(data.batch_size))
        self._model: nn.Module = module
        self._data_source = data
        self._sampler = sampler
        problems = self._problems(config, set())
        if problems:
            raise ConfigError(problems)
        return config, module, data, loss_fn

    def _setup_state(self, config: TrainConfig, tensorboard: Any) -> None:
        """The state machine's fields (idle, step 0), the history and events, the run's
        log writer and the learning rate's reference batch."""
        self._state_lock = threading.RLock()
        self._cond = threading.Condition(self._state_lock)
        self._step_lock = threading.RLock()
        self._state = "idle"
        self._config = config
        self._changes = ChangeQueue(config, self._state_lock)
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
        # the monitor's samples are matched to this GPU by UUID (None on CPU: the first GPU)
        self._gpu_uuid = cuda_uuid(self.device)
        self.history: History = History()
        self.events: Recent = Recent()
        # the log holds this session weakly: the finalizer holds the log (`owners.when_dropped`)
        self._runlog = SessionLog(self.id, tensorboard, self._state_lock, owners.is_closed(self))
        self._version = 0
        self._callbacks: list[Callable[[StepRecord], None]] = []
        self._folders.last_save_time = time.time()
        self.reference_batch = config.effective_batch_size(self.world_size)
        # Phase labels of the loop: no-ops, `record_function` while the profiler runs.
        self._label: Label = contextlib.nullcontext

    def _setup_runtime(
        self,
        config: TrainConfig,
        module: nn.Module,
        data: Any,
        loss_fn: Any,
        payload: dict[str, Any] | None,
    ) -> None:
        """The data stream and backend `config` is built into (`Runtime`), from `payload`'s
        step, state, data position, history and RNG stream when resuming."""
        position = state = buffers = None
        if payload is not None:
            self._step = int(payload["step"])
            self.reference_batch = int(payload.get("reference_batch") or self.reference_batch)
            position = DataPosition(**payload["data"]) if payload.get("data") else None
            state = payload["backend"]
            buffers = payload.get("buffers") or {}
            self.history = History(resumed_records(payload))
        try:
            self._rt = Runtime(
                config,
                module,
                data,
                loss_fn,
                device=self.device,
                world_size=self.world_size,
                rank=self.rank,
                reference_batch=self.reference_batch,
                on_event=owners.weak_method(self._event),  # the runtime keeps no session alive
                state=state,
                position=position,
                buffers=buffers,
                # a re-run cell's old Session on this module is closed once this one checked
                # everything it can before changing the module
                claim=lambda: owners.take_over(module),
            )
        except BaseException:
            self._runlog.close()
            raise
        self._stepper = SessionStep(
            self._rt,
            self._changes,
            sampler=self._sampler,
            info=self.info,
            world_size=self.world_size,
            rank=self.rank,
            device=self.device,
            gpu_uuid=self._gpu_uuid,
            config=lambda: self._config,
            steps_done=lambda: self._step,
            label=lambda: self._label,
            apply=self._apply,
            event=self._event,
        )
        owners.register(module, self)
        self._finalizer = owners.when_dropped(self, self._rt, self._runlog)  # close() detaches it
        if payload is not None:  # the checkpoint's RNG stream, in place of the seeded one
            rng = payload["rng"]
            self._rt.rng = RngStream.made_by(lambda: ckpt.set_rng_state(rng), self.device)
            self._event("resumed", f"resumed from {payload['path']} at step {self._step}")

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> TrainConfig:
        """The settings in effect (queued changes are in `pending_changes`)."""
        return self._config

    @property
    def model(self) -> nn.Module:
        """The module being trained now: your module, or the engine's working copy (under
        DeepSpeed 16-bit, flattened, partitioned under ZeRO-3; under FSDP sharded; under
        precision "bf16-true" cast to bf16). Your own module gets the trained weights back,
        in its own dtypes, at every engine switch and at `close()`; `state_dict()` gives the
        full weights at any time. After `close()` this is your module."""
        if self._state == "closed":
            return self._model
        return self._rt.trained_module

    @property
    def gpu_uuid(self) -> str | None:
        """NVML's UUID of the GPU this session trains on (None on CPU): the monitor's
        samples and the advisor read this GPU."""
        return self._gpu_uuid

    @property
    def failure(self) -> str | None:
        """Why the last run ended early (a non-finite loss, an exception in a step, a
        KeyboardInterrupt), or None. Cleared when a run starts."""
        return self._failure

    @property
    def pending_changes(self) -> dict[str, Any]:
        """Changes `update` queued for the next step boundary (setting -> value)."""
        return self._changes.pending()

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
        """The engine now training: a PlainBackend, or a DeepSpeedBackend."""
        return self._rt.backend

    @property
    def data(self) -> Any:
        """The Dataset or DataLoader this session trains on (as given, or the built-in's)."""
        return self._data_source

    @property
    def data_position(self) -> DataPosition:
        """Where the next batch comes from: (epoch, samples read in it) for a Dataset,
        (epoch, batches) for your DataLoader."""
        return self._rt.data.position

    @property
    def lr(self) -> float:
        """Learning rate after `lr_scaling` (before the schedule)."""
        return scaled_lr(self._config, self.reference_batch, self.world_size)

    def records_since(self, index: int) -> list[StepRecord]:
        """Records published after the first `index` (a cursor: `history.total` is the
        count so far), copied under the lock (safe from any thread). On a long run the
        oldest are thinned (`workbench.train.history`); the run's log has them all."""
        with self._state_lock:
            return self.history.since(index)

    def events_since(self, index: int) -> list[Event]:
        """Events after the first `index` (a cursor: `events.total` is the count so far)."""
        with self._state_lock:
            return self.events.since(index)

    @property
    def log_path(self) -> str | None:
        """The run's JSON-lines log (`<checkpoint_dir>/log.jsonl`), None without a run
        folder; `workbench.train.runlog.read_records(path)` reads every step back."""
        folder = self._config.checkpoint_dir
        return None if folder is None else str(Path(folder) / LOG_NAME)

    def flush_log(self) -> None:
        """Wait until every record and event so far is in the run's log (and TensorBoard)."""
        self._runlog.flush()

    def on_record(self, callback: Callable[[StepRecord], None]) -> Callable[[], None]:
        """Call `callback(record)` in the training thread after each step; returns a
        function that unsubscribes. Exceptions in callbacks become warning events."""
        if not callable(callback):
            raise ValueError(f"callback={shown(callback)}: must be callable(record)")
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

    # ------------------------------------------------------------------ checks
    def _problems(self, config: TrainConfig, changed: set[str]) -> list[SettingProblem]:
        """What this session (device, ranks, model, data) cannot run of `config`; a new
        `checkpoint_dir` holding another run's checkpoints or log is one (before the log
        moves there)."""
        problems = session_problems(
            config,
            changed,
            model=self._model,
            device=self.device,
            world_size=self.world_size,
            data=self._data_source,
        )
        if "checkpoint_dir" in changed and config.checkpoint_dir is not None:
            problems += self._folders.checkpoint_dir_problems(
                config.checkpoint_dir, self._step, self.world_size, self.rank
            )
        return problems

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
        self._log(ev)
        return ev

    def _log(self, item: StepRecord | Event) -> None:
        """Hand a record or event to the run's log writer (a queue put, nothing more)."""
        self._runlog.put(item, self._config.checkpoint_dir)

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
            before = self._changes.request(changes, self._problems)
            apply_now = not self._loop_active
        if apply_now:
            with self._step_lock:
                try:
                    self._apply_pending(raise_errors=True)
                except Exception:
                    raise
                except BaseException:  # KeyboardInterrupt in the build: as before the call
                    self._changes.withdraw(set(changes), before, self._config)
                    raise

    def _apply_pending(self, *, raise_errors: bool) -> None:
        """Apply queued changes (caller holds the step lock); see `ChangeQueue.apply`."""
        self._changes.apply(
            self._config,
            self._apply,
            first_step=self._step + 1,
            event=self._event,
            raise_errors=raise_errors,
            problems=self._problems,
        )

    def _apply(
        self, target: TrainConfig, changed: set[str], *, release_first: bool = False
    ) -> None:
        """Rebuild what `changed` needs (`Runtime.rebuild`), then take `target` as the
        settings in effect; on any failure nothing changes and the exception propagates."""
        self._rt.rebuild(target, changed, release_first=release_first)
        self._config = target
        self._changes.applied(target, changed)

    # ------------------------------------------------------------------ your module's weights
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full trained weights and buffers of your module, keyed as your module's own
        `state_dict()` (its dtypes), gathered from DeepSpeed's shards when an engine trains
        it; load with `module.load_state_dict(...)` anywhere. Taken between steps (a running
        session keeps running). Under several ranks with ZeRO-3 every rank must call it."""
        if self._state != "closed":
            with self._step_lock:
                self._rt.sync_weights()
                return {k: v.detach().clone() for k, v in self._model.state_dict().items()}
        return {k: v.detach().clone() for k, v in self._model.state_dict().items()}

    # ------------------------------------------------------------------ running
    def _check_open(self, action: str) -> None:
        if self._state == "closed":
            raise SessionStateError(f"cannot {action}: the session is closed")

    @contextlib.contextmanager
    def _between_steps(self, action: str, *, apply_pending: bool = False) -> Iterator[Runtime]:
        """For a tool (`session_tools`): the session open (SessionStateError naming
        `action` else), the step lock held and torch's RNG left as it was (a probe changes
        no training, this session's or another's in a background thread: `workbench.rng`),
        the queued changes applied first with `apply_pending`; yields the runtime."""
        self._check_open(action)
        devices = [self.device] if self.device.type == "cuda" else []
        with self._step_lock, GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=devices):
            if apply_pending:
                self._apply_pending(raise_errors=False)
            yield self._rt

    @contextlib.contextmanager
    def _interrupted(self, action: str) -> Iterator[None]:
        """A block run with the loop paused: a running session is paused for it and resumed
        after; a paused one is paused again after it, towards its run's target. From the
        loop's own thread (an `on_record` callback) SessionStateError naming `action`,
        before anything changes: the loop cannot pause under its own step."""
        if threading.get_ident() == self._loop_thread_id:
            raise SessionStateError(
                f"cannot {action} from the training loop's thread (an on_record callback): "
                f"{action} runs steps of its own; call it after the run returns, or from "
                "another thread while the session runs in the background"
            )
        was_running = self._state == "running"
        if was_running:
            self.pause()
        was_paused, target = self._state == "paused", self._target_step
        try:
            yield
        finally:
            with self._cond:
                if was_paused and self._state == "idle":  # back to the run it interrupted
                    self._target_step = target
                    self._state = "paused"
                    self._cond.notify_all()
            if was_running and self._state == "paused":
                self.resume()

    def _begin(self, steps: int | None, action: str) -> None:
        with self._state_lock:
            self._check_open(action)
            if self._state == "running" or self._loop_active:
                raise SessionStateError(f"cannot {action}: the session is already running")
            if steps is not None:
                if not is_int(steps) or steps < 1 or steps > MAX_RUN_STEPS:
                    raise ValueError(
                        f"optimizer_steps={shown(steps)}: must be an integer from 1 to 10^12 "
                        "(a longer run than any training run), or None"
                    )
                steps = int(steps)
                self._target_step = self._step + steps
            self._pause_requested = False
            self._stop_requested = False
            self._loop_active = True
            self._failure = None
            self._background = action in ("start", "resume")
            self._set_state("running")

    def run(self, optimizer_steps: int, *, progress: bool | None = None) -> list[StepRecord]:
        """Train `optimizer_steps` steps in this thread; returns their records (those the
        bounded history still keeps: all of them unless the run is longer than its
        full-resolution window; the run's log has every one).

        Returns early (state "paused") on `pause()` from another thread or a non-finite
        loss; raises `SessionError` (state "error") when a step raises. `progress`: a
        progress bar (tqdm) on stderr; None shows it when stderr is a terminal.
        """
        if optimizer_steps is None:
            raise ValueError("optimizer_steps=None: run() needs a number of steps >= 1")
        if progress is not None and not isinstance(progress, bool):
            raise ValueError(f"progress={shown(progress)}: must be True, False or None")
        start = self.history.total
        self._begin(optimizer_steps, "run")
        with progress_bar(self, optimizer_steps, progress):
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
                self._rt.close()  # your module gets the trained weights, then all is released
            except Exception as exc:
                ev = self._event(
                    "weights-not-synced",
                    f"close(): could not copy the trained weights into your module: "
                    f"{type(exc).__name__}: {exc}",
                    "error",
                    traceback=traceback.format_exc(),
                )
                log.error("workbench: %s", ev.message)
            self._set_state("closed")
            self._finalizer.detach()
            owners.closed(self)
        self._runlog.close()  # every record and event written

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        self._loop_thread_id = threading.get_ident()
        final = "idle"
        interrupted = False
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
        except BaseException as exc:  # KeyboardInterrupt, or a bug in the loop itself
            interrupted = True
            self._rt.backend.zero_grad()
            final = "paused" if isinstance(exc, KeyboardInterrupt) else "error"
            self._last_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            message = f"training interrupted after step {self._step}: {self._last_error}"
            if final == "paused":
                message += "; the session paused (resume() or run() goes on)"
            ev = self._event(
                "interrupted" if final == "paused" else "error",
                message,
                "warning" if final == "paused" else "error",
                traceback=traceback.format_exc(),
            )
            self._fail(ev.message, announce=self._background and final == "error")
            raise
        finally:
            # queued changes applied before the loop ends (after Ctrl-C they stay queued)
            if final != "error" and not interrupted and self._changes:
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

    # ------------------------------------------------------------------ one step, with its faults
    def _guarded_step(self) -> str | None:
        """One optimizer step with fault handling; a state name when the loop must end."""
        record: StepRecord | None = None
        skipped: str | None = None  # why a non-finite loss ends the run
        # the callbacks get the record after the step released its locks (a callback may
        # wait for another session, whose steps need the RNG lock)
        with self._step_lock, self._rng_installed():
            if self._changes:  # queued changes (read without the lock: seen next step at worst)
                self._apply_pending(raise_errors=False)
            try:
                record = self._stepper.take()
            except NonFiniteLoss as nf:
                record = self._stepper.nonfinite_record(nf.value)
                skipped = self._stepper.nan_event(nf.value, record).message
            except Exception as exc:
                self._rt.backend.zero_grad()
                self._last_error = f"{type(exc).__name__}: {exc}"
                ev = self._stepper.error_event(exc, self._last_error)
                self._fail(ev.message, announce=self._background)
                return "error"
        self._publish(record)
        if skipped is not None:
            self._fail(skipped, announce=True)
            return "paused"
        self._autosave()
        return None

    def _rng_installed(self) -> contextlib.AbstractContextManager[None]:
        """This session's own RNG stream in torch's global generators for a block (what a
        step or a checkpoint's RNG states read; `workbench.train.runtime.RngStream`)."""
        return self._rt.rng.installed()

    def _fail(self, message: str, *, announce: bool) -> None:
        """Remember why the run ended; say it on the console when nobody is waiting on
        the call (a background run), since `events` is not where users look first."""
        self._failure = message
        if announce:
            log.warning("workbench session %s: %s", self.id, message)

    def _publish(self, record: StepRecord) -> None:
        with self._state_lock:
            self.history.append(record)
            self._step = record.step
            self._version += 1
            callbacks = list(self._callbacks)
        self._log(record)
        for cb in callbacks:
            try:
                cb(record)
            except Exception as exc:
                self._event(
                    "callback-error",
                    f"on_record callback {shown(cb)} raised {shown(exc)}",
                    "warning",
                )
