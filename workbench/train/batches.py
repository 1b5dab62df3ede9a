"""The data contract: how a batch reaches the model and becomes a loss.

Two batch shapes, checked on one batch when a Session is built:

* an `(inputs, targets)` pair (tuple or list of two): `outputs = model(inputs)`, then
  `loss = loss_fn(outputs, targets)`; `loss_fn` is required.
* a mapping of the model's keyword arguments (Hugging Face style, e.g.
  `{"input_ids": ..., "attention_mask": ..., "labels": ...}`): `outputs = model(**batch)`,
  then `loss = loss_fn(outputs, batch)` when a `loss_fn` is given (it receives the whole
  batch, as the Hugging Face Trainer's `compute_loss` does), else the output's own loss:
  `outputs.loss` or `outputs["loss"]` (a model given `labels` computes it). A model whose
  forward takes `use_cache` (a transformers model) gets `use_cache=False` unless the batch
  says otherwise: a training step needs no KV cache, and a block that fills one as it
  runs cannot be recomputed under activation checkpointing (T5's decoder).

`loss_fn` always receives fp32 outputs: 16-bit floating tensors in the output (a tensor,
or the fields of an output object, a dict, a tuple) are cast to fp32 first, so the loss
is computed in fp32 whatever the precision setting. The forward runs inside the backend's
autocast context; the loss outside it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

LossFn = Callable[[Any, Any], torch.Tensor]

EXPECTED = (
    "each batch must be an (inputs, targets) pair, with loss_fn(outputs, targets), or a "
    "mapping of the model's keyword arguments such as {'input_ids': ..., 'labels': ...} "
    "(model(**batch); the output's .loss is the loss unless you pass loss_fn(outputs, batch))"
)


class DataContractError(ValueError):
    """A batch or a model output that does not fit the data contract."""


def _is_pair(batch: Any) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2


def describe(batch: Any) -> str:
    """A short description of a batch's structure for error messages."""
    if isinstance(batch, torch.Tensor):
        return f"a tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, Mapping):
        return f"a {type(batch).__name__} with keys {sorted(map(str, batch))}"
    if isinstance(batch, (tuple, list)):
        return f"a {type(batch).__name__} of length {len(batch)}"
    return f"a {type(batch).__name__}"


def check_batch(batch: Any, loss_fn: LossFn | None) -> None:
    """ValueError naming what is expected unless `batch` fits the contract."""
    if isinstance(batch, Mapping):
        if not batch:
            raise DataContractError(f"data: the first batch is an empty mapping; {EXPECTED}")
        return
    if _is_pair(batch):
        if loss_fn is None:
            raise DataContractError(
                "loss_fn=None: batches are (inputs, targets) pairs, so a loss_fn(outputs, "
                "targets) is required (only a model fed with mapping batches can return its "
                "own .loss)"
            )
        return
    raise DataContractError(f"data: the first batch is {describe(batch)}; {EXPECTED}")


def to_fp32(out: Any) -> Any:
    """`out` with every 16-bit floating tensor cast to fp32 (tensors, mappings and
    output objects, tuples and lists; other values unchanged)."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out
    if isinstance(out, Mapping):
        converted = {k: to_fp32(v) for k, v in out.items()}
        if all(converted[k] is out[k] for k in converted):
            return out
        try:
            return type(out)(**converted)  # dataclass-like outputs (Hugging Face ModelOutput)
        except TypeError:
            try:
                return type(out)(converted)
            except TypeError:
                return converted
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(to_fp32(v) for v in out)
    if isinstance(out, list):
        return [to_fp32(v) for v in out]
    return out


def output_loss(out: Any) -> torch.Tensor:
    """The loss a model returned itself: `out.loss` or `out["loss"]`."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if not isinstance(loss, torch.Tensor):
        raise DataContractError(
            f"loss_fn=None: the model's output ({type(out).__name__}) has no loss tensor "
            "(.loss or ['loss']); include 'labels' in each batch so the model computes its "
            "loss, or pass loss_fn(outputs, batch)"
        )
    return loss.float()


#: the wrappers whose `.module` is the model they call with the same arguments
_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel", "DeepSpeedEngine"})


@functools.lru_cache(maxsize=256)
def _takes_use_cache(cls: type) -> bool:
    try:
        return "use_cache" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature to read
        return False


def _without_cache(module: nn.Module, batch: Mapping[str, Any]) -> bool:
    """Whether `module(**batch)` should add `use_cache=False` (the module docstring)."""
    if "use_cache" in batch:
        return False
    while type(module).__name__ in _WRAPPERS and isinstance(
        getattr(module, "module", None), nn.Module
    ):
        module = module.module
    return _takes_use_cache(type(module))


def forward(module: nn.Module, batch: Any) -> Any:
    """The model's output for one batch (see the module docstring)."""
    if isinstance(batch, Mapping):
        if _without_cache(module, batch):
            return module(**batch, use_cache=False)
        return module(**batch)
    if not _is_pair(batch):
        raise DataContractError(f"data: a batch is {describe(batch)}; {EXPECTED}")
    return module(batch[0])


def loss_of(out: Any, batch: Any, loss_fn: LossFn | None) -> torch.Tensor:
    """The fp32 loss of one batch's output."""
    if loss_fn is None:
        return output_loss(out)
    targets = batch if isinstance(batch, Mapping) else batch[1]
    return loss_fn(to_fp32(out), targets)


def forward_and_loss(
    module: nn.Module,
    batch: Any,
    loss_fn: LossFn | None,
    autocast: Callable[[], AbstractContextManager[Any]],
    loss_context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> torch.Tensor:
    """Forward inside `autocast()`, loss outside it, in fp32; inside `loss_context()` when
    given (the tensor-parallel engine's vocabulary-parallel loss, whose DTensor loss comes
    back as this rank's local, replicated value, still differentiable)."""
    with autocast():
        out = forward(module, batch)
    if loss_context is None:
        return loss_of(out, batch, loss_fn)
    with loss_context():
        loss = loss_of(out, batch, loss_fn)
    to_local = getattr(loss, "to_local", None)
    return to_local() if callable(to_local) else loss
