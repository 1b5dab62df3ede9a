"""Magnitude pruning, made permanent: zeroed weights, or whole channels and heads removed.

    sparse = prune_unstructured(model, 0.5)          # half of all linear/conv weights -> 0
    narrow = prune_structured(model, 0.5)            # half of the channels of each group
    fewer = prune_structured(gpt, 0.5, unit="heads") # half of the attention heads

* Unstructured (`torch.nn.utils.prune.global_unstructured` with `L1Unstructured`): the
  `sparsity` fraction of the smallest-magnitude weights over all chosen layers together
  (a global threshold: layers with smaller weights lose more) are set to zero, then
  `prune.remove` folds the mask into the weight, so the result is a plain model with
  zeros in it. The tensors keep their dense shape: the model is as large and, on dense
  kernels (CPUs and GPUs alike, without 2:4 sparse kernels), as fast as before.
* Structured (`workbench.compress.structure`): in each group of layers it can trace, the
  `sparsity` fraction of units (rounded down, at least one kept) with the smallest L2
  norm is removed and the layers are rebuilt smaller. The model shrinks and does less work.

Both return a copy (`Compressed.model`); your model is untouched. Fine-tuning the pruned
copy afterwards recovers quality; unstructured zeros can then grow back (keep
`torch.nn.utils.prune`'s masks yourself to prevent that).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from torch import nn
from torch.nn.utils import prune

from workbench.compress.layers import (
    ALREADY,
    PRUNABLE,
    Compressed,
    MethodProblem,
    check_model,
    check_sparsity,
    plain_float_weight,
    select_layers,
)
from workbench.compress.structure import UNITS, WHERE, find_groups, remove_units
from workbench.problems import ConfigError


def prune_unstructured(
    model: nn.Module, sparsity: float, *, layers: Iterable[str] | None = None
) -> Compressed:
    """A copy of `model` with the `sparsity` fraction of its smallest weights set to zero
    (global magnitude pruning over the chosen layers, made permanent).

    `layers`: names of Linear/Conv layers (default: all, except tied ones). ValueError,
    your model untouched, for a sparsity outside [0, 1), an unsupported layer, or a model
    without any supported layer.
    """
    check_model(model)
    amount = check_sparsity(sparsity)
    names, skipped = select_layers(model, layers, PRUNABLE, "magnitude pruning")
    out = copy.deepcopy(model)
    modules = dict(out.named_modules())
    targets = [(modules[name], "weight") for name in names]
    prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=amount)
    for module, name in targets:
        # weight = weight_orig * mask, a plain parameter again
        prune.remove(module, name)  # type: ignore[no-untyped-call]
    return Compressed(
        model=out,
        method="prune",
        layers=tuple(names),
        skipped=tuple(skipped),
        notes=(
            f"global magnitude (L1) pruning: {amount:.0%} of the weights of {len(names)} "
            "layers set to zero, masks folded in (torch.nn.utils.prune)",
        ),
        why_no_gain=(
            "zeroed weights stay in dense tensors: the same bytes, and dense kernels do the "
            "same work on zeros (a sparse format, or 2:4 sparsity on GPUs with sparse tensor "
            "cores, is needed for a gain)"
        ),
    )


def prune_structured(model: nn.Module, sparsity: float, *, unit: str = "channels") -> Compressed:
    """A copy of `model` with the weakest `sparsity` fraction of its channels (or
    attention `unit="heads"`) removed, layer group by group (see
    `workbench.compress.structure` for where units can be removed).

    ValueError, your model untouched, for a sparsity outside [0, 1), an unknown unit, or
    a model with no group of that unit that this module can trace (a `ConfigError` whose
    `MethodProblem` names `unit` and the methods to use instead).
    """
    check_model(model)
    amount = check_sparsity(sparsity)
    groups = find_groups(model, unit)  # ValueError for an unknown unit
    if not groups:
        raise ConfigError(
            [
                MethodProblem(
                    "unit",
                    unit,
                    f"structured pruning of {unit} found nothing it can remove in this "
                    f"{type(model).__name__}: {WHERE[unit]}",
                    instead=(next(u for u in UNITS if u != unit), "prune"),
                )
            ]
        )
    modules = dict(model.named_modules())
    layers = sorted({c.layer for g in groups for c in (*g.producers, *g.consumers)})
    quantized = [name for name in layers if not plain_float_weight(modules[name])]
    if quantized:
        raise ValueError(f"model: layers {', '.join(quantized)}: {ALREADY}")
    out = copy.deepcopy(model)
    removals = [remove_units(out, group, amount) for group in groups]
    changed = tuple(sorted({c.layer for g in groups for c in (*g.producers, *g.consumers)}))
    summary = ", ".join(f"{r.group} {r.before}->{r.after}" for r in removals)
    return Compressed(
        model=out,
        method=unit,
        layers=changed,
        notes=(
            f"structured magnitude pruning: the weakest {amount:.0%} of the {unit} of each "
            f"group removed (L2 norm of their weights; the layers rebuilt smaller): {summary}",
        ),
        why_no_gain="the layers it narrows are too small a share of the work here",
    )
