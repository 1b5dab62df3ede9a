"""One prediction per setup: (TrainConfig, model description, world size) -> MemoryEstimate.

Every caller that shows a prediction next to a training setup uses `predict_memory`:
`Session.memory()` and `Session.predict()`, the training panel's "predicted" bars (through
`Session.predict()`), `workbench launch` (per rank) and `workbench export` (per GPU). So
one setup has one prediction everywhere.

The model description is anything with `n_params` and, for a decoder-only transformer,
`layers`, `hidden`, `heads`, `seq_len` and `vocab` (a built-in model's
`workbench.models.ModelInfo`), or a plain parameter count (model states only: no
activation prediction). The accounting follows the engine that runs the setup: DeepSpeed's
real layout ("deepspeed": fp32 master partitions, flat buffers, reduce buckets) whenever
DeepSpeed trains it (ZeRO, DeepSpeed 16-bit, several ranks), FSDP2's ("fsdp") under
`fsdp`, the ZeRO paper's otherwise.

Pure Python: imports the config and the estimator, no torch.
"""

from __future__ import annotations

from typing import Any

from workbench.config import (
    Attention,
    Documents,
    Engine,
    FsdpMode,
    OffloadDevice,
    TrainConfig,
)
from workbench.engines import engine_for
from workbench.estimate import Architecture, MemoryEstimate, estimate_memory
from workbench.inputs import shown

SHAPE_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab")


#: The estimator's accounting for each engine's memory layout.
ACCOUNTING: dict[Engine, str] = {
    Engine.FSDP: "fsdp",
    Engine.DEEPSPEED: "deepspeed",
    Engine.PLAIN: "paper",
    Engine.TENSOR_PARALLEL: "paper",  # FSDP2's layout over the data-parallel ranks with `fsdp`
    Engine.PIPELINE: "paper",
}


def accounting_for(config: TrainConfig, world_size: int = 1) -> str:
    """The estimator accounting of the engine that trains `config` on `world_size` ranks
    (`engine_for`): FSDP2's layout under FSDP, DeepSpeed's under DeepSpeed, else the ZeRO
    paper's."""
    engine = engine_for(config, world_size)
    if engine is Engine.TENSOR_PARALLEL and FsdpMode(config.fsdp) is not FsdpMode.OFF:
        return ACCOUNTING[Engine.FSDP]
    return ACCOUNTING[engine]


def shape_of(model: Any) -> dict[str, Any]:
    """The transformer shape of a model description (empty when it has none): its
    `architecture` (an `Architecture`, e.g. a transformers module's from its config) or
    its shape fields, with its dropout and attention kernel when it says."""
    if isinstance(model, int) or model is None:
        return {}
    arch = getattr(model, "architecture", None)
    if isinstance(arch, Architecture):
        shape: dict[str, Any] = {"model": arch}
    else:
        values = {name: getattr(model, name, None) for name in SHAPE_FIELDS}
        if any(v is None for v in values.values()):
            return {}
        shape = {k: int(v) for k, v in values.items() if v is not None}
    rate = getattr(model, "dropout", None)
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        shape["dropout"] = rate > 0  # no dropout: no masks to keep
    attention = getattr(model, "attention", None)
    if isinstance(attention, str):
        shape["attention"] = attention
    return shape


def predict_memory(
    config: TrainConfig,
    model: Any,
    world_size: int = 1,
    *,
    accounting: str | None = None,
    gpu: str | None = None,
    lora_params: int | None = None,
    qlora_params: int | None = None,
) -> MemoryEstimate:
    """The estimator's per-rank figure for training `model` with `config` on `world_size`
    ranks (see the module docstring). `accounting`: "paper" or "deepspeed" (default: the
    engine's, `accounting_for`). `gpu`: a catalog GPU name for the fits answer.
    `lora_params`: the exact LoRA adapter count of the module (`lora_rank` > 0; else the
    estimator counts them from the shape, every linear layer of a block a target), and
    `qlora_params` the weights QLoRA holds in 4 bits. Raises
    ValueError (the estimator's, naming every bad input) when it cannot predict."""
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={shown(config)}: must be a workbench.TrainConfig")
    n_params = model if isinstance(model, int) else getattr(model, "n_params", None)
    if not isinstance(n_params, int) or isinstance(n_params, bool) or n_params < 1:
        raise ValueError(
            f"model={shown(model)}: must be a parameter count or a description with n_params >= 1"
        )
    return estimate_memory(
        n_params=n_params,
        precision=str(config.precision),
        optimizer=str(config.optimizer),
        zero_stage=int(config.zero_stage),
        gpus=int(world_size),
        tensor_parallel=int(config.tp),
        pipeline_parallel=int(config.pp),
        sequence_parallel=bool(config.sequence_parallel),
        micro_batch=int(config.micro_batch),
        checkpointing=str(config.activation_checkpointing),
        offload_optimizer=OffloadDevice(config.offload_optimizer) is not OffloadDevice.NONE,
        offload_params=OffloadDevice(config.offload_params) is not OffloadDevice.NONE,
        fsdp=FsdpMode(config.fsdp).value,
        fsdp_reduce_fp32=bool(config.fsdp_reduce_fp32),
        grad_accum=int(config.grad_accum),
        weight_decay=float(config.weight_decay),
        optimizer_in_backward=bool(config.optimizer_in_backward),
        **lora_inputs(config, lora_params, qlora_params),
        activation_offload=bool(config.activation_offload),
        document_mask=Documents(config.documents) is not Documents.STREAM,
        accounting=accounting or accounting_for(config, world_size),
        gpu=gpu,
        **_with_attention(shape_of(model), Attention(config.attention)),
    )


def lora_inputs(config: TrainConfig, params: int | None, quantized: int | None) -> dict[str, Any]:
    """The estimator's LoRA inputs of `config` (none when `lora_rank` is 0). The Session's
    targets are module names; the shape's figures count every linear layer of a block
    (`lora_params`, when given, is the exact adapter count)."""
    if int(config.lora_rank) == 0:
        return {}
    return {
        "lora_rank": int(config.lora_rank),
        "lora_targets": "all-linear",
        "lora_params": params,
        "lora_dropout": float(config.lora_dropout),
        "qlora": bool(config.qlora),
        **({"qlora_params": quantized} if config.qlora else {}),
    }


def _with_attention(shape: dict[str, Any], kernel: Attention) -> dict[str, Any]:
    """The shape with the estimator's attention terms for the config's kernel: "sdpa" as
    is; "eager" the model's own unfused kernel (the built-in GPT's is Megatron's, its
    softmax output kept in the compute dtype; a transformers model's keeps fp32)."""
    if not shape or kernel is Attention.MODEL:
        return shape
    if kernel is Attention.SDPA:
        return {**shape, "attention": "sdpa"}
    own = shape.get("attention")
    return {**shape, "attention": "megatron" if own == "megatron" else "eager"}
