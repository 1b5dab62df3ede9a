"""The norms' and the rotary embedding's terms (`workbench.estimate.implementations`) held to
torch's autograd and to the dry run of transformers' Llama and GPT-2.

* What each norm keeps, counted with `saved_tensors_hooks` on real tensors (once per
  storage, parameters and per-token statistics aside): torch's `nn.LayerNorm` ("kernel"),
  transformers' `LlamaRMSNorm` ("llama") and `GemmaRMSNorm` ("gemma"), in fp32, pure bf16,
  CPU autocast and CUDA autocast's lists (read from torch's CUDA autocast kernels on fake
  tensors, `CudaAutocastLists`), trained and frozen (LoRA).
* The rotary embedding keeps cos and sin alone: not the pre-rotation Q and K, nor their
  rotated halves.
* One transformers Llama decoder layer and one GPT-2 block keep, to the byte, the
  formula's layer (`per_layer_bytes`) plus what it leaves out (the norms' per-token rsqrt,
  the rotary tables) in every precision.
* The dry run of the Llama of tests/integration/test_dry_run.py (2 layers, hidden 128,
  GQA 4/2 heads, 2 x 128 tokens) in fp32, amp-bf16 and bf16-true with sdpa, bf16-true with
  eager attention, and of its GPT-2 with eager attention in bf16-true: the formula's
  forward end equals the dry run's less what it leaves out, counted by hand (`_left_out`),
  within 0.1% of the dry run's total; its backward is within 0.5%. Before these terms the
  formula was 9% to 15% under the Llama's forward end (5% to 11% with eager attention) and
  5% over the GPT-2's.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import nn
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.gemma3.modeling_gemma3 import (
    Gemma3DecoderLayer,
    Gemma3RMSNorm,
    Gemma3RotaryEmbedding,
)
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3DecoderLayer,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from workbench import TrainConfig
from workbench.estimate import estimate_memory
from workbench.estimate.implementations import kept_bytes, qk_kept_bytes
from workbench.train.dry_run import simulate_memory

sys.path.insert(0, str(Path(__file__).parent))
from test_activation_function_saves import CudaAutocastLists  # noqa: E402
from test_dry_run import _gpt2, _llama  # noqa: E402

N, H = 64, 32  # tokens, hidden (a norm's input)
#: precision -> (the module's dtype, the input's dtype, autocast: None, "cpu" or "cuda")
MODES: dict[str, tuple[torch.dtype, torch.dtype, str | None]] = {
    "fp32": (torch.float32, torch.float32, None),
    "bf16-true": (torch.bfloat16, torch.bfloat16, None),
    "cpu-autocast": (torch.float32, torch.float32, "cpu"),  # the residual stream is fp32
    "cuda-autocast": (torch.float32, torch.float32, "cuda"),
}


def _autocast(kind: str | None) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    if kind is not None:
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
    if kind == "cuda":
        stack.enter_context(CudaAutocastLists())
    return stack


def _saved(
    fn: Any, skip: list[torch.Tensor]
) -> dict[int, tuple[int, torch.dtype, tuple[int, ...]]]:
    """Every storage `fn()` saves for backward (`saved_tensors_hooks`), but `skip`'s:
    {storage: (bytes, dtype, shape)}."""
    skipped = {t.untyped_storage().data_ptr() for t in skip}
    seen: dict[int, tuple[int, torch.dtype, tuple[int, ...]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        where = t.untyped_storage().data_ptr()
        if where not in skipped:
            seen[where] = (t.untyped_storage().nbytes(), t.dtype, tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return seen


# --------------------------------------------------------------------------- the norms
NORMS = {
    "kernel": lambda: nn.LayerNorm(H),
    "llama": lambda: LlamaRMSNorm(H),
    "gemma": lambda: GemmaRMSNorm(H),
}


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(NORMS))
def test_each_norm_keeps_the_table_s_bytes(name: str, mode: str, frozen: bool) -> None:
    """Bytes per element of its input one norm keeps (its output is the next matmul's
    input, counted there; its per-token statistics, N elements, are left out)."""
    dtype, input_dtype, kind = MODES[mode]
    torch.manual_seed(0)
    norm = NORMS[name]().to(dtype)
    norm.requires_grad_(not frozen)
    leaf = torch.randn(N, H, dtype=input_dtype, requires_grad=True)
    x = leaf * 1.0  # a layer's input: made by an op, as the residual stream is

    def run() -> None:
        with _autocast(kind):
            norm(x).float().sum()

    saved = _saved(run, [*norm.parameters(), leaf])
    wide = sum(nbytes for nbytes, _, shape in saved.values() if shape == (N, H))
    e = 4 if dtype == torch.float32 and kind is None else 2
    assert wide == N * H * kept_bytes(name, e, kind is not None, frozen), saved


#: the query and key norms: Qwen3's (transformers' Llama RMSNorm, per head) and Gemma 3's
QK_NORMS = {"llama": lambda d: Qwen3RMSNorm(d), "gemma": lambda d: Gemma3RMSNorm(d)}


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(QK_NORMS))
def test_a_query_or_key_norm_keeps_qk_kept_bytes(name: str, mode: str, frozen: bool) -> None:
    """A per-head norm on a projection's output (b, s, heads, head_dim): the output is in
    the compute dtype (16 bits under autocast, where the residual stream is fp32), so the
    norm keeps what its row keeps of a 16-bit input there, not of an fp32 one."""
    dtype, _, kind = MODES[mode]
    b, s, heads, d = 2, 8, 4, 16
    torch.manual_seed(0)
    norm = QK_NORMS[name](d).to(dtype)
    norm.requires_grad_(not frozen)
    compute = torch.bfloat16 if kind is not None else dtype  # autocast's linear output
    leaf = torch.randn(b, s, heads, d, dtype=compute, requires_grad=True)
    x = leaf * 1.0  # a projection's output: made by an op

    def run() -> None:
        with _autocast(kind):
            norm(x).float().sum()

    saved = _saved(run, [*norm.parameters(), leaf])
    wide = sum(nbytes for nbytes, _, shape in saved.values() if shape == (b, s, heads, d))
    e = 4 if compute == torch.float32 else 2
    assert wide == b * s * heads * d * qk_kept_bytes(name, e, frozen), saved
    if kind is not None and name == "llama" and not frozen:
        # not what the same norm keeps of the fp32 residual stream (4 + 4 bytes)
        assert qk_kept_bytes(name, e, frozen) < kept_bytes(name, e, True, frozen)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_rms_norm_on_cuda_keeps_what_kernel_keeps(dtype: torch.dtype) -> None:
    """torch's `nn.RMSNorm` on a CUDA tensor runs `aten::_fused_rms_norm`, whose backward
    reads the input and the per-token rstd: it keeps its input alone (docs/estimator.md),
    not the CPU composite's fp32 copy and normalised input."""
    norm = nn.RMSNorm(H).to("cuda", dtype)
    leaf = torch.randn(N, H, dtype=dtype, device="cuda", requires_grad=True)
    x = leaf * 1.0

    saved = _saved(lambda: norm(x).float().sum(), [*norm.parameters(), leaf])
    wide = sum(nbytes for nbytes, _, shape in saved.values() if shape == (N, H))
    e = 4 if dtype == torch.float32 else 2
    assert wide == N * H * kept_bytes("kernel", e, False), saved


def test_torch_rms_norm_on_a_cpu_keeps_what_gemma_keeps() -> None:
    """On a CPU `nn.RMSNorm` runs the composite: the fp32 copy and the normalised input in
    fp32 (the weight multiplies in fp32), as the `gemma` row."""
    norm = nn.RMSNorm(H).to(torch.bfloat16)
    leaf = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
    x = leaf * 1.0

    saved = _saved(lambda: norm(x).float().sum(), [*norm.parameters(), leaf])
    wide = sum(nbytes for nbytes, _, shape in saved.values() if shape == (N, H))
    assert wide == N * H * kept_bytes("gemma", 2, False), saved


# --------------------------------------------------------------------------- the rotary embedding
@pytest.mark.parametrize("mode", list(MODES))
def test_the_rotary_embedding_keeps_cos_and_sin_only(mode: str) -> None:
    """`q * cos + rotate_half(q) * sin` multiplies by tables that need no gradient: autograd
    keeps the two tables (s x head_dim, shared by every layer), neither the pre-rotation Q
    and K nor their rotated halves."""
    dtype, input_dtype, kind = MODES[mode]
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32)
    rotary = LlamaRotaryEmbedding(config)
    b, a, s, d = 2, 2, 16, 32
    hidden = torch.zeros(b, s, 64, dtype=input_dtype)
    cos, sin = rotary(hidden, torch.arange(s).unsqueeze(0))
    leaf_q = torch.randn(b, a, s, d, dtype=dtype, requires_grad=True)
    leaf_k = torch.randn(b, a, s, d, dtype=dtype, requires_grad=True)
    q, k = leaf_q * 1.0, leaf_k * 1.0

    def run() -> None:
        with _autocast(kind):
            out_q, out_k = apply_rotary_pos_emb(q, k, cos, sin)
            (out_q.float().sum() + out_k.float().sum()).backward()

    saved = _saved(run, [leaf_q, leaf_k])
    tables = {cos.untyped_storage().data_ptr(), sin.untyped_storage().data_ptr()}
    assert set(saved) == tables, saved
    assert all(shape == (1, 1, s, d) for _, _, shape in saved.values())


# --------------------------------------------------------------------------- one layer
class _LlamaLayer(nn.Module):
    """One transformers Llama decoder layer (sdpa, GQA) with its rotary embedding."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.LlamaConfig(
            hidden_size=128,
            intermediate_size=352,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            attention_dropout=0.0,
        )
        config._attn_implementation = "sdpa"
        self.layer = LlamaDecoderLayer(config, 0)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        out = self.layer(
            x,
            attention_mask=None,
            position_ids=positions,
            position_embeddings=self.rotary(x, positions),
        )
        return out[0] if isinstance(out, tuple) else out


LAYER_B, LAYER_S = 2, 16
_LLAMA_SHAPE = dict(
    layers=1, hidden=128, heads=4, kv_heads=2, ffn_hidden=352, mlp="swiglu", norm="rmsnorm",
    bias="none", positions="rotary", tied_embeddings=False, vocab=64, seq_len=LAYER_S,
    micro_batch=LAYER_B, dropout=False, attention="sdpa",
)  # fmt: skip
#: the layer tests' precision -> (the module's dtype, autocast kind, the estimate's precision)
_LAYER_MODES = {
    "fp32": (torch.float32, None, "fp32"),
    "bf16-true": (torch.bfloat16, None, "bf16-true"),
    "cpu-autocast": (torch.float32, "cpu", "amp-bf16"),
    "cuda-autocast": (torch.float32, "cuda", "amp-bf16"),
}


def _layer_saved(module: nn.Module, mode: str) -> tuple[int, int]:
    """(bytes one layer saves but its weights' autocast copies, those copies' bytes)."""
    dtype, kind, _ = _LAYER_MODES[mode]
    torch.manual_seed(0)
    module = module.to(dtype)
    leaf = torch.randn(LAYER_B, LAYER_S, 128, dtype=dtype, requires_grad=True)
    x = leaf * 1.0
    weights = [
        m.weight for m in module.modules() if isinstance(m, (nn.Linear, transformers.Conv1D))
    ]

    def run() -> None:
        with _autocast(kind):
            module(x).float().sum()

    saved = _saved(run, [*module.parameters(), *module.buffers(), leaf])
    shapes = {tuple(w.shape) for w in weights} | {tuple(w.shape)[::-1] for w in weights}
    casts = sum(n for n, dt, shape in saved.values() if kind and shape in shapes and dt != dtype)
    return sum(n for n, _, _ in saved.values()) - casts, casts


@pytest.mark.parametrize("mode", list(_LAYER_MODES))
def test_a_llama_layer_keeps_the_formula_s_layer(mode: str) -> None:
    """Its norms (an fp32 copy of the input and the normalised input each; under autocast
    the fp32 residual stream and a 16-bit cast for each of Q, K, V, gate and up), sdpa's
    Q, K and V (K and V at the grouped width), output and log-sum-exp, SwiGLU's tensors:
    the formula's `per_layer_bytes`, plus what it leaves out: the two norms' fp32 rsqrt
    (4 bytes a token each) and the rotary embedding's cos and sin."""
    kept, casts = _layer_saved(_LlamaLayer(), mode)
    precision = _LAYER_MODES[mode][2]
    e = estimate_memory(**_LLAMA_SHAPE, precision=precision)
    tokens, d = LAYER_B * LAYER_S, 128 // 4
    table = 4 if precision != "bf16-true" else 2  # cos and sin: the residual stream's dtype
    left_out = 2 * 4 * tokens + 2 * LAYER_S * d * table
    assert e.activations.norm_impl == "llama"
    assert kept == e.activations.per_layer_bytes + left_out
    if precision == "amp-bf16":  # the casts of Q, K, V, O, gate, up, down's weights
        assert casts == 2 * sum(p.numel() for p in _LlamaLayer().layer.parameters() if p.dim() == 2)


class _Qwen3Layer(_LlamaLayer):
    """One transformers Qwen3 decoder layer: the Llama layer's shape with RMSNorms on Q and K
    per head (head size 32)."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        config = transformers.Qwen3Config(
            hidden_size=128,
            intermediate_size=352,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=64,
            attention_dropout=0.0,
        )
        config._attn_implementation = "sdpa"
        self.layer = Qwen3DecoderLayer(config, 0)
        self.rotary = Qwen3RotaryEmbedding(config)


@pytest.mark.parametrize("mode", list(_LAYER_MODES))
def test_a_qwen3_layer_keeps_the_formula_s_layer_with_its_query_and_key_norms(mode: str) -> None:
    """The Llama layer's tensors plus its query and key norms' (`qk_norm`): an fp32 copy of
    the Q and K projections' outputs and their normalised copies in the compute dtype,
    (q + g) x (4 + e) bytes a token; left out beside the Llama layer's: the per-head rsqrt
    of each (4 bytes a head a token). Without `qk_norm` the formula is that much under."""
    kept, _ = _layer_saved(_Qwen3Layer(), mode)
    precision = _LAYER_MODES[mode][2]
    e = estimate_memory(**_LLAMA_SHAPE, precision=precision, qk_norm=True)
    tokens, d, heads, kv_heads = LAYER_B * LAYER_S, 32, 4, 2
    table = 4 if precision != "bf16-true" else 2
    left_out = 2 * 4 * tokens + 2 * LAYER_S * d * table + (heads + kv_heads) * 4 * tokens
    assert e.qk_norm
    assert kept == e.activations.per_layer_bytes + left_out
    width = (heads + kv_heads) * d
    compute = 4 if precision == "fp32" else 2
    without = estimate_memory(**_LLAMA_SHAPE, precision=precision)
    assert kept - left_out - without.activations.per_layer_bytes == tokens * width * (4 + compute)


class _Gemma3Layer(nn.Module):
    """One transformers Gemma 3 decoder layer (sdpa, GQA 4/2, head size 32, GeGLU): four
    Gemma RMSNorms (before and after the attention and the MLP) and per-head Q/K norms."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.Gemma3TextConfig(
            hidden_size=128,
            intermediate_size=352,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=64,
            attention_dropout=0.0,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=32,
        )
        config._attn_implementation = "sdpa"
        self.kind = config.layer_types[0]
        self.layer = Gemma3DecoderLayer(config, 0)
        self.rotary = Gemma3RotaryEmbedding(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        tables = self.rotary(x, positions, layer_type=self.kind)
        out = self.layer(x, position_embeddings=tables, attention_mask=None, position_ids=positions)
        return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("mode", list(_LAYER_MODES))
def test_a_gemma3_layer_keeps_the_formula_s_layer_with_its_four_norms(mode: str) -> None:
    """Gemma 3's layer: the formula's Gemma-norm layer with query and key norms
    (`qk_norm`) and the norms of the attention's and the MLP's outputs (`post_norms`: an
    fp32 copy and the normalised output in fp32 of each, 8 bytes an element of 2h a
    token). Left out, counted here: the rotary tables, each norm's rstd (4 bytes a token;
    a head a token for Q and K) and each norm's fp32 (1 + weight), weight-sized."""
    kept, _ = _layer_saved(_Gemma3Layer(), mode)
    precision = _LAYER_MODES[mode][2]
    shape = dict(_LLAMA_SHAPE, activation_function="gelu_pytorch_tanh", norm_impl="gemma")
    e = estimate_memory(**shape, precision=precision, qk_norm=True, post_norms=True)
    tokens, d, heads, kv_heads, h = LAYER_B * LAYER_S, 32, 4, 2, 128
    table = 4 if precision != "bf16-true" else 2
    stats = 4 * 4 * tokens + (heads + kv_heads) * 4 * tokens
    one_plus_weight = 4 * (4 * h + 2 * d)
    left_out = 2 * LAYER_S * d * table + stats + one_plus_weight
    assert (e.post_norms, e.qk_norm, e.norm_impl) == (True, True, "gemma")
    assert kept == e.activations.per_layer_bytes + left_out
    without = estimate_memory(**shape, precision=precision, qk_norm=True)
    assert kept - left_out - without.activations.per_layer_bytes == 2 * 8 * tokens * h


class _Gpt2Block(nn.Module):
    """One transformers GPT-2 block (eager attention, no dropout) and its causal mask."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.GPT2Config(
            n_embd=128, n_head=4, n_positions=64, resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0
        )
        config._attn_implementation = "eager"
        self.block = transformers.models.gpt2.modeling_gpt2.GPT2Block(config, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        blocked = torch.ones(s, s, dtype=torch.bool).triu(1)
        mask = torch.zeros(1, 1, s, s, dtype=x.dtype).masked_fill(blocked, torch.finfo(x.dtype).min)
        out = self.block(x, attention_mask=mask)
        return out[0] if isinstance(out, tuple) else out


#: CPU autocast keeps gelu_new in bf16 where the formula counts CUDA's fp32 `pow`
#: (`activation_functions`; tests/integration/test_dry_run_mlp_activations.py holds that
#: difference): the block's autocast case is CUDA's lists alone
_GPT2_MODES = [m for m in _LAYER_MODES if m != "cpu-autocast"]


@pytest.mark.parametrize("mode", _GPT2_MODES)
def test_a_gpt2_block_keeps_the_formula_s_layer_with_its_own_softmax(mode: str) -> None:
    """GPT-2's eager softmax runs in the scores' dtype: in pure bf16 it keeps one bf16
    probabilities tensor (as Megatron's), where Llama's keeps an fp32 one beside its cast;
    under CUDA autocast it runs in fp32 (and gelu_new's `pow`). Left out: the norms' mean
    and rstd."""
    kept, _ = _layer_saved(_Gpt2Block(), mode)
    precision = _LAYER_MODES[mode][2]
    shape = dict(
        layers=1, hidden=128, heads=4, vocab=64, seq_len=LAYER_S, micro_batch=LAYER_B,
        dropout=False, attention="eager", activation_function="gelu_new", eager_softmax="input",
    )  # fmt: skip
    e = estimate_memory(**shape, precision=precision)
    tokens = LAYER_B * LAYER_S
    stats = 2 * 2 * tokens * (2 if precision == "bf16-true" else 4)  # two norms' mean, rstd
    assert kept == e.activations.per_layer_bytes + stats


# --------------------------------------------------------------------------- the dry run
#: (family, precision, attention) of the dry runs
RUNS = [
    ("llama", "fp32", "sdpa"),
    ("llama", "amp-bf16", "sdpa"),
    ("llama", "bf16-true", "sdpa"),
    ("llama", "bf16-true", "eager"),
    ("gpt2", "bf16-true", "eager"),
    ("qwen3", "amp-bf16", "sdpa"),
    ("qwen3", "bf16-true", "sdpa"),
]
B, S = 2, 128  # test_dry_run.py's micro-batch


def _qwen3(attention: str) -> nn.Module:
    """test_dry_run.py's Llama as Qwen3 builds it: query and key norms per head."""
    config = transformers.Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
    )
    config._attn_implementation = attention
    return transformers.Qwen3ForCausalLM(config)


BUILDS = {"llama": _llama, "gpt2": _gpt2, "qwen3": _qwen3}


def _left_out(family: str, precision: str, layers: int = 2, hidden: int = 128) -> int:
    """What the formula leaves out of the forward end, counted by hand: the Llama's rotary
    cos and sin (s x head_dim each, the residual stream's dtype), its norms' fp32 rsqrt
    (4 bytes a token each, 2 a layer and the final one), and under autocast the final
    norm's fp32 output, which the model's forward holds while its loss runs; GPT-2's
    norms' mean and rstd (in the activation dtype on a CPU); Qwen3's query and key norms'
    per-head rsqrt (4 bytes a head a token, 4 + 2 heads a layer)."""
    tokens, norms = B * S, 2 * layers + 1
    e = 2 if precision == "bf16-true" else 4
    if family == "gpt2":
        return norms * 2 * tokens * e
    table = 2 * S * (hidden // 4) * e
    final = 4 * tokens * hidden if precision == "amp-bf16" else 0
    heads = layers * (4 + 2) * 4 * tokens if family == "qwen3" else 0
    return table + norms * 4 * tokens + final + heads


@pytest.mark.parametrize("run", RUNS, ids=["-".join(r) for r in RUNS])
def test_the_formula_meets_the_dry_run(run: tuple[str, str, str]) -> None:
    family, precision, attention = run
    build = BUILDS[family]
    config = TrainConfig(micro_batch=B, precision=precision)
    dry_run = simulate_memory(lambda: build(attention), config, seq_len=S, progress=False)
    formula = dry_run.formula
    assert formula.norm_impl == ("kernel" if family == "gpt2" else "llama")
    assert formula.eager_softmax == ("input" if family == "gpt2" else "fp32")
    assert formula.qk_norm is (family == "qwen3")
    dry = {p: sum(v.values()) for p, v in dry_run.points.items()}
    counted = {p: sum(v.values()) for p, v in formula.peak.points.items()}
    forward_end = dry["forward end"] - counted["forward end"] - _left_out(family, precision)
    assert abs(forward_end) <= 0.001 * dry["forward end"], (forward_end, dry, counted)
    backward = dry["backward"] - counted["backward"]
    assert abs(backward) <= 0.005 * dry["backward"], (backward, dry, counted)
