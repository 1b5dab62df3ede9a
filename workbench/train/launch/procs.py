"""The running ranks of a launch: the events files they write (tailed as they grow), what
they reported (`LaunchState`), SIGTERM passed on to them, and ending the whole process
tree so no rank is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.train.launch.result import RankError
from workbench.train.records import StepRecord

POLL_SECONDS = 0.05
#: The folder of a launch's run folder where torchrun's agent keeps its per-run folders.
LAUNCHER_LOGS = "torchelastic"
KILL_GRACE_SECONDS = 5.0  # SIGTERM lets a rank release a build lock (JIT ops) before SIGKILL
LOG_TAIL_CHARS = 3000
#: After a first error, how long the other ranks get to report theirs (the root cause may
#: come a moment later than a peer's communication error).
ERROR_GRACE_SECONDS = 5.0
# Messages of ranks that failed only because another rank went away (gloo, NCCL, c10d).
_PEER_FAILURE = re.compile(
    r"connection closed by peer|remote worker crash|connection reset|broken pipe|"
    r"nccl.*(watchdog|timeout|abort)|process ?group.*(abort|timed out)",
    re.IGNORECASE,
)


def die_with_parent() -> Callable[[], None]:
    """A `preexec_fn` for the launcher: on Linux the launcher gets SIGTERM when the process
    that started it dies, however it dies (SIGKILL, a closed terminal's SIGHUP: no handler
    of ours runs then), and passes it on to its ranks, which end too; elsewhere nothing.
    The C library is loaded here, in the parent, so the child only makes one call."""
    if not sys.platform.startswith("linux"):
        return lambda: None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the call: act on it now
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


#: prctl's option that sends a signal to a process when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def terminate_tree(
    proc: Any, extra_pids: Sequence[int] = (), grace: float = KILL_GRACE_SECONDS
) -> None:
    """SIGTERM the launcher and every descendant (and `extra_pids`), SIGKILL what is left
    after `grace` seconds, and reap them all."""
    import psutil

    procs: dict[int, Any] = {}
    for p in _descendants(proc.pid):
        procs[p.pid] = p
    for pid in extra_pids:
        if pid not in procs:
            with contextlib.suppress(psutil.Error):
                procs[pid] = psutil.Process(pid)
    with contextlib.suppress(psutil.Error):
        procs[proc.pid] = psutil.Process(proc.pid)
    alive = []
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.terminate()
            alive.append(p)
    _, alive = psutil.wait_procs(alive, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


class EventsTail:
    """New complete lines of one rank's events file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


def read_log_tail(path: Path) -> str:
    """The last `LOG_TAIL_CHARS` of the launcher's log ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_CHARS))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def clean_run_dir(run_dir: Path, *, keep: bool) -> None:
    """Remove a launch's run folder; `keep`: remove all but the checkpoints in it."""
    if keep:
        for name in ("events", "config.json", "launcher.log", LAUNCHER_LOGS):
            target = run_dir / name
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        return
    shutil.rmtree(run_dir, ignore_errors=True)


class LaunchState:
    """What the ranks reported so far (their JSON lines, `handle`d in order): hello, ready,
    records, checkpoints, final figures, errors and the root-cause error among them."""

    def __init__(self, ranks: int, on_record: Callable[[StepRecord], None] | None) -> None:
        self.ranks = ranks
        self.on_record = on_record
        self.records: dict[int, list[StepRecord]] = {r: [] for r in range(ranks)}
        self.hello: dict[int, dict[str, Any]] = {}
        self.ready: dict[int, dict[str, Any]] = {}
        self.final: dict[int, dict[str, Any]] = {}
        self.checkpoints: dict[int, dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []
        self.first_error: RankError | None = None
        self.preempted = False

    def pids(self) -> list[int]:
        return [int(h["pid"]) for h in self.hello.values() if h.get("pid")]

    def handle(self, msg: dict[str, Any]) -> None:
        kind, rank = msg.get("type"), int(msg.get("rank", -1))
        if kind == "hello":
            self.hello[rank] = msg
        elif kind == "ready":
            self.ready[rank] = msg
        elif kind == "record":
            record = StepRecord.from_dict(msg["record"])
            self.records.setdefault(rank, []).append(record)
            if self.on_record is not None:
                self.on_record(record)
        elif kind == "checkpoint":
            self.checkpoints[rank] = msg
        elif kind == "final":
            self.final[rank] = msg
            if msg.get("preempted"):
                self.preempted = True
        elif kind == "error":
            self.errors.append(msg)
            # The root cause: the earliest error that is not a peer's communication failure
            # ("connection closed by peer" on the ranks a crashed rank leaves behind).
            causes = [m for m in self.errors if not _PEER_FAILURE.search(str(m.get("message")))]
            first = min(causes or self.errors, key=lambda m: float(m.get("wall_time") or 0))
            self.first_error = RankError(
                int(first["rank"]),
                str(first.get("message", "")),
                str(first.get("traceback", "")),
            )

    def all_reported(self) -> bool:
        """Every rank has sent an error or its final message."""
        done = {int(m.get("rank", -1)) for m in self.errors} | set(self.final)
        return all(r in done for r in range(self.ranks))


class SigtermForward:
    """While a launch runs on the main thread, a SIGTERM to this process is passed on to
    the ranks (they checkpoint and exit) instead of killing this process."""

    def __init__(self, state: LaunchState) -> None:
        self.state = state
        self.pending = False
        self.sent = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._handler)
        self._installed = True

    def _handler(self, signum: int, frame: Any) -> None:
        self.pending = True

    def forward(self) -> None:
        if self.sent:
            self.pending = False
            return
        pids = self.state.pids()
        if len(pids) < self.state.ranks:
            return  # not every rank has started; stays pending for the next poll
        self.pending = False
        self.sent = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
