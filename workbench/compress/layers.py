"""Which layers a compression method touches, and the checks every method shares.

Every method works on a copy of your model and checks its input before it copies
anything, so bad input (a sparsity outside [0, 1), a layer of a type the method does not
support, a model with nothing it could compress) raises a `ValueError` naming the
argument, the value and what is allowed, and your model stays exactly as it was. The
problems a front end words its own way are data: `sparsity_problem` a `SettingProblem`, a
structured pruning that finds nothing a `MethodProblem` (in a `ConfigError`) naming the
methods to use instead.

A layer whose weight is shared with another module (tiny-gpt's output head is tied to the
token embedding) is left out when layers are picked automatically, with a note saying
so: compressing one side of a tie would split it into two tensors and make the model
larger, not smaller. Naming such a layer explicitly is an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.inputs import shown
from workbench.problems import ConfigError, SettingProblem

#: Layers magnitude pruning supports (their `weight` is pruned; biases are kept).
PRUNABLE: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: Layers INT8 dynamic quantization supports.
QUANTIZABLE: tuple[type[nn.Module], ...] = (nn.Linear,)


@dataclass(frozen=True)
class Compressed:
    """A compressed copy of a model and what was done to it.

    `model`: the new module (your model is untouched). `method`: the method's name, as
    the report shows it. `layers`: the layers it changed, by name. `skipped`: layers it
    left out, each with the reason. `notes`: how it was done (library, settings).
    `why_no_gain`: why the method may not pay on some hardware; the report shows it when
    its measurements say the method did not pay. `why_by_step`: a combination's reasons
    by its steps ("channels", "int8"), so the report leaves out the reason of a step that
    measured faster on its own.
    """

    model: nn.Module
    method: str
    layers: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    why_no_gain: str = ""
    why_by_step: tuple[tuple[str, str], ...] = ()


ALREADY = (
    "its weight is not a plain floating-point tensor (already quantized?); every method "
    "starts from float weights, so quantize last (e.g. methods=['channels+int8'])"
)


def plain_float_weight(module: nn.Module) -> bool:
    """True when the layer's weight is an ordinary floating-point tensor (not quantized)."""
    weight = getattr(module, "weight", None)
    return (
        isinstance(weight, torch.Tensor)
        and type(weight) in (torch.Tensor, nn.Parameter)
        and weight.is_floating_point()
    )


def check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise ValueError(f"model={type(model).__name__}: must be a torch.nn.Module")


def sparsity_problem(sparsity: Any, name: str = "sparsity") -> SettingProblem | None:
    """The problem of a sparsity outside [0, 1), or None when it is usable."""
    if (
        isinstance(sparsity, bool)
        or not isinstance(sparsity, (int, float))
        or not math.isfinite(sparsity)
        or not 0 <= sparsity < 1
    ):
        return SettingProblem(
            name,
            sparsity,
            "must be a number in [0, 1) (the fraction of weights or units to remove; 1 would "
            "remove everything)",
        )
    return None


def check_sparsity(sparsity: Any) -> float:
    problem = sparsity_problem(sparsity)
    if problem:
        raise ConfigError([problem])
    return float(sparsity)


#: How the Python API says each of `compress`'s methods.
METHOD_CALLS = {
    "int8": "quantize_int8()",
    "prune": "prune_unstructured()",
    "channels": "unit='channels'",
    "heads": "unit='heads'",
}


@dataclass(frozen=True)
class MethodProblem(SettingProblem):
    """A problem other compression methods do not have: `instead` names them as `compress`
    does ("channels", "prune"); `str()` says them as the Python API does ("use
    unit='channels' or prune_unstructured() instead"), and a front end its own way."""

    instead: tuple[str, ...] = ()

    def render(
        self,
        name: Callable[[str], str] = str,
        value_text: str | None = None,
        sep: str = "=",
    ) -> str:
        text = super().render(name, value_text, sep)
        if not self.instead:
            return text
        return f"{text}; use {' or '.join(METHOD_CALLS[m] for m in self.instead)} instead"


def _type_names(types: Iterable[type[nn.Module]]) -> str:
    return ", ".join(f"nn.{t.__name__}" for t in types)


def shared_weights(model: nn.Module) -> dict[str, str]:
    """Layer name -> the other owner of its `weight`, for weights registered in two places
    (tied embeddings)."""
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for pname, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append(f"{name}.{pname}" if name else pname)
    shared: dict[str, str] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            names = owners.get(id(weight), [])
            here = f"{name}.weight" if name else "weight"
            others = [n for n in names if n != here]
            if others:
                shared[name] = others[0]
    return shared


def _count_types(model: nn.Module) -> str:
    counts: dict[str, int] = {}
    for _, m in model.named_modules():
        if not list(m.children()):  # leaves only
            counts[type(m).__name__] = counts.get(type(m).__name__, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "no layers"


def select_layers(
    model: nn.Module,
    layers: Iterable[str] | None,
    supported: tuple[type[nn.Module], ...],
    what: str,
) -> tuple[list[str], list[str]]:
    """(names of the layers `what` will change, skipped layers with their reason).

    `layers=None` picks every layer of a `supported` type except shared (tied) weights;
    a list of names must name existing layers of a supported type, none of them tied.
    ValueError (every problem at once) when a name is wrong or nothing is left.
    """
    modules = dict(model.named_modules())
    tied = shared_weights(model)
    if layers is None:
        chosen, skipped = [], []
        for name, module in modules.items():
            if isinstance(module, supported):
                if name in tied:
                    skipped.append(
                        f"{name}: its weight is shared with {tied[name]} (tied); "
                        f"{what} would split the tie"
                    )
                elif not plain_float_weight(module):
                    skipped.append(f"{name}: {ALREADY}")
                else:
                    chosen.append(name)
        if not chosen:
            raise ValueError(
                f"model: {what} supports {_type_names(supported)} layers and this model has "
                f"none it can change (its layers: {_count_types(model)})"
                + (f"; left out: {'; '.join(skipped)}" if skipped else "")
            )
        return chosen, skipped
    if isinstance(layers, str) or not all(isinstance(n, str) for n in layers):
        raise ValueError(f"layers={shown(layers)}: must be a list of layer names, or None for all")
    names = list(layers)
    problems = []
    if not names:
        problems.append("layers=[]: name at least one layer, or pass None for all")
    for name in names:
        module = modules.get(name)
        if module is None:
            known = [n for n, m in modules.items() if isinstance(m, supported)]
            problems.append(
                f"layers: {shown(name)} is not a layer of this model (its {_type_names(supported)} "
                f"layers: {', '.join(known[:12]) or 'none'}{', ...' if len(known) > 12 else ''})"
            )
        elif not isinstance(module, supported):
            problems.append(
                f"layers: {shown(name)} is a {type(module).__name__}, which {what} does not support "
                f"(supported: {_type_names(supported)})"
            )
        elif name in tied:
            problems.append(
                f"layers: {shown(name)} shares its weight with {tied[name]} (tied); {what} would "
                "split the tie and make the model larger"
            )
        elif not plain_float_weight(module):
            problems.append(f"layers: {shown(name)}: {ALREADY}")
    raise_problems(problems)
    return names, []


def raise_problems(problems: Sequence[str | SettingProblem]) -> None:
    """One ValueError naming every problem (nothing to do when the list is empty)."""
    lines = [str(p) for p in problems]
    if len(lines) == 1:
        raise ValueError(lines[0])
    if lines:
        raise ValueError(f"{len(lines)} problems:\n" + "\n".join(f"  - {p}" for p in lines))
