"""Writes land only where meant, reads never block, and error texts are built with bounded
work: the cases a fuzz of the file-facing entry points found (docs/bad_input.md)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from workbench.inputs import InputFileError, open_regular, read_bytes, read_json, shown
from workbench.outputs import OutputError, check_target, target_problem, write_file, write_files


def shared_references(depth: int = 40) -> list[object]:
    """`[L, L]` nested `depth` deep: a few bytes pickled, 2**depth leaves when walked."""
    value: list[object] = [0]
    for _ in range(depth):
        value = [value, value]
    return value


# --------------------------------------------------------------------------- shown
def test_shown_of_shared_references_is_bounded() -> None:
    text = shown(shared_references())
    assert len(text) <= 80 and text.startswith("[[[") and "..." in text


def test_shown_of_a_container_holding_itself() -> None:
    looped: dict[str, object] = {}
    looped["a"] = looped
    assert shown(looped).startswith("{'a': {'a':")


def test_shown_of_a_huge_string_reads_only_its_start() -> None:
    class Counting(str):
        pass

    text = shown("y" * 10**7)
    assert len(text) == 80 and text.startswith("'yyy") and text.endswith("...")
    assert shown(Counting("ab")) == "'ab'"


# --------------------------------------------------------------------------- writes
@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_an_atomic_write_refuses_a_fifo_and_leaves_it_one(fifo: Path) -> None:
    with pytest.raises(OutputError, match=r"pipe.*a FIFO \(named pipe\), not a regular file"):
        write_file(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert (
        target_problem(fifo, folder=False)
        == "exists and is a FIFO (named pipe), not a regular file"
    )


def test_an_atomic_write_refuses_a_device() -> None:
    with pytest.raises(OutputError, match="/dev/null.*a device, not a regular file"):
        check_target("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_atomic_write_refuses_a_socket(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        with pytest.raises(OutputError, match="a socket"):
            write_file(path, "x")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        sock.close()


def test_a_link_the_user_named_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    written = write_file(link, "new")
    assert link.is_symlink() and real.read_text() == "new" and written == real.resolve()


def test_a_link_to_a_fifo_is_refused(tmp_path: Path, fifo: Path) -> None:
    link = tmp_path / "out.png"
    link.symlink_to(fifo)
    with pytest.raises(OutputError, match="link to a FIFO"):
        write_file(link, b"png")
    assert link.is_symlink() and stat.S_ISFIFO(os.stat(link).st_mode)


def test_a_link_under_a_folder_of_chosen_names_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("keep")
    job = tmp_path / "job"
    job.mkdir()
    (job / "launch.sh").symlink_to(elsewhere)
    with pytest.raises(OutputError, match="symbolic link"):
        write_files(job, {"ds_config.json": "{}", "launch.sh": "echo"})
    assert elsewhere.read_text() == "keep" and not (job / "ds_config.json").exists()
    assert sorted(p.name for p in job.iterdir()) == ["launch.sh"]


def test_the_ladder_out_flag_refuses_a_fifo(fifo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["ladder", "--steps", "1", "--out", str(fifo)])
    assert exit_.value.code == 2 and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "FIFO" in err[0]


# --------------------------------------------------------------------------- reads
def test_a_file_swapped_for_a_fifo_after_the_check_does_not_block(
    fifo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check by name said "a regular file" (a swap after it); the open must not block
    and the descriptor's own fstat refuses it."""
    regular = os.stat(__file__)
    monkeypatch.setattr("workbench.inputs.os.stat", lambda *a, **k: regular, raising=True)
    with pytest.raises(InputFileError, match="a FIFO"):
        read_bytes(fifo, what="--config")
    with pytest.raises(InputFileError, match="a FIFO"):
        read_json(fifo, what="--hf-config")


def test_open_regular_refuses_a_fifo_and_a_folder(fifo: Path, tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="a FIFO"):
        open_regular(fifo, what="log")
    with pytest.raises(InputFileError, match="a directory"):
        open_regular(tmp_path, what="log")
    with open_regular(__file__, what="source") as f:
        assert f.read(3) == b'"""'


def test_shown_is_what_messages_use_for_a_deep_value() -> None:
    """The common path of every error message: a bounded text in bounded time."""
    assert sys.getrecursionlimit() > 100
    assert len(shown({"k": shared_references(60)})) <= 80


def test_a_report_with_a_diverged_figure_is_strict_json() -> None:
    """`workbench export/compress/launch --json` and compress's report.json: a NaN loss or
    an infinite ratio is `null`, never `NaN`/`Infinity` (which JSON parsers refuse)."""
    import json

    from workbench.cli import report_json

    text = report_json({"losses": [1.0, float("nan")], "ratio": float("inf"), "n": 3})
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
        "losses": [1.0, None],
        "ratio": None,
        "n": 3,
    }
