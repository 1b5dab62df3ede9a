"""An observer's prediction and the memory advice predict for the device the run is on:
on a CPU with dropout, torch's sdpa runs its math kernel (which keeps the s x s attention
weights), so the CPU figure is the larger one, as `predict_memory(device="cpu")` says."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from workbench.config import TrainConfig
from workbench.integrations.observer import Observer
from workbench.prediction import predict_memory
from workbench.train.measure import memory_advice as advice_module

INFO = SimpleNamespace(
    n_params=10**6, layers=2, hidden=64, heads=4, seq_len=256, vocab=96, dropout=0.1
)


def test_an_observer_predicts_for_the_device_its_model_is_on(monkeypatch) -> None:
    config = TrainConfig(attention="sdpa", micro_batch=4)
    observer = Observer(torch.nn.Linear(4, 4), config=config)
    monkeypatch.setattr(observer, "description", lambda: INFO)
    on_cpu = predict_memory(config, INFO, device="cpu")
    on_gpu = predict_memory(config, INFO, device="cuda")
    assert on_cpu.activation_bytes > on_gpu.activation_bytes  # the math kernel's weights
    assert observer.predict().activation_bytes == on_cpu.activation_bytes


def test_the_memory_advice_predicts_for_its_device(monkeypatch) -> None:
    seen: list[object] = []
    real = advice_module.predict_memory

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device"))
        return real(*args, **kwargs)

    monkeypatch.setattr(advice_module, "predict_memory", spy)
    config = TrainConfig(attention="sdpa", micro_batch=4)
    advice_module.memory_advice(config, INFO, device="cpu")
    advice_module.memory_advice(config, INFO, device="cuda")
    assert "cpu" in seen and "cuda" in seen and None not in seen
