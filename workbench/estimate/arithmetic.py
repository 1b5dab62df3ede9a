"""The estimator's arithmetic: functions over checked `EstimateInputs` that do no checking.

Model states come from `model_states` (the ZeRO paper's accounting or another), activations
from `activations` (Korthikanti et al. 2022, extended), GPU figures from `catalog`; this
module adds them up, adds what the GPU holds beside the allocated peak (`reserve`: the CUDA
context, NCCL's buffers, the allocator's reserve), compares the sum with the GPU, and turns
the training tokens into FLOPs, seconds and money. `estimate_from` assembles the `MemoryEstimate`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from workbench.config import Precision
from workbench.estimate.activations import ActivationBreakdown, activation_breakdown
from workbench.estimate.flops import FlopCount, flop_count_of
from workbench.estimate.inputs_check import EstimateInputs
from workbench.estimate.limits import LIMITS
from workbench.estimate.lora import frozen_base_bytes
from workbench.estimate.model_states import (
    ModelStateQuery,
    ModelStates,
    bytes_per_param,
    model_state_bytes,
)
from workbench.estimate.peak import StepFixed, StepPeak, fixed_terms, peak_point, step_peak
from workbench.estimate.reserve import (
    TRANSIENT_SHARE,
    Reserve,
    allocator_at,
    reserve_of,
)
from workbench.estimate.result import MemoryEstimate

_BF16 = (Precision.AMP_BF16, Precision.BF16, Precision.BF16_TRUE)


def _states_of(i: EstimateInputs, n_params: int, precision: Precision | None = None) -> ModelStates:
    """The accounting's model states of `n_params` trained parameters under `i`'s setup
    (under `precision` when given: fp32 adapters over a bf16 base)."""
    query = ModelStateQuery(
        n_params,
        precision or i.precision,
        i.optimizer,
        i.zero_stage,
        i.data_parallel,
        i.offload_optimizer,
        i.offload_params,
        fsdp=i.fsdp,
        # the model's shapes for the whole model's states (a LoRA's adapters have others)
        parameter_shapes=i.parameter_shapes if n_params == i.shard_params else None,
    )
    return model_state_bytes(query, i.accounting)


def model_states(i: EstimateInputs) -> ModelStates:
    """Parameters, gradients and optimizer states on one GPU, and what is offloaded."""
    lora = i.lora
    if lora is None:
        return _states_of(i, i.shard_params)
    # the adapters train: their states as the engine lays them out (its accounting);
    # the frozen base holds weights only, split as the engine splits weights
    # fp32 adapters (peft's default) over a pure-bf16 base train as fp32 training does
    fp32 = lora.dtype == "fp32" and i.precision is Precision.BF16_TRUE
    trained = _states_of(i, lora.trainable, Precision.FP32 if fp32 else None)
    split = i.fsdp in ("full_shard", "shard_grad_op") or (i.fsdp == "off" and i.zero_stage >= 3)
    frozen = frozen_base_bytes(
        i.shard_params, lora, bytes_per_param(i.precision, i.optimizer).weights,
        gpus=i.data_parallel, split=split,
    )  # fmt: skip
    if i.offload_params:  # the base's weights go to the host with the adapters'
        return replace(trained, cpu_offload_bytes=trained.cpu_offload_bytes + frozen)
    return replace(trained, params_bytes=trained.params_bytes + frozen)


def activations(i: EstimateInputs) -> ActivationBreakdown | None:
    """The activation bytes one GPU keeps for the backward pass (None without a shape)."""
    arch = i.architecture
    if arch is None:
        return None
    return activation_breakdown(
        arch.layers,
        arch.hidden,
        arch.heads,
        arch.seq_len,
        i.micro_batch,
        arch.vocab,
        i.checkpointing,
        4 if i.precision is Precision.FP32 else 2,
        i.dropout,
        arch.token_ffn_hidden,
        arch.mlp,
        i.tensor_parallel,
        i.sequence_parallel,
        i.pipeline_parallel,
        arch.parallel_residual,
        i.attention,
        arch.kv_dim,
        arch.experts or 0,
        arch.experts_per_token or 0,
        arch.activation_function,
        runs_autocast(i),
        arch.norm_impl,
        arch.one_qkv_matrix,
        arch.eager_softmax,
        i.lora is not None,  # LoRA trains adapters only: the norms' weights are frozen
        arch.qk_norm_width,
        arch.post_norms,
    )


def runs_autocast(i: EstimateInputs) -> bool:
    """Whether the step's forward runs under torch autocast: amp-* on the plain loop and
    DeepSpeed (FSDP's mixed-precision policy casts the weights and runs every op in 16
    bits instead)."""
    return i.precision in (Precision.AMP_BF16, Precision.AMP_FP16) and i.fsdp == "off"


def overhead_bytes(i: EstimateInputs, peak: StepPeak | None = None) -> int:
    """What one GPU holds beside the allocated peak of `i` (bytes): `overhead_gib` when
    given, else the derived reserve at `peak` (`reserve.reserve_of`; the peak computed when
    not given)."""
    if peak is None:
        peak = peak_of(i, model_states(i))[0]
    return reserve_of(i, peak.terms).total_bytes


def peak_of(i: EstimateInputs, states: ModelStates) -> tuple[StepPeak, ActivationBreakdown | None]:
    """The peak of a step of `i` and its activations (`peak.step_peak`)."""
    breakdown = activations(i)
    return step_peak(i, states, breakdown), breakdown


def on_gpu(
    i: EstimateInputs,
    states: ModelStates,
    peak: StepPeak,
    reserve: Reserve,
    fixed: StepFixed | None = None,
) -> tuple[int | None, bool | None, int | None]:
    """(the GPU's memory, whether the peak of a step plus `reserve` fits in it, the
    largest micro-batch whose peak plus its own reserve fits, at most the largest
    micro-batch the estimator takes); all None without a GPU, the micro-batch also without
    activations or when not even one sample fits.

    Every point of the step is a sum of terms that are constant or exact multiples of the
    micro-batch (`StepPeak.variable`), and the reserve is a constant (the context, NCCL's
    buffers) plus the allocator's rounding, which is never negative and grows with the
    tensors. So the lowest crossing of the room the constant part leaves by those lines is
    the largest micro-batch that could fit; from there the answer is found by computing
    the peak and its reserve at smaller micro-batches (doubling the step, then halving the
    bracket), usually one or two. Should a term not divide evenly, the crossing is only a
    first guess and the search goes both ways. `fixed`: the step's terms that do not
    change with the micro-batch (`peak.fixed_terms(i, states)`) when already computed."""
    if i.gpu is None:
        return None, None, None
    gpu_mem = i.gpu.memory_bytes
    fits = peak.peak_bytes + reserve.total_bytes <= gpu_mem
    if i.architecture is None:
        return gpu_mem, fits, None
    top = int(LIMITS["micro_batch"].high)
    mb = i.micro_batch
    room = gpu_mem - (reserve.total_bytes - reserve.allocator_bytes)
    b, exact = top, True
    variable = peak.variable
    lines = []  # each phase's (bytes at any micro-batch, bytes a sample)
    for name, total in peak.phases.items():
        grows = variable.get(name, 0)
        exact = exact and grows % mb == 0
        if total - grows > room:  # the part that does not shrink with the micro-batch
            return gpu_mem, fits, None
        if grows > 0:
            b = min(b, (room - (total - grows)) * mb // grows)
        lines.append((total - grows, grows // mb))
    if b < 1 and exact:
        return gpu_mem, fits, None
    b = max(1, min(b, top))

    held = fixed if fixed is not None else fixed_terms(i, states)
    # the context and NCCL's buffers (or the overhead given): the same at every micro-batch
    beside = reserve.total_bytes - reserve.allocator_bytes

    def fits_at(n: int) -> bool:
        if n == mb:
            return fits
        changed = _at_micro_batch(i, n)
        point = peak_point(changed, states, activations(changed), fixed=held)
        return point.peak_bytes + beside + allocator_at(changed, point.terms) <= gpu_mem

    if exact and fits and b > mb:
        bound = _lowest_unfitting(i, peak, reserve, gpu_mem, min(top, b + 1), lines)
        if bound is not None:
            if bound - 1 == mb or fits_at(bound - 1):  # nothing from `bound` on fits
                return gpu_mem, fits, bound - 1
            b = bound - 1  # the answer is below: the bracket search from there
    if fits_at(b):
        if exact:  # nothing above the crossing fits, even without the allocator's rounding
            return gpu_mem, fits, b
        low, step = b, 1  # rounding in the terms: look above too
        high = b + step
        while high <= top and fits_at(high):
            low, step = high, step * 2
            high = b + step
        if high > top:
            if fits_at(top):
                return gpu_mem, fits, top
            high = top
    else:  # bracket [low fits, high does not] below b
        high, step = b, 1
        low = b - step
        while low >= 1 and not fits_at(low):
            high, step = low, step * 2
            low = b - step
        if low < 1:
            if not fits_at(1):
                return gpu_mem, fits, None
            low = 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits_at(mid) else (low, mid)
    return gpu_mem, fits, low


def _at_micro_batch(i: EstimateInputs, n: int) -> EstimateInputs:
    """A private copy of frozen inputs `i` at micro-batch `n` (what `copy.copy` makes,
    without its generic protocol: the search for the largest micro-batch makes one per
    micro-batch it tries)."""
    changed = object.__new__(EstimateInputs)
    changed.__dict__.update(i.__dict__)
    changed.__dict__["micro_batch"] = n
    return changed


def _lowest_unfitting(
    i: EstimateInputs,
    peak: StepPeak,
    reserve: Reserve,
    gpu_mem: int,
    top: int,
    lines: list[tuple[int, int]] | None = None,
) -> int | None:
    """The smallest micro-batch that provably does not fit (None: up to `top`, the
    crossing of the lines without the allocator's share plus one, none is ruled out), from a lower bound of what any micro-batch n needs, made of the peak's
    lines (each phase's total is its constant part plus its `variable` part scaled by n;
    the highest backward moment at n is at least the one at this micro-batch) and of the
    reserve: its constant part (the context, NCCL's buffers, or `overhead_gib` given),
    plus the allocator's fitted share of the transient bytes, which are at least the
    total less the most model-state bytes any point of the step holds (its rounding of
    the states is left out: it is never negative). The bound grows with n, so every
    micro-batch from the first one it rules out is ruled out; the micro-batch just below
    is then usually the answer, found with one computed peak. Only micro-batches above
    this one (which fits) are bounded: a term that grows with the micro-batch but is not
    in `variable` makes the lines too low above it, never too high. `lines`: each phase's
    (constant part, `variable` part a sample) when `on_gpu` has read them."""
    mb = i.micro_batch
    share = 0.0 if i.overhead_gib is not None else TRANSIENT_SHARE
    constant = reserve.total_bytes - reserve.allocator_bytes
    base = peak.points["forward end"]
    states = base.get("parameters", 0) + base.get("optimizer states", 0)
    states += peak.held_gradients_bytes
    if lines is None:
        lines = [
            (total - peak.variable.get(name, 0), peak.variable.get(name, 0) // mb)
            for name, total in peak.phases.items()
        ]
    for _, per in lines:
        if per < 0:
            return None

    def needs(n: int) -> int:
        highest = max([fixed + per * n for fixed, per in lines])
        return highest + constant + max(0, int(share * (highest - states)))

    if needs(top) <= gpu_mem:
        return None
    # `needs` never falls as n grows, so the answer is the first n above this micro-batch
    # where it passes the GPU (or mb + 1): solved from the lines, checked with two calls
    guess = _first_crossing(lines, constant, share, states, gpu_mem, mb + 1, top)
    if needs(guess) > gpu_mem and (guess == mb + 1 or needs(guess - 1) <= gpu_mem):
        return guess
    low, high = mb, top  # this micro-batch fits; needs(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if needs(mid) <= gpu_mem else (low, mid)
    return high


def _first_crossing(
    lines: list[tuple[int, int]],
    constant: int,
    share: float,
    states: int,
    gpu_mem: int,
    low: int,
    high: int,
) -> int:
    """A guess at the first n in [`low`, `high`] whose highest line `fixed + per x n` plus
    `constant` plus `share` of what it holds beyond `states` passes `gpu_mem`
    (`_lowest_unfitting`'s `needs`), solved in floating point: the caller checks it."""
    room = gpu_mem - constant
    h = room if room <= states else states + (room - states) / (1.0 + share)
    first = high
    for fixed, per in lines:
        if per > 0:
            first = min(first, math.floor((h - fixed) / per) + 1)
        elif fixed > h:
            first = low
    return max(low, min(first, high))


def flop_count(i: EstimateInputs) -> FlopCount:
    """The FLOP count of `i`'s model (`workbench.estimate.flops`): with a shape, its
    parameters a token uses less the embedding lookups and the attention term; with a
    parameter count only, every parameter multiplied and no attention term."""
    arch = i.architecture
    if arch is None:
        used = i.active_params if i.active_params is not None else i.n_params
        return FlopCount(matmul_params=int(used), layers=0, attention_width=0, seq_len=0)
    used = arch.active_params if arch.is_moe else i.n_params
    if i.active_params is not None:
        used = i.active_params
    if i.context_parallel > 1:  # every token attends to the whole sequence, not its rank's
        arch = replace(arch, seq_len=arch.seq_len * i.context_parallel)
    return flop_count_of(arch, used)


def time_and_cost(
    i: EstimateInputs, count: FlopCount | None = None
) -> tuple[float | None, float | None, float | None, float | None]:
    """(hardware FLOPs, seconds, cost, model FLOPs) of the tokens: the one FLOP count
    (`flops.FlopCount`: 6 N + 12 L q s a token, N without the embedding lookups; under LoRA
    4 N + 2 N_trained; the recomputed forward on top for the hardware FLOPs), the hardware
    FLOPs at `mfu` of the GPUs' peak (the rate the GPUs sustain on what they run), at the
    price per GPU-hour. Each is None when its inputs are missing (tokens; a GPU with a peak
    rate; a price). `count`: `flop_count(i)` when already computed."""
    if i.tokens is None:
        return None, None, None, None
    trained = i.lora.trainable if i.lora is not None else None
    model, flops = (count if count is not None else flop_count(i)).step(
        i.tokens, i.checkpointing._value_, trained
    )
    seconds = cost = None
    if i.gpu is not None:
        peak = i.gpu.peak_flops(i.precision is not Precision.FP32, bf16=i.precision in _BF16)
        if peak is not None:
            seconds = flops / (i.gpus * peak * i.mfu)
            if i.price_per_gpu_hour is not None:
                cost = seconds / 3600.0 * i.gpus * i.price_per_gpu_hour
    return flops, seconds, cost, model


def estimate_from(i: EstimateInputs, breakdown: ActivationBreakdown | None) -> MemoryEstimate:
    """The estimate of checked inputs whose activations are `breakdown` (`activations(i)`)."""
    states = model_states(i)
    model_bytes = states.params_bytes + states.grads_bytes + states.optimizer_bytes
    act_bytes = breakdown.total_bytes if breakdown is not None else None
    total = model_bytes + (act_bytes or 0)
    fixed = fixed_terms(i, states)
    peak = step_peak(i, states, breakdown, fixed=fixed)
    reserve = reserve_of(i, peak.terms)
    gpu_mem, fits, max_mb = on_gpu(i, states, peak, reserve, fixed)
    count = flop_count(i)
    flops, seconds, cost, model_flops = time_and_cost(i, count)
    arch = i.architecture
    return MemoryEstimate.of_every_field(
        {
            "n_params": i.n_params,
            "params_bytes": states.params_bytes,
            "grads_bytes": states.grads_bytes,
            "optimizer_bytes": states.optimizer_bytes,
            "activation_bytes": act_bytes,
            "total_bytes": total,
            "overhead_bytes": reserve.total_bytes,
            "cpu_offload_bytes": states.cpu_offload_bytes,
            "gpu": i.gpu.name if i.gpu is not None else None,
            "gpu_memory_bytes": gpu_mem,
            "fits": fits,
            "max_micro_batch": max_mb,
            "train_flops": flops,
            "model_flops": model_flops,
            "flop_count": count,
            "train_seconds": seconds,
            "cost": cost,
            "activations": breakdown,
            "precision": i.precision._value_,  # `.value`, read directly (hot path)
            "optimizer": i.optimizer._value_,
            "zero_stage": i.zero_stage,
            "gpus": i.gpus,
            "offload_optimizer": i.offload_optimizer,
            "offload_params": i.offload_params,
            "fsdp": i.fsdp,
            "dropout": i.dropout,
            "checkpointing": i.checkpointing._value_,
            "micro_batch": i.micro_batch,
            "layers": arch.layers if arch else None,
            "hidden": arch.hidden if arch else None,
            "heads": arch.heads if arch else None,
            "seq_len": arch.seq_len * i.context_parallel if arch else None,
            "vocab": arch.vocab if arch else None,
            "overhead_gib": i.overhead_gib,
            "tokens": i.tokens,
            "mfu": i.mfu,
            "price_per_gpu_hour": i.price_per_gpu_hour,
            "accounting": i.accounting,
            "model": i.model,
            "hf_config": i.hf_config,
            "kv_heads": arch.kv_heads if arch else None,
            "ffn_hidden": arch.ffn_hidden if arch else None,
            "mlp": arch.mlp if arch else None,
            "activation_function": arch.activation_function if arch else None,
            "norm_impl": arch.norm_impl if arch else None,
            "eager_softmax": arch.eager_softmax if arch else None,
            "qk_norm": arch.qk_norm if arch else None,
            "post_norms": arch.post_norms if arch else None,
            "norm": arch.norm if arch else None,
            "bias": arch.bias if arch else None,
            "positions": arch.positions if arch else None,
            "tied_embeddings": arch.tied_embeddings if arch else None,
            "parallel_residual": arch.parallel_residual if arch else None,
            "tensor_parallel": i.tensor_parallel,
            "pipeline_parallel": i.pipeline_parallel,
            "sequence_parallel": i.sequence_parallel,
            "context_parallel": i.context_parallel,
            "data_parallel": i.data_parallel,
            "shard_params": i.shard_params,
            "active_params": (
                i.active_params
                if i.active_params is not None
                else arch.active_params
                if arch is not None
                else i.n_params
            ),
            "activation_note": i.activation_note,
            "activation_function_note": i.activation_function_note,
            "shape_note": i.shape_note,
            "experts": arch.experts if arch else None,
            "experts_per_token": arch.experts_per_token if arch else None,
            "peak_bytes": peak.peak_bytes,
            "peak": peak,
            "reserve": reserve,
            "attention": i.attention._value_,
            "optimizer_impl": peak.optimizer_impl,
            "grad_accum": i.grad_accum,
            "loss_chunks": i.loss_chunks,
            "lora_rank": i.lora.rank if i.lora is not None else 0,
            "lora_params": i.lora.trainable if i.lora is not None else 0,
            "qlora_params": i.lora.quantized if i.lora is not None else 0,
        }
    )


__all__ = [
    "activations",
    "estimate_from",
    "flop_count",
    "model_states",
    "on_gpu",
    "peak_of",
    "overhead_bytes",
    "time_and_cost",
]
