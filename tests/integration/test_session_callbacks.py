"""What an `on_record` callback may call: a refused call leaves the run as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench import Session, TrainConfig
from workbench.train.session import SessionStateError


def _session() -> Session:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    return Session(
        TrainConfig(micro_batch=8), model=model, data=data, loss_fn=nn.CrossEntropyLoss()
    )


@pytest.mark.parametrize("background", [False, True], ids=["run", "start"])
def test_profile_from_a_callback_is_refused_and_the_run_goes_on(background: bool) -> None:
    refused: list[BaseException] = []

    def profile_at_step_3(record) -> None:
        if record.step == 3:
            try:
                s.profile(steps=1)
            except SessionStateError as exc:
                refused.append(exc)

    with _session() as s:
        s.on_record(profile_at_step_3)
        if background:
            s.start(6)
            assert s.wait(timeout=120) == "idle"
        else:
            s.run(6)
        assert s.state == "idle" and s.step == 6  # not left paused at step 3
        [exc] = refused
        assert "cannot profile from the training loop's thread" in str(exc)
        assert s.failure is None
