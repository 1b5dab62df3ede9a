"""The transformer shape of a Hugging Face model of any family, read from its config.

`hf_build` builds the model a config.json describes and counts its parameters exactly;
this module (pure Python, no torch) maps the config onto the terms of `Architecture`, so
that the activation formula applies, or says why it cannot (`Shape.note`). It reads the
config as the built model holds it (`hf_build.resolved_config`: every default filled in,
and the standard names below resolved through the config class's `attribute_map`, so
GPT-2's `n_layer` is also `num_hidden_layers`).

    family                      MLP     norm       biases        positions  notes
    gpt2, mistral, qwen2,       as `hf_config.read_family` (the pure path)
    gpt_neox
    llama, granite              swiglu  rmsnorm    attention_bias rotary
                                                   and mlp_bias
    mixtral                     swiglu  rmsnorm    none          rotary     experts
    qwen2_moe                   swiglu  rmsnorm    qkv_bias      rotary     experts, a
                                                                            shared expert
    qwen3, qwen3_moe            swiglu  rmsnorm    attention_bias rotary    per-head q/k
                                                                            norms; experts
    gemma, gemma2, gemma3_text  swiglu  rmsnorm    attention_bias rotary    GeGLU (gated:
                                                                            3 matrices);
                                                                            gemma2/3: four
                                                                            norms a layer
    phi3                        swiglu  rmsnorm    none          rotary     fused QKV
    olmo2, olmoe                swiglu  rmsnorm    attention_bias rotary    q/k norms;
                                                                            olmoe experts
    starcoder2                  gelu    layernorm  use_bias      rotary
    falcon                      gelu    layernorm  bias          rotary /   parallel, one
                                                                 ALiBi      or two norms
    phi                         gelu    layernorm  all           rotary     parallel, one
                                                                            norm a layer
    gptj                        gelu    layernorm  MLP only      rotary     parallel
    gpt_bigcode                 gelu    layernorm  all           learned    multi-query
    opt                         gelu    layernorm  enable_bias   learned    (ReLU MLP, 2
                                                                            rows offset)
    bloom                       gelu    layernorm  all           ALiBi      seq_length
                                                                            or 2048
    bert, roberta, xlm-roberta  gelu    layernorm  all           learned    encoders
                                                                            (causal False)

("gelu" stands for any two-matrix MLP: ReLU's has the same shape; "swiglu" for any gated
one with three.) The MLP's activation function (`activation_function`, which sets its
inner tensors: `activation_functions`) is the config's, under the key its family's code
reads (`activation_functions.CONFIG_KEYS`: `activation_function` for gpt2, gptj,
gpt_bigcode and opt, falcon's `activation`, gemma2's and gemma3's `hidden_activation`,
`hidden_act` elsewhere; bloom runs its own `bloom_gelu`): gpt2, gptj and phi gelu_new, opt
relu, gpt_bigcode and starcoder2 gelu_pytorch_tanh, bert and gpt_neox gelu, the gated
families silu. A name the estimator does not know is counted as the MLP's default (one op
that keeps its input), and `Shape.activation_function_note` says so. The norms' and the
unfused softmax's implementations are the family's (`implementations`): the RMSNorm
families run transformers' Llama RMSNorm (`norm_impl` "llama"), gemma, gemma2/3 and olmo2
theirs with the weight's multiply in fp32 ("gemma"), the LayerNorm families torch's kernel
("kernel"); gpt2, bert, roberta and xlm-roberta run their eager softmax in the scores'
dtype (`eager_softmax` "input"), the others in fp32. Q, K and V are one linear layer (`fused_qkv`, LoRA's one target) in gpt2,
gpt_neox, falcon, gpt_bigcode and bloom (phi3's fused QKV and gate/up are left as separate
matrices: its LoRA count is the shape's, not the module's). Rotary and ALiBi positions have no table (`positions="rotary"`). Every
shape is checked against the built model: the parameters of its stack of layers must
equal the shape's layer terms plus what the family's layers hold beyond them (counted per
family below, e.g. Qwen3's per-head query/key norms or Gemma 2's extra norms); the
embeddings and heads may differ (BERT's token-type table and pooler, OPT's projections),
since the count comes from the module. A family the table does not list gets a shape when
Llama's or GPT's layout counts its layers exactly, and none otherwise.

A multimodal model (Gemma 3's, LLaVA's, Mistral 3's: a `text_config` beside a vision
tower's, no layer count at the top level) is read as its language model
(`hf_build.language_model_config`): the activations of a text-only step; its count is the
whole module's, the vision tower's too.

No shape (the parameter count stays exact, activations are not estimated, and `note`
says why) for: encoder-decoders (t5, bart), multi-head latent attention (deepseek_v2/v3),
mixtures that mix dense and expert layers, and any layer stack the shape does not count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from workbench.estimate.activation_functions import config_activation
from workbench.estimate.architecture import build_architecture
from workbench.estimate.hf_config import (
    FAMILIES,
    HEAD_DIM,
    config_flag,
    config_integer,
    read_family,
)
from workbench.estimate.implementations import (
    family_eager_softmax,
    family_norm_impl,
    family_post_norms,
    family_qk_norm,
)
from workbench.inputs import shown

#: The standard config names `hf_build.resolved_config` resolves for every family.
STANDARD_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",
    "tie_word_embeddings",
    "is_encoder_decoder",
    "is_decoder",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
)
#: Names families give their routed experts per layer, and the experts each token uses.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts")

#: BLOOM's training sequence (BigScience 2022, "BLOOM: A 176B-Parameter Open-Access
#: Multilingual Language Model", Section 3.5): ALiBi has no position limit to read.
BLOOM_SEQ_LEN = 2048


class Shape(NamedTuple):
    """The `Architecture` fields of a config (empty without a shape), why there is none
    (`note`, a sentence to show beside the estimate; `reason`, its reason alone), the
    config's invalid values (`problems`, each naming its key) and what the shape assumed
    of an MLP activation function the estimator does not know
    (`activation_function_note`)."""

    fields: dict[str, Any]
    note: str | None
    problems: list[str]
    reason: str | None = None  # why there is no shape (the note's reason alone)
    activation_function_note: str | None = None


class _Mapped(NamedTuple):
    fields: dict[str, Any]
    layer_extra: int = 0  # parameters per layer the shape's terms do not count


def _no_shape(reason: str) -> Shape:
    return Shape({}, no_activations(reason), [], reason)


def no_activations(reason: str) -> str:
    """The note of a model whose activations are not estimated, for `reason`."""
    return f"activations not estimated: {reason}; a dry run of the model measures them"


def family_shape(config: Mapping[str, Any], layer_params: int | None) -> Shape:
    """The shape of `config` (a resolved config, see the module docstring), checked
    against `layer_params`, the parameters of the built model's stack of layers (None:
    trusted unchecked, for a listed family only)."""
    model_type = config.get("model_type")
    name = model_type if isinstance(model_type, str) and model_type else "this model"
    if config.get("is_encoder_decoder") is True:
        reason = (
            f"{name} is an encoder-decoder (the activation formula covers decoder-only and "
            "encoder-only transformers)"
        )
        return _no_shape(reason)
    if config.get("kv_lora_rank") is not None:
        reason = (
            f"{name} uses multi-head latent attention (low-rank key/value projections), "
            "which the formula's attention terms do not describe"
        )
        return _no_shape(reason)
    problems: list[str] = []
    mapped: _Mapped | str
    act_note: str | None = None
    if model_type in _MAPPERS:  # llama too: every combination of its biases
        mapped = _MAPPERS[str(model_type)](config, problems)
    elif model_type in FAMILIES:
        read = read_family(config, str(model_type))
        if read.unsupported and not read.problems:
            return _no_shape(f"{name} with {read.unsupported[0]}")
        problems, mapped, act_note = read.problems, _Mapped(read.fields), read.note
    else:
        return _inferred(config, name, layer_params)
    if problems:
        return Shape({}, None, problems)
    if isinstance(mapped, str):
        return _no_shape(f"{name} {mapped}")
    if "activation_function" not in mapped.fields:
        mlp = str(mapped.fields.get("mlp"))
        mapped.fields["activation_function"], act_note = config_activation(config, name, mlp)
    norm = str(mapped.fields.get("norm") or "layernorm")
    mapped.fields.setdefault("norm_impl", family_norm_impl(model_type, norm))
    mapped.fields.setdefault("eager_softmax", family_eager_softmax(model_type, config))
    mapped.fields.setdefault("qk_norm", family_qk_norm(model_type))
    mapped.fields.setdefault("post_norms", family_post_norms(model_type))
    hidden, heads = _size(mapped.fields, "hidden"), _size(mapped.fields, "heads")
    uneven = heads > 0 and hidden % heads > 0
    if uneven and mapped.fields.get("head_dim") is None and model_type not in FAMILIES:
        mapped.fields["head_dim"] = hidden // heads  # transformers' head size: floored
    arch, _ = build_architecture(mapped.fields)
    if arch is None or layer_params is None:  # the estimate reports the shape's problems
        return Shape(mapped.fields, None, [], None, act_note)
    expected = arch.layers * (arch.layer_params() + mapped.layer_extra)
    if expected != layer_params:
        reason = (
            f"the layers of this {name} model hold {layer_params:,} parameters, the shape "
            f"read from its config {expected:,} (a variant of the family the mapping does "
            "not describe)"
        )
        return _no_shape(reason)
    return Shape(mapped.fields, None, [], None, act_note)


def language_model(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config dict's language model: its `text_config` where the top level counts no
    layers and the text config does (a multimodal model), else the config itself (the
    dropout a step trains with is read from the same place as the shape)."""
    text = config.get("text_config")
    if type(config.get("num_hidden_layers")) is int or not isinstance(text, Mapping):
        return config
    return text if type(text.get("num_hidden_layers")) is int else config


def experts_and_top_k(config: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(routed experts per layer, experts per token) under any of their names, or None."""
    return _first_int(config, EXPERT_KEYS), _first_int(config, TOP_K_KEYS)


# ---------------------------------------------------------------- reading
def _first_int(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if type(value) is int:
            return value
    return None


def _standard(
    c: Mapping[str, Any], p: list[str], *, ffn_key: str | None = "intermediate_size"
) -> dict[str, Any]:
    """The shape keys every family shares, under their standard names."""
    return {
        "layers": config_integer(c, "num_hidden_layers", "layers", p),
        "hidden": config_integer(c, "hidden_size", "hidden", p),
        "heads": config_integer(c, "num_attention_heads", "heads", p),
        "kv_heads": config_integer(c, "num_key_value_heads", "kv_heads", p),
        "ffn_hidden": config_integer(c, ffn_key, "ffn_hidden", p) if ffn_key else None,
        "vocab": config_integer(c, "vocab_size", "vocab", p),
        "seq_len": config_integer(c, "max_position_embeddings", "seq_len", p),
        "tied_embeddings": config_flag(c, "tie_word_embeddings", False, p),
    }


def _size(fields: Mapping[str, Any], name: str) -> int:
    value = fields.get(name)
    return value if isinstance(value, int) else 0


def _head_dim(c: Mapping[str, Any], p: list[str], fields: Mapping[str, Any]) -> int:
    """The head size: `head_dim` when the config has one, else hidden / heads."""
    given = config_integer(c, "head_dim", "head_dim", p, HEAD_DIM)
    heads = _size(fields, "heads")
    return given or (_size(fields, "hidden") // heads if heads else 0)


# ---------------------------------------------------------------- the families
def _gated(c: Mapping[str, Any], p: list[str]) -> dict[str, Any]:
    """Llama's layout: a gated MLP, RMSNorm, rotary positions, no biases, `head_dim`."""
    fields = _standard(c, p)
    fields["head_dim"] = config_integer(c, "head_dim", "head_dim", p, HEAD_DIM)
    fields.update(mlp="swiglu", norm="rmsnorm", bias="none", positions="rotary")
    return fields


def _attention_bias(c: Mapping[str, Any], p: list[str], fields: dict[str, Any]) -> int:
    """`attention_bias` puts biases on Q, K, V and the output: bias "qkv" and the output's
    h per layer beyond the shape's terms."""
    if config_flag(c, "attention_bias", False, p):
        fields["bias"] = "qkv"
        return _size(fields, "hidden")
    return 0


def _llama_like(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    """Llama's `attention_bias` and `mlp_bias` (granite)."""
    fields = _gated(c, p)
    extra = _attention_bias(c, p, fields)
    if config_flag(c, "mlp_bias", False, p):
        if extra:
            fields["bias"], extra = "all", 0
        else:
            extra = 2 * _size(fields, "ffn_hidden") + _size(fields, "hidden")
    return _Mapped(fields, extra)


def _experts(
    c: Mapping[str, Any], p: list[str], fields: dict[str, Any], size_key: str
) -> str | None:
    """The routed experts of a mixture (`size_key`: each expert's inner size); a reason
    when some layers are dense (Qwen's `mlp_only_layers`, `decoder_sparse_step`)."""
    experts, top_k = experts_and_top_k(c)
    if not experts:
        return None
    only = c.get("mlp_only_layers")
    step = c.get("decoder_sparse_step")
    if only or step not in (None, 1):
        return (
            "mixes dense and expert layers (mlp_only_layers, decoder_sparse_step), which "
            "one shape does not describe"
        )
    fields["experts"] = experts
    fields["experts_per_token"] = top_k
    fields["moe_ffn_hidden"] = config_integer(c, size_key, "ffn_hidden", p)
    return None


def _mixtral(c: Mapping[str, Any], p: list[str]) -> _Mapped | str:
    fields = _gated(c, p)
    return _experts(c, p, fields, "intermediate_size") or _Mapped(fields)


def _qwen2_moe(c: Mapping[str, Any], p: list[str]) -> _Mapped | str:
    fields = _gated(c, p)
    if config_flag(c, "qkv_bias", True, p):
        fields["bias"] = "qkv"
    dense = _experts(c, p, fields, "moe_intermediate_size")
    if dense:
        return dense
    shared = config_integer(c, "shared_expert_intermediate_size", "ffn_hidden", p)
    if fields.get("experts") and shared:
        fields["shared_ffn_hidden"] = shared
        return _Mapped(fields, _size(fields, "hidden"))  # the shared expert's sigmoid gate
    return _Mapped(fields)


def _qwen3(c: Mapping[str, Any], p: list[str]) -> _Mapped | str:
    fields = _gated(c, p)
    extra = _attention_bias(c, p, fields) + 2 * _head_dim(c, p, fields)  # q_norm, k_norm
    moe = c.get("model_type") == "qwen3_moe"
    dense = _experts(c, p, fields, "moe_intermediate_size") if moe else None
    return dense or _Mapped(fields, extra)


def _gemma(norms: int, qk_norm: bool) -> Callable[[Mapping[str, Any], list[str]], _Mapped]:
    """Gemma's GeGLU MLP (gated, three matrices), tied embeddings; `norms` RMSNorms a
    layer (gemma2 and gemma3 add two around the MLP) and per-head q/k norms (gemma3)."""

    def read(c: Mapping[str, Any], p: list[str]) -> _Mapped:
        fields = _gated(c, p)
        extra = _attention_bias(c, p, fields) + (norms - 2) * _size(fields, "hidden")
        if qk_norm:
            extra += 2 * _head_dim(c, p, fields)
        return _Mapped(fields, extra)

    return read


def _phi3(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    return _Mapped(_gated(c, p))


def _olmo(c: Mapping[str, Any], p: list[str]) -> _Mapped | str:
    """OLMo 2 and OLMoE: norms after attention and MLP, RMSNorms over the whole query and
    key (OLMoE's query norm is hidden wide)."""
    fields = _gated(c, p)
    head = _head_dim(c, p, fields)
    kv = _size(fields, "kv_heads") or _size(fields, "heads")
    if c.get("model_type") == "olmoe":
        query = _size(fields, "hidden")
        dense = _experts(c, p, fields, "intermediate_size")
        if dense:
            return dense
    else:
        query = _size(fields, "heads") * head
    return _Mapped(fields, _attention_bias(c, p, fields) + query + kv * head)


def _gelu(c: Mapping[str, Any], p: list[str], **changes: Any) -> dict[str, Any]:
    """GPT's layout: a two-matrix MLP, LayerNorm, biases; rotary unless `changes` say."""
    fields = _standard(c, p, ffn_key=changes.pop("ffn_key", "intermediate_size"))
    fields.update(mlp="gelu", norm="layernorm", bias="all", positions="rotary")
    fields.update(changes)
    return fields


def _starcoder2(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    bias = "all" if config_flag(c, "use_bias", True, p) else "none"
    return _Mapped(_gelu(c, p, bias=bias))


def _falcon(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    """Falcon: parallel attention and MLP; multi-query (7B) or `num_kv_heads` groups with
    two norms a layer (`new_decoder_architecture`, 40B/180B); `bias` on every linear."""
    new = config_flag(c, "new_decoder_architecture", False, p)
    parallel = config_flag(c, "parallel_attn", True, p)
    bias = "all" if config_flag(c, "bias", False, p) else "none"
    fields = _gelu(c, p, ffn_key="ffn_hidden_size", bias=bias, parallel_residual=parallel or new)
    fields["fused_qkv"] = True  # query_key_value
    if new:
        fields["kv_heads"] = config_integer(c, "num_kv_heads", "kv_heads", p)
    elif config_flag(c, "multi_query", True, p):
        fields["kv_heads"] = 1
    else:
        fields["kv_heads"] = None
    one_norm = parallel and c.get("num_ln_in_parallel_attn") != 2
    return _Mapped(fields, -2 * _size(fields, "hidden") if one_norm else 0)


def _phi(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    """Phi-1/2: parallel attention and MLP behind one LayerNorm."""
    fields = _gelu(c, p, parallel_residual=True)
    return _Mapped(fields, -2 * _size(fields, "hidden"))


def _gptj(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    """GPT-J: parallel, one LayerNorm, no attention biases, MLP biases (f + h)."""
    fields = _gelu(c, p, ffn_key="n_inner", bias="none", parallel_residual=True)
    fields["kv_heads"] = None
    h = _size(fields, "hidden")
    ffn = _size(fields, "ffn_hidden") or 4 * h
    return _Mapped(fields, ffn + h - 2 * h)


def _gpt_bigcode(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    multi_query = config_flag(c, "multi_query", True, p)
    fields = _gelu(c, p, ffn_key="n_inner", positions="learned", tied_embeddings=True)
    fields["kv_heads"] = 1 if multi_query else None
    fields["fused_qkv"] = True  # c_attn, an nn.Linear of h -> q + 2g
    return _Mapped(fields)


def _opt(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    """OPT: a ReLU MLP of `ffn_dim`, a learned table of max_position_embeddings + 2 rows
    (its positions start at 2)."""
    bias = "all" if config_flag(c, "enable_bias", True, p) else "none"
    fields = _gelu(c, p, ffn_key="ffn_dim", positions="learned", bias=bias)
    fields["kv_heads"] = None
    if isinstance(fields["seq_len"], int):
        fields["max_positions"] = fields["seq_len"] + 2
    norms = config_flag(c, "layer_norm_elementwise_affine", True, p)
    return _Mapped(fields, 0 if norms else -4 * _size(fields, "hidden"))


def _bloom(c: Mapping[str, Any], p: list[str]) -> _Mapped:
    fields = _gelu(c, p, ffn_key=None)
    fields["kv_heads"] = None
    fields["fused_qkv"] = True  # query_key_value
    if fields["seq_len"] is None:  # ALiBi: no table; the released configs' seq_length
        fields["seq_len"] = config_integer(c, "seq_length", "seq_len", p) or BLOOM_SEQ_LEN
    return _Mapped(fields)


def _encoder(c: Mapping[str, Any], p: list[str]) -> _Mapped | str:
    """BERT and RoBERTa: post-norm encoder layers (same terms, attention not causal),
    learned positions (RoBERTa's start after the padding id: a sequence is
    max_position_embeddings - pad_token_id - 1 long)."""
    kind = c.get("position_embedding_type")
    if kind not in (None, "absolute"):
        return f"with position_embedding_type={shown(kind)} adds relative-position tables"
    decoder = config_flag(c, "is_decoder", False, p)
    fields = _gelu(c, p, positions="learned", causal=decoder, tied_embeddings=True)
    fields["tied_embeddings"] = config_flag(c, "tie_word_embeddings", True, p)
    fields["kv_heads"] = None
    table = fields["seq_len"]
    if isinstance(table, int):
        fields["max_positions"] = table
        pad = c.get("pad_token_id")
        if c.get("model_type") != "bert" and type(pad) is int and 0 <= pad < table - 1:
            fields["seq_len"] = table - pad - 1
    return _Mapped(fields)


_MAPPERS: dict[str, Callable[[Mapping[str, Any], list[str]], _Mapped | str]] = {
    "llama": _llama_like,
    "granite": _llama_like,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3,
    "gemma": _gemma(2, qk_norm=False),
    "gemma2": _gemma(4, qk_norm=False),
    "gemma3_text": _gemma(4, qk_norm=True),
    "phi3": _phi3,
    "olmo2": _olmo,
    "olmoe": _olmo,
    "starcoder2": _starcoder2,
    "falcon": _falcon,
    "phi": _phi,
    "gptj": _gptj,
    "gpt_bigcode": _gpt_bigcode,
    "opt": _opt,
    "bloom": _bloom,
    "bert": _encoder,
    "roberta": _encoder,
    "xlm-roberta": _encoder,
}
#: The families mapped onto the formula's terms by name (others only when inferred).
MAPPED_FAMILIES = tuple(dict.fromkeys((*FAMILIES, *_MAPPERS)))


# ---------------------------------------------------------------- any other family
def _inferred(config: Mapping[str, Any], name: str, layer_params: int | None) -> Shape:
    """The shape of a family the table does not list: Llama's or GPT's layout, when one of
    them counts the built model's layers exactly."""
    reason = f"{name} is not a family mapped onto the activation formula's terms"
    if layer_params is None:
        return _no_shape(reason)
    p: list[str] = []
    base = _standard(config, p)
    base["head_dim"] = config_integer(config, "head_dim", "head_dim", p, HEAD_DIM)
    if p or any(base[k] is None for k in ("layers", "hidden", "heads", "vocab", "seq_len")):
        reason += " (its config lacks the standard shape keys)"
        return _no_shape(reason)
    experts, top_k = experts_and_top_k(config)
    moe: list[dict[str, Any]] = [{}]
    if experts and top_k:
        sizes = {config.get("moe_intermediate_size"), base["ffn_hidden"]} - {None}
        moe = [
            {"experts": experts, "experts_per_token": top_k, "moe_ffn_hidden": size}
            for size in sizes
            if type(size) is int
        ]
    for mlp, norm, bias in _LAYOUTS:
        for expert in moe:
            fields = {**base, **expert, "mlp": mlp, "norm": norm, "bias": bias}
            fields["positions"] = "rotary"
            fields["activation_function"], act_note = config_activation(config, name, mlp)
            arch, _ = build_architecture(fields)
            if arch is not None and arch.layers * arch.layer_params() == layer_params:
                return Shape(fields, None, [], None, act_note)
    reason += f" and neither Llama's nor GPT's layout counts its {layer_params:,} layer parameters"
    return _no_shape(reason)


_LAYOUTS = (
    ("swiglu", "rmsnorm", "none"),
    ("swiglu", "rmsnorm", "qkv"),
    ("swiglu", "layernorm", "none"),
    ("gelu", "layernorm", "all"),
    ("gelu", "layernorm", "none"),
    ("gelu", "rmsnorm", "none"),
)


__all__ = [
    "BLOOM_SEQ_LEN",
    "language_model",
    "EXPERT_KEYS",
    "MAPPED_FAMILIES",
    "STANDARD_KEYS",
    "TOP_K_KEYS",
    "Shape",
    "experts_and_top_k",
    "family_shape",
    "no_activations",
]


#: Config keys of dropout rates across transformers' families.
DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout",
    "activation_dropout",
    "dropout_rate",
)
#: transformers' `attn_implementation` values -> the estimator's attention kernel.
ATTENTION_KERNELS = {
    "eager": "eager",
    "sdpa": "sdpa",
    "flash_attention_2": "sdpa",
    "flash_attention_3": "sdpa",
    "flex_attention": "sdpa",
}


#: The dropout rates transformers' config class of each common family gives the
#: `DROPOUT_KEYS` a config.json leaves out (`CONFIG_MAPPING[family]().to_dict()`, transformers
#: 5; a test holds the table to it): read from here, a plain config.json is estimated and
#: planned without importing transformers (and torch), which takes seconds. A family not
#: listed is looked up in transformers.
FAMILY_DROPOUT: dict[str, dict[str, float]] = {
    **{
        family: {"attention_dropout": 0.0}
        for family in (
            "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
            "gemma", "gemma2", "gemma3_text", "starcoder2", "olmo", "olmo2", "deepseek_v3",
            "granite", "cohere",
        )
    },
    **{
        family: {"attention_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
        for family in ("phi", "phi3")
    },
    **{
        family: {"attention_dropout": 0.0, "hidden_dropout": 0.0}
        for family in ("gpt_neox", "falcon", "bloom", "stablelm")
    },
    **{
        family: {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
        for family in ("gpt2", "gpt_bigcode")
    },
    **{
        family: {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
        for family in ("gptj", "codegen")
    },
    **{
        family: {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
        for family in ("bert", "roberta", "deberta-v2")
    },
    "opt": {"attention_dropout": 0.0, "dropout": 0.1},
    "bart": {"attention_dropout": 0.0, "dropout": 0.1, "activation_dropout": 0.0},
    "mpt": {"resid_pdrop": 0.0},
    "t5": {"dropout_rate": 0.1},
    "mt5": {"dropout_rate": 0.1},
}  # fmt: skip


def _family_defaults(model_type: Any) -> dict[str, Any]:
    """The dropout rates (`DROPOUT_KEYS`) the family of `model_type` gives a config that
    leaves them out: `FAMILY_DROPOUT`, else `_family_defaults_of` (transformers)."""
    if not isinstance(model_type, str):
        return {}
    if model_type in FAMILY_DROPOUT:
        return dict(FAMILY_DROPOUT[model_type])
    return dict(_family_defaults_of(model_type))


@functools.lru_cache(maxsize=64)
def _family_defaults_of(model_type: str) -> dict[str, Any]:
    """The dropout rates transformers' config class of `model_type` gives the keys of
    `DROPOUT_KEYS` the file leaves out (a Llama config without `attention_dropout` trains
    with 0.0, a GPT-2 one without `resid_pdrop` with 0.1); {} for a family transformers does
    not register. Only transformers' own registered classes are looked up: nothing in the
    file is run."""
    if not isinstance(model_type, str) or not model_type:
        return {}
    try:
        from transformers import CONFIG_MAPPING

        if model_type not in CONFIG_MAPPING:
            return {}
        defaults = CONFIG_MAPPING[model_type]().to_dict()
    except Exception:  # a transformers without the family, or one whose defaults fail
        return {}
    return {k: defaults[k] for k in DROPOUT_KEYS if k in defaults}


def training_facts(config: Mapping[str, Any], attn_implementation: Any = None) -> dict[str, Any]:
    """What a config says about how the model trains, as `estimate_memory` keywords:
    `dropout` (True when any dropout rate of `DROPOUT_KEYS` is above 0, False when the
    rates it gives are all 0; absent when it gives none) and `attention` (from the
    implementation the module was built with, `attn_implementation`, or the config's own
    key; absent when neither says: transformers then picks sdpa)."""
    out: dict[str, Any] = {}
    rates = [config.get(k) for k in DROPOUT_KEYS]
    numbers = [r for r in rates if isinstance(r, (int, float)) and not isinstance(r, bool)]
    if not numbers:  # the family's own defaults, as transformers builds the model
        defaults = _family_defaults(config.get("model_type"))
        rates = [defaults.get(k) for k in DROPOUT_KEYS]
        numbers = [r for r in rates if isinstance(r, (int, float)) and not isinstance(r, bool)]
    if numbers:
        out["dropout"] = any(r > 0 for r in numbers)
    name = (
        attn_implementation
        or config.get("_attn_implementation")
        or config.get("attn_implementation")
    )
    if isinstance(name, str) and name in ATTENTION_KERNELS:
        out["attention"] = ATTENTION_KERNELS[name]
    return out


def config_of(arch: Any) -> dict[str, Any] | None:
    """A transformers config.json (a dict) that builds a model of `arch`'s shape, for the
    dry run of a preset or a shape: Llama's for a SwiGLU / RMSNorm decoder, Mixtral's for
    its mixture of experts, GPT-2's for a GELU / LayerNorm decoder with learned positions
    and tied embeddings, GPT-NeoX's for one with rotary positions, each with the shape's
    MLP activation function (BLOOM's `bloom_gelu`, which transformers names nothing, as
    `gelu_pytorch_tanh`: the same tanh GELU, one op that keeps its input), Qwen3's for a
    dense one with query and key norms (`qk_norm`) and no biases; None for a shape none of
    them builds (an encoder, a parallel residual with learned positions, query and key
    norms in any other layout)."""
    act = getattr(arch, "activation_function", None) or "gelu"
    act = "gelu_pytorch_tanh" if act == "bloom_gelu" else act
    common = {"vocab_size": arch.vocab, "tie_word_embeddings": bool(arch.tied_embeddings)}
    if not getattr(arch, "causal", True) or getattr(arch, "post_norms", False):
        return None  # an encoder; Gemma's norms of the blocks' outputs
    llama_like = arch.mlp == "swiglu" and arch.norm == "rmsnorm" and arch.positions == "rotary"
    if getattr(arch, "qk_norm", False) and not llama_like:
        return None  # query and key norms: built as Qwen3's, a Llama layout only
    if llama_like:
        config = {
            **common,
            "model_type": "mixtral" if arch.is_moe else "llama",
            "num_hidden_layers": arch.layers,
            "hidden_size": arch.hidden,
            "num_attention_heads": arch.heads,
            "num_key_value_heads": arch.kv_heads,
            "intermediate_size": (arch.moe_ffn_hidden or arch.ffn_hidden)
            if arch.is_moe
            else arch.ffn_hidden,
            "max_position_embeddings": arch.seq_len,
            "head_dim": arch.head_dim,
            "hidden_act": act,
        }
        if getattr(arch, "qk_norm", False):  # Qwen3: RMSNorms on Q and K per head
            if arch.is_moe or arch.bias != "none":
                return None
            config.update(model_type="qwen3", attention_bias=False)
            return config
        if arch.is_moe:
            if arch.shared_ffn_hidden:
                return None
            config.update(
                num_local_experts=arch.experts, num_experts_per_tok=arch.experts_per_token
            )
        elif arch.bias == "qkv":  # Qwen2: biases on Q, K and V only
            config["model_type"] = "qwen2"
        else:
            config.update(attention_bias=arch.bias != "none", mlp_bias=arch.bias == "all")
        return config
    if arch.mlp == "gelu" and arch.norm == "layernorm" and arch.bias == "all":
        if arch.positions == "learned" and arch.tied_embeddings and not arch.parallel_residual:
            return {
                "model_type": "gpt2",
                "vocab_size": arch.vocab,
                "n_layer": arch.layers,
                "n_embd": arch.hidden,
                "n_head": arch.heads,
                "n_inner": arch.ffn_hidden,
                "n_positions": arch.max_positions or arch.seq_len,
                "activation_function": act,
            }
        if arch.positions == "rotary":
            return {
                **common,
                "model_type": "gpt_neox",
                "num_hidden_layers": arch.layers,
                "hidden_size": arch.hidden,
                "num_attention_heads": arch.heads,
                "intermediate_size": arch.ffn_hidden,
                "max_position_embeddings": arch.seq_len,
                "use_parallel_residual": bool(arch.parallel_residual),
                "rotary_pct": 1.0,
                "hidden_act": act,
            }
    return None
