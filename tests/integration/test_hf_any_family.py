"""`estimate_memory(hf_config=...)` for a config.json of any family transformers builds.

Every config is written here at a tiny size (never downloaded). For each family the count
the estimator gives equals the parameters of the same model built by transformers on the
CPU (tied weights once); where the family maps onto the activation formula's terms the
estimate has a shape, and the difference between the module's count and the shape's is
exactly what the family holds outside those terms, counted by hand below. Families that
do not map (encoder-decoders, latent attention) keep the exact count and say why their
activations are not estimated.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.estimate import (
    MODELS,
    Architecture,
    EstimateInputError,
    estimate_memory,
    hf_build,
)
from workbench.estimate.from_module import module_facts
from workbench.estimate.hf_build import build_facts, config_facts

L, H, A, KV, F, V, S, D = 2, 64, 4, 2, 96, 100, 32, 16  # layers, hidden, heads, ... head size
TINY = {
    "num_hidden_layers": L,
    "hidden_size": H,
    "num_attention_heads": A,
    "num_key_value_heads": KV,
    "intermediate_size": F,
    "vocab_size": V,
    "max_position_embeddings": S,
    "pad_token_id": 0,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}

# model_type -> (config keys beyond TINY, module count - the shape's count, by hand)
MAPPED: dict[str, tuple[dict[str, object], int]] = {
    "gemma": ({"head_dim": D}, 0),
    "gemma2": ({"head_dim": D}, L * 2 * H),  # norms before and after the MLP too
    "gemma3_text": ({"head_dim": D}, L * (2 * H + 2 * D)),  # and per-head q/k norms
    "phi3": ({}, 0),
    "mixtral": ({"num_local_experts": 4, "num_experts_per_tok": 2}, 0),
    "qwen2_moe": (
        {"num_experts": 4, **MOE, "shared_expert_intermediate_size": 48},
        L * H,  # the shared expert's gate h -> 1
    ),
    "qwen3": ({"head_dim": D}, L * 2 * D),  # per-head q/k norms
    "qwen3_moe": ({"head_dim": D, "num_experts": 4, **MOE}, L * 2 * D),
    "olmo2": ({}, L * (A + KV) * D),  # q/k norms over every head
    "olmoe": ({"num_experts": 4, "num_experts_per_tok": 2}, L * (H + KV * D)),
    "granite": ({}, 0),
    "llama": ({"attention_bias": True}, L * H),  # Q, K, V and output biases: "qkv" + h
    "starcoder2": ({}, 0),
    "falcon": ({}, -L * 2 * H),  # Falcon-7B: parallel, multi-query, one LayerNorm a layer
    "phi": ({}, -L * 2 * H + V),  # one LayerNorm a layer; the output layer's bias
    "gptj": ({}, L * (4 * H - H) + V),  # MLP biases only; one LayerNorm; output bias
    "gpt_bigcode": ({}, 0),
    "opt": ({"ffn_dim": F}, 0),
    "bloom": ({}, 2 * H),  # the LayerNorm after the embedding
    # BERT for masked LM: token types 2h, the head's transform h^2 + h and LayerNorm 2h,
    # the decoder's bias V (its weight is the embedding's)
    "bert": ({}, 2 * H + H * H + H + 2 * H + V),
    "roberta": ({"pad_token_id": 1, "type_vocab_size": 1}, H + H * H + H + 2 * H + V),
}


def _config(model_type: str, **extra: object) -> dict[str, object]:
    return {"model_type": model_type, **TINY, **extra}


def _cpu_count(config: dict[str, object]) -> int:
    """The parameters of the model transformers builds from `config`, on the CPU."""
    data = dict(config)
    cls = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    if cls.is_encoder_decoder:
        auto = transformers.AutoModelForSeq2SeqLM
    elif type(cls).__name__ in ("BertConfig", "RobertaConfig"):
        auto = transformers.AutoModelForMaskedLM
    else:
        auto = transformers.AutoModelForCausalLM
    model = auto.from_config(cls)
    return sum(p.numel() for p in model.parameters())  # a tied weight appears once


@pytest.mark.parametrize("model_type", sorted(MAPPED))
def test_a_family_is_counted_exactly_and_mapped_onto_the_formula(model_type):
    extra, outside = MAPPED[model_type]
    config = _config(model_type, **extra)
    kept = copy.deepcopy(config)
    facts = config_facts(config)
    assert facts.problems == [] and facts.activation_note is None
    assert facts.counted == _cpu_count(config)
    arch = Architecture.create(**facts.fields)
    assert facts.counted - arch.n_params == outside
    e = estimate_memory(hf_config=config, micro_batch=2, precision="bf16")
    assert e.n_params == facts.counted and e.layers == L and e.activation_bytes is not None
    assert e.model == facts.name and e.hf_config == "dict"
    assert config == kept  # the caller's dict is not changed


def test_the_shapes_read_from_the_families():
    def shape(model_type: str) -> Architecture:
        extra, _ = MAPPED[model_type]
        arch = config_facts(_config(model_type, **extra)).architecture()
        assert arch is not None
        return arch

    gemma = shape("gemma")  # GeGLU: gated, three matrices; 4 heads of 16 from hidden 64
    assert (gemma.mlp, gemma.norm, gemma.head_dim, gemma.tied_embeddings) == (
        "swiglu",
        "rmsnorm",
        D,
        True,
    )
    bert = shape("bert")
    assert (bert.causal, bert.positions, bert.max_positions, bert.mlp) == (
        False,
        "learned",
        S,
        "gelu",
    )
    roberta = shape("roberta")  # positions start after the padding id: 30 of 32 rows usable
    assert (roberta.seq_len, roberta.max_positions) == (S - 2, S)
    falcon = shape("falcon")
    assert (falcon.kv_heads, falcon.parallel_residual, falcon.bias) == (1, True, "none")
    opt = shape("opt")  # OPT's table has two rows more than its positions
    assert (opt.max_positions, opt.seq_len, opt.ffn_hidden) == (S + 2, S, F)
    bloom = {k: v for k, v in _config("bloom").items() if k != "max_position_embeddings"}
    alibi = config_facts(bloom).architecture()  # no position table, no position limit:
    assert alibi is not None and alibi.seq_len == 2048  # BLOOM's training sequence
    assert config_facts({**bloom, "seq_length": 512}).fields["seq_len"] == 512
    moe = shape("qwen2_moe")
    assert (moe.experts, moe.experts_per_token, moe.moe_ffn_hidden, moe.shared_ffn_hidden) == (
        4,
        2,
        32,
        48,
    )
    assert (moe.bias, shape("qwen3").head_dim) == ("qkv", D)
    # the MLP's activation: the default of each family's config class (the key its code reads)
    activations = {name: shape(name).activation_function for name in MAPPED}
    assert activations == {
        **{name: "silu" for name in MAPPED},
        "gemma": "gelu_pytorch_tanh", "gemma2": "gelu_pytorch_tanh",
        "gemma3_text": "gelu_pytorch_tanh", "starcoder2": "gelu_pytorch_tanh",
        "gpt_bigcode": "gelu_pytorch_tanh", "falcon": "gelu", "bert": "gelu",
        "roberta": "gelu", "phi": "gelu_new", "gptj": "gelu_new", "opt": "relu",
        "bloom": "bloom_gelu",
    }  # fmt: skip


def test_the_five_pure_families_count_as_the_built_model():
    """gpt2, llama, mistral, qwen2 and gpt_neox are read without transformers; the model
    built on the meta device counts the same and maps onto the same shape."""
    gpt2 = {"n_layer": L, "n_embd": H, "n_head": A, "n_positions": S, "vocab_size": V}
    configs = [
        {"model_type": "gpt2", **gpt2},
        {"model_type": "gpt2", **gpt2, "n_inner": F, "tie_word_embeddings": False},
        _config("llama"),
        _config("llama", attention_bias=True, mlp_bias=True, head_dim=8),
        _config("mistral", head_dim=32),
        _config("qwen2", tie_word_embeddings=True),
        _config("gpt_neox", use_parallel_residual=False),
    ]
    for config in configs:
        pure = config_facts(config)
        assert pure.counted is None and pure.problems == []  # nothing built
        built = build_facts(config)
        assert built.counted == _cpu_count(config), config
        assert pure.architecture() == built.architecture(), config
        assert Architecture.create(**pure.fields).n_params == built.counted, config


def test_families_that_do_not_map_keep_the_exact_count_and_say_why():
    t5 = {
        "model_type": "t5",
        "d_model": H,
        "d_ff": F,
        "d_kv": D,
        "num_layers": L,
        "num_heads": A,
        "vocab_size": V,
    }
    facts = config_facts(t5)
    assert facts.counted == _cpu_count(t5) and facts.fields == {}
    assert facts.name == "T5ForConditionalGeneration"
    assert facts.activation_note == (
        "activations not estimated: t5 is an encoder-decoder (the activation formula covers "
        "decoder-only and encoder-only transformers); a dry run of the model measures them"
    )
    e = estimate_memory(hf_config=t5)
    assert e.n_params == facts.counted and e.activation_bytes is None and e.layers is None
    sizes = {"d_model": H, "encoder_layers": L, "decoder_layers": L}
    heads = {"encoder_attention_heads": A, "decoder_attention_heads": A}
    whisper = config_facts({"model_type": "whisper", **sizes, **heads})  # never the decoder alone
    assert whisper.name == "WhisperForConditionalGeneration" and whisper.fields == {}
    deepseek = _config(
        "deepseek_v3",
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    )
    facts = config_facts(deepseek)
    assert facts.counted == _cpu_count(deepseek) and facts.fields == {}
    assert "deepseek_v3 uses multi-head latent attention" in (facts.activation_note or "")
    # one expert layer (the first is dense) of 4 SwiGLU experts, 2 per token
    assert facts.active_params == facts.counted - (4 - 2) * 3 * H * 32
    mamba = {"model_type": "mamba", "hidden_size": H, "num_hidden_layers": L, "vocab_size": V}
    facts = config_facts(mamba)
    assert facts.counted == _cpu_count(mamba) and facts.fields == {}
    assert "mamba is not a family mapped onto the activation formula's terms" in (
        facts.activation_note or ""
    )


def test_heads_that_do_not_divide_the_hidden_size_get_transformers_head_size():
    phi3 = _config("phi3", num_attention_heads=5, num_key_value_heads=5)  # heads of 64 // 5
    facts = config_facts(phi3)
    arch = facts.architecture()
    assert arch is not None and arch.head_dim == 12 and arch.q_dim == 60
    assert facts.counted == _cpu_count(phi3) == arch.n_params


def test_a_family_the_table_does_not_list_is_mapped_when_a_common_layout_counts_it():
    glm = _config("glm")  # GLM-4: Llama's layout with Q/K/V biases and a fused gate/up
    facts = config_facts(glm)
    arch = facts.architecture()
    assert arch is not None and facts.activation_note is None
    assert (arch.mlp, arch.norm, arch.bias) == ("swiglu", "rmsnorm", "qkv")
    assert facts.counted == _cpu_count(glm) == arch.n_params


def test_mixtral_8x7b_as_published_counts_on_meta_once(monkeypatch):
    config = {  # config.json of mistralai/Mixtral-8x7B-v0.1 as released
        "architectures": ["MixtralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mixtral",
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.36.0.dev0",
        "use_cache": True,
        "vocab_size": 32000,
    }
    built = []
    real = hf_build._meta_model

    def recording(config):
        module, problems = real(config)
        built.append(module)
        return module, problems

    monkeypatch.setattr(hf_build, "_meta_model", recording)
    hf_build.clear_cache()
    facts = config_facts(config)
    assert facts.counted == 46_702_792_704  # KerasHub mixtral_8_7b_en: 46,702,792,704
    assert facts.active_params == 12_879_925_248  # "12.9B active" (Mistral AI, 2023)
    assert facts.architecture() == MODELS["mixtral-8x7b"].architecture
    (module,) = built  # 46.7B parameters built on the meta device: no storage behind them
    tensors = [*module.parameters(), *module.buffers()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    del module, tensors
    built.clear()
    again = estimate_memory(hf_config=config, precision="bf16", zero_stage=3, gpus=8)
    assert again.n_params == facts.counted
    assert built == []  # the built config is cached: the estimate did not build it again


def test_a_built_config_is_cached_per_content(monkeypatch):
    builds = []
    real = hf_build._build

    def counting(config):
        builds.append(config["model_type"])
        return real(config)

    monkeypatch.setattr(hf_build, "_build", counting)
    hf_build.clear_cache()
    config = _config("phi3")
    first = config_facts(config)
    assert config_facts(dict(config)) == first and builds == ["phi3"]
    config_facts({**config, "num_hidden_layers": 3})
    assert builds == ["phi3", "phi3"]  # other content: built again


def test_a_transformers_module_gives_its_shape_from_its_config():
    config = transformers.AutoConfig.for_model("gemma", **TINY, head_dim=D)
    model = transformers.AutoModelForCausalLM.from_config(config)
    facts = module_facts(model)
    assert facts.counted == sum(p.numel() for p in model.parameters())
    assert facts.fields["head_dim"] == D and facts.activation_note is None
    e = estimate_memory(model=model, micro_batch=2, precision="bf16")
    assert e.model == "GemmaForCausalLM" and e.mlp == "swiglu" and e.activation_bytes is not None
    assert e.n_params == facts.counted
    arch = facts.architecture()
    assert arch is not None
    assert estimate_memory(model=arch, n_params=facts.counted).n_params == facts.counted
    moe = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model("mixtral", **TINY, num_local_experts=4)
    )
    facts = module_facts(moe)
    assert facts.fields["experts"] == 4
    assert facts.active_params == facts.counted - L * (4 - 2) * 3 * H * F
    t5 = transformers.T5ForConditionalGeneration(
        transformers.T5Config(d_model=H, d_ff=F, d_kv=D, num_layers=L, num_heads=A, vocab_size=V)
    )
    facts = module_facts(t5)
    assert facts.fields == {} and "t5 is an encoder-decoder" in (facts.activation_note or "")
    assert estimate_memory(model=t5).activation_bytes is None


def test_a_module_without_a_config_has_active_parameters_only_when_dense():
    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    assert module_facts(torch.nn.Linear(4, 4)).active_params == 20
    facts = module_facts(Experts())
    assert facts.counted == 60 and facts.active_params is None  # top-k unknown


def test_a_module_factory_of_any_family_is_built_on_meta():
    config = transformers.AutoConfig.for_model("qwen3", **TINY, head_dim=D)
    e = estimate_memory(model=lambda: transformers.AutoModelForCausalLM.from_config(config))
    assert e.model == "Qwen3ForCausalLM" and e.layers == L and e.activation_bytes is not None


# ------------------------------------------------------------------ bad input
def _problem(config: object) -> str:
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config=config)
    (problem,) = info.value.problems
    assert problem.field == "hf_config"
    return problem.message


def test_configs_transformers_cannot_build_are_problems_naming_what_is_wrong():
    assert _problem({"model_type": "no-such-model", "hidden_size": 8}) == (
        "model_type 'no-such-model' is not a model type "
        f"transformers {transformers.__version__} knows (nor one of gpt2, llama, mistral, "
        "qwen2, gpt_neox, counted without it)"
    )
    assert _problem(_config("gemma", num_hidden_layers="2")) == (
        "num_hidden_layers '2' is a string: must be an integer from 1 to 10^5"
    )
    assert _problem(_config("gemma", hidden_size=0)) == (
        "hidden_size 0: must be an integer from 1 to 10^6"
    )
    bloom = {"model_type": "bloom", "n_layer": 2.5, "hidden_size": H, "n_head": A}
    assert _problem(bloom) == "n_layer 2.5: must be an integer from 1 to 10^5"  # its own name
    message = _problem(_config("gemma", attention_bias="yes"))
    assert message.startswith(f"transformers {transformers.__version__} cannot read this gemma")
    assert "attention_bias" in message and "expected bool" in message
    message = _problem(_config("bert", num_attention_heads=5))
    assert message == (
        "building the bert model (AutoModelForMaskedLM) failed: ValueError: The hidden size "
        "(64) is not a multiple of the number of attention heads (5)"
    )
    message = _problem({**_config("phi3"), "pad_token_id": 500})  # outside the vocabulary
    assert message.startswith("building the phi3 model (AutoModelForCausalLM) failed: ")
    assert "Traceback" not in message and len(message) < 500
    assert _problem(_config("mixtral", num_hidden_layers=5000)) == (
        "num_hidden_layers 5000: more than 4,096 layers (a model is built layer by layer to be "
        "counted; the deepest models trained have about 10^2)"
    )


def test_a_config_that_names_custom_code_is_refused():
    for config, where in (
        ({**_config("llama"), "auto_map": {"AutoModelForCausalLM": "x.Y"}}, "auto_map"),
        ({**_config("gemma"), "text_config": {"auto_map": {"AutoConfig": "x.C"}}}, "text_config"),
    ):
        message = _problem(config)
        assert message.startswith(f"{where}")
        assert "names custom code to import; a config is read as data and nothing in it " in (
            message
        )


def test_without_transformers_other_families_say_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)
    hf_build.clear_cache()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config("gemma")))
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config=path)
    assert str(info.value).endswith(
        "is not installed (transformers; pip install transformers); without it the supported "
        "families are gpt2, llama, mistral, qwen2, gpt_neox"
    )
    assert f"hf_config='{path}': model_type 'gemma' is counted by building" in str(info.value)
    with pytest.raises(EstimateInputError, match=r"attention_bias=True with mlp_bias=False"):
        estimate_memory(hf_config=_config("llama", attention_bias=True))
    assert (
        estimate_memory(hf_config=_config("llama")).n_params
        == Architecture.create(**config_facts(_config("llama")).fields).n_params
    )  # the pure path needs no transformers


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(10**5, 10**7),
    st.sampled_from([10**10, 10**400, 2**64, -(10**6)]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.lists(st.integers(0, 4), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(
    max_examples=int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", 0)) or 60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.sampled_from([*sorted(MAPPED), "t5", "deepseek_v3", "mamba"]),
    st.dictionaries(st.sampled_from([*TINY, "head_dim", "tie_word_embeddings"]), JUNK, max_size=3),
)
def test_any_config_gives_a_count_or_problems_naming_the_field(model_type, junk):
    extra, _ = MAPPED.get(model_type, ({}, 0))
    config = {**_config(model_type, **extra), **junk}
    kept = copy.deepcopy(config)
    facts = config_facts(config)
    assert config == kept
    for problem in facts.problems:
        assert problem.field == "hf_config" and 0 < len(str(problem)) < 2_000
        assert "Traceback" not in problem.message
    if not facts.problems:
        assert facts.counted is not None and facts.counted >= 0
        try:
            e = estimate_memory(hf_config=config)
        except EstimateInputError as refused:
            # a config that counts can still be one the estimate refuses (a sequence
            # longer than the config allows, say): the refusal names its fields
            assert refused.problems
            for problem in refused.problems:
                assert problem.field and 0 < len(str(problem)) < 2_000, problem
                assert "Traceback" not in problem.message
        else:
            assert e.n_params == facts.counted
