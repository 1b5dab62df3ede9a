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

The attention kernel is the one torch runs on the device at hand (`device`; `sdpa_kernel`):
`scaled_dot_product_attention` picks a fused kernel on a GPU (flash or memory-efficient)
and on a CPU without dropout (its CPU flash kernel), and its math kernel on a CPU when the
attention has dropout (the CPU flash kernel takes none), which keeps the s x s attention
weights; the estimate's `attention` says which it counted.

Pure Python: imports the config and the estimator, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from enum import Enum
from typing import Any

from workbench.config import (
    Documents,
    FsdpMode,
    OffloadDevice,
    TrainConfig,
)
from workbench.engines import ACCOUNTING as ACCOUNTING  # re-exported: the engine rows'
from workbench.engines import accounting_for
from workbench.estimate import Architecture, MemoryEstimate, estimate_memory
from workbench.estimate.activations import attention_terms
from workbench.inputs import shown

SHAPE_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab")


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
    device: str | None = None,
    qlora_bytes: int | None = None,
) -> MemoryEstimate:
    """The estimator's per-rank figure for training `model` with `config` on `world_size`
    ranks (see the module docstring). `accounting`: "paper" or "deepspeed" (default: the
    engine's, `accounting_for`). `gpu`: a catalog GPU name for the fits answer.
    `lora_params`: the exact LoRA adapter count of the module (`lora_rank` > 0; else the
    estimator counts them from the shape, every linear layer of a block a target), and
    `qlora_params` the weights QLoRA holds in 4 bits, `qlora_bytes` their bytes as
    bitsandbytes holds them (`four_bit_weight_bytes`). `device`: the device type it trains on
    ("cuda", "cpu"; None: a GPU's), for the attention kernel torch picks there. Raises
    ValueError (the estimator's, naming every bad input) when it cannot predict."""
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={shown(config)}: must be a workbench.TrainConfig")
    n_params = model if isinstance(model, int) else getattr(model, "n_params", None)
    if not isinstance(n_params, int) or isinstance(n_params, bool) or n_params < 1:
        raise ValueError(
            f"model={shown(model)}: must be a parameter count or a description with n_params >= 1"
        )
    inputs = estimator_inputs(
        config,
        world_size,
        model=model,
        lora_params=lora_params,
        qlora_params=qlora_params,
        qlora_bytes=qlora_bytes,
        device=device,
    )
    if accounting:
        inputs["accounting"] = accounting
    return estimate_memory(n_params=n_params, gpu=gpu, **inputs)


def _text(value: Any) -> str:
    """A choice setting's text: an enum's value, a string as it is."""
    return str(value.value) if isinstance(value, Enum) else str(value)


def _offloaded(value: Any) -> bool:
    return OffloadDevice(value) is not OffloadDevice.NONE


#: TrainConfig field -> (estimator keyword, how its value reads there): the settings that
#: mean the same to both; `estimator_inputs` adds the rest (world size, attention, LoRA).
_SAME: dict[str, tuple[str, Any]] = {
    "precision": ("precision", _text),
    "optimizer": ("optimizer", _text),
    "zero_stage": ("zero_stage", int),
    "tp": ("tensor_parallel", int),
    "pp": ("pipeline_parallel", int),
    "sequence_parallel": ("sequence_parallel", bool),
    "micro_batch": ("micro_batch", int),
    "activation_checkpointing": ("checkpointing", _text),
    "offload_optimizer": ("offload_optimizer", _offloaded),
    "offload_params": ("offload_params", _offloaded),
    "fsdp": ("fsdp", lambda v: FsdpMode(v).value),
    "fsdp_reduce_fp32": ("fsdp_reduce_fp32", bool),
    "fsdp_units": ("fsdp_units", lambda v: units_policy(str(v))),
    "grad_accum": ("grad_accum", int),
    "weight_decay": ("weight_decay", float),
    "optimizer_in_backward": ("optimizer_in_backward", bool),
    "activation_offload": ("activation_offload", bool),
    "documents": ("document_mask", lambda v: Documents(v) is not Documents.STREAM),
    "compile": ("compile", bool),
}

#: The TrainConfig fields `estimator_inputs` reads (each `Setting.moves_memory`).
ESTIMATOR_FIELDS = frozenset(
    {*_SAME, "attention", "lora_rank", "lora_dropout", "qlora", "lora_dtype"}
)


def estimator_inputs(
    config: TrainConfig | Mapping[str, Any],
    world_size: int = 1,
    *,
    model: Any = None,
    lora_params: int | None = None,
    qlora_params: int | None = None,
    device: str | None = None,
    qlora_bytes: int | None = None,
) -> dict[str, Any]:
    """The `estimate_memory` keywords of training `model` with `config` on `world_size`
    ranks: the one mapping TrainConfig -> estimator inputs, used by the prediction
    (`predict_memory`), the dry run's formula and the planner.

    `config` is a TrainConfig (every setting read; the accounting is its engine's,
    `accounting_for`) or a mapping of TrainConfig settings (the planner's: only those it
    holds are read, no engine decided, the estimator's accounting). `model`: a model
    description (`shape_of`; None: none, the caller gives the model); the attention kernel
    is translated with the model's own (`attention_terms`) when it has a shape. LoRA:
    `lora_params` / `qlora_params` as in `predict_memory`. `device`: the device type it
    trains on (None: a GPU's), for the sdpa kernel torch picks there (`sdpa_kernel`)."""
    if isinstance(config, TrainConfig):
        values = {f.name: getattr(config, f.name) for f in fields(config)}
    else:
        values = dict(config)
    out: dict[str, Any] = {"gpus": int(world_size)}
    for name, (keyword, read) in _SAME.items():
        if name in values:
            out[keyword] = read(values[name])
    out.update(lora_inputs(values, lora_params, qlora_params, qlora_bytes))
    if isinstance(config, TrainConfig):
        out["accounting"] = accounting_for(config, world_size)
    shape = shape_of(model)
    if shape:
        kernel = attention_terms(_text(values.get("attention", "model")), shape.get("attention"))
        kernel = sdpa_kernel(kernel, device, bool(shape.get("dropout", False)))
        shape = {**shape, "attention": kernel} if kernel is not None else shape
    out.update(shape)
    return out


def units_policy(units: str) -> str:
    """The estimator's `fsdp_units` for a TrainConfig's: its keyword ("blocks",
    "blocks-only"), and for a list of module names "blocks-only" (what the list leaves out
    is gathered with the root: the larger count when it names the blocks; the dry run
    measures the list itself)."""
    text = units.strip()
    return text if text in ("blocks", "blocks-only") else "blocks-only"


def sdpa_kernel(kernel: str | None, device: str | None, dropout: bool) -> str | None:
    """The attention terms of `kernel` (the estimator's words) on `device` as torch's sdpa
    backend selection decides (torch 2.x: aten/src/ATen/native/transformers/sdp_utils_cpp.cpp
    `select_sdp_backend_cpp`: the CPU flash kernel unless a check refuses it, and
    `check_for_dropout` refuses a dropout above 0; on CUDA, sdp_utils.cpp picks flash or
    memory-efficient, both with dropout): "sdpa" on a CPU with dropout becomes "math" (its
    math kernel, `activations.Attention.MATH`); every other kernel is what it says. Measured
    on a CPU: tests/integration/test_attention_kernel.py."""
    if kernel == "sdpa" and device == "cpu" and dropout:
        return "math"
    return kernel


def lora_inputs(
    config: TrainConfig | Mapping[str, Any],
    params: int | None,
    quantized: int | None,
    quantized_bytes: int | None = None,
) -> dict[str, Any]:
    """The estimator's LoRA inputs of `config` (a TrainConfig or a mapping of its settings;
    none when `lora_rank` is 0). The Session's targets are module names; the shape's
    figures count every linear layer of a block (`lora_params`, when given, is the exact
    adapter count; `qlora_params` and `qlora_bytes` the 4-bit base's weights and bytes)."""
    get = (lambda n, d: getattr(config, n)) if isinstance(config, TrainConfig) else config.get
    rank = int(get("lora_rank", 0))
    if rank == 0:
        return {}
    out: dict[str, Any] = {"lora_rank": rank, "lora_targets": "all-linear", "lora_params": params}
    if get("lora_dropout", None) is not None:
        out["lora_dropout"] = float(get("lora_dropout", None))
    qlora = get("qlora", None)
    if qlora is not None:
        out["qlora"] = bool(qlora)
        if qlora:
            out["qlora_params"] = quantized
            out["qlora_bytes"] = quantized_bytes
    dtype = get("lora_dtype", None)
    if dtype is not None:
        out["lora_dtype"] = _text(dtype)
    return out
