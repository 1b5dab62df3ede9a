"""One optimizer step: `grad_accum` micro-batches through the data contract, their
backward passes, then the optimizer step; timed, and turned into a `StepRecord`.

The loop has no mode checks: the backend was built for the settings (precision, ZeRO
stage) and the phase labels are no-ops unless the profiler asks for them. The host waits
for the device once per step, in `read_device_values`, the one place the step turns device
values into numbers: the summed loss and, where the backend prepares it before the
optimizer step (`prepare_step()`, the plain backend without loss scaling), the gradient
norm, read together, so a non-finite step is skipped before the optimizer touches the
weights. The step's time comes from `step_clock` (CUDA events read a step late, no sync of
their own). docs/step_cost.md says what each part of a step costs and which settings add
syncs of their own (a loss scaler's checks, the DeepSpeed and FSDP engines' norms;
bitsandbytes' 8-bit optimizers sync after every parameter they step, once more when paged).
The CUDA peak statistic is reset as the step starts, so each record's peak is its own
step's. A step that fails leaves the weights and optimizer state as they were; the Session
turns the failure into an event (`NonFiniteLoss`, out of memory, any other exception).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch

from workbench.config import Precision, TrainConfig
from workbench.inputs import shown
from workbench.train import batches
from workbench.train.backends import ModelStateBytes, StepOutcome
from workbench.train.records import StepRecord

Label = Callable[[str], AbstractContextManager[Any]]


class NonFiniteLoss(Exception):
    """The mean loss of a step was NaN or infinite; nothing was applied."""

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


def nan_advice(config: TrainConfig) -> str:
    """What to try after a non-finite loss, for this precision."""
    precision = Precision(config.precision)
    if precision in (Precision.AMP_FP16, Precision.FP16):
        bf16 = "amp-bf16" if precision is Precision.AMP_FP16 else "bf16"
        return (
            f"{precision.value}: an activation overflowed above 65504 in the forward (the loss "
            "scale never reaches the forward, so loss_scale_init does not fix it): use "
            f"precision={shown(bf16)} (fp32's exponent range) where the hardware has bf16, or "
            "lower lr or set clip_grad_norm so the weights stop growing"
        )
    clip = (
        "set clip_grad_norm (e.g. 1.0)"
        if config.clip_grad_norm is None
        else f"lower clip_grad_norm (now {config.clip_grad_norm:g})"
    )
    fp32_weights = (
        ", or use precision='amp-bf16' (fp32 weights, bf16 compute)"
        if precision is Precision.BF16_TRUE
        else ""
    )
    return (
        f"in {precision.value} this is divergence, not overflow: lower lr (now "
        f"{float(config.lr):g}), {clip}, and check the data for NaN/inf values{fp32_weights}"
    )


@dataclass(frozen=True)
class StepMeasure:
    """What one optimizer step measured."""

    loss: float  # mean over the micro-batches
    outcome: StepOutcome
    step_seconds: float
    data_seconds: float
    loss_parts: dict[str, float] | None = None  # from a loss_fn with take_parts()


def read_device_values(
    loss_sum: torch.Tensor, grad_norm: torch.Tensor | None
) -> tuple[float, float | None]:
    """The step's one read of device values: (summed loss, gradient norm or None), copied
    to the host together. On CUDA the host waits for the device here, once per step."""
    if grad_norm is None:
        return loss_sum.item(), None  # host waits for the device here
    both = torch.stack((loss_sum.float(), grad_norm.float())).tolist()  # and here
    return both[0], both[1]


def optimizer_step(runtime: Any, fetched: list[Any], label: Label) -> StepMeasure:
    """One optimizer step on `runtime` (a `workbench.train.runtime.Runtime`). The batches
    read are appended to `fetched`, so an out-of-memory retry can split them. Raises
    `NonFiniteLoss` (gradients dropped, nothing applied) or what the model raised.

    A `loss_fn` with a `take_parts()` method (distillation's loss) reports named parts of
    its loss: called once here to drop what a failed step left, and once after the
    micro-batches for this step's means, which go into the record."""
    cfg = runtime.config
    backend = runtime.backend
    data = runtime.data
    loss_fn = runtime.loss_fn
    clock = runtime.clock
    take_parts = getattr(loss_fn, "take_parts", None)
    if take_parts is not None:
        take_parts()
    module = backend.module
    autocast = runtime.forward_context  # autocast, under activation offload when set
    # the tensor-parallel engine's loss runs vocabulary-parallel (loss_parallel)
    loss_context = backend.loss_context
    accum = int(cfg.grad_accum)
    runtime.begin_step()  # the CUDA peak of this step's record counts from here
    clock.start()
    data_s = 0.0
    total: torch.Tensor | None = None
    whole_step = backend.runs_whole_step  # a pipeline runs the whole step
    for _ in range(accum):
        t = perf_counter()
        with label("workbench.data"):
            batch = data.next()
        data_s += perf_counter() - t
        fetched.append(batch)
        if whole_step:
            continue
        with label("workbench.forward"):
            loss = batches.forward_and_loss(module, batch, loss_fn, autocast, loss_context)
        with label("workbench.backward"):
            backend.backward(loss)
        total = loss.detach() if total is None else total + loss.detach()
    if whole_step:
        with label("workbench.pipeline"):
            total = backend.train_step(fetched[-accum:], loss_fn)
    assert total is not None
    # one optimizer span per step: the norm and clipping, the step's one read of device
    # values (the loss with the norm), the NaN check and the step itself
    with label("workbench.optimizer"):
        norm = backend.prepare_step()  # the plain backend's gradient norm, else None
        clock.before_read()
        loss_sum, grad_norm = read_device_values(total, norm)
        loss_value = loss_sum / accum
        loss_parts = take_parts() if take_parts is not None else None
        if not math.isfinite(loss_value):
            backend.zero_grad()
            raise NonFiniteLoss(loss_value)
        first = runtime.state_bytes is None
        if first:
            before = backend.model_state_bytes()
        outcome = backend.step() if norm is None else backend.step(grad_norm=grad_norm)
    if first:
        after = backend.model_state_bytes()
        runtime.state_bytes = ModelStateBytes(
            before.params_bytes, before.grads_bytes, after.optimizer_bytes
        )
    return StepMeasure(loss_value, outcome, clock.stop(), data_s, loss_parts)


class RecordMaker:
    """Makes each step's `StepRecord` (`make()`, with `make_record`'s arguments). The
    fields a setting fixes (its settings, the engine's ZeRO stage, the measured model-state
    bytes, the samples per step) are worked out once per setting; each step adds its own
    measurements. A record costs about 1.5 us this way, a quarter of building it field by
    field through the dataclass's checks (docs/step_cost.md)."""

    def __init__(self) -> None:
        self._config: TrainConfig | None = None
        self._state_bytes: ModelStateBytes | None = None
        self._key: tuple[Any, ...] = ()
        self._fixed: dict[str, Any] = {}
        self._samples = 0
        self._tokens: int | None = None

    def _fix(
        self,
        config: TrainConfig,
        world_size: int,
        rank: int,
        tokens_per_sample: int | None,
        state_bytes: ModelStateBytes | None,
        zero_stage: int,
    ) -> None:
        cfg, sb = config, state_bytes
        self._samples = cfg.effective_batch_size(world_size)  # over the data-parallel ranks
        self._tokens = self._samples * tokens_per_sample if tokens_per_sample else None
        self._fixed = {
            "micro_steps": int(cfg.grad_accum),
            "precision": str(cfg.precision),
            "micro_batch": int(cfg.micro_batch),
            "grad_accum": int(cfg.grad_accum),
            "zero_stage": zero_stage,  # the engine's own, not the config's
            "fsdp": str(cfg.fsdp),
            "world_size": world_size,
            "rank": rank,
            "clip_grad_norm": cfg.clip_grad_norm,
            "activation_checkpointing": str(cfg.activation_checkpointing),
            "num_workers": int(cfg.num_workers),
            "params_bytes": sb.params_bytes if sb else None,
            "grads_bytes": sb.grads_bytes if sb else None,
            "optimizer_bytes": sb.optimizer_bytes if sb else None,
        }

    def make(
        self,
        *,
        step: int,
        config: TrainConfig,
        measure: StepMeasure,
        world_size: int,
        rank: int,
        tokens_per_sample: int | None,
        memory: tuple[int | None, int | None, int | None, int | None],
        state_bytes: ModelStateBytes | None,
        warmup: bool,
        changes: dict[str, Any],
        zero_stage: int,
        gpu: Any | None = None,
        cpu_util_percent: float | None = None,
    ) -> StepRecord:
        """The `StepRecord` of step number `step` (1-based) from what it measured."""
        small = (world_size, rank, tokens_per_sample, zero_stage)
        if config is not self._config or state_bytes is not self._state_bytes or small != self._key:
            self._fix(config, world_size, rank, tokens_per_sample, state_bytes, zero_stage)
            self._config, self._state_bytes, self._key = config, state_bytes, small
        m, outcome = measure, measure.outcome
        step_s, data_s = m.step_seconds, m.data_seconds
        alloc, max_alloc, reserved, rss = memory
        fields = {
            "step": step,
            "loss": m.loss,
            "samples_per_s": self._samples / step_s if step_s > 0 else 0.0,
            "tokens_per_s": self._tokens / step_s if self._tokens and step_s > 0 else None,
            "step_seconds": step_s,
            "data_seconds": data_s,
            "compute_seconds": step_s - data_s,
            "lr": float(outcome.lr),
            "grad_norm": outcome.grad_norm,
            "scale": outcome.scale,
            "skipped": bool(outcome.skipped),
            **self._fixed,
            "changes": changes,
            "warmup": warmup,
            "cuda_allocated_bytes": alloc,
            "cuda_max_allocated_bytes": max_alloc,
            "cuda_reserved_bytes": reserved,
            "rss_bytes": rss,
            "gpu_util_percent": getattr(gpu, "util_percent", None),
            "gpu_memory_used_bytes": getattr(gpu, "memory_used_bytes", None),
            "cpu_util_percent": cpu_util_percent,
            "loss_parts": m.loss_parts,
            "wall_time": time.time(),
        }
        return StepRecord.from_fields(fields)


def make_record(**arguments: Any) -> StepRecord:
    """The `StepRecord` of one step (`RecordMaker.make`'s arguments), made on its own."""
    return RecordMaker().make(**arguments)
