"""The Session's prediction follows the attention kernel torch runs on this CPU: sdpa with
dropout runs its math kernel (the s x s weights kept), without dropout the CPU's flash
kernel; the measured activations meet the prediction for eager and sdpa, with and without
dropout, and the report says which kernel was counted."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench import Session, TrainConfig


def _saved(dtype: torch.dtype, dropout: float) -> tuple[str, int]:
    """(the backward node of one sdpa call, the bytes it saves) on this CPU."""
    q, k, v = (torch.randn(2, 4, 64, 32, dtype=dtype, requires_grad=True) for _ in range(3))
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    return out.grad_fn.name(), sum(saved.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_runs_its_flash_kernel_without_dropout_and_math_with(dtype) -> None:
    as2b, sbh = 2 * 4 * 64 * 64, 2 * 4 * 64 * 32
    node, without = _saved(dtype, 0.0)
    assert "FlashAttentionForCpu" in node
    # q, k, v, the output and the fp32 log-sum-exp: no s x s tensor
    assert without == 4 * sbh * dtype.itemsize + 2 * 4 * 64 * 4
    node, with_dropout = _saved(dtype, 0.1)
    assert "FlashAttention" not in node
    # the math kernel, in fp32 on a CPU: softmax output, dropout mask, dropped weights
    assert with_dropout >= 3 * as2b * 4


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_measured_activations_meet_the_kernel_torch_runs_here(precision, attention, dropout):
    cfg = TrainConfig(micro_batch=8, precision=precision, attention=attention)
    with Session(cfg, model_options={"dropout": dropout}) as s:
        report = s.memory()
    kernel = report.predicted.attention
    expected = {"eager": "megatron", "sdpa": "math" if dropout else "sdpa"}[attention]
    assert kernel == expected
    said = [n for n in report.notes if "the prediction counts that kernel" in n]
    assert len(said) == (1 if expected == "math" else 0)
    predicted = report.predicted_activation_bytes
    ratio = report.activation_bytes / predicted
    assert 0.85 <= ratio <= 1.15, (report.activation_bytes, predicted, ratio)
    if precision == "fp32":  # every tensor fp32: the kernel's terms exact to 1%
        assert report.activation_bytes == pytest.approx(predicted, rel=0.01)
    else:  # amp: with the fp32 residual stream the formula counts (test_memory.py)
        assert report.activation_bytes == pytest.approx(predicted, rel=0.02)


def test_a_gpu_prediction_keeps_the_fused_kernel() -> None:
    from workbench.models import build_model
    from workbench.prediction import predict_memory

    info = build_model("tiny-gpt")[3]
    cfg = TrainConfig(micro_batch=8, attention="sdpa")
    gpu = predict_memory(cfg, info, device="cuda")
    cpu = predict_memory(cfg, info, device="cpu")
    assert (gpu.attention, cpu.attention) == ("sdpa", "math")
    assert cpu.activation_bytes > gpu.activation_bytes
