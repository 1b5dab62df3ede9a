"""Which channels and attention heads can be removed from a model, and removing them.

Structured pruning removes whole units: a layer's output channel (a row of a linear
weight, an output channel of a convolution) together with the matching inputs of the
layer that reads it, or an attention head (its rows of the query/key/value projection and
its columns of the output projection). The layers become smaller tensors, so the model
is smaller and does less work, unlike zeroed weights in a dense tensor.

A unit can only be removed where every reader of it is known. This module finds such
groups in:

* `nn.Sequential` containers: a Linear (or ConvNd) followed by element-wise layers
  (activations, dropout, pooling, BatchNorm, which is sliced too) and then another Linear
  (ConvNd of the same kind), or a ConvNd, then `nn.Flatten`, then a Linear;
* the built-in models: the cnn's last convolution feeding its classifier through the
  flatten in `forward`; tiny-gpt's MLP hidden units (`fc` -> `fc_proj`) and its
  attention heads.

Anything else (a residual connection, a layer read by two others, `nn.MultiheadAttention`,
grouped convolutions) is left alone. Units are ranked by the L2 norm of the weights that
produce them (magnitude), and the weakest are removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.inputs import shown

UNITS = ("channels", "heads")

_ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.ELU,
    nn.Hardswish,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.Identity,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
)
_NORMS: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CONVS: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class Cut:
    """Where a unit lives in one layer: along `dim` of its weight (0: outputs, 1:
    inputs), `block` consecutive entries per unit, the layout repeated `sections` times
    (a fused query/key/value projection has 3 sections)."""

    layer: str
    dim: int
    block: int = 1
    sections: int = 1


@dataclass(frozen=True)
class Group:
    """Units that are removed together: `producers` make them (and rank them), readers
    (`consumers`) take them as inputs, `norms` (BatchNorm) sit between. `attention`: the
    attention module to rebuild with fewer heads (head groups only)."""

    name: str
    unit: str  # "channels" or "heads"
    units: int
    producers: tuple[Cut, ...]
    consumers: tuple[Cut, ...]
    norms: tuple[str, ...] = ()
    attention: str | None = None
    head_dim: int | None = None


@dataclass(frozen=True)
class Removal:
    """What structured pruning did to one group."""

    group: str
    unit: str
    before: int
    after: int
    kept: tuple[int, ...] = field(repr=False, default=())


# --------------------------------------------------------------------------- finding groups


def _weight_rows(module: nn.Module) -> int:
    if isinstance(module, nn.Linear):
        return module.out_features
    return int(module.out_channels)  # type: ignore[arg-type]


def _sequential_groups(model: nn.Module) -> list[Group]:
    groups = []
    for prefix, seq in model.named_modules():
        if type(seq) is not nn.Sequential:  # a subclass may wire its children differently
            continue
        children = list(seq.named_children())
        for i, (name, producer) in enumerate(children):
            if not isinstance(producer, (nn.Linear, *_CONVS)):
                continue
            if isinstance(producer, _CONVS) and producer.groups != 1:
                continue
            norms, flatten, consumer_name, consumer = [], False, None, None
            for next_name, module in children[i + 1 :]:
                if isinstance(module, _ELEMENTWISE):
                    continue
                if isinstance(module, _NORMS) and not flatten:
                    norms.append(next_name)
                    continue
                if isinstance(module, nn.Flatten) and isinstance(producer, _CONVS):
                    flatten = True
                    continue
                consumer_name, consumer = next_name, module
                break
            if consumer is None or consumer_name is None:
                continue
            units = _weight_rows(producer)
            block = 1
            if flatten or (isinstance(producer, _CONVS) and isinstance(consumer, nn.Linear)):
                if not (flatten and isinstance(consumer, nn.Linear)):
                    continue
                if consumer.in_features % units:
                    continue
                block = consumer.in_features // units
            elif type(consumer) is not type(producer) or getattr(consumer, "groups", 1) != 1:
                continue
            full = f"{prefix}." if prefix else ""
            groups.append(
                Group(
                    name=f"{full}{name} -> {full}{consumer_name}",
                    unit="channels",
                    units=units,
                    producers=(Cut(full + name, 0),),
                    consumers=(Cut(full + consumer_name, 1, block=block),),
                    norms=tuple(full + n for n in norms),
                )
            )
    return groups


def _builtin_groups(model: nn.Module) -> list[Group]:
    from workbench.models import gpt, synthetic

    groups = []
    for prefix, module in model.named_modules():
        full = f"{prefix}." if prefix else ""
        if isinstance(module, synthetic.SmallCNN):
            convs = [(n, m) for n, m in module.features.named_children() if isinstance(m, _CONVS)]
            if convs:
                conv_name, conv = convs[-1]
                rows = int(getattr(conv, "out_channels"))  # noqa: B009 - typed as a Module
                if module.classifier.in_features % rows == 0:
                    groups.append(
                        Group(
                            name=f"{full}features.{conv_name} -> {full}classifier",
                            unit="channels",
                            units=rows,
                            producers=(Cut(f"{full}features.{conv_name}", 0),),
                            consumers=(
                                Cut(
                                    f"{full}classifier",
                                    1,
                                    block=module.classifier.in_features // rows,
                                ),
                            ),
                        )
                    )
        elif isinstance(module, gpt.MLP):
            groups.append(
                Group(
                    name=f"{full}fc -> {full}fc_proj",
                    unit="channels",
                    units=module.fc.out_features,
                    producers=(Cut(f"{full}fc", 0),),
                    consumers=(Cut(f"{full}fc_proj", 1),),
                )
            )
        elif isinstance(module, (gpt.CausalSelfAttention, PrunedSelfAttention)):
            heads = int(module.heads)
            qkv: Any = module.qkv
            d = int(qkv.out_features) // 3 // heads
            groups.append(
                Group(
                    name=f"{prefix} heads",
                    unit="heads",
                    units=heads,
                    producers=(Cut(f"{full}qkv", 0, block=d, sections=3),),
                    consumers=(Cut(f"{full}proj", 1, block=d),),
                    attention=prefix,
                    head_dim=d,
                )
            )
    return groups


def find_groups(model: nn.Module, unit: str) -> list[Group]:
    """The groups of `unit` ("channels" or "heads") structured pruning can remove."""
    if unit not in UNITS:
        raise ValueError(f"unit={shown(unit)}: must be one of {', '.join(map(repr, UNITS))}")
    found = _sequential_groups(model) + _builtin_groups(model)
    return [g for g in found if g.unit == unit]


WHERE = {
    "channels": (
        "it removes a layer's output channels together with the matching inputs of the "
        "layer that reads them, which it can trace inside nn.Sequential containers "
        "(Linear -> element-wise layers -> Linear, ConvNd -> ... -> ConvNd, ConvNd -> "
        "Flatten -> Linear) and in the built-in mlp, cnn and tiny-gpt"
    ),
    "heads": (
        "it removes attention heads of workbench's tiny-gpt attention (a fused qkv "
        "projection and an output projection); other attention modules, "
        "nn.MultiheadAttention included, are not supported"
    ),
}


# --------------------------------------------------------------------------- removing units


def _view(weight: torch.Tensor, cut: Cut, units: int) -> torch.Tensor:
    """`weight` as (sections, units, block, rest) along the cut's dimension."""
    w = weight.detach().float().movedim(cut.dim, 0)
    return w.reshape(cut.sections, units, cut.block, -1)


def importance(model: nn.Module, group: Group) -> torch.Tensor:
    """L2 norm of each unit's producing weights (all producers and sections)."""
    modules = dict(model.named_modules())
    total = torch.zeros(group.units)
    for cut in group.producers:
        w = _view(_weight(modules[cut.layer]), cut, group.units)
        total += w.pow(2).sum(dim=(0, 2, 3)).cpu()
    return total.sqrt()


def _indices(kept: list[int], units: int, cut: Cut) -> torch.Tensor:
    span = units * cut.block
    return torch.tensor(
        [
            s * span + u * cut.block + j
            for s in range(cut.sections)
            for u in kept
            for j in range(cut.block)
        ],
        dtype=torch.long,
    )


def _replace(module: nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(module, name)
    if isinstance(old, nn.Parameter):
        setattr(module, name, nn.Parameter(value, requires_grad=old.requires_grad))
    else:
        module._buffers[name] = value


def _weight(module: nn.Module) -> torch.Tensor:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{type(module).__name__}: has no weight tensor")
    return weight


def _slice_layer(module: nn.Module, dim: int, index: torch.Tensor) -> None:
    with torch.no_grad():
        weight = _weight(module)
        _replace(module, "weight", weight.index_select(dim, index.to(weight.device)).clone())
        bias = getattr(module, "bias", None)
        if dim == 0 and isinstance(bias, torch.Tensor):
            _replace(module, "bias", bias.index_select(0, index.to(bias.device)).clone())
    size = len(index)
    if isinstance(module, nn.Linear):
        attr = "out_features" if dim == 0 else "in_features"
    else:
        attr = "out_channels" if dim == 0 else "in_channels"
    setattr(module, attr, size)


def _slice_norm(norm: nn.Module, index: torch.Tensor) -> None:
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            value = getattr(norm, name, None)
            if isinstance(value, torch.Tensor):
                _replace(norm, name, value.index_select(0, index.to(value.device)).clone())
    setattr(norm, "num_features", len(index))  # noqa: B010 - a plain int attribute


def remove_units(model: nn.Module, group: Group, sparsity: float) -> Removal:
    """Remove the weakest `floor(sparsity * units)` units of `group` from `model` (in
    place; at least one unit stays)."""
    drop = min(math.floor(sparsity * group.units + 1e-9), group.units - 1)  # 0.3 * 10 is 2.99...
    if drop <= 0:
        return Removal(group.name, group.unit, group.units, group.units, tuple(range(group.units)))
    scores = importance(model, group)
    order = sorted(range(group.units), key=lambda u: (float(scores[u]), u))
    kept = sorted(order[drop:])
    modules = dict(model.named_modules())
    for cut in group.producers:
        _slice_layer(modules[cut.layer], 0, _indices(kept, group.units, cut))
    for cut in group.consumers:
        _slice_layer(modules[cut.layer], 1, _indices(kept, group.units, cut))
    for name in group.norms:
        _slice_norm(modules[name], torch.tensor(kept, dtype=torch.long))
    if group.attention is not None:
        attention = modules[group.attention]
        assert group.head_dim is not None
        _set_module(
            model, group.attention, PrunedSelfAttention(attention, len(kept), group.head_dim)
        )
    return Removal(group.name, group.unit, group.units, len(kept), tuple(kept))


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


class PrunedSelfAttention(nn.Module):
    """tiny-gpt's causal self-attention after head pruning: `heads` heads of `head_dim`
    each, so the attention's inner width (heads x head_dim) is narrower than the model's
    hidden size; the projections, dropouts and mask are the original module's."""

    def __init__(self, attention: Any, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.qkv: nn.Module = attention.qkv
        self.proj: nn.Module = attention.proj
        self.attn_drop: nn.Module = attention.attn_drop
        self.resid_drop: nn.Module = attention.resid_drop
        self.causal_mask: torch.Tensor
        self.register_buffer("causal_mask", attention.causal_mask, persistent=False)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        """`blocked`: a document batch's bool mask (`workbench.models.gpt.document_mask`)."""
        from workbench.models.gpt import ScaledMaskedSoftmax

        b, s, _ = x.shape
        d = self.head_dim
        inner = self.heads * d
        q, k, v = self.qkv(x).split(inner, dim=2)
        q = q.reshape(b, s, self.heads, d).transpose(1, 2)
        k = k.reshape(b, s, self.heads, d).transpose(1, 2)
        v = v.reshape(b, s, self.heads, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1)
        mask = self.causal_mask[:s, :s] if blocked is None else blocked
        att = ScaledMaskedSoftmax.apply(  # type: ignore[no-untyped-call]
            scores, mask, 1.0 / math.sqrt(d)
        )
        att = self.attn_drop(att)
        y = (att @ v).transpose(1, 2).reshape(b, s, inner)
        out: torch.Tensor = self.resid_drop(self.proj(y))
        return out

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}"
