"""What a `torch.compile`d step keeps for the backward, against eager: the peak's term
"recomputed under torch.compile" (`COMPILE_TERM`).

Under `torch.compile` AOTAutograd traces the forward and the backward as one joint graph,
and its min-cut partitioner (`torch._functorch.partitioners.min_cut_rematerialization_partition`,
what inductor uses) decides which forward values the backward reads from memory and which it
recomputes: it saves the inputs of matmuls and reductions and recomputes chains of pointwise
ops (activations, casts, the normalisation's scaling) from them. So the compiled step keeps
fewer tensors than the eager one, and which ones depends on the model's ops, not on its size.

Measured on this CPU (torch 2.13, inductor; tests/integration/test_compile_memory.py counts
the tensors the compiled forward hands its backward, `CompiledFunctionBackward.saved_tensors`,
once per storage, without parameters, and compares them with the tensors an eager forward
saves, `saved_tensors_hooks`), per layer (the difference between a model of two layers and
one of one), in the formula's symbols (`activations`: s sequence, b micro-batch, h hidden,
f MLP inner, a heads, e the activation bytes; t the tensor-parallel size):

* **a gated MLP (SwiGLU: Llama, Mistral, Qwen2)**: the SiLU output (e·sbf) is recomputed
  from the gate projection's output in backward; the gate and up outputs and their product
  (the down projection's input) are kept. The formula's 4sbf elements become 3sbf.
* **a GELU MLP (the built-in GPT)**: nothing of the formula's: the GELU output is the
  second matmul's input, which the backward of that matmul reads, so it is kept beside the
  GELU input.
* **an MLP activation written out in Python** (`activation_functions`: GPT-2's gelu_new,
  quick_gelu, ...): its intermediates are recomputed from the first matmul's output, so a
  two-matrix MLP keeps that output and the second matmul's input (2sbf; a ReLU, sigmoid,
  tanh or identity, which keeps its output only, sbf) and a gated one the gate, up and
  product (3sbf), in the activation dtype: under CUDA autocast, whose fp32 ops (gelu_new's
  `pow`) are in the recomputed chain, too. The term is the eager count less that. The built-in GPT's fused softmax (computed in fp32) is where the partitioner's
  choice moves with the shape: in fp32 it may keep the softmax's fp32 row maximum and sum
  (2 x 4asb bytes per layer) beside the probabilities, and the layer norms' means; at the
  test's shape it keeps neither. The term is 0, within that bound (0.06% of a layer at
  h 1024, s 1024); in bf16 the compiled layer keeps what the eager one does.
* **the norms** (`implementations`): the compiled step keeps each norm's input and its
  per-token rstd and recomputes the rest. transformers' RMSNorms ("llama", "gemma") keep
  an fp32 copy of their input and the normalised input eagerly, so the term holds what
  they keep beyond the input (the residual stream's bytes: e, fp32 under autocast), in
  every layer and in the final norm: (4 + e) - e bytes an element for "llama" in 16 bits,
  8 - 4 in fp32. torch's one-kernel norm ("kernel") keeps its input either way. Under
  autocast the projections' own 16-bit casts of the norm's output are left as the eager
  step keeps them (not measured compiled). The rotary embedding's cos and sin are no part
  of either figure. The query and key norms (`qk_norm`) are not measured compiled and
  are counted as the eager step keeps them (no term): at most 4 bytes an element of the
  q + g wide projection outputs over, if the partitioner treats them as the layer's norms.
* **transformers' unfused attention ("eager") in 16 bits**: the eager step keeps the
  softmax's fp32 output (4as^2b) beside its 16-bit cast; the compiled step keeps the
  16-bit scores (2as^2b) and the softmax's fp32 row maximum and sum (2 x 4asb) and
  recomputes the fp32 probabilities: 2as^2b - 8asb bytes less per layer (measured without
  attention dropout, transformers' default for Llama; with dropout the term is 0, not
  measured). In fp32 the two steps keep the same.
* **torch's math kernel with dropout ("math": what sdpa runs on a CPU when the attention has
  dropout)**: its dropout mask, a tensor of the scores' dtype (fp32 on a CPU), is kept as a
  bool mask: 4as^2b - as^2b = 3as^2b bytes less per layer, in fp32 and bf16.
* **sdpa, Megatron's kernel, dropout**: no change (the fused kernel's inputs, output and
  log-sum-exp are kept; the dropout masks are random, which the partitioner never
  recomputes).

The term counts the layers the formula's stored activations hold (`ActivationBreakdown`:
`layers / pipeline_parallel` layers for each micro-batch in flight) under no recomputation
and selective recomputation, which keep the MLP's tensors; under selective-op and full
recomputation a layer keeps no pointwise intermediate (its recomputation in backward is
not measured compiled here, and the term is 0). Everything before and after the layers (the
embedding, the final norm's input, the output projection's input, the logits and the loss)
is the same.

The partitioner runs on the joint graph before inductor lowers it for CPU or CUDA, and it
runs on fake tensors as well: one Llama 3 8B layer (h 4096, f 14336) at 8192 tokens in
bf16 keeps the formula's layer minus this term plus the norms' rstd, to the byte (the same
test). So the term measured here is the one a GPU's compiled step drops; the fused kernels
inductor writes for a GPU may hold their own temporaries, within the backward transient. Published figures (docs/estimator.md, "torch.compile"):
torchtitan's Llama 3.1 8B, 82.4 -> 77.0 GiB, torchtune's Llama 3.2 3B, 60.0 -> 51.0 GiB.

Pure Python: imports no torch.
"""

from __future__ import annotations

from workbench.estimate.activation_functions import (
    ACTIVATION_FUNCTIONS,
    default_activation,
    inner_bytes,
)
from workbench.estimate.activations import ActivationBreakdown, Attention, Checkpointing
from workbench.estimate.implementations import eager_keeps_fp32, kept_bytes, residual_bytes

#: The peak's term: the activation bytes a compiled step does not keep (a negative term).
COMPILE_TERM = "recomputed under torch.compile"

#: The recomputation modes whose stored layers keep the MLP's and the softmax's tensors.
_KEEPS_LAYER = (Checkpointing.NONE.value, Checkpointing.SELECTIVE.value)


def compiled_layer_drop_bytes(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    ffn_hidden: int,
    mlp: str,
    attention: str,
    checkpointing: str,
    activation_bytes_per_element: int,
    dropout: bool = False,
    tensor_parallel: int = 1,
    activation_function: str | None = None,
    autocast: bool = False,
    norm_impl: str = "kernel",
    norms: int = 2,
    eager_softmax: str = "fp32",
    sequence_parallel: bool = False,
    frozen_norms: bool = False,
) -> int:
    """The bytes one stored layer keeps eagerly (the formula's terms) and not under
    `torch.compile` (the module docstring's table). `ffn_hidden` is the inner width one
    token goes through (`Architecture.token_ffn_hidden`); `attention` and `checkpointing`
    are the formula's words (`Attention`, `Checkpointing` values); `activation_function`
    (None: the MLP's default), `autocast`, `norm_impl` (with `norms` norms a layer, one
    with a parallel residual; split over t with `sequence_parallel`) and `eager_softmax`
    as the formula's (`activation_breakdown`)."""
    if checkpointing not in _KEEPS_LAYER:
        return 0
    s, b, t, e = seq_len, micro_batch, tensor_parallel, activation_bytes_per_element
    gated = mlp == "swiglu"
    act = activation_function or default_activation(mlp)
    # the activation's pointwise chain, recomputed from the matmul outputs (SwiGLU: the
    # SiLU output, from the gate projection's output)
    kept = 3 if gated else min(2, ACTIVATION_FUNCTIONS[act].two.tensors)
    eager = inner_bytes(act, gated, e, autocast)
    drop = max(0, eager - e * kept) * s * b * ffn_hidden // t
    drop += (
        norms
        * norm_drop_bytes(norm_impl, e, autocast, frozen_norms)
        * (s * b * hidden // (t if sequence_parallel else 1))
    )
    if (
        attention == Attention.EAGER.value
        and eager_keeps_fp32(eager_softmax, e, autocast)
        and not dropout
        and checkpointing == Checkpointing.NONE.value
    ):
        # the fp32 probabilities, recomputed from the 16-bit scores and two fp32 row stats
        a = heads
        drop += (2 * a * s * s * b - 2 * 4 * a * s * b) // t
    if attention == Attention.MATH.value and dropout and checkpointing == Checkpointing.NONE.value:
        # the CPU math kernel's dropout mask: a tensor of the scores' dtype (fp32), kept as
        # a bool mask when compiled
        drop += 3 * heads * s * s * b // t
    return drop


def norm_drop_bytes(norm_impl: str, e: int, autocast: bool, frozen: bool = False) -> int:
    """Bytes per element of its input one norm keeps eagerly and not compiled: what it
    keeps beyond its input (`implementations.kept_bytes` less the residual stream's)."""
    return kept_bytes(norm_impl, e, autocast, frozen) - residual_bytes(e, autocast)


def compiled_drop_bytes(
    breakdown: ActivationBreakdown,
    *,
    layers: int,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
) -> int:
    """The activation bytes a compiled step does not keep of `breakdown` (the formula's
    eager activations of a model with `layers` layers): every stored layer's
    `compiled_layer_drop_bytes`, for each micro-batch in flight."""
    per_layer = compiled_layer_drop_bytes(
        seq_len=seq_len,
        micro_batch=micro_batch,
        hidden=hidden,
        heads=heads,
        ffn_hidden=breakdown.ffn_hidden or 4 * hidden,
        mlp=breakdown.mlp,
        attention=breakdown.attention,
        checkpointing=breakdown.checkpointing,
        activation_bytes_per_element=breakdown.activation_bytes_per_element,
        dropout=breakdown.dropout,
        tensor_parallel=breakdown.tensor_parallel,
        activation_function=breakdown.activation_function,
        autocast=breakdown.autocast,
        norm_impl=breakdown.norm_impl,
        norms=1 if breakdown.parallel_residual else 2,
        eager_softmax=breakdown.eager_softmax,
        sequence_parallel=breakdown.sequence_parallel,
        frozen_norms=breakdown.frozen_norms,
    )
    split = breakdown.tensor_parallel if breakdown.sequence_parallel else 1
    stored_layers = layers // breakdown.pipeline_parallel * breakdown.in_flight_micro_batches
    drop = min(stored_layers * per_layer, breakdown.layers_bytes)
    if breakdown.output_bytes:  # the final norm, on the last stage
        e, autocast = breakdown.activation_bytes_per_element, breakdown.autocast
        final = norm_drop_bytes(breakdown.norm_impl, e, autocast, breakdown.frozen_norms)
        drop += final * (seq_len * micro_batch * hidden // split)
    return drop


__all__ = ["COMPILE_TERM", "compiled_drop_bytes", "compiled_layer_drop_bytes", "norm_drop_bytes"]
