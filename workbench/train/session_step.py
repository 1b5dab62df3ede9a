"""One optimizer step of a Session's loop and its record: the step measured
(`workbench.train.step.optimizer_step`), a step out of memory retried on the same samples
at half the micro-batch and twice the accumulation (`faults.halved_for_oom`, the same
effective batch; Event "oom"; a batch-shape change queued meanwhile is kept or refused by
`ChangeQueue.after_oom`), and the `StepRecord` of a step, or of one skipped for a
non-finite loss, with the settings, memory and monitor sample of that moment.

`SessionStep` belongs to one Session and reads it only through the callables it is
given (the settings in effect, the steps done, the loop's phase labels) and changes it
only through the two it is handed (apply a settings change, record an event); the
state machine around a step (locks, faults that end the run, publishing) stays in
`workbench.train.session`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch

from workbench.config import TrainConfig
from workbench.train import faults
from workbench.train.backends import StepOutcome
from workbench.train.batches import DataContractError
from workbench.train.records import Event, StepRecord
from workbench.train.runtime import Runtime
from workbench.train.step import (
    Label,
    RecordMaker,
    StepMeasure,
    is_oom,
    nan_advice,
    optimizer_step,
)


class SessionStep:
    """Steps of one Session's runtime `rt` and their records (see the module docstring)."""

    def __init__(
        self,
        rt: Runtime,
        changes: Any,
        *,
        sampler: Any | None,
        info: Any | None,
        world_size: int,
        rank: int,
        device: torch.device,
        gpu_uuid: str | None,
        config: Callable[[], TrainConfig],
        steps_done: Callable[[], int],
        label: Callable[[], Label],
        apply: Callable[..., None],
        event: Callable[..., Event],
    ) -> None:
        self._rt = rt
        self._changes = changes
        self._sampler = sampler
        self._tokens_per_sample = info.tokens_per_sample if info is not None else None
        self._world_size, self._rank = world_size, rank
        self._device = device
        self._gpu_uuid = gpu_uuid
        self._config, self._steps_done, self._label = config, steps_done, label
        self._apply, self._event = apply, event
        self._records = RecordMaker()

    def take(self) -> StepRecord:
        """One optimizer step and its record; out of memory, the same samples again at
        half the micro-batch, until it fits (`faults.halved_for_oom` refuses past one)."""
        while True:
            fetched: list[Any] = []
            try:
                return self.record(optimizer_step(self._rt, fetched, self._label()))
            except Exception as exc:
                if not is_oom(exc):
                    raise
                message = faults.first_line(str(exc)) or type(exc).__name__
            # outside the except block, so the failed step's frames (and tensors) are freed
            self._rt.backend.zero_grad()
            self._recover_from_oom(fetched, message)

    def _recover_from_oom(self, fetched: list[Any], message: str) -> None:
        """Retry the same samples at half the micro-batch (`faults.halved_for_oom`)."""
        cfg = self._config()
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        target = faults.halved_for_oom(cfg, user_loader=self._rt.user_loader, message=message)
        self._rt.data.requeue_split(fetched, 2)
        fetched.clear()
        self._apply(target, {"micro_batch", "grad_accum"}, release_first=True)
        queue = self._changes.after_oom(cfg, target)  # a change queued meanwhile: kept or refused
        kept = {k: v for k, v in queue.queued.items() if k not in queue.refused}
        step = self._steps_done() + 1
        self._event(
            "oom",
            faults.oom_message(cfg, target) + faults.oom_queued_text(kept, queue.asked, target),
            "warning",
            step=step,
            error=message,
            micro_batch=target.micro_batch,
            grad_accum=target.grad_accum,
        )
        if queue.refused:
            self._event(
                "change-refused",
                faults.oom_refused_message(queue.refused, queue.why, target),
                "warning",
                step=step,
                changes=queue.refused,
                error=queue.why,
            )

    def record(self, measure: StepMeasure) -> StepRecord:
        """The record of the step just measured (the next step number)."""
        rt = self._rt
        sample = self._sampler.latest() if self._sampler is not None else None
        warmup, rt.fresh = rt.fresh, False
        changes = self._changes.for_record()
        return self._records.make(
            step=self._steps_done() + 1,
            config=self._config(),
            measure=measure,
            world_size=self._world_size,
            rank=self._rank,
            tokens_per_sample=self._tokens_per_sample,
            memory=rt.read_memory(),
            state_bytes=rt.state_bytes,
            warmup=warmup,
            changes=changes,
            zero_stage=rt.backend.zero_stage,
            gpu=sample.gpu(self._gpu_uuid) if sample is not None else None,
            cpu_util_percent=sample.cpu_util_percent if sample is not None else None,
        )

    def nonfinite_record(self, loss: float) -> StepRecord:
        """The record of a step skipped for the non-finite `loss`."""
        lr = float(self._rt.backend.lr)
        outcome = StepOutcome(grad_norm=None, skipped=True, scale=None, lr=lr)
        return self.record(StepMeasure(loss, outcome, 0.0, 0.0))

    def nan_event(self, loss: float, record: StepRecord) -> Event:
        """Say (Event "nan-loss") that the step of `record` was skipped for the non-finite
        `loss`, with what to change (`step.nan_advice`)."""
        cfg = self._config()
        return self._event(
            "nan-loss",
            faults.nan_message(loss, record.step, nan_advice(cfg)),
            "error",
            step=record.step,
            loss=loss,
            precision=str(cfg.precision),
            lr=record.lr,
        )

    def error_event(self, exc: Exception, error: str) -> Event:
        """Say (Event "error", with the traceback: call it while handling `exc`) that the
        next step raised `exc` (`error`: its type and message)."""
        step = self._steps_done() + 1
        return self._event(
            "error",
            faults.failure_message(step, error, data_contract=isinstance(exc, DataContractError)),
            "error",
            step=step,
            error=error,
            traceback=traceback.format_exc(),
        )
