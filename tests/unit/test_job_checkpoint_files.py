"""The exported jobs' checkpoint flags and files (`workbench/export/job_checkpoints.py`): bad
flags and job.json values are refused by name, only complete checkpoints are resumed, a
pickle is read for the globals it names without building them, and a resumed data stream
is the rest of the uninterrupted one."""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import pickle
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from workbench.export import job_checkpoints as ckpt
from workbench.export.job_common import batches


def _args(config: dict[str, Any] | None = None, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ckpt.add_checkpoint_arguments(parser, config or {})
    return parser.parse_args(list(argv))


def _complete(folder: Path, step: int) -> Path:
    path = folder / f"step-{step}"
    path.mkdir(parents=True)
    (path / "complete.json").write_text(json.dumps({"step": step, "world_size": 1}))
    return path


def test_the_flags_take_the_exported_configs_settings_and_check_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"checkpoint_dir": str(tmp_path / "c"), "checkpoint_every_steps": 50}
    args = _args(config)
    assert (args.checkpoint_dir, args.checkpoint_every_steps) == (str(tmp_path / "c"), 50)
    assert args.checkpoint_every_seconds is None and args.keep_checkpoints == 2
    assert _args(config, "--checkpoint-every-steps", "7").checkpoint_every_steps == 7
    for flag, value in [
        ("--checkpoint-every-steps", "0"),
        ("--checkpoint-every-seconds", "-1"),
        ("--checkpoint-every-seconds", "nan"),
        ("--keep-checkpoints", "-2"),
    ]:
        with pytest.raises(SystemExit):
            _args({}, flag, value)
        assert f"{flag}: {value!r}: must be" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        _args({"checkpoint_every_steps": "10"})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "job.json config.checkpoint_every_steps='10': must be an integer >= 1 or null" in err


def test_what_a_run_resumes_from_is_checked_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(*argv: str) -> str:
        with pytest.raises(SystemExit):
            ckpt.resume_folder(_args({}, *argv))
        return capsys.readouterr().err

    assert "--checkpoint-every-steps 5: needs --checkpoint-dir DIR" in refused(
        "--checkpoint-every-steps", "5"
    )
    assert "--resume auto: needs --checkpoint-dir DIR" in refused("--resume", "auto")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no complete checkpoint" in refused("--resume", str(empty))
    assert "none is there" in refused("--resume", str(tmp_path / "nowhere"))
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert "must be a folder" in refused("--checkpoint-dir", str(a_file))

    run = tmp_path / "run"
    _complete(run, 4)
    assert "holds another run's checkpoint (step-4)" in refused("--checkpoint-dir", str(run))
    # an incomplete newer save (killed while writing) is passed over
    (run / "step-6").mkdir()
    (run / "step-6" / "rank-0.pt").write_bytes(b"partial")
    found = ckpt.resume_folder(_args({}, "--checkpoint-dir", str(run), "--resume", "auto"))
    assert found == str(run / "step-4")
    assert ckpt.resume_folder(_args({}, "--resume", str(run))) == str(run / "step-4")
    # auto with nothing there starts afresh
    fresh = tmp_path / "fresh"
    assert ckpt.resume_folder(_args({}, "--checkpoint-dir", str(fresh), "--resume", "auto")) is None


def test_saves_are_kept_newest_first_and_an_old_one_goes_only_after_a_newer_is_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args({}, "--checkpoint-dir", str(tmp_path), "--checkpoint-every-steps", "2")
    before = signal.getsignal(signal.SIGTERM)
    try:
        saves = ckpt.Checkpoints(args, torch.device("cpu"))  # it handles SIGTERM from here
        assert signal.getsignal(signal.SIGTERM) == saves._on_signal
    finally:
        signal.signal(signal.SIGTERM, before)
    assert saves.due(1, 10) == (False, False) and saves.due(2, 10) == (True, False)
    for step in (2, 4, 6):
        folder = saves.folder(step)
        ckpt.save_rank_state(folder, {"applied": step})
        assert ckpt.newest(str(tmp_path)) != folder  # not complete before commit
        saves.commit(step, {"format": "test"})
    assert sorted(os.listdir(tmp_path)) == ["step-4", "step-6"]
    assert ckpt.read_complete(str(tmp_path / "step-6"))["format"] == "test"
    state = ckpt.load_rank_state(str(tmp_path / "step-6"))
    assert state["applied"] == 6
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [ln["step"] for ln in lines] == [2, 4, 6]
    # a signal: save and stop at this step, unless it is the run's last anyway
    saves._on_signal(15, None)
    assert saves.due(7, 10) == (True, True) and saves.due(9, 9) == (False, False)


def test_the_generators_a_rank_saved_are_the_ones_it_resumes_with(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torch.rand(3)
    ckpt.save_rank_state(str(tmp_path))
    expected = torch.rand(5)
    torch.rand(7)
    ckpt.load_rank_state(str(tmp_path))
    assert torch.equal(torch.rand(5), expected)


def test_a_pickle_is_read_for_the_globals_it_names_without_building_them(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2), "o": collections.OrderedDict(a=1), "s": torch.Size([2])}, plain)
    names = ckpt.pickled_globals(str(plain))
    assert "collections.OrderedDict" in names and "torch._utils._rebuild_tensor_v2" in names
    ckpt.safe_to_load(str(tmp_path), (".pt",))  # plain data passes

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "sub" / "bad.pt"
    bad.parent.mkdir()
    bad.write_bytes(pickle.dumps([Payload()], protocol=4))
    assert ckpt.pickled_globals(str(bad)) == {"posix.system"}
    with pytest.raises(SystemExit):
        ckpt.safe_to_load(str(tmp_path), (".pt",))
    assert not marker.exists()
    # a STACK_GLOBAL whose names are not the strings just pushed cannot be named: refused
    hidden = io.BytesIO()
    hidden.write(b"\x80\x04")  # protocol 4
    hidden.write(b"\x8c\x02os\x94")  # "os", memo 0
    hidden.write(b"\x8c\x06system\x94")  # "system", memo 1
    hidden.write(b"N")  # something else on top
    hidden.write(b"0")  # popped again
    hidden.write(b"\x93.")  # STACK_GLOBAL, STOP
    (tmp_path / "hidden.pt").write_bytes(hidden.getvalue())
    assert ckpt.pickled_globals(str(tmp_path / "hidden.pt")) == {ckpt.UNKNOWN}
    garbage = tmp_path / "garbage.metadata"
    garbage.write_bytes(b"\x00not a pickle")
    assert ckpt.pickled_globals(str(garbage)) == {ckpt.UNKNOWN}


def test_a_resumed_data_stream_is_the_rest_of_the_uninterrupted_one() -> None:
    data = TensorDataset(torch.arange(40).float().unsqueeze(1))
    job = {"seed": 3, "num_workers": 0, "pin_memory": False}
    straight = batches(job, data, 3, 2, 1)
    whole = [next(straight)[0].flatten().tolist() for _ in range(20)]  # over 3 epochs
    for skip in (0, 4, 6, 13):
        resumed = batches(job, data, 3, 2, 1, skip=skip)
        assert [next(resumed)[0].flatten().tolist() for _ in range(20 - skip)] == whole[skip:]


def test_a_link_or_fifo_in_a_checkpoint_folder_is_refused_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "step-2"
    folder.mkdir()
    torch.save({"w": torch.ones(1)}, folder / "rank-0.pt")
    ckpt.safe_to_load(str(folder), (".pt",))
    (folder / "more").symlink_to(outside, target_is_directory=True)  # os.walk would skip it
    with pytest.raises(SystemExit):
        ckpt.safe_to_load(str(folder), (".pt",))
    assert "more is a link, FIFO or device" in capsys.readouterr().err
    (folder / "more").unlink()
    os.mkfifo(folder / "x.pt")  # reading it would block
    with pytest.raises(SystemExit):
        ckpt.safe_to_load(str(folder), (".pt",))
    assert "x.pt is a link, FIFO or device" in capsys.readouterr().err
