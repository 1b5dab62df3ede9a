"""The attention kernel a Session trains with (`TrainConfig.attention`), switched on the
module itself: nothing is rebuilt, the weights and optimizer state stay as they are.

* The built-in GPT (`workbench.models.gpt.CausalSelfAttention`): each attention module's
  `kernel` is "eager" (written out: its scores and probabilities kept for backward, the
  estimator's "megatron" terms) or "sdpa" (`F.scaled_dot_product_attention`).
* A `transformers` model: its `attn_implementation` ("eager": fp32 softmax, the scores
  kept; "sdpa"), through `set_attn_implementation` where the installed transformers has it.
* "model" leaves (or puts back) the kernel the module had when the workbench first saw it.

`attention_problem` says why a module cannot take a kernel (a module of your own that is
neither: the setting has nothing to switch), `set_attention` switches it, and
`estimator_attention` names the estimator's attention terms for the kernel in effect.

Selective recomputation of a transformers model (`set_hf_selective`, what
`activation_checkpointing="selective"` switches): the kernel K runs as the attention
function "workbench_selective_K" registered with transformers' `AttentionInterface`, which
calls K's function under `torch.utils.checkpoint`: the attention core (for eager: the
scores, softmax, dropout and product with V; for sdpa: the kernel, its output and
log-sum-exp) is recomputed in backward, and only its inputs (q, k, v, the mask) are kept.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from workbench.config import Attention
from workbench.inputs import shown
from workbench.problems import SettingProblem

#: Where the kernel a module had when first seen is kept (a module attribute).
_ORIGINAL = "_workbench_attention_original"


def _builtin_layers(model: nn.Module) -> list[nn.Module]:
    from workbench.models.gpt import CausalSelfAttention

    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


def _hf_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "_attn_implementation"):
        return config
    return None


def attention_problem(model: nn.Module, value: Any) -> SettingProblem | None:
    """Why `model` cannot train with attention `value` (None when it can)."""
    kernel = Attention(value)
    if kernel is Attention.MODEL or _builtin_layers(model):
        return None
    config = _hf_config(model)
    if config is None:
        return SettingProblem(
            "attention",
            kernel.value,
            "the model is neither the built-in GPT nor a transformers model, so there is no "
            "attention kernel to switch: keep 'model' (your module's own attention)",
        )
    if kernel is Attention.SDPA and not getattr(model, "_supports_sdpa", True):
        return SettingProblem(
            "attention",
            kernel.value,
            f"{type(model).__name__} does not support sdpa in this transformers version",
        )
    return None


def current_attention(model: nn.Module) -> str | None:
    """The kernel in effect: "eager" or "sdpa" (None for a module of your own)."""
    layers = _builtin_layers(model)
    if layers:
        return str(layers[0].kernel)
    config = _hf_config(model)
    if config is None:
        return None
    base = str(config._attn_implementation).removeprefix(SELECTIVE)
    return "eager" if base == "eager" else "sdpa"


#: the prefix of the attention functions that recompute their core (selective recomputation)
SELECTIVE = "workbench_selective_"


def hf_attention_modules(model: nn.Module) -> list[nn.Module]:
    """A transformers model's attention modules (what its attention function is called
    with); empty for other models."""
    if _hf_config(model) is None:
        return []
    return [
        m
        for m in model.modules()
        if type(m).__name__.endswith("Attention") and hasattr(m, "config")
    ]


def hf_selective_supported(model: nn.Module) -> bool:
    """Whether `model` is a transformers model whose attention implementation can be
    switched (`set_attn_implementation`) to one that recomputes its core."""
    return _hf_config(model) is not None and callable(
        getattr(model, "set_attn_implementation", None)
    )


def set_hf_selective(model: nn.Module, on: bool) -> bool:
    """Switch a transformers model's attention core recomputation on or off, keeping its
    kernel; False (nothing done) for other models."""
    if not hf_selective_supported(model):
        return False
    config = _hf_config(model)
    name = str(config._attn_implementation)
    base = name.removeprefix(SELECTIVE)
    target = _selective_name(base) if on else base
    if target != name:
        model.set_attn_implementation(target)  # type: ignore[operator]
    return True


def _selective_name(base: str) -> str:
    """The registered attention function "workbench_selective_<base>" (registered once)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = SELECTIVE + base
    if name not in ALL_ATTENTION_FUNCTIONS:
        # the same attention mask as the kernel's own: transformers builds a model's mask
        # by its attention implementation's name, and builds none for a name it does not
        # know (an eager kernel would then attend to later tokens)
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        masks = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
        if base not in masks:
            raise ValueError(
                f"activation_checkpointing='selective': no attention mask function for the "
                f"{shown(base)} kernel in this transformers version; use 'full'"
            )
        AttentionMaskInterface.register(name, masks[base])
        AttentionInterface.register(name, _recomputed(base))
    return name


def _base_function(base: str, module: nn.Module) -> Any:
    """transformers' attention function `base` for `module`: the registered one, or for
    "eager" the model file's own `eager_attention_forward`."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base != "eager" and base in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[base]
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise ValueError(
            f"activation_checkpointing='selective': {type(module).__name__} has no "
            f"attention function {shown(base)} to recompute; use 'full'"
        )
    return fn


def _recomputed(base: str) -> Any:
    def attend(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> Any:
        fn = _base_function(base, module)
        if not torch.is_grad_enabled():
            return fn(module, query, key, value, attention_mask, **kwargs)
        observer = getattr(module, "core_inputs_observer", None)
        if observer is not None:  # Session.memory(): what the checkpoint keeps
            for t in (query, key, value, attention_mask):
                if isinstance(t, torch.Tensor):
                    observer(t)
        context_fn = getattr(module, "core_context_fn", None)
        extra = {"context_fn": context_fn} if context_fn is not None else {}

        def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> Any:
            return fn(module, q, k, v, mask, **kwargs)

        return torch.utils.checkpoint.checkpoint(
            core, query, key, value, attention_mask, use_reentrant=False, **extra
        )

    return attend


def set_attention(model: nn.Module, value: Any) -> None:
    """Switch `model` to attention `value` (checked with `attention_problem` first)."""
    kernel = Attention(value)
    now = current_attention(model)
    if now is None:
        return
    if not hasattr(model, _ORIGINAL):
        setattr(model, _ORIGINAL, now)
    wanted = getattr(model, _ORIGINAL) if kernel is Attention.MODEL else kernel.value
    if wanted == now:
        return
    layers = _builtin_layers(model)
    for layer in layers:
        layer.kernel = wanted
    if layers:
        return
    if str(_hf_config(model)._attn_implementation).startswith(SELECTIVE):
        wanted = _selective_name(wanted)  # the core recomputed, as before the switch
    switch = getattr(model, "set_attn_implementation", None)
    if callable(switch):
        switch(wanted)
    else:  # older transformers: the config the attention modules read
        _hf_config(model)._attn_implementation = wanted


def estimator_attention(model: nn.Module) -> str | None:
    """The estimator's attention terms for the kernel in effect: the built-in GPT's eager
    is Megatron's unfused kernel ("megatron": the softmax output kept in the compute
    dtype), a transformers model's eager keeps the fp32 softmax ("eager"); "sdpa" both."""
    now = current_attention(model)
    if now == "eager" and _builtin_layers(model):
        return "megatron"
    return now


__all__ = ["attention_problem", "current_attention", "estimator_attention", "set_attention"]
