"""What a Session (or a launch's ranks) cannot run of a valid config, as data: each problem
names its setting and value, and the text is made from them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.config import (
    ConfigError,
    OptimizerName,
    SettingProblem,
    TrainConfig,
    runtime_problems,
)
from workbench.train.changes import runtime_setting_problems, session_problems


@pytest.mark.parametrize("optimizer", OptimizerName.choices())
def test_runtime_problems_as_data_say_what_the_config_module_says(optimizer, tmp_path) -> None:
    settings = [
        {},
        {"zero_stage": 3, "offload_params": "nvme", "nvme_path": "/no/such/folder"},
        {"zero_stage": 2, "offload_optimizer": "nvme", "nvme_path": "/x"},
        {"zero_stage": 3, "offload_params": "nvme", "nvme_path": str(tmp_path)},
        {"offload_optimizer": "nvme", "nvme_path": "/no/such/folder"},
    ]
    for changes in settings:
        try:
            config = TrainConfig(optimizer=optimizer, **changes)
        except ConfigError:  # a config TrainConfig itself refuses has no runtime problems
            continue
        typed = runtime_setting_problems(config)
        assert [str(p) for p in typed] == runtime_problems(config)
        assert {p.field for p in typed} <= {"optimizer", "nvme_path"}


def test_session_problems_name_their_setting() -> None:
    config = TrainConfig(device="cpu", optimizer="lamb", activation_checkpointing=True)
    data = torch.utils.data.TensorDataset(torch.randn(4, 2), torch.randn(4, 2))
    found = session_problems(
        config,
        set(),
        model=nn.Linear(2, 2),
        device=torch.device("cpu"),
        world_size=1,
        data=data,
    )
    assert all(isinstance(p, SettingProblem) for p in found)
    assert [(p.field, p.value) for p in found] == [
        ("optimizer", "lamb"),
        ("activation_checkpointing", True),
    ]
    text = str(ConfigError(found))
    assert "optimizer='lamb': cannot train here" in text
    assert "activation_checkpointing=True: the model has no checkpointable blocks" in text
