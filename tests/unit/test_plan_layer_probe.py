"""The GPU probe measures one layer of the planned model at its real width, sequence and
micro-batch (`probe_layer`), not the 4 x 64 toy; a device too small for it is refused."""

from __future__ import annotations

import pytest

from workbench.planner import plan
from workbench.train.measure.plan_probe import probe_layer

TINY = {"layers": 4, "hidden": 128, "heads": 4, "vocab": 1000, "seq_len": 64, "gpu": "h100",
        "gpus": 1, "global_batch": 2, "precision": "fp32"}  # fmt: skip


def test_one_layer_of_the_planned_model_is_measured_at_its_width() -> None:
    r = plan(**TINY)
    got = probe_layer(r, steps=3, device="cpu")
    assert (got.hidden, got.heads, got.seq_len) == (128, 4, 64)  # the planned shape
    assert got.micro_batch == r.best.settings["micro_batch"]
    assert got.ffn_hidden == 4 * 128 and got.device == "cpu"
    # its FLOPs are the one count's of the layer built: 4 h^2 + 2 h f weights, 12 h s
    per_token = 6 * (4 * 128 * 128 + 2 * 128 * 512) + 12 * 128 * 64
    assert got.flops_per_s == pytest.approx(per_token * got.micro_batch * 64 / got.seconds)
    assert got.efficiency is None  # no catalog peak on a CPU
    assert "width 128" in got.text() and "no efficiency" in got.text()


def test_a_device_too_small_for_the_layer_is_refused_saying_so() -> None:
    r = plan(model="llama-3-8b", gpu="h100", gpus=8, seq_len=8192, global_batch=16)
    with pytest.raises(ValueError, match=r"one layer of the planned model \(width 4096, "
                       r"sequence 8192, micro-batch 1\) needs .* GiB free: too small"):  # fmt: skip
        probe_layer(r, device="cpu", memory_bytes=1 << 30)
    with pytest.raises(ValueError, match="steps=1: must be an integer from 2 to 100"):
        probe_layer(r, steps=1)


@pytest.mark.gpu
def test_on_a_gpu_a_layer_of_llama_3_8b_runs_at_a_share_of_the_peak_not_launch_bound() -> None:
    """One Llama 3 8B layer at 4096 tokens in bf16 keeps a catalog GPU busy: its efficiency
    is a real share of the peak (the toy's was 10^-4 to 10^-3)."""
    import torch

    from workbench.estimate import find_gpu

    gpu = find_gpu(torch.cuda.get_device_name(0))
    assert not isinstance(gpu, str), gpu
    # Llama 3 8B's layer shape (width 4096, 32 heads, SwiGLU 14336), two layers: it fits
    r = plan(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, mlp="swiglu",
             norm="rmsnorm", bias="none", positions="rotary", vocab=32000, seq_len=4096,
             gpu=gpu.name, gpus=1, global_batch=2)  # fmt: skip
    got = probe_layer(r)
    assert got.efficiency is not None and 0.1 < got.efficiency < 1, got.text()


def test_grouped_query_attention_and_swiglu_are_built_at_the_planned_widths() -> None:
    r = plan(layers=2, hidden=128, heads=8, kv_heads=2, ffn_hidden=256, mlp="swiglu",
             norm="rmsnorm", bias="none", positions="rotary", vocab=500, seq_len=32,
             gpu="h100", gpus=1, global_batch=2, precision="fp32")  # fmt: skip
    got = probe_layer(r, steps=2, device="cpu")
    weights = 128 * (128 + 2 * 2 * 16) + 128 * 128 + 3 * 128 * 256  # q, k, v; out; SwiGLU
    per_token = 6 * weights + 12 * 128 * 32
    assert got.flops_per_s == pytest.approx(per_token * got.micro_batch * 32 / got.seconds)
