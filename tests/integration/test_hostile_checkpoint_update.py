"""A live session pointed at another run's folder (`update(checkpoint_dir=...)`) is refused
before its log moves there: nothing of the other run changes (docs/bad_input.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.train.launch.checks import checkpoint_dir_problems

TINY = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}


def test_update_into_another_runs_folder_is_refused_before_the_log_moves(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    with Session(
        TrainConfig(micro_batch=2, checkpoint_dir=str(theirs)), model_options=TINY
    ) as first:
        first.run(2)
        first.save_checkpoint()
    before = {p.name: p.read_bytes() for p in theirs.iterdir() if p.is_file()}
    assert "log.jsonl" in before

    with Session(TrainConfig(micro_batch=2), model_options=TINY) as second:
        second.run(1)
        with pytest.raises(ValueError, match=r"checkpoint_dir=.*theirs.*another run"):
            second.update(checkpoint_dir=str(theirs))
        assert second.config.checkpoint_dir is None
        second.run(1)  # the session goes on, unchanged
        assert second.step == 2
        mine = tmp_path / "mine"
        second.update(checkpoint_dir=str(mine))
        second.run(1)
        assert Path(second.save_checkpoint()).parent == mine
    after = {p.name: p.read_bytes() for p in theirs.iterdir() if p.is_file()}
    assert after == before


def _saved(folder: Path, steps: list[int]) -> None:
    """A run of the built-in tiny GPT saving a checkpoint at each of `steps` in `folder`."""
    with Session(TrainConfig(micro_batch=2, checkpoint_dir=str(folder)), model_options=TINY) as s:
        for step in steps:
            s.run(step - s.step)
            s.save_checkpoint()


@pytest.fixture
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything starts a process (torchrun, a rank)."""
    import subprocess

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", started)


@pytest.mark.usefixtures("no_process")
def test_a_launch_into_another_runs_folder_is_refused_before_torchrun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.cli import main

    _saved(tmp_path / "earlier" / "rank-0", [1])
    before = sorted(p.name for p in (tmp_path / "earlier" / "rank-0").iterdir())
    options = '{"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}'
    with pytest.raises(SystemExit) as info:
        main(
            ["launch", "--device", "cpu", "--steps", "2", "--ranks", "1", "--micro-batch", "2",
             "--model-options", options, "--checkpoint-dir", str(tmp_path / "earlier")]
        )  # fmt: skip
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--checkpoint-dir" in err[0] and "another run" in err[0], err
    assert sorted(p.name for p in (tmp_path / "earlier" / "rank-0").iterdir()) == before


@pytest.mark.usefixtures("no_process")
def test_a_resume_whose_rank_holds_newer_checkpoints_says_so_before_torchrun(
    tmp_path: Path,
) -> None:
    """One rank saved step 4, the other was killed before it: every rank resumes from step
    2, and rank 0's saves would overwrite its step 4; the launch says to use a new folder."""
    from workbench.train.launch import launch_ranks

    _saved(tmp_path / "run" / "rank-0", [2, 4])
    _saved(tmp_path / "run" / "rank-1", [2])
    with pytest.raises(ValueError, match=r"checkpoint_dir=.*rank-0/.*newer than its step 2"):
        launch_ranks(
            TrainConfig(device="cpu", micro_batch=2),
            ranks=2,
            model="tiny-gpt",
            model_options=TINY,
            steps=6,
            resume=str(tmp_path / "run"),
        )
    # a new folder for the resumed run is free
    assert checkpoint_dir_problems(tmp_path / "new", 2, str(tmp_path / "run"), 2) == []


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: p.write_text("x"), "a file"),
        (lambda p: os.mkfifo(p), "a FIFO (named pipe)"),
        (None, "a device"),
    ],
    ids=["file", "fifo", "device"],
)
def test_a_checkpoint_dir_that_is_no_folder_is_refused_at_once(tmp_path: Path, make, kind) -> None:
    path = "/dev/null" if make is None else str(tmp_path / "not-a-folder")
    if make is not None:
        make(Path(path))
    said = rf"checkpoint_dir='{re.escape(path)}': exists and is {re.escape(kind)}, where a folder"
    with pytest.raises(ConfigError, match=said):
        Session(TrainConfig(micro_batch=2, checkpoint_dir=path), model_options=TINY)
    with Session(TrainConfig(micro_batch=2), model_options=TINY) as s:
        s.run(1)
        with pytest.raises(ConfigError, match=said):
            s.update(checkpoint_dir=path)
        assert s.config.checkpoint_dir is None and s.pending_changes == {}
        s.run(1)  # the session goes on, unchanged
        assert s.step == 2 and s.log_path is None
    if make is not None:
        assert Path(path).exists() and not Path(path).is_dir()  # left as it was


def test_a_checkpoint_dir_inside_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=rf"checkpoint_dir=.*: {re.escape(str(afile))} is a file"):
        Session(TrainConfig(micro_batch=2, checkpoint_dir=str(afile / "run")), model_options=TINY)
