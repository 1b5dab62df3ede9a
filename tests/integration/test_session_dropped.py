"""A Session dropped without `close()` (garbage-collected) still leaves the trained weights
in your module, on the engines that train a copy of it (pure bf16, FSDP), and it is not
kept alive to do so."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench import Session, TrainConfig


def _full(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).float().cpu().clone()


@pytest.mark.parametrize("settings", [{"precision": "bf16-true"}, {"fsdp": "full_shard"}])
def test_a_dropped_session_leaves_the_trained_weights_in_the_module(settings):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    s = Session(
        TrainConfig(micro_batch=8, lr=1e-2, **settings),
        model=model,
        data=data,
        loss_fn=nn.CrossEntropyLoss(),
    )
    s.run(3)
    assert s.model is not model  # the engine trains a copy
    trained = {k: _full(v) for k, v in s.model.state_dict().items()}
    alive = weakref.ref(s)
    del s
    gc.collect()
    assert alive() is None  # nothing keeps the dropped session alive
    for name, value in model.state_dict().items():
        assert torch.equal(value.float(), trained[name]), name
        assert not torch.equal(value, initial[name]), name
