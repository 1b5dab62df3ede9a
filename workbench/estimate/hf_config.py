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

llama, mistral and qwen2 have a SwiGLU MLP, RMSNorm and rotary positions; gpt2 and
gpt_neox a GELU MLP and LayerNorm, with learned (gpt2) or rotary (gpt_neox) positions.
`tie_word_embeddings` is read when present, and gpt_neox's `use_parallel_residual`
(default true). The sequence length is the config's longest
position: pass `seq_len` to estimate a shorter training sequence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from workbench.estimate.limits import as_bool, check_number, is_bool
from workbench.estimate.problems import Problem
from workbench.inputs import InputFileError, shown

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox")

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


def read_hf_config(source: Any, field: str = "hf_config") -> tuple[dict[str, Any], list[Problem]]:
    """(`Architecture` fields, problems) from a config.json path or an already-loaded dict.

    A file is read by `workbench.inputs.read_json`: a regular file only (a FIFO or a device
    is refused before it is opened), at most `MAX_CONFIG_BYTES`, strict JSON (a key given
    twice, NaN or a nesting deeper than 64 levels is an error). Values are not coerced: a
    shape key must be a JSON integer in the estimator's range (`limits`), a flag such as
    `tie_word_embeddings` a JSON boolean (`"false"` is an error, not true); null is read as
    absent. Problems name `field`, the key and what is wrong, all of them at once: a missing
    or unreadable file, a `model_type` outside `FAMILIES` (naming the supported ones),
    missing or ill-typed keys, a `head_dim` that is not hidden / heads.
    """
    if isinstance(source, Mapping):
        config: Mapping[str, Any] = source
        where = "{...}"
    elif isinstance(source, (str, os.PathLike)) and str(source).strip():
        where = str(source)
        loaded, problem = _load(source, field)
        if problem is not None:
            return {}, [problem]
        if not isinstance(loaded, dict):
            return {}, [Problem(field, where, "must hold a JSON object")]
        config = loaded
    else:
        return {}, [Problem(field, source, "must be a path to a config.json or a dict")]
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
    problems: list[str] = []
    keys = _KEYS[model_type]
    fields: dict[str, Any] = {}
    missing = [key for key in keys.values() if config.get(key) is None]
    if missing:
        problems.append(f"{model_type} config lacks {', '.join(missing)}")
    for name, key in keys.items():
        fields[name] = _integer(config, key, name, problems)
    gated = model_type in _GATED
    if model_type == "gpt2":
        fields["ffn_hidden"] = _integer(config, "n_inner", "ffn_hidden", problems)  # None: 4h
    if gated:
        kv_heads = _integer(config, "num_key_value_heads", "kv_heads", problems)
        fields["kv_heads"] = kv_heads  # None: = heads
    fields["mlp"] = "swiglu" if gated else "gelu"
    fields["norm"] = "rmsnorm" if gated else "layernorm"
    fields["positions"] = "learned" if model_type == "gpt2" else "rotary"
    fields["tied_embeddings"] = _flag(config, "tie_word_embeddings", model_type == "gpt2", problems)
    if model_type == "gpt_neox":
        fields["parallel_residual"] = _flag(config, "use_parallel_residual", True, problems)
    if model_type == "llama":
        attention_bias = _flag(config, "attention_bias", False, problems)
        mlp_bias = _flag(config, "mlp_bias", False, problems)
        if attention_bias != mlp_bias:
            problems.append(
                f"attention_bias={attention_bias} with mlp_bias={mlp_bias} is not "
                "supported (biases on every linear layer, on Q/K/V only, or none)"
            )
        fields["bias"] = "all" if attention_bias else "none"
    else:
        fields["bias"] = {"mistral": "none", "qwen2": "qkv"}.get(model_type, "all")
    head_dim = _integer(config, "head_dim", "hidden", problems)
    hidden, heads = fields["hidden"], fields["heads"]
    if (
        head_dim is not None
        and hidden is not None
        and heads is not None
        and head_dim * heads != hidden
    ):
        problems.append(
            f"head_dim={head_dim} x heads={heads} differs from hidden_size={hidden}; "
            "only head_dim = hidden / heads is supported"
        )
    if problems:
        return {}, [Problem(field, where, message) for message in problems]
    return fields, []


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


def _integer(config: Mapping[str, Any], key: str, name: str, problems: list[str]) -> int | None:
    """The integer at `key` (None when absent or null), checked against the range of the
    estimator's input `name`; a problem naming the key otherwise."""
    value = config.get(key)
    if value is None:
        return None
    number, message = check_number(name, value)
    if message is None:
        return number  # type: ignore[no-any-return]
    kind = _json_kind(value)
    problems.append(f"{key} {shown(value)}{f' is {kind}' if kind else ''}: {message}")
    return None


def _flag(config: Mapping[str, Any], key: str, default: bool, problems: list[str]) -> bool:
    """The boolean at `key` (`default` when absent or null); a problem naming the key for
    anything but true or false (`"false"` is a string, not false)."""
    value = as_bool(config.get(key))
    if value is None:
        return default
    if not isinstance(value, bool):
        kind = _json_kind(value)
        problems.append(
            f"{key} {shown(value)}{f' is {kind}' if kind else ''}: must be true or false"
        )
        return default
    return value


def _json_kind(value: Any) -> str:
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
