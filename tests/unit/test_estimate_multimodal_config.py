"""A multimodal model's config.json (Gemma 3's, LLaVA's: a `text_config` beside a vision
tower's) is estimated as its language model for the activations, with every parameter of
the built module in the count, and the report says so (`hf_build.language_model_config`)."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.cli import main
from workbench.estimate import estimate_memory

TEXT = {
    "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 3, "vocab_size": 512,
    "max_position_embeddings": 256,
}  # fmt: skip
VISION = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
    "num_hidden_layers": 2, "image_size": 56, "patch_size": 14,
}  # fmt: skip


def _gemma3() -> dict[str, Any]:
    return {
        "model_type": "gemma3",
        "mm_tokens_per_image": 16,
        "text_config": {"model_type": "gemma3_text", **TEXT, "query_pre_attn_scalar": 32},
        "vision_config": {"model_type": "siglip_vision_model", **VISION},
    }


def _llava() -> dict[str, Any]:
    return {
        "model_type": "llava",
        "text_config": {"model_type": "llama", **TEXT},
        "vision_config": {"model_type": "clip_vision_model", **VISION, "projection_dim": 64},
    }


@pytest.mark.parametrize(
    ("build", "language", "extra_norms"),
    [(_gemma3, "gemma3_text", True), (_llava, "llama", False)],
    ids=["gemma3", "llava"],
)
def test_a_multimodal_config_is_estimated_as_its_language_model(build, language, extra_norms):
    config = build()
    e = estimate_memory(hf_config=config, seq_len=64, precision="bf16-true", gpu="h100")
    text_only = estimate_memory(hf_config=config["text_config"], seq_len=64, precision="bf16-true")
    # the activations are the language model's, to the byte
    assert e.activation_bytes is not None
    assert e.activations == text_only.activations
    assert (e.layers, e.hidden, e.qk_norm, e.post_norms) == (3, 128, extra_norms, extra_norms)
    # the count is the whole module's: the vision tower and the projector too
    assert e.n_params > text_only.n_params
    assert e.shape_note is not None and e.shape_note.startswith(
        f"the activations are {language}'s, its language model (`text_config`): a text-only "
        "step, where images through its vision tower would keep more;"
    )
    assert e.verdict is not None and "without its activations" not in e.verdict


def test_the_command_line_says_where_the_shape_was_read(tmp_path, capsys) -> None:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_gemma3()))
    assert main(["estimate", "--hf-config", str(path), "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "note: the activations are gemma3_text's, its language model" in out
    assert "shape: 3 layers, hidden 128" in out


def test_a_multimodal_module_is_read_as_its_language_model_too() -> None:
    """`model=` a built (meta) Gemma 3 module: the same shape, note and dropout as its
    config.json."""
    import transformers

    config = _gemma3()
    hf = transformers.Gemma3Config.from_dict({k: v for k, v in config.items() if k != "model_type"})
    module = estimate_memory(
        model=lambda: transformers.Gemma3ForConditionalGeneration(hf), seq_len=64,
        precision="bf16-true",
    )  # fmt: skip
    from_config = estimate_memory(hf_config=config, seq_len=64, precision="bf16-true")
    assert module.activations == from_config.activations
    assert module.shape_note == from_config.shape_note
    assert module.n_params == from_config.n_params
