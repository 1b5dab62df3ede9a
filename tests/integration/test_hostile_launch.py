"""A launch leaves nothing behind: no rank or launcher alive after its parent is killed
(SIGKILL: no handler runs). One launch of 2 gloo ranks on CPU. (No torchelastic folder left
in the temporary directory after a run: test_launch.py's CLI launch holds it.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

MLP = {"in_features": 4, "hidden": 8, "depth": 1, "out_features": 2, "samples": 64}
ROOT = Path(__file__).resolve().parents[2]
#: The longest wait for processes to start or end (polled; the test ends as soon as they do).
WAIT_S = 240


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _command(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_killing_the_launching_process_ends_its_launcher_and_ranks(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "launch",
            "--device=cpu",
            "--model=mlp",
            f"--model-options={json.dumps(MLP)}",
            "--steps=1000000",
            "--threads=1",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # the launcher and both ranks
            started = _descendants(cli.pid)
            commands = [_command(p) for p in started]
            ranks = [c for c in commands if "rank_worker" in c and "distributed.run" not in c]
            if len(ranks) == 2:
                break
            assert cli.poll() is None, "the launch ended before its ranks started"
            time.sleep(0.2)
        assert len(started) >= 3, [_command(p) for p in started]
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        deadline = time.monotonic() + WAIT_S
        while _running(started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _running(started)
        assert left == [], [_command(p)[:200] for p in left]
    finally:
        for p in _running([*started, psutil.Process(cli.pid)] if cli.poll() is None else started):
            p.kill()
