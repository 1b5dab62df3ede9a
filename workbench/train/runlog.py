"""The run's log: every step record and event as JSON lines, optionally TensorBoard.

A Session with a run folder (`config.checkpoint_dir`) appends one JSON object per line to
`<run folder>/log.jsonl`, always; with `Session(..., tensorboard=True)` it also writes
TensorBoard scalars under `<run folder>/tensorboard` (`torch.utils.tensorboard`; install
with `pip install 'workbench[tensorboard]'`). Lines:

    {"type": "record", "step": 1, "loss": ..., ...}    StepRecord.to_dict(), one per step
    {"type": "event", "kind": "checkpoint", ...}        Event.to_dict()

Read the whole run with pandas, `pd.read_json(path, lines=True)`, or with
`read_records(path)` (StepRecords, one per step). A resumed run appends to the same file
and logs again the steps after its checkpoint; the newest line of a step is the one that
counts (`read_records` keeps it; with pandas, `drop_duplicates("step", keep="last")`).

Off the hot path: the training thread only puts the record object on a queue; a writer
thread ("workbench-log-<id>") turns it into JSON (and TensorBoard scalars) and writes
what has queued up, then flushes the file. `flush()` waits until everything put so far
is written; `close()` flushes and ends the thread. A full queue (the disk far slower
than training) makes the training thread wait rather than grow memory without bound.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.inputs import InputFileError, open_regular, shown
from workbench.train.records import Event, StepRecord

log = logging.getLogger("workbench")

LOG_NAME = "log.jsonl"
TENSORBOARD_DIR = "tensorboard"
QUEUE_LIMIT = 10_000
TENSORBOARD_INSTALL = "pip install 'workbench[tensorboard]'"

#: StepRecord fields written as TensorBoard scalars, by tag.
SCALARS = {
    "train/loss": "loss",
    "train/lr": "lr",
    "train/grad_norm": "grad_norm",
    "train/loss_scale": "scale",
    "speed/samples_per_s": "samples_per_s",
    "speed/tokens_per_s": "tokens_per_s",
    "time/step_seconds": "step_seconds",
    "time/data_seconds": "data_seconds",
    "time/compute_seconds": "compute_seconds",
    "memory/params_bytes": "params_bytes",
    "memory/grads_bytes": "grads_bytes",
    "memory/optimizer_bytes": "optimizer_bytes",
    "memory/cuda_allocated_bytes": "cuda_allocated_bytes",
    "memory/cuda_max_allocated_bytes": "cuda_max_allocated_bytes",
    "memory/rss_bytes": "rss_bytes",
    "hardware/gpu_util_percent": "gpu_util_percent",
    "hardware/cpu_util_percent": "cpu_util_percent",
}

_STOP = object()


def tensorboard_writer_class() -> Any:
    """`torch.utils.tensorboard.SummaryWriter`, or ImportError saying what to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(
            f"tensorboard=True needs the tensorboard package: {TENSORBOARD_INSTALL} ({exc})"
        ) from exc
    return SummaryWriter


def _open_log(path: Path) -> Any:
    """The run's log opened to append, as a regular file only: opened non-blocking without
    following a link (a FIFO there cannot block, a link planted there is not written
    through), then checked with `fstat` on the descriptor; ValueError naming it otherwise."""
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise ValueError(
            f"run log {shown(str(path), 1000)}: cannot be opened to append "
            f"({exc.strerror or exc}; a link, FIFO or device there is refused)"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(
                f"run log {shown(str(path), 1000)}: not a regular file (a FIFO, device or "
                "socket is refused); move it away or choose another checkpoint_dir"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


class RunLog:
    """JSON lines and/or TensorBoard scalars, written by a background thread.

    `path`: the JSON-lines file (appended to), or None. `tensorboard_dir`: a folder for
    TensorBoard event files, or None. `name`: a suffix for the writer thread's name.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        tensorboard_dir: str | os.PathLike[str] | None = None,
        name: str = "",
    ) -> None:
        self.path = None if path is None else Path(path)
        self.tensorboard_dir = None if tensorboard_dir is None else Path(tensorboard_dir)
        self._tb: Any = None
        if self.tensorboard_dir is not None:
            self._tb = tensorboard_writer_class()(log_dir=str(self.tensorboard_dir))
        self._file: Any = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = _open_log(self.path)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_LIMIT)
        self.error: str | None = None  # the first write failure (later ones are dropped)
        self.written = 0  # lines written
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"workbench-log-{name}".rstrip("-"), daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ training thread
    def put(self, item: StepRecord | Event) -> None:
        """Queue a record or an event (the only work done on the caller's thread)."""
        if not self._closed:
            self._queue.put(item)

    def flush(self) -> None:
        """Wait until everything queued so far is written and flushed."""
        if not self._closed:
            self._queue.join()

    def close(self) -> None:
        """Write what is queued, then end the writer thread and close the files. Called on
        the writer thread itself (a dropped Session's finalizer, which the garbage collector
        may run on any thread), another thread waits for it and closes them."""
        if self._closed:
            return
        self._closed = True
        if threading.current_thread() is self._thread:
            name = f"{self._thread.name}-close"
            threading.Thread(target=self._finish, name=name, daemon=True).start()
            return
        self._finish()

    def _finish(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()
        for name in ("_file", "_tb"):  # a full disk here is reported, never raised
            sink = getattr(self, name)
            if sink is None:
                continue
            try:
                sink.close()
            except Exception as exc:
                if self.error is None:
                    self.error = f"{type(exc).__name__}: {exc}"
                    log.warning(
                        "workbench: run log %s: %s", self.path or self.tensorboard_dir, self.error
                    )

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(items) < 1000:  # whatever queued up meanwhile, in one write
                    items.append(self._queue.get_nowait())
            stop = any(item is _STOP for item in items)
            try:
                self._write([i for i in items if i is not _STOP])
            except Exception as exc:  # a full disk must not stop training
                if self.error is None:
                    self.error = f"{type(exc).__name__}: {exc}"
                    where = self.path or self.tensorboard_dir
                    log.warning("workbench: run log %s: %s", where, self.error)
            finally:
                for _ in items:
                    self._queue.task_done()
            if stop:
                return

    def _write(self, items: list[Any]) -> None:
        if not items:
            return
        if self._file is not None:
            lines = []
            for item in items:
                kind = "record" if isinstance(item, StepRecord) else "event"
                lines.append(json.dumps({"type": kind, **_fields(item)}, default=str))
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
            self.written += len(lines)
        if self._tb is not None:
            for item in items:
                self._write_tensorboard(item)
            self._tb.flush()

    def _write_tensorboard(self, item: Any) -> None:
        if isinstance(item, StepRecord):
            for tag, name in SCALARS.items():
                value = getattr(item, name, None)
                if value is not None and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(tag, value, item.step, walltime=item.wall_time)
        else:
            self._tb.add_text(f"events/{item.kind}", f"step {item.step}: {item.message}", item.step)


def _fields(item: Any) -> dict[str, Any]:
    """A record's or event's fields, as `to_dict()` gives them: a dataclass's own
    `__dict__` (a fifth of `dataclasses.asdict`'s cost; the values are only read)."""
    own = getattr(item, "__dict__", None)
    return own if own is not None else item.to_dict()  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- reading
def iter_lines(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every complete JSON line of a run log, in file order (a torn last line, from a
    process killed mid-write, is skipped). Reading is bounded: `path` must be a regular
    file (a FIFO is refused, never waited on: ValueError), a line longer than any record
    (1 MiB) is skipped without being held in memory, and a line that starts with a NUL
    byte ends the log (the zero-filled tail a crash can leave, of any size, is not read)."""
    with open_regular(path, what="run log") as f:
        while True:
            line = f.readline(_MAX_LINE + 1)
            if not line or line.startswith(b"\0"):
                return
            if len(line) > _MAX_LINE:  # no record is this long: skip to the next line
                while line and not line.endswith(b"\n"):
                    line = f.readline(_MAX_LINE + 1)
                    if line.startswith(b"\0"):
                        return
                continue
            if not line.endswith(b"\n"):
                return
            with contextlib.suppress(ValueError):
                yield json.loads(line)


def read_records(path: str | os.PathLike[str], *, up_to_step: int | None = None) -> list[Any]:
    """The run's StepRecords, one per step in step order; where a resumed run logged a
    step again, its newest line. `up_to_step`: only steps <= it."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in iter_lines(path):
        step = line.get("step") if line.get("type") == "record" else None
        if isinstance(step, int) and (up_to_step is None or step <= up_to_step):
            by_step[step] = line
    return [StepRecord.from_dict(by_step[s]) for s in sorted(by_step)]


def read_events(path: str | os.PathLike[str]) -> list[Event]:
    """The run's events, in the order they were logged."""
    names = set(Event.__dataclass_fields__)
    return [
        Event(**{k: v for k, v in line.items() if k in names})
        for line in iter_lines(path)
        if line.get("type") == "event"
    ]


_MAX_LINE = 1 << 20  # a record line is a few hundred bytes
#: `tail_records` reads at most this many bytes from the end of a log: room for a resumed
#: history's 2048 records of a few hundred bytes each, many times over, and a bound on the
#: time a damaged log (a crash can leave a zero-filled, sparse tail of any size) can take.
MAX_TAIL_BYTES = 16 << 20


def tail_records(path: str | os.PathLike[str], *, up_to_step: int, limit: int) -> list[Any]:
    """The newest `limit` records with step <= `up_to_step` (the newest line of each
    step), read backwards from the end of the file, at most `MAX_TAIL_BYTES` of it: what a
    resumed session's history starts with, in time that does not grow with the run's
    length. ValueError (`workbench.inputs.InputFileError`) when `path` is a symbolic link
    or not a regular file (nothing is read; a FIFO does not block)."""
    if os.path.islink(path):
        raise InputFileError("run log", str(path), "a symbolic link, not a regular file")
    found: dict[int, dict[str, Any]] = {}
    block = 1 << 16
    with open_regular(path, what="run log") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        floor = max(0, end - MAX_TAIL_BYTES)
        carry = b""
        while end > floor and len(found) < limit:
            start = max(floor, end - block)
            f.seek(start)
            chunk = f.read(end - start) + carry
            end = start
            lines = chunk.split(b"\n")
            carry = lines.pop(0) if start > 0 else b""  # maybe cut: joined with the next read
            if len(carry) > _MAX_LINE:  # no record is this long: not a log this wrote
                carry = b""
            for raw in reversed(lines):
                step = _record_step(raw)
                if step is None or step > up_to_step or step in found:
                    continue
                with contextlib.suppress(ValueError):
                    found[step] = json.loads(raw)
                if len(found) >= limit:
                    break
    records = []
    for s in sorted(found):
        with contextlib.suppress(TypeError, ValueError, KeyError, AttributeError):
            records.append(StepRecord.from_dict(found[s]))  # a line of another shape: skipped
    return records


def _record_step(raw: bytes) -> int | None:
    """The step of a record line, without parsing the whole line."""
    if not raw.startswith(b'{"type": "record", "step": '):
        return None
    digits = raw[27:].split(b",", 1)[0]
    return int(digits) if digits.isdigit() else None
