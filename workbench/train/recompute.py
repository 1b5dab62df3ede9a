"""Activation checkpointing of marked blocks, switched on and off on a live model.

A block is *checkpointable* when it has the attribute `_workbench_checkpointable = True`
(tiny-gpt's transformer blocks are marked). Mark your own blocks with

    from workbench.train.recompute import mark_checkpointable
    mark_checkpointable(model, ["encoder.layers.0", "encoder.layers.1"])  # by name
    mark_checkpointable(model.encoder.layers)   # every child of a ModuleList/Sequential
    mark_checkpointable(model.block)            # one module

and set `activation_checkpointing=True` (also live: `session.update(...)`). While on,
each marked block runs under `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`:
its forward keeps only its inputs and recomputes the rest during backward (dropout masks
are reproduced: the RNG state is preserved). Switching replaces only the instance's
`forward`, so parameter names, state dicts and the module object stay the same.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch.utils.checkpoint
from torch import nn

_FLAG = "_workbench_checkpointable"
_ORIG = "_workbench_orig_forward"


def mark_checkpointable(target: nn.Module, names: Iterable[str] | None = None) -> list[nn.Module]:
    """Mark blocks for activation checkpointing; returns the marked modules.

    With `names`, marks `target.get_submodule(name)` for each (ValueError naming every
    unknown one). Without, marks `target` itself, or every child when `target` is a
    `ModuleList` or `Sequential`.
    """
    if not isinstance(target, nn.Module):
        raise ValueError(f"target={target!r}: must be a torch.nn.Module")
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
                f"names={unknown!r}: no such submodule(s); e.g. "
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


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> int:
    """Switch checkpointing of `model`'s marked blocks; returns how many are affected."""
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
    return len(blocks)


def is_checkpointing(module: nn.Module) -> bool:
    return _ORIG in module.__dict__
