"""What a Session (or a launch's ranks) cannot run of a valid config, as data: each problem
names its setting and value, and the text is made from them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.config import (
    NOT_IN_SESSION,
    SESSION_OPTIMIZERS,
    ConfigError,
    OptimizerName,
    SettingProblem,
    TrainConfig,
    runtime_problems,
)
from workbench.train.changes import session_problems


@pytest.mark.parametrize("optimizer", OptimizerName.choices())
def test_runtime_problems_carry_field_value_and_message(optimizer, tmp_path) -> None:
    """Each problem is data (the setting, its value, what is allowed); its text is made
    from them, naming the nearest optimizer a Session trains as a setting."""
    missing = str(tmp_path / "not-here")
    settings = [
        {},
        {"zero_stage": 3, "offload_params": "nvme", "nvme_path": missing},
        {"zero_stage": 2, "offload_optimizer": "nvme", "nvme_path": missing},
        {"zero_stage": 3, "offload_params": "nvme", "nvme_path": str(tmp_path)},
        {"offload_optimizer": "nvme", "nvme_path": missing},
    ]
    trains = OptimizerName(optimizer) in SESSION_OPTIMIZERS
    for changes in settings:
        try:
            config = TrainConfig(optimizer=optimizer, **changes)
        except ConfigError:  # a config TrainConfig itself refuses has no runtime problems
            continue
        found = runtime_problems(config)
        assert all(isinstance(p, SettingProblem) for p in found)
        expected = [] if trains else [("optimizer", optimizer)]
        if changes.get("nvme_path") == missing:
            expected.append(("nvme_path", missing))
        assert [(p.field, p.value) for p in found] == expected
        for p in found:
            assert str(p) == f"{p.field}={p.value!r}: {p.message.replace('`', '')}"
            if p.field == "nvme_path":
                assert p.message == "must be an existing writable directory on this machine"
            else:
                _, nearest = NOT_IN_SESSION[OptimizerName(optimizer)]
                assert p.message.startswith("cannot train here: ")
                assert f"the nearest a Session trains is `optimizer`={nearest.value!r}" in (
                    p.message
                )
                assert p.render(name=lambda n: "--" + n.replace("_", "-"), sep=" ").startswith(
                    f"--optimizer {optimizer!r}: cannot train here: "
                )
        if found:
            assert ConfigError(found).problems == found


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
        ("activation_checkpointing", "full"),
    ]
    text = str(ConfigError(found))
    assert "optimizer='lamb': cannot train here" in text
    assert "activation_checkpointing='full': the model has no checkpointable blocks" in text
