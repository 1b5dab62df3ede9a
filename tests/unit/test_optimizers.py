"""The optimizer rows (`workbench.optimizers`) say what the tables said before them: state
bytes, families, state keys, fused-only, DeepSpeed names, why a Session refuses one."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.choices import NOT_IN_SESSION, SESSION_OPTIMIZERS, OptimizerName
from workbench.optimizers import OPTIMIZERS, ROWS, row

STATE_BYTES = {
    "adamw": 8,
    "adam": 8,
    "sgd": 4,
    "sgd-nomomentum": 0,
    "adam8bit": 2,
    "paged-adam8bit": 2,
    "lamb": 8,
    "lion": 4,
    "adagrad": 4,
    "onebitadam": 8,
    "zerooneadam": 12,
    "onebitlamb": 12,
}
FAMILY = {
    "adamw": "adam",
    "adam": "adam",
    "sgd": "sgd",
    "sgd-nomomentum": None,
    "adam8bit": "adam",
    "paged-adam8bit": "adam",
}
FUSED_ONLY = {
    "lamb",
    "lion",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
    "adam8bit",
    "paged-adam8bit",
}
DEEPSPEED = {
    "adamw": "AdamW",
    "adam": "Adam",
    "sgd": "SGD",
    "sgd-nomomentum": "SGD",
    "adagrad": "Adagrad",
    "lamb": "Lamb",
    "lion": "Lion",
    "onebitadam": "OneBitAdam",
    "zerooneadam": "ZeroOneAdam",
    "onebitlamb": "OneBitLamb",
}
OLD_NAMES = set(STATE_BYTES)


def test_every_old_optimizer_has_its_row() -> None:
    assert set(ROWS) >= OLD_NAMES
    assert {o.value for o in OptimizerName} == set(ROWS)


@pytest.mark.parametrize("name", sorted(OLD_NAMES))
def test_row_keeps_the_old_tables(name: str) -> None:
    r = ROWS[name]
    assert r.state_bytes_per_param == STATE_BYTES[name]
    assert r.fused_only is (name in FUSED_ONLY)
    assert r.deepspeed_name == DEEPSPEED.get(name)
    assert r.eight_bit is (name in ("adam8bit", "paged-adam8bit"))
    assert r.error_feedback is (name in ("onebitadam", "zerooneadam", "onebitlamb"))
    assert r.deepspeed_fused is (name not in ("sgd", "sgd-nomomentum"))
    if name in FAMILY:
        assert r.family == FAMILY[name]
        assert r.in_session


def test_session_optimizers_and_refusals_read_the_rows() -> None:
    assert [o.value for o in SESSION_OPTIMIZERS][:6] == list(FAMILY)
    assert {o.value for o in SESSION_OPTIMIZERS} == {r.name for r in OPTIMIZERS if r.in_session}
    assert {o.value: (why, nearest.value) for o, (why, nearest) in NOT_IN_SESSION.items()} == {
        r.name: r.not_in_session for r in OPTIMIZERS if r.not_in_session
    }


def test_aliases_find_their_row() -> None:
    assert row("adamw8bit").name == "adam8bit"
    assert row("paged_adamw8bit").name == "paged-adam8bit"
    assert row(OptimizerName.ADAMW).name == "adamw"
    assert OptimizerName("adamw8bit") is OptimizerName.ADAM8BIT
    with pytest.raises(KeyError):
        row("nope")


def test_every_session_row_can_be_built_or_says_why() -> None:
    for r in OPTIMIZERS:
        assert (r.factory is not None) is r.in_session, r.name
        assert (r.not_in_session is None) is r.in_session, r.name
        if r.engines and set(r.engines) != {
            "plain",
            "deepspeed",
            "fsdp",
            "tensor-parallel",
            "pipeline",
        }:
            assert r.engines_reason, r.name


def _class(path: str) -> type:
    import importlib

    module, _, name = path.partition(":")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


def test_a_sharded_factory_is_its_rows_class_for_fsdps_shards() -> None:
    """A row naming a class for sharded (DTensor) parameters trains under FSDP, and that
    class is its factory's own, subclassed (the same keywords and states)."""
    sharded = [r for r in OPTIMIZERS if r.sharded_factory]
    assert [r.name for r in sharded] == ["adafactor"]
    for r in sharded:
        assert r.factory and "fsdp" in r.engines
        assert issubclass(_class(r.sharded_factory or ""), _class(r.factory))


def test_the_export_refuses_adafactor_under_fsdp_by_its_rows_reason(tmp_path: Any) -> None:
    """The standalone FSDP job builds its optimizer from its own copy of the rows, without
    the sharded step: it refuses Adafactor by the row's export reason, naming it."""
    from workbench.config import TrainConfig
    from workbench.export import ExportError, export_job

    reason = row("adafactor").export_reason or ""
    assert "sharded step" in reason
    config = TrainConfig(optimizer="adafactor", fsdp="full_shard")
    with pytest.raises(ExportError, match=r"optimizer='adafactor': the exported jobs") as err:
        export_job(config, format="fsdp", gpus=2, out_dir=tmp_path)
    assert reason in str(err.value)


def test_deepspeed_tables_read_the_rows() -> None:
    from workbench.deepspeed.keys import (
        OPTIMIZER_OF_TYPE,
        TYPE_OF_OPTIMIZER,
        ZERO_TESTED_OPTIMIZERS,
    )

    assert {o.value for o in ZERO_TESTED_OPTIMIZERS} == {"adamw", "adam", "adagrad", "lion"}
    assert {o.value: t for o, t in TYPE_OF_OPTIMIZER.items()} == DEEPSPEED
    assert {t: o.value for t, o in OPTIMIZER_OF_TYPE.items()} == {
        "adamw": "adamw",
        "adagrad": "adagrad",
        "lamb": "lamb",
        "lion": "lion",
        "onebitadam": "onebitadam",
        "zerooneadam": "zerooneadam",
        "onebitlamb": "onebitlamb",
    }


def test_the_job_scripts_copy_of_the_rows_is_equal() -> None:
    from workbench.export.job_common import OPTIMIZER_CLASSES

    assert {
        r.name: (r.factory, r.factory_kwargs, r.library)
        for r in OPTIMIZERS
        if r.in_session and r.export_reason is None and "fsdp" in r.engines
    } == OPTIMIZER_CLASSES


def test_the_type_checkers_members_are_rows() -> None:
    """`OptimizerName` is made from the rows at run time; the members the type checker
    sees (written out in choices.py) must each be a row's."""
    import ast
    from pathlib import Path

    import workbench.choices

    tree = ast.parse(Path(workbench.choices.__file__).read_text(encoding="utf-8"))
    stub = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == "OptimizerName"
    )
    members = {
        t.id: node.value.value
        for node in stub.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert members == {r.member: r.name for r in OPTIMIZERS if r.member in members}
    assert {getattr(OptimizerName, m).value for m in members} == set(members.values())
