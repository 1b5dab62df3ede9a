"""`workbench.train.measure.memory_advice`: the memory technique that frees the most of the predicted
peak, named with the term it shrinks and the bytes it frees, applied in one change."""

from __future__ import annotations

import pytest

from workbench import Session, TrainConfig
from workbench.models import build_model
from workbench.prediction import predict_memory
from workbench.train.measure.memory_advice import (
    PURE_BF16,
    SHORT_FRACTION,
    memory_advice,
)

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64}


def test_optimizer_states_of_a_7b_model_point_to_8_bit_adamw() -> None:
    config = TrainConfig(precision="amp-bf16")
    (advice,) = memory_advice(config, 7_000_000_000)
    base = predict_memory(config, 7_000_000_000)
    after = predict_memory(config.replace(optimizer="adam8bit"), 7_000_000_000)
    assert advice.apply == {"optimizer": "adam8bit"}
    assert advice.evidence["freed_bytes"]["8-bit AdamW"] == base.peak_bytes - after.peak_bytes
    share = round(100 * base.peak_terms["optimizer states"] / base.peak_bytes)
    assert advice.message.startswith(f"optimizer states are {share}% of the peak")
    # 7e9 x (8 - 2) bytes of states, and foreach's fp32 temporary (4 bytes each), which the
    # 8-bit step (one compiled kernel per tensor) does not make: 7e9 x 10 bytes = 65.19 GiB
    assert "8-bit AdamW frees 65.19 GiB" in advice.message


def test_a_tiny_gpt_s_activations_point_to_offloading_and_the_change_applies() -> None:
    """Two layers in pure bf16: offloading keeps one layer's activations on the device,
    checkpointing every layer's input and one layer's recomputation, so offloading frees
    the most (in fp32, pure bf16 itself would: it halves the activations too) on a GPU.
    On a CPU offloading moves nothing, so it is not offered: checkpointing is."""
    info = build_model("tiny-gpt", **TINY)[3]
    short = predict_memory(TrainConfig(micro_batch=8), info, device="cpu").peak_bytes
    (fp32,) = memory_advice(TrainConfig(micro_batch=8), info, capacity_bytes=short)
    assert fp32.apply == {"precision": "bf16-true"}  # where memory is short
    config = TrainConfig(micro_batch=8, precision="bf16-true")
    (advice,) = memory_advice(config, info, device="cuda")
    assert advice.apply == {"activation_offload": True}
    assert advice.message.startswith("activations are")
    freed = advice.evidence["freed_bytes"]
    assert freed["activation offload"] == max(freed.values()) > freed["activation checkpointing"]
    assert freed["activation checkpointing"] > 0
    (on_cpu,) = memory_advice(config, info, device="cpu")
    assert on_cpu.apply == {"activation_checkpointing": True}
    assert "activation offload" not in on_cpu.evidence["freed_bytes"]
    with Session(config.replace(device="cpu"), model_options=TINY) as s:
        s.run(optimizer_steps=1)
        assert [a.apply for a in s.memory_advice()] == [on_cpu.apply]
        before = s.predict().peak_bytes
        s.update(**advice.apply)  # a GPU's saving, as the prediction states it
        s.run(optimizer_steps=1)
        assert before - s.predict().peak_bytes == freed["activation offload"]


def test_nothing_left_to_switch_on_gives_no_advice() -> None:
    info = build_model("tiny-gpt", **TINY)[3]
    done = TrainConfig(
        optimizer="adam8bit", optimizer_in_backward=True, attention="sdpa",
        activation_checkpointing=True, activation_offload=True, precision="bf16-true",
    )  # fmt: skip
    assert memory_advice(done, info) == []
    with pytest.raises(ValueError, match="config="):
        memory_advice("fp32", info)  # type: ignore[arg-type]


def test_lora_is_said_for_fine_tuning_but_never_the_one_click_change() -> None:
    """A 7B shape under amp-bf16 with checkpointing: 8-bit AdamW is the one-click change;
    LoRA frees more (no gradients or states of the base), and the advice says so with its
    own bytes, predicted by the same path."""

    class SevenB:  # a 7B GPT-style shape, as a prediction reads it
        n_params = 6_738_415_616
        layers, hidden, heads, seq_len, vocab = 32, 4096, 32, 512, 32000

    config = TrainConfig(precision="amp-bf16", activation_checkpointing=True, micro_batch=1)
    (advice,) = memory_advice(config, SevenB())
    assert "lora_rank" not in advice.apply
    base = predict_memory(config, SevenB())
    lora = predict_memory(config.replace(lora_rank=16), SevenB())
    freed = base.peak_bytes - lora.peak_bytes
    assert advice.evidence["freed_bytes"]["LoRA rank 16"] == freed
    assert freed > max(v for k, v in advice.evidence["freed_bytes"].items() if k != "LoRA rank 16")
    assert "if this run fine-tunes, LoRA (lora_rank=16" in advice.message


def test_with_8_bit_states_on_pure_bf16_frees_the_most_and_deepspeed_is_not_offered_it() -> None:
    """8-bit AdamW on already: pure bf16 (no fp32 master copy) halves the weights and the
    gradients, the most left to free; under ZeRO (DeepSpeed refuses pure bf16) it is not
    tried."""
    config = TrainConfig(precision="amp-bf16", optimizer="adam8bit")
    (advice,) = memory_advice(config, 7_000_000_000, device="cuda", capacity_bytes=40 * 2**30)
    assert advice.apply == {"precision": "bf16-true"}
    base = predict_memory(config, 7_000_000_000)
    after = predict_memory(config.replace(precision="bf16-true"), 7_000_000_000)
    assert base.peak_bytes > SHORT_FRACTION * 40 * 2**30  # short on a 40 GiB GPU
    assert advice.evidence["freed_bytes"]["pure bf16 (precision='bf16-true')"] == (
        base.peak_bytes - after.peak_bytes
    )
    assert "pure bf16 (precision='bf16-true') keeps weights" in advice.message
    assert "no fp32 master copy" in advice.message
    zero = memory_advice(TrainConfig(precision="bf16", zero_stage=2), 7_000_000_000, world_size=8)
    assert all("pure bf16" not in name for a in zero for name in a.evidence["freed_bytes"])


def test_pure_bf16_is_offered_only_where_memory_is_short_and_says_what_it_costs() -> None:
    """notebook 06 told an fp32 run peaking at 3.5 MiB, on a machine of GiBs, to drop its
    fp32 master copy, without a word on the lost updates. Pure bf16 is the last resort:
    offered when the predicted peak is above SHORT_FRACTION of the memory the run has,
    with its cost; else the next technique, and the evidence says why."""
    info = build_model("tiny-gpt", **TINY)[3]
    config = TrainConfig(micro_batch=8)
    peak = predict_memory(config, info, device="cpu").peak_bytes
    (roomy,) = memory_advice(config, info, device="cpu", capacity_bytes=100 * peak)
    assert roomy.apply != {"precision": "bf16-true"} and "bf16" not in roomy.message
    assert "1.0% of the" in roomy.evidence["not_offered"][PURE_BF16]
    assert roomy.evidence["capacity_bytes"] == 100 * peak
    near = int(peak / (SHORT_FRACTION + 0.01))  # the peak just above the threshold
    (short,) = memory_advice(config, info, device="cpu", capacity_bytes=near)
    assert short.apply == {"precision": "bf16-true"}
    assert "no fp32 master copy" in short.message and "small updates" in short.message
    assert f"is {100 * peak / near:.0f}% of the" in short.message
    assert "this machine's RAM" in short.message
    (gpu,) = memory_advice(config, info, device="cuda", capacity_bytes=near)
    assert "this GPU has" in gpu.message
    unknown = memory_advice(config, info, device="cuda")  # no CUDA here: not known
    assert all(a.apply != {"precision": "bf16-true"} for a in unknown)
    for bad in (0, -1, 1.5, True, "80GB"):
        with pytest.raises(ValueError, match=r"capacity_bytes=.*: must be an integer >= 1"):
            memory_advice(config, info, capacity_bytes=bad)  # type: ignore[arg-type]
