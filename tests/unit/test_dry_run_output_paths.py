"""`workbench estimate --simulate --snapshot F` / `--timeline F`: the file's folder is
checked before the dry run (an existing one must take a new file, a missing one must be
one the write can make), refused by flag otherwise, and the check leaves no folder
behind."""

from __future__ import annotations

from pathlib import Path

import pytest

import workbench.train.dry_run as dry_run
from workbench.cli import main

SHAPE = ["--layers", "2", "--hidden", "64", "--heads", "2", "--seq-len", "32", "--vocab", "100"]


@pytest.fixture
def no_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dry run started before the output path was checked")

    monkeypatch.setattr(dry_run, "simulate_memory", refuse)


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(["estimate", *SHAPE, "--simulate", *argv])
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "path", "expected"),
    [
        ("--snapshot", "/proc/x/s.pickle", "the folder '/proc/x' cannot be made ("),
        ("--timeline", "/proc/t.png", "the folder '/proc' takes no new file ("),
    ],
)
def test_a_folder_that_cannot_take_the_file_is_refused_before_the_dry_run(
    flag: str, path: str, expected: str, no_dry_run: None, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error([flag, path], capsys)
    assert f"{flag} {path}: {expected}" in err and "Traceback" not in err


def test_the_check_leaves_no_folder_behind(
    tmp_path: Path, no_dry_run: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # a missing folder that can be made passes; the run then stops at another flag
    snap = tmp_path / "new" / "deep" / "s.pickle"
    err = _error(["--snapshot", str(snap), "--timeline", str(tmp_path / "t.svg")], capsys)
    assert "--timeline" in err and "--snapshot" not in err
    assert list(tmp_path.iterdir()) == []
