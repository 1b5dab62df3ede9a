"""Activation checkpointing of marked blocks, switched on and off on a live model.

A block is *checkpointable* when it has the attribute `_workbench_checkpointable = True`
(tiny-gpt's transformer blocks are marked). Mark your own blocks with

    from workbench.train.techniques.recompute import mark_checkpointable
    mark_checkpointable(model, ["encoder.layers.0", "encoder.layers.1"])  # by name
    mark_checkpointable(model.encoder.layers)   # every child of a ModuleList/Sequential
    mark_checkpointable(model.block)            # one module

and set `activation_checkpointing="full"` (or True; also live: `session.update(...)`).
While on, each marked block runs under `torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)`: its forward keeps only its inputs and recomputes the rest during
backward (dropout masks are reproduced: the RNG state is preserved). Switching replaces
only the instance's `forward`, so parameter names, state dicts and the module object stay
the same.

`activation_checkpointing="selective"` recomputes less: each attention module with a
boolean `recompute_core` attribute (the built-in GPT's `CausalSelfAttention`) runs its
core (the scores, the masked softmax, the attention dropout and the product with V) under
checkpoint, so the `as^2b` tensors are not kept (Korthikanti et al.'s selective
recomputation; with the sdpa kernel, only its output and log-sum-exp are recomputed). A
transformers model does the same through its attention function
(`workbench.train.techniques.attention.set_hf_selective`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch.utils.checkpoint
from torch import nn

from workbench.export.job_common import CHECKPOINTABLE
from workbench.inputs import shown

#: the mark of a checkpointable block: the exported jobs' attribute (one name, read by both)
_FLAG = CHECKPOINTABLE
_ORIG = "_workbench_orig_forward"
_CORE = "recompute_core"


def mark_checkpointable(target: nn.Module, names: Iterable[str] | None = None) -> list[nn.Module]:
    """Mark blocks for activation checkpointing; returns the marked modules.

    With `names`, marks `target.get_submodule(name)` for each (ValueError naming every
    unknown one). Without, marks `target` itself, or every child when `target` is a
    `ModuleList` or `Sequential`.
    """
    if not isinstance(target, nn.Module):
        raise ValueError(f"target={shown(target)}: must be a torch.nn.Module")
    if names is None:
        modules = list(target) if isinstance(target, (nn.ModuleList, nn.Sequential)) else [target]
    else:
        if isinstance(names, str):
            names = [names]
        modules, unknown = [], []
        for name in names:
            try:
                modules.append(target.get_submodule(name))
            except AttributeError:
                unknown.append(name)
        if unknown:
            raise ValueError(
                f"names={shown(unknown)}: no such submodule(s); e.g. "
                + ", ".join(n for n, _ in list(target.named_modules())[1:6])
            )
    for module in modules:
        setattr(module, _FLAG, True)
    return modules


def checkpointable_modules(model: nn.Module) -> list[nn.Module]:
    """The marked blocks of `model`, outermost first (a marked block's marked children
    are not checkpointed separately)."""
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if getattr(module, _FLAG, False):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def core_recomputable_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that recompute their attention core on request: those with a
    boolean `recompute_core` attribute (the built-in GPT's attention)."""
    return [m for m in model.modules() if isinstance(getattr(m, _CORE, None), bool)]


def selective_supported(model: nn.Module) -> bool:
    """Whether `activation_checkpointing="selective"` has an attention core to recompute:
    the built-in GPT's attention, or a transformers model's attention function."""
    from workbench.train.techniques.attention import hf_selective_supported

    return bool(core_recomputable_modules(model)) or hf_selective_supported(model)


def core_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose attention core selective recomputation checkpoints (the built-in
    GPT's attention, a transformers model's attention modules): each reads its
    `core_inputs_observer` (called with what the checkpoint keeps) and `core_context_fn`
    (the checkpoint's context_fn) while it recomputes."""
    from workbench.train.techniques.attention import hf_attention_modules

    return core_recomputable_modules(model) or hf_attention_modules(model)


def set_activation_checkpointing(model: nn.Module, mode: bool | str) -> int:
    """Switch `model`'s activation recomputation to `mode`: "full" (or True: each marked
    block under checkpoint), "selective" (each attention that offers it recomputes its
    core: `recompute_core = True`), "none" (or False); returns how many blocks or
    attention modules the mode affects (0: nothing to switch)."""
    mode = "full" if mode is True else "none" if mode is False else str(mode)
    if mode not in ("none", "selective", "full"):
        raise ValueError(f"mode={shown(mode)}: must be none, selective or full (or True / False)")
    from workbench.train.techniques.attention import set_hf_selective

    cores = core_recomputable_modules(model)
    for module in cores:
        setattr(module, _CORE, mode == "selective")
    hf = not cores and set_hf_selective(model, mode == "selective")
    enabled = mode == "full"
    blocks = checkpointable_modules(model)
    for block in blocks:
        active = _ORIG in block.__dict__
        if enabled and not active:
            original = block.__dict__.get("forward")
            block.__dict__[_ORIG] = original
            block.forward = functools.partial(_checkpointed, block.forward)  # type: ignore[method-assign]
        elif not enabled and active:
            original = block.__dict__.pop(_ORIG)
            if original is None:
                del block.forward
            else:
                block.forward = original  # type: ignore[method-assign]
    if mode == "selective":
        return len(cores) or (len(core_modules(model)) if hf else 0)
    return len(blocks)


def is_checkpointing(module: nn.Module) -> bool:
    return _ORIG in module.__dict__
