"""LoRA and QLoRA in the estimator: the adapters, the frozen base, the 4-bit base.

LoRA (Hu et al. 2021) freezes the base weights and trains, on each target linear layer of
shape (in, out), two matrices A (rank x in) and B (out x rank): `rank * (in + out)`
parameters. Only they have gradients and optimizer states, so per GPU the adapters' model
states are the engine's accounting of `rank * (in + out)` parameters (the ZeRO paper's,
DeepSpeed's or FSDP2's layout, sharded as the stage or mode shards them), plus the frozen
base's weights (`frozen_base_bytes`):

    parameters          weight bytes x frozen base  +  the adapters' (accounting)
    gradients           the adapters' (accounting)
    optimizer states    the adapters' (accounting: master copy, flat buffers included)

QLoRA (Dettmers et al. 2023) holds the base linear layers in 4-bit NF4, counted to the
byte as bitsandbytes 0.50 lays a `Params4bit` out (`nf4_weight_bytes`, per layer of `n`
weights; `functional.quantize_4bit` with `compress_statistics=True`, blocksize 64):

    packed weights        ceil(n / 2) bytes (two 4-bit codes a byte, uint8 storage)
    absmax, quantised     ceil(n / 64) bytes (one uint8 per 64-weight block)
    second-level absmax   4 x ceil(blocks / 256) bytes (fp32, one per 256 blocks)
    offset                4 bytes (the fp32 mean subtracted before the second level)
    NF4 code              16 x 4 bytes (fp32)
    second-level code     256 x 4 bytes (fp32, the dynamic 8-bit map)

about `NF4_BYTES_PER_PARAM` (0.516) bytes per weight. Embeddings, norms, biases and the
output head stay in the weights' dtype: fp32 under fp32 and amp (autocast keeps fp32
weights), bf16 under pure bf16 ("bf16-true", as torchtune's and PEFT's QLoRA recipes run
it). Each 4-bit layer is dequantised for its matmul (forward, and backward for the input
gradient): one layer's weight in the compute dtype, a transient.

Under FSDP2 the 4-bit base is torchao's `NF4Tensor` (torchtune's `FrozenNF4Linear`, which
FSDP2 shards and gathers through the tensor's own hooks): packed codes ceil(n / 2), int8
block scales n / 64, one second-level factor per 256 blocks, a scale mean and a 16-entry
code, the last three in the weight's dtype (2 bytes under bf16-true, else 4). A rank holds
1/N of each weight (`frozen_base_bytes`: ceil of the whole over N); the scale mean and the
code stay whole on every rank, 17 x 2 bytes a layer in bf16 that the share leaves out
(34 bytes x (N - 1) / N a layer: 19 KB on a 70B's 560 linear layers).

The adapters' dtype (`lora_dtype`): "auto" keeps them in the trained weights' dtype (bf16
under bf16-true, as torchtune does; fp32 otherwise); "fp32" keeps them in fp32 over a bf16
base, as peft's `get_peft_model` does by default (`autocast_adapter_dtype=True`), so their
weights, gradients and optimizer states are counted as fp32 training counts them.

Targets: "all-linear" (every linear layer of a block: Q, K, V, output, the MLP's two or
three matrices; not the output head, as peft's "all-linear") or "attention" (Q, K, V and
output, the original paper's choice). Where the model holds Q, K and V as one matrix
(`Architecture.fused_qkv`: GPT-2's Conv1D `c_attn`, GPT-NeoX's `query_key_value`) that
matrix is one target, (h, q + 2g), as peft wraps it: GPT-2 124M at rank 8 gets 1,179,648
adapters on every linear layer, as a Session attaches them (its `c_attn` alone, 294,912,
is the module's count, which a Session passes). A mixture-of-experts MLP is counted as its dense
MLP of `ffn_hidden`. A Session passes the exact adapter count of your module
(`lora_params`); the shape's figure stands for it otherwise.

Activations: each target keeps its adapter's rank-wide middle (A x) for B's gradient, and
with `lora_dropout` > 0 its own dropped copy of the layer input (peft applies dropout per
target) and the 1-byte mask. The frozen base layers' inputs are still counted as the
full fine-tune keeps them (an upper bound: a frozen layer that is not a target needs its
input for no weight gradient).

Pure Python: imports only the estimator's own tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.choices import LoraDtype

#: bitsandbytes NF4 with double quantisation per weight: 4 bits, a 1-byte absmax per 64
#: weights and an fp32 second-level absmax per 256 blocks (a layer's constants aside:
#: `nf4_weight_bytes` counts a layer to the byte).
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)

#: NF4's block of weights sharing one absmax, and the second level's block of absmaxes.
NF4_BLOCK = 64
NF4_ABSMAX_BLOCK = 256
#: A 4-bit layer's constants: the offset (fp32), the 16-entry NF4 code and the 256-entry
#: second-level code (fp32 each).
NF4_LAYER_CONSTANT_BYTES = 4 + 16 * 4 + 256 * 4

LORA_TARGETS = ("all-linear", "attention")

#: The adapters' dtype: "auto" (the trained weights': bf16 under bf16-true, torchtune's
#: choice; fp32 otherwise) or "fp32" (peft's `autocast_adapter_dtype=True` default).
LORA_DTYPES = tuple(d.value for d in LoraDtype)


#: The 4-bit libraries whose layouts `nf4_weight_bytes` counts.
FOUR_BIT_LIBRARIES = ("bitsandbytes", "torchao")


def nf4_weight_bytes(elements: int, library: str = "bitsandbytes", scale_bytes: int = 4) -> int:
    """Bytes one weight of `elements` takes in NF4 with double quantisation (blocks of 64,
    absmaxes in blocks of 256). "bitsandbytes" (`Params4bit`, uint8 storage): see the
    module docstring's table. "torchao" (`NF4Tensor`, torchtune's and FSDP2's): packed
    codes ceil(n / 2), int8 block scales n / 64, a second-level factor per 256 blocks and
    a scale mean and the 16-entry NF4 code in the weight's dtype (`scale_bytes` each: 2
    under bf16-true, 4 in fp32)."""
    blocks = -(-elements // NF4_BLOCK)
    packed = -(-elements // 2) + blocks
    if library == "torchao":
        factors = -(-blocks // NF4_ABSMAX_BLOCK)
        # torchao 0.18 keeps a lone factor as a view of its 256-wide block (`[:, 0]` of one
        # row is contiguous already, so `.contiguous()` copies nothing): 256 held
        held = NF4_ABSMAX_BLOCK if factors == 1 else factors
        return packed + scale_bytes * (held + 1 + 16)
    return packed + 4 * -(-blocks // NF4_ABSMAX_BLOCK) + NF4_LAYER_CONSTANT_BYTES


@dataclass(frozen=True)
class LoraFacts:
    """What the estimator reads of a LoRA setup (checked inputs)."""

    rank: int
    targets: str  # a LORA_TARGETS value
    trainable: int  # adapter parameters
    quantized: int  # base weights held in 4 bits (QLoRA), else 0
    dropout: float
    qlora: bool
    layer_shapes: tuple[tuple[int, int], ...]  # (in, out) of each target of one layer
    largest_linear: int  # elements of the largest linear weight of a block
    #: bytes of the 4-bit base as bitsandbytes holds it (its constants included), else 0
    quantized_bytes: int = 0
    #: "auto" or "fp32" (`LORA_DTYPES`): fp32 adapters over a bf16 base
    dtype: str = "auto"


#: The roles of the attention's linear layers (`block_linears`): "attention"'s targets.
ATTENTION_ROLES = ("q", "k", "v", "qkv", "o")


def block_linears(arch: Any) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of one block of `arch`, by role: Q, K and V as one
    "qkv" layer (h, q + 2g) where the model holds them fused (`fused_qkv`: GPT-2's c_attn,
    GPT-NeoX's query_key_value), else three."""
    h, q, g = arch.hidden, arch.q_dim, arch.kv_dim
    f = (arch.moe_ffn_hidden or arch.ffn_hidden) if arch.is_moe else arch.ffn_hidden
    shapes: dict[str, tuple[int, int]]
    if arch.fused_qkv:
        shapes = {"qkv": (h, q + 2 * g), "o": (q, h)}
    else:
        shapes = {"q": (h, q), "k": (h, g), "v": (h, g), "o": (q, h)}
    if arch.mlp == "swiglu":
        shapes.update({"gate": (h, f), "up": (h, f), "down": (f, h)})
    else:
        shapes.update({"up": (h, f), "down": (f, h)})
    return shapes


def target_shapes(arch: Any, targets: str) -> tuple[tuple[int, int], ...]:
    """(in, out) of the targets of one block."""
    shapes = block_linears(arch)
    if targets == "attention":
        return tuple(shape for role, shape in shapes.items() if role in ATTENTION_ROLES)
    return tuple(shapes.values())


def lora_facts(
    arch: Any,
    rank: int,
    targets: str,
    params: int | None,
    dropout: float,
    qlora: bool,
    quantized_params: int | None = None,
    quantized_bytes: int | None = None,
    dtype: str = "auto",
    library: str = "bitsandbytes",
    scale_bytes: int = 4,
) -> LoraFacts:
    """The facts of a LoRA setup on `arch` (None: a shape-less model, where `params`
    must be given, and `quantized_params` under QLoRA). The 4-bit base's bytes:
    `quantized_bytes` when given (a Session counts its layers), else each of the shape's
    linear layers by `nf4_weight_bytes`; with a count alone (`quantized_params`, no shape
    or another count than the shape's) `NF4_BYTES_PER_PARAM` per weight. `library` and
    `scale_bytes`: the 4-bit layout (`nf4_weight_bytes`; torchao's under FSDP2)."""
    shapes = target_shapes(arch, targets) if arch is not None else ()
    linears = block_linears(arch) if arch is not None else {}
    layers = arch.layers if arch is not None else 0
    counted = layers * sum(rank * (a + b) for a, b in shapes)
    quantized = layers * sum(a * b for a, b in linears.values())
    largest = max((a * b for a, b in linears.values()), default=0)
    held = quantized_params if quantized_params is not None else quantized
    if quantized_bytes is None:
        if held == quantized:
            quantized_bytes = layers * sum(
                nf4_weight_bytes(a * b, library, scale_bytes) for a, b in linears.values()
            )
        else:
            quantized_bytes = -(-held * int(NF4_BYTES_PER_PARAM * 2**16) // 2**16)
    return LoraFacts(
        rank=rank,
        targets=targets,
        trainable=params if params is not None else counted,
        quantized=held if qlora else 0,
        dropout=dropout,
        qlora=qlora,
        layer_shapes=shapes,
        largest_linear=largest,
        quantized_bytes=int(quantized_bytes) if qlora else 0,
        dtype=dtype,
    )


def frozen_base_bytes(
    n_params: int, lora: LoraFacts, weights: int, *, gpus: int = 1, split: bool = False
) -> int:
    """Bytes of the frozen base on one GPU: `n_params` base parameters in the weights'
    dtype (`weights` bytes each), those QLoRA holds in 4 bits at their bytes as
    bitsandbytes holds them (`LoraFacts.quantized_bytes`); each part `ceil(x / gpus)` when
    the engine splits the weights (`split`: ZeRO-3, FSDP full_shard). The adapters' own
    states are the accounting's (`model_states`)."""

    def part(count: int) -> int:
        return -(-count // gpus) if split else count

    base = n_params - lora.quantized
    return int(weights * part(base) + part(lora.quantized_bytes))


def adapter_activation_bytes(
    lora: LoraFacts, arch: Any, micro_batch: int, e: int, layers: int | None = None
) -> int:
    """Bytes the adapters of `layers` blocks (default: all) keep for backward: per target
    its rank-wide middle, and with dropout its dropped input copy (compute dtype) and
    1-byte mask. Under full checkpointing a block keeps them only while it is recomputed,
    one block at a time."""
    if arch is None:
        return 0
    tokens = arch.seq_len * micro_batch
    per_layer = 0
    for fan_in, _ in lora.layer_shapes:
        per_layer += e * tokens * lora.rank
        if lora.dropout > 0:
            per_layer += (e + 1) * tokens * fan_in
    return (arch.layers if layers is None else layers) * per_layer


def dequantized_bytes(lora: LoraFacts, e: int) -> int:
    """QLoRA's transient: the largest 4-bit layer dequantised to the compute dtype."""
    return e * lora.largest_linear if lora.qlora else 0
