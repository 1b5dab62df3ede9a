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

from workbench.estimate.problems import Problem

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

    Problems name `field` and say what is wrong: a missing or unreadable file, a
    `model_type` outside `FAMILIES` (naming the supported ones), a missing shape key, a
    `head_dim` that is not hidden / heads.
    """
    if isinstance(source, Mapping):
        config: Mapping[str, Any] = source
    elif isinstance(source, (str, os.PathLike)) and str(source).strip():
        import json  # only when a file is read: keeps `workbench estimate` start-up short
        from pathlib import Path

        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}, [Problem(field, str(source), "no such file")]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = " ".join(str(exc).split())
            return {}, [Problem(field, str(source), f"not a readable JSON file ({msg})")]
        if not isinstance(loaded, dict):
            return {}, [Problem(field, str(source), "must hold a JSON object")]
        config = loaded
    else:
        return {}, [Problem(field, source, "must be a path to a config.json or a dict")]
    shown = str(source) if not isinstance(source, Mapping) else "{...}"
    model_type = config.get("model_type")
    if model_type not in _KEYS:
        return {}, [
            Problem(
                field,
                shown,
                f"model_type {model_type!r} is not supported; supported: {', '.join(FAMILIES)}",
            )
        ]
    keys = _KEYS[model_type]
    fields: dict[str, Any] = {}
    missing = [key for key in keys.values() if config.get(key) is None]
    if missing:
        return {}, [
            Problem(
                field,
                shown,
                f"{model_type} config lacks {', '.join(missing)}",
            )
        ]
    for name, key in keys.items():
        fields[name] = config[key]
    problems: list[Problem] = []
    gated = model_type in _GATED
    if model_type == "gpt2":
        fields["ffn_hidden"] = config.get("n_inner")  # None: 4h
    if model_type in _GATED:
        fields["kv_heads"] = config.get("num_key_value_heads")  # None: = heads
    fields["mlp"] = "swiglu" if gated else "gelu"
    fields["norm"] = "rmsnorm" if gated else "layernorm"
    fields["positions"] = "learned" if model_type == "gpt2" else "rotary"
    fields["tied_embeddings"] = bool(config.get("tie_word_embeddings", model_type == "gpt2"))
    if model_type == "gpt_neox":
        fields["parallel_residual"] = bool(config.get("use_parallel_residual", True))
    if model_type == "llama":
        attention_bias = bool(config.get("attention_bias", False))
        mlp_bias = bool(config.get("mlp_bias", False))
        if attention_bias != mlp_bias:
            problems.append(
                Problem(
                    field,
                    shown,
                    f"attention_bias={attention_bias} with mlp_bias={mlp_bias} is not "
                    "supported (biases on every linear layer, on Q/K/V only, or none)",
                )
            )
        fields["bias"] = "all" if attention_bias else "none"
    else:
        fields["bias"] = {"mistral": "none", "qwen2": "qkv"}.get(model_type, "all")
    head_dim = config.get("head_dim")
    hidden, heads = fields["hidden"], fields["heads"]
    if (
        head_dim is not None
        and isinstance(hidden, int)
        and isinstance(heads, int)
        and heads > 0
        and head_dim * heads != hidden
    ):
        problems.append(
            Problem(
                field,
                shown,
                f"head_dim={head_dim} x heads={heads} differs from hidden_size={hidden}; "
                "only head_dim = hidden / heads is supported",
            )
        )
    if problems:
        return {}, problems
    return fields, []
