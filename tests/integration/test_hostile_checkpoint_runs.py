"""Nothing a user trained is lost: a Session never deletes or overwrites a checkpoint it did
not write, and reading a checkpoint, its manifest or its log is bounded and never blocks."""

from __future__ import annotations

import copy
import errno
import json
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.train import checkpoints as ckpt
from workbench.train import runlog
from workbench.train.checkpointing import write as ckpt_write
from workbench.train.ladder import plan_ladder

TINY = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}
MLP = {"samples": 64, "hidden": 16, "depth": 1}


def _config(folder: Path | None = None, **settings: Any) -> TrainConfig:
    return TrainConfig(
        micro_batch=2, seed=1, checkpoint_dir=None if folder is None else str(folder), **settings
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def other_run(tmp_path: Path) -> Path:
    """A folder holding a finished run's checkpoints (steps 2 and 3) and its log."""
    folder = tmp_path / "run"
    cfg = _config(folder, checkpoint_every_steps=1, keep_checkpoints=2)
    with Session(cfg, model_options=TINY) as s:
        s.run(3)
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real checkpoint's payload, for crafting others from it."""
    root = tmp_path_factory.mktemp("saved")
    with Session(TrainConfig(micro_batch=2, seed=3), model="mlp", model_options=MLP) as s:
        s.run(1)
        path = s.save_checkpoint(str(root / "good.pt"))
    payload = ckpt.load(path)
    payload.pop("path")
    payload.pop("manifest")
    return payload


def _write_raw(payload: dict[str, Any], path: Path, **manifest: Any) -> Path:
    """A tensor file written with plain torch.save (no checks) and a manifest that matches
    its size and hash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    _rewrite_manifest(path, **{"step": payload["step"], **manifest})
    return path


def _rewrite_manifest(path: Path, **fields: Any) -> None:
    import hashlib

    data = path.read_bytes()
    m = {
        "kind": ckpt.MANIFEST_KIND,
        "format": ckpt.CHECKPOINT_FORMAT,
        "file": path.name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **fields,
    }
    path.with_suffix(".json").write_text(json.dumps(m))


# --------------------------------------------------------------------------- 1. another run's folder
def test_a_fresh_session_refuses_a_folder_holding_another_runs_checkpoints(other_run):
    before = _files(other_run)
    with pytest.raises(ValueError, match=r"another run.*step-00000003\.pt.*resume_from") as info:
        Session(_config(other_run, checkpoint_every_steps=1), model_options=TINY)
    assert str(other_run) in str(info.value) and "nothing in it was changed" in str(info.value)
    assert _files(other_run) == before


def test_save_checkpoint_into_another_runs_folder_is_refused(other_run):
    before = _files(other_run)
    with Session(_config(), model_options=TINY) as s:
        s.run(1)
        with pytest.raises(ValueError, match=r"another run.*step-00000003\.pt"):
            s.save_checkpoint(str(other_run))
    assert _files(other_run) == before


def test_a_folder_holding_only_another_runs_log_is_refused(tmp_path):
    folder = tmp_path / "run"
    with Session(_config(folder), model_options=TINY) as s:
        s.run(2)  # a run that logged but saved nothing
    before = _files(folder)
    with pytest.raises(ValueError, match=r"log\.jsonl.*another run"):
        Session(_config(folder), model_options=TINY)
    assert _files(folder) == before


def test_a_run_moved_to_another_runs_folder_never_writes_over_its_checkpoints(other_run, tmp_path):
    steps = {p.name: p.read_bytes() for p in other_run.glob("step-*")}
    with Session(_config(tmp_path / "first"), model_options=TINY) as s:
        s.run(1)
        s.update(checkpoint_dir=str(tmp_path / "moved"))  # a new folder: saves go there
        s.run(2)
        assert Path(s.save_checkpoint()).parent == tmp_path / "moved"
        with pytest.raises(ValueError, match="checkpoint_dir=.*another run"):
            s.update(checkpoint_dir=str(other_run), checkpoint_every_steps=1)
        s.run(1)  # step 4: the session goes on in its own folder
        assert s.config.checkpoint_dir == str(tmp_path / "moved")
    assert {p.name: p.read_bytes() for p in other_run.glob("step-*")} == steps


def test_a_save_returns_a_checkpoint_that_exists_and_keeps_its_run(tmp_path):
    folder = tmp_path / "run"
    with Session(_config(folder, keep_checkpoints=2), model_options=TINY) as s:
        for _ in range(3):
            s.run(1)
            path = Path(s.save_checkpoint())
            assert path.is_file() and ckpt.read_manifest(path)["run"] == s.run_id
        first = s.run_id
    assert [p.name for p in ckpt.list_checkpoints(folder)] == [
        "step-00000002.pt",
        "step-00000003.pt",
    ]
    with Session.resume_from(folder) as s:  # the newest complete checkpoint, the same run
        assert s.step == 3 and s.run_id == first
        s.run(1)
        assert Path(s.save_checkpoint()).is_file()
    assert [p.name for p in ckpt.list_checkpoints(folder)] == [
        "step-00000003.pt",
        "step-00000004.pt",
    ]


def test_pruning_deletes_only_the_runs_own_checkpoints(saved, tmp_path):
    folder = tmp_path / "mixed"
    for step, run in ((5, "aaaa"), (6, "aaaa"), (1, "bbbb"), (2, "bbbb")):
        ckpt.save(
            dict(copy.deepcopy(saved), step=step),
            folder / ckpt.checkpoint_name(step),
            describe={"run": run},
        )
    written = folder / ckpt.checkpoint_name(2)
    deleted = ckpt.prune(folder, 1, run="bbbb", written=written)
    assert [p.name for p in deleted] == ["step-00000001.pt"]
    assert [p.name for p in ckpt.list_checkpoints(folder)] == [
        "step-00000002.pt",
        "step-00000005.pt",
        "step-00000006.pt",
    ]


def test_resuming_an_older_checkpoint_into_its_own_folder_is_refused(other_run, tmp_path):
    before = _files(other_run)
    with pytest.raises(ValueError, match=r"newer.*step-00000003\.pt.*checkpoint_dir="):
        Session.resume_from(other_run / "step-00000002.pt")
    assert _files(other_run) == before
    elsewhere = tmp_path / "continued"
    with Session.resume_from(other_run / "step-00000002.pt", checkpoint_dir=str(elsewhere)) as s:
        s.run(1)
        s.save_checkpoint()
    assert _files(other_run) == before
    assert [p.name for p in ckpt.list_checkpoints(elsewhere)] == ["step-00000003.pt"]


def test_a_previous_layout_checkpoint_belongs_to_the_run_resumed_from_it(saved, tmp_path):
    folder = tmp_path / "old"
    ckpt.save(dict(copy.deepcopy(saved), step=1), folder / ckpt.checkpoint_name(1))
    assert "run" not in ckpt.read_manifest(folder)  # written as the previous layout did
    with Session.resume_from(folder, model="mlp", keep_checkpoints=1) as s:
        s.run(1)
        s.save_checkpoint(str(folder))
    assert [p.name for p in ckpt.list_checkpoints(folder)] == ["step-00000002.pt"]


@pytest.mark.parametrize("bad", ["", 5, b"x", 1.5])
def test_save_checkpoint_refuses_an_empty_or_non_path_argument(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    with (
        Session(_config(), model_options=TINY) as s,
        pytest.raises(ValueError, match=r"path=.*file or folder path"),
    ):
        s.save_checkpoint(bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["", 5, b"x"])
def test_save_weights_refuses_a_bad_path(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    with Session(_config(), model_options=TINY) as s:
        with pytest.raises(ValueError, match=r"path=.*file path"):
            s.save_weights(bad)
        with pytest.raises(ValueError, match=r"path=.*folder"):
            s.save_weights(tmp_path)


@pytest.mark.parametrize("bad", [5, "", 1.5, b"x"])
def test_session_refuses_a_resume_that_is_not_a_path(bad):
    with pytest.raises(ValueError, match=r"resume=.*checkpoint file or folder"):
        Session(_config(), model_options=TINY, resume=bad)
    with pytest.raises(ValueError, match=r"path_or_dir=.*checkpoint file or folder"):
        Session.resume_from(bad)
    with pytest.raises(ValueError, match=r"path=.*checkpoint file or folder"):
        ckpt.load(bad)


def test_session_refuses_a_resume_dict_that_is_not_a_payload():
    with pytest.raises(ValueError, match=r"resume: a dict that is not a payload"):
        Session(_config(), model_options=TINY, resume={"step": 1})


# --------------------------------------------------------------------------- 2. rung files
@pytest.mark.parametrize(
    "setting",
    [
        {"checkpoint_dir": "somewhere"},
        {"checkpoint_every_steps": 1},
        {"checkpoint_every_seconds": 1.0},
        {"keep_checkpoints": 1},
    ],
)
def test_a_rung_never_chooses_where_the_workbench_writes(tmp_path, setting):
    with pytest.raises(ValueError, match=r"rung 1.*never chooses where the workbench writes"):
        plan_ladder([setting], "mlp", 4, model_options=MLP, device="cpu")


def test_a_later_rung_choosing_where_to_write_is_refused_for_that_alone(tmp_path):
    """The refusal is the rung's one problem: not also "changes nothing" (the refused
    setting is the change it asked for)."""
    rungs = [{"lr": 1e-3}, {"checkpoint_dir": str(tmp_path / "user-run")}]
    with pytest.raises(ValueError, match=r"rung 2.*never chooses where") as info:
        plan_ladder(rungs, "mlp", 4, model_options=MLP, device="cpu")
    assert "changes nothing" not in str(info.value)
    assert not (tmp_path / "user-run").exists()


# --------------------------------------------------------------------------- 3. the log read
def test_a_manifest_never_points_the_resume_at_another_runs_log(tmp_path):
    other = tmp_path / "other"
    with Session(_config(other), model_options=TINY) as s:
        s.run(3)
    mine = tmp_path / "mine"
    with Session(_config(), model_options=TINY) as s:
        s.run(2)
        path = Path(s.save_checkpoint(str(mine)))
    manifest = json.loads(path.with_suffix(".json").read_text())
    manifest["log"] = "../other/log.jsonl"
    path.with_suffix(".json").write_text(json.dumps(manifest))
    with Session.resume_from(path) as s:
        assert list(s.history) == []  # the other run's records were not read


# --------------------------------------------------------------------------- 4. compressed entries
def test_a_compressed_entry_in_the_tensor_file_is_refused(saved, tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save(saved, plain)
    crafted = tmp_path / "ck" / "step-00000001.pt"
    crafted.parent.mkdir()
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(crafted, "w") as dst:
        for info in src.infolist():
            kind = zipfile.ZIP_DEFLATED if "/data/" in info.filename else zipfile.ZIP_STORED
            dst.writestr(info.filename, src.read(info), compress_type=kind)
    _rewrite_manifest(crafted, step=saved["step"])
    with pytest.raises(ckpt.CheckpointError, match=r"compressed"):
        ckpt.load(crafted)


# --------------------------------------------------------------------------- 5. bounded reads
def test_the_log_tail_reads_a_bounded_number_of_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(runlog, "MAX_TAIL_BYTES", 1 << 20, raising=False)
    with Session(_config(tmp_path), model_options=TINY) as s:
        s.run(2)
    log = tmp_path / "log.jsonl"
    assert len(runlog.tail_records(log, up_to_step=10, limit=5)) == 2
    with open(log, "r+b") as f:
        f.truncate(8 << 20)  # a zero-filled (sparse) tail, as a crash can leave
    assert runlog.tail_records(log, up_to_step=10, limit=5) == []  # the start is not read


def test_a_sparse_tensor_file_past_the_limit_is_refused_before_it_is_read(
    saved, tmp_path, monkeypatch
):
    monkeypatch.setattr(ckpt, "MAX_CHECKPOINT_BYTES", 1 << 20, raising=False)
    path = tmp_path / "ck" / "step-00000001.pt"
    _write_raw(saved, path)
    with open(path, "r+b") as f:
        f.truncate(4 << 20)
    manifest = json.loads(path.with_suffix(".json").read_text())
    manifest["bytes"] = 4 << 20
    path.with_suffix(".json").write_text(json.dumps(manifest))
    with pytest.raises(
        ckpt.CheckpointError, match=r"4194304 bytes.*more than.*MAX_CHECKPOINT_BYTES"
    ):
        ckpt.load(path)


# --------------------------------------------------------------------------- 6. not a regular file
def test_a_fifo_in_place_of_the_log_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer, so no open blocks
    try:
        os.write(writer, b'{"type": "record", "step": 1}\n')
        with pytest.raises(ValueError, match=r"not a regular file"):
            runlog.tail_records(fifo, up_to_step=1, limit=5)
    finally:
        os.close(writer)


def test_a_fifo_in_place_of_the_tensor_file_is_refused(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    fifo = folder / "step-00000001.pt"
    os.mkfifo(fifo)
    (folder / "step-00000001.json").write_text(
        json.dumps(
            {
                "kind": ckpt.MANIFEST_KIND,
                "format": ckpt.CHECKPOINT_FORMAT,
                "file": fifo.name,
                "bytes": 0,
                "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "step": 1,
            }
        )
    )
    with pytest.raises(ckpt.CheckpointError, match=r"not a regular file"):
        ckpt.load(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# --------------------------------------------------------------------------- 7. crafted payloads
def _shared(depth: int = 40) -> list[Any]:
    value: list[Any] = [0]
    for _ in range(depth):
        value = [value, value]
    return value


def _crafted(saved: dict[str, Any], **changes: Any) -> dict[str, Any]:
    crafted = copy.deepcopy(saved)
    for key, value in changes.items():
        node = crafted
        *parents, last = key.split(".")
        for name in parents:
            node = node[name]
        node[last] = value
    return crafted


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"step": 10**400}, "step"),
        ({"data": {"epoch": 0, "offset": 2**64}}, "data"),
        ({"rng.numpy": ("MT19937",)}, "rng.numpy"),
        ({"rng.python": (3, (1, 2), None)}, "rng.python"),
        ({"rng.python": (3,)}, "rng.python"),
        ({"rng.python.state": [torch.tensor(1)] * 625}, "rng.python"),
        ({"data": _shared()}, "data"),
        ({"model.options": {"hidden": _shared()}}, "model.options"),
        ({"step": _shared()}, "step"),
        ({"backend.steps": [1]}, "backend.steps"),
        ({"backend.overflow_steps": "x"}, "backend.overflow_steps"),
        ({"backend.scheduler": [1]}, "backend.scheduler"),
        ({"backend.optimizer.state": [1]}, "backend.optimizer.state"),
        ({"backend.optimizer": "adamw"}, "backend.optimizer"),
        ({"backend.scaler": {"scale": "big"}}, "backend.scaler"),
    ],
    ids=[
        "huge-step",
        "huge-offset",
        "short-numpy-rng",
        "short-python-rng",
        "python-rng-tuple-1",
        "python-rng-tensors",
        "shared-data",
        "shared-option",
        "shared-step",
        "backend-steps-list",
        "backend-overflow-text",
        "backend-scheduler-list",
        "backend-optimizer-state-list",
        "backend-optimizer-text",
        "backend-scaler-text",
    ],
)
def test_a_crafted_payload_is_refused_when_loaded(saved, tmp_path, changes, named):
    crafted = _crafted(saved, **changes)
    manifest_step = crafted["step"] if isinstance(crafted["step"], int) else 1
    path = _write_raw(crafted, tmp_path / "ck" / "step-00000001.pt", step=manifest_step)
    with pytest.raises(ckpt.CheckpointError, match=named.replace(".", r"\.")):
        ckpt.load(path)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        Session.resume_from(path, model="mlp")


def test_a_sparse_weight_is_refused_when_loaded(saved, tmp_path):
    crafted = copy.deepcopy(saved)
    name = next(iter(crafted["backend"]["model"]))
    crafted["backend"]["model"][name] = crafted["backend"]["model"][name].to_sparse()
    path = _write_raw(crafted, tmp_path / "ck" / "step-00000001.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"backend\.model.*dense"):
        Session.resume_from(path, model="mlp")


def test_a_sparse_optimizer_state_is_refused_when_loaded(saved, tmp_path):
    crafted = copy.deepcopy(saved)
    state = next(iter(crafted["backend"]["optimizer"]["state"].values()))
    state["exp_avg"] = state["exp_avg"].to_sparse()
    path = _write_raw(crafted, tmp_path / "ck" / "step-00000001.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"backend\.optimizer\..*exp_avg.*dense"):
        Session.resume_from(path, model="mlp")


def test_a_config_value_of_shared_references_is_refused(saved, tmp_path):
    crafted = _crafted(saved, **{"config.lr": _shared()})
    path = _write_raw(crafted, tmp_path / "ck" / "step-00000001.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"config"):
        Session.resume_from(path, model="mlp")


def test_check_plain_names_a_bad_value_with_bounded_text():
    class Odd:
        def __repr__(self) -> str:
            return "x" * 10_000

    with pytest.raises(ValueError) as info:
        ckpt.check_plain({"a": [Odd()]})
    assert len(str(info.value)) < 600
    ckpt.check_plain({"a": _shared()})  # shared references are walked once each


# --------------------------------------------------------------------------- 9. Ctrl-C, a full disk
def _failing_writes(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """The checkpoint's file raises `error` at its third write (as a full disk or Ctrl-C
    would, inside torch.save)."""
    real_init = ckpt_write._HashingWriter.__init__

    class Failing:
        def __init__(self, f: Any) -> None:
            self._f, self.calls = f, 0

        def write(self, data: Any) -> int:
            self.calls += 1
            if self.calls == 3:
                raise error
            return int(self._f.write(data))

        def flush(self) -> None:
            self._f.flush()

    def init(self: Any, f: Any) -> None:
        real_init(self, Failing(f))

    monkeypatch.setattr(ckpt_write._HashingWriter, "__init__", init)


def test_a_full_disk_during_a_save_is_one_clear_error(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    with Session(_config(folder), model_options=TINY) as s:
        s.run(1)
        first = s.save_checkpoint()
        s.run(1)
        _failing_writes(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
        with pytest.raises(OSError, match=r"disk is full.*previous checkpoints are whole") as info:
            s.save_checkpoint()
        assert "step-00000002.pt" in str(info.value)
        monkeypatch.undo()
    assert not list(folder.glob("*.tmp"))
    assert [str(p) for p in ckpt.list_checkpoints(folder)] == [first]
    ckpt.load(first)


def test_ctrl_c_during_a_save_leaves_the_files_consistent(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    with Session(_config(folder), model_options=TINY) as s:
        s.run(1)
        first = s.save_checkpoint()
        s.run(1)
        _failing_writes(monkeypatch, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            s.save_checkpoint()
        monkeypatch.undo()
    assert not list(folder.glob("*.tmp"))
    assert not (folder / "step-00000002.pt").exists()
    assert [str(p) for p in ckpt.list_checkpoints(folder)] == [first]


def test_close_still_closes_when_the_log_cannot_be_written(tmp_path, monkeypatch):
    real_open = open

    class Full:
        def __init__(self, f: Any) -> None:
            self._f = f

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            self._f.close()
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runlog, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)
    s = Session(_config(tmp_path / "run"), model_options=TINY)
    s.run(2)
    trained = {k: v.clone() for k, v in s.state_dict().items()}
    s.close()
    assert s.state == "closed"
    assert all(torch.equal(v, trained[k]) for k, v in s.model.state_dict().items())


# --------------------------------------------------------------------------- 10. atomic writes
def test_save_weights_never_turns_a_fifo_into_a_regular_file(tmp_path):
    fifo = tmp_path / "weights.pt"
    os.mkfifo(fifo)
    with (
        Session(_config(), model_options=TINY) as s,
        pytest.raises(ValueError, match=r"weights\.pt"),
    ):
        s.save_weights(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["weights.pt"]


@pytest.mark.parametrize("name", ["ckpt.fifo", "fifo-without-suffix", "/dev/null"])
def test_save_checkpoint_to_a_fifo_or_device_says_what_the_path_is(tmp_path, name):
    target = Path(name) if name.startswith("/") else tmp_path / name
    if not name.startswith("/"):
        os.mkfifo(target)
    kind = "a device" if name.startswith("/") else "a FIFO \\(named pipe\\)"
    with Session(_config(), model_options=TINY) as s:
        s.run(1)
        with pytest.raises(ValueError, match=rf"path='{target}': exists and is {kind}, where a"):
            s.save_checkpoint(target)
        s.run(1)  # the session trains on
        assert s.step == 2
    if not name.startswith("/"):
        assert stat.S_ISFIFO(os.stat(target).st_mode)
        assert [p.name for p in tmp_path.iterdir()] == [name]


# --------------------------------------------------------------------------- the panel's save
def test_the_panels_save_button_saves_each_session_in_its_own_folder(tmp_path, monkeypatch):
    from workbench.ui.training import TrainingPanel

    monkeypatch.chdir(tmp_path)
    saved_by = {}
    for _ in range(2):  # two sessions, each with its own panel, saving without a run folder
        with Session(_config(), model_options=TINY) as s:
            s.run(1)
            panel = TrainingPanel(s)
            panel.buttons["save"].click()
            assert "checkpoint saved" in panel.message_text, panel.message_text
            saved_by[s.run_id] = ckpt.list_checkpoints(tmp_path / "checkpoints" / s.run_id)
            panel.close()
    assert len(saved_by) == 2 and all(len(files) == 1 for files in saved_by.values())


def test_reading_a_whole_log_refuses_a_fifo_and_stops_at_a_zero_filled_tail(tmp_path):
    with Session(_config(tmp_path / "run"), model_options=TINY) as s:
        s.run(2)
    log = tmp_path / "run" / "log.jsonl"
    with open(log, "r+b") as f:
        f.truncate(log.stat().st_size + (64 << 20))  # what a crash can leave
    assert [r.step for r in runlog.read_records(log)] == [1, 2]
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that never closes
    try:
        os.write(writer, b'{"type": "record", "step": 1}\n')
        with pytest.raises(ValueError, match=r"not a regular file"):
            runlog.read_records(fifo)
    finally:
        os.close(writer)


def test_a_previous_format_history_of_another_shape_is_skipped(saved, tmp_path):
    old = dict(copy.deepcopy(saved), format=ckpt.PREVIOUS_FORMAT, history=[{"bogus": 1}, 7])
    path = tmp_path / "old" / "step-00000001.pt"
    path.parent.mkdir()
    torch.save(old, path)  # format 1: one file, no manifest, the records inside
    with Session.resume_from(path, model="mlp") as s:
        assert s.step == saved["step"] and list(s.history) == []


# --------------------------------------------------------------------------- links planted in a run
@pytest.mark.parametrize(
    "planted", ["step-00000002.pt", "step-00000002.json", "step-00000002.pt.tmp"]
)
def test_a_link_planted_in_the_run_folder_is_never_written_through(tmp_path, planted):
    """A symbolic link under a name the workbench chooses (the next checkpoint, its
    manifest, their temporary file) is refused or replaced, never written through: the
    file it points to stays as it was."""
    folder = tmp_path / "run"
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    with Session(_config(folder), model_options=TINY) as s:
        s.run(1)
        s.save_checkpoint()
        (folder / planted).symlink_to(outside)
        s.run(1)
        if planted.endswith(".tmp"):  # the workbench's own temporary name: replaced
            written = Path(s.save_checkpoint())
            assert written == folder / "step-00000002.pt" and not written.is_symlink()
        else:
            with pytest.raises(ValueError, match="symbolic link"):
                s.save_checkpoint()
    assert outside.read_text() == "keep"
    assert not (tmp_path / "outside.json").exists()


def test_a_resumed_runs_log_that_is_a_link_or_a_fifo_is_not_written_through(tmp_path, caplog):
    folder = tmp_path / "run"
    with Session(_config(folder), model_options=TINY) as s:
        s.run(1)
        s.save_checkpoint()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (folder / "log.jsonl").unlink()
    (folder / "log.jsonl").symlink_to(outside)
    with Session.resume_from(folder) as s:
        s.run(1)
    assert outside.read_text() == "keep"
    (folder / "log.jsonl").unlink()
    os.mkfifo(folder / "log.jsonl")  # opened to append, a FIFO would block: never
    with Session.resume_from(folder) as s:
        s.run(1)
    assert stat.S_ISFIFO(os.lstat(folder / "log.jsonl").st_mode)
    assert "no run log" in caplog.text


def test_a_checkpoint_file_named_inside_another_runs_folder_is_refused(other_run):
    """`save_checkpoint("other/step-N.pt")`: a step-N.pt name is that folder's
    checkpoint, and `resume_from(folder)` would pick it up as the other run's newest."""
    before = _files(other_run)
    with Session(_config(), model_options=TINY) as s:
        s.run(1)
        with pytest.raises(ValueError, match="another run"):
            s.save_checkpoint(str(other_run / "step-00000009.pt"))
        assert Path(s.save_checkpoint(str(other_run / "mine.pt"))).is_file()
    assert {k: v for k, v in _files(other_run).items() if not k.startswith("mine")} == before


@pytest.mark.parametrize("steps", [_shared(), 10**400, 10**12 + 1, 0, 1.5, True])
def test_a_run_of_a_bad_step_count_is_refused_at_once(steps):
    with Session(_config(), model_options=TINY) as s:
        with pytest.raises(ValueError, match=r"optimizer_steps=.*integer from 1 to 10\^12"):
            s.run(steps)
        with pytest.raises(ValueError, match=r"optimizer_steps="):
            s.start(steps)
        with pytest.raises(ValueError, match=r"steps=.*integer from 1 to 10\^6"):
            s.profile(steps=steps)
        assert s.step == 0 and s.state == "idle"


def test_a_launch_resuming_a_damaged_rank_checkpoint_says_so_before_torchrun(
    saved, tmp_path, monkeypatch
):
    import subprocess

    from workbench.train.launch import launch_ranks

    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", started)
    crafted = _crafted(saved, **{"backend.steps": [1]})
    crafted["model"] = {"name": "mlp", "options": MLP}
    _write_raw(crafted, tmp_path / "run" / "rank-0" / "step-00000001.pt", model=crafted["model"])
    with pytest.raises(ValueError, match=r"resume=.*rank-0/step-00000001\.pt.*backend\.steps"):
        launch_ranks(
            TrainConfig(device="cpu", micro_batch=2, seed=3),
            ranks=1,
            model="mlp",
            model_options=MLP,
            steps=3,
            resume=str(tmp_path / "run"),
        )
