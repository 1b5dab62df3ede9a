"""A Hugging Face `config.json` on disk (or its dict) -> `Architecture` fields.

Reads `model_type` and the shape keys of the families below; no network, no
`transformers` import. Keys and defaults are those of the `transformers` config classes
(`GPT2Config`, `LlamaConfig`, `MistralConfig`, `Qwen2Config`, `GPTNeoXConfig`):

    family     layers            hidden        heads                kv heads
    gpt2       n_layer           n_embd        n_head               = heads
    llama      num_hidden_layers hidden_size   num_attention_heads  num_key_value_heads
    mistral, qwen2: as llama;    gpt_neox: as llama without kv heads

    family     MLP inner                 sequence length          tied default  biases
    gpt2       n_inner (None: 4h)        n_positions (learned)    true          all
    llama      intermediate_size         max_position_embeddings  false         attention_bias
                                                                                and mlp_bias
    mistral    intermediate_size         max_position_embeddings  false         none
    qwen2      intermediate_size         max_position_embeddings  false         qkv
    gpt_neox   intermediate_size         max_position_embeddings  false         all

llama, mistral and qwen2 have a SwiGLU MLP, RMSNorm and rotary positions, and read
`head_dim` (default hidden / heads; gpt2 and gpt_neox have none); gpt2 and gpt_neox a GELU
MLP and LayerNorm, with learned (gpt2) or rotary (gpt_neox) positions, and Q, K and V in
one linear layer (`fused_qkv`: gpt2's Conv1D c_attn, gpt_neox's query_key_value).
`tie_word_embeddings` is read when present, and gpt_neox's `use_parallel_residual`
(default true). The MLP's activation function is gpt2's `activation_function` (default
gelu_new, transformers' Python tanh GELU) and the others' `hidden_act` (gpt_neox gelu,
llama, mistral, qwen2 silu); one the estimator does not know (`activation_functions`) is
counted as the MLP's default, with a note (`FamilyShape.note`). What the family's code
keeps of its norms and its unfused softmax (`implementations`): llama, mistral and qwen2
run transformers' Python RMSNorm (`norm_impl` "llama"), gpt2 and gpt_neox torch's LayerNorm
("kernel"); gpt2's eager attention runs its softmax in the scores' dtype (`eager_softmax`
"input", unless `reorder_and_upcast_attn`), the others' in fp32. The sequence length is the config's longest
position: pass `seq_len` to estimate a shorter training sequence (with `seq_len` given, a
config of a family with rotary positions may leave `max_position_embeddings` out).

Configs of these families whose layers the shape cannot describe (llama with biases on the
attention but not the MLP or the reverse, gpt_neox without attention biases, gpt2 with
cross-attention) are `unsupported` here; `hf_build` counts them, and every other family
the installed `transformers` knows, by building the model on the meta device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from workbench.estimate.activation_functions import config_activation
from workbench.estimate.architecture import FIELD_BOUNDS
from workbench.estimate.implementations import family_eager_softmax, family_norm_impl
from workbench.estimate.limits import Bound, as_bool, check_number, is_bool, nesting_problem
from workbench.estimate.problems import Problem
from workbench.inputs import MAX_JSON_DEPTH, InputFileError, shown

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox")
#: The families of `FAMILIES` whose Q, K and V are one linear layer (`Architecture.fused_qkv`).
_FUSED_QKV = ("gpt2", "gpt_neox")
HEAD_DIM = FIELD_BOUNDS["head_dim"]

_LLAMA_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "ffn_hidden": "intermediate_size",
    "vocab": "vocab_size",
    "seq_len": "max_position_embeddings",
}
_KEYS: dict[str, dict[str, str]] = {
    "gpt2": {
        "layers": "n_layer",
        "hidden": "n_embd",
        "heads": "n_head",
        "vocab": "vocab_size",
        "seq_len": "n_positions",
    },
    "llama": _LLAMA_KEYS,
    "mistral": _LLAMA_KEYS,
    "qwen2": _LLAMA_KEYS,
    "gpt_neox": _LLAMA_KEYS,
}
_GATED = ("llama", "mistral", "qwen2")
#: The MLP activation function each family's config class gives a config.json that leaves
#: its key out (`GPT2Config.activation_function`, the others' `hidden_act`).
ACTIVATION_DEFAULTS = {
    "gpt2": "gelu_new",
    "gpt_neox": "gelu",
    "llama": "silu",
    "mistral": "silu",
    "qwen2": "silu",
}


#: The keys of the shape fields every family reads under the same name.
_COMMON_KEYS = {"kv_heads": "num_key_value_heads", "head_dim": "head_dim"}


def family_key(model_type: str, name: str) -> str | None:
    """The config key of `Architecture` field `name` in a config of `model_type` (one of
    `FAMILIES`), or None where the family has none."""
    keys = _KEYS.get(model_type, _LLAMA_KEYS)
    if name == "ffn_hidden":
        return "n_inner" if model_type == "gpt2" else "intermediate_size"
    if name == "tied_embeddings":
        return "tie_word_embeddings"
    return keys.get(name) or _COMMON_KEYS.get(name)


#: The dtypes a config.json's `torch_dtype` (`dtype` since transformers 4.56) may name: the
#: dtypes weights are saved in (the precision decides what the estimate counts).
CONFIG_DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2")
#: The keys that name it, the newer first.
DTYPE_KEYS = ("dtype", "torch_dtype")


def config_dtype(config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the dtype `config` says its weights were saved in, or None; the problem naming the
    key when it names no dtype of `CONFIG_DTYPES`). Null is read as absent."""
    found: str | None = None
    for key in DTYPE_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if not (isinstance(value, str) and value in CONFIG_DTYPES):
            kind = "" if isinstance(value, str) else json_kind(value)
            message = (
                f"{key} {shown(value)}{f' is {kind}' if kind else ''}: must be one of "
                f"{', '.join(CONFIG_DTYPES)} (the dtype the weights were saved in)"
            )
            return None, message
        found = found or value
    return found, None


class FamilyShape(NamedTuple):
    """What `read_family` read: the `Architecture` fields (empty when anything is wrong),
    the `problems` (invalid values, each naming its key), what is `unsupported` (valid,
    but layers the shape does not describe) and the `note` when the config names an MLP
    activation function the estimator does not know (its MLP's default is counted)."""

    fields: dict[str, Any]
    problems: list[str]
    unsupported: list[str]
    note: str | None = None


def read_hf_config(source: Any, field: str = "hf_config") -> tuple[dict[str, Any], list[Problem]]:
    """(`Architecture` fields, problems) from a config.json path or an already-loaded dict.

    A file is read by `workbench.inputs.read_json`: a regular file only (a FIFO or a device
    is refused before it is opened), at most `MAX_CONFIG_BYTES`, strict JSON (a key given
    twice, NaN or a nesting deeper than 64 levels is an error). Values are not coerced: a
    shape key must be a JSON integer in the estimator's range (`limits`), a flag such as
    `tie_word_embeddings` a JSON boolean (`"false"` is an error, not true); null is read as
    absent. Problems name `field`, the key and what is wrong, all of them at once: a missing
    or unreadable file, a `model_type` outside `FAMILIES` (naming the supported ones),
    missing or ill-typed keys, layers the shape does not describe (`read_family`).
    """
    config, where, problem = load_config(source, field)
    if problem is not None:
        return {}, [problem]
    assert config is not None
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _KEYS:
        return {}, [
            Problem(
                field,
                where,
                f"model_type {shown(model_type)} is not supported; supported: "
                f"{', '.join(FAMILIES)}",
            )
        ]
    read = read_family(config, model_type)
    _, dtype_problem = config_dtype(config)
    messages = read.problems + read.unsupported + ([dtype_problem] if dtype_problem else [])
    if messages:
        return {}, [Problem(field, where, message) for message in messages]
    return read.fields, []


def load_config(source: Any, field: str) -> tuple[Mapping[str, Any] | None, str, Problem | None]:
    """(the config, how to name it in a problem: its path or "{...}", None), or (None, name,
    the problem) for a config.json path (a file or its folder) or an already-loaded dict."""
    if isinstance(source, Mapping):
        nesting = nesting_problem(source, MAX_JSON_DEPTH)
        if nesting is not None:  # read as a tree by every reader after this one
            why, at = nesting
            where = "".join(f"[{shown(k)}]" for k in at[:8]) + ("..." if len(at) > 8 else "")
            message = f"{why}{f' (at {where})' if at else ''}; a config is a JSON object"
            return None, "{...}", Problem(field, "{...}", message)
        return source, "{...}", None
    if isinstance(source, (str, os.PathLike)) and str(source).strip():
        where = str(source)
        loaded, problem = _load(source, field)
        if problem is not None:
            return None, where, problem
        if not isinstance(loaded, dict):
            return None, where, Problem(field, where, "must hold a JSON object")
        return loaded, where, None
    where = source if isinstance(source, str) else f"<{type(source).__name__}>"
    return None, where, Problem(field, source, "must be a path to a config.json or a dict")


def read_family(
    config: Mapping[str, Any], model_type: str, seq_len_given: bool = False
) -> FamilyShape:
    """The `Architecture` fields of `config`, a config of `model_type` (one of `FAMILIES`),
    with the keys and defaults of its `transformers` config class (see the module
    docstring). `seq_len_given`: the training sequence is given, so a family with rotary
    positions (no position table to count) needs no `max_position_embeddings`."""
    problems: list[str] = []
    unsupported: list[str] = []
    keys = _KEYS[model_type]
    fields: dict[str, Any] = {}
    optional = {"seq_len"} if seq_len_given and model_type != "gpt2" else set()
    missing = [
        key for name, key in keys.items() if config.get(key) is None and name not in optional
    ]
    if missing:
        hint = ""
        if model_type != "gpt2" and keys["seq_len"] in missing:
            hint = (
                " (with `seq_len`, the training sequence, it may leave max_position_embeddings out)"
            )
        problems.append(f"{model_type} config lacks {', '.join(missing)}{hint}")
    for name, key in keys.items():
        fields[name] = config_integer(config, key, name, problems)
    gated = model_type in _GATED
    if model_type == "gpt2":
        fields["ffn_hidden"] = config_integer(config, "n_inner", "ffn_hidden", problems)
        if config_flag(config, "add_cross_attention", False, problems):
            unsupported.append(
                "add_cross_attention=true (a cross-attention block in every layer) is not "
                "supported without transformers"
            )
    if gated:
        kv_heads = config_integer(config, "num_key_value_heads", "kv_heads", problems)
        fields["kv_heads"] = kv_heads  # None: = heads
        fields["head_dim"] = config_integer(config, "head_dim", "head_dim", problems, HEAD_DIM)
    fields["mlp"] = "swiglu" if gated else "gelu"
    fields["activation_function"], note = config_activation(
        config, model_type, fields["mlp"], ACTIVATION_DEFAULTS[model_type]
    )
    fields["norm"] = "rmsnorm" if gated else "layernorm"
    # what the family's code runs: its norms (`implementations`: llama's RMSNorm, torch's
    # LayerNorm) and its unfused softmax (GPT-2's in the scores' dtype)
    fields["norm_impl"] = family_norm_impl(model_type, fields["norm"])
    fields["eager_softmax"] = family_eager_softmax(model_type, config)
    fields["positions"] = "learned" if model_type == "gpt2" else "rotary"
    fields["tied_embeddings"] = config_flag(
        config, "tie_word_embeddings", model_type == "gpt2", problems
    )
    # Q, K and V as one layer: GPT-2's Conv1D c_attn, GPT-NeoX's query_key_value
    fields["fused_qkv"] = model_type in _FUSED_QKV
    if model_type == "gpt_neox":
        fields["parallel_residual"] = config_flag(config, "use_parallel_residual", True, problems)
        if not config_flag(config, "attention_bias", True, problems):
            unsupported.append(
                "attention_bias=false (biases on the MLP but not the attention) is not "
                "supported without transformers"
            )
    if model_type == "llama":
        attention_bias = config_flag(config, "attention_bias", False, problems)
        mlp_bias = config_flag(config, "mlp_bias", False, problems)
        if attention_bias != mlp_bias:
            unsupported.append(
                f"attention_bias={attention_bias} with mlp_bias={mlp_bias} is not "
                "supported (biases on every linear layer, on Q/K/V only, or none)"
            )
        fields["bias"] = "all" if attention_bias else "none"
    else:
        fields["bias"] = {"mistral": "none", "qwen2": "qkv"}.get(model_type, "all")
    if problems:
        return FamilyShape({}, problems, unsupported)
    return FamilyShape({} if unsupported else fields, [], unsupported, note)


#: The largest config.json read: real ones are a few KiB (1 MiB with a large label map).
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _load(source: str | os.PathLike[str], field: str) -> tuple[Any, Problem | None]:
    """(the JSON value of the config.json at `source`, a file or its folder, None), or
    (None, the problem: no such file, not a regular file, too large, not strict JSON)."""
    from workbench.inputs import read_json  # only when a file is read: keeps start-up short

    name = os.fspath(source)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    folder = os.path.isdir(name)  # False for a name too long or with a NUL byte: read_json says
    path = os.path.join(name, "config.json") if folder else name
    try:
        return read_json(path, what=field, max_bytes=MAX_CONFIG_BYTES), None
    except InputFileError as exc:
        reason = f"its config.json: {exc.reason}" if folder else exc.reason
        return None, Problem(field, str(source), reason)


def config_integer(
    config: Mapping[str, Any],
    key: str,
    name: str,
    problems: list[str],
    bound: Bound | None = None,
) -> int | None:
    """The integer at `key` (None when absent or null), checked against the range of the
    estimator's input `name` (or `bound`); a problem naming the key otherwise."""
    value = config.get(key)
    if value is None:
        return None
    number, message = check_number(name, value, bound)
    if message is None:
        return number  # type: ignore[no-any-return]
    kind = json_kind(value)
    problems.append(f"{key} {shown(value)}{f' is {kind}' if kind else ''}: {message}")
    return None


def config_flag(config: Mapping[str, Any], key: str, default: bool, problems: list[str]) -> bool:
    """The boolean at `key` (`default` when absent or null); a problem naming the key for
    anything but true or false (`"false"` is a string, not false)."""
    value = as_bool(config.get(key))
    if value is None:
        return default
    if not isinstance(value, bool):
        kind = json_kind(value)
        problems.append(
            f"{key} {shown(value)}{f' is {kind}' if kind else ''}: must be true or false"
        )
        return default
    return value


def json_kind(value: Any) -> str:
    """ "a string" / "a number" / ... for a value of the wrong JSON type, "" for a number."""
    if isinstance(value, str):
        return "a string"
    if is_bool(value):
        return "a boolean"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return ""
