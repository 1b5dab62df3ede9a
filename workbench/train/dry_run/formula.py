"""The formula's side of a dry run: the estimate of the same setup the dry run runs.

`formula_of` asks `workbench.estimate.estimate_memory` for the settings the engines use
(the precision, optimizer and its implementation, accumulation, checkpointing, FSDP with
its layout or DeepSpeed with the engine config a Session hands it, the optimizer step in
backward) and the model's transformer shape where one is known; `formula_attention` names
the attention kernel the formula counts for the fake model, with a note when it is a
guess. Each returns the figure and a note saying what the formula cannot describe.
"""

from __future__ import annotations

from typing import Any

from workbench.config import Engine, TrainConfig
from workbench.engines import engine_for
from workbench.estimate.activations import attention_terms
from workbench.train.dry_run.fake import FakeBatch, FakeModel
from workbench.train.techniques.attention import estimator_attention


def formula_attention(fm: FakeModel) -> tuple[str | None, str | None]:
    """The attention kernel the formula counts, and a note when it is a guess."""
    if fm.kind == "built-in":
        return estimator_attention(fm.module) or getattr(fm.info, "attention", None), None
    config = fm.hf_config
    if config is not None:
        return attention_terms(getattr(config, "_attn_implementation", None) or "sdpa"), None
    return "sdpa", (
        "the formula counts sdpa attention (no s^2 tensors): your module's attention kernel "
        "is not known to it"
    )


def formula_of(
    config: TrainConfig,
    fm: FakeModel,
    fb: FakeBatch,
    world_size: Any,
    impl: str,
    attention: str | None,
) -> tuple[Any, str | None]:
    """The formula's estimate of the same setup (the settings the engines run), or None and
    why. DeepSpeed's setups (ZeRO, its 16-bit modes, several ranks without FSDP) are
    counted with DeepSpeed's layout and the engine config the Session hands it."""
    from workbench.estimate import estimate_memory
    from workbench.prediction import estimator_inputs

    deepspeed = engine_for(config, world_size) is Engine.DEEPSPEED
    lora_params = four_bit = four_bit_bytes = None
    if int(config.lora_rank) > 0:  # the adapters the dry run puts on the fake copy
        from workbench.train.techniques.lora import (
            adapter_parameter_count,
            four_bit_weight_bytes,
            four_bit_weight_count,
        )

        lora_params = adapter_parameter_count(fm.module, config)
        if config.qlora:  # and the 4-bit base, layer by layer
            four_bit = four_bit_weight_count(fm.module)
            four_bit_bytes = four_bit_weight_bytes(fm.module, config)
    kwargs = estimator_inputs(
        config,
        world_size,
        lora_params=lora_params,
        qlora_params=four_bit,
        qlora_bytes=four_bit_bytes,
    )
    kwargs.update(micro_batch=fb.micro_batch, optimizer_impl=impl)
    if deepspeed:
        from workbench.train.backends.deepspeed import engine_config

        # the engine sizes its buckets by the trained parameters (LoRA: the adapters)
        trained = lora_params if lora_params is not None else fm.n_params
        kwargs["deepspeed_config"] = engine_config(config, int(world_size), trained)
    info = fm.info
    if fm.kind == "built-in" and info is not None and info.is_transformer:
        kwargs.update(
            n_params=fm.n_params,
            layers=info.layers,
            hidden=info.hidden,
            heads=info.heads,
            seq_len=fb.seq_len or info.seq_len,
            vocab=info.vocab,
            dropout=bool(info.dropout),
            attention=attention or "sdpa",
        )
    elif fm.kind == "transformers" and fm.twin is not None:
        kwargs.update(model=fm.twin, attention=attention or "sdpa")
        if fb.seq_len:
            kwargs["seq_len"] = fb.seq_len
    else:
        kwargs["n_params"] = fm.n_params
    from workbench.train.techniques.lora import holds_lora

    if int(config.lora_rank) > 0 and "n_params" in kwargs and holds_lora(fm.module):
        # a LoRA Session's copy holds its adapters already: the formula adds them to the base
        kwargs["n_params"] -= int(kwargs["lora_params"])
    try:
        estimate = estimate_memory(**kwargs)
    except ValueError as exc:
        return None, f"the formula cannot describe this setup: {exc}"
    if estimate.activation_bytes is None:
        return estimate, (
            "the formula has no transformer shape for this model: it counts model states, "
            "the optimizer's temporaries and the engine's buffers, no activations"
        )
    return estimate, None


__all__ = ["formula_attention", "formula_of"]
