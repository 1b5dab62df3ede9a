"""The terms of a training step that its micro-batch does not change: which engine trains
the setup, the bytes per element it computes and reduces in, the autocast copies, and the
engine's buffers (DDP's buckets, FSDP's gathered units and unsharded gradients,
DeepSpeed's gathered parameters, reduce buckets, flattened reduce copy and fp32 gradient
partition), gathered once per estimate in `StepFixed` (`fixed_terms`).
`workbench.estimate.peak` adds the terms that grow with the micro-batch and finds the
step's highest point; its module docstring describes each engine's buffers and where they
come from.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from workbench.config import Precision
from workbench.estimate.activations import Attention, Checkpointing
from workbench.estimate.inputs_check import EstimateInputs
from workbench.estimate.lora import block_linears, dequantized_bytes, nf4_weight_bytes
from workbench.estimate.model_states import ModelStates
from workbench.estimate.optimizer_step import optimizer_temporaries, resolve_impl, stepped_params
from workbench.estimate.tied_embedding import tied_sum_bytes
from workbench.optimizers import row

_LOOPS = ("plain", "ddp")  # engines whose gradients are plain `.grad` tensors


def engine_of(i: EstimateInputs) -> str:
    """Which engine trains the setup: FSDP, DeepSpeed (ZeRO, DeepSpeed's 16-bit modes or
    its accounting), DDP (several data-parallel GPUs) or the plain loop."""
    if i.fsdp != "off":
        return "fsdp"
    if i.zero_stage >= 1 or i.precision.is_deepspeed or i.accounting == "deepspeed":
        return "deepspeed"
    return "ddp" if i.data_parallel > 1 else "plain"


#: the members the step's functions compare with, bound once (an enum member read through
#: its class costs several times a module constant, and a step reads them dozens of times)
_FP32 = Precision.FP32
_SIXTEEN_BIT_WEIGHTS = (Precision.FP16, Precision.BF16, Precision.BF16_TRUE)
_SDPA = Attention.SDPA


def compute_bytes(precision: Precision) -> int:
    """Bytes per element of the activations and of gathered 16-bit copies."""
    return 4 if precision is _FP32 else 2


def weight_bytes(precision: Precision) -> int:
    """Bytes per weight element as the engine holds it: 2 where the weights are 16-bit,
    else 4 (fp32, and amp-*, whose weights stay fp32 and are cast per matmul)."""
    return 2 if precision in _SIXTEEN_BIT_WEIGHTS else 4


def grad_bytes(precision: Precision) -> int:
    """Bytes per gradient element: a gradient is in its weight's dtype."""
    return weight_bytes(precision)


def autocast_casts(i: EstimateInputs, engine: str) -> int:
    """The 16-bit weight copies torch autocast keeps through forward and backward."""
    if i.precision not in (Precision.AMP_BF16, Precision.AMP_FP16) or engine == "fsdp":
        return 0
    arch = i.architecture
    if arch is None:
        matmul = i.shard_params
    else:
        t, p = i.tensor_parallel, i.pipeline_parallel
        rows = -(-arch.vocab // t)
        layer = arch.layer_params(t) - 2 * arch.norm_params()  # norms run in fp32: not cast
        matmul = (arch.layers // p) * layer + (rows * arch.hidden if p == 1 else 0)
    if i.zero_stage >= 3:  # only the gathered parameters are cast
        matmul = min(matmul, _zero3_live(i))
    return 2 * matmul


def _lora_casts(i: EstimateInputs) -> int:
    """The 16-bit copies autocast makes under LoRA: its cache keeps the casts of trainable
    leaves (the adapters') through forward and backward; a frozen weight is cast anew for
    each matmul and autograd saves that copy for the gradient of the matmul's input, which
    needs one wherever an adapter before it trains: every block's linear weights and the
    output head, alive until their backward. Full recomputation keeps only the layer being
    recomputed (or the head, run outside the blocks) at a time. A 4-bit base saves no copy
    (its matmul dequantizes again in backward: `dequantized_bytes`). Measured by the dry
    run on fake tensors (a 4-layer Llama, tests/integration)."""
    lora = i.lora
    assert lora is not None
    arch = i.architecture
    if lora.qlora or arch is None:
        return 2 * lora.trainable + 2 * lora.largest_linear
    t, p = i.tensor_parallel, i.pipeline_parallel
    layer = arch.layer_params(t) - 2 * arch.norm_params()  # its linear weights
    head = -(-arch.vocab // t) * arch.hidden if p == 1 else 0
    if i.checkpointing is Checkpointing.FULL:
        frozen = max(layer, head)
    else:
        frozen = (arch.layers // p) * layer + head
    return 2 * lora.trainable + 2 * frozen


def _block_params(i: EstimateInputs) -> tuple[int, int]:
    """(one layer's parameters, the root unit's) on this GPU before sharding."""
    arch = i.architecture
    if arch is None:
        return 0, i.shard_params
    t = i.tensor_parallel
    root = arch.embedding_params(t) + arch.output_params(t)
    return arch.layer_params(t), root


def fsdp_unit_params(i: EstimateInputs) -> tuple[int, int, int]:
    """(one block's, the unit gathered first in forward and last in backward, the unit
    gathered last in forward and first in backward) parameters on this GPU before
    sharding, as `fsdp_units` makes the units: "blocks" (an untied model): the embedding
    and the output head (with the final norm) units of their own; "blocks-only", or a head
    tied to the embedding (one weight cannot be in two units): both in the root, which is
    gathered for the whole step (the first unit then, the last one 0)."""
    layer, root = _block_params(i)
    arch = i.architecture
    if arch is None or i.fsdp_units != "blocks" or arch.tied_embeddings:
        return layer, root, 0
    t = i.tensor_parallel
    return layer, arch.embedding_params(t), arch.output_params(t)


def _zero3_live(i: EstimateInputs) -> int:
    ds = i.deepspeed
    layer, _ = _block_params(i)
    ahead = min(int(ds["stage3_prefetch_bucket_size"]), i.shard_params)
    # what runs is gathered whatever `stage3_max_live_parameters` says: a limit under a
    # layer is counted as the layer (a floor: the dry run of DeepSpeed's engine keeps the
    # whole tiny GPT gathered at the forward's end with the limit and prefetch at 0)
    live = max(int(ds["stage3_max_live_parameters"]), layer)
    return min(i.shard_params, live, layer + ahead)


def trained_params(i: EstimateInputs) -> int:
    """Parameters on this GPU that have gradients: the adapters under LoRA (the frozen base
    has none, on any engine), else every parameter."""
    return i.lora.trainable if i.lora is not None else i.shard_params


def _unit_trained(i: EstimateInputs) -> tuple[int, int]:
    """(one layer's parameters with gradients, the output head's) on this GPU: under LoRA
    a layer's adapters (`trainable` over the layers) and none of the frozen head's."""
    layer, _ = _block_params(i)
    arch = i.architecture
    head = 0
    if arch is not None and i.pipeline_parallel == 1:
        head = -(-arch.vocab // i.tensor_parallel) * arch.hidden
    if i.lora is None:
        return layer, head
    layers = arch.layers if arch is not None else 1
    return -(-i.lora.trainable // max(1, layers)), 0


def _fsdp_terms(i: EstimateInputs) -> tuple[int, int, int, int]:
    """(gathered parameters at the forward's end, gathered in the last layer's backward,
    unsharded gradients in backward, gathered in the loss's backward) of FSDP2 (module
    docstring). A unit's unsharded
    gradients are those of its parameters that train: a frozen weight has none."""
    cw = compute_bytes(i.precision)
    upcast = cw == 2 and i.fsdp_reduce_fp32 and i.precision is not Precision.BF16_TRUE
    arch = i.architecture
    layer, root = _block_params(i)
    if arch is None:
        whole, trained = cw * i.shard_params, trained_params(i)
        return whole, whole, cw * trained + (4 * trained if upcast else 0), whole
    layers = arch.layers // i.pipeline_parallel
    if i.fsdp == "full_shard":  # a layer running and the next prefetched
        forward, backward = min(2, layers), min(2, layers)
    else:  # every layer gathered, and the last one's all-gather output until the loss
        forward, backward = layers + 1, layers
    layer_trained, head = _unit_trained(i)
    grads = cw * (head + min(2, layers) * layer_trained) + (4 * layer_trained if upcast else 0)
    _, first, last = fsdp_unit_params(i)
    unit = _gathered_layer_bytes(i, layer, cw)
    if last and i.fsdp == "full_shard":
        # own units: the embedding is freed after its forward and gathered again only at
        # the end of backward; every layer is freed after its forward, and the head stays
        # gathered from its forward into its backward, with its all-gather output until
        # the next all-gather (the last layer's, prefetched by the head's backward): the
        # loss's backward still holds both; a layer's backward holds the layer and the
        # next prefetched (the head freed after its own backward)
        return cw * 2 * last, backward * unit, grads, cw * 2 * last
    whole = cw * root + backward * unit
    return cw * root + forward * unit, whole, grads, whole


def _gathered_layer_bytes(i: EstimateInputs, layer: int, cw: int) -> int:
    """One gathered layer unit of `layer` parameters: in the compute dtype, except under
    QLoRA, whose 4-bit weights FSDP2 gathers as they are held (torchao's NF4 tensor
    all-gathers its packed codes and scales through its own FSDP hooks, torchtune's way;
    they are dequantised one matmul at a time, the peak's "QLoRA dequantized weight"); the
    norms and the layer's LoRA adapters beside them in the compute dtype."""
    lora, arch = i.lora, i.architecture
    if lora is None or arch is None:
        return cw * layer
    # LoRA's adapters are in their layer's unit (in blocks only: a layer's share)
    adapters = lora.trainable // (arch.layers * i.tensor_parallel)
    if not lora.quantized or arch.is_moe:
        return cw * (layer + adapters)
    linears = [a * b for a, b in block_linears(arch).values()]
    quantized = sum(linears) // i.tensor_parallel
    if quantized >= layer:
        return cw * (layer + adapters)
    scale = 2 if i.precision is Precision.BF16_TRUE else 4
    packed = sum(nf4_weight_bytes(n // i.tensor_parallel, "torchao", scale) for n in linears)
    return packed + cw * (layer - quantized + adapters)


#: The term of DeepSpeed's flattened reduce copy (`DeepSpeedBuffers`).
FLAT_REDUCE_TERM = "DeepSpeed flattened reduce copy"
#: The term of ZeRO 1/2's contiguous reduce buckets (`DeepSpeedBuffers.reduce`).
REDUCE_BUCKETS_TERM = "DeepSpeed reduce buckets"
#: The elements DeepSpeed's ZeRO-0 engine flattens its gradients in, at most, per allreduce:
#: `allreduce_gradients`' own bucket (DeepSpeed 0.19 engine.py `MEMORY_OPT_ALLREDUCE_SIZE`),
#: whatever the config's reduce_bucket_size says.
STAGE0_ALLREDUCE_ELEMENTS = 500_000_000


class DeepSpeedBuffers(NamedTuple):
    """DeepSpeed's buffers of a step, in bytes (the peak module's docstring): ZeRO-3's
    gathered parameters; ZeRO 1/2's reduce buckets in backward; the flattened copy of a
    reduce, beside the layers' backward (a reduce before the last: the bucket is smaller
    than the trained parameters) and at the end of backward (the final reduce, or stage 0's
    allreduce); whether the gradient partition exists at that final reduce; the fp32 copy
    of the gradient partition the step makes (stage 3: of one sub-group's, in every
    precision)."""

    gathered: int
    reduce: int
    flat_layers: int
    flat_end: int
    partition_at_end: bool
    fp32_grads: int


def _deepspeed_buffers(i: EstimateInputs) -> DeepSpeedBuffers:
    """DeepSpeed's buffers of `i`'s step (`DeepSpeedBuffers`).

    The flattened reduce copy (DeepSpeed 0.19): ZeRO 1/2's `reduce_ipg_grads` ->
    `average_tensor` -> `allreduce_and_scatter` -> `allreduce_bucket` cats the bucket's
    gradient slices into one new tensor in the bucket's dtype (the gradient dtype; W x the
    bucket's elements, at most `reduce_bucket_size`), all-reduces it and copies it back;
    it is freed when the reduce returns, one at a time with or without `overlap_comm`.
    Stage 2's gradient hooks reduce whenever the bucket fills and once more at the end of
    backward (stage 1's only with `overlap_comm`; without it, `reduce_gradients` flattens
    after backward the gradients it moved from their whole `.grad`s into the bucket, bytes
    the end of backward's "DeepSpeed stage-1 whole gradients" hold already). The gradient
    partition is allocated by the first reduce, after its copy is freed: a bucket that
    holds every trained parameter reduces once, before any partition exists. Stage 0's
    engine flattens every gradient (in chunks of `STAGE0_ALLREDUCE_ELEMENTS`) after
    autograd's backward, the same copy.

    Stage 3 gathers each layer in the dtype its partitions are held in: 16-bit under
    bf16/fp16, fp32 under fp32 and amp-* (autocast casts per matmul, after the gather).
    Its step (`stage3.py` `_prepare_fp32_grad_for_sub_group`) flattens one sub-group's
    gradient partitions into a new tensor and upcasts it to fp32 for the masters, in every
    precision (under fp32 and amp-* the flat copy is that fp32 gradient; under 16-bit
    training the 16-bit flat copy is alive with it for the upcast), and frees it after the
    sub-group's step (`_release_sub_group`): its largest sub-group
    (`largest_sub_group`: `sub_group_size` elements and up to one parameter's partition
    more; DeepSpeed's default 1e9)."""
    ds = i.deepspeed
    w = grad_bytes(i.precision)
    psi = trained_params(i)  # DeepSpeed reduces and partitions the trained parameters only
    bucket = int(ds["reduce_bucket_size"])
    if not i.deepspeed_given:  # the workbench caps its bucket at the trained parameters
        bucket = min(bucket, -(-psi // 64) * 64)
    gathered = reduce = flat_layers = flat_end = 0
    partition_at_end = True
    if i.zero_stage == 3:
        gathered = weight_bytes(i.precision) * _zero3_live(i)
    elif i.zero_stage in (1, 2):
        overlap = ds["overlap_comm"]
        reduce = w * bucket * (2 if overlap else 1)
        if i.zero_stage == 2 or overlap:  # the gradient hooks reduce in backward
            flat_end = w * min(bucket, psi)
            if bucket < psi:  # the bucket fills (and is reduced) before the last layer
                flat_layers = flat_end
            partition_at_end = bucket < psi or i.grad_accum > 1
    else:
        flat_end = w * min(STAGE0_ALLREDUCE_ELEMENTS, psi)
    fp32_grads = 0
    if i.zero_stage == 3 and not i.offload_optimizer:
        fp32_grads = 4 * largest_sub_group(i, psi)
    elif w == 2 and not i.offload_optimizer:
        fp32_grads = 4 * (-(-psi // i.data_parallel) if i.zero_stage >= 1 else psi)
    return DeepSpeedBuffers(gathered, reduce, flat_layers, flat_end, partition_at_end, fp32_grads)


def largest_sub_group(i: EstimateInputs, psi: int) -> int:
    """The elements of this rank's largest ZeRO-3 sub-group, of the `psi` trained
    parameters: DeepSpeed's `_create_fp16_sub_groups` (stage3.py) keeps one group when
    `sub_group_size` covers the rank's partition, else walks the parameters in order,
    adding each one's partition (ceil(numel / ranks)) and closing a group once it holds
    `sub_group_size` or more, so a group runs up to a parameter's partition past it.
    The walk needs the parameters' shapes (`parameter_shapes`: a module's order, or the
    shape's); without them (LoRA's adapters, a parameter count alone) `sub_group_size`
    bounds it from below."""
    size = int(i.deepspeed["sub_group_size"])
    shapes = i.parameter_shapes if i.lora is None else None
    if shapes is None:  # 0: a parameter a group, of sizes not known: the whole partition
        return min(-(-psi // i.data_parallel), size or psi)
    partitions = [-(-math.prod(shape) // i.data_parallel) for shape in shapes]
    if size >= sum(partitions):
        return sum(partitions)
    largest = group = 0
    for partition in partitions:
        group += partition
        if group >= size:
            largest, group = max(largest, group), 0
    return max(largest, group)


def _backward_end_engine(
    i: EstimateInputs, engine: str, during: dict[str, int], step: dict[str, int]
) -> dict[str, int]:
    """The engine's buffers at the end of backward: DDP's and DeepSpeed's buckets; FSDP's
    root unit gathered, with its unsharded gradients (the embedding's and the output
    projection's, reduced last)."""
    if engine != "fsdp":
        return {k: v for k, v in during.items() if "ZeRO-3" not in k}
    cw = compute_bytes(i.precision)
    _, root, last = fsdp_unit_params(i)
    if not last or i.fsdp != "full_shard":  # the root unit: the embedding and the head
        root = _block_params(i)[1]
    upcast = cw == 2 and i.fsdp_reduce_fp32 and i.precision is not Precision.BF16_TRUE
    graded = root if i.lora is None else 0  # LoRA: the embedding and head are frozen
    return {
        "FSDP gathered parameters": cw * root,
        "FSDP unsharded gradients": cw * graded + (4 * graded if upcast else 0),
    }


class StepFixed(NamedTuple):
    """The terms of a step that do not change with the micro-batch (`fixed_terms`): the
    engine, the optimizer's implementation, the model states as the step holds them, the
    autocast casts, the optimizer's temporaries, the gradients held before backward, the
    first one made and those held at its end, QLoRA's dequantized weight and the engine's
    buffers."""

    engine: str
    impl: str
    params: int
    grads: int
    optim: int
    casts: int
    temps: int
    held_grads: int
    first: int
    dequant: int
    gathered_loss: int
    #: the gradients the end of backward holds (DeepSpeed ZeRO 1/2: none before a final
    #: reduce that is the first, `DeepSpeedBuffers.partition_at_end`)
    end_grads: int
    engine_fwd: dict[str, int]
    engine_bwd: dict[str, int]
    engine_step: dict[str, int]
    backward_end_engine: dict[str, int]
    #: the engine's units held in the loss's backward (before any layer's)
    held_units: dict[str, int]
    #: the optimizer's states are paged (`PAGED_TERM`: beside the device peak)
    paged: bool
    #: a tied embedding's gradient sum at its backward (`tied_embedding.TIED_SUM_TERM`; 0:
    #: no such instant)
    tied_sum: int
    #: the gradients and the engine's buffers at the embedding's backward (before the
    #: final reduce)
    embedding_grads: int
    embedding_engine: dict[str, int]
    #: the sums of `engine_fwd`, `held_units`, `engine_bwd`, `backward_end_engine`,
    #: `engine_step` and `embedding_engine` (`peak_point` adds a point's terms without
    #: naming them)
    sums: tuple[int, int, int, int, int, int]


def fixed_terms(i: EstimateInputs, states: ModelStates) -> StepFixed:
    """The terms of `i`'s step with model states `states` that its micro-batch does not
    change: computed once for an estimate, whose search for the largest micro-batch that
    fits computes the peak at other micro-batches of the same inputs (`step_peak`'s
    `fixed`)."""
    engine = engine_of(i)
    impl = resolve_impl(i, engine)
    params, grads, optim = states.params_bytes, states.grads_bytes, states.optimizer_bytes
    casts = autocast_casts(i, engine)
    temps = optimizer_temporaries(i, engine, impl)
    # gradients alive before this step's backward: accumulation's, and ZeRO-3's partition
    # buffer (DeepSpeed 0.19 frees stage 0-2 gradients at each step; dry runs of its engine)
    zero3 = engine == "deepspeed" and i.zero_stage == 3
    held_grads = grads if (i.grad_accum > 1 or zero3) else 0
    arch = i.architecture
    first = 0  # FSDP's and DeepSpeed's first gradients are in their own terms
    if held_grads == 0 and arch is not None and i.pipeline_parallel == 1 and engine in _LOOPS:
        rows = -(-arch.vocab // i.tensor_parallel)
        first = min(grads, grad_bytes(i.precision) * rows * arch.hidden)

    dequant = gathered_loss = 0
    if i.lora is not None:  # LoRA: only the adapters train (workbench.estimate.lora)
        stepped = stepped_params(i, engine)
        # the adapters' share of what this GPU steps (sharded as the engine shards them)
        adapters_stepped = -(-i.lora.trainable * stepped // max(1, i.shard_params))
        temps = int(temps * adapters_stepped / stepped) if stepped else 0
        first = 0  # the output head is frozen: no gradient of its own
        if casts:
            casts = _lora_casts(i)
        dequant = dequantized_bytes(i.lora, compute_bytes(i.precision))

    engine_fwd: dict[str, int] = {}
    engine_bwd: dict[str, int] = {}
    engine_step: dict[str, int] = {}
    if engine == "ddp":
        buckets = 0 if i.bucket_view else grad_bytes(i.precision) * trained_params(i)
        for d in (engine_fwd, engine_bwd, engine_step):
            d["DDP gradient buckets"] = buckets
    elif engine == "fsdp":
        gathered_fwd, gathered_bwd, unsharded, gathered_loss = _fsdp_terms(i)
        engine_fwd["FSDP gathered parameters"] = gathered_fwd
        engine_bwd["FSDP gathered parameters"] = gathered_bwd
        engine_bwd["FSDP unsharded gradients"] = unsharded
    elif engine == "deepspeed":
        buffers = _deepspeed_buffers(i)
        gathered, reduce, fp32_grads = buffers.gathered, buffers.reduce, buffers.fp32_grads
        if gathered:
            engine_fwd["ZeRO-3 gathered parameters"] = gathered
            engine_bwd["ZeRO-3 gathered parameters"] = gathered
        if reduce:  # allocated at the first gradient hook, released after backward
            engine_bwd[REDUCE_BUCKETS_TERM] = reduce
            if i.zero_stage == 1 and i.grad_accum > 1:
                # stage 1 releases them at the accumulation boundary only (its epilogue
                # runs in `reduce_gradients`): the last micro-batch's forward and loss
                # hold the buckets the first one's backward allocated
                engine_fwd[REDUCE_BUCKETS_TERM] = reduce
        if buffers.flat_layers:  # a reduce beside the layers' backward
            engine_bwd[FLAT_REDUCE_TERM] = buffers.flat_layers

        if fp32_grads:
            engine_step["DeepSpeed fp32 gradient partition"] = fp32_grads
            if i.zero_stage in (1, 2) or (i.zero_stage == 3 and grad_bytes(i.precision) == 2):
                # the partition is flattened in the gradient dtype, then upcast: both are
                # alive before the optimizer runs, a moment above the step's own when its
                # temporaries are smaller than the flat copy (stage 3 under fp32 and amp-*:
                # the flat copy is the fp32 gradient itself)
                flat = grad_bytes(i.precision) * (fp32_grads // 4)
                extra = max(0, flat - temps)
                if extra:
                    engine_step["DeepSpeed flattened gradient partition"] = extra

    # the loss's backward: the units gathered before any layer's (no reduce has run yet,
    # and no gradient hook: DeepSpeed 0.19 allocates ZeRO 1/2's reduce buckets in the first
    # parameter's hook, `process_gradients` -> `setup_buckets`)
    held_units = {
        k: v
        for k, v in engine_bwd.items()
        if "unsharded" not in k and k not in (FLAT_REDUCE_TERM, REDUCE_BUCKETS_TERM)
    }
    if REDUCE_BUCKETS_TERM in engine_fwd:  # held from the previous micro-batch's backward
        held_units[REDUCE_BUCKETS_TERM] = engine_fwd[REDUCE_BUCKETS_TERM]
    if engine == "fsdp":
        held_units["FSDP gathered parameters"] = gathered_loss
    backward_end = _backward_end_engine(i, engine, engine_bwd, engine_step)
    end_grads = grads
    if engine == "deepspeed":
        backward_end.pop(FLAT_REDUCE_TERM, None)
        if buffers.flat_end:  # the final reduce (stage 0: the allreduce after backward)
            backward_end[FLAT_REDUCE_TERM] = buffers.flat_end
        if not buffers.partition_at_end:  # made by the reduce, after its copy is freed
            end_grads = 0
    if engine == "deepspeed" and i.zero_stage == 1 and not i.deepspeed["overlap_comm"]:
        # stage 1 partitions no gradient in backward: without overlap_comm (its default
        # there) its hooks reduce nothing, every parameter's 16-bit .grad is whole at the
        # end of backward, until `reduce_gradients` (DeepSpeed 0.19 stage_1_and_2.py
        # `process_gradients`), with the optimizer offloaded or not
        whole = grad_bytes(i.precision) * trained_params(i) - grads
        if whole > 0:
            backward_end["DeepSpeed stage-1 whole gradients"] = whole
    width = compute_bytes(i.precision) if engine == "fsdp" else grad_bytes(i.precision)
    tied_sum = tied_sum_bytes(i, engine, width)
    embedding_grads = 0
    embedding_engine: dict[str, int] = {}
    if tied_sum:
        embedding_grads, embedding_engine = _embedding_terms(i, engine, end_grads, backward_end)
    return StepFixed(
        engine,
        impl,
        params,
        grads,
        optim,
        casts,
        temps,
        held_grads,
        first,
        dequant,
        gathered_loss,
        end_grads,
        engine_fwd,
        engine_bwd,
        engine_step,
        backward_end,
        held_units,
        bool(optim and row(i.optimizer).paged and not i.offload_optimizer),
        tied_sum,
        embedding_grads,
        embedding_engine,
        tuple(
            sum(d.values())
            for d in (
                engine_fwd,
                held_units,
                engine_bwd,
                backward_end,
                engine_step,
                embedding_engine,
            )
        ),  # type: ignore[arg-type]
    )


def _embedding_terms(
    i: EstimateInputs,
    engine: str,
    end_grads: int,
    backward_end: dict[str, int],
) -> tuple[int, dict[str, int]]:
    """The gradients and the engine's buffers at a tied embedding's backward, after every
    layer's and before the engine's final reduce: those of the end of backward (DDP's
    buckets, ZeRO 1/2's reduce buckets, ZeRO-1's whole gradients) but the final reduce's
    flattened copy, which comes after (ZeRO-1, which reduces at the accumulation boundary
    only, has no partition yet when its bucket holds every trained parameter); ZeRO-3's
    gathered parameters: the embedding, gathered for its backward; FSDP's root unit gathered with its unsharded gradients (the
    embedding's, the head's, the final norm's) beside the last layer unit's reduce-scatter
    input, in the reduce dtype, which the root's reduce waits on, and every unit's sharded
    gradient but the root's, which its reduce makes (with accumulation the earlier
    micro-batches' is held). None of the gradients under
    `optimizer_in_backward` (each is stepped and freed as it is made)."""
    grads = 0 if i.optimizer_in_backward else end_grads
    if engine == "fsdp":
        cw = compute_bytes(i.precision)
        # the backend's MixedPrecisionPolicy reduces in fp32 under AMP and bf16-true alike
        reduce = 4 if cw == 2 and i.fsdp_reduce_fp32 else cw
        root = _block_params(i)[1]
        layer, _ = _unit_trained(i)
        if grads and i.grad_accum == 1:  # accumulated: the root's shard is held already
            grads -= grads * root // max(1, i.shard_params)
        return grads, {
            "FSDP gathered parameters": backward_end["FSDP gathered parameters"],
            "FSDP unsharded gradients": cw * root + reduce * layer,
        }
    out = {k: v for k, v in backward_end.items() if k != FLAT_REDUCE_TERM}
    if engine == "deepspeed" and i.zero_stage >= 3:
        # the embedding gathered for its backward, in the weights' dtype (fp32 under
        # amp-*, whose weights are fp32): nothing is left to prefetch after it
        arch = i.architecture
        assert arch is not None  # a tied embedding has a shape
        out["ZeRO-3 gathered parameters"] = grad_bytes(i.precision) * arch.embedding_params(
            i.tensor_parallel
        )
    elif (
        engine == "deepspeed"
        and i.zero_stage == 1
        and i.deepspeed["overlap_comm"]
        and not _deepspeed_buffers(i).flat_layers
    ):
        # its hooks reduce at the accumulation boundary only: a bucket that holds every
        # trained parameter has not reduced yet, so no partition exists at the instant
        grads = 0
    return grads, out


__all__ = [
    "FLAT_REDUCE_TERM",
    "REDUCE_BUCKETS_TERM",
    "DeepSpeedBuffers",
    "StepFixed",
    "autocast_casts",
    "compute_bytes",
    "engine_of",
    "fixed_terms",
    "fsdp_unit_params",
    "grad_bytes",
    "trained_params",
]
