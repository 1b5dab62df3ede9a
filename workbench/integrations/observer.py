"""`Observer`: a run the workbench does not own, recorded as the same `StepRecord` stream a
Session publishes, next to the prediction for that run's own settings.

    with workbench.observe(model, optimizer, micro_batch=8) as obs:   # a hand-written loop
        for batch in loader:
            loss = ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
            obs.step(loss)                       # one optimizer step done
    workbench.dashboard(obs)                     # charts, advisor, monitor, estimator

A trainer's callback (`workbench.integrations.hf`, `.lightning`) drives the same Observer
from its hooks. Per optimizer step the record holds the loss (mean over its micro-batches),
learning rate, samples (and tokens) per second, the step time split into the wait for data
(where the trainer shows it) and compute, the gradient norm and loss scale where known, and
the memory measured: CUDA's allocated / peak / reserved bytes each step (one read of the
allocator's statistics; the peak is the process's since its last reset, which the observer
leaves to your trainer unless `reset_peak=True`) or the process RSS (at most every
`RSS_SECONDS`),
the parameters', gradients' and optimizer states' bytes counted from the tensors on the
first steps and every `STATE_EVERY` steps after (they keep their sizes). `predict()` is the
estimator's figure for the trainer's settings (`config`, a TrainConfig read from the
trainer's arguments, shown read-only); `advice()` is the advisor's, each message naming the
argument of *your* trainer to change (`arg_names`).

On the hot path a trainer's callback (`end_step`) keeps what the step's record needs and
never waits for the device: the records are made when they are read (a dashboard's
refresh, `records()`), or once `FLUSH_EVERY` steps are pending, their losses, norms and
loss scales (copied into the observer's device slots each step) read in one host-device
copy. A CPU tensor's value is read at once instead: it is ready when its op returns, and
in a training loop a read costs half what the copy does. A hand-written loop's `obs.step(loss)` returns
its record, so it reads the loss then. The gradient norm, the costly part on a model of
many small tensors, is taken every step while it costs under 0.1% of the step
(`grad_norm="auto"`). benchmarks/observe.py measures the cost against the same trainer
without the callback.

Past 700 lines because the hot path is one object's: the hooks (`batch_start`,
`end_step`) keep their state in the Observer's own attributes, written out in one body
each, and the records are made from that state at the flush. What a step's values are
(the gradient-norm schedule, the device slots, a tensor's value, a batch's size) lives in
`workbench.integrations.step_values`.
"""

from __future__ import annotations

import collections
import contextlib
import math
import numbers
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.inputs import shown
from workbench.integrations.step_values import (
    COLUMNS,
    LOSS,
    NORM,
    ON_DEVICE,
    SCALE,
    StepSlots,
    batch_size,
    device_of,
    grad_norm_every,
    norm_interval,
    number,
    real_value,
    world,
)
from workbench.integrations.step_values import (
    NORM_BUDGET as NORM_BUDGET,
)
from workbench.train.backends.base import storage_bytes
from workbench.train.history import History
from workbench.train.records import Event, StepRecord
from workbench.train.runtime import memory_reader

#: Model-state bytes are counted on the first steps and then every this many steps (they
#: keep their sizes; counting a model's optimizer states takes about a millisecond).
STATE_EVERY = 500

#: The most steps whose records wait to be made (`end_step`): a trainer's callback makes
#: its records when they are read (`records()`, a dashboard's refresh), their losses read
#: from the device in one copy, or once this many steps are pending (a bounded memory).
FLUSH_EVERY = 1024

#: A CPU run's RSS is read at most this often (seconds; reading /proc costs 5-40 us, a
#: percent of a millisecond step); CUDA's counters every step.
RSS_SECONDS = 0.25

#: What a hand-written loop's observer says when a step came without a loss (a trainer's
#: callback says how to expose the loss to it: `Observer(no_loss_note=...)`).
LOOP_NO_LOSS = (
    "obs.step() was given no loss: pass it, obs.step(loss) (or obs.micro_batch(batch, loss) "
    "per micro-batch)"
)


class Observer:
    """The records of a run you train yourself (see the module docstring).

    `config`: the run's settings as a TrainConfig (what the prediction and the advisor
    read; default `TrainConfig()` with `micro_batch` and `grad_accum` given), `trainer`:
    "loop", "transformers" or "lightning", `arg_names`: a setting's name in your trainer
    (`{"grad_accum": "gradient_accumulation_steps="}`) or a mapping from its value to
    the argument (`{"precision": {"amp-bf16": "bf16=True"}}`), `read_from`: which of your
    trainer's settings `config` was read from (shown), `notes`: what was assumed.
    `grad_norm`: when the observer takes the gradients' total norm (a record without it
    has `grad_norm=None`): True every step, False never, k every k-th step, "auto" (the
    default) every step while it costs the host under `NORM_BUDGET` (0.1%) of the step,
    else every k-th step with the smallest k that keeps it there (a model of many small
    tensors whose steps take milliseconds: 30 gradients' norm is about 50 us on a CPU).
    `norm_every` says the interval in use. A step whose loss the observer was not given
    is recorded with `loss=None` (unknown: not NaN, so no advice on it), and the first such
    step adds a note (`notes`) and a "loss-unknown" event (`events`) saying why and how to
    expose the loss: `no_loss_note` (a trainer's callback names its own way; default: pass
    it to `step()`). `reset_peak=True` resets CUDA's peak at each step's end, so a record's
    peak is its own step's; off by default, as that reset clobbers the peak your trainer
    reports (the Trainer's memory metrics, Lightning's device stats)."""

    def __init__(
        self,
        model: nn.Module | None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        config: TrainConfig | None = None,
        trainer: str = "loop",
        arg_names: Mapping[str, Any] | None = None,
        read_from: Mapping[str, Any] | None = None,
        notes: list[str] | None = None,
        grad_norm: bool | int | str = "auto",
        no_loss_note: str | None = None,
        reset_peak: bool = False,
    ) -> None:
        self._norm_every = grad_norm_every(grad_norm)
        self._reset_peak = reset_peak
        if no_loss_note is not None and not isinstance(no_loss_note, str):
            raise ValueError(
                f"no_loss_note={shown(no_loss_note)}: must be a string or None (what to say "
                "when a step's loss cannot be read)"
            )
        if not isinstance(reset_peak, bool):
            raise ValueError(f"reset_peak={shown(reset_peak)}: must be True or False")
        self.no_loss_note = no_loss_note or LOOP_NO_LOSS
        self._loss_noted = False  # the first step without a loss is said (notes, events)
        self.trainer = trainer
        self.arg_names = dict(arg_names or {})
        self.want_grad_norm = self._norm_every != 0
        # "auto": the norm's host seconds (the last measured) and the steps apart it is
        # taken; 1 until measured
        self._norm_s = 0.0
        self._norm_step = 1
        # the steps whose gradients are read next: their norm, the model states' bytes
        self._next_norm = 1
        self._next_states = 1
        # whether the next optimizer step needs the gradients (their norm, the states'
        # bytes): a callback calls `before_optimizer_step` only then
        self.grads_due = True
        self._history = History()
        # steps ended whose records are not made yet (`end_step`), and steps ended in all
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._steps = 0
        self.events: list[Event] = []
        self._version = 0  # attachments, flushes and replacements so far
        self.world_size, self.rank = world()
        self._lock = threading.Lock()
        self._closed = False
        self._last_end: float | None = None
        self._begin: float | None = None
        self._data_s = 0.0
        # this step's losses: the sum of those given as numbers and how many, how many
        # were added into its row of the device slots; its gradient norm (a number, or
        # ON_DEVICE: in its row)
        self._loss_sum, self._loss_n, self._loss_dev = 0.0, 0, 0
        self._slots: StepSlots | None = None
        # a CPU tensor's value is read at once (it is ready); True: copied into the slots
        # too, as another device's are (what the tests of the slots set)
        self._slots_on_cpu = False
        self._row = 0  # this step's row of the slots (rows are reused FLUSH_EVERY steps on)
        self._samples = 0
        self._tokens = 0
        self._norm: float | object | None = None
        self._summed = False
        self._step_lr: float | None = None
        self._states: tuple[int | None, int | None, int | None] = (None, None, None)
        self.model: nn.Module | None = None
        self.config = TrainConfig()
        self.read_from: dict[str, Any] = {}
        self.notes: list[str] = []
        if model is not None:
            self.attach(model, optimizer, config=config, read_from=read_from, notes=notes)
        elif optimizer is not None or config is not None:
            raise ValueError("model=None: an optimizer or config needs the model they train")

    def attach(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        config: TrainConfig | None = None,
        read_from: Mapping[str, Any] | None = None,
        notes: list[str] | None = None,
    ) -> None:
        """The model (and optimizer, settings) this observer records: a trainer callback
        attaches them when its run starts, so a dashboard of `callback.observer` can be
        shown before `trainer.train()`. Records already taken stay."""
        if not isinstance(model, nn.Module):
            raise ValueError(f"model={shown(model)}: must be a torch.nn.Module")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                f"optimizer={shown(optimizer)}: must be a torch.optim.Optimizer or None"
            )
        if config is not None and not isinstance(config, TrainConfig):
            raise ValueError(f"config={shown(config)}: must be a workbench.TrainConfig or None")
        self.model = model
        self.optimizer = optimizer
        self.config = config or TrainConfig()
        self.read_from = dict(read_from or {})
        self.notes = list(notes or [])
        self._loss_noted = False
        self.device = device_of(model)
        self._cuda = self.device.type == "cuda"
        self._params: list[nn.Parameter] | None = None
        self._batch: Any = None  # the first micro-batch seen: its sequence length
        self._description: Any = None
        self._read_memory = memory_reader(self.device)
        # wall-clock time = perf_counter() + this (a step's end read once, on one clock)
        self._wall_offset = time.time() - time.perf_counter()
        self._memory_at = -math.inf
        self._last_memory: tuple[int | None, ...] = (None, None, None, None)
        cfg = self.config
        # the record fields a run's settings fix, made once
        self._fixed: dict[str, Any] = {
            "precision": str(cfg.precision),
            "micro_batch": int(cfg.micro_batch),
            "grad_accum": int(cfg.grad_accum),
            "zero_stage": int(cfg.zero_stage),
            "fsdp": str(getattr(cfg.fsdp, "value", cfg.fsdp)),
            "world_size": self.world_size,
            "rank": self.rank,
            "clip_grad_norm": cfg.clip_grad_norm,
            "activation_checkpointing": str(cfg.activation_checkpointing),
            "num_workers": int(cfg.num_workers),
            "gpu_util_percent": None,
            "gpu_memory_used_bytes": None,
            "cpu_util_percent": None,
            "loss_parts": None,
        }
        if self.device.type == "cuda" and self._reset_peak:
            torch.cuda.reset_peak_memory_stats(self.device)
        with self._lock:
            self._version += 1

    @property
    def version(self) -> int:
        """Changes with every step ended (its record may still be pending), attachment and
        replaced record: a panel redraws when it changed since its last look."""
        return self._version + self._steps

    @property
    def attached(self) -> bool:
        """True once a model is attached (a callback's run has started)."""
        return self.model is not None

    # ------------------------------------------------------------------ the Session's reads
    @property
    def state(self) -> str:
        return "closed" if self._closed else "running"

    @property
    def history(self) -> History:
        """The records, the pending steps' made first (`flush`)."""
        self.flush()
        return self._history

    def records_since(self, index: int) -> list[StepRecord]:
        """Records published after the first `index` (a panel's cursor), as a Session's."""
        self.flush()
        with self._lock:
            return self._history.since(index)

    def records(self) -> list[StepRecord]:
        self.flush()
        with self._lock:
            return list(self._history)

    # ------------------------------------------------------------------ the hooks
    def begin_step(self) -> None:
        """The first micro-batch of an optimizer step is in hand: the time since the last
        step ended was the wait for data (and the trainer's own work between steps)."""
        self.batch_start(None, True)

    def batch_start(self, batch: Any, first: bool) -> None:
        """A micro-batch is in hand (`first`: the first of its optimizer step): as
        `begin_step()` when `first`, then `micro_batch(batch)`. The step's beginning is
        written out here: a trainer's callback calls this every micro-batch, when the step
        has left the host's caches cold and each call costs a microsecond or more."""
        if first:
            now = time.perf_counter()
            if self._last_end is not None:
                self._data_s += now - self._last_end
            self._begin = now
            try:  # the lr this step uses (a scheduler moved it already)
                lr = self.optimizer.param_groups[0]["lr"]  # type: ignore[union-attr]
            except (AttributeError, IndexError, KeyError):  # no optimizer, group or lr
                lr = math.nan
            self._step_lr = lr if type(lr) is float else self._lr()
        if batch is not None:
            self._count(batch)

    def _count(self, batch: Any) -> None:
        """A micro-batch's samples and tokens into the step's; the first batch kept (its
        sequence length, for the prediction)."""
        kind = type(batch)
        ids = batch[0] if (kind is tuple or kind is list) and batch else batch
        if type(ids) is torch.Tensor and ids.dim() and self._batch is not None:
            shape = ids.shape  # the common layouts (a tensor, a tuple's first), checked cheaply
            self._samples += shape[0]
            if len(shape) == 2 and not ids.is_floating_point():
                self._tokens += shape[0] * shape[1]
            return
        samples, tokens = batch_size(batch)
        self._samples += samples
        self._tokens += tokens
        if self._batch is None:
            self._batch = batch

    def micro_batch(
        self, batch: Any = None, loss: torch.Tensor | float | None = None, *, summed: bool = False
    ) -> None:
        """One micro-batch of the step: its batch (samples and tokens counted from it)
        and/or its loss (a CPU tensor's value read now, another device's copied into the
        observer's device slots until the step's record is made). `summed`: the loss is
        this micro-batch's share of the step's (normalised by the step's token count, as
        a transformers model given `num_items_in_batch` returns it), so the step's loss is
        the sum of the shares, not their mean."""
        if summed:
            self._summed = True
        if loss is not None:  # first: a loss it refuses leaves the batch uncounted
            self._add_loss(loss)
        if batch is not None:
            self._count(batch)

    def _add_loss(self, loss: torch.Tensor | float) -> None:
        """A micro-batch's loss into this step's: a CPU tensor's value read now, another
        device's added into the step's row of the device slots (no tensor of the trainer's
        is kept, nothing waits for the device), a number into its sum."""
        if type(loss) is torch.Tensor and loss.is_cpu and not self._slots_on_cpu:
            # the common case first, in one call: a trainer's step runs it every micro-batch
            self._loss_sum += loss.item() if loss.numel() == 1 else number(loss)
            self._loss_n += 1
            return
        if isinstance(loss, torch.Tensor):
            if (self._slots_on_cpu or not loss.is_cpu) and self._put(
                LOSS, loss, add=self._loss_dev > 0
            ):
                self._loss_dev += 1
                return
            loss = number(loss)
        elif not isinstance(loss, numbers.Real) or isinstance(loss, bool):
            raise ValueError(f"loss={shown(loss)}: must be a tensor, a real number or None")
        self._loss_sum += float(loss)
        self._loss_n += 1

    def _put(self, column: int, value: torch.Tensor, add: bool = False) -> bool:
        """`value` into this step's row of the slots; False for a tensor they cannot take
        (a DTensor, another subclass): the caller keeps its number instead."""
        if type(value) is not torch.Tensor:  # a DTensor or another subclass
            return False
        slots = self._slots
        try:
            if slots is None:
                slots = self._slots = StepSlots(value.device, FLUSH_EVERY)
            slots.put(self._row, column, value, add)
        except (RuntimeError, TypeError, NotImplementedError):
            return False
        return True

    def _value(self, column: int, value: torch.Tensor) -> float | object:
        """A step's tensor value (its gradient norm, loss scale): read now on a CPU (the
        value is computed when the op returns: a read waits for nothing and costs a step
        less than a copy), else copied into the step's row of the slots (`ON_DEVICE`), or
        read now where they cannot take it."""
        if (self._slots_on_cpu or not value.is_cpu) and self._put(column, value):
            return ON_DEVICE
        return number(value, COLUMNS[column])

    def before_optimizer_step(
        self, optimizer: torch.optim.Optimizer | None = None, *, grad_scale: Any = None
    ) -> None:
        """The gradients are ready: their total norm (on the device, read with the loss at
        the step's end) when the observer computes it, and the model states' bytes on the
        first steps. `grad_scale`: the loss scale the gradients still carry (fp16 before
        the scaler's `unscale_`; a tensor or number), divided out of the norm."""
        if optimizer is not None:
            self.optimizer = optimizer
        if self.model is None:
            return
        params = self._params if self._params is not None else self._list_params()
        self._step_lr = self._lr()  # before the scheduler moves it
        step = self._steps + 1
        norm = self.want_grad_norm and step >= self._next_norm
        states = step >= self._next_states
        if not (norm or states):
            return
        start = time.perf_counter()
        grads = [p.grad for p in params if p.grad is not None]
        if norm and grads:
            total = _total_norm(grads, self._one_kind)
            self._norm = self._value(NORM, total if grad_scale is None else total / grad_scale)
            self._norm_s = time.perf_counter() - start  # the listing included
        if states:
            self._states = (storage_bytes(self._params), storage_bytes(grads), None)

    @property
    def norm_every(self) -> int:
        """The steps apart the gradient norm is taken now (0: never; "auto" adapts it to
        the measured cost of the norm and of the step)."""
        if self._norm_every is not None:
            return self._norm_every
        return self._norm_step

    def _list_params(self) -> list[nn.Parameter]:
        """The module's parameters, listed once (about 100 us), and whether one foreach
        kernel takes their gradients' norm (one device and dtype): checked once, not each
        step (comparing 30 devices costs as much as the norm on a tiny model)."""
        assert self.model is not None
        self._params = list(self.model.parameters())
        kinds = {(p.device, p.dtype) for p in self._params if p.requires_grad}
        self._one_kind = len(kinds) == 1 and self.device.type in ("cpu", "cuda")
        return self._params

    def step(
        self,
        loss: torch.Tensor | float | None = None,
        *,
        samples: int | None = None,
        tokens: int | None = None,
        lr: float | None = None,
        grad_norm: float | None = None,
        scale: float | torch.Tensor | None = None,
        skipped: bool = False,
        batch: Any = None,
    ) -> StepRecord:
        """One optimizer step ended: publish its record (and those of steps still pending)
        and return it. `loss` (this step's, or the last micro-batch's when `micro_batch()`
        was not called), `samples`/`tokens` (default: counted from the batches given, else
        the config's micro_batch x grad_accum), `lr` (default: the optimizer's first
        group's), `grad_norm` and `scale` when your trainer knows them."""
        self.end_step(
            loss, samples=samples, tokens=tokens, lr=lr, grad_norm=grad_norm, scale=scale,
            skipped=skipped, batch=batch,
        )  # fmt: skip
        self.flush()
        record: StepRecord = self._history[-1]
        return record

    def end_step(
        self,
        loss: torch.Tensor | float | None = None,
        *,
        samples: int | None = None,
        tokens: int | None = None,
        lr: float | None = None,
        grad_norm: float | None = None,
        scale: float | torch.Tensor | None = None,
        skipped: bool = False,
        batch: Any = None,
        summed: bool = False,
    ) -> None:
        """As `step()`, but the record is made later, at the next read (`records()`,
        `history`, a dashboard's refresh) or once `FLUSH_EVERY` steps are pending: the
        trainer's callbacks end their steps so, and the host reads the device values of
        the pending steps (losses, norms, loss scales) at once, not every step."""
        now = time.perf_counter()
        if self._closed or self.model is None:
            if self._closed:
                raise RuntimeError("observer: closed; create a new one with workbench.observe()")
            raise RuntimeError("observer: no model attached yet (Observer.attach)")
        # written out in one body: a trainer's callback calls this every step, when the
        # step has left the host's caches cold and each call costs a microsecond or more.
        # The values checked first (a callback gives none of them): a refused one ends
        # no step and changes nothing, and no record fails when it is made
        if samples is not None or tokens is not None or lr is not None or grad_norm is not None:
            samples, tokens, lr, grad_norm = self._checked(samples, tokens, lr, grad_norm)
        kept_scale: object = scale
        if isinstance(scale, torch.Tensor):  # a GradScaler's, updated in place: this
            kept_scale = self._value(SCALE, scale)  # step's value, kept now
        elif scale is not None:
            kept_scale = real_value("scale", scale)
        if loss is not None:
            self._add_loss(loss)
            if summed:
                self._summed = True
        if batch is not None:
            self._count(batch)
        self._steps = step = self._steps + 1
        if step >= self._next_states:  # the model states' bytes: the first steps, then
            self._count_optimizer_states(step)  # every STATE_EVERY
        if self._cuda or now - self._memory_at >= RSS_SECONDS:
            self._last_memory = self._read_memory()
            self._memory_at = now
        start = self._last_end
        if start is None:
            start = self._begin
        # what the record needs, as it is now; the record itself is made at the flush
        # (a deque: appended here while a dashboard's thread may be flushing it)
        self._pending.append(
            (
                step,
                self._row,
                self._loss_sum,
                self._loss_n,
                self._loss_dev,
                self._summed,
                self._norm if grad_norm is None else grad_norm,
                kept_scale,
                now,
                start,
                self._data_s,
                self._samples if samples is None else samples,
                self._tokens if tokens is None else tokens,
                (self._step_lr if self._step_lr is not None else self._lr()) if lr is None else lr,
                skipped,
                self._states,
                self._last_memory,
            )
        )
        self._loss_sum, self._loss_n, self._loss_dev = 0.0, 0, 0
        self._row = (self._row + 1) % FLUSH_EVERY
        self._samples, self._tokens, self._norm = 0, 0, None
        self._summed, self._step_lr, self._data_s = False, None, 0.0
        if step >= self._next_norm:
            self._next_norm = self._norm_after(step, now - start if start is not None else 0.0)
        self.grads_due = step + 1 >= self._next_states or (
            self.want_grad_norm and step + 1 >= self._next_norm
        )
        if len(self._pending) >= FLUSH_EVERY:
            self.flush()
            now = time.perf_counter()
        self._last_end = now
        if self._cuda and self._reset_peak:
            torch.cuda.reset_peak_memory_stats(self.device)

    def _checked(self, samples: Any, tokens: Any, lr: Any, grad_norm: Any) -> tuple[Any, ...]:
        """`end_step`'s values given by the caller, checked (a ValueError names the first
        refused): counts are integers >= 0, the others real numbers or one-value tensors
        (the gradient norm's kept as the step's other device values, the lr's read now)."""
        for name, value in (("samples", samples), ("tokens", tokens)):
            if value is not None and (
                not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0
            ):
                raise ValueError(f"{name}={shown(value)}: must be an integer >= 0 or None")
        if lr is not None:
            lr = real_value("lr", lr)
            lr = number(lr, "lr") if isinstance(lr, torch.Tensor) else lr
        if grad_norm is not None:
            grad_norm = real_value("grad_norm", grad_norm)
            if isinstance(grad_norm, torch.Tensor):
                grad_norm = self._value(NORM, grad_norm)
        return samples, tokens, lr, grad_norm

    def _count_optimizer_states(self, step: int) -> None:
        """The optimizer states' bytes at `step` (the parameters' and gradients' were
        counted before its optimizer step), and the next step they are counted at."""
        self._next_states = step + 1 if step < 2 else (step // STATE_EVERY + 1) * STATE_EVERY
        states = self._states
        if states[0] is not None:
            self._states = (states[0], states[1], self._optimizer_bytes())

    def _norm_after(self, step: int, step_s: float) -> int:
        """The step whose gradient norm is taken after the one at `step`: each k-th step
        for a fixed `grad_norm=k`; for "auto", `norm_interval` steps on, from the norm's
        measured cost and this step's time (the first step includes the trainer's
        start-up: the second is taken too, and the cost measured at every norm taken)."""
        if self._norm_every:
            return (step // self._norm_every + 1) * self._norm_every
        if self._norm_s and step > 1:
            self._norm_step = norm_interval(self._norm_s, step_s)
        self._norm_s = 0.0
        return step + self._norm_step

    def _optimizer_bytes(self) -> int | None:
        if self.optimizer is None:
            return None
        return storage_bytes(
            v for st in self.optimizer.state.values() for v in st.values()
            if isinstance(v, torch.Tensor)
        )  # fmt: skip

    def flush(self) -> None:
        """Make the records of the pending steps: their device values read in one go."""
        queue = self._pending
        with self._lock:
            n = len(queue)  # the steps ended so far (the trainer's thread may end more)
            if not n:
                return
            # the device values of every pending step in one copy (one wait)
            rows = self._slots.read() if self._slots is not None else []
            for _ in range(n):
                self._history.append(self._record(queue.popleft(), rows))
            self._version += 1

    def _record(self, entry: tuple[Any, ...], rows: list[list[float]]) -> StepRecord:
        """The StepRecord of a pending step; `rows`: the device slots' values on the host."""
        (step, row, total, count, on_device, summed, norm, scale, end, start, data_s, n, t,
         lr, skipped, states, mem) = entry  # fmt: skip
        if on_device:
            total += rows[row][LOSS]
            count += on_device
        # no loss given: unknown (None), not a NaN a rule would read as divergence
        loss = None if not count else total if summed else total / count
        if loss is None and not self._loss_noted:
            self._note_no_loss(step)
        if norm is ON_DEVICE:
            norm = rows[row][NORM]
        if scale is ON_DEVICE:
            scale = rows[row][SCALE]
        step_s = end - start if start is not None else 0.0
        data_s = min(data_s, step_s)
        n = n or self._config_samples()
        fields = {
            **self._fixed,
            "step": step,
            "micro_steps": count or self._fixed["grad_accum"],
            "loss": None if loss is None else float(loss),
            "samples_per_s": n / step_s if step_s > 0 else 0.0,
            "tokens_per_s": t / step_s if t and step_s > 0 else None,
            "step_seconds": step_s,
            "data_seconds": data_s,
            "compute_seconds": step_s - data_s,
            "lr": float(lr),
            "grad_norm": float(norm) if norm is not None else None,
            "scale": float(scale) if scale is not None else None,
            "skipped": bool(skipped),
            "changes": {},
            "warmup": step == 1,
            "params_bytes": states[0],
            "grads_bytes": states[1],
            "optimizer_bytes": states[2],
            "cuda_allocated_bytes": mem[0],
            "cuda_max_allocated_bytes": mem[1],
            "cuda_reserved_bytes": mem[2],
            "rss_bytes": mem[3],
            # the wall-clock time of the step's end, from the monotonic clock read then
            "wall_time": self._wall_offset + end,
        }
        return StepRecord.from_fields(fields)

    def _note_no_loss(self, step: int) -> None:
        """Say once (a note, an event) that the loss is unknown from `step`, and why."""
        self._loss_noted = True
        message = (
            f"loss unknown from step {step}: {self.no_loss_note}. The records' loss is None "
            "and the advisor says nothing about it"
        )
        self.notes.append(message)
        self.events.append(Event("loss-unknown", message, step, severity="warning"))

    def fill_loss(self, loss: float) -> None:
        """The last ended step's loss as the trainer logged it after the step, where the
        observer was given none (a step with its own loss keeps it); what was said about
        that step's unknown loss is taken back."""
        if not isinstance(loss, numbers.Real) or isinstance(loss, bool):
            raise ValueError(
                f"loss={shown(loss)}: must be a number (the step's loss as the trainer logged it)"
            )
        with self._lock:
            if self._pending:  # not made yet: the step's entry takes the loss as given
                entry = self._pending[-1]
                if not (entry[3] or entry[4]):  # no loss as a number, none on the device
                    self._pending[-1] = (*entry[:2], float(loss), 1, 0, False, *entry[6:])
                return
            if not self._history.total or self._history[-1].loss is not None:
                return
            step = self._history[-1].step
        self.replace_last(loss=float(loss))
        said = self.events[-1] if self.events else None
        if said is not None and said.kind == "loss-unknown" and said.step == step:
            # said for this step only (a dashboard made its record before the trainer logged)
            self.notes.remove(self.events.pop().message)
            self._loss_noted = False

    def replace_last(self, **values: Any) -> None:
        """Fill in what the trainer tells after the step (its logged grad norm)."""
        import dataclasses

        self.flush()
        with self._lock:
            if not self._history.total:
                return
            last = self._history[-1]
            self._history.replace_last(dataclasses.replace(last, **values))
            self._version += 1

    def _lr(self) -> float:
        try:
            lr = self.optimizer.param_groups[0]["lr"]  # type: ignore[union-attr]
        except (AttributeError, IndexError, KeyError):  # no optimizer, group or lr
            return math.nan
        if type(lr) is float:
            return lr
        return float(lr.item() if isinstance(lr, torch.Tensor) else lr)

    def _config_samples(self) -> int:
        return int(self.config.micro_batch) * int(self.config.grad_accum)

    # ------------------------------------------------------------------ predicted, advised
    def description(self) -> Any:
        """The model as the prediction reads it: a `transformers` model's shape at the
        batches' sequence length, else its parameter count."""
        if self.model is None:
            raise ValueError("observer: no model yet (a callback attaches it when training starts)")
        if self._description is None:
            from workbench.modelstats import count_parameters
            from workbench.train.session_tools import module_description

            description: Any = count_parameters(self.model)
            if callable(getattr(getattr(self.model, "config", None), "to_dict", None)):
                description = module_description(self.model, self._batch) or description
            self._description = description
        return self._description

    def utilisation(self, gpu: str | None = None) -> Any:
        """The watched run's measured MFU and HFU on `gpu` (`Session.utilisation`)."""
        from workbench.train.measure.utilisation import measured_utilisation
        from workbench.train.session_tools import flop_inputs

        return measured_utilisation(self, gpu=gpu, **flop_inputs(self.description()))

    def predict(self, config: TrainConfig | None = None) -> Any:
        """The estimator's figure for this run's settings (or `config`'s), from
        `workbench.predict_memory`; raises ValueError when it cannot predict them."""
        from workbench.prediction import predict_memory

        device = self.device.type if self.model is not None else None
        return predict_memory(
            config or self.config, self.description(), self.world_size, device=device
        )

    def advice(self, samples: Any = None) -> list[Any]:
        """The advisor's advice on the records (and `samples` of a `Sampler`), plus the
        memory technique that frees the most of the predicted peak; each message ends with
        the argument of your trainer to change, and none applies by itself (`apply` is
        kept in `evidence["workbench_change"]`)."""
        import dataclasses

        from workbench.advisor import advise
        from workbench.train.measure.memory_advice import memory_advice

        found = advise(self.records()[-500:], samples=samples, config=self.config)
        with contextlib.suppress(ValueError):
            where = self.device if self.model is not None else None
            found += memory_advice(self.config, self.description(), self.world_size, device=where)
        out = []
        for a in found:
            change = a.apply or {}
            message = a.message
            if change:
                message += f" → in your {self.trainer_name}: {self.say(change)}"
            evidence = {**(a.evidence or {}), "workbench_change": dict(change)}
            out.append(dataclasses.replace(a, message=message, apply=None, evidence=evidence))
        return out

    @property
    def trainer_name(self) -> str:
        return {
            "transformers": "TrainingArguments",
            "lightning": "Lightning Trainer",
        }.get(self.trainer, "loop")

    def say(self, change: Mapping[str, Any]) -> str:
        """A settings change in your trainer's words (`arg_names`), the workbench's
        names where your trainer has none."""
        parts = []
        for name, value in change.items():
            plain = getattr(value, "value", value)
            named = self.arg_names.get(name)
            if isinstance(named, Mapping):
                parts.append(str(named.get(plain, f"{name}={fmt_value(plain)}")))
            elif isinstance(named, str):
                parts.append(f"{named}{fmt_value(plain)}")
            else:
                parts.append(f"{name}={fmt_value(plain)} (the workbench's name)")
        return ", ".join(parts)

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        self.flush()
        self._closed = True

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Observer({self.trainer}, {self.history.total} steps, "
            f"{self.config.precision}, micro-batch {self.config.micro_batch})"
        )


@contextlib.contextmanager
def observe(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    micro_batch: int | None = None,
    grad_accum: int = 1,
    config: TrainConfig | None = None,
    grad_norm: bool | int | str = "auto",
    reset_peak: bool = False,
) -> Iterator[Observer]:
    """Observe a hand-written loop: call `obs.step(loss)` after each optimizer step
    (`obs.begin_step()` when a step's first batch is in hand, to split off the data wait;
    `obs.micro_batch(batch, loss)` per micro-batch under accumulation; otherwise the
    gradient norm is read from the gradients left when `step()` runs, before
    `zero_grad()`). `micro_batch` / `grad_accum` (or a whole `config`) describe the run
    for the prediction; `reset_peak`: as `Observer`'s."""
    if config is None:
        settings: dict[str, Any] = {"grad_accum": grad_accum}
        if micro_batch is not None:
            settings["micro_batch"] = micro_batch
        config = TrainConfig(**settings)
    obs = _LoopObserver(model, optimizer, config=config, grad_norm=grad_norm, reset_peak=reset_peak)
    try:
        yield obs
    finally:
        obs.close()


class _LoopObserver(Observer):
    """A hand-written loop's observer: when no `before_optimizer_step()` came, the
    gradients left when `step()` runs (before your `zero_grad()`) are read there."""

    def before_optimizer_step(
        self, optimizer: torch.optim.Optimizer | None = None, *, grad_scale: Any = None
    ) -> None:
        self._prepared = True
        super().before_optimizer_step(optimizer, grad_scale=grad_scale)

    def step(self, loss: torch.Tensor | float | None = None, **kwargs: Any) -> StepRecord:
        if self._params is None and self.model is not None:
            self._list_params()
        if (
            not getattr(self, "_prepared", False)
            and self._params is not None
            and any(p.grad is not None for p in self._params)
        ):
            super().before_optimizer_step()
        self._prepared = False
        return super().step(loss, **kwargs)


def _total_norm(grads: list[torch.Tensor], one_kind: bool) -> torch.Tensor:
    """The total 2-norm of `grads` on the device: one foreach kernel when they share a
    device and dtype (`one_kind`, as the Session's plain loop computes it), torch's
    grouping else."""
    if one_kind:
        norms = torch.stack(torch._foreach_norm(grads, 2.0))
        total: torch.Tensor = torch.linalg.vector_norm(norms, 2.0)
        return total
    norm: torch.Tensor = torch.nn.utils.get_total_norm(grads)
    return norm


def fmt_value(v: Any) -> str:
    """A setting's value as an argument writes it (floats without trailing zeros, text
    quoted)."""
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, str):
        return repr(v)
    return str(v)
