"""A Session dropped without `close()` (garbage-collected) still leaves the trained weights
in your module, on the engines that train a copy of it (pure bf16, FSDP), and its whole
run log on disk with its writer thread ended, and it is not kept alive to do so."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench import Session, TrainConfig
from workbench.train import runlog


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


def test_a_dropped_session_writes_its_whole_run_log_and_ends_its_writer(tmp_path):
    model = nn.Sequential(nn.Linear(8, 4))
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    s = Session(
        TrainConfig(micro_batch=8, checkpoint_dir=str(tmp_path)),
        model=model,
        data=data,
        loss_fn=nn.CrossEntropyLoss(),
    )
    s.run(3)
    s.update(lr=1e-2)  # an event ("change")
    s.run(2)
    records, events = len(s.history), len(s.events)
    (writer,) = [t for t in threading.enumerate() if t.name == f"workbench-log-{s.id}"]
    path = s.log_path
    alive = weakref.ref(s)
    del s
    gc.collect()
    assert alive() is None  # the log it hands to its finalizer keeps it alive no more
    assert not writer.is_alive()
    kinds = [line["type"] for line in runlog.iter_lines(path)]
    assert (kinds.count("record"), kinds.count("event")) == (records, events) == (5, 1)
    assert [r.step for r in runlog.read_records(path)] == [1, 2, 3, 4, 5]
