"""LoRA and QLoRA on your module, through peft: adapters put in place, merged back.

`LoraAdapters.attach(model, config, device)` puts peft's LoRA layers into your module in
place (`peft.inject_adapter_in_model`): each target linear layer (torch's `nn.Linear`, or
transformers' `Conv1D`, GPT-2's projections, whose weight is stored transposed as (in, out))
becomes a peft `lora.Linear` wrapping the original layer (`base_layer`) with two small
matrices, and every other parameter is frozen (`requires_grad=False`). A Conv1D target is
wrapped as peft wraps it (`fan_in_fan_out=True`: the update is transposed into the weight's
layout); A is (rank, in) and B (out, rank) on either kind. B starts at zero, so the module
computes exactly what it did before; A is drawn from the run's seed alone (the exported
jobs draw it the same way). The backend, whichever engine (the plain loop, DeepSpeed's or
FSDP's copy of your module), then trains only the adapters.

QLoRA (`qlora=True`): every linear layer but the output head is first replaced by
bitsandbytes' `Linear4bit` (NF4, double quantisation, blocksize 64; a Conv1D's weight is
transposed into nn.Linear's (out, in) layout first, as the 4-bit layer computes `x W^T`)
and the adapters go on the targets among them. The original layers, with their weights in
their own dtype, are kept aside in host memory. It computes in the autocast dtype
(amp-bf16, amp-fp16), in fp32 under fp32, and in bf16 under pure bf16 ("bf16-true", as
torchtune's and PEFT's QLoRA recipes run it: the weights are quantised from their bf16
values, so a layer dequantises straight to bf16, and the engine's copy holds norms,
embedding, head and biases in bf16). bitsandbytes 0.50 trains it on a CPU too (its 4-bit
quantise, dequantise and matmul have CPU kernels); which engines train it is their rows'
word (`workbench.engines.EngineRow.qlora`).

The adapters' dtype (`lora_dtype`): "auto", the trained weights' (bf16 under bf16-true,
as torchtune keeps them), or "fp32" over a bf16 base, as peft's `get_peft_model` gives
them (`autocast_adapter_dtype=True`): `adapters_in_dtype` casts them back after the
engine's bf16 cast, and peft casts each adapter's input to its dtype.

`merge()` gives your module back its own layers with the adapters' update added to the
weights (`W += B A * alpha / rank`; into a Conv1D's (in, out) weight as `(B A)^T`; under
QLoRA into the kept original weight, not the 4-bit copy) and the `requires_grad` every
parameter had. The Session merges when LoRA is switched off or changed (then puts fresh
adapters on: the outputs do not change at the switch) and at `close()`, so after either
your module holds what was trained, in its own structure. `save(path)` writes the adapters
alone in peft's format (`adapter_model.safetensors` and `adapter_config.json`, with
`fan_in_fan_out: true` when the targets are Conv1D layers, as peft writes it for GPT-2),
which `peft.PeftModel.from_pretrained` loads onto a `transformers` base model.

Targets: `lora_targets="all-linear"` (every linear layer, `nn.Linear` or Conv1D, but the
output head: the layer a `transformers` model's `get_output_embeddings()` returns, or one
named `lm_head`, `head`, `output`, `embed_out`, `classifier` or `score`), or comma-separated
module names or name endings (GPT-2's `c_attn`, the classic LoRA tutorial's target).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.config import (
    FsdpMode,
    LoraDtype,
    Precision,
    SettingProblem,
    TrainConfig,
    lora_target_names,
)
from workbench.estimate.lora import NF4_ABSMAX_BLOCK, NF4_BLOCK
from workbench.export.job_common import LORA_HEADS, PEFT_PREFIX, linear_kinds
from workbench.inputs import shown

#: Names of output heads "all-linear" leaves out (peft's "all-linear" leaves out the head):
#: the exported jobs' set, one object (`workbench.export.job_common.LORA_HEADS`).
HEAD_NAMES = LORA_HEADS

#: torchao's NF4 tensor (torchtune's 4-bit base, which FSDP2 shards).
NF4_MODULE = "torchao.quantization.quantize_.workflows.nf4.nf4_tensor"

#: peft's adapter name for the Session's one adapter.
ADAPTER = "default"

#: The settings a LoRA rebuild reads.
LORA_FIELDS = frozenset(
    {"lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "qlora", "lora_dtype"}
)


def linear_4bit() -> type:
    """bitsandbytes' `Linear4bit` (ImportError without bitsandbytes)."""
    from bitsandbytes.nn import Linear4bit

    return Linear4bit  # type: ignore[no-any-return]


def conv1d_class() -> type | None:
    """transformers' `Conv1D` (GPT-2's linear layers, weight stored as (in, out)), or None
    when transformers has not loaded it: then no module holds one (read from the loaded
    modules, so asking costs no import; the exported jobs' rule, one function)."""
    kinds = linear_kinds()[1:]
    return kinds[0] if kinds else None


def is_conv1d(module: nn.Module) -> bool:
    """Whether `module` is transformers' `Conv1D`."""
    kind = conv1d_class()
    return kind is not None and isinstance(module, kind)


def in_out(layer: nn.Module) -> tuple[int, int]:
    """(in, out) features of a linear layer (its base under LoRA): nn.Linear's (a 4-bit
    layer's too), or a Conv1D's `nx` and `nf` (its weight's (in, out) shape, read from the
    attributes so that a DeepSpeed-partitioned weight reads the same)."""
    base = _base_linear(layer)
    if is_conv1d(base):
        return int(base.nx), int(base.nf)  # type: ignore[arg-type]
    return int(base.in_features), int(base.out_features)  # type: ignore[arg-type]


def _quantizable(layer: nn.Module) -> bool:
    """An nn.Linear or a Conv1D: a layer QLoRA quantises."""
    return isinstance(layer, nn.Linear) or is_conv1d(layer)


def _as_linear(layer: nn.Module) -> nn.Linear:
    """`layer` as an nn.Linear: itself, or a Conv1D's weight transposed into (out, in) and
    its bias, copied on its device in its dtype (what a 4-bit layer is made from)."""
    if isinstance(layer, nn.Linear):
        return layer
    fan_in, fan_out = in_out(layer)
    weight = layer.weight
    bias = getattr(layer, "bias", None)
    linear = nn.Linear(
        fan_in, fan_out, bias=bias is not None, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        linear.weight.copy_(weight.t())
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


def _is_lora_layer(module: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)


def _base_linear(module: nn.Module) -> nn.Module:
    """A linear layer as its base: a peft LoRA layer's wrapped layer, or itself."""
    return module.get_base_layer() if _is_lora_layer(module) else module  # type: ignore[operator]


class NF4Linear(nn.Linear):
    """A frozen linear layer whose weight is torchao's `NF4Tensor` (4-bit NF4, blocks of
    64 with double quantisation in blocks of 256), as torchtune's `FrozenNF4Linear`: the
    4-bit base FSDP2 shards and gathers (the tensor implements FSDP2's
    `fsdp_pre_all_gather` / `fsdp_post_all_gather`). `linear_nf4` dequantises the weight
    to the input's dtype for the matmul, in forward and again in backward (only the 4-bit
    weight is saved)."""

    def __init__(self, layer: nn.Linear, dtype: torch.dtype) -> None:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

        nn.Module.__init__(self)
        self.in_features, self.out_features = layer.in_features, layer.out_features
        weight = layer.weight.detach().to("cpu", dtype).contiguous()
        self.weight = nn.Parameter(to_nf4(weight, NF4_BLOCK, NF4_ABSMAX_BLOCK), requires_grad=False)
        bias = layer.bias
        self.bias = (
            None
            if bias is None
            else nn.Parameter(bias.detach().to("cpu", dtype).clone(), requires_grad=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4

        out = linear_nf4(x, self.weight)
        return out if self.bias is None else out + self.bias.to(out.dtype)


def four_bit_library(config: TrainConfig) -> str:
    """The library QLoRA's 4-bit base comes from: torchao's NF4 tensor under FSDP2 (the
    `fsdp` setting on), bitsandbytes' Linear4bit in the plain loop."""
    return "torchao" if FsdpMode(config.fsdp) is not FsdpMode.OFF else "bitsandbytes"


def _linear_names(model: nn.Module) -> list[str]:
    """Names of the model's linear layers, nn.Linear or Conv1D (as their base under LoRA
    or QLoRA)."""
    kinds: tuple[type, ...] = (nn.Linear,)
    with contextlib.suppress(ImportError):  # no bitsandbytes: no 4-bit layers either
        kinds = (nn.Linear, linear_4bit())
    conv1d = conv1d_class()
    if conv1d is not None:
        kinds = (*kinds, conv1d)
    names = []
    for name, module in model.named_modules():
        plain = isinstance(module, kinds) and not _inside_lora(model, name)
        if _is_lora_layer(module) or plain:
            names.append(name)
    return names


def _inside_lora(model: nn.Module, name: str) -> bool:
    """True for a module inside a peft LoRA layer (its base layer or an adapter matrix)."""
    parts = name.split(".")
    for k in range(1, len(parts)):
        parent = model.get_submodule(".".join(parts[:k]))
        if _is_lora_layer(parent):
            return True
    return False


def _head_names(model: nn.Module) -> set[str]:
    heads = set()
    get = getattr(model, "get_output_embeddings", None)
    out = get() if callable(get) else None
    for name, module in model.named_modules():
        if (out is not None and module is out) or name.split(".")[-1] in HEAD_NAMES:
            heads.add(name)
    return heads


def resolve_targets(model: nn.Module, targets: str) -> list[str]:
    """The full names of the linear layers `targets` (a `lora_targets` value) picks.
    Raises ValueError naming the setting when it picks none (`targets_problem`)."""
    picked, why = _picked(model, targets)
    if why is not None:
        raise ValueError(f"lora_targets={shown(targets)}: {why}")
    return picked


def targets_problem(model: nn.Module, targets: str) -> str | None:
    """Why `targets` (a `lora_targets` value) picks none of `model`'s linear layers, with
    the names to pick from (None: it picks some)."""
    return _picked(model, targets)[1]


def _picked(model: nn.Module, targets: str) -> tuple[list[str], str | None]:
    linears = _linear_names(model)
    wanted = lora_target_names(targets)
    if wanted == ["all-linear"]:
        heads = _head_names(model)
        picked = [n for n in linears if n not in heads]
    else:
        picked = [n for n in linears if any(n == w or n.endswith("." + w) for w in wanted)]
    if picked:
        return picked, None
    names = ", ".join(linears[:12]) + (" ..." if len(linears) > 12 else "")
    return [], (
        f"picks none of the model's linear layers ({names or 'it has none'}); give their "
        "names or name endings, or 'all-linear'"
    )


def adapter_parameter_count(model: nn.Module, config: TrainConfig) -> int:
    """The parameters LoRA of `config` adds to `model` (0 when `lora_rank` is 0), counted
    from the target layers' shapes without changing the model."""
    rank = int(config.lora_rank)
    if rank == 0:
        return 0
    total = 0
    for name in resolve_targets(model, str(config.lora_targets)):
        fan_in, fan_out = in_out(model.get_submodule(name))
        total += rank * (fan_in + fan_out)
    return total


def four_bit_weight_count(model: nn.Module) -> int:
    """The weights QLoRA holds in 4 bits: every linear layer's but the output head's
    (biases stay in their dtype), counted from the shapes."""
    heads = _head_names(model)
    total = 0
    for name in _linear_names(model):
        if name not in heads:
            fan_in, fan_out = in_out(model.get_submodule(name))
            total += fan_in * fan_out
    return total


def four_bit_weight_bytes(model: nn.Module, config: TrainConfig) -> int:
    """The bytes QLoRA's 4-bit base of `config` takes on `model`, whole: each quantised
    layer's weight by `workbench.estimate.lora.nf4_weight_bytes` in the layout of its
    library (`four_bit_library`: packed codes, scales, second level, code tables),
    counted from the shapes."""
    from workbench.estimate.lora import nf4_weight_bytes

    library = four_bit_library(config)
    scale = 2 if Precision(config.precision) is Precision.BF16_TRUE else 4
    heads = _head_names(model)
    total = 0
    for name in _linear_names(model):
        if name not in heads:
            fan_in, fan_out = in_out(model.get_submodule(name))
            total += nf4_weight_bytes(fan_in * fan_out, library, scale)
    return total


def nf4_shard_problem(model: nn.Module, world_size: int) -> str | None:
    """What stops FSDP2 from sharding `model`'s torchao NF4 weights over `world_size`
    ranks (None when nothing does): torchao splits each of a weight's inner tensors
    evenly, so every 4-bit layer's weight count must be a multiple of 64 x 256 x ranks
    (its second-level scales, one per 16,384 weights, split over the ranks)."""
    whole = NF4_BLOCK * NF4_ABSMAX_BLOCK * world_size
    for name, module in model.named_modules():
        if isinstance(module, NF4Linear):
            n = module.in_features * module.out_features
            if n % whole or module.out_features % world_size:
                return (
                    f"FSDP2 shards torchao's NF4 weights evenly: layer {name} holds {n:,} "
                    f"weights ({module.out_features} x {module.in_features}), not a multiple "
                    f"of 64 x 256 x {world_size} ranks = {whole:,} over {world_size} ranks"
                )
    return None


def lora_rebuild(changed: set[str], config: TrainConfig) -> bool:
    """Whether a change of `changed` settings to `config` puts the adapters on afresh: a
    LoRA setting, or `fsdp` under QLoRA (the 4-bit base's library follows the engine)."""
    return bool(changed & LORA_FIELDS) or (bool(config.qlora) and "fsdp" in changed)


def adapters_in_dtype(model: nn.Module, config: TrainConfig) -> None:
    """The adapters of `model` in fp32 (peft puts them in a 4-bit layer's compute dtype;
    an engine's pure-bf16 copy casts them to bf16), unless `lora_dtype` is "auto" under
    bf16-true, where they stay in the trained weights' bf16."""
    pure = Precision(config.precision) is Precision.BF16_TRUE
    if pure and LoraDtype(config.lora_dtype) is LoraDtype.AUTO:
        return
    for name, p in model.named_parameters():
        if is_adapter_parameter(name) and p.dtype != torch.float32:
            p.data = p.data.float()


def is_adapter_parameter(name: str) -> bool:
    """True for a LoRA adapter's parameter name (`...lora_A.default.weight`)."""
    return ".lora_A." in name or ".lora_B." in name


def _compute_dtype(config: TrainConfig) -> torch.dtype:
    precision = Precision(config.precision)
    if precision in (Precision.AMP_BF16, Precision.BF16_TRUE):
        return torch.bfloat16
    if precision is Precision.AMP_FP16:
        return torch.float16
    return torch.float32


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


class LoraAdapters:
    """LoRA adapters in your module (see the module docstring)."""

    def __init__(self, model: nn.Module, config: TrainConfig, device: torch.device) -> None:
        if any(_is_lora_layer(m) for m in model.modules()):
            raise ValueError(
                "lora_rank: the model holds peft LoRA layers already; give the Session the "
                "base model (or `merge_and_unload()` it first)"
            )
        self.model = model
        self.rank = int(config.lora_rank)
        self.targets = resolve_targets(model, str(config.lora_targets))
        self.qlora = bool(config.qlora)
        self.requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        # your module's layers are Conv1D (GPT-2): its saved adapters say so for peft
        self.fan_in_fan_out = any(is_conv1d(model.get_submodule(n)) for n in self.targets)
        self.originals: dict[str, nn.Module] = {}
        if self.qlora:
            self._quantize(config, device)
        self.peft_config = peft_lora_config(
            config, self.targets, _wraps_conv1d(model, self.targets)
        )
        # the adapters' initial A from the run's seed alone (the exported jobs do the same),
        # without moving the RNG the run itself draws from
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(config.seed))
            inject_lora(self.peft_config, model)
        adapters_in_dtype(model, config)
        model.to(device)

    @classmethod
    def attach(
        cls, model: nn.Module, config: TrainConfig, device: torch.device
    ) -> LoraAdapters | None:
        """The adapters of `config` in `model` (None when `lora_rank` is 0)."""
        return cls(model, config, device) if int(config.lora_rank) > 0 else None

    def _quantize(self, config: TrainConfig, device: torch.device) -> None:
        """Every linear layer but the head as a 4-bit NF4 layer (`four_bit_library`); the
        originals kept in host memory."""
        heads = _head_names(self.model)
        dtype = _compute_dtype(config)
        if four_bit_library(config) == "torchao":
            # quantised from the weights in the dtype the engine's copy holds (bf16 under
            # bf16-true: its cast leaves a bf16 NF4 tensor as it is)
            pure = Precision(config.precision) is Precision.BF16_TRUE
            for name in _linear_names(self.model):
                layer = self.model.get_submodule(name)
                if name in heads or not _quantizable(layer):
                    continue
                own = layer.weight.dtype
                linear = _as_linear(layer)  # a Conv1D's weight as (out, in)
                four_nf4 = NF4Linear(linear, torch.bfloat16 if pure else own).to(device)
                self.originals[name] = layer.to("cpu")
                _set(self.model, name, four_nf4)
            return
        Linear4bit = linear_4bit()
        for name in _linear_names(self.model):
            layer = self.model.get_submodule(name)
            if name in heads or not _quantizable(layer):
                continue
            linear = _as_linear(layer)  # a Conv1D's weight as (out, in)
            four = Linear4bit(
                linear.in_features,
                linear.out_features,
                bias=linear.bias is not None,
                compute_dtype=dtype,
                quant_type="nf4",
                device="cpu",
            )
            four.load_state_dict(linear.state_dict())
            if dtype is torch.bfloat16 and Precision(config.precision) is Precision.BF16_TRUE:
                # quantised from the bf16 values: it dequantises straight to bf16
                four.weight.data = four.weight.data.to(dtype)
            four.weight.requires_grad_(False)
            if four.bias is not None:
                four.bias.requires_grad_(False)
            four = four.to(device)  # bitsandbytes quantises when the layer is moved
            self.originals[name] = layer.to("cpu")
            _set(self.model, name, four)

    # ------------------------------------------------------------------ facts
    def adapter_parameters(self) -> int:
        return sum(p.numel() for n, p in self.model.named_parameters() if is_adapter_parameter(n))

    def base_parameters(self) -> int:
        """The base model's parameters (the originals' count under QLoRA)."""
        total = sum(
            p.numel() for n, p in self.model.named_parameters() if not is_adapter_parameter(n)
        )
        for name, original in self.originals.items():
            four = _base_linear(self.model.get_submodule(name))
            total += sum(p.numel() for p in original.parameters())
            total -= sum(p.numel() for p in four.parameters())
        return total

    def trainable_fraction(self) -> float:
        """Adapter parameters over all (base + adapters)."""
        adapters = self.adapter_parameters()
        return adapters / max(1, adapters + self.base_parameters())

    # ------------------------------------------------------------------ out
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The adapters' weights under the names peft's `save_pretrained` writes them
        (`base_model.model.<layer>.lora_A.weight`: no adapter name, the prefix of a
        `PeftModel` around your module, which `PeftModel.from_pretrained` expects)."""
        from peft import get_peft_model_state_dict

        return {
            PEFT_PREFIX + k: v.detach().cpu().contiguous()
            for k, v in get_peft_model_state_dict(self.model, adapter_name=ADAPTER).items()
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """The adapters alone, in peft's format, in directory `path` (created)."""
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict(), str(folder / "adapter_model.safetensors"))
        config = self.peft_config.to_dict()
        config["target_modules"] = self.targets
        # the layout of your module's layers (peft reads it when it loads them onto GPT-2)
        config["fan_in_fan_out"] = self.fan_in_fan_out
        (folder / "adapter_config.json").write_text(
            json.dumps(config, indent=2, sort_keys=True, default=list)
        )
        return folder

    def merge(self) -> None:
        """Your module's own layers back, each with the adapters' update added to its
        weight; every parameter's `requires_grad` as it was. Idempotent."""
        if not self.targets and not self.originals:
            return
        with torch.no_grad():
            for name in self.targets:
                layer = self.model.get_submodule(name)
                if not _is_lora_layer(layer):
                    continue
                # (out, in), or (in, out) from a layer peft wraps with fan_in_fan_out
                delta = layer.get_delta_weight(ADAPTER)  # type: ignore[operator]
                base = self.originals.pop(name, None)
                if base is None:
                    base = _base_linear(layer)
                else:
                    base.to(delta.device)
                if is_conv1d(base) and not getattr(layer, "fan_in_fan_out", False):
                    delta = delta.t()  # a 4-bit layer's (out, in) update into (in, out)
                base.weight.add_(delta.to(base.weight.dtype))
                _set(self.model, name, base)
            for name, original in list(self.originals.items()):  # 4-bit layers w/o adapters
                device = next(_base_linear(self.model.get_submodule(name)).parameters()).device
                _set(self.model, name, original.to(device))
            self.originals.clear()
        self.targets = []
        if "peft_config" in vars(self.model):  # the injection's record of its config
            del self.model.peft_config
        for name, p in self.model.named_parameters():
            p.requires_grad_(self.requires_grad.get(name, True))


def peft_lora_config(config: TrainConfig, targets: list[str], fan_in_fan_out: bool = False) -> Any:
    """peft's `LoraConfig` of `config`'s LoRA settings on exactly the layers `targets`;
    `fan_in_fan_out` when they are Conv1D layers (weights stored as (in, out))."""
    from peft import LoraConfig

    return LoraConfig(
        r=int(config.lora_rank),
        lora_alpha=float(config.lora_alpha),
        lora_dropout=float(config.lora_dropout),
        target_modules="|".join(re.escape(n) for n in targets),
        bias="none",
        fan_in_fan_out=fan_in_fan_out,
    )


def _wraps_conv1d(model: nn.Module, targets: list[str]) -> bool:
    """Whether any of `targets` is a Conv1D layer now (peft's `fan_in_fan_out`; under QLoRA
    they are 4-bit nn.Linear layers by then)."""
    return any(is_conv1d(_base_linear(model.get_submodule(n))) for n in targets)


def inject_lora(peft_config: Any, model: nn.Module, **options: Any) -> None:
    """peft's `inject_adapter_in_model` under the Session's adapter name. peft sets
    `fan_in_fan_out` per layer (on for a Conv1D, off for an nn.Linear) and warns where the
    config said otherwise: a model whose targets are of both kinds is wrapped right, so
    that warning is left out."""
    from peft import inject_adapter_in_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="fan_in_fan_out is set to")
        inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER, **options)


def holds_lora(model: nn.Module) -> bool:
    """Whether `model` holds peft LoRA layers (a LoRA Session's module, or a copy of it)."""
    return any(_is_lora_layer(m) for m in model.modules())


def fake_adapters(model: nn.Module, config: TrainConfig, fake_mode: Any) -> int:
    """LoRA of `config` put on a dry run's fake copy of a model (its parameters fake
    tensors), as a Session puts it on the real one: peft's layers on the same targets, the
    base frozen. peft makes the adapters on the meta device (`low_cpu_mem_usage`: moving
    fake parameters with `.to()` is refused), and each becomes a fake tensor beside its
    layer's weight. Returns the adapter parameter count."""
    targets = resolve_targets(model, str(config.lora_targets))
    lora = peft_lora_config(config, targets, _wraps_conv1d(model, targets))
    inject_lora(lora, model, low_cpu_mem_usage=True)
    count = 0
    for name in targets:
        layer = model.get_submodule(name)
        home = _base_linear(layer).weight.device
        for module in layer.modules():
            for key, p in list(module.named_parameters(recurse=False)):
                if p.device.type != "meta":
                    continue
                with fake_mode:
                    made = torch.empty(p.shape, dtype=p.dtype, device=home)
                # set in the dict, not through `.to()`: fake parameters cannot be swapped
                module._parameters[key] = nn.Parameter(made, requires_grad=p.requires_grad)
                count += p.numel()
    return count


class _Dequantized4bit(torch.autograd.Function):
    """bitsandbytes' `MatMul4Bit` as the dry run sees it: the weight dequantised to its
    quantisation dtype, then to the input's (a transient each way), for the forward and
    again for the input's gradient; only the packed weight is saved for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: torch.Tensor, shape: Any, dtype: Any) -> Any:
        ctx.shape, ctx.dtype = shape, dtype
        ctx.save_for_backward(packed)
        return nn.functional.linear(x, packed.new_empty(shape, dtype=dtype).to(x.dtype))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (packed,) = ctx.saved_tensors
        weight = packed.new_empty(ctx.shape, dtype=ctx.dtype).to(grad.dtype)
        return grad @ weight, None, None, None


class FakeLinear4bit(nn.Linear):
    """A dry run's stand-in for bitsandbytes' `Linear4bit` on fake tensors (its kernels
    do not run there): the packed codes as the layer's uint8 `weight` and the quantisation
    state (absmax, second level, offset, code tables) as one uint8 parameter of its bytes
    (`nf4_weight_bytes`), both frozen and never cast; the matmul dequantises as
    `_Dequantized4bit` does."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype) -> None:
        from workbench.estimate.lora import nf4_weight_bytes

        nn.Module.__init__(self)
        self.in_features, self.out_features = in_out(layer)  # a Conv1D's transposed
        n = self.in_features * self.out_features
        device = layer.weight.device
        packed = torch.empty(((n + 1) // 2, 1), dtype=torch.uint8, device=device)
        state = torch.empty(nf4_weight_bytes(n) - (n + 1) // 2, dtype=torch.uint8, device=device)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.quant_state_bytes = nn.Parameter(state, requires_grad=False)
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias, requires_grad=False)
        self.dequant_dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (self.out_features, self.in_features)
        out = _Dequantized4bit.apply(x, self.weight, shape, self.dequant_dtype)
        return out if self.bias is None else out + self.bias.to(out.dtype)


#: Why a dry run does not copy a module that holds 4-bit layers already.
FOUR_BIT_MODULE = (
    "the module holds QLoRA's 4-bit layers already (a QLoRA Session's own module), whose "
    "packed weights and quantisation state fake tensors cannot copy: simulate the base "
    "model (a model name, or your module before QLoRA), on which the dry run puts its own "
    "4-bit stand-in"
)


def holds_four_bit(model: nn.Module) -> bool:
    """Whether `model` holds a 4-bit layer (bitsandbytes' or torchao's)."""
    kinds: tuple[type, ...] = (NF4Linear,)
    with contextlib.suppress(ImportError):
        kinds = (NF4Linear, linear_4bit())
    return any(isinstance(m, kinds) for m in model.modules())


def fake_four_bit(model: nn.Module, config: TrainConfig, fake_mode: Any) -> int:
    """QLoRA's 4-bit base put on a dry run's fake copy of a model, as a Session's plain loop
    holds it: every linear layer (nn.Linear or Conv1D) but the head a `FakeLinear4bit`,
    quantised from bf16 under bf16-true (else from the weights' dtype). Returns the layers
    replaced."""
    pure = Precision(config.precision) is Precision.BF16_TRUE
    heads = _head_names(model)
    count = 0
    for name in _linear_names(model):
        layer = model.get_submodule(name)
        if name in heads or (type(layer) is not nn.Linear and not is_conv1d(layer)):
            continue
        with fake_mode:
            four = FakeLinear4bit(layer, torch.bfloat16 if pure else layer.weight.dtype)
        _set(model, name, four)
        count += 1
    return count


def lora_problem(model: nn.Module, config: TrainConfig) -> SettingProblem | None:
    """What stops LoRA of a valid `config` on `model` here (None when nothing does): peft
    or, for QLoRA, bitsandbytes not importable; targets that pick no linear layer."""
    if int(config.lora_rank) == 0:
        return None
    try:
        importlib.import_module("peft")
    except ImportError as exc:
        why = f"LoRA trains through peft: pip install peft ({exc})"
        return SettingProblem("lora_rank", int(config.lora_rank), why)
    if config.qlora and four_bit_library(config) == "torchao":
        try:
            importlib.import_module(NF4_MODULE)
        except ImportError as exc:
            why = f"under FSDP the 4-bit base is torchao's NF4 tensor: pip install torchao ({exc})"
            return SettingProblem("qlora", True, why)
    elif config.qlora:
        try:
            linear_4bit()
        except ImportError as exc:
            why = f"the 4-bit base is bitsandbytes' Linear4bit: pip install bitsandbytes ({exc})"
            return SettingProblem("qlora", True, why)
    why = targets_problem(model, str(config.lora_targets))
    return None if why is None else SettingProblem("lora_targets", config.lora_targets, why)


def parameter_bytes_by_dtype(module: nn.Module) -> dict[str, int]:
    """The bytes of `module`'s parameters on this rank by dtype, every storage once: an
    FSDP shard's local tensor, torchao's NF4 weight as its inner tensors (uint8 codes, int8
    scales, its factors and code in the weight's dtype), bitsandbytes' 4-bit weight with
    its quantisation state (uint8 absmax, fp32 second level, offset and code tables).
    Under QLoRA it sums to the measured parameters (`Session.memory().params_bytes`)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    seen: dict[int, tuple[str, int]] = {}

    def add(t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        local = getattr(t, "_local_tensor", None)
        if isinstance(local, torch.Tensor):
            t = local
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            for name in names:
                add(getattr(t, name))
            return
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = (str(t.dtype).removeprefix("torch."), storage.nbytes())

    for p in module.parameters():
        add(p)
        state = getattr(p, "quant_state", None)
        while state is not None:
            for part in ("absmax", "code", "offset"):
                add(getattr(state, part, None))
            state = getattr(state, "state2", None)
    out: dict[str, int] = {}
    for dtype, nbytes in seen.values():
        out[dtype] = out.get(dtype, 0) + nbytes
    return dict(sorted(out.items()))


def lora_summary(adapters: LoraAdapters | None) -> dict[str, Any] | None:
    """The adapters in numbers: rank, targets, adapter and base parameters, the trainable
    fraction, 4-bit layers (None without LoRA)."""
    if adapters is None:
        return None
    return {
        "rank": adapters.rank,
        "targets": len(adapters.targets),
        "adapter_params": adapters.adapter_parameters(),
        "base_params": adapters.base_parameters(),
        "trainable_fraction": adapters.trainable_fraction(),
        "four_bit_layers": len(adapters.originals),
    }
