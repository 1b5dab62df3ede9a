"""Activation memory of a decoder-only transformer (Korthikanti et al. 2022), extended.

Reference: V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2022, Section 4 and Table 2. Notation: s sequence length, b micro-batch, h hidden
size, a attention heads, f MLP inner size (4h in the paper), L layers, v vocabulary, t
tensor-parallel size, p pipeline stages. docs/estimator.md has the derivation.

Per layer, with 16-bit activations and 1-byte dropout masks, the paper stores
`sbh(34 + 5as/h)` bytes. We keep that sum split into *element* terms (16-bit tensors,
2 bytes each) and *mask* terms (1 byte each), so that 32-bit activations double only the
element terms:

    attention  elements: 5sbh (norm output = QKV input, Q, K, V, projection input)
                         + 2as^2b (softmax output, dropout output)
               masks:    as^2b (attention dropout) + sbh (output dropout)
    MLP        elements: GELU: sbh + 2sbf (first linear input, GELU input, GELU output)
                         SwiGLU: sbh + 4sbf (gate/up input, gate output = SiLU input,
                         SiLU output, up output, product = down-projection input)
                         (with another activation function the inner tensors are that
                         activation's, `activation_functions`: GPT-2's gelu_new 5sbf,
                         ReLU sbf; under CUDA autocast some are fp32)
               masks:    sbh (output dropout)
    norms      elements: 2sbh (the inputs of the two norms; sbh with a parallel residual,
                         where attention and MLP normalise the same layer input), with
                         torch's one-kernel norm; transformers' RMSNorms keep more, and
                         autocast keeps fp32 inputs (`implementations`, below)

    no recomputation:  elements 8sbh + 2sbf + 2as^2b, masks 2sbh + as^2b
                       (f = 4h: 34sbh + 5as^2b bytes, the paper's figure)
    selective:         the same without the as^2b terms (f = 4h: 34sbh)
    selective-op:      torchtitan's op-level policy (`selective_ac_option="op"`): the
                       layer input, the outputs of the 1st, 3rd, 5th, ... matmul (Q, V,
                       the gate or first MLP matrix, and with a gated MLP the down
                       projection) and the sdpa kernel's output and log-sum-exp; the rest
                       is recomputed. Llama (g = h/4, gated): 4sbh + sbg + sbf elements.
    full:              elements sbh (the layer input) -> 2sbh bytes

Grouped-query attention (kv heads < heads) changes no term of unfused attention, which
repeats K and V to every head before the score matmul (Megatron's core attention and Hugging Face's
eager `repeat_kv` both do), and the repeated K and V are what the matmuls save. GQA saves
parameters (and KV cache at inference), not training activations, unless a fused kernel
keeps the un-repeated K and V.

Tensor parallelism over t GPUs (Section 4.2) splits the tensors inside the attention and
MLP blocks: Q, K, V, the projection input, the MLP inner tensors and every as^2b term are
divided by t; the norm inputs, the QKV and MLP inputs and the residual dropout masks are
replicated, unless sequence parallelism (Section 4.2.2) splits them over the sequence
too. At f = 4h this is Table 2: sbh(10 + 24/t + 5as/(ht)) with tensor parallelism,
sbh(34/t + 5as/(ht)) with tensor + sequence parallelism, minus the as^2b terms with
selective recomputation; full recomputation keeps 2sbh (2sbh/t with sequence
parallelism, whose layer input is split over the sequence).

Pipeline parallelism over p stages with the 1F1B schedule: the first stage holds its L/p
layers for p micro-batches in flight (Narayanan et al. 2021), L layers' worth, plus p
embedding dropout masks; the output layer lives on the last stage, which holds less.
The first stage is reported: it is the peak.

Without dropout (`dropout=False`) the masks vanish and the softmax output is the only
attention-score tensor kept.

What the totals include besides the stored layers (documented choices):

* Recomputation working set (`recompute_bytes`): while the backward pass recomputes,
  one layer's recomputed tensors exist at a time. With *selective* recomputation that is
  one layer's attention-core tensors (the `5as^2b` terms). With *full* checkpointing that
  is one complete layer at the no-recomputation size, minus the layer input which is
  already stored as that layer's checkpoint. So with one layer all three modes agree,
  and full <= selective <= none holds for every shape.
* Embedding (`embedding_bytes`): the input dropout mask, sbh bytes (the dropout output
  is the first layer's input and is counted there).
* Output (`output_bytes`): the final norm's input (sbh elements), the output
  projection's input (sbh elements) and the logits kept in fp32 for the cross-entropy
  loss, 4sbv bytes whatever the activation precision (Section 4.3: 4sbh(1 + v/h) in total
  at 16 bits); with tensor parallelism the logits are split over the vocabulary
  (4sb·ceil(v/t)).

Attention kernel (`attention`): the paper's attention is unfused, with Megatron's fused
scale-mask-softmax keeping its output in the compute dtype ("megatron"). transformers'
unfused attention ("eager") runs the softmax in fp32 and keeps that fp32 output too: under
16-bit compute +4as²b bytes per layer without dropout (its 16-bit cast is the matmul's
input), +2as²b with dropout (the cast is dropout's input, not kept); in fp32 the two are
one tensor. torch's own unfused kernel ("math": what `scaled_dot_product_attention` runs
on a CPU when the attention has dropout; aten's sdp_utils_cpp.cpp, `use_flash_attention_cpp`,
refuses dropout) keeps, per layer, scaled copies of Q and K and a contiguous copy of V
(3sbh, with K and V repeated to every head: in place of Q, K and V) and as^2b for the
softmax output, 3as^2b with dropout (its mask is a tensor of the scores' dtype, and the
dropped probabilities are the second matmul's input), all in fp32 on a CPU (its math
kernel computes 16-bit inputs in fp32): 4·as^2b or 4·3as^2b score bytes whatever the
activation dtype, and under 16-bit compute 2·3sbh more for the fp32 Q, K, V. Selective
recomputation keeps the kernel's 16-bit inputs and recomputes the rest. The fused kernels torch and transformers use by default ("sdpa": flash /
memory-efficient `scaled_dot_product_attention`) store no `as^2b` tensor: the per-layer
score terms become the kernel's fp32 log-sum-exp, 4·asb bytes (4·asb/t with tensor
parallelism), its dropout keeps a seed instead of an `as^2b` mask, and it keeps K and V
at their grouped width g (transformers passes `enable_gqa`): 2sbh + 2sbg for Q, K, V and
the projection input instead of 4sbh. Selective recomputation then has almost nothing
left to recompute (the log-sum-exp). tests/integration/test_peak_terms.py measures the
three on a transformers Llama.

MLP activation function (`activation_function`, transformers' names): the MLP's inner
tensors are what its autograd keeps (`activation_functions.inner_bytes`): torch's one-kernel
GELU and SiLU keep their input (the paper's 2sbf, SwiGLU's 4sbf), a ReLU its output only
(sbf: the first matrix's output is freed), transformers' Python formulas their
intermediates (GPT-2's gelu_new: 5sbf). Under CUDA autocast (`autocast`: amp-* outside
FSDP) the ops autocast runs in fp32 (`pow`, `softplus`, ...) make fp32 tensors: gelu_new
keeps 2 x 16-bit + 3 x fp32 (16 bytes per element, not 10). Full recomputation keeps the
layer input only whatever the activation; its recomputation working set (one layer)
includes the activation's tensors.

Norms (`norm_impl`, `implementations`): the paper's norm keeps its input (torch's
one-kernel `layer_norm`, "kernel"). transformers' RMSNorms upcast: Llama's ("llama") keeps an
fp32 copy of its input and the normalised input in the input's dtype (4 + e bytes an
element per norm, where the paper counts e), Gemma's ("gemma") both in fp32 (8); with their
weights frozen (LoRA) the fp32 copy alone (4). Each norm's output is kept once by the
projections that read it (the QKV and MLP inputs above, e bytes). Under autocast (`autocast`)
the residual stream is fp32: every norm's input, and a layer's input kept by full or
op-level recomputation, takes 4 bytes, and each projection reading a norm's fp32 output
keeps its own 16-bit cast (3 for separate Q, K and V, 1 for a fused QKV matrix; 2 for a
gated MLP's gate and up, 1 for a two-matrix MLP and the output projection). The final norm
and the output projection's input follow the same rows. transformers' unfused attention
keeps an fp32 softmax output only where its family's code upcasts (`eager_softmax` "fp32",
Llama's) or autocast runs the softmax in fp32 (GPT-2's "input"). The rotary embedding keeps
its cos and sin tables alone (shared by every layer): no term. Query and key norms
(`qk_norm`: Qwen3, Gemma 3, OLMo 2, OLMoE) keep what their row keeps of the Q and K
projections' outputs (`qk_kept_bytes`, q + g elements a token, in the compute dtype);
Gemma 2's and 3's norms of the attention's and the MLP's outputs (`post_norms`) by the same
rule, 2h elements a token.

Not included here (the peak of a step, `workbench.estimate.peak`, adds them): the
transient peak of the backward pass (gradients of activations, about one layer's worth),
the logits' fp32 copies in the loss; nor fused MLP kernels that store less (a fused
SwiGLU keeps 3sbf instead of 4sbf), per-token norm statistics and the rotary tables:
tests/integration/test_estimate_families.py and test_dry_run_norm_rope.py measure them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from workbench.estimate.activation_functions import NAMES as ACTIVATION_NAMES
from workbench.estimate.activation_functions import default_activation, inner_bytes
from workbench.estimate.frozen import field_names, of_every_field
from workbench.estimate.implementations import (
    NORM_NAMES,
    SOFTMAX_NAMES,
    eager_keeps_fp32,
    input_bytes,
    kept_bytes,
    qk_kept_bytes,
    residual_bytes,
)
from workbench.estimate.limits import as_bool, as_int
from workbench.inputs import shown


class Attention(str, Enum):
    """The attention kernel: `sdpa` (`torch.nn.functional.scaled_dot_product_attention`
    with its flash or memory-efficient kernel, what torch and transformers pick by default:
    it stores the output and a per-row log-sum-exp, 4·asb bytes in fp32, no `as^2b` tensor,
    and K and V at their grouped width; its dropout keeps a random seed, not a mask);
    `megatron` (unfused, the scores a tensor, with Megatron's fused scale-mask-softmax that
    keeps its output in the compute dtype: Korthikanti et al.'s `as^2b` terms); `eager`
    (transformers' unfused attention: as megatron, but the softmax runs in fp32 and keeps
    its fp32 output besides the 16-bit probabilities); `math` (the math kernel of
    `scaled_dot_product_attention`, which torch picks on a CPU for attention with dropout,
    whose CPU flash kernel takes none: it keeps scaled copies of Q and K and a copy of V,
    the softmax output, and with dropout its mask in the scores' dtype and the dropped
    probabilities, all in fp32 on a CPU, which computes 16-bit inputs in fp32)."""

    SDPA = "sdpa"
    MEGATRON = "megatron"
    EAGER = "eager"
    MATH = "math"

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def choices(cls) -> list[str]:
        return [m.value for m in cls]


def attention_terms(kernel: str | None, own: str | None = None) -> str | None:
    """The estimator's attention terms (an `Attention` value) for a kernel named in the
    Session's words (`TrainConfig.attention`: "model", "eager", "sdpa") or in transformers'
    (`attn_implementation`: "eager", "sdpa", "flash_attention_2", ...): the one translation
    between the two vocabularies. `own` is the model's own kernel in the estimator's words
    ("megatron": the built-in GPT's unfused kernel, its softmax output in the compute dtype;
    "eager": a transformers model's, the softmax in fp32; None: not known). "model" (or
    None) gives `own`; an unfused "eager" is the model's own unfused kernel (megatron for
    the built-in GPT, else eager); every fused kernel counts as sdpa."""
    if kernel is None or kernel == "model":
        return own
    if kernel == "eager":
        return Attention.MEGATRON.value if own == Attention.MEGATRON.value else kernel
    if kernel in (Attention.MEGATRON.value, Attention.MATH.value):
        return kernel
    return Attention.SDPA.value


class Checkpointing(str, Enum):
    """Activation recomputation: none; selective (Megatron's: the attention core);
    selective-op (torchtitan's op-level policy: every layer keeps its input, every other
    matmul's output and the attention kernel's output, and recomputes the rest); full
    (every layer keeps its input only)."""

    NONE = "none"
    SELECTIVE = "selective"
    SELECTIVE_OP = "selective-op"
    FULL = "full"

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def choices(cls) -> list[str]:
        return [m.value for m in cls]


@dataclass(frozen=True)
class ActivationBreakdown:
    """Activation bytes of one forward pass kept for the backward pass, on one GPU.

    `per_layer_*` are what one layer stores for one micro-batch under the checkpointing
    mode and the tensor/sequence parallel split (Table 2 of Korthikanti et al. at 16
    bits). `layers_bytes = layers * per_layer_bytes`: a GPU of the first pipeline stage
    holds `layers / pipeline_parallel` layers for each of the `in_flight_micro_batches`
    (= `pipeline_parallel`, 1F1B) micro-batches in flight. `total_bytes` = layers +
    recompute working set + embedding + output terms (the output terms live on the last
    stage and are 0 with pipeline parallelism: the first stage is the peak).
    """

    checkpointing: str
    activation_bytes_per_element: int
    dropout: bool
    per_layer_element_bytes: int
    per_layer_mask_bytes: int
    per_layer_bytes: int
    layers_bytes: int
    recompute_bytes: int
    embedding_bytes: int
    output_bytes: int
    logits_bytes: int
    total_bytes: int
    mlp: str = "gelu"
    ffn_hidden: int | None = None
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    pipeline_parallel: int = 1
    in_flight_micro_batches: int = 1
    parallel_residual: bool = False
    attention: str = "eager"
    #: the MLP's activation function (`activation_functions`) and whether CUDA autocast
    #: ran it (its fp32 ops' tensors are fp32)
    activation_function: str = "gelu"
    autocast: bool = False
    #: the bytes of one layer's MLP inner tensors (the activation function's), within
    #: `per_layer_element_bytes` without recomputation
    mlp_inner_bytes: int = 0
    #: the norms' implementation (`implementations`) and the bytes of one layer's norm
    #: tensors (their inputs, what they keep of them, their outputs as the projections
    #: keep them), within `per_layer_element_bytes` without full or op-level recomputation
    norm_impl: str = "kernel"
    norm_bytes: int = 0
    #: the dtype an unfused "eager" attention's softmax runs in ("fp32", "input")
    eager_softmax: str = "fp32"
    #: the norms' weights do not train (LoRA): an upcast norm keeps no normalised input
    frozen_norms: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_sizes(function: str, **sizes: Any) -> dict[str, int]:
    """The sizes as Python ints (numpy integers are read as numbers, never computed with in
    their fixed width); one `ValueError` naming every size that is not an integer >= 1."""
    ints = {name: as_int(value) for name, value in sizes.items()}
    bad = [f"{name}={shown(sizes[name])}" for name, n in ints.items() if n is None or n < 1]
    if bad:
        raise ValueError(f"{function}: {', '.join(bad)}: each must be an integer >= 1")
    return {name: n for name, n in ints.items() if n is not None}


def _layer_terms(
    s: int,
    b: int,
    h: int,
    a: int,
    dropout: bool,
    t: int,
    sp: bool,
    fused: bool = False,
    g: int | None = None,
    math: bool = False,
) -> tuple[int, int, int, int]:
    """(linear elements, attention-score elements, linear mask bytes, score bytes kept
    whatever the activation dtype) of one layer on one GPU of a tensor-parallel group of
    `t` (see the module docstring), without the MLP's inner tensors (the activation
    function's) and the norms' inputs and outputs (the norm implementation's,
    `implementations`): `activation_breakdown` adds both in bytes. `fused`: the sdpa kernel, whose score bytes are its
    fp32 log-sum-exp (4·asb) instead of the `as^2b` tensors and masks, and which keeps K
    and V at their width `g` (grouped-query attention: no repeat). `math`: torch's math
    kernel on a CPU, whose copies of Q, K, V and score tensors are fp32 whatever the
    activation dtype (the module docstring; `activation_breakdown` adds the fp32 copies
    of 16-bit Q, K and V)."""
    sbh = s * b * h
    outside = t if sp else 1  # the residual dropout masks
    split = 2 * sbh + 2 * s * b * (g or h) if fused else 4 * sbh  # Q, K, V, projection input
    linear = split // t
    masks = 2 * sbh // outside if dropout else 0
    if fused:
        return linear, 0, masks, 4 * (a * s * b) // t  # log-sum-exp, fp32
    as2b = a * s * s * b
    if math:  # fp32 on a CPU: the softmax output (+ its mask and the dropped weights)
        return linear, 0, masks, 4 * (3 if dropout else 1) * as2b // t
    if dropout:
        return linear, 2 * as2b // t, masks, as2b // t
    return linear, as2b // t, 0, 0


def _op_saved(tokens: int, h: int, g: int, f: int, gated: bool, t: int) -> int:
    """Elements of the matmul outputs torchtitan's op-level policy keeps in one layer: it
    numbers the matmuls of a layer (Q, K, V, output projection, then gate and up or the
    first MLP matrix, then the down projection) and keeps the odd-numbered ones."""
    outputs = [h, g, g, h] + ([f, f] if gated else [f]) + [h]
    return sum(tokens * width // t for width in outputs[::2])


def transformer_activation_bytes(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    micro_batch: int,
    vocab: int,
    checkpointing: str | Checkpointing = Checkpointing.NONE,
    activation_bytes_per_element: int = 2,
    dropout: bool = True,
    ffn_hidden: int | None = None,
    mlp: str = "gelu",
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    pipeline_parallel: int = 1,
    parallel_residual: bool = False,
    attention: str | Attention = Attention.MEGATRON,
    activation_function: str | None = None,
    autocast: bool = False,
    norm_impl: str = "kernel",
    fused_qkv: bool = False,
    eager_softmax: str = "fp32",
) -> ActivationBreakdown:
    """Activation bytes of a decoder-only transformer on one GPU (see the module docstring).

    `attention` is "megatron" (Korthikanti et al.'s unfused attention with Megatron's
    fused softmax, this function's default: the paper's formula), "eager" (transformers'
    unfused attention, whose fp32 softmax output is kept too), "math" (torch's sdpa math
    kernel as a CPU runs it with dropout, in fp32) or "sdpa" (a fused kernel
    that stores no `as^2b` tensors; `estimate_memory` defaults to it, as torch and
    transformers do).

    `activation_bytes_per_element` is 2 for 16-bit activations, 4 for fp32. `ffn_hidden`
    is the MLP inner size f (default 4 x `hidden`), `mlp` "gelu" or "swiglu" (gated);
    `parallel_residual` blocks (GPT-NeoX) store one norm input per layer instead of two.
    `activation_function` is the MLP's (transformers' names, `activation_functions.NAMES`;
    None: gelu for "gelu", silu for "swiglu"); `autocast` True counts what CUDA autocast
    keeps of it (16-bit activations only: some of its ops run in fp32) and of the
    residual stream (fp32 under autocast). `norm_impl` is the norms' implementation
    (`implementations.NORM_NAMES`: "kernel", this function's default, keeps its input;
    transformers' RMSNorms "llama" and "gemma" an fp32 copy of it and the normalised
    input); `fused_qkv` True (one QKV matrix) makes autocast keep one 16-bit cast of the
    attention's input, not three; `eager_softmax` ("fp32", "input") whether "eager"
    attention keeps an fp32 softmax output in 16-bit training without autocast.
    `tensor_parallel` must divide `heads` and `ffn_hidden`, `pipeline_parallel` must
    divide `layers`; `sequence_parallel` needs `tensor_parallel` > 1. Invalid arguments
    raise `ValueError` naming them.
    """
    sizes = _check_sizes(
        "transformer_activation_bytes",
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=seq_len,
        micro_batch=micro_batch,
        vocab=vocab,
        activation_bytes_per_element=activation_bytes_per_element,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        **({} if ffn_hidden is None else {"ffn_hidden": ffn_hidden}),
    )
    layers, hidden, heads, seq_len = (sizes[k] for k in ("layers", "hidden", "heads", "seq_len"))
    micro_batch, vocab = sizes["micro_batch"], sizes["vocab"]
    activation_bytes_per_element = sizes["activation_bytes_per_element"]
    tensor_parallel, pipeline_parallel = sizes["tensor_parallel"], sizes["pipeline_parallel"]
    f = sizes.get("ffn_hidden", 4 * hidden)
    dropout, parallel_residual = as_bool(dropout), as_bool(parallel_residual)
    sequence_parallel = as_bool(sequence_parallel)
    bad: list[str] = []
    for flag_name, flag in (("dropout", dropout), ("parallel_residual", parallel_residual)):
        if not isinstance(flag, bool):
            bad.append(f"{flag_name}={shown(flag)}: must be True or False")
    if mlp not in ("gelu", "swiglu"):
        bad.append(f"mlp={shown(mlp)}: must be gelu or swiglu")
    if activation_function is not None and activation_function not in ACTIVATION_NAMES:
        bad.append(
            f"activation_function={shown(activation_function)}: must be one of "
            f"{', '.join(ACTIVATION_NAMES)}"
        )
    autocast = as_bool(autocast)
    if not isinstance(autocast, bool):
        bad.append(f"autocast={shown(autocast)}: must be True or False")
    elif autocast and activation_bytes_per_element != 2:
        bad.append(
            f"autocast=True: needs activation_bytes_per_element=2 (autocast computes in 16 "
            f"bits), not {activation_bytes_per_element}"
        )
    if norm_impl not in NORM_NAMES:
        bad.append(f"norm_impl={shown(norm_impl)}: must be one of {', '.join(NORM_NAMES)}")
    if eager_softmax not in SOFTMAX_NAMES:
        bad.append(
            f"eager_softmax={shown(eager_softmax)}: must be one of {', '.join(SOFTMAX_NAMES)}"
        )
    fused_qkv = as_bool(fused_qkv)
    if not isinstance(fused_qkv, bool):
        bad.append(f"fused_qkv={shown(fused_qkv)}: must be True or False")
    try:
        mode = Checkpointing(checkpointing)
    except ValueError:
        bad.append(
            f"checkpointing={shown(checkpointing)}: must be one of {', '.join(Checkpointing.choices())}"
        )
    try:
        kernel = Attention(attention)
    except ValueError:
        bad.append(f"attention={shown(attention)}: must be one of {', '.join(Attention.choices())}")
    t, p = tensor_parallel, pipeline_parallel
    if not isinstance(sequence_parallel, bool):
        bad.append(f"sequence_parallel={shown(sequence_parallel)}: must be True or False")
    elif sequence_parallel and t == 1:
        bad.append("sequence_parallel=True: needs tensor_parallel > 1")
    for name, size in (("hidden", hidden), ("heads", heads), ("ffn_hidden", f)):
        if size % t:
            bad.append(f"tensor_parallel={t}: must divide {name}={size} evenly")
    if layers % p:
        bad.append(f"pipeline_parallel={p}: must divide layers={layers} evenly")
    if bad:
        raise ValueError("; ".join(bad))
    return activation_breakdown(
        layers,
        hidden,
        heads,
        seq_len,
        micro_batch,
        vocab,
        mode,
        activation_bytes_per_element,
        dropout,
        f,
        mlp,
        t,
        bool(sequence_parallel),
        p,
        parallel_residual,
        kernel,
        activation_function=activation_function,
        autocast=bool(autocast),
        norm_impl=norm_impl,
        fused_qkv=bool(fused_qkv),
        eager_softmax=eager_softmax,
    )


#: the members `activation_breakdown` compares with, bound once (an enum member read
#: through its class costs several times a module constant; it runs twice an estimate)
_SDPA, _MATH, _EAGER = Attention.SDPA, Attention.MATH, Attention.EAGER
_NONE, _SELECTIVE = Checkpointing.NONE, Checkpointing.SELECTIVE
_SELECTIVE_OP = Checkpointing.SELECTIVE_OP

#: `ActivationBreakdown`'s fields (`activation_breakdown` builds one in one step).
_BREAKDOWN_FIELDS = field_names(ActivationBreakdown)


def activation_breakdown(
    n: int,
    h: int,
    a: int,
    s: int,
    b: int,
    v: int,
    mode: Checkpointing,
    e: int,
    dropout: bool,
    f: int,
    mlp: str,
    t: int,
    sp: bool,
    p: int,
    parallel_residual: bool,
    attention: Attention = Attention.MEGATRON,
    kv_dim: int | None = None,
    experts: int = 0,
    experts_per_token: int = 0,
    activation_function: str | None = None,
    autocast: bool = False,
    norm_impl: str = "kernel",
    fused_qkv: bool = False,
    eager_softmax: str = "fp32",
    frozen_norms: bool = False,
    qk_norm_width: int = 0,
    post_norms: bool = False,
) -> ActivationBreakdown:
    """`transformer_activation_bytes` on arguments already checked (the estimator's path);
    `kv_dim` (the K and V projections' width, default h) is read by selective-op only;
    `activation_function` (None: the MLP's default) and `autocast` (CUDA autocast ran the
    step) set the MLP's inner tensors (`activation_functions.inner_bytes`); `norm_impl`,
    `autocast` and, under autocast, `fused_qkv` (one cast of the attention's input, not
    three) and `frozen_norms` (LoRA: the norms' weights do not train) set the norms' tensors
    (`implementations`); `eager_softmax` whether an unfused "eager" attention keeps an
    fp32 softmax output; `qk_norm_width` the elements a token's query and key norms read
    (`Architecture.qk_norm_width`: q + g, 0 without them), each keeping
    `implementations.qk_kept_bytes` of the norms' row; `post_norms` two more norms a layer
    on the attention's and the MLP's outputs (Gemma 2 and 3), by the same rule.

    A mixture of experts (`experts` E, `experts_per_token` k) passes as `f` the inner width
    one token goes through (k x the expert's inner size + a shared expert's): each token's
    k routed copies go through an expert MLP, which keeps its tensors for them; the
    layer also keeps the k copies of its input (k·sbh elements), the router's logits (E·sb
    elements) and its fp32 probabilities (4·E·sb bytes)."""
    sdpa, math = attention is _SDPA, attention is _MATH
    lin_el, score_el, lin_mask, score_mask = _layer_terms(
        s,
        b,
        h,
        a,
        dropout,
        t,
        sp,
        sdpa,
        kv_dim,
        math,
    )
    act = activation_function or default_activation(mlp)
    # the MLP's inner tensors: the activation function's, in bytes (fp32 under autocast)
    mlp_inner = inner_bytes(act, mlp == "swiglu", e, autocast) * s * b * f // t
    outside = t if sp else 1
    sbh_out = s * b * h // outside
    # the norms' inputs and what they keep of them (a parallel block's norms read one
    # tensor), and their outputs as the projections reading them keep them
    norms = 1 if parallel_residual else 2
    mlp_readers = 1 if experts else (2 if mlp == "swiglu" else 1)  # a router, gate and up
    norm_block = (
        norms * kept_bytes(norm_impl, e, autocast, frozen_norms)
        + input_bytes(e, autocast, 1 if fused_qkv else 3)
        + input_bytes(e, autocast, mlp_readers)
    ) * sbh_out
    if qk_norm_width:  # inside the tensor-parallel region: split over t
        norm_block += qk_kept_bytes(norm_impl, e, frozen_norms) * s * b * qk_norm_width // t
    if post_norms:  # after the row-parallel reduce: the whole width (split by sp only)
        norm_block += 2 * qk_kept_bytes(norm_impl, e, frozen_norms) * sbh_out
    if attention is _EAGER and eager_keeps_fp32(eager_softmax, e, autocast):
        # transformers' fp32 softmax output
        # no dropout: kept besides its 16-bit cast (+4 bytes); with dropout the cast is
        # dropout's input, not kept, and the fp32 output replaces it (+4 - 2 bytes)
        score_mask += (2 if dropout else 4) * a * s * s * b // t
    if math and e == 2:  # the CPU's math kernel upcasts Q, K, V
        score_mask += (4 - e) * 3 * s * b * h // t  # its fp32 copies, beyond 16-bit ones
    if experts:
        tokens = s * b // (t if sp else 1)
        lin_el += experts_per_token * s * b * h // t + experts * tokens
        lin_mask += 4 * experts * tokens
    full_layer = e * (lin_el + score_el) + norm_block + mlp_inner + lin_mask + score_mask
    layer_input = residual_bytes(e, autocast) * sbh_out

    if mode is _NONE:
        per_el = e * (lin_el + score_el) + norm_block + mlp_inner
        per_mask, recompute = lin_mask + score_mask, 0
    elif mode is _SELECTIVE:
        per_el, per_mask = e * lin_el + norm_block + mlp_inner, lin_mask
        recompute = e * score_el + score_mask
    elif mode is _SELECTIVE_OP:
        per_el = layer_input + e * _op_saved(s * b, h, kv_dim or h, f, mlp == "swiglu", t)
        if sdpa:  # the kernel's output and log-sum-exp
            per_el += e * (s * b * h) // t + score_mask
        per_mask, recompute = 0, max(0, full_layer - per_el)
    else:
        per_el, per_mask = layer_input, 0
        recompute = full_layer - layer_input

    per_layer = per_el + per_mask
    in_flight = p  # 1F1B: the first stage holds p micro-batches of its n / p layers
    embedding = in_flight * sbh_out if dropout else 0
    logits = 4 * s * b * -(-v // t) if p == 1 else 0
    # the final norm's input and what it keeps of it, the output projection's input
    final = kept_bytes(norm_impl, e, autocast, frozen_norms) + input_bytes(e, autocast, 1)
    output = final * sbh_out + logits if p == 1 else 0
    layers_bytes = (n // p) * in_flight * per_layer
    total = layers_bytes + recompute + embedding + output
    return of_every_field(
        ActivationBreakdown,
        _BREAKDOWN_FIELDS,
        dict(
            checkpointing=mode._value_,  # `.value`, read directly (hot path)
            activation_bytes_per_element=e,
            dropout=dropout,
            per_layer_element_bytes=per_el,
            per_layer_mask_bytes=per_mask,
            per_layer_bytes=per_layer,
            layers_bytes=layers_bytes,
            recompute_bytes=recompute,
            embedding_bytes=embedding,
            output_bytes=output,
            logits_bytes=logits,
            total_bytes=total,
            mlp=mlp,
            ffn_hidden=f,
            tensor_parallel=t,
            sequence_parallel=sp,
            pipeline_parallel=p,
            in_flight_micro_batches=in_flight,
            parallel_residual=parallel_residual,
            attention=attention._value_,
            activation_function=act,
            autocast=autocast,
            mlp_inner_bytes=mlp_inner,
            norm_impl=norm_impl,
            norm_bytes=norm_block,
            eager_softmax=eager_softmax,
            frozen_norms=frozen_norms,
        ),
    )


def params_from_shape(*, layers: int, hidden: int, seq_len: int, vocab: int) -> int:
    """Parameters of a GPT-style decoder with tied input/output embeddings.

    12Lh^2 + 13Lh + Vh + sh + 2h: per layer QKV (3h^2 + 3h), attention projection
    (h^2 + h), MLP with 4h inner size (8h^2 + 5h) and two layernorms (4h); token embedding
    (Vh, shared with the output projection), learned position embedding (sh) and the
    final layernorm (2h). Sizes that are not integers >= 1 raise `ValueError`.
    """
    sizes = _check_sizes(
        "params_from_shape", layers=layers, hidden=hidden, seq_len=seq_len, vocab=vocab
    )
    n, h, s, v = sizes["layers"], sizes["hidden"], sizes["seq_len"], sizes["vocab"]
    return 12 * n * h * h + 13 * n * h + v * h + s * h + 2 * h
