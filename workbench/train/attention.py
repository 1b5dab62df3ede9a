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
"""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.config import Attention
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
    return "eager" if config._attn_implementation == "eager" else "sdpa"


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
