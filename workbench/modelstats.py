"""The one parameter counter: a torch module's parameters, shared weights counted once,
DeepSpeed ZeRO-3's partitioned parameters at their full size. Every caller (Session,
ranks, the estimator's module path, the built-in models) counts with it."""

from __future__ import annotations

from typing import Any

import torch

from workbench.inputs import shown


def count_parameters(module: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameters of `module`, each shared (tied) weight counted once.

    A weight is shared when the same `Parameter` object is registered twice (tied
    embeddings) or when two `Parameter`s view the same storage with the same offset,
    shape and strides. Parameters on the `meta` device are deduplicated by identity
    only (they have no storage). A parameter DeepSpeed ZeRO-3 partitioned (an empty tensor
    with `ds_numel`) counts `ds_numel`, and an FSDP-sharded DTensor its global size. `trainable_only` counts parameters
    with `requires_grad=True`.
    """
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"module={type(module).__name__}: must be a torch.nn.Module")
    if not isinstance(trainable_only, bool):
        raise ValueError(f"trainable_only={shown(trainable_only)}: must be True or False")
    seen: set[Any] = set()
    total = 0
    for p in module.parameters():  # already skips repeats of the same Parameter object
        if trainable_only and not p.requires_grad:
            continue
        full = getattr(p, "ds_numel", None)
        if isinstance(full, int):  # ZeRO-3 partitioned: this rank holds a shard or nothing
            total += full
            continue
        if hasattr(p, "_local_tensor") or hasattr(p, "__tensor_flatten__"):
            # an FSDP DTensor (numel() is the full size) or a tensor subclass over inner
            # tensors (QLoRA's NF4 weight), which has no storage of its own to key on
            total += p.numel()
            continue
        if p.device.type != "meta" and p.numel() > 0:
            key = (
                p.device,
                p.untyped_storage().data_ptr(),
                p.storage_offset(),
                tuple(p.shape),
                p.stride(),
            )
            if key in seen:
                continue
            seen.add(key)
        total += p.numel()
    return total


def parameter_shapes(module: torch.nn.Module) -> tuple[tuple[int, ...], ...]:
    """The shapes of `module`'s trainable parameters, in its order, each shared (tied)
    weight once as `count_parameters` counts it (an FSDP DTensor's global shape)."""
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"module={type(module).__name__}: must be a torch.nn.Module")
    seen: set[Any] = set()
    shapes: list[tuple[int, ...]] = []
    for p in module.parameters():
        if not p.requires_grad:
            continue
        if p.device.type != "meta" and p.numel() > 0 and not hasattr(p, "_local_tensor"):
            key = (p.device, p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape))
            if key in seen:
                continue
            seen.add(key)
        shapes.append(tuple(int(d) for d in p.shape))
    return tuple(shapes)
