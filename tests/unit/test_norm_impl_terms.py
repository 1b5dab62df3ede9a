"""The norms' implementation (`Architecture.norm_impl`) and the unfused softmax's dtype
(`Architecture.eager_softmax`) in the activation formula (`workbench.estimate.
implementations`): per-layer bytes counted by hand, defaults, what configs and presets say,
refusals, the command line. tests/integration/test_dry_run_norm_rope.py holds the counts to
torch's autograd and to the dry run."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workbench.cli import main
from workbench.estimate import Architecture, estimate_memory, transformer_activation_bytes
from workbench.estimate.hf_config import read_hf_config
from workbench.estimate.hf_shape import family_shape
from workbench.estimate.implementations import NORM_IMPLS, kept_bytes
from workbench.estimate.presets import find_model
from workbench.estimate.problems import EstimateInputError

# Llama-2-7B's layer at 1 x 2048 tokens (the dry run's real-shape grid)
LLAMA = {"model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "attention": "sdpa"}
SBH = 2048 * 4096


def _norm_bytes(**kw: Any) -> int:
    e = estimate_memory(**{**LLAMA, **kw})
    assert e.activations is not None
    return e.activations.norm_bytes


# --------------------------------------------------------------------------- the terms
def test_a_llama_layer_s_norms_by_hand() -> None:
    """Two norms a layer, each its input's kept bytes, and their outputs as the projections
    keep them: one tensor in pure precisions; under autocast a 16-bit cast for each of Q,
    K and V, and for gate and up."""
    assert _norm_bytes(precision="bf16-true") == (2 * (4 + 2) + 2 + 2) * SBH  # was 8 SBH
    assert _norm_bytes(precision="fp32") == (2 * (4 + 4) + 4 + 4) * SBH  # was 16 SBH
    assert _norm_bytes(precision="amp-bf16") == (2 * (4 + 4) + 3 * 2 + 2 * 2) * SBH
    # FSDP's mixed precision runs every op in bf16: no autocast
    fsdp = _norm_bytes(precision="amp-bf16", fsdp="full_shard", gpus=8)
    assert fsdp == _norm_bytes(precision="bf16-true")
    assert _norm_bytes(precision="bf16-true", norm_impl="kernel") == 4 * 2 * SBH  # the paper's
    assert _norm_bytes(precision="bf16-true", norm_impl="gemma") == (2 * (4 + 4) + 2 + 2) * SBH


def test_lora_s_frozen_norms_keep_their_fp32_copy_alone() -> None:
    lora = _norm_bytes(precision="bf16-true", lora_rank=8)
    assert lora == (2 * 4 + 2 + 2) * SBH
    assert kept_bytes("llama", 2, False, frozen=True) == kept_bytes("gemma", 4, True, True) == 4
    assert kept_bytes("kernel", 2, False, frozen=True) == 2  # its input, trained or not


def test_the_final_norm_and_full_recomputation_keep_the_residual_stream_s_bytes() -> None:
    sbh, v = SBH, 32000
    output = {
        p: estimate_memory(**LLAMA, precision=p).activations.output_bytes
        for p in ("fp32", "bf16-true", "amp-bf16")
    }
    assert output["bf16-true"] == (4 + 2 + 2) * sbh + 4 * 2048 * v
    assert output["fp32"] == (8 + 4) * sbh + 4 * 2048 * v
    assert output["amp-bf16"] == (8 + 2) * sbh + 4 * 2048 * v
    full = {
        p: estimate_memory(**LLAMA, precision=p, checkpointing="full").activations
        for p in ("bf16-true", "amp-bf16")
    }
    assert full["bf16-true"].per_layer_bytes == 2 * sbh
    assert full["amp-bf16"].per_layer_bytes == 4 * sbh  # autocast's fp32 layer input


def test_gpt2_s_eager_softmax_runs_in_the_scores_dtype() -> None:
    """In pure bf16 GPT-2's eager attention keeps one bf16 probabilities tensor (Megatron's
    count); under autocast an fp32 one beside its cast, as Llama's does in every 16-bit
    setting."""
    kw = {"model": "gpt2", "micro_batch": 2, "dropout": False}
    a, s, b = 12, 1024, 2
    for precision in ("bf16-true", "amp-bf16"):
        own = estimate_memory(**kw, precision=precision, attention="eager").activations
        upcast = estimate_memory(
            **kw, precision=precision, attention="eager", eager_softmax="fp32"
        ).activations
        extra = upcast.per_layer_bytes - own.per_layer_bytes
        assert extra == (4 * a * s * s * b if precision == "bf16-true" else 0), precision
    assert find_model("gpt2").architecture.eager_softmax == "input"
    assert find_model("llama-2-7b").architecture.eager_softmax == "fp32"


# --------------------------------------------------------------------------- the fields
def test_the_default_follows_the_norm_and_a_named_one_is_kept() -> None:
    shape = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100}
    gpt = Architecture.create(**shape)
    assert (gpt.norm_impl, gpt.eager_softmax) == ("kernel", "fp32")
    assert gpt.replace(norm="rmsnorm").norm_impl == "llama"
    gemma = gpt.replace(norm="rmsnorm", norm_impl="gemma")
    assert gemma.replace(norm="layernorm").norm_impl == "gemma"  # named: kept
    assert gemma.n_params == gpt.replace(norm="rmsnorm").n_params  # no parameter changes
    assert find_model("llama-2-7b").architecture.norm_impl == "llama"  # transformers' model
    assert find_model("gpt2").architecture.norm_impl == "kernel"
    assert set(NORM_IMPLS) == {"kernel", "llama", "gemma"}


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [("norm_impl", "rms", "kernel, llama, gemma"), ("eager_softmax", "bf16", "fp32, input")],
)
def test_a_bad_value_is_refused_naming_the_field_the_value_and_the_choices(
    field: str, value: str, allowed: str
) -> None:
    shape = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100}
    message = f"{field}='{value}': must be one of {allowed}"
    with pytest.raises(EstimateInputError, match=message):
        Architecture.create(**shape, **{field: value})
    with pytest.raises(ValueError, match=message):
        estimate_memory(**shape, **{field: value})
    with pytest.raises(ValueError, match=message):
        transformer_activation_bytes(**shape, micro_batch=1, **{field: value})
    assert estimate_memory(**shape, **{field: allowed.split(",")[0].upper()}).activations


def test_fused_qkv_must_be_a_bool() -> None:
    shape = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100}
    with pytest.raises(ValueError, match="fused_qkv='x': must be True or False"):
        transformer_activation_bytes(**shape, micro_batch=1, fused_qkv="x")
    one = transformer_activation_bytes(**shape, micro_batch=1, autocast=True, fused_qkv=True)
    three = transformer_activation_bytes(**shape, micro_batch=1, autocast=True)
    assert three.per_layer_bytes - one.per_layer_bytes == (3 - 1) * 2 * 32 * 64  # two casts


# --------------------------------------------------------------------------- configs
def _config(model_type: str, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": model_type, "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
        "max_position_embeddings": 32, "n_layer": 2, "n_embd": 64, "n_head": 4,
        "n_positions": 32, **extra,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("model_type", "extra", "norm", "softmax"),
    [
        ("gpt2", {}, "kernel", "input"),
        ("gpt2", {"reorder_and_upcast_attn": True}, "kernel", "fp32"),
        ("llama", {}, "llama", "fp32"),
        ("gpt_neox", {}, "kernel", "fp32"),
    ],
)
def test_a_config_of_a_pure_family_says_its_norm_and_softmax(model_type, extra, norm, softmax):
    fields, problems = read_hf_config(_config(model_type, **extra))
    assert not problems
    assert (fields["norm_impl"], fields["eager_softmax"]) == (norm, softmax)


@pytest.mark.parametrize(
    ("model_type", "norm", "softmax"),
    [
        ("gemma", "gemma", "fp32"),
        ("olmo2", "gemma", "fp32"),
        ("qwen3", "llama", "fp32"),
        ("bert", "kernel", "input"),
        ("opt", "kernel", "fp32"),
    ],
)
def test_each_mapped_family_says_what_its_code_runs(model_type, norm, softmax):
    config = _config(model_type, ffn_dim=128, head_dim=16, hidden_act="gelu")
    shape = family_shape(config, None)
    assert (shape.fields["norm_impl"], shape.fields["eager_softmax"]) == (norm, softmax)


@pytest.mark.parametrize(
    ("model_type", "qk_norm", "post_norms"),
    [
        ("qwen3", True, False),
        ("gemma3_text", True, True),
        ("gemma2", False, True),
        ("olmo2", True, False),
        ("gemma", False, False),
        ("opt", False, False),
    ],
)
def test_each_mapped_family_says_which_extra_norms_it_runs(model_type, qk_norm, post_norms):
    """transformers 5's modules: Qwen3Attention and Gemma3Attention hold per-head `q_norm`
    and `k_norm`, Olmo2Attention whole-width ones; Gemma2DecoderLayer and Gemma3DecoderLayer
    `post_attention_layernorm` and `post_feedforward_layernorm` on the blocks' outputs;
    Gemma's and OPT's none of them."""
    config = _config(model_type, ffn_dim=128, head_dim=16, hidden_act="gelu")
    fields = family_shape(config, None).fields
    assert (fields["qk_norm"], fields["post_norms"]) == (qk_norm, post_norms)


def test_query_and_key_norms_are_a_shape_field_with_their_bytes() -> None:
    """(q + g) x (4 + e) bytes a token a layer for the Llama row (the projections' outputs
    in the compute dtype: e = 2 under autocast, not the residual stream's 4), 4 frozen."""
    shape = dict(
        layers=2, hidden=256, heads=8, kv_heads=2, seq_len=512, vocab=1000, mlp="swiglu",
        norm="rmsnorm", positions="rotary", bias="none", attention="sdpa", dropout=False,
    )  # fmt: skip
    tokens, q, g = 512, 256, 64
    for precision, per_element in (("fp32", 8), ("bf16-true", 6), ("amp-bf16", 6)):
        off = estimate_memory(**shape, precision=precision).activations
        on = estimate_memory(**shape, precision=precision, qk_norm=True).activations
        assert on.per_layer_bytes - off.per_layer_bytes == tokens * (q + g) * per_element
    frozen = dict(shape, precision="bf16-true", lora_rank=8)
    off = estimate_memory(**frozen).activations
    on = estimate_memory(**frozen, qk_norm=True).activations
    assert on.per_layer_bytes - off.per_layer_bytes == tokens * (q + g) * 4


def test_a_bad_qk_norm_is_refused_naming_the_field_and_the_value(capsys) -> None:
    with pytest.raises(EstimateInputError, match=r"qk_norm='maybe': must be True or False"):
        estimate_memory(model="llama-3-8b", qk_norm="maybe")
    config = _config("qwen3", head_dim=16)
    with pytest.raises(
        EstimateInputError,
        match=r"qk_norm=False: the qwen3 config.json .*"
        r"whose layout its model_type decides \(no key sets qk_norm\)",
    ):
        estimate_memory(hf_config=config, qk_norm=False)
    assert main(["estimate", "--model", "llama-3-8b", "--qk-norm"]) == 0
    assert "rmsnorm (llama) with query and key norms" in capsys.readouterr().out
    with pytest.raises(EstimateInputError, match=r"post_norms='yes please': must be True or False"):
        estimate_memory(model="llama-3-8b", post_norms="yes please")
    assert main(["estimate", "--model", "llama-3-8b", "--post-norms", "--norm-impl", "gemma"]) == 0
    assert "gemma) and norms of each block's output" in capsys.readouterr().out


def test_the_norms_of_the_blocks_outputs_are_two_h_wide_norms_a_layer() -> None:
    """Gemma's norms on the attention's and the MLP's outputs: 2 x h x 8 bytes a token a
    layer ("gemma": fp32 copy and normalised output), 2 x h x 4 with LoRA's frozen weights."""
    shape = dict(
        layers=2, hidden=256, heads=8, kv_heads=2, seq_len=512, vocab=1000, mlp="swiglu",
        norm="rmsnorm", positions="rotary", bias="none", attention="sdpa", dropout=False,
        norm_impl="gemma",
    )  # fmt: skip
    for extra, per_element in (({}, 8), ({"lora_rank": 8}, 4)):
        off = estimate_memory(**shape, **extra, precision="bf16-true").activations
        on = estimate_memory(**shape, **extra, precision="bf16-true", post_norms=True).activations
        assert on.per_layer_bytes - off.per_layer_bytes == 2 * 512 * 256 * per_element


def test_the_command_line_takes_and_shows_them(capsys) -> None:
    assert main(["estimate", "--model", "llama-2-7b", "--json"]) == 0
    llama = json.loads(capsys.readouterr().out)
    assert (llama["norm_impl"], llama["eager_softmax"]) == ("llama", "fp32")
    assert main(["estimate", "--model", "llama-2-7b", "--norm-impl", "kernel", "--json"]) == 0
    kernel = json.loads(capsys.readouterr().out)
    assert kernel["norm_impl"] == "kernel"
    # fp32 at 1 x 4096 tokens: each of a layer's two norms keeps its normalised input too
    assert llama["activations"]["norm_bytes"] - kernel["activations"]["norm_bytes"] == (
        2 * 4 * 4096 * 4096
    )
    assert main(["estimate", "--model", "llama-2-7b"]) == 0
    assert "rmsnorm (llama)" in capsys.readouterr().out
    assert main(["estimate", "--model", "gpt2", "--attention", "eager"]) == 0
    assert "input softmax" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["estimate", "--model", "llama-2-7b", "--norm-impl", "rms"])
    assert "--norm-impl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["estimate", "--model", "llama-2-7b", "--norm-impl", "kernel", "--simulate"])
    assert "--norm-impl: not simulated (the dry run runs the model as it is built" in (
        capsys.readouterr().err
    )


QWEN3_8B = {
    "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "num_hidden_layers": 36, "vocab_size": 151936, "max_position_embeddings": 40960,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
}  # fmt: skip


def test_qwen3_8b_s_query_and_key_norms_as_docs_estimator_md_gives_them() -> None:
    """docs/estimator.md: at 1 x 4,096 in bf16 the norms keep (4,096 + 1,024) x 6 bytes a
    token, 126 MB a layer, +17% of the layer; the allocated peak 78.2 -> 82.4 GiB, over an
    H100 by 9.1 GiB with the reserve where it was 4.3 without them."""
    kw = dict(seq_len=4096, precision="bf16-true", attention="sdpa", gpu="h100")
    with_norms = estimate_memory(hf_config=QWEN3_8B, **kw)
    assert with_norms.qk_norm
    shape = Architecture.create(
        layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn_hidden=12288,
        mlp="swiglu", norm="rmsnorm", positions="rotary", bias="none", vocab=151936,
        seq_len=4096, tied_embeddings=False,
    )  # fmt: skip
    without = estimate_memory(model=shape, n_params=with_norms.n_params, dropout=False, **kw)
    a, b = without.activations, with_norms.activations
    assert b.per_layer_bytes - a.per_layer_bytes == 4096 * (4096 + 1024) * 6 == 125_829_120
    assert b.per_layer_bytes / a.per_layer_bytes == pytest.approx(1.17, abs=0.005)
    assert without.peak_bytes / 2**30 == pytest.approx(78.2, abs=0.05)
    assert with_norms.peak_bytes / 2**30 == pytest.approx(82.4, abs=0.05)
    assert -without.margin_bytes / 2**30 == pytest.approx(4.3, abs=0.05)
    assert -with_norms.margin_bytes / 2**30 == pytest.approx(9.1, abs=0.05)


def test_gemma3_12b_s_norms_of_the_blocks_outputs_as_docs_estimator_md_gives_them() -> None:
    """docs/estimator.md: at Gemma 3 12B's shape, 1 x 4,096 in bf16, a layer keeps 1.04 GiB
    without `post_norms` and 1.27 GiB with them (2 x 3,840 x 8 bytes a token more)."""
    arch = Architecture.create(
        layers=48, hidden=3840, heads=16, kv_heads=8, head_dim=256, ffn_hidden=15360,
        mlp="swiglu", norm="rmsnorm", positions="rotary", bias="none", vocab=262208,
        seq_len=4096, activation_function="gelu_pytorch_tanh", norm_impl="gemma",
        qk_norm=True, tied_embeddings=True,
    )  # fmt: skip
    kw = dict(precision="bf16-true", dropout=False, attention="sdpa")
    a = estimate_memory(model=arch, **kw).activations.per_layer_bytes
    b = estimate_memory(model=arch.replace(post_norms=True), **kw).activations.per_layer_bytes
    assert b - a == 2 * 3840 * 8 * 4096
    assert (round(a / 2**30, 2), round(b / 2**30, 2)) == (1.04, 1.27)


def test_a_built_family_s_layout_flags_are_refused_naming_them(capsys, tmp_path) -> None:
    """Whether a family's layers run query/key norms or norms of the blocks' outputs is its
    `model_type`'s: a config counted by building its model refuses either flag."""
    gemma = _config("gemma3_text", head_dim=16, hidden_activation="gelu_pytorch_tanh")
    with pytest.raises(EstimateInputError, match=r"post_norms=False: the gemma3_text config"):
        estimate_memory(hf_config=gemma, post_norms=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_8B))
    with pytest.raises(SystemExit) as stopped:
        main(["estimate", "--hf-config", str(path), "--qk-norm"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--qk-norm: the qwen3 config.json is counted by building transformers' model" in err


def test_a_shape_the_dry_run_cannot_build_with_its_norms_is_not_built() -> None:
    """`hf_shape.config_of` builds query/key norms as Qwen3's (a Llama layout) and no norms
    of the blocks' outputs: a GPT-2 shape with either, or a Llama one with the second, gets
    no config rather than a model without them."""
    from workbench.estimate.hf_shape import config_of

    gpt2 = find_model("gpt2").architecture
    llama = find_model("llama-3-8b").architecture
    assert config_of(gpt2.replace(qk_norm=True)) is None
    assert config_of(gpt2.replace(post_norms=True)) is None
    assert config_of(llama.replace(post_norms=True)) is None
    assert config_of(llama.replace(qk_norm=True))["model_type"] == "qwen3"
