"""Checking the estimator's inputs: `estimate_memory`'s keyword arguments turned into one
frozen `EstimateInputs`, every value typed and in range and the model resolved.

`check_inputs` reads every keyword (choices from `schema`, where each keyword is declared;
ranges from `limits`, counts such as "7B" from `counts`), resolves the model from a preset (`presets`), a Hugging Face config
(`hf_config`), a torch module (`from_module`, which imports torch when called), a shape
(`architecture`) or a parameter count, and checks how the inputs combine (ZeRO vs FSDP,
offload, the tensor/pipeline/data-parallel split). Every problem is collected and raised as
one `EstimateInputError`. The arithmetic (`arithmetic`) reads the result and checks
nothing; the one limit that needs a computed figure, the activation bytes of a GPU, is
`check_activation_size`.

Past 600 lines because every input of `estimate_memory` is read here once, next to the
combinations it takes part in, so one error lists every problem; one value is read by
`readers`, the LoRA inputs are checked in `lora_inputs`, the arithmetic lives in its own
modules. A problem that only says the model's shape is missing (`Problem.needs_model`) is
dropped when the model itself (a preset name, a config.json, a module) was refused: the
user sees that refusal alone, not the shape it could not give.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from workbench.config import OptimizerName, Precision
from workbench.estimate.activations import Attention, Checkpointing
from workbench.estimate.architecture import Architecture, build_architecture, parameter_shapes
from workbench.estimate.catalog import GpuSpec, find_gpu
from workbench.estimate.context_parallel import problems as cp_problems
from workbench.estimate.context_parallel import rank_view
from workbench.estimate.counts import COUNT_EXAMPLES
from workbench.estimate.deepspeed_buffers import read_deepspeed_buffers
from workbench.estimate.frozen import field_names, of_every_field
from workbench.estimate.hf_build import config_facts
from workbench.estimate.limits import (
    GIB,
    LIMITS,
    MAX_BYTES_PER_GPU,
    as_int,
    check_number,
)
from workbench.estimate.lora import LoraFacts
from workbench.estimate.lora_inputs import lora_inputs
from workbench.estimate.model_states import ACCOUNTINGS
from workbench.estimate.presets import find_model
from workbench.estimate.problems import EstimateInputError, Problem
from workbench.estimate.readers import checked as _checked
from workbench.estimate.readers import choice as _choice
from workbench.estimate.readers import count as _count
from workbench.estimate.readers import flag as _flag
from workbench.estimate.schema import OPTIMIZER_IMPLS, choices_of
from workbench.inputs import shown
from workbench.optimizers import row

SHAPE_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab")

#: The architecture keywords of `estimate_memory`; given with a model, they override its own.
ARCH_FIELDS = (
    *SHAPE_FIELDS,
    "kv_heads",
    "ffn_hidden",
    "mlp",
    "norm",
    "bias",
    "positions",
    "tied_embeddings",
    "parallel_residual",
    "activation_function",
    "norm_impl",
    "eager_softmax",
    "qk_norm",
    "post_norms",
)


def _table(name: str, read: Any = str) -> dict[str, Any]:
    """Choice keyword `name`'s allowed text (declared in `schema`; stripped and lower case,
    as `_choice` reads a value) -> what it reads as."""
    table = {str(value): read(value) for value in choices_of(name)}
    assert all(key == key.strip().lower() for key in table), table
    return table


_PRECISIONS = _table("precision", Precision)
_OPTIMIZERS = _table("optimizer", OptimizerName)
_CHECKPOINTING = _table("checkpointing", Checkpointing)
_ATTENTION = _table("attention", Attention)
_IMPLS = _table("optimizer_impl")
_FSDP = _table("fsdp")
_FSDP_UNITS = _table("fsdp_units")
_NEEDS_SHAPE = (
    "needs a transformer shape (a `model` or `layers`, `hidden`, `heads`, `seq_len`, "
    "`vocab`) to split the model"
)


@dataclass(frozen=True)
class EstimateInputs:
    """The inputs of one estimate, checked and resolved (made by `check_inputs`).

    `n_params` counts the model states: the count given, a module's count or the shape's.
    `architecture` is the transformer shape (None without one: then no activations).
    `model` is the preset's name or the module's class name, `hf_config` the config's path
    (or "dict"). `gpus = tensor_parallel x pipeline_parallel x data_parallel`, where
    `data_parallel` includes the `context_parallel` ranks (they hold the same parameters);
    `shard_params` is what one GPU holds before ZeRO shards it over `data_parallel`.
    `fsdp` is an FSDP mode ("off": ZeRO `zero_stage`), `accounting` a key of
    `model_states.ACCOUNTINGS` ("fsdp" whenever `fsdp` is on).
    """

    n_params: int
    architecture: Architecture | None
    model: str | None
    hf_config: str | None
    micro_batch: int
    precision: Precision
    optimizer: OptimizerName
    checkpointing: Checkpointing
    zero_stage: int
    fsdp: str
    accounting: str
    offload_optimizer: bool
    offload_params: bool
    dropout: bool
    gpus: int
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    sequence_parallel: bool
    shard_params: int
    gpu: GpuSpec | None
    overhead_gib: float | None  # None: derived ("auto", `workbench.estimate.reserve`)
    tokens: float | None
    mfu: float
    price_per_gpu_hour: float | None
    # the peak of a step (`peak`)
    attention: Attention = Attention.SDPA
    optimizer_impl: str = "auto"
    grad_accum: int = 1
    loss_chunks: int = 1
    bucket_view: bool = False
    fsdp_reduce_fp32: bool = True
    #: FSDP's units: "blocks" (embedding and head units of their own) or "blocks-only"
    #: (gathered with the root)
    fsdp_units: str = "blocks"
    weight_decay: float = 0.0
    optimizer_in_backward: bool = False
    activation_offload: bool = False
    document_mask: bool = False  # per-sample attention masks (packed documents)
    compile: bool = False  # torch.compile: what its partitioner recomputes (`compiled`)
    lazy_loading: bool = True  # CUDA's lazy module loading: the context's size (`reserve`)
    lora: LoraFacts | None = None  # LoRA / QLoRA (`workbench.estimate.lora`)
    deepspeed: Mapping[str, Any] = field(default_factory=dict)
    deepspeed_given: bool = False
    # a module's or a built config's: its active parameters (None: the shape's) and why
    # its activations are not estimated when it gives no shape
    active_params: int | None = None
    activation_note: str | None = None
    # what the shape assumed of an MLP activation function its config names and the
    # estimator does not know (`activation_functions.unknown_note`)
    activation_function_note: str | None = None
    # where the shape was read when not at the config's top level (`hf_build.ModelFacts`)
    shape_note: str | None = None
    # the trained parameters' shapes (a module's, or its shape's: `parameter_shapes_of`);
    # None where they do not describe `shard_params` (a factored optimizer's states
    # follow them; without them its bound is counted)
    parameter_shapes: tuple[tuple[int, ...], ...] | None = None
    # context parallelism (`workbench.estimate.context_parallel`): `architecture` is then
    # one rank's view, its `seq_len` the rank's share (the model's sequence / this)
    context_parallel: int = 1


#: `EstimateInputs`'s fields (`check_inputs` builds it in one step: `frozen.of_every_field`).
_INPUT_FIELDS = field_names(EstimateInputs)


# ---------------------------------------------------------------- readers
def _impl_of(p: list[Problem], impl: str, optimizer: OptimizerName) -> None:
    """Refuse an implementation `optimizer` has none of (its row's `implementations`)."""
    kinds = row(optimizer).implementations
    if impl != "auto" and impl not in kinds:
        why = "runs only as a fused kernel" if kinds == ("fused",) else f"has no {impl} kernel"
        message = f"`optimizer` {optimizer.value} {why}: must be one of auto, {', '.join(kinds)}"
        p.append(Problem("optimizer_impl", impl, message))


# ---------------------------------------------------------------- the model
def parameter_shapes_of(
    counted: tuple[tuple[int, ...], ...] | None, arch: Architecture | None, params: int
) -> tuple[tuple[int, ...], ...] | None:
    """The shapes of the `params` parameters one GPU holds before ZeRO: a module's own
    (`counted`), else its shape's (`architecture.parameter_shapes`), when they count
    `params` (so never under tensor or pipeline parallelism); None otherwise."""
    shapes = counted if counted is not None else (_shapes_of(arch) if arch is not None else None)
    if shapes is None or _elements(shapes) != params:
        return None
    return shapes


#: The last architecture's shapes, found by identity (a preset's and a built shape's
#: `Architecture` come back as the same object; hashing one for `parameter_shapes`'s cache
#: reads every field)
_LAST_SHAPES: list[Any] = [None, None]


def _shapes_of(arch: Architecture) -> tuple[tuple[int, ...], ...]:
    """`parameter_shapes(arch)`, the last one remembered by identity."""
    if _LAST_SHAPES[0] is not arch:
        _LAST_SHAPES[:] = [arch, parameter_shapes(arch)]
    return _LAST_SHAPES[1]  # type: ignore[no-any-return]


#: The last shapes counted, found by identity (`parameter_shapes` caches its tuples, and a
#: module's are read once per estimate): summing a model's thousand shapes on every
#: estimate cost more than the rest of it.
_LAST_COUNTED: list[Any] = [None, 0]


def _elements(shapes: tuple[tuple[int, ...], ...]) -> int:
    if _LAST_COUNTED[0] is not shapes:
        _LAST_COUNTED[:] = [shapes, sum(math.prod(s) for s in shapes)]
    return int(_LAST_COUNTED[1])


class _Source(NamedTuple):
    """Where the model's shape comes from: a preset's or an `Architecture` (`base`), or the
    fields of a config or module (`fields`), and a module's (or a built config's)
    parameter count, its active parameters (a mixture of experts: the count less the
    experts a token is not routed to; None: the shape's `active_params`) and why its
    activations are not estimated when it gives no shape (`activation_note`)."""

    name: str | None = None
    config_name: str | None = None
    base: Architecture | None = None
    fields: Mapping[str, Any] | None = None
    counted: int | None = None
    active_params: int | None = None
    activation_note: str | None = None
    training: Mapping[str, Any] | None = None  # `hf_shape.training_facts`: dropout, attention
    shapes: tuple[tuple[int, ...], ...] | None = None  # a module's parameters' shapes
    refused: bool = False  # the model, config or module itself was refused
    no_shape_reason: str | None = None  # why a counted model gives no shape
    activation_function_note: str | None = None  # an unknown activation's assumption
    shape_note: str | None = None  # a multimodal model's language model


def _training(model: Any, hf_config: Any) -> dict[str, Any]:
    """The dropout and attention kernel a module's or a config's Hugging Face config says
    it trains with (`hf_shape.training_facts`; {} when there is no config)."""
    from workbench.estimate.hf_shape import language_model, training_facts

    if model is not None:
        config = getattr(model, "config", None)
        to_dict = getattr(config, "to_dict", None)
        if not callable(to_dict):
            return {}
        try:
            data = to_dict()
        except Exception:  # a config that cannot describe itself says nothing
            return {}
        kernel = getattr(config, "_attn_implementation", None)
        return training_facts(language_model(data), kernel) if isinstance(data, Mapping) else {}
    from workbench.estimate.hf_config import load_config

    config, _, problem = load_config(hf_config, "hf_config")
    return training_facts(language_model(config)) if problem is None and config is not None else {}


def _model_source(
    p: list[Problem], model: Any, hf_config: Any, shape: Mapping[str, Any]
) -> _Source:
    """The model named by `model` or `hf_config` (an empty `_Source` for neither); a
    config counted by building its model is built with the shape keywords `shape` set
    (`hf_build.override_config`)."""
    if model is not None and hf_config is not None:
        p.append(Problem("hf_config", hf_config, "give `model` or `hf_config`, not both"))
        return _Source(refused=True)
    if isinstance(model, str):
        found = find_model(model)
        if isinstance(found, str):
            p.append(Problem("model", model, found))
            return _Source(refused=True)
        return _Source(name=found.name, base=found.architecture)
    if isinstance(model, Architecture):
        return _Source(base=model)
    if model is not None and not (callable(model) or hasattr(model, "parameters")):
        message = (
            "must be a model name, an Architecture, a torch nn.Module or a function that builds one"
        )
        p.append(Problem("model", model, message))
        return _Source(refused=True)
    if model is not None:
        from workbench.estimate.from_module import module_facts  # imports torch

        facts = module_facts(model)
    elif hf_config is not None:
        facts = config_facts(hf_config, overrides=shape)  # imports torch for a built family
    else:
        return _Source()
    p.extend(facts.problems)
    config_name = None
    if hf_config is not None and not facts.problems:  # a path or a dict: named as it is
        config_name = "dict" if isinstance(hf_config, Mapping) else str(hf_config)
    return _Source(
        name=facts.name,
        config_name=config_name,
        fields=facts.fields,
        counted=facts.counted,
        active_params=facts.active_params,
        activation_note=facts.activation_note,
        training=(facts.training if facts.training is not None else _training(model, hf_config))
        if not facts.problems
        else {},
        shapes=facts.parameter_shapes,
        refused=bool(facts.problems),
        no_shape_reason=facts.no_shape_reason,
        activation_function_note=facts.activation_function_note,
        shape_note=facts.shape_note,
    )


def _architecture(
    p: list[Problem], source: _Source, given: dict[str, Any], hf_config: Any = None
) -> Architecture | None:
    """The source's shape with the architecture keywords `given` applied and checked (None
    when the source was refused: its shape is not known, what `given` lacks not asked)."""
    if source.refused:
        return None
    if source.base is not None:
        try:
            return source.base.replace(**given)
        except EstimateInputError as exc:
            p.extend(exc.problems)
            return None
    base_fields = source.fields or {}
    if not (base_fields or given):
        return None
    counted_only = source.counted is not None and not base_fields
    if counted_only and (source.config_name is not None or set(given) == {"seq_len"}):
        return None  # a model counted without a shape: `activation_note` says why
    merged = {**base_fields, **given}
    merged.pop("dropout", None)  # a training fact of the source, not part of the shape
    if base_fields and "seq_len" in given and merged.get("positions") == "learned":
        merged.setdefault("max_positions", base_fields["seq_len"])
    arch, shape_problems = build_architecture(merged)
    if source.config_name is not None and shape_problems:
        shape_problems = _config_problems(shape_problems, given, source, hf_config)
    p.extend(shape_problems)
    return arch


_NAMED = re.compile(r"`(\w+)`")


def _config_problems(
    problems: list[Problem], given: Mapping[str, Any], source: _Source, hf_config: Any
) -> list[Problem]:
    """The shape's `problems` said as the config's where its own values are at fault:
    a problem of a field not `given` names `hf_config` and the config's key
    (`num_attention_heads 4: must divide hidden_size=66 evenly`); a field given that
    disagrees with the config names the config's key it disagrees with."""
    from workbench.estimate.hf_build import config_key
    from workbench.estimate.hf_config import load_config

    config, _, _ = load_config(hf_config, "hf_config")
    config = config or {}
    out = []
    for q in problems:
        own = q.field not in given and not q.missing

        def named(m: re.Match[str], own: bool = own) -> str:
            name = m.group(1)
            if name in given:
                return m.group(0)
            return config_key(config, name) if own else f"the config's {config_key(config, name)}"

        message = _NAMED.sub(named, q.message)
        if own:
            key = config_key(config, q.field)
            out.append(
                Problem("hf_config", source.config_name, f"{key} {shown(q.value)}: {message}")
            )
        else:
            out.append(Problem(q.field, q.value, message, q.missing, q.needs_model))
    return out


def _model(
    p: list[Problem], given: Mapping[str, Any]
) -> tuple[int | None, _Source, Architecture | None]:
    """(the parameter count of the model states, where the model comes from, its shape)."""
    n_params, model, hf_config = given["n_params"], given["model"], given["hf_config"]
    n = _count(p, "n_params", n_params) if n_params is not None else None
    shape = {k: given[k] for k in ARCH_FIELDS if given[k] is not None}
    source = _model_source(p, model, hf_config, shape)
    if source.counted is not None and not source.fields and set(shape) == {"seq_len"}:
        source = source._replace(activation_note=source.activation_note or _no_shape(source))
    arch = _architecture(p, source, shape, hf_config)
    nothing = n_params is None and model is None and hf_config is None
    if nothing and source.base is None and not (source.fields or shape):
        message = (
            "give `n_params`, a `model` or a transformer shape (`layers`, `hidden`, "
            "`heads`, `seq_len`, `vocab`)"
        )
        p.append(Problem("n_params", None, message, missing=True))
    if n is None and n_params is None:
        n = (
            source.counted
            if source.counted is not None
            else (arch.n_params if arch is not None else None)
        )
    return n, source, arch


def _why_no_shape(problem: Problem, source: _Source) -> Problem:
    """`problem` (it needs the model's shape) with why the model given has none."""
    what = (
        f"the config.json {source.config_name}"
        if source.config_name not in (None, "dict")
        else "the config"
        if source.config_name
        else source.name or "the module"
    )
    reason = (
        source.no_shape_reason
        or source.activation_note
        or "it has no Hugging Face config to read one from"
    )
    return Problem(
        problem.field,
        problem.value,
        f"{problem.message}; {what} was counted but gives no transformer shape ({reason})",
    )


def _no_shape(source: _Source) -> str:
    """Why a module counted without a Hugging Face config has no activations at `seq_len`."""
    reason = (
        f"{source.name or 'the module'} has no Hugging Face config to read its transformer "
        "shape from (give its layers, hidden, heads and vocab with seq_len)"
    )
    return f"activations not estimated: {reason}; a dry run of the model measures them"


#: Families whose published training used dropout (GPT-2 and GPT-3: 0.1). Llama,
#: Mistral, Qwen2 and Pythia (gpt_neox) were trained without; their configs say 0.0.
TRAINED_WITH_DROPOUT = frozenset({"gpt2"})


def _default_dropout(given: Mapping[str, Any], source: _Source) -> bool:
    """Whether the model trains with dropout when `dropout` is not given: a preset's family
    (`TRAINED_WITH_DROPOUT`), the rates of a config or module's config
    (`hf_shape.training_facts`), else True (a bare shape: Korthikanti et al.'s setting)."""
    if isinstance(given["model"], str) and source.name is not None:
        preset = find_model(source.name)
        if not isinstance(preset, str):
            return preset.family in TRAINED_WITH_DROPOUT
    rate = (source.training or {}).get("dropout")
    return rate if isinstance(rate, bool) else True


# ---------------------------------------------------------------- the training setup
def _zero_stage(p: list[Problem], zero_stage: Any) -> int | None:
    stage = as_int(zero_stage)
    if stage is None or not 0 <= stage <= 3:
        p.append(Problem("zero_stage", zero_stage, "must be 0, 1, 2 or 3"))
        return None
    return stage


def _engine_problems(
    p: list[Problem],
    sharding: str | None,
    stage: int | None,
    prec: Precision | None,
    offload_optimizer: bool,
    offload_params: bool,
    accounting: Any,
) -> Any:
    """What FSDP (`sharding` not "off") or ZeRO (`stage`) allows of the precision, offload
    and accounting; returns the accounting ("fsdp" for an FSDP setup)."""
    if sharding is None:
        return accounting
    if sharding == "off":
        if prec is Precision.BF16_TRUE and ((stage or 0) >= 1 or accounting == "deepspeed"):
            message = (
                "is pure bf16 (no fp32 master copy), which DeepSpeed does not train: use "
                "'bf16' (bf16 weights, fp32 master copy) with ZeRO"
            )
            p.append(Problem("precision", "bf16-true", message))
        if stage is not None:
            if offload_optimizer and stage == 0:
                p.append(Problem("offload_optimizer", True, "needs `zero_stage` 1, 2 or 3 (got 0)"))
            if offload_params and stage != 3:
                p.append(Problem("offload_params", True, f"needs `zero_stage` 3 (got {stage})"))
        return accounting
    if stage not in (None, 0):
        p.append(Problem("fsdp", sharding, f"is PyTorch FSDP: needs `zero_stage` 0 (got {stage})"))
    if prec is not None and prec.is_deepspeed:
        message = f"needs precision fp32, amp-bf16, amp-fp16 or bf16-true (got {prec.value})"
        p.append(Problem("fsdp", sharding, message))
    if offload_optimizer:
        message = "is DeepSpeed's; FSDP offloads with `offload_params`"
        p.append(Problem("offload_optimizer", True, message))
    if offload_params and sharding != "full_shard":
        p.append(
            Problem("offload_params", True, f"needs fsdp 'full_shard' (got {shown(sharding)})")
        )
    if accounting not in ("paper", "fsdp"):
        p.append(Problem("accounting", accounting, "an FSDP setup is counted by 'fsdp'"))
    return "fsdp"


# ---------------------------------------------------------------- the parallel layout
def _data_parallel(
    p: list[Problem],
    gpus: Any,
    arch: Architecture | None,
    n_gpus: int | None,
    tp: int | None,
    pp: int | None,
) -> int | None:
    """`gpus / (tensor_parallel x pipeline_parallel)`, after checking that the model can be
    split so (None where a size is invalid)."""
    if tp is None or pp is None:
        return None
    if arch is None and (tp > 1 or pp > 1):
        for which, size in (("tensor_parallel", tp), ("pipeline_parallel", pp)):
            if size > 1:
                p.append(Problem(which, size, _NEEDS_SHAPE, needs_model=True))
    elif arch is not None and (tp > 1 or pp > 1):  # every shape splits by 1
        p.extend(arch.parallel_problems(tp, pp))
    if n_gpus is None:
        return None
    if n_gpus % (tp * pp):
        message = f"must be a multiple of `tensor_parallel` x `pipeline_parallel` = {tp * pp}"
        p.append(Problem("gpus", gpus, message))
        return None
    return int(n_gpus // (tp * pp))


def _shard_params(
    p: list[Problem],
    gpus: Any,
    n: int | None,
    arch: Architecture | None,
    tp: int | None,
    pp: int | None,
    dp: int | None,
) -> int | None:
    """The parameters on one GPU before ZeRO: the tensor-parallel share of the largest
    pipeline stage, checked to be at least the data-parallel size."""
    shard: int | None = None
    if n is not None and tp is not None and pp is not None:
        if tp == 1 and pp == 1:
            shard = n
        elif arch is not None and not p:
            stage_n = arch.stage_params(tp, pp)
            total_n = arch.n_params
            shard = stage_n if n == total_n else -(-n * stage_n // total_n)
    if shard is not None and dp is not None and dp > shard:
        if tp == 1 and pp == 1:
            p.append(Problem("gpus", gpus, f"must not exceed the parameter count ({n})"))
        else:
            message = (
                f"gives a data-parallel size of {dp}, more than the parameters of one "
                f"model-parallel shard ({shard})"
            )
            p.append(Problem("gpus", gpus, message))
    return shard


# ---------------------------------------------------------------- GPU and compute
def _gpu(p: list[Problem], gpu: Any) -> GpuSpec | None:
    if gpu is None:
        return None
    found = find_gpu(gpu)
    if isinstance(found, str):
        p.append(Problem("gpu", gpu, found))
        return None
    return found


_TOKENS_HIGH = LIMITS["tokens"].high


def _tokens(p: list[Problem], tokens: Any) -> float | None:
    """The training tokens: a count as text ("300B") or a number."""
    if type(tokens) is float and 0.0 < tokens <= _TOKENS_HIGH:  # in range: reads as itself
        return tokens
    if isinstance(tokens, str):
        counted = _count(p, "tokens", tokens)
        return float(counted) if counted is not None else None
    if tokens is None:
        return None
    number, message = check_number("tokens", tokens)
    if message is not None:
        p.append(Problem("tokens", tokens, f"{message} ({COUNT_EXAMPLES})"))
    return number  # type: ignore[no-any-return]


# ---------------------------------------------------------------- all together
def check_inputs(given: Mapping[str, Any]) -> EstimateInputs:
    """`given`, every keyword of `estimate_memory` (defaults included), read, checked and
    resolved. Raises `EstimateInputError` listing every problem at once."""
    p: list[Problem] = []
    n, source, arch = _model(p, given)

    mb = _checked(p, "micro_batch", given["micro_batch"])
    prec = _choice(p, "precision", given["precision"], _PRECISIONS)
    opt = _choice(p, "optimizer", given["optimizer"], _OPTIMIZERS)
    ckpt = _choice(p, "checkpointing", given["checkpointing"], _CHECKPOINTING)
    stage = _zero_stage(p, given["zero_stage"])
    gpus = given["gpus"]
    n_gpus = _checked(p, "gpus", gpus)
    tp = _checked(p, "tensor_parallel", given["tensor_parallel"])
    pp = _checked(p, "pipeline_parallel", given["pipeline_parallel"])
    cp = _checked(p, "context_parallel", given["context_parallel"])
    dropout = (
        _flag(p, "dropout", given["dropout"])
        if given["dropout"] is not None
        else _default_dropout(given, source)
    )
    sp = _flag(p, "sequence_parallel", given["sequence_parallel"])
    offload_optimizer = _flag(p, "offload_optimizer", given["offload_optimizer"])
    offload_params = _flag(p, "offload_params", given["offload_params"])
    if sp is True and tp == 1:
        p.append(Problem("sequence_parallel", True, "needs `tensor_parallel` > 1 (got 1)"))
    sharding = _choice(p, "fsdp", given["fsdp"], _FSDP)
    accounting = _engine_problems(
        p,
        sharding,
        stage,
        prec,
        offload_optimizer is True,
        offload_params is True,
        given["accounting"],
    )
    dp = _data_parallel(p, gpus, arch, n_gpus, tp, pp)

    gpu = _gpu(p, given["gpu"])
    overhead = given["overhead_gib"]
    derived = isinstance(overhead, str) and overhead.strip().lower() == "auto"
    if derived:
        overhead = None
    else:
        number, message = check_number("overhead_gib", overhead)
        if message is not None:
            p.append(Problem("overhead_gib", overhead, f"{message}, or auto (derived)"))
        overhead = number
    tokens = _tokens(p, given["tokens"])
    mfu = _checked(p, "mfu", given["mfu"])
    price = given["price_per_gpu_hour"]
    if price is not None:
        price = _checked(p, "price_per_gpu_hour", price)
        if given["tokens"] is None:  # a price alone prices nothing: said, as plan() says it
            p.append(
                Problem(
                    "price_per_gpu_hour",
                    given["price_per_gpu_hour"],
                    "the cost is of training the tokens; give the tokens to train too (tokens=, --tokens)",
                )
            )
    if not isinstance(accounting, str) or accounting not in ACCOUNTINGS:  # a registry
        p.append(Problem("accounting", accounting, f"must be one of {', '.join(ACCOUNTINGS)}"))
    shard = _shard_params(p, gpus, n, arch, tp, pp, dp)

    kernel = given["attention"]
    if kernel is None:  # the model's (a config's attn_implementation), else torch's default
        kernel = (source.training or {}).get("attention", Attention.SDPA.value)
    attention = _choice(p, "attention", kernel, _ATTENTION)
    impl = _choice(p, "optimizer_impl", given["optimizer_impl"], _IMPLS)
    if impl is not None and opt is not None:
        _impl_of(p, impl, opt)
    grad_accum = _checked(p, "grad_accum", given["grad_accum"])
    chunks = _checked(p, "loss_chunks", given["loss_chunks"])
    if chunks is not None and arch is not None and chunks > arch.seq_len:
        message = f"must not exceed seq_len ({arch.seq_len}): a chunk holds at least one token"
        p.append(Problem("loss_chunks", chunks, message))
    bucket_view = _flag(p, "bucket_view", given["bucket_view"])
    reduce_fp32 = _flag(p, "fsdp_reduce_fp32", given["fsdp_reduce_fp32"])
    units = _choice(p, "fsdp_units", given["fsdp_units"], _FSDP_UNITS)
    decay = _checked(p, "weight_decay", given["weight_decay"])
    in_backward = _flag(p, "optimizer_in_backward", given["optimizer_in_backward"])
    if in_backward is True:
        if grad_accum not in (None, 1):
            p.append(
                Problem(
                    "optimizer_in_backward",
                    True,
                    "steps each parameter as its gradient is ready: needs grad_accum=1",
                )
            )
        if (stage or 0) > 0 or sharding not in (None, "off") or (n_gpus or 1) > 1:
            p.append(
                Problem(
                    "optimizer_in_backward",
                    True,
                    "counted for the plain loop on one GPU (zero_stage=0, no fsdp, gpus=1)",
                )
            )
    act_offload = _flag(p, "activation_offload", given["activation_offload"])
    if act_offload is True and (pp or 1) > 1:
        p.append(
            Problem(
                "activation_offload",
                True,
                "counted without pipeline parallelism (pipeline_parallel=1): a stage's "
                "micro-batches in flight are not modelled on the host",
            )
        )
    doc_mask = _flag(p, "document_mask", given["document_mask"])
    compiled = _flag(p, "compile", given["compile"])
    lazy = _flag(p, "lazy_loading", given["lazy_loading"])
    lora = lora_inputs(p, given, arch, tp, pp, prec)
    ds_source = given["deepspeed_config"]
    ds, ds_problems = read_deepspeed_buffers(ds_source)
    p.extend(ds_problems)
    if ds_source is not None and sharding not in (None, "off"):
        p.append(Problem("deepspeed_config", "given", "is DeepSpeed's; this setup is FSDP"))

    if cp is not None and cp > 1:
        p.extend(cp_problems(cp, arch, n_gpus, gpus, tp, pp, attention, doc_mask))
    if source.refused:  # the model's own problem, not what its missing shape leads to
        p = [q for q in p if not q.needs_model]
    elif arch is None and source.counted is not None:  # a model given: say why no shape
        p = [_why_no_shape(q, source) if q.needs_model else q for q in p]
    if p:
        raise EstimateInputError(p)
    if cp > 1 and arch is not None:  # one rank's view: its share of the sequence
        arch = rank_view(arch, cp)
    assert n is not None and prec is not None and opt is not None and ckpt is not None
    assert stage is not None and sharding is not None and mb is not None
    assert n_gpus is not None and tp is not None and pp is not None and dp is not None
    assert shard is not None and (derived or overhead is not None) and mfu is not None
    return of_every_field(
        EstimateInputs,
        _INPUT_FIELDS,
        dict(
            n_params=n,
            architecture=arch,
            model=source.name,
            hf_config=source.config_name,
            micro_batch=mb,
            precision=prec,
            optimizer=opt,
            checkpointing=ckpt,
            zero_stage=stage,
            fsdp=sharding,
            accounting=accounting,
            offload_optimizer=offload_optimizer,
            offload_params=offload_params,
            dropout=dropout,
            gpus=n_gpus,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            data_parallel=dp,
            sequence_parallel=sp,
            shard_params=shard,
            gpu=gpu,
            overhead_gib=overhead,
            tokens=tokens,
            mfu=mfu,
            price_per_gpu_hour=price,
            active_params=source.active_params,
            activation_note=source.activation_note if arch is None else None,
            activation_function_note=source.activation_function_note
            if arch is not None and given["activation_function"] is None
            else None,
            shape_note=source.shape_note if arch is not None else None,
            attention=attention,
            optimizer_impl=impl,
            grad_accum=grad_accum,
            loss_chunks=chunks,
            bucket_view=bucket_view,
            fsdp_reduce_fp32=reduce_fp32,
            fsdp_units=units,
            weight_decay=decay,
            optimizer_in_backward=bool(in_backward),
            activation_offload=bool(act_offload),
            parameter_shapes=parameter_shapes_of(source.shapes, arch, shard),
            document_mask=bool(doc_mask),
            compile=bool(compiled),
            lazy_loading=bool(lazy),
            lora=lora,
            deepspeed=ds,
            deepspeed_given=ds_source is not None,
            context_parallel=cp,
        ),
    )


def check_activation_size(inputs: EstimateInputs, activation_bytes: int) -> None:
    """Raises `EstimateInputError` when the activations of one GPU come to more than
    `MAX_BYTES_PER_GPU`: the one limit on the inputs that needs a computed figure."""
    if activation_bytes <= MAX_BYTES_PER_GPU:
        return
    arch = inputs.architecture
    mb = inputs.micro_batch
    field, value = ("micro_batch", mb) if mb > 1 or arch is None else ("seq_len", arch.seq_len)
    message = (
        f"gives {activation_bytes / GIB:.3g} GiB of activations per GPU, more than "
        "2^30 GiB (a million GPUs' memory): lower `micro_batch` or `seq_len`"
    )
    raise EstimateInputError([Problem(field, value, message)])


__all__ = [
    "ARCH_FIELDS",
    "SHAPE_FIELDS",
    "OPTIMIZER_IMPLS",
    "EstimateInputs",
    "check_activation_size",
    "check_inputs",
]
