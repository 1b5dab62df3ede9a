"""The norm and the unfused softmax a family's own code runs, and what each keeps for the
backward pass beyond the formula's one-op picture.

Korthikanti et al. count a norm as one op that keeps its input (sbh elements; its output
is the next matmul's input, counted there). That is torch's one-kernel `layer_norm`
(`nn.LayerNorm`: GPT-2, GPT-NeoX, OPT, BERT, ...) and the fused norms of Megatron and
Apex. transformers writes its RMSNorms out in Python, upcast to fp32 (`norm_impl`):

* `kernel`: one kernel; it keeps its input (and per-token statistics, sb-wide, left out).
* `llama`: `LlamaRMSNorm` and the families that copy it (Mistral, Qwen2, Qwen3, Mixtral,
  Phi-3, Granite, OLMoE, ...): `x.to(fp32)`, `x * rsqrt(mean(x²) + eps)`, cast back to the
  input's dtype, times the weight. `pow` and the multiply keep the fp32 copy of the input
  (the input itself when it is fp32), the weight's multiply keeps the normalised input in
  the input's dtype: 4 + e bytes an element where the formula counted e (pure bf16: 6, not
  2; fp32: 8, not 4).
* `gemma`: Gemma's RMSNorm (and OLMo 2's), whose weight multiplies in fp32 before the cast
  back: the fp32 copy and the normalised input in fp32, 8 bytes an element whatever the
  dtype.

Every row's output, the next matmul's input, is kept as the formula counts it: one tensor
of the compute dtype e, read by every projection that takes it. Under autocast (amp-* on
the plain loop or DeepSpeed) two things differ, both measured on CPU autocast and read from
CUDA autocast's kernels (they agree here; CUDA autocast runs `layer_norm`, `rms_norm`, `pow`
and `rsqrt` in fp32, which these norms' fp32 inputs already are):

* the residual stream is never cast (embeddings and residual adds run in fp32), so each
  norm's input is fp32: 4 bytes where the formula counted 2 (`residual_bytes`), for every
  row, and so is each layer's input kept under full recomputation;
* the norm's output is fp32 (every row computes in fp32 from an fp32 input) and each
  linear layer that reads it keeps its own 16-bit cast (autocast caches casts of leaf
  weights only): 3 casts for separate Q, K and V projections (1 for a fused QKV matrix),
  2 for a gated MLP's gate and up projections, 1 for a two-matrix MLP, a router and the
  output projection (`input_bytes`).

So a Llama layer under amp-bf16 keeps 4 + 4 + 3 x 2 bytes an element for its attention's
norm and 4 + 4 + 2 x 2 for its MLP's, where the formula counted 2 + 2 each.

With the norms' weights frozen (LoRA and QLoRA train adapters only) the weight's multiply
needs no gradient of the weight and keeps no normalised input: the upcast rows keep their
fp32 copy alone, 4 bytes an element (`kept_bytes(frozen=True)`).

The unfused attention's softmax (`eager_softmax`, transformers' "eager" attention): Llama
and most families call `softmax(scores, dtype=torch.float32)` and keep that fp32 output
beside its 16-bit cast in 16-bit training (`fp32`); GPT-2 and BERT call `softmax(scores)`
in the scores' dtype (`input`): 16 bits in pure 16-bit training (the one 16-bit
probabilities tensor Megatron keeps), fp32 under autocast (CUDA autocast runs softmax in
fp32; on a CPU the fp32 causal mask promotes the scores), and then as `fp32` keeps them.

The rotary embedding keeps nothing layer-wide: `q * cos + rotate_half(q) * sin` multiplies
by tables that need no gradient, so autograd keeps cos and sin (s x head_dim each, one pair
for every layer) and neither the pre-rotation Q and K nor their rotated halves; under
autocast the rotated Q and K are fp32 (cos is) but only the attention's 16-bit casts of
them are kept. tests/integration/test_dry_run_norm_rope.py holds every count to torch's
saved-tensor hooks on real tensors and the dry run of transformers' Llama and GPT-2.

The query and key norms (`qk_norm`: Qwen3's and Gemma 3's per head, OLMo 2's and OLMoE's over
the whole width) read the Q and K projections' outputs, which nothing else keeps, and are
the family's RMSNorm: each keeps what that row keeps of an input in the compute dtype
(`qk_kept_bytes`: a projection's output is 16-bit under autocast too, not the fp32
residual stream), 4 + e bytes an element of the q + g wide outputs for "llama", 8 for
"gemma", 4 with the weights frozen; the rotary embedding then keeps nothing of them and the
attention keeps its Q and K as without the norms (measured:
tests/integration/test_dry_run_norm_rope.py, transformers' Qwen3 layer). Qwen3-8B at 4,096
tokens keeps 126 MB more a layer in bf16 (+17% of its layer). Gemma 2 and 3 also normalise
the attention's and the MLP's outputs before each residual add (`post_norms`): two more
norms a layer on h-wide projection outputs, by the same rule (8 bytes an element for
"gemma"); their outputs go into the residual add, which keeps nothing.

Not counted: the norms' per-token statistics (4 or 8 bytes a token per norm, under 1/h of
the norm's tensors; a query or key norm's per head), GPT-J's
fp32 copies of Q and K in its unfused attention, and a mixture of experts' routed copies
under autocast (fp32 rows of the norm's output, each expert casting its own).

Pure Python: imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class NormImpl(NamedTuple):
    """A row of the table: what the norm runs, whether it keeps an fp32 copy of its input
    (`upcast`), and whether it keeps its normalised input in fp32 (`fp32_normalised`;
    else in its input's dtype)."""

    name: str
    runs: str
    upcast: bool
    fp32_normalised: bool


NORM_IMPLS: dict[str, NormImpl] = {
    "kernel": NormImpl(
        "kernel",
        "torch's one-kernel layer_norm (nn.LayerNorm; Megatron's and Apex's fused norms): "
        "keeps its input",
        False,
        False,
    ),
    "llama": NormImpl(
        "llama",
        "transformers' LlamaRMSNorm and its copies: an fp32 copy of the input and the "
        "normalised input cast back to the input's dtype",
        True,
        False,
    ),
    "gemma": NormImpl(
        "gemma",
        "Gemma's and OLMo 2's RMSNorm (the weight's multiply in fp32): an fp32 copy of the "
        "input and the normalised input in fp32",
        True,
        True,
    ),
}
NORM_NAMES = tuple(NORM_IMPLS)

#: The norm each kind of norm (`Architecture.norm`) runs unless one is named: torch's
#: LayerNorm kernel; for an RMSNorm transformers' Llama one, what every transformers family
#: with RMSNorm but Gemma's and OLMo 2's runs, and what a dry run of the shape builds.
DEFAULT_NORM = {"layernorm": "kernel", "rmsnorm": "llama"}
#: The families whose RMSNorm multiplies its weight in fp32.
_GEMMA_NORMS = frozenset(("gemma", "gemma2", "gemma3", "gemma3_text", "olmo2"))

#: The families whose attention normalises its query and key projections' outputs
#: (`Architecture.qk_norm`): per head (Qwen3, Gemma 3) or over the whole width (OLMo 2,
#: OLMoE).
_QK_NORMS = frozenset(("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2", "olmoe"))
#: The families that also normalise the attention's and the MLP's outputs before each
#: residual add (`Architecture.post_norms`: four norms a layer).
_POST_NORMS = frozenset(("gemma2", "gemma3", "gemma3_text"))

#: The unfused softmax's dtypes (`Architecture.eager_softmax`).
SOFTMAX_NAMES = ("fp32", "input")
#: The families whose unfused attention runs its softmax in the scores' dtype.
_INPUT_SOFTMAX = frozenset(("gpt2", "bert", "roberta", "xlm-roberta"))


def default_norm_impl(norm: str) -> str:
    """The norm implementation a norm of kind `norm` ("layernorm", "rmsnorm") has unless
    one is named."""
    return DEFAULT_NORM.get(norm, "kernel")


def family_norm_impl(model_type: Any, norm: str) -> str:
    """The norm implementation the transformers family `model_type` runs for a norm of
    kind `norm`."""
    if norm == "rmsnorm" and model_type in _GEMMA_NORMS:
        return "gemma"
    return default_norm_impl(norm)


def family_eager_softmax(model_type: Any, config: Mapping[str, Any] | None = None) -> str:
    """The dtype the unfused attention of the transformers family `model_type` runs its
    softmax in: "input" for GPT-2 (unless its config sets `reorder_and_upcast_attn`, whose
    attention upcasts), BERT and RoBERTa; "fp32" for every other family."""
    if model_type == "gpt2" and config is not None and config.get("reorder_and_upcast_attn"):
        return "fp32"
    return "input" if model_type in _INPUT_SOFTMAX else "fp32"


def family_qk_norm(model_type: Any) -> bool:
    """Whether the transformers family `model_type` normalises its query and key
    projections' outputs."""
    return model_type in _QK_NORMS


def family_post_norms(model_type: Any) -> bool:
    """Whether the transformers family `model_type` normalises its attention's and MLP's
    outputs before the residual adds (Gemma 2 and 3)."""
    return model_type in _POST_NORMS


def qk_kept_bytes(name: str, e: int, frozen: bool = False) -> int:
    """Bytes per element of a projection's output one norm `name` reading it keeps (a query
    or key norm; Gemma's norms of the attention's and the MLP's outputs): `kept_bytes` of
    an input in the compute dtype `e` (a projection's output is 16-bit under autocast, not
    the fp32 residual stream)."""
    return kept_bytes(name, e, False, frozen)


def residual_bytes(e: int, autocast: bool) -> int:
    """Bytes an element of the residual stream (a norm's input, a layer's input) takes:
    the activation bytes `e`, or fp32 under autocast, which casts no residual add."""
    return 4 if autocast else e


def kept_bytes(name: str, e: int, autocast: bool, frozen: bool = False) -> int:
    """Bytes per element of its input (per s·b·h) one norm `name` keeps, its output
    aside (`input_bytes` counts that). With its weight `frozen` (LoRA trains none of the
    norms) the weight's multiply keeps no normalised input: an upcast norm keeps its fp32
    copy alone."""
    row = NORM_IMPLS[name]
    r = residual_bytes(e, autocast)
    if not row.upcast:
        return r
    if frozen:
        return 4
    return 4 + (4 if row.fp32_normalised else r)


def input_bytes(e: int, autocast: bool, readers: int) -> int:
    """Bytes per element of a norm's output kept by the `readers` linear layers that read
    it: one tensor of the activation bytes `e`, or under autocast each reader's 16-bit
    cast of the fp32 output."""
    return 2 * readers if autocast else e


def eager_keeps_fp32(softmax: str, e: int, autocast: bool) -> bool:
    """Whether an unfused attention whose softmax runs in `softmax` ("fp32", "input")
    keeps an fp32 softmax output beside its 16-bit cast (16-bit activations only)."""
    return e == 2 and (softmax == "fp32" or autocast)


__all__ = [
    "DEFAULT_NORM",
    "NORM_IMPLS",
    "NORM_NAMES",
    "NormImpl",
    "SOFTMAX_NAMES",
    "default_norm_impl",
    "eager_keeps_fp32",
    "family_eager_softmax",
    "family_norm_impl",
    "family_post_norms",
    "family_qk_norm",
    "input_bytes",
    "kept_bytes",
    "qk_kept_bytes",
    "residual_bytes",
]
