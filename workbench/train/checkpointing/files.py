"""A checkpoint's files and names: the tensor file `step-N.pt` and its manifest
`step-N.json` in a run folder, the constants of the format, `CheckpointError`, and the
listing of a folder's complete checkpoints (the layout is in `workbench.train.checkpoints`)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from workbench import inputs
from workbench.inputs import InputFileError, is_int, shown

CHECKPOINT_FORMAT = 2
PREVIOUS_FORMAT = 1
MANIFEST_KIND = "workbench-checkpoint"
#: a run folder's tensor file name, its step in the group
STEP_NAME = re.compile(r"^step-(\d+)\.pt$")
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few kB; its config and options are small
#: Steps, data offsets and batch sizes are at most this (a 64-bit counter's range).
MAX_COUNT = 2**63 - 1
#: A run id: what `new_run_id` gives, or a previous save's (letters, digits, '-').
RUN_ID = re.compile(r"^[0-9a-z][0-9a-z-]{0,63}$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed: missing, incomplete, truncated, altered, or
    holding objects a checkpoint never contains. As data: `path` (the file), `reason` (why)
    and `hint` (what to do about it, "" when nothing); the message is "path='...': reason"
    with the hint after it."""

    def __init__(self, path: str | os.PathLike[str], reason: str, hint: str = "") -> None:
        self.path = str(path)
        self.reason = reason
        self.hint = hint
        super().__init__(f"path={shown(self.path, 1000)}: {reason}" + (f"; {hint}" if hint else ""))

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, as a plain ValueError is
        return (type(self), (self.path, self.reason, self.hint))


def is_checkpoint_name(name: str) -> bool:
    """Whether `name` is a run folder's checkpoint name (`step-N.pt`)."""
    return STEP_NAME.match(name) is not None


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """The manifest beside a tensor file: `step-N.pt` -> `step-N.json`."""
    return Path(path).with_suffix(".json")


def is_count(value: Any) -> bool:
    """An integer from 0 to MAX_COUNT (a step, data offset or batch size)."""
    return is_int(value) and 0 <= value <= MAX_COUNT


def open_regular(path: str | os.PathLike[str], *, follow: bool = True) -> Any:
    """A binary file object reading `path`, which must be a regular file
    (`workbench.inputs.open_regular`: opened without blocking, so a FIFO swapped in does
    not hang the open, then checked with `fstat` on the descriptor that is read).
    `follow=False`: a symbolic link is refused (a name the workbench chose, not the
    user). CheckpointError when it is missing or not a regular file."""
    if not follow and os.path.islink(path):
        raise CheckpointError(path, "a symbolic link; only a regular file is read here")
    try:
        return inputs.open_regular(path, what="checkpoint file")
    except InputFileError as exc:
        raise CheckpointError(path, f"{exc.reason}; nothing was read") from None


def step_files(directory: Path) -> list[tuple[int, Path]]:
    return sorted(
        (int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_NAME.match(p.name))
    )


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints in `directory` (`step-N.pt` with its manifest), oldest first.
    A folder without any manifest is one of the previous format: its `step-N.pt` files."""
    d = Path(directory)
    if not d.is_dir():
        return []
    files = step_files(d)
    complete = [p for _, p in files if manifest_path(p).is_file()]
    if complete or any(d.glob("step-*.json")):
        return complete
    return [p for _, p in files]
