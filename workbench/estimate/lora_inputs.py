"""The LoRA and QLoRA inputs of `estimate_memory` (`lora_rank`, `lora_targets`,
`lora_params`, `lora_dropout`, `qlora`, `qlora_params`, `qlora_bytes`, `lora_dtype`) read
and checked against the rest of the setup, as `lora.LoraFacts` (`inputs_check` calls
`lora_inputs` with the problems it collects).

Pure Python: imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.config import Precision
from workbench.estimate.lora import LORA_DTYPES, LoraFacts, lora_facts
from workbench.estimate.problems import Problem
from workbench.estimate.readers import checked, flag
from workbench.estimate.schema import choices_of


def lora_inputs(
    p: list[Problem],
    given: Mapping[str, Any],
    arch: Any,
    tp: int | None,
    pp: int | None,
    prec: Precision | None,
) -> LoraFacts | None:
    """The LoRA inputs (`lora_rank`, `lora_targets`, `lora_params`, `lora_dropout`,
    `qlora`) checked, as `LoraFacts` (None when `lora_rank` is 0)."""
    rank = given["lora_rank"]
    if (  # no LoRA, the others at their defaults: nothing to check
        rank == 0
        and type(rank) is int
        and given["qlora"] is False
        and given["lora_params"] is None
        and given["qlora_params"] is None
        and type(given["lora_dropout"]) is float
        and given["lora_dropout"] == 0.0
        and given["lora_targets"] == "all-linear"
    ):
        return None
    rank = checked(p, "lora_rank", given["lora_rank"])
    dropout = checked(p, "lora_dropout", given["lora_dropout"])
    qlora = flag(p, "qlora", given["qlora"])
    targets = given["lora_targets"]
    allowed = choices_of("lora_targets")
    if not isinstance(targets, str) or targets.strip().lower() not in allowed:
        p.append(Problem("lora_targets", targets, f"must be one of {', '.join(allowed)}"))
        targets = None
    params = given["lora_params"]
    if params is not None:
        params = checked(p, "lora_params", params)
    quantized = given["qlora_params"]
    if quantized is not None:
        quantized = checked(p, "qlora_params", quantized)
    if qlora is True and rank == 0:
        p.append(
            Problem("qlora", True, "trains LoRA adapters over a 4-bit base: needs lora_rank >= 1")
        )
    if not rank:
        if params is not None:
            p.append(Problem("lora_params", params, "counts LoRA adapters: needs lora_rank >= 1"))
        return None
    if (tp or 1) > 1 or (pp or 1) > 1:
        p.append(
            Problem(
                "lora_rank",
                rank,
                "counted for data parallelism (ZeRO or FSDP sharding included) without "
                "tensor or pipeline parallelism (tensor_parallel=1, pipeline_parallel=1)",
            )
        )
    if qlora is True and prec is not None and prec.is_deepspeed:
        p.append(
            Problem(
                "qlora",
                True,
                "keeps a 4-bit base under a torch precision (fp32, amp-bf16, amp-fp16, "
                f"bf16-true); precision={prec.value} is DeepSpeed's 16-bit mode, whose "
                "engine casts every weight to its dtype",
            )
        )
    dtype = given["lora_dtype"]
    if not isinstance(dtype, str) or dtype.strip().lower() not in LORA_DTYPES:
        p.append(Problem("lora_dtype", dtype, f"must be one of {', '.join(LORA_DTYPES)}"))
        dtype = None
    elif dtype.strip().lower() == "fp32" and prec is not None and prec.is_deepspeed:
        p.append(
            Problem(
                "lora_dtype",
                dtype,
                f"fp32 adapters over a bf16 base: precision={prec.value} is DeepSpeed's 16-bit "
                "mode, whose engine casts every weight, the adapters' too, to its dtype; use "
                "'auto'",
            )
        )
    quantized_bytes = given["qlora_bytes"]
    if quantized_bytes is not None:
        quantized_bytes = checked(p, "qlora_bytes", quantized_bytes)
        if qlora is not True:
            p.append(
                Problem(
                    "qlora_bytes", quantized_bytes, "counts QLoRA's 4-bit base: needs qlora=True"
                )
            )
    if qlora is True and arch is None and quantized is None:
        p.append(
            Problem(
                "qlora",
                True,
                "needs the model's shape or qlora_params, the base weights held in 4 bits",
                needs_model=True,
            )
        )
    if arch is None and params is None:
        p.append(
            Problem(
                "lora_rank",
                rank,
                "needs the model's shape (a preset, config or module) or lora_params, the "
                "adapters' parameter count",
                needs_model=True,
            )
        )
    if (
        targets is None
        or dropout is None
        or not isinstance(qlora, bool)
        or rank is None
        or dtype is None
    ):
        return None
    return lora_facts(
        arch,
        int(rank),
        targets.strip().lower(),
        params,
        float(dropout),
        qlora,
        quantized,
        quantized_bytes,
        dtype.strip().lower(),
        # FSDP2 trains torchao's NF4 tensor, in the weights' dtype (bf16 under bf16-true)
        "torchao" if _fsdp_on(given["fsdp"]) else "bitsandbytes",
        2 if prec is Precision.BF16_TRUE else 4,
    )


def _fsdp_on(value: Any) -> bool:
    """Whether an `fsdp` input names an FSDP mode (its own check reports a bad one)."""
    return isinstance(value, str) and value.strip().lower() not in ("off", "")


__all__ = ["lora_inputs"]
