"""What a `torch.compile`d forward keeps for the backward, counted tensor by tensor on this
CPU, against the formula's eager terms minus `workbench.estimate.compiled`'s term.

The compiled forward hands its backward the tensors AOTAutograd's partitioner chose; they
are the saved tensors of the `CompiledFunctionBackward` node the output hangs from. The eager
forward's are caught with `saved_tensors_hooks`. Both are counted once per storage, without
parameters and buffers. A layer's bytes are the difference between a model of two layers and
the same model of one (everything before and after the layers cancels). The models are
compiled afresh for each case (`torch._dynamo.reset()` first).

Each case's compiled layer equals the formula's eager layer minus the term, plus the norms'
per-token statistics the formula leaves out (counted by hand: `STATS`), exactly.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from workbench.estimate import transformer_activation_bytes
from workbench.estimate.compiled import compiled_layer_drop_bytes
from workbench.models.gpt import TinyGPT

sys.path.insert(0, str(Path(__file__).parent))
from peak_measure import tiny_llama  # noqa: E402

S, B = 32, 2  # sequence, micro-batch
GPT = {"hidden": 32, "heads": 4, "vocab": 64}  # the built-in GPT: GELU MLP (4h), dropout 0.1
LLAMA = {"hidden": 64, "heads": 4, "ffn": 96, "vocab": 100}  # SwiGLU, no dropout


class _Logits(nn.Module):
    """A transformers causal LM's logits as the model's output (what the Session compiles:
    the model's forward)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=ids).logits
        return logits


def _gpt(layers: int, dtype: torch.dtype, attention: str) -> nn.Module:
    torch.manual_seed(0)
    model = TinyGPT(
        vocab=GPT["vocab"], seq_len=S, layers=layers, hidden=GPT["hidden"], heads=GPT["heads"]
    )
    for block in model.blocks:  # "sdpa": torch's kernel (its math kernel on a CPU, dropout)
        block.attn.kernel = attention
    return model.to(dtype)


def _llama(layers: int, dtype: torch.dtype, attention: str) -> nn.Module:
    model = tiny_llama(
        layers=layers,
        hidden=LLAMA["hidden"],
        heads=LLAMA["heads"],
        kv_heads=LLAMA["heads"],
        ffn=LLAMA["ffn"],
        vocab=LLAMA["vocab"],
        seq_len=S,
        attention=attention,
    )
    return _Logits(model.to(dtype))


def _frozen(model: nn.Module) -> set[int]:
    tensors = [*model.parameters(), *model.buffers()]
    return {t.untyped_storage().data_ptr() for t in tensors}


def _count(tensors: list[torch.Tensor], frozen: set[int]) -> int:
    storages: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in frozen:
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


def eager_saved_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    """The bytes an eager forward saves for backward (parameters and buffers left out)."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(ids)
    del out
    return _count(saved, _frozen(model))


def compiled_saved_bytes(model: nn.Module, ids: torch.Tensor, backend: str = "inductor") -> int:
    """The bytes a compiled forward hands its backward (parameters and buffers left out)."""
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend)(ids)
    node = out.grad_fn
    assert type(node).__name__ == "CompiledFunctionBackward", type(node)  # one graph, no break
    saved = [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
    return _count(saved, _frozen(model))


def per_layer(
    measure: Callable[[nn.Module, torch.Tensor], int],
    build: Callable[..., nn.Module],
    vocab: int,
    dtype: torch.dtype,
    attention: str,
) -> int:
    ids = torch.randint(0, vocab, (B, S), generator=torch.Generator().manual_seed(0))
    two = measure(build(2, dtype, attention), ids)
    one = measure(build(1, dtype, attention), ids)
    return two - one


#: (family, dtype, attention, the norms' per-token statistics one layer keeps, by hand,
#: backend): LayerNorm keeps its rstd (fp32 in fp32; in bf16 its mean and rstd, in bf16);
#: RMSNorm its fp32 rstd; two norms per layer. "inductor" is torch.compile's default;
#: "aot_eager_decomp_partition" is the same decompositions and partitioner without
#: inductor's code generation (seconds instead of a C++ compile per case; the dry run's
#: path), which saves the same tensors as inductor in every case here (checked when this
#: table was written: each case passes with either backend).
CASES = [
    ("gpt", torch.float32, "megatron", 2 * 4 * S * B, "inductor"),
    ("gpt", torch.bfloat16, "megatron", 2 * 2 * 2 * S * B, "aot_eager_decomp_partition"),
    ("gpt", torch.float32, "math", 2 * 4 * S * B, "aot_eager_decomp_partition"),
    ("gpt", torch.bfloat16, "math", 2 * 2 * 2 * S * B, "aot_eager_decomp_partition"),
    ("llama", torch.float32, "sdpa", 2 * 4 * S * B, "aot_eager_decomp_partition"),
    ("llama", torch.bfloat16, "sdpa", 2 * 4 * S * B, "aot_eager_decomp_partition"),
    ("llama", torch.bfloat16, "eager", 2 * 4 * S * B, "inductor"),
]


def _formula(family: str, dtype: torch.dtype, attention: str) -> tuple[int, int]:
    """(the formula's eager bytes of one layer, the term's bytes of one layer)."""
    e = 2 if dtype == torch.bfloat16 else 4
    sizes = GPT if family == "gpt" else LLAMA
    f = 4 * sizes["hidden"] if family == "gpt" else sizes["ffn"]
    mlp = "gelu" if family == "gpt" else "swiglu"
    # transformers' RMSNorm keeps an fp32 copy of its input and the normalised input eagerly,
    # which the compiled step recomputes (the term); the built-in GPT's LayerNorm its input
    norm = "kernel" if family == "gpt" else "llama"
    breakdown = transformer_activation_bytes(
        layers=1,
        hidden=sizes["hidden"],
        heads=sizes["heads"],
        seq_len=S,
        micro_batch=B,
        vocab=sizes["vocab"],
        activation_bytes_per_element=e,
        dropout=family == "gpt",
        ffn_hidden=f,
        mlp=mlp,
        attention=attention,
        norm_impl=norm,
    )
    term = compiled_layer_drop_bytes(
        seq_len=S,
        micro_batch=B,
        hidden=sizes["hidden"],
        heads=sizes["heads"],
        ffn_hidden=f,
        mlp=mlp,
        attention=attention,
        checkpointing="none",
        activation_bytes_per_element=e,
        dropout=family == "gpt",
        norm_impl=norm,
    )
    return breakdown.per_layer_bytes, term


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0]}-{str(c[1]).split('.')[-1]}-{c[2]}-{c[4]}" for c in CASES]
)
def test_a_compiled_layer_keeps_the_formula_minus_the_compile_term(case) -> None:
    family, dtype, attention, stats, backend = case
    build = _gpt if family == "gpt" else _llama
    vocab = (GPT if family == "gpt" else LLAMA)["vocab"]
    kernel = "sdpa" if attention in ("sdpa", "math") else "eager"
    measure = functools.partial(compiled_saved_bytes, backend=backend)
    compiled = per_layer(measure, build, vocab, dtype, kernel)
    eager = per_layer(eager_saved_bytes, build, vocab, dtype, kernel)
    formula, term = _formula(family, dtype, attention)
    assert compiled == formula - term + stats
    assert compiled <= eager  # what eager keeps beyond: the term and the norms' own copies
    if family == "llama":
        assert term > 0  # SwiGLU's SiLU output (+ the fp32 softmax output, eager in bf16)
    elif attention == "math":
        assert term == 3 * GPT["heads"] * S * S * B  # the fp32 dropout mask kept as bool
    else:
        assert term == 0  # the GELU output is the second matmul's input: kept


class _DecoderLayer(nn.Module):
    """One transformers Llama decoder layer with its rotary embedding: a layer as the
    compiled model runs it."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )

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


def test_at_llama_3_8b_sizes_the_partitioner_keeps_the_formula_minus_the_term() -> None:
    """One Llama 3 8B layer (h 4096, 32 heads, f 14336) at 8192 tokens in bf16, on fake
    tensors: the partitioner inductor uses (`PartitionedModule`, the dry run's) saves the
    formula's layer minus the term plus the two RMSNorms' fp32 rstd, to the byte."""
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing.reductions import StorageWeakRef

    from workbench.train.dry_run.compiled import PartitionedModule

    h, a, f, s, b = 4096, 32, 14336, 8192, 1
    config = transformers.LlamaConfig(
        hidden_size=h,
        num_attention_heads=a,
        num_key_value_heads=a,
        intermediate_size=f,
        max_position_embeddings=s,
        attn_implementation="sdpa",
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode():
            layer = _DecoderLayer(config)
            x = torch.randn(b, s, h, requires_grad=True)
            out = PartitionedModule(layer)(x)
            kept = {t for t in [*layer.parameters(), *layer.buffers()]}
            frozen = {StorageWeakRef(t.untyped_storage()) for t in kept}
            storages = {
                StorageWeakRef(t.untyped_storage()): t.untyped_storage().nbytes()
                for t in out.grad_fn.saved_tensors
                if StorageWeakRef(t.untyped_storage()) not in frozen
            }
    finally:
        torch.set_default_dtype(default)
    formula = transformer_activation_bytes(
        layers=1,
        hidden=h,
        heads=a,
        seq_len=s,
        micro_batch=b,
        vocab=8,
        dropout=False,
        ffn_hidden=f,
        mlp="swiglu",
        attention="sdpa",
    ).per_layer_bytes
    term = compiled_layer_drop_bytes(
        seq_len=s,
        micro_batch=b,
        hidden=h,
        heads=a,
        ffn_hidden=f,
        mlp="swiglu",
        attention="sdpa",
        checkpointing="none",
        activation_bytes_per_element=2,
    )
    assert term == 2 * s * b * f  # the SiLU output: 224 MiB per layer
    assert sum(storages.values()) == formula - term + 2 * 4 * s * b
