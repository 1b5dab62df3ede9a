"""Where a Session's records and events are written: the run log (`runlog.RunLog`, JSON
lines in `<checkpoint_dir>/log.jsonl`, TensorBoard scalars optionally), opened on first use
and moved when the run folder changes; and the `tensorboard=` setting that asks for it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config import TrainConfig
from workbench.inputs import shown
from workbench.train.records import Event, StepRecord
from workbench.train.runlog import LOG_NAME, TENSORBOARD_DIR, RunLog, tensorboard_writer_class

log = logging.getLogger("workbench")


def tensorboard_setting(value: Any, config: TrainConfig) -> bool | str:
    """`tensorboard=` checked: False, True (needs a run folder) or a folder path; the
    package must be installed (ImportError saying what to install)."""
    if value is False or value is None:
        return False
    if value is True:
        if config.checkpoint_dir is None:
            raise ValueError(
                "tensorboard=True: needs a run folder: set checkpoint_dir in the config, or "
                "pass tensorboard='path/to/folder'"
            )
    elif not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"tensorboard={shown(value)}: must be True, False or a folder path")
    tensorboard_writer_class()
    return True if value is True else str(value)


class SessionLog:
    """The log writer of one Session (`name`: its id). `tensorboard`: a checked
    `tensorboard_setting`. `lock`: the session's state lock, under which the writer is
    opened or moved; `is_closed()` (asked under it) keeps a closed session from opening
    one again."""

    def __init__(
        self,
        name: str,
        tensorboard: bool | str,
        lock: threading.RLock,
        is_closed: Callable[[], bool],
    ) -> None:
        self.name = name
        self.tensorboard = tensorboard
        self._lock = lock
        self._is_closed = is_closed
        self._sink: RunLog | None = None
        self._key: tuple[str | None, str | None] | None = None

    def put(self, item: StepRecord | Event, folder: str | None) -> None:
        """Hand a record or event to the writer for run folder `folder` (a queue put)."""
        sink = self._writer(folder)
        if sink is not None:
            sink.put(item)

    def flush(self) -> None:
        """Wait until everything put so far is written."""
        sink = self._sink
        if sink is not None:
            sink.flush()

    def close(self) -> None:
        """Write everything put so far and end the writer (a later `put` opens a new one)."""
        sink, self._sink = self._sink, None
        self._key = None
        if sink is not None:
            sink.close()

    def _writer(self, folder: str | None) -> RunLog | None:
        """The writer for `folder` (opened on first use, moved when it changes); None
        without a run folder or TensorBoard."""
        tb: str | None = None
        if self.tensorboard is True and folder is not None:
            tb = str(Path(folder) / TENSORBOARD_DIR)
        elif isinstance(self.tensorboard, str):
            tb = self.tensorboard
        key = (folder, tb)
        if key == self._key:
            return self._sink
        with self._lock:
            if key == self._key:
                return self._sink
            self.close()
            self._key = key
            if key == (None, None) or self._is_closed():
                return None
            try:
                self._sink = RunLog(
                    None if folder is None else Path(folder) / LOG_NAME,
                    tensorboard_dir=tb,
                    name=self.name,
                )
            except Exception as exc:
                log.warning(
                    "workbench session %s: no run log (%s: %s)", self.name, type(exc).__name__, exc
                )
            return self._sink
