"""Writing a checkpoint: each file to a temporary name, flushed and fsynced, then renamed
(the tensor file first, its manifest last) and the folder fsynced, so a process killed at
any point leaves the previous checkpoints whole; a full disk is one OSError saying so."""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from workbench.inputs import shown
from workbench.outputs import check_target
from workbench.train.checkpointing.files import MANIFEST_KIND, manifest_path
from workbench.train.checkpointing.payload import check_plain
from workbench.version import __version__

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class _HashingWriter:
    """A file wrapper that counts and hashes what is written through it, and keeps the
    first exception a write raised (torch's writer reports it as its own RuntimeError,
    "enforce fail at inline_container.cc"; the original is what the caller gets)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        try:
            written = int(self._f.write(data))
            self.sha256.update(data)
            self.size += len(memoryview(data).cast("B"))
        except BaseException as exc:  # a full disk, or Ctrl-C while writing or hashing
            if self.error is None:
                self.error = exc
            raise
        return written

    def flush(self) -> None:
        self._f.flush()


def _disk_full(target: Path) -> OSError:
    return OSError(
        errno.ENOSPC,
        f"the disk is full: {target.name} was not written (its temporary file is removed); "
        "the previous checkpoints are whole. Free some space, or save elsewhere",
        str(target),
    )


def _write_tmp(target: Path, write: Any) -> tuple[Path, int, str]:
    """`write(file)` into `target.tmp`, flushed and fsynced; returns (the temporary file,
    the bytes written, their SHA-256). Any failure removes the temporary file; the
    exception raised is the write's own (a KeyboardInterrupt stays one), and a full disk
    is one OSError saying so."""
    # `target` is checked by the caller (`check_target`: never a rename over a device,
    # FIFO, socket or folder). The temporary name is the workbench's own: whatever has it
    # (a killed save's leftover, or a link planted there) is removed, not written through,
    # and the new file is created exclusively without following a link.
    tmp = target.with_name(target.name + ".tmp")
    w: _HashingWriter | None = None
    try:
        with contextlib.suppress(FileNotFoundError):
            if not os.path.isdir(tmp) or os.path.islink(tmp):
                os.unlink(tmp)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(tmp, flags, 0o644), "wb") as f:
            w = _HashingWriter(f)
            try:
                write(w)
            except BaseException:
                if w.error is not None:  # torch's wrapper of what the file raised
                    raise w.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
            raise _disk_full(target) from None
        raise
    return tmp, w.size, w.sha256.hexdigest()


def _write_tmp_then_rename(target: Path, write: Any) -> tuple[int, str]:
    """`write(file)` into `target.tmp`, flush, fsync, rename over `target` (which must be
    a regular file or nothing: `workbench.outputs.check_target`); returns the bytes
    written and their SHA-256. Any failure removes the temporary file."""
    target = check_target(target)
    tmp, size, digest = _write_tmp(target, write)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, digest


def _fsync_dir(directory: Path) -> None:
    """Make the renames in `directory` durable (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(payload: Any, path: str | os.PathLike[str]) -> Path:
    """`torch.save` to a temporary file beside `path`, fsync, then rename over `path`
    (one file, no manifest: for plain weights)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_tmp_then_rename(target, lambda f: torch.save(payload, f))
    _fsync_dir(target.parent)
    return target


def save(
    payload: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    describe: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint: the tensor file at `path`, then its manifest beside it (see the
    module docstring). `describe`: more manifest fields (model, world size, the log).
    Returns the tensor file's path."""
    target = Path(path)
    if target.suffix == ".json":
        raise ValueError(f"path={shown(str(target), 1000)}: .json is the manifest's name; use .pt")
    check_plain(payload)
    target.parent.mkdir(parents=True, exist_ok=True)
    # both names are the workbench's (a step-N.pt in a run folder, its manifest): a link
    # planted under either is refused, never written through
    target = check_target(target, follow_symlink=False)
    manifest_file = check_target(manifest_path(target), follow_symlink=False)
    tensor_tmp, size, digest = _write_tmp(target, lambda f: torch.save(payload, f))
    manifest = {
        "kind": MANIFEST_KIND,
        "format": int(payload["format"]),
        "file": target.name,
        "bytes": size,
        "sha256": digest,
        "step": payload["step"],
        "config": payload["config"],
        "model": payload["model"],
        "data": payload["data"],
        "reference_batch": payload["reference_batch"],
        **(describe or {}),
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"workbench": _workbench_version(), "torch": torch.__version__},
    }
    text = json.dumps(manifest, indent=2, default=str) + "\n"
    try:
        manifest_tmp, _, _ = _write_tmp(manifest_file, lambda f: f.write(text.encode("utf-8")))
    except BaseException:
        tensor_tmp.unlink(missing_ok=True)
        raise
    try:  # both files are whole on disk: now the real names (the manifest last)
        os.replace(tensor_tmp, target)
        os.replace(manifest_tmp, manifest_file)
    except BaseException:
        tensor_tmp.unlink(missing_ok=True)
        manifest_tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return target


def _workbench_version() -> str:
    return str(__version__)
