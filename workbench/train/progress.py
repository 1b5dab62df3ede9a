"""The progress bar of `Session.run()`: a tqdm bar on stderr fed by the session's records."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Protocol

from workbench.train.records import StepRecord


class RecordSource(Protocol):
    """What the bar reads of a Session."""

    id: str

    def on_record(self, callback: Callable[[StepRecord], None]) -> Callable[[], None]: ...


@contextlib.contextmanager
def progress_bar(session: RecordSource, total: int, show: bool | None) -> Iterator[None]:
    """A tqdm bar of `total` steps while this block trains in this thread; `show`: None
    shows it when stderr is a terminal."""
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit="step", desc=f"session {session.id}", leave=True)

    def advance(record: StepRecord) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{record.loss:.4g}", refresh=False)

    remove = session.on_record(advance)
    try:
        yield
    finally:
        remove()
        bar.close()
