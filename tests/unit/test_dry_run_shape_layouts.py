"""The transformers model a shape's dry run builds (`fake.shape_config`) has the layout
the estimate counts: a bare shape (GPT's defaults) is a GPT-2, a SwiGLU / RMSNorm /
rotary one a Llama, and a layout none of them builds is refused, never built with
another layout."""

from __future__ import annotations

from workbench.train.dry_run.fake import shape_config

SHAPE = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100}


def test_a_bare_shape_is_built_as_gpt2():
    config, missing = shape_config(SHAPE)
    assert missing is None and config is not None and config["model_type"] == "gpt2"


def test_a_llama_layout_is_built_as_a_llama_without_biases():
    layout = {"mlp": "swiglu", "norm": "rmsnorm", "positions": "rotary", "bias": "none"}
    config, _ = shape_config({**SHAPE, **layout})
    assert config is not None and config["model_type"] == "llama"
    assert config["attention_bias"] is False and config["mlp_bias"] is False
    config, _ = shape_config({**SHAPE, **layout, "bias": "qkv"})
    assert config is not None and config["model_type"] == "qwen2"


def test_a_layout_no_class_builds_is_refused_not_built_as_gpt2():
    config, missing = shape_config({**SHAPE, "bias": "none"})
    assert config is None and missing is not None and "no transformers model" in missing
    config, _ = shape_config({**SHAPE, "positions": "rotary"})
    assert config is not None and config["model_type"] == "gpt_neox"
