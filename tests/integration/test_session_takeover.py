"""A new Session on a module another Session trains closes that one only once it is sure
to start: a refused one (settings, data, a checkpoint of another model) leaves it running."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.train.batches import DataContractError


def _mlp(hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def _data() -> TensorDataset:
    return TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))


def _running(model: nn.Module) -> Session:
    s = Session(
        TrainConfig(micro_batch=8), model=model, data=_data(), loss_fn=nn.CrossEntropyLoss()
    )
    s.start()
    return s


def _still_training(s: Session) -> None:
    """`s` runs on with its settings (three more steps), then is closed."""
    assert s.state == "running" and s.config == TrainConfig(micro_batch=8)
    step = s.step
    while s.step < step + 3:
        assert s.state == "running"
        time.sleep(0.001)
    s.close()


@pytest.mark.parametrize(
    "refused",
    [
        pytest.param(
            lambda m: Session(
                TrainConfig(micro_batch=8, attention="sdpa"),
                model=m,
                data=_data(),
                loss_fn=nn.CrossEntropyLoss(),
            ),
            id="settings",
        ),
        pytest.param(
            lambda m: Session(
                TrainConfig(micro_batch=8),
                model=m,
                data=TensorDataset(torch.randn(64, 8)),  # no targets: not a pair
                loss_fn=nn.CrossEntropyLoss(),
            ),
            id="data",
        ),
    ],
)
def test_a_refused_new_session_leaves_the_running_one_training(refused):
    model = _mlp()
    old = _running(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "closing Session" warning either
        with pytest.raises((ConfigError, DataContractError)):
            refused(model)
    assert old.state == "running"
    _still_training(old)


def test_a_refused_resume_of_another_model_leaves_the_running_one_training(tmp_path):
    other = _mlp(hidden=32)
    with Session(
        TrainConfig(micro_batch=8), model=other, data=_data(), loss_fn=nn.CrossEntropyLoss()
    ) as s:
        s.run(1)
        path = s.save_checkpoint(tmp_path / "other.pt")
    model = _mlp(hidden=16)
    old = _running(model)
    with pytest.raises(ValueError) as refused:
        Session.resume_from(path, model=model, data=_data(), loss_fn=nn.CrossEntropyLoss())
    message = str(refused.value)
    assert str(path) in message and "model= (your Sequential)" in message
    assert "0.weight is (32, 8) there, (16, 8) in the model" in message
    assert old.state == "running"
    _still_training(old)


def test_a_resume_with_other_names_names_the_missing_weights(tmp_path):
    with Session(
        TrainConfig(micro_batch=8), model=_mlp(), data=_data(), loss_fn=nn.CrossEntropyLoss()
    ) as s:
        s.run(1)
        path = s.save_checkpoint(tmp_path / "mlp.pt")
    renamed = nn.Sequential()
    renamed.add_module("first", nn.Linear(8, 16))
    renamed.add_module("act", nn.ReLU())
    renamed.add_module("last", nn.Linear(16, 4))
    with pytest.raises(
        ValueError, match=r"no weights for first\.weight, first\.bias, last\.weight and 1 more"
    ):
        Session.resume_from(path, model=renamed, data=_data(), loss_fn=nn.CrossEntropyLoss())


def test_the_take_over_warning_points_at_the_line_that_built_the_new_session():
    model = _mlp()
    old = _running(model)
    with pytest.warns(UserWarning, match="closing Session") as caught:
        new = Session(
            TrainConfig(micro_batch=8), model=model, data=_data(), loss_fn=nn.CrossEntropyLoss()
        )
    assert old.state == "closed" and new.state == "idle"
    assert caught[0].filename == __file__
    new.close()
