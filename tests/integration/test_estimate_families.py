"""The estimator's architecture formulas against small `transformers` models of each family.

The models are built from a config (never downloaded) at a tiny size, in fp32 and
without dropout. Two checks per family:

* the parameter count the estimator derives from the model's config.json equals the
  module's own count (GQA, SwiGLU, biases, norms, tied or untied embeddings);
* the bytes autograd saves for backward (`workbench.train.measure.memory.measure_activations`)
  equal the activation formula (with the family's norms: transformers' RMSNorm keeps its
  normalised input too, `implementations`) plus the implementation details it leaves out,
  each counted by hand below: per-token norm statistics, the rotary cos/sin tables, the
  int64 token ids and the loss normaliser.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from workbench.estimate import (
    Architecture,
    estimate_memory,
    read_hf_config,
    transformer_activation_bytes,
)
from workbench.train.measure.memory import measure_activations

L, H, A, KV, F, V, S, B = 2, 64, 4, 2, 96, 100, 32, 3  # layers, hidden, heads, kv heads, ...


def _config(family: str, act: str | None = None) -> transformers.PretrainedConfig:
    """The family's tiny config; `act` its MLP activation (GPT-2's `activation_function`,
    the others' `hidden_act`) instead of the one below."""
    config = _family_config(family)
    if act is not None:
        setattr(config, "activation_function" if family == "gpt2" else "hidden_act", act)
    return config


def _family_config(family: str) -> transformers.PretrainedConfig:
    llama_like = dict(
        num_hidden_layers=L,
        hidden_size=H,
        num_attention_heads=A,
        num_key_value_heads=KV,
        intermediate_size=F,
        vocab_size=V,
        max_position_embeddings=S,
    )
    if family == "gpt2":
        return transformers.GPT2Config(
            n_layer=L,
            n_embd=H,
            n_head=A,
            vocab_size=V,
            n_positions=S,
            activation_function="gelu",  # GPT-2's tanh "gelu_new" keeps more intermediates
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
    if family == "llama":
        return transformers.LlamaConfig(**llama_like)
    if family == "mistral":
        return transformers.MistralConfig(**llama_like, sliding_window=None)
    if family == "qwen2":
        return transformers.Qwen2Config(**llama_like)
    assert family == "gpt_neox"
    return transformers.GPTNeoXConfig(
        num_hidden_layers=L,
        hidden_size=H,
        num_attention_heads=A,
        intermediate_size=4 * H,
        vocab_size=V,
        max_position_embeddings=S,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def _model(family: str, act: str | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    config = _config(family, act)
    config._attn_implementation = "eager"  # the unfused attention of Korthikanti's Table 2
    return transformers.AutoModelForCausalLM.from_config(config)


FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "gpt_neox"]


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_from_the_config_equals_the_module(family):
    model = _model(family)
    fields, problems = read_hf_config(model.config.to_dict())
    assert problems == []
    arch = Architecture.create(**fields)
    counted = sum(p.numel() for p in model.parameters())  # tied weights appear once
    assert arch.n_params == counted
    assert estimate_memory(model=model).n_params == counted
    assert estimate_memory(hf_config=model.config.to_dict()).n_params == counted
    expected = {
        "gpt2": ("gelu", "layernorm", "all", "learned", True, A),
        "llama": ("swiglu", "rmsnorm", "none", "rotary", False, KV),
        "mistral": ("swiglu", "rmsnorm", "none", "rotary", False, KV),
        "qwen2": ("swiglu", "rmsnorm", "qkv", "rotary", False, KV),
        "gpt_neox": ("gelu", "layernorm", "all", "rotary", False, A),
    }[family]
    got = (arch.mlp, arch.norm, arch.bias, arch.positions, arch.tied_embeddings, arch.kv_heads)
    assert got == expected


def _extras(family: str, model: torch.nn.Module) -> int:
    """Saved bytes that are implementation details outside the formula, by hand (fp32)."""
    sb = S * B
    norms = 2 * L + 1  # two per layer and the final one
    ids = 8 * sb + 8 * sb  # int64 input ids (embedding) and labels (loss)
    loss_normaliser = 4  # cross-entropy's fp32 total weight
    # LayerNorm keeps mean and 1/std per token, fp32; RMSNorm 1/rms
    stats = norms * (2 if family in ("gpt2", "gpt_neox") else 1) * 4 * sb
    extra = stats + ids + loss_normaliser
    if family == "gpt2":
        extra += 8 * S  # int64 position ids (one row, broadcast over the batch)
    else:
        fraction = 1.0
        if family == "gpt_neox":  # rotates a quarter of each head by default
            rope = getattr(model.config, "rope_parameters", None) or {}
            fraction = rope.get("partial_rotary_factor", getattr(model.config, "rotary_pct", 0.25))
        extra += 2 * 4 * S * int(H // A * fraction)  # cos and sin, shared by every layer
    return extra


@pytest.mark.parametrize(
    ("family", "act"),
    [(family, None) for family in FAMILIES]
    + [
        ("gpt2", "gelu_new"),  # GPT-2's own: its Python tanh formula's intermediates
        ("gpt2", "relu"),  # keeps its output only
        ("gpt2", "quick_gelu"),
        ("gpt_neox", "gelu_new"),
        ("llama", "gelu_new"),  # gated
        ("llama", "relu"),
    ],
)
def test_saved_activations_equal_the_formula_plus_known_extras(family, act):
    """With the MLP activation the config names (`activation_functions`): the formula
    counts what its autograd keeps."""
    model = _model(family, act)
    model.train()
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
    _, measured = measure_activations(model, lambda: model(input_ids=ids, labels=ids).loss)
    e = estimate_memory(model=model, seq_len=S, micro_batch=B, precision="fp32")
    formula = transformer_activation_bytes(
        layers=L,
        hidden=H,
        heads=A,
        seq_len=S,
        micro_batch=B,
        vocab=V,
        activation_bytes_per_element=4,
        dropout=False,
        ffn_hidden=e.ffn_hidden,
        mlp=e.mlp,
        parallel_residual=bool(e.parallel_residual),
        activation_function=e.activation_function,
        norm_impl=e.norm_impl,
    )
    assert e.norm_impl == ("kernel" if family in ("gpt2", "gpt_neox") else "llama")
    assert e.activation_function == (
        act or {"gpt2": "gelu", "gpt_neox": "gelu"}.get(family, "silu")
    )
    assert measured.activation_bytes == formula.total_bytes + _extras(family, model)
    # the terms that tell the families apart, from the formula itself
    sbh, sbf = S * B * H, S * B * (e.ffn_hidden or 0)
    kept = {None: 0, "gelu_new": 3, "relu": -1, "quick_gelu": 1}[act]  # beyond gelu's / silu's
    mlp_terms = {"gelu": sbh + 2 * sbf, "swiglu": sbh + 4 * sbf}[e.mlp or ""] + kept * sbf
    norm_inputs = 1 if e.parallel_residual else 2
    # each norm's input; in fp32 transformers' RMSNorm keeps its normalised input beside it
    norm_kept = norm_inputs * (2 if e.norm_impl == "llama" else 1)
    per_layer = 4 * ((norm_kept + 5) * sbh + mlp_terms + A * S * S * B)
    assert formula.per_layer_bytes == per_layer


def test_gqa_keys_and_values_are_saved_at_full_width_by_unfused_attention():
    """Eager attention repeats K and V to every head before the score matmul, so GQA
    saves parameters, not activations: the same activations as with kv_heads = heads."""
    gqa = _model("llama")
    mha_config = _config("llama")
    mha_config.num_key_value_heads = A
    mha_config._attn_implementation = "eager"
    mha = transformers.AutoModelForCausalLM.from_config(mha_config)
    ids = torch.randint(0, V, (B, S))
    sizes = []
    for model in (gqa, mha):
        model.train()
        _, m = measure_activations(model, lambda model=model: model(input_ids=ids, labels=ids).loss)
        sizes.append(m.activation_bytes)
    assert sizes[0] == sizes[1]
    assert sum(p.numel() for p in gqa.parameters()) < sum(p.numel() for p in mha.parameters())


def test_a_factory_is_built_on_the_meta_device():
    """A 6.7B-parameter model is counted without allocating its 27 GB of fp32 weights."""
    import resource

    config = transformers.LlamaConfig(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    e = estimate_memory(
        model=lambda: transformers.AutoModelForCausalLM.from_config(config),
        precision="bf16",
        zero_stage=3,
        gpus=8,
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert e.n_params == 6_738_415_616 == estimate_memory(model="llama-2-7b").n_params
    assert e.model == "LlamaForCausalLM" and e.layers == 32 and e.mlp == "swiglu"
    assert grown_kib < 2 * 1024 * 1024  # far below the 27 GB the weights would take
