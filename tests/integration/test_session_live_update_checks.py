"""A live Session's checks refuse what changes, not what is said: a setting given its
present value is accepted; a refusal names the field the user gave; FSDP units that name
no module are refused at `update()`; a checkpoint it cannot write (an OSError, as a full
disk is) and a sampler that is none are refused by name, and the session trains on."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.models import build_model
from workbench.train.changes import session_problems


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_an_update_to_the_present_values_is_accepted_and_changes_nothing() -> None:
    s = Session(TrainConfig(micro_batch=2), model="tiny-gpt")
    try:
        s.run(optimizer_steps=1)
        before = s.config
        for kw in ({"pp": 1}, {"tp": 1}, {"documents": s.config.documents},
                   {"sequence_parallel": False}, {"pp": 1, "tp": 1, "lr": s.config.lr}):  # fmt: skip
            s.update(**kw)
        s.run(optimizer_steps=1)
        assert s.config == before and s.step == 2
        with pytest.raises(ConfigError, match="pp=2: cannot change on a live session"):
            s.update(pp=2, grad_accum=2)
    finally:
        s.close()


def test_a_live_only_refusal_is_said_as_that_not_as_what_the_value_would_need() -> None:
    s = Session(TrainConfig(micro_batch=2), model="mlp", model_options={"hidden": 16, "depth": 1})
    try:
        with pytest.raises(ConfigError) as refused:
            s.update(pp=2)  # pp=2 would also need grad_accum >= 2: beside the point live
        assert str(refused.value).startswith("invalid setting: pp=2: cannot change on a live")
        with pytest.raises(ConfigError) as refused:
            s.update(pp=2, lr=-1.0)  # the other change's own problem is said too
        assert [p.field for p in refused.value.problems] == ["pp", "lr"]
        assert s.config == TrainConfig(micro_batch=2) and s.pending_changes == {}
    finally:
        s.close()


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"pp": "x"}, "pp='x': must be an integer >= 1, at most 64"),
        ({"pp": 2.0}, "pp=2.0: must be an integer >= 1, at most 64"),
        ({"tp": -1}, "tp=-1: must be an integer >= 1, at most 64"),
        ({"sequence_parallel": "yes"}, "sequence_parallel='yes': must be True or False"),
        (
            {"documents": "packd"},
            "documents='packd': must be one of stream, padded, packed; did you mean 'packed'?",
        ),
    ],
)
def test_a_value_the_setting_never_takes_is_refused_as_that_not_as_a_live_change(
    changes: dict[str, Any], said: str
) -> None:
    s = Session(TrainConfig(micro_batch=2), model="mlp", model_options={"hidden": 16, "depth": 1})
    try:
        with pytest.raises(ConfigError) as refused:
            s.update(**changes)
        assert str(refused.value).startswith(f"invalid setting: {said}")
        assert "cannot change on a live session" not in str(refused.value)
        (name,) = changes
        other = "pp" if name == "tp" else "tp"
        with pytest.raises(ConfigError) as refused:  # a valid value: the live refusal, beside it
            s.update(**changes, **{other: 2})
        found = {p.field: p.message for p in refused.value.problems}
        assert found[name].startswith(said.split(": ", 1)[1])
        assert found[other].startswith("cannot change on a live session")
        s.update(documents="STREAM")  # the present value, in another case: changes nothing
        assert s.config == TrainConfig(micro_batch=2) and s.pending_changes == {}
    finally:
        s.close()


def test_a_sequence_parallel_change_is_refused_by_its_own_name() -> None:
    model = build_model("tiny-gpt")[0]
    config = TrainConfig(tp=2, sequence_parallel=True, micro_batch=2)
    found = session_problems(
        config,
        {"sequence_parallel"},
        model=model,
        device=torch.device("cpu"),
        world_size=2,
        data=None,
    )
    named = [p.field for p in found if "cannot change on a live session" in p.message]
    assert named == ["sequence_parallel"]


def test_fsdp_units_naming_no_module_are_refused_at_update_and_the_session_keeps_on() -> None:
    s = Session(TrainConfig(micro_batch=2), model="tiny-gpt")
    try:
        s.run(optimizer_steps=1)
        with pytest.raises(ConfigError, match="fsdp_units='nosuchmodule': 'nosuchmodule' "
                           "matches no module of the model"):  # fmt: skip
            s.update(fsdp="full_shard", fsdp_units="nosuchmodule")
        assert str(s.config.fsdp) == "off"
        s.run(optimizer_steps=1)
        assert s.step == 2 and str(s.config.fsdp) == "off"
    finally:
        s.close()


def test_a_checkpoint_it_cannot_write_is_refused_by_path_and_training_goes_on(
    tmp_path: Any,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder", encoding="utf-8")
    s = Session(TrainConfig(micro_batch=2), model="tiny-gpt")
    try:
        s.run(optimizer_steps=1)
        with pytest.raises(OSError, match=r"path='.*a-file/x\.pt': cannot write the checkpoint"):
            s.save_checkpoint(str(blocked / "x.pt"))
        trained = _weights(s.model)
        s.run(optimizer_steps=1)
        assert s.step == 2
        assert any(not torch.equal(trained[k], v) for k, v in _weights(s.model).items())
        assert list(tmp_path.iterdir()) == [blocked]  # nothing half-written beside it
    finally:
        s.close()


def test_a_sampler_that_is_none_is_refused_before_the_session_takes_the_module() -> None:
    module, data, loss_fn, _ = build_model("tiny-gpt")
    with pytest.raises(ValueError, match=r"sampler=5: must be a workbench\.monitor\.Sampler"):
        Session(TrainConfig(micro_batch=2), model=module, data=data, loss_fn=loss_fn, sampler=5)
    s = Session(TrainConfig(micro_batch=2), model=module, data=data, loss_fn=loss_fn)
    s.run(optimizer_steps=1)  # the module was left free to take, and trains
    s.close()
