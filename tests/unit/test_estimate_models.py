"""Model presets, architecture-aware parameter counts, Hugging Face configs, counts as text.

Every preset's count is computed from its shape; here it is pinned to the total published
for the released model (the source of each number is beside it).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np
import pytest

from workbench.estimate import (
    MODELS,
    Architecture,
    EstimateInputError,
    estimate_memory,
    find_model,
    get_model,
    hf_build,
    model_names,
    params_from_shape,
    parse_count,
    read_hf_config,
)

# name -> (published parameter count, where it is published). Hugging Face checkpoints of
# Llama 2 also store each layer's rotary `inv_freq` buffer (head_dim / 2 = 64 values), which
# the page's count includes; those buffers are not parameters and are subtracted here.
PUBLISHED = {
    "gpt2": (124_439_808, "KerasHub preset gpt2_base_en metadata"),
    "gpt2-medium": (354_823_168, "KerasHub preset gpt2_medium_en metadata"),
    "gpt2-large": (774_030_080, "KerasHub preset gpt2_large_en metadata"),
    "gpt2-xl": (1_557_611_200, "KerasHub preset gpt2_extra_large_en metadata"),
    "llama-2-7b": (6_738_415_616, "KerasHub preset llama2_7b_en metadata"),
    "llama-2-13b": (13_015_866_880 - 40 * 64, "HF meta-llama/Llama-2-13b-hf safetensors"),
    "llama-2-70b": (68_976_653_312 - 80 * 64, "HF meta-llama/Llama-2-70b-hf safetensors"),
    "llama-3-8b": (8_030_261_248, "HF meta-llama/Meta-Llama-3-8B; KerasHub llama3_8b_en"),
    "llama-3-70b": (70_553_706_496, "HF meta-llama/Meta-Llama-3-70B safetensors"),
    "llama-3.1-405b": (405_853_388_800, "HF meta-llama/Llama-3.1-405B safetensors"),
    "mistral-7b": (7_241_732_096, "KerasHub preset mistral_7b_en metadata"),
    "mixtral-8x7b": (46_702_792_704, "KerasHub preset mixtral_8_7b_en metadata"),
    "qwen2.5-7b": (7_615_616_512, "HF Qwen/Qwen2.5-7B safetensors"),
    "pythia-1.4b": (1_414_647_808, "EleutherAI/pythia README, model table"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_preset_count_is_the_published_total(name):
    published, _source = PUBLISHED[name]
    preset = MODELS[name]
    assert preset.n_params == published
    assert estimate_memory(model=name).n_params == published
    assert "Shape: " in preset.source and "Published" in preset.source  # cited in the catalog


def test_mixtral_active_parameters_are_the_published_12_9b():
    # Mistral AI, "Mixtral of experts" (2023): 46.7B total, 12.9B used per token (top-2 of 8)
    arch = MODELS["mixtral-8x7b"].architecture
    expert = 3 * 4096 * 14336  # gate, up, down of one SwiGLU expert
    assert arch.active_params == arch.n_params - 32 * (8 - 2) * expert == 12_879_925_248
    assert (round(arch.n_params / 1e8), round(arch.active_params / 1e8)) == (467, 129)
    for name, preset in MODELS.items():  # every dense preset: all parameters are active
        if name != "mixtral-8x7b":
            assert preset.architecture.active_params == preset.n_params, name


def test_gpt3_preset_is_the_published_174_6b():
    # Brown et al. 2020 Table 2.1 rounds to 175.0B; Narayanan et al. 2021 Table 1 gives
    # 174.6B for 96 layers, hidden 12288, 96 heads.
    n = MODELS["gpt3-175b"].n_params
    assert round(n / 1e8) == 1746
    assert n == params_from_shape(layers=96, hidden=12288, seq_len=2048, vocab=50257)


def test_non_embedding_counts_as_the_papers_report_them():
    # Pythia paper, Table 1: 1,208,602,624 non-embedding parameters for Pythia-1.4B.
    assert MODELS["pythia-1.4b"].architecture.non_embedding_params == 1_208_602_624
    # Qwen2.5-7B model card: 6.53B non-embedding parameters.
    assert round(MODELS["qwen2.5-7b"].architecture.non_embedding_params / 1e7) == 653


def test_every_name_the_issue_asks_for_is_a_preset():
    required = {
        "gpt2",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "gpt3-175b",
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3-8b",
        "llama-3-70b",
        "llama-3.1-405b",
        "mistral-7b",
        "qwen2.5-7b",
    }
    assert required <= set(model_names())
    assert set(PUBLISHED) | {"gpt3-175b"} == set(model_names())  # every preset is pinned


# ------------------------------------------------------------------ the formula by hand
def test_gqa_swiglu_rmsnorm_untied_count_by_hand():
    arch = Architecture.create(
        layers=2,
        hidden=8,
        heads=4,
        kv_heads=2,
        ffn_hidden=12,
        seq_len=16,
        vocab=10,
        mlp="swiglu",
        norm="rmsnorm",
        bias="none",
        positions="rotary",
        tied_embeddings=False,
    )
    # per layer: Q 8x8 + K, V 2 x 8x4 (2 kv heads of size 2) + O 8x8 = 192;
    # gate, up, down 3 x 8x12 = 288; two RMSNorm weights 16 -> 496
    # embedding 10x8 + untied output 10x8 + final RMSNorm 8 = 168
    assert arch.layer_params() == 496
    assert arch.n_params == 2 * 496 + 168
    tied = arch.replace(tied_embeddings=False, bias="qkv")
    assert tied.n_params == arch.n_params + 2 * (8 + 4 + 4)  # Q, K, V biases per layer


def test_mixture_of_experts_count_by_hand():
    dense = dict(layers=2, hidden=8, heads=4, kv_heads=2, seq_len=16, vocab=10)
    llama = dict(mlp="swiglu", norm="rmsnorm", bias="none", positions="rotary")
    moe = Architecture.create(
        **dense, **llama, ffn_hidden=12, tied_embeddings=False, experts=4, experts_per_token=2
    )
    # per layer: attention 192 (as above); router 8x4; 4 experts of 3 x 8x12; norms 16
    assert moe.layer_params() == 192 + 32 + 4 * 288 + 16
    assert moe.n_params == 2 * moe.layer_params() + 168
    assert moe.active_params == moe.n_params - 2 * 2 * 288  # two idle experts per layer
    assert moe.moe_ffn_hidden == 12 and moe.is_moe
    shared = moe.replace(moe_ffn_hidden=6, shared_ffn_hidden=24)
    assert shared.layer_params() == 192 + 32 + 4 * 3 * 8 * 6 + 3 * 8 * 24 + 16
    assert shared.active_params == shared.n_params - 2 * 2 * 3 * 8 * 6
    # biases everywhere (gpt-oss): each expert's MLP biases and the router's
    gelu = Architecture.create(**dense, ffn_hidden=12, experts=3, experts_per_token=1)
    per_expert = 2 * 8 * 12 + 12 + 8  # fc1, fc2 weights; fc1, fc2 biases
    attention = 2 * 8 * 8 + 2 * 8 * 4 + (8 + 2 * 4) + 8
    assert gelu.layer_params() == attention + 3 * per_expert + (8 * 3 + 3) + 2 * 16
    assert gelu.active_params == gelu.n_params - 2 * 2 * per_expert
    # splitting: experts as the MLP, the router replicated
    assert moe.layer_params(tensor_parallel=2) == (192 + 4 * 288) // 2 + 32 + 16
    assert [p.message for p in moe.parallel_problems(5, 1)][
        -1
    ] == "must divide `moe_ffn_hidden`=12 evenly"


def test_mixture_of_experts_fields_are_checked():
    base = dict(layers=2, hidden=8, heads=4, seq_len=16, vocab=10)
    with pytest.raises(EstimateInputError) as info:
        Architecture.create(**base, experts=4)
    assert "experts_per_token is missing: a mixture of experts needs" in str(info.value)
    with pytest.raises(EstimateInputError, match=r"experts_per_token=5: must not exceed experts=4"):
        Architecture.create(**base, experts=4, experts_per_token=5)
    with pytest.raises(EstimateInputError, match=r"moe_ffn_hidden=6: needs experts"):
        Architecture.create(**base, moe_ffn_hidden=6)
    with pytest.raises(EstimateInputError, match=r"experts=0: must be an integer from 1 to 10\^6"):
        Architecture.create(**base, experts=0, experts_per_token=1)
    dense = Architecture.create(**base)
    assert (dense.experts, dense.experts_per_token, dense.moe_ffn_hidden) == (None, None, None)
    assert not dense.is_moe and dense.active_params == dense.n_params


def test_head_dim_other_than_hidden_over_heads():
    # Gemma 7B: hidden 3072, 16 heads of 256, so Q is 3072 x 4096 and the output 4096 x 3072
    base = dict(layers=1, hidden=3072, heads=16, seq_len=8, vocab=8, mlp="swiglu")
    default = Architecture.create(**base, ffn_hidden=24576, bias="none")
    wide = default.replace(head_dim=256)
    assert default.head_dim == 192 and wide.head_dim == 256 and wide.q_dim == 4096
    assert wide.layer_params() - default.layer_params() == 4 * 3072 * (4096 - 3072)
    assert wide.replace(head_dim=192) == default  # back to the default: equal shapes
    assert wide.replace(hidden=2048).head_dim == 256  # an explicit head size stays
    assert default.replace(hidden=2048).head_dim == 128  # the default follows hidden / heads
    # heads need not divide hidden when the head size is given
    odd = Architecture.create(layers=1, hidden=2304, heads=7, head_dim=256, seq_len=8, vocab=8)
    assert odd.q_dim == 7 * 256
    with pytest.raises(EstimateInputError, match=r"heads=7: must divide hidden=2304 evenly"):
        Architecture.create(layers=1, hidden=2304, heads=7, seq_len=8, vocab=8)
    assert Architecture.create(**base, causal=False).causal is False


def test_gpt_defaults_are_the_existing_formula():
    arch = Architecture.create(layers=3, hidden=16, heads=4, seq_len=8, vocab=50)
    assert arch.n_params == params_from_shape(layers=3, hidden=16, seq_len=8, vocab=50)
    assert (arch.kv_heads, arch.ffn_hidden, arch.mlp, arch.max_positions) == (4, 64, "gelu", 8)


def test_swiglu_default_inner_size_is_llamas_rule():
    # LLaMA: 2/3 of 4h rounded up to a multiple of 256 -> 11008 for h = 4096
    arch = Architecture.create(layers=1, hidden=4096, heads=32, seq_len=8, vocab=8, mlp="swiglu")
    assert arch.ffn_hidden == 11008


def test_multi_query_attention_count():
    mha = Architecture.create(layers=1, hidden=64, heads=8, seq_len=8, vocab=8)
    mqa = mha.replace(kv_heads=1)
    # K and V shrink from 64x64 (+64 bias) to 64x8 (+8 bias) each
    assert mha.n_params - mqa.n_params == 2 * (64 * 64 + 64) - 2 * (64 * 8 + 8)


# ------------------------------------------------------------------ presets in the estimator
def test_shape_given_with_a_model_overrides_the_preset():
    kw = dict(micro_batch=1, precision="bf16", attention="megatron")
    base = estimate_memory(model="llama-3-8b", **kw)
    longer = estimate_memory(model="llama-3-8b", seq_len=32768, **kw)
    assert longer.n_params == base.n_params  # rotary: no position table grows
    assert (base.seq_len, longer.seq_len) == (8192, 32768)
    assert longer.activation_bytes > 4 * base.activation_bytes  # the as^2b terms grow 16x
    assert (longer.kv_heads, longer.ffn_hidden, longer.mlp) == (8, 14336, "swiglu")
    deeper = estimate_memory(model="llama-3-8b", layers=40)
    assert deeper.n_params == base.n_params + 8 * MODELS["llama-3-8b"].architecture.layer_params()


def test_learned_positions_cap_the_sequence_length():
    shorter = estimate_memory(model="gpt2", seq_len=512)
    assert shorter.n_params == MODELS["gpt2"].n_params  # the 1024-row table stays
    with pytest.raises(
        EstimateInputError,
        match=r"seq_len=2048: must not exceed the learned position table \(max_positions=1024\)",
    ):
        estimate_memory(model="gpt2", seq_len=2048)


def test_model_names_are_forgiving_and_unknown_ones_listed():
    assert get_model("Llama-3-8B").name == "llama-3-8b"
    assert get_model("meta-llama/llama-3-8b").name == "llama-3-8b"
    assert get_model("QWEN2.5-7B").name == "qwen2.5-7b"
    found = find_model("lama-3-8b")
    assert isinstance(found, str) and "did you mean llama-3-8b?" in found
    with pytest.raises(EstimateInputError, match=r"model='gpt5': unknown model; .*known: gpt2, "):
        estimate_memory(model="gpt5")


def test_preset_echo_in_the_result():
    e = estimate_memory(model="mistral-7b", precision="bf16", gpus=8, zero_stage=3)
    d = json.loads(json.dumps(e.to_dict()))
    assert d["model"] == "mistral-7b"
    assert (d["layers"], d["hidden"], d["heads"], d["kv_heads"], d["vocab"]) == (
        32,
        4096,
        32,
        8,
        32000,
    )
    assert (d["norm"], d["bias"], d["positions"], d["tied_embeddings"]) == (
        "rmsnorm",
        "none",
        "rotary",
        False,
    )


def test_architecture_problems_are_all_reported():
    with pytest.raises(EstimateInputError) as info:
        Architecture.create(
            layers=2, hidden=64, heads=8, kv_heads=3, seq_len=8, vocab=8, mlp="relu", norm="bn"
        )
    text = str(info.value)
    assert "kv_heads=3: must divide heads=8 evenly" in text
    assert "mlp='relu': must be one of gelu, swiglu" in text
    assert "norm='bn': must be one of layernorm, rmsnorm" in text


# ------------------------------------------------------------------ Hugging Face config.json
LLAMA_3_8B_CONFIG = {  # config.json of meta-llama/Meta-Llama-3-8B as released
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


def test_llama_config_json_read_from_disk(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_3_8B_CONFIG))
    e = estimate_memory(hf_config=path, precision="bf16", micro_batch=1)
    assert e.n_params == 8_030_261_248  # the published total
    assert (e.kv_heads, e.ffn_hidden, e.mlp, e.norm, e.seq_len) == (
        8,
        14336,
        "swiglu",
        "rmsnorm",
        8192,
    )
    assert e.hf_config == str(path) and e.activation_bytes is not None
    # a folder holding config.json works too, and shape arguments override
    shorter = estimate_memory(hf_config=str(tmp_path), seq_len=4096)
    assert shorter.n_params == e.n_params and shorter.seq_len == 4096


def test_unsupported_and_broken_configs(tmp_path, monkeypatch):
    bert = tmp_path / "bert.json"
    bert.write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    _, problems = read_hf_config(bert)  # the pure reader: five families
    assert problems[0].message == (
        "model_type 'bert' is not supported; supported: gpt2, llama, mistral, qwen2, gpt_neox"
    )
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed: import fails
    hf_build.clear_cache()
    with pytest.raises(
        EstimateInputError,
        match=r"model_type 'bert' is counted by building the model with transformers, which is "
        r"not installed \(.*pip install transformers\); without it the supported families "
        r"are gpt2, llama, mistral, qwen2, gpt_neox",
    ):
        estimate_memory(hf_config=bert)
    assert estimate_memory(hf_config=LLAMA_3_8B_CONFIG).n_params == 8_030_261_248  # pure
    with pytest.raises(EstimateInputError, match=r"hf_config='.*missing.json': no such file"):
        estimate_memory(hf_config=tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(
        EstimateInputError, match=r"broken.json': not valid JSON \(Expecting property name"
    ):
        estimate_memory(hf_config=broken)
    cfg = {k: v for k, v in LLAMA_3_8B_CONFIG.items() if k != "num_hidden_layers"}
    _, problems = read_hf_config(cfg)
    assert [p.message for p in problems] == ["llama config lacks num_hidden_layers"]
    with pytest.raises(EstimateInputError, match=r"give model or hf_config, not both"):
        estimate_memory(model="gpt2", hf_config=bert)


def test_a_head_size_other_than_hidden_over_heads_is_read():
    # Mistral-NeMo-style: 32 heads of 128 with hidden 5120 (Q is 5120 x 4096)
    fields, problems = read_hf_config({**LLAMA_3_8B_CONFIG, "head_dim": 128, "hidden_size": 5120})
    assert problems == [] and fields["head_dim"] == 128
    arch = Architecture.create(**fields)
    assert arch.q_dim == 4096 and arch.kv_dim == 1024
    _, problems = read_hf_config({**LLAMA_3_8B_CONFIG, "head_dim": 0})
    assert problems[0].message.startswith("head_dim 0: must be an integer from 1 to 10^6")
    # GPT-2 and GPT-NeoX have no head size key: theirs is hidden / heads, a head_dim is ignored
    neox = {
        "model_type": "gpt_neox",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 100,
        "max_position_embeddings": 128,
    }
    assert read_hf_config({**neox, "head_dim": 8})[0] == read_hf_config(neox)[0]


def test_layers_the_pure_reader_does_not_describe_are_unsupported_without_transformers():
    tiny = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 96,
        "vocab_size": 100,
        "max_position_embeddings": 32,
    }
    gpt2 = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32, "vocab_size": 100}
    for config, message in (
        (
            {**tiny, "model_type": "llama", "attention_bias": True},
            "attention_bias=True with mlp_bias=False is not supported",
        ),
        (
            {**tiny, "model_type": "gpt_neox", "attention_bias": False},
            "attention_bias=false (biases on the MLP but not the attention) is not supported",
        ),
        (
            {**gpt2, "model_type": "gpt2", "add_cross_attention": True},
            "add_cross_attention=true (a cross-attention block in every layer) is not supported",
        ),
    ):
        fields, problems = read_hf_config(config)
        assert fields == {} and message in problems[0].message


def _write(tmp_path, text, name="config.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_config_values_of_the_wrong_json_type_are_errors_naming_the_key():
    config = {
        **LLAMA_3_8B_CONFIG,
        "hidden_size": "4096",
        "num_hidden_layers": 32.5,
        "tie_word_embeddings": "false",
        "attention_bias": 0,
    }
    _, problems = read_hf_config(config)
    assert [p.message for p in problems] == [
        "num_hidden_layers 32.5: must be an integer from 1 to 10^5",
        "hidden_size '4096' is a string: must be an integer from 1 to 10^6",
        "tie_word_embeddings 'false' is a string: must be true or false",
        "attention_bias 0: must be true or false",
    ]
    neox = {
        "model_type": "gpt_neox",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 100,
        "max_position_embeddings": 128,
    }
    with pytest.raises(
        EstimateInputError, match=r"use_parallel_residual 'no' is a string: must be true or false"
    ):
        estimate_memory(hf_config={**neox, "use_parallel_residual": "no"})
    assert estimate_memory(hf_config={**neox, "use_parallel_residual": None}).parallel_residual


def test_config_numbers_past_the_range_are_refused_with_the_key(tmp_path):
    text = json.dumps({**LLAMA_3_8B_CONFIG, "hidden_size": 10**400})
    with pytest.raises(
        EstimateInputError,
        match=r"hidden_size <an integer of about 401 digits>: more than 10\^6 hidden units",
    ):
        estimate_memory(hf_config=_write(tmp_path, text))
    with pytest.raises(EstimateInputError, match=r"max_position_embeddings 10000000000: more than"):
        estimate_memory(hf_config={**LLAMA_3_8B_CONFIG, "max_position_embeddings": 10**10})


def test_config_model_type_of_another_type_is_not_supported(tmp_path):
    for model_type in (["llama"], {"a": 1}, 7, None):
        path = _write(tmp_path, json.dumps({**LLAMA_3_8B_CONFIG, "model_type": model_type}))
        with pytest.raises(EstimateInputError, match=r"model_type .* is not supported; supported"):
            estimate_memory(hf_config=path)


def test_config_with_a_key_twice_is_refused(tmp_path):
    text = json.dumps(LLAMA_3_8B_CONFIG)[:-1] + ', "num_hidden_layers": 320}'
    with pytest.raises(
        EstimateInputError,
        match=r"hf_config='.*config.json': key 'num_hidden_layers' appears twice in one object",
    ):
        estimate_memory(hf_config=_write(tmp_path, text))


def test_config_nested_200000_levels_is_refused(tmp_path):
    path = _write(tmp_path, '{"model_type": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(EstimateInputError, match=r"nested deeper than 64 levels"):
        estimate_memory(hf_config=path)


def _within_10_s(fn, *args):
    """fn(*args) in a daemon thread: a call that blocks (a FIFO opened for reading) fails
    the test instead of hanging it."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), f"{fn.__name__}{args} did not return within 10 s"
    return out[0]


def test_config_paths_that_are_not_regular_files_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, reason in (
        (fifo, "a FIFO (named pipe), not a regular file"),
        ("/dev/urandom", "a device, not a regular file"),
        ("/dev/zero", "a device, not a regular file"),
    ):
        assert [(p.value, p.message) for p in _within_10_s(read_hf_config, path)[1]] == [
            (str(path), reason)
        ]
    with pytest.raises(
        EstimateInputError, match=r"hf_config='a{76}\.\.\.: cannot be read \(File name too long\)"
    ):
        estimate_memory(hf_config="a" * 300)
    with pytest.raises(EstimateInputError, match=r"its config.json: no such file"):
        estimate_memory(hf_config=tmp_path)
    with pytest.raises(EstimateInputError, match=r"must hold a JSON object"):
        estimate_memory(hf_config=_write(tmp_path, "[1, 2]"))
    with pytest.raises(EstimateInputError, match=r"not UTF-8 text \(byte 0xff at offset 0\)"):
        path = tmp_path / "binary.json"
        path.write_bytes(b"\xff\xfe")
        estimate_memory(hf_config=path)


def test_config_problems_are_reported_together():
    config = {k: v for k, v in LLAMA_3_8B_CONFIG.items() if k != "vocab_size"}
    config.update(num_attention_heads=True, mlp_bias="yes")
    _, problems = read_hf_config(config)
    assert [p.message for p in problems] == [
        "llama config lacks vocab_size",
        "num_attention_heads True is a boolean: must be an integer from 1 to 10^6",
        "mlp_bias 'yes' is a string: must be true or false",
    ]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # GPT-2 small as released (openai-community/gpt2 config.json keys)
        (
            {
                "model_type": "gpt2",
                "n_layer": 12,
                "n_embd": 768,
                "n_head": 12,
                "n_positions": 1024,
                "n_inner": None,
                "vocab_size": 50257,
            },
            124_439_808,
        ),
        # Qwen2.5-7B (Qwen/Qwen2.5-7B config.json shape keys)
        (
            {
                "model_type": "qwen2",
                "num_hidden_layers": 28,
                "hidden_size": 3584,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "intermediate_size": 18944,
                "vocab_size": 152064,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": False,
            },
            7_615_616_512,
        ),
        # Pythia-1.4B (EleutherAI/pythia-1.4b config.json shape keys)
        (
            {
                "model_type": "gpt_neox",
                "num_hidden_layers": 24,
                "hidden_size": 2048,
                "num_attention_heads": 16,
                "intermediate_size": 8192,
                "vocab_size": 50304,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": False,
                "use_parallel_residual": True,
            },
            1_414_647_808,
        ),
    ],
)
def test_other_families_from_their_config(config, expected):
    assert estimate_memory(hf_config=config).n_params == expected


# ------------------------------------------------------------------ counts as text
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7B", 7 * 10**9),
        ("1.5e9", 1_500_000_000),
        ("175B", 175 * 10**9),
        ("350M", 350 * 10**6),
        ("1.3T", 1_300_000_000_000),
        ("7.3b", 7_300_000_000),
        ("124,439,808", 124_439_808),
        ("1_000", 1000),
        ("2k", 2000),
        (7.5e9, 7_500_000_000),
        (10, 10),
    ],
)
def test_counts_as_people_write_them(text, value):
    assert parse_count(text) == value
    assert estimate_memory(n_params=text).n_params == value


@pytest.mark.parametrize(
    "junk", ["seven", "7X", "1.5", "7B5", "", "B", "-5", "nan", "1,2,3", "1_0", "12,34"]
)
def test_junk_counts_are_refused_with_examples(junk):
    assert parse_count(junk) is None
    with pytest.raises(
        EstimateInputError,
        match=r"must be a whole number from 1 to 10\^16 \(e.g. 7B, 1.5e9, 350M or 1.3T\)",
    ):
        estimate_memory(n_params=junk)


def test_grouped_digits_are_read_only_in_groups_of_three():
    assert parse_count("1,000,000") == parse_count("1 000 000") == parse_count("1_000_000")
    assert parse_count("1,000,000") == 1_000_000 and parse_count("7 B") == 7 * 10**9
    for text in ("1,2,3", "1,00,000", "1_0", "1,000_000", ",100", "100,"):
        assert parse_count(text) is None, text
    with pytest.raises(
        EstimateInputError,
        match=r"n_params='1,2,3': must be a whole number .*; separators must group the digits by "
        r"three \(1,000,000 or 1_000_000\)",
    ):
        estimate_memory(n_params="1,2,3")


@pytest.mark.parametrize("huge", ["1e400", "1e17", 10**17, 10**400, 1e300])
def test_counts_past_the_range_say_why(huge):
    with pytest.raises(
        EstimateInputError,
        match=r"n_params=.*: more than 10\^16 parameters \(10\^4 times the largest models "
        r"trained\); allowed: an integer from 1 to 10\^16",
    ):
        estimate_memory(n_params=huge)


def test_numpy_counts_are_numbers():
    assert parse_count(np.int64(7)) == 7 and parse_count(np.float32(8.0)) == 8
    assert parse_count(np.float64(1.5)) is None and parse_count(np.True_) is None
    assert estimate_memory(n_params=np.int64(10**9)).n_params == 10**9


def test_tokens_accept_counts_as_text():
    e = estimate_memory(n_params="7B", tokens="300B", gpu="h100", price_per_gpu_hour=2)
    assert e.tokens == 300e9 and e.train_flops == 6 * 7e9 * 300e9
