"""The step reads device values in one place, once per optimizer step.

On a GPU every read of a device value as a Python number (`.item()`, `float(t)`,
`.tolist()`) makes the host wait for the device. `workbench.train.step.read_device_values`
is the one place the plain loop does it (the loss and the gradient norm together, before
the optimizer step); these tests hold the CPU loop to that structure, so it holds on CUDA,
where `benchmarks/gpu_check.py` counts the syncs themselves. Under loss scaling
(amp-fp16) the scaler's own checks read too; that setup is outside the bound.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from typing import Any

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.train import step as step_module

MLP = {"hidden": 16, "depth": 2, "samples": 256}
STEPS = 5


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], Counter[str]]:
    """(calls of read_device_values per run, reads of tensor values by workbench code
    outside it, by function)."""
    calls = [0]
    outside: Counter[str] = Counter()
    real = step_module.read_device_values

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(step_module, "read_device_values", counted)
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def spy(self: torch.Tensor, *a: Any, _original: Any = original, **k: Any) -> Any:
            caller = sys._getframe(1)
            module = caller.f_globals.get("__name__", "")
            if module.startswith("workbench.") and caller.f_code.co_name != "read_device_values":
                outside[f"{module}.{caller.f_code.co_name}"] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return calls, outside


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"precision": "amp-bf16"},
        {"clip_grad_norm": 0.5},
        {"grad_accum": 3, "clip_grad_norm": 1.0},
        {"precision": "bf16-true"},
    ],
    ids=["fp32", "amp-bf16", "clipping", "accumulation+clipping", "bf16-true"],
)
def test_one_read_per_optimizer_step(monkeypatch: pytest.MonkeyPatch, settings: dict) -> None:
    cfg = TrainConfig(micro_batch=8, seed=1, **settings)
    with Session(cfg, model="mlp", model_options=MLP, device="cpu") as s:
        s.run(1)  # the first step also measures model-state bytes
        calls, outside = _spy_reads(monkeypatch)
        records = s.run(STEPS)
        monkeypatch.undo()
    assert calls[0] == STEPS
    assert not outside, f"device values read outside read_device_values: {dict(outside)}"
    # what the record carries is all there
    for r in records:
        assert math.isfinite(r.loss) and r.grad_norm is not None and r.grad_norm > 0
        assert r.step_seconds > 0 and 0 <= r.data_seconds <= r.step_seconds
        assert r.samples_per_s > 0 and r.rss_bytes and r.lr > 0


def test_the_read_gives_the_loss_and_the_norm_torch_computes() -> None:
    """The record's gradient norm is torch's get_total_norm of the gradients the
    optimizer applies (before clipping), and its loss the mean of the micro-batch losses."""
    cfg = TrainConfig(micro_batch=8, grad_accum=2, seed=2, clip_grad_norm=0.1)
    with Session(cfg, model="mlp", model_options=MLP, device="cpu") as s:
        backend = s.backend
        seen: list[float] = []
        real_prepare = backend.prepare_step

        def prepare() -> torch.Tensor | None:
            grads = [p.grad for p in s.model.parameters() if p.grad is not None]
            seen.append(float(torch.nn.utils.get_total_norm(grads)))
            return real_prepare()

        backend.prepare_step = prepare  # type: ignore[method-assign]
        records = s.run(3)
    assert [r.grad_norm for r in records] == seen


def test_a_nan_loss_is_caught_by_the_read_before_the_optimizer_step() -> None:
    cfg = TrainConfig(micro_batch=8, seed=3, clip_grad_norm=1.0)
    with Session(cfg, model="mlp", model_options=MLP, device="cpu") as s:
        s.run(1)
        with torch.no_grad():
            next(s.model.parameters())[0, 0] = float("nan")
        poisoned = {k: v.clone() for k, v in s.model.state_dict().items()}
        s.run(1)
        assert s.state == "paused" and s.history[-1].skipped
        assert math.isnan(s.history[-1].loss)
        after = s.model.state_dict()
        # nothing applied: the weights are the poisoned ones, untouched by the optimizer
        for k, v in poisoned.items():
            same = (after[k] == v) | (after[k].isnan() & v.isnan())
            assert bool(same.all()), k
