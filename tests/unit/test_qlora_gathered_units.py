"""Under FSDP2 a QLoRA base is gathered as it is held: torchao's NF4 tensor all-gathers its
packed codes and block scales through its own FSDP hooks (torchtune's way), so a gathered
layer unit is its 4-bit weights' bytes plus the norms and adapters in the compute dtype,
not the layer in bf16."""

from __future__ import annotations

from workbench.estimate import estimate_memory
from workbench.estimate.architecture import build_architecture
from workbench.estimate.lora import block_linears, nf4_weight_bytes

SHAPE = dict(
    layers=4,
    hidden=1024,
    heads=8,
    kv_heads=2,
    ffn_hidden=2816,
    vocab=1000,
    seq_len=256,
    mlp="swiglu",
    norm="rmsnorm",
    positions="rotary",
    bias="none",
    tied_embeddings=False,
)
SETUP = dict(
    **SHAPE,
    micro_batch=1,
    gpus=8,
    fsdp="full_shard",
    precision="bf16-true",
    checkpointing="full",
    lora_rank=16,
)


def _gathered_in_a_layers_backward(**kw: object) -> int:
    e = estimate_memory(**{**SETUP, **kw})
    return e.peak.moments["last layer's backward"]["FSDP gathered parameters"]


def test_a_gathered_layer_is_its_nf4_bytes_and_the_rest_in_bf16() -> None:
    arch, _ = build_architecture(dict(SHAPE))
    assert arch is not None
    linears = [a * b for a, b in block_linears(arch).values()]
    e = estimate_memory(**SETUP, qlora=True)
    rest = 2 * arch.hidden + e.lora_params // arch.layers  # two norms, the adapters
    one = sum(nf4_weight_bytes(n, "torchao", 2) for n in linears) + 2 * rest
    assert _gathered_in_a_layers_backward(qlora=True) == 2 * one  # the layer and the next


def test_the_4bit_base_gathers_under_a_third_of_the_bf16_one() -> None:
    bf16 = _gathered_in_a_layers_backward()
    four_bit = _gathered_in_a_layers_backward(qlora=True)
    assert four_bit < bf16 / 3
