"""How a model splits over a tensor-parallel group: which layers are column- or row-wise
parallel, and what sizes `tp` must divide (Megatron's layout, through PyTorch's
`torch.distributed.tensor.parallel`).

`tensor_plan(model, tp)` returns a `TensorPlan` for the two families the workbench knows:

* the built-in GPT (`workbench.models.gpt.TinyGPT`): in each block the fused `attn.qkv`
  and `mlp.fc` column-wise (weights and biases split by output rows), `attn.proj` and
  `mlp.fc_proj` row-wise (weights split by input columns, biases whole); the token
  embedding vocabulary-parallel (`RowwiseParallel` on an `nn.Embedding`: rows split, the
  partial lookups summed) and the tied output head column-wise with its logits left split
  over the vocabulary (`Shard(-1)`), so the loss runs vocabulary-parallel
  (`torch.distributed.tensor.parallel.loss_parallel`). Layer norms and the position table
  stay whole on every rank. The fused `qkv` weight holds all of q, then k, then v; split
  as is, a rank would get q's rows and some of k's, so its rows are permuted first
  (`permutations`) so that each rank's contiguous slice holds q, k and v of its own heads
  (the attention reads them as the thirds of its slice). The permutation is undone when
  weights and optimizer states leave the engine.
* a `transformers` Llama-style decoder (`model.layers[i].self_attn.{q,k,v,o}_proj`,
  `mlp.{gate,up,down}_proj`, `embed_tokens`, `lm_head`: Llama, Mistral, Qwen2 and kin):
  q, k, v, gate and up column-wise, o and down row-wise, the same embedding and head.
  Their attention reads the local head count from the width (`view(..., -1, head_dim)`).

`tp` must divide the heads (and K/V heads), the hidden size and the MLP width; the
vocabulary need not divide (torch.chunk's split: the last rank holds fewer rows, in a
buffer of ceil(V/tp) rows, as DTensor scatters padded chunks).
Sequence parallelism (`sequence_parallel=True`): in the built-in GPT the layer norms
(`SequenceParallel`), the dropout and the residual stream hold s/tp positions each; each
column-parallel matmul all-gathers its input along the sequence and each row-parallel one
reduce-scatters its output back (Korthikanti et al.), the position table's output is
split like the sequence. On a Llama-style decoder the same with its RMSNorms, except
that the embedding's output stays whole (the decoder computes positions and the causal
mask from it) and the first layer takes its rank's positions, and the attention and the
MLP each all-gather their input once for q, k, v and gate, up (torchtitan's layout).
Without it the activations outside the matmuls are whole on every rank, as the
estimator's `sequence_parallel=False` counts them.

Pure description: no process group is touched here (`workbench.train.backends.tensor_parallel`
applies the plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.config import SettingProblem

#: The families `tensor_plan` splits, as users read them in errors.
KNOWN_FAMILIES = (
    "the built-in GPT (tiny-gpt) and transformers Llama-style decoders (q/k/v/o_proj, "
    "gate/up/down_proj)"
)


@dataclass
class TensorPlan:
    """One model's tensor-parallel layout (see the module docstring)."""

    family: str
    #: module name -> "colwise" | "rowwise" | "embedding" | "head", and under sequence
    #: parallel "norm", "positions" (the GPT), "embedding-whole", "split-sequence",
    #: "gather-sequence"(-kw), "colwise-gathered" (a Llama-style decoder)
    layers: dict[str, str]
    #: the sizes `tp` must divide, by name (heads, kv_heads, hidden, ffn_hidden)
    sizes: dict[str, int]
    #: parameter name -> the row order the engine holds it in (the fused qkv)
    permutations: dict[str, torch.Tensor] = field(default_factory=dict)
    #: (head, embedding) module names whose weights are one tied matrix
    tied: tuple[str, str] | None = None
    #: the layers and the residual stream laid out for sequence parallelism
    sequence_parallel: bool = False


def tensor_plan(model: nn.Module, tp: int, *, sequence_parallel: bool = False) -> TensorPlan:
    """The `TensorPlan` of `model` over `tp` ranks (with `sequence_parallel`, the norms and
    the residual stream split along the sequence); ValueError naming `tp`,
    `sequence_parallel` or the model when it cannot be split so."""
    plan = _gpt_plan(model, tp, sequence_parallel) or _llama_plan(model, sequence_parallel)
    if plan is None:
        raise ValueError(
            f"model: {type(model).__name__} has no tensor-parallel plan; `tp` > 1 splits "
            f"{KNOWN_FAMILIES}"
        )
    if sequence_parallel and not plan.sequence_parallel:
        raise ValueError(
            f"sequence_parallel: {type(model).__name__}'s plan has no sequence-parallel "
            "layout (the built-in GPT and transformers Llama-style decoders have one)"
        )
    bad = [f"{name}={size}" for name, size in plan.sizes.items() if size % tp]
    if bad:
        raise ValueError(f"tp={tp}: must divide {', '.join(bad)} evenly")
    return plan


def tp_model_problem(
    model: nn.Module, tp: int, sequence_parallel: bool = False
) -> SettingProblem | None:
    """What stops `model` splitting over `tp` ranks (None when nothing does, or tp=1)."""
    if int(tp) == 1:
        return None
    try:
        tensor_plan(model, int(tp), sequence_parallel=bool(sequence_parallel))
    except ValueError as exc:
        field, message = str(exc).split(": ", 1)
        if field == "sequence_parallel":
            return SettingProblem("sequence_parallel", True, message)
        return SettingProblem("tp", int(tp), message)
    return None


def _gpt_plan(model: nn.Module, tp: int, sequence_parallel: bool) -> TensorPlan | None:
    from workbench.models.gpt import TinyGPT

    if not isinstance(model, TinyGPT):
        return None
    blocks = list(model.blocks)
    hidden = int(model.wte.weight.shape[1])
    heads = int(blocks[0].attn.heads) if blocks else 1
    layers: dict[str, str] = {"wte": "embedding", "head": "head"}
    sizes = {"heads": heads, "hidden": hidden, "ffn_hidden": 4 * hidden}
    if sequence_parallel:  # the position table's rows split as the sequence is
        layers.update({"wpe": "positions", "ln_f": "norm"})
        sizes["seq_len"] = int(model.seq_len)
    perms: dict[str, torch.Tensor] = {}
    for i, _ in enumerate(blocks):
        if sequence_parallel:
            layers[f"blocks.{i}.ln_1"] = "norm"
            layers[f"blocks.{i}.ln_2"] = "norm"
        layers[f"blocks.{i}.attn.qkv"] = "colwise"
        layers[f"blocks.{i}.attn.proj"] = "rowwise"
        layers[f"blocks.{i}.mlp.fc"] = "colwise"
        layers[f"blocks.{i}.mlp.fc_proj"] = "rowwise"
        if hidden % tp == 0:
            order = qkv_order(hidden, tp)
            perms[f"blocks.{i}.attn.qkv.weight"] = order
            perms[f"blocks.{i}.attn.qkv.bias"] = order
    tied = ("head", "wte") if model.head.weight is model.wte.weight else None
    return TensorPlan(
        family="tiny-gpt",
        layers=layers,
        sizes=sizes,
        permutations=perms,
        tied=tied,
        sequence_parallel=sequence_parallel,
    )


def qkv_order(hidden: int, tp: int) -> torch.Tensor:
    """The rows of a fused (q; k; v) projection reordered so that the r-th of `tp` equal
    slices is (q_r; k_r; v_r): rank r's heads' q, k and v."""
    c = hidden // tp
    return torch.cat(
        [
            torch.arange(j * hidden + r * c, j * hidden + (r + 1) * c)
            for r in range(tp)
            for j in range(3)
        ]
    )


def _llama_plan(model: nn.Module, sequence_parallel: bool = False) -> TensorPlan | None:
    base = getattr(model, "model", None)
    layers_list = getattr(base, "layers", None)
    config = getattr(model, "config", None)
    if not isinstance(layers_list, nn.ModuleList) or config is None:
        return None
    names = {n for n, _ in model.named_modules()}
    want = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    mlp = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    if not all(
        f"model.layers.{i}.{w}" in names for i in range(len(layers_list)) for w in (*want, *mlp)
    ):
        return None
    if "model.embed_tokens" not in names or "lm_head" not in names:
        return None
    layers: dict[str, str] = {"model.embed_tokens": "embedding", "lm_head": "head"}
    if sequence_parallel:
        # the decoder computes positions and the causal mask from the embedding's output,
        # so it stays whole there and the first layer splits it along the sequence
        layers["model.embed_tokens"] = "embedding-whole"
        layers["model.layers.0"] = "split-sequence"
        layers["model.norm"] = "norm"
    # under sequence parallel the attention and the MLP each gather their input once (q, k
    # and v, gate and up then share one whole copy, as torchtitan's Llama plan does)
    colwise = "colwise-gathered" if sequence_parallel else "colwise"
    for i in range(len(layers_list)):
        p = f"model.layers.{i}"
        if sequence_parallel:
            layers[f"{p}.input_layernorm"] = "norm"
            layers[f"{p}.post_attention_layernorm"] = "norm"
            layers[f"{p}.self_attn"] = "gather-sequence-kw"  # called with hidden_states=
            layers[f"{p}.mlp"] = "gather-sequence"
        for w in ("q_proj", "k_proj", "v_proj"):
            layers[f"{p}.self_attn.{w}"] = colwise
        layers[f"{p}.self_attn.o_proj"] = "rowwise"
        layers[f"{p}.mlp.gate_proj"] = colwise
        layers[f"{p}.mlp.up_proj"] = colwise
        layers[f"{p}.mlp.down_proj"] = "rowwise"
    heads = int(config.num_attention_heads)
    sizes = {
        "heads": heads,
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
        "hidden": int(config.hidden_size),
        "ffn_hidden": int(config.intermediate_size),
    }
    head_w: Any = model.lm_head.weight  # type: ignore[union-attr]
    tied = ("lm_head", "model.embed_tokens") if head_w is base.embed_tokens.weight else None  # type: ignore[union-attr]
    return TensorPlan(
        family="llama", layers=layers, sizes=sizes, tied=tied, sequence_parallel=sequence_parallel
    )


__all__ = ["KNOWN_FAMILIES", "TensorPlan", "qkv_order", "tensor_plan", "tp_model_problem"]
