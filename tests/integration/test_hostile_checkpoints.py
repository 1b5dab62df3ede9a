"""A shared checkpoint is data: whatever it names, loading it imports and runs nothing the
file chose. A factory the file names is refused unless the caller trusts the file, and a
payload or manifest of the wrong shape is named, never a traceback (hypothesis)."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import Session, TrainConfig
from workbench.compress.checkpoint import load_trained
from workbench.models.spec import UntrustedSpecError
from workbench.train import checkpoints as ckpt

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "40"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real checkpoint of a small mlp (its payload, for crafting others from it)."""
    root = tmp_path_factory.mktemp("saved")
    cfg = TrainConfig(micro_batch=2, seed=3)
    with Session(cfg, model="mlp", model_options={"samples": 64, "hidden": 16, "depth": 1}) as s:
        s.run(1)
        path = s.save_checkpoint(str(root / "good.pt"))
    payload = ckpt.load(path)
    payload.pop("path")
    payload.pop("manifest")
    return payload


def _craft(payload: dict[str, Any], folder: Path, **changes: Any) -> Path:
    crafted = copy.deepcopy(payload)
    crafted.update(changes)
    return ckpt.save(crafted, folder / "step-00000001.pt")


def test_a_checkpoint_naming_os_system_runs_nothing(saved, tmp_path):
    target = tmp_path / "pwned"
    path = _craft(
        saved,
        tmp_path / "ck",
        model={"name": "os:system", "options": {"command": f"touch {target}"}},
    )
    with pytest.raises(UntrustedSpecError, match=r"model='os:system' in checkpoint .*not imported"):
        load_trained(path.parent)
    assert not target.exists()
    # resuming it as a Session: a built-in name only, never an import
    with pytest.raises(ValueError, match=r"model='os:system'"):
        Session.resume_from(path.parent)
    assert not target.exists()


def test_a_factory_named_by_a_checkpoint_is_refused_then_honoured_when_trusted(
    saved, tmp_path, marker, caplog
):
    spec, mark = marker.spec, marker.path
    path = _craft(saved, tmp_path / "ck", model={"name": spec, "options": {}})
    with pytest.raises(UntrustedSpecError) as info:
        load_trained(path)
    assert info.value.spec == spec and str(path) in info.value.source
    assert "trusted=True" in str(info.value)
    assert not marker.ran

    with caplog.at_level(logging.WARNING, logger="workbench"):
        trained = load_trained(path, trusted=True)
    assert mark.read_text() == "called"
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert f"importing module {spec.split(':')[0]!r}" in warning and "make(**options)" in warning
    assert str(tmp_path) in warning  # where the module is imported from
    weights = saved["backend"]["model"]
    for name, tensor in trained.model.state_dict().items():
        assert torch.equal(tensor, weights[name])


def test_a_factory_the_caller_names_is_the_callers_choice(saved, tmp_path, marker):
    spec, mark = marker.spec, marker.path
    path = _craft(saved, tmp_path / "ck", model={"name": None, "options": {}})
    trained = load_trained(path, model=spec)
    assert mark.read_text() == "called" and trained.name == spec


def test_resuming_a_session_from_a_crafted_checkpoint_imports_nothing(saved, tmp_path, marker):
    spec = marker.spec
    path = _craft(saved, tmp_path / "ck", model={"name": spec, "options": {}})
    with pytest.raises(ValueError, match=rf"model={spec!r}"):
        Session.resume_from(path)
    # resume= with the user's own model reads the weights and ignores the name
    session = Session(
        TrainConfig(micro_batch=2, seed=3),
        model="mlp",
        model_options={"samples": 64, "hidden": 16, "depth": 1},
        resume=path,
    )
    session.close()
    assert not marker.ran


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"backend": [1, 2]}, r"backend=\[1, 2\]: must be a dict"),
        ({"backend": {"model": {"w": 1}}}, r"backend.model: must map parameter names to tensors"),
        ({"step": -3}, r"step=-3: must be an integer >= 0"),
        ({"model": ["mlp"]}, r"model=\['mlp'\]: must be a dict"),
        ({"model": {"name": 7}}, r"model.name=7"),
        ({"model": {"name": "mlp", "options": [1]}}, r"model.options=\[1\]"),
        ({"data": {"epoch": "0", "offset": 0}}, r"data=.*must be \{'epoch'"),
        ({"rng": {"torch": torch.zeros(3, dtype=torch.uint8)}}, r"rng.torch: must be torch's"),
        ({"reference_batch": 0}, r"reference_batch=0: must be an integer >= 1"),
        ({"config": [1]}, r"config=\[1\]: must be a dict of settings"),
    ],
)
def test_a_payload_of_the_wrong_shape_is_named(saved, tmp_path, changes, pattern):
    path = _craft(saved, tmp_path / "ck", **changes)
    with pytest.raises(ckpt.CheckpointError, match=pattern):
        ckpt.load(path)
    with pytest.raises(ValueError, match=pattern):
        Session.resume_from(path)


@pytest.mark.parametrize("key", ["bytes", "sha256", "step"])
def test_a_manifest_without_its_checks_is_named(saved, tmp_path, key):
    import json

    path = _craft(saved, tmp_path / "ck")
    manifest = ckpt.manifest_path(path)
    data = json.loads(manifest.read_text())
    del data[key]
    manifest.write_text(json.dumps(data))
    with pytest.raises(ckpt.CheckpointError, match=rf"altered manifest \({key}=None"):
        ckpt.load(path)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ('{"kind": "workbench-checkpoint", "kind": "x"}', "appears twice"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        ('{"kind": "workbench-checkpoint", "bytes": 1e999}', "must be finite"),
    ],
)
def test_a_hostile_manifest_is_named(saved, tmp_path, text, pattern):
    path = _craft(saved, tmp_path / "ck")
    ckpt.manifest_path(path).write_text(text)
    with pytest.raises(ckpt.CheckpointError, match=pattern):
        ckpt.load(path)


def test_a_fifo_named_as_a_checkpoint_does_not_block(tmp_path):
    fifo = tmp_path / "step-00000001.pt"
    os.mkfifo(fifo)
    with pytest.raises(ckpt.CheckpointError, match="no such checkpoint file"):
        ckpt.load(fifo)


plain_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = ["step", "config", "backend", "buffers", "rng", "data", "reference_batch", "model"]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.dictionaries(st.sampled_from(KEYS), plain_values, min_size=1, max_size=3))
def test_any_plain_payload_is_resumed_or_named_never_a_traceback(saved, tmp_path, changes):
    folder = tmp_path / f"fuzz-{abs(hash(repr(changes))) % 10**9}"
    path = _craft(saved, folder, **changes)
    for load in (ckpt.load, load_trained):
        with contextlib.suppress(ValueError):
            load(path)
    with contextlib.suppress(ValueError):
        Session.resume_from(path).close()


def test_a_resumed_run_saves_beside_its_checkpoint_not_where_the_file_says(saved, tmp_path):
    elsewhere = tmp_path / "chosen-by-the-file"
    config = dict(saved["config"], checkpoint_dir=str(elsewhere))
    path = _craft(saved, tmp_path / "ck", config=config)
    with Session.resume_from(path) as session:
        assert session.config.checkpoint_dir == str(path.parent)
        session.run(1)
        written = Path(session.save_checkpoint())
    assert written.parent == path.parent and not elsewhere.exists()


def _with_manifest_log(path: Path, log: Any) -> None:
    import json

    manifest = ckpt.manifest_path(path)
    data = json.loads(manifest.read_text())
    data["log"] = log
    manifest.write_text(json.dumps(data))


def test_the_manifest_cannot_point_the_history_at_another_file(saved, tmp_path):
    secret = tmp_path / "secret.jsonl"
    record = {"type": "record", "step": 1, "loss": 1.0}
    secret.write_text(json.dumps(record) + "\n")
    path = _craft(saved, tmp_path / "ck")
    for log in (str(secret), "../secret.jsonl", 7, ["log.jsonl"]):
        _with_manifest_log(path, log)
        with Session.resume_from(path) as session:
            assert len(session.history) == 0


def test_a_crafted_log_gives_no_records_of_the_wrong_types(saved, tmp_path):
    path = _craft(saved, tmp_path / "ck", step=3)
    good = Session(TrainConfig(micro_batch=2), model="mlp", model_options={"samples": 64})
    record = good.run(1)[0].to_dict()
    good.close()
    lines = [
        {"type": "record", **{**record, "step": 1, "loss": "high"}},
        {"type": "record", **{**record, "step": 2, "changes": [1, 2]}},
        {"type": "record", **{**record, "step": 3}},
    ]
    (path.parent / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _with_manifest_log(path, "log.jsonl")
    with Session.resume_from(path) as session:
        assert [r.step for r in session.history] == [3]
    # one giant line with no newline: read in bounded blocks, nothing taken from it
    (path.parent / "log.jsonl").write_bytes(b'{"type": "record", "step": 1' + b"x" * (3 << 20))
    with Session.resume_from(path) as session:
        assert len(session.history) == 0


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_weights_file_that_is_no_file_is_refused_without_blocking(tmp_path, kind):
    if kind == "fifo":
        target = tmp_path / "weights.pt"
        os.mkfifo(target)
    else:
        target = Path("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        load_trained(target, model="mlp")


def test_a_weights_file_pickling_other_objects_is_refused_unread(tmp_path):
    target = tmp_path / "weights.pt"
    mark = tmp_path / "touched"
    torch.save({"w": torch.zeros(1), "x": mark.touch}, target)  # unpickling would call nothing,
    # but the object named (pathlib.Path.touch) is outside torch's safe set: refused unread
    with pytest.raises(
        ValueError, match=r"refused: it holds Python objects .*nothing in it was loaded"
    ):
        load_trained(target, model="mlp")
