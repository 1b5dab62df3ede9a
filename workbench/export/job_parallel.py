"""Tensor parallelism in the exported FSDP and Lightning jobs: the model's layers split
over the tensor-parallel ranks of a device mesh by the job's own copy of the workbench's
plan (`workbench.train.techniques.tensor_plan`: the built-in GPT and Llama-style transformers
decoders), and the gradient norm over DTensor shards.

The workbench ships it as `workbench/export/job_parallel.py` and copies it as is beside
`job_common.py` (which imports it and re-exports `tensor_parallelize` and
`sharded_grad_norm`) in every export; it imports nothing of the workbench.
"""

from __future__ import annotations

from typing import Any

import torch

if __package__:  # a module of the package
    from workbench.export.job_files import fail
else:  # the exported folder's own job_files.py beside it
    from job_files import fail  # type: ignore[no-redef, import-not-found]


def tensor_parallelize(module: torch.nn.Module, mesh: Any, tp: int, sequence: bool) -> None:
    """Split `module` over the `tp` ranks of `mesh` in place: the job's copy of
    `workbench.train.techniques.tensor_plan` and the tensor-parallel engine's plan. The built-in GPT
    (fused qkv rows reordered so each rank's slice holds its heads' q, k and v) and
    `transformers` Llama-style decoders (with `sequence`, the norms and the residual
    stream of either split along the sequence); column-wise q/k/v (qkv) and first MLP layers,
    row-wise projections, a vocabulary-parallel embedding and head (logits left split for
    `loss_parallel`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    layers, sizes, tied = _tp_layers(module, tp, sequence)
    bad = [f"{name}={size}" for name, size in sizes.items() if size % tp]
    if bad:
        fail(f"tp={tp}: must divide {', '.join(bad)} evenly")
    stream = Shard(1) if sequence else Replicate()
    styles: dict[str, Any] = {}
    for name, kind in layers.items():
        if kind == "colwise":
            styles[name] = ColwiseParallel(input_layouts=stream)
        elif kind == "rowwise":
            styles[name] = RowwiseParallel(output_layouts=stream)
        elif kind == "embedding":
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        elif kind == "embedding-whole":
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif kind == "colwise-gathered":
            styles[name] = ColwiseParallel()
        elif kind == "gather-sequence":
            styles[name] = PrepareModuleInput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_output=True,
            )
        elif kind == "gather-sequence-kw":
            styles[name] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=True,
            )
        elif kind == "split-sequence":
            styles[name] = PrepareModuleInput(
                input_layouts=(Replicate(),),
                desired_input_layouts=(Shard(1),),
                use_local_output=True,
            )
        elif kind == "norm":
            styles[name] = SequenceParallel()
        elif kind == "positions":
            styles[name] = PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(0)
            )
        else:
            styles[name] = ColwiseParallel(
                input_layouts=stream, output_layouts=Shard(-1), use_local_output=False
            )
    parallelize_module(module, mesh, styles)
    if tied is not None:
        head, embedding = (module.get_submodule(n) for n in tied)
        head.weight = embedding.weight
    every: list[Any] = list(module.parameters())
    for p in every:
        placements = getattr(p, "placements", None)
        if p.requires_grad and placements is not None:
            p.register_hook(_placed_as(placements))


def _placed_as(placements: Any) -> Any:
    def hook(grad: Any) -> Any:  # the embedding's whole-vocabulary gradient -> its rows
        if tuple(grad.placements) == tuple(placements):
            return None
        return grad.redistribute(placements=placements)

    return hook


def _tp_layers(
    model: torch.nn.Module, tp: int, sequence: bool
) -> tuple[dict[str, str], dict[str, int], tuple[str, str] | None]:
    """(module name -> style, the sizes tp must divide, the tied (head, embedding))."""
    module: Any = model  # its submodules are read by name
    names = {n for n, _ in module.named_modules()}
    blocks: Any = getattr(module, "blocks", None)
    if type(module).__name__ == "TinyGPT" and isinstance(blocks, torch.nn.ModuleList):
        hidden = int(module.wte.weight.shape[1])
        layers: dict[str, str] = {"wte": "embedding", "head": "head"}
        gpt_blocks: list[Any] = list(blocks)
        sizes = {"heads": int(gpt_blocks[0].attn.heads), "hidden": hidden, "ffn_hidden": 4 * hidden}
        if sequence:
            layers.update({"wpe": "positions", "ln_f": "norm"})
            sizes["seq_len"] = int(module.seq_len)
        for i, block in enumerate(gpt_blocks):
            if sequence:
                layers[f"blocks.{i}.ln_1"] = layers[f"blocks.{i}.ln_2"] = "norm"
            layers[f"blocks.{i}.attn.qkv"] = layers[f"blocks.{i}.mlp.fc"] = "colwise"
            layers[f"blocks.{i}.attn.proj"] = layers[f"blocks.{i}.mlp.fc_proj"] = "rowwise"
            if hidden % tp == 0:
                c = hidden // tp
                order = torch.cat(
                    [
                        torch.arange(j * hidden + r * c, j * hidden + (r + 1) * c)
                        for r in range(tp)
                        for j in range(3)
                    ]
                )
                with torch.no_grad():
                    for p in (block.attn.qkv.weight, block.attn.qkv.bias):
                        p.copy_(p[order])
        tied = ("head", "wte") if module.head.weight is module.wte.weight else None
        return layers, sizes, tied
    n = len(getattr(getattr(module, "model", None), "layers", None) or [])
    want = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
    llama = n > 0 and all(f"model.layers.{i}.{w}" in names for i in range(n) for w in want)
    if not llama or "model.embed_tokens" not in names or "lm_head" not in names:
        fail(
            f"tp={tp}: {type(module).__name__} has no tensor-parallel plan; tp > 1 splits the "
            "workbench GPT and transformers Llama-style decoders"
        )
    layers = {"model.embed_tokens": "embedding", "lm_head": "head"}
    if sequence:  # positions and the mask read the embedding's output: whole there
        layers.update({"model.embed_tokens": "embedding-whole", "model.layers.0": "split-sequence"})
        layers["model.norm"] = "norm"
    for i in range(n):
        if sequence:  # the attention and the MLP gather their input once each
            layers[f"model.layers.{i}.input_layernorm"] = "norm"
            layers[f"model.layers.{i}.post_attention_layernorm"] = "norm"
            layers[f"model.layers.{i}.self_attn"] = "gather-sequence-kw"
            layers[f"model.layers.{i}.mlp"] = "gather-sequence"
        for w in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            layers[f"model.layers.{i}.{w}"] = "colwise-gathered" if sequence else "colwise"
        layers[f"model.layers.{i}.self_attn.o_proj"] = "rowwise"
        layers[f"model.layers.{i}.mlp.down_proj"] = "rowwise"
    config = module.config
    heads = int(config.num_attention_heads)
    sizes = {
        "heads": heads,
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
        "hidden": int(config.hidden_size),
        "ffn_hidden": int(config.intermediate_size),
    }
    tied_llama = module.lm_head.weight is module.model.embed_tokens.weight
    return layers, sizes, ("lm_head", "model.embed_tokens") if tied_llama else None


def sharded_grad_norm(params: list[Any], world: int, clip: float | None) -> float:
    """The full gradient's norm over DTensor shards and whole tensors alike (each local
    squared sum weighted by how many ranks hold the same elements), clipped to `clip`."""
    import torch.distributed as dist

    grads: list[Any] = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        local = g.to_local() if hasattr(g, "to_local") else g
        pieces = 1
        placements = getattr(g, "placements", None)
        if placements is not None:
            for size, placement in zip(g.device_mesh.shape, placements, strict=True):
                if not (placement.is_replicate() or placement.is_partial()):
                    pieces *= int(size)
        total += local.float().pow(2).sum() * (pieces / world)
    dist.all_reduce(total)
    norm = float(total.sqrt())
    if clip is not None and clip / (norm + 1e-6) < 1.0:
        for g in grads:
            (g.to_local() if hasattr(g, "to_local") else g).mul_(clip / (norm + 1e-6))
    return norm


#: `fsdp_units` keywords: the transformer blocks with the embedding and the output head as
#: units of their own (torchtitan's `apply_fsdp`, torchtune's `custom_sharded_layers:
#: ['tok_embeddings', 'output']`), or the blocks alone with the embedding and head gathered
#: with the root.
UNIT_POLICIES = ("blocks", "blocks-only")


def unit_tokens(spec: str) -> list[str]:
    """`fsdp_units` as its list of tokens (a keyword, or class names / name patterns)."""
    return [part.strip() for part in str(spec).split(",") if part.strip()]


def _outside(module: torch.nn.Module, blocks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The leaf modules of `module` outside every block, in order."""
    inside = {id(m) for b in blocks for m in b.modules()}
    return [m for m in module.modules() if id(m) not in inside and not list(m.children())]


def fsdp_units(
    module: torch.nn.Module, spec: str, blocks: list[torch.nn.Module]
) -> tuple[list[Any], list[str]]:
    """(the units `fully_shard` is applied to, innermost first, each a module or a list of
    modules sharded as one; the tokens of `spec` that match no module) of `module` whose
    transformer blocks are `blocks`; the root is sharded after them by the caller.

    "blocks": every block, the embeddings (every `nn.Embedding` outside the blocks, one
    unit) and the output head (every `nn.Linear` outside the blocks, with the norms beside
    it, one unit); a head tied to the embedding stays with the root, with the embedding,
    since one weight cannot live in two units. "blocks-only": the blocks. Otherwise
    comma-separated class names (`LlamaDecoderLayer`) or patterns of qualified names
    (`model.layers.*`, `lm_head`; "*" and "?" match within one name segment): every module
    holding parameters that one of them matches is a unit."""
    import re

    tokens = unit_tokens(spec)
    if tokens == ["blocks-only"] or (tokens == ["blocks"] and not blocks):
        return list(blocks), []  # no blocks: the root is the one unit, as before
    if tokens == ["blocks"]:
        rest = _outside(module, blocks)
        embeddings = [m for m in rest if isinstance(m, torch.nn.Embedding)]
        heads = [m for m in rest if isinstance(m, torch.nn.Linear)]
        tied = {id(p) for m in embeddings for p in m.parameters()}
        if any(id(p) in tied for m in heads for p in m.parameters()):
            return list(blocks), []
        norms = [m for m in rest if "norm" in type(m).__name__.lower() and heads]
        units: list[Any] = list(blocks)
        if embeddings:
            units.insert(0, embeddings if len(embeddings) > 1 else embeddings[0])
        if heads:
            group = [*norms, *heads]
            units.append(group if len(group) > 1 else group[0])
        return units, []
    # modules holding parameters; a pattern's "*" and "?" stay within one name segment
    named = [(n, m) for n, m in module.named_modules() if n and any(True for _ in m.parameters())]
    matched: list[tuple[str, torch.nn.Module]] = []
    missing = []
    for token in tokens:
        segment = re.escape(token).replace(r"\*", "[^.]*").replace(r"\?", "[^.]")
        hits = [(n, m) for n, m in named if type(m).__name__ == token or re.fullmatch(segment, n)]
        if not hits:
            missing.append(token)
        matched += [h for h in hits if all(h[1] is not m for _, m in matched)]
    # nested units first: FSDP2 shards an inner unit before the one around it
    matched.sort(key=lambda nm: -nm[0].count("."))
    return [m for _, m in matched], missing


def resolve_units(
    module: torch.nn.Module, spec: str, blocks: list[torch.nn.Module]
) -> tuple[list[Any], str | None]:
    """The one resolver of `fsdp_units` that the Session, the dry run and the exported jobs
    ask: (the units `fully_shard` is applied to, innermost first, as `fsdp_units` makes
    them; why `spec` cannot be sharded on `module`, or None): names that match no module
    (`units_problem`), or a tied weight whose modules fall in two units (`tied_split`)."""
    units, missing = fsdp_units(module, spec, blocks)
    if missing:
        return units, units_problem(module, missing)
    return units, tied_split(module, units)


def tied_split(module: torch.nn.Module, units: list[Any]) -> str | None:
    """Why `units` (innermost first, the rest of `module` in the root) cannot be sharded, or
    None: FSDP2 shards each weight in one unit, the innermost holding the module that
    holds it, so a weight tied over modules in two units (a GPT-2 head whose weight is the
    embedding's, made a unit of its own) stops `fully_shard` half-way."""
    names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
    unit_of: dict[int, int] = {}  # a module -> the innermost unit holding it (-1: the root)
    for i, unit in enumerate(units):
        for part in unit if isinstance(unit, list) else [unit]:
            for m in part.modules():
                unit_of.setdefault(id(m), i)
    first: dict[int, tuple[int, str]] = {}  # a weight -> (its unit, its first name)
    for name, m in module.named_modules(remove_duplicate=False):
        here = unit_of.get(id(m), -1)
        for own, p in m.named_parameters(recurse=False, remove_duplicate=False):
            full = f"{name}.{own}" if name else own
            unit, seen = first.setdefault(id(p), (here, full))
            if unit == here:
                continue
            held = [(u, n) for u, n in ((unit, seen), (here, full)) if u >= 0]
            held += [(u, n) for u, n in ((unit, seen), (here, full)) if u < 0]
            where = [
                f"{n!r} in {'the root' if u < 0 else 'unit ' + repr(_unit_name(units[u], names))}"
                for u, n in held
            ]
            out = [repr(_unit_name(units[u], names)) for u, _ in held if u >= 0]
            return (
                f"{held[0][1]!r} is {held[1][1]!r} (one tied weight: {' and '.join(where)}), "
                "and FSDP2 shards a weight in one unit only: the tied weight's modules must "
                f"be in one unit: leave {' and '.join(out)} out (the root then holds both), "
                f"or name one module holding both ({UNIT_POLICIES[0]!r} keeps a tied head "
                "with the embedding)"
            )
    return None


def _unit_name(unit: Any, names: dict[int, str]) -> str:
    """A unit's qualified name (its modules' joined by "+" for a group)."""
    return "+".join(names.get(id(m), "?") for m in (unit if isinstance(unit, list) else [unit]))


def module_names(module: torch.nn.Module, limit: int = 40) -> tuple[list[str], list[str]]:
    """(the distinct class names of `module`'s submodules, its qualified names with the
    repeated indices folded to `*`), at most `limit` of each: what `fsdp_units` can name."""
    import re

    classes: list[str] = []
    names: list[str] = []
    for n, m in module.named_modules():
        if not n:
            continue
        c = type(m).__name__
        if c not in classes:
            classes.append(c)
        folded = re.sub(r"\.\d+(?=\.|$)", ".*", n)
        if folded not in names:
            names.append(folded)
    return classes[:limit], names[:limit]


def units_problem(module: torch.nn.Module, missing: list[str]) -> str:
    """Why `fsdp_units` tokens `missing` were refused: each matches no module; what the
    model's modules are called (classes and folded qualified names) to pick from."""
    classes, names = module_names(module)
    verb = "matches" if len(missing) == 1 else "match"
    return (
        f"{', '.join(repr(t) for t in missing)} {verb} no module of the model: name a "
        f"module class ({', '.join(classes)}) or a qualified-name pattern "
        f"({', '.join(names)}), or use {' or '.join(UNIT_POLICIES)}"
    )
