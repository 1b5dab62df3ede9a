"""Writing what a command produces: all of it or none of it.

`write_files(folder, {name: data})` first writes every file under a temporary name in
`folder` (same file system, so the renames are atomic), flushes each to disk, and only
when all of them were written renames them into place. A failure while writing (a full
disk, a file name taken by a folder, no permission) removes the temporary files and
leaves what `folder` held before whole: never a job whose `ds_config.json` describes the
new settings while its `launch.sh` still describes the old ones.
`write_file(path, data)` is the same for one file.

Writes land only where meant: a name that exists and is not a regular file (a device such as
`/dev/null`, a FIFO, a socket, a folder) is refused with its path before anything is written,
instead of being replaced by a regular file. A symbolic link is followed only where the user
named it (`write_file(path)`, `check_target(path)`): the file it points to is replaced
atomically and the link stays; under a folder whose file names the workbench chooses
(`write_files`) a link is refused. `check_target` says the same before any work is done.

Pure: imports only workbench.inputs (to show a path in an error) and no torch.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from workbench.inputs import file_kind, shown


class OutputError(ValueError):
    """A command's output could not be written; nothing of it was put in place.
    `path` is the file that failed, `reason` what happened."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot write {shown(path, 1000)}: {reason}; nothing was changed there")


def check_target(path: str | os.PathLike[str], *, follow_symlink: bool = True) -> Path:
    """Where a write to `path` lands: `path` itself when it does not exist or is a regular
    file; with `follow_symlink` (the user named the path), the regular file a symbolic link
    points to (or would create). Anything else (a device, a FIFO, a socket, a folder, a link
    when `follow_symlink` is False, a link to any of these) raises OutputError naming it:
    an atomic rename over it would turn it into a regular file."""
    target = Path(path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        raise OutputError(str(target), f"cannot be used ({reason})") from None
    if stat.S_ISLNK(info.st_mode):
        if not follow_symlink:
            raise OutputError(
                str(target),
                "is a symbolic link; the workbench names this file itself and "
                "does not write through a link it did not ask for",
            )
        resolved = Path(os.path.realpath(target))
        try:
            info = os.stat(resolved)
        except FileNotFoundError:
            return resolved
        except OSError as exc:
            raise OutputError(str(target), f"cannot be used ({exc.strerror or exc})") from None
        if not stat.S_ISREG(info.st_mode):
            raise OutputError(
                str(target),
                f"is a link to {file_kind(info.st_mode)} ({resolved}), not a regular file",
            )
        return resolved
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(
            str(target), f"exists and is {file_kind(info.st_mode)}, not a regular file"
        )
    return target


def target_problem(path: str | os.PathLike[str], *, folder: bool) -> str | None:
    """Why `path` cannot take a command's output (None when it can), said before any work:
    `folder` True: a folder, or a place one can be made; False: a file in such a place."""
    target = Path(path)
    try:
        if folder and target.exists() and not target.is_dir():
            return f"exists and is {_kind(target)}, where a folder is needed"
        if not folder and target.is_dir():
            return "is a folder; name a file"
        if not folder:
            try:
                check_target(target)
            except OutputError as exc:
                return exc.reason
        parent = next((p for p in target.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            return f"{parent} is {_kind(parent)}, where a folder is needed"
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        return f"cannot be used ({reason})"
    return None


def _kind(path: Path) -> str:
    """What an existing `path` that is no folder is ("a file", "a FIFO (named pipe)",
    "a device", ...), a link followed."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "not a folder"
    return "a file" if stat.S_ISREG(mode) else file_kind(mode)


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def write_files(
    folder: str | os.PathLike[str],
    files: Mapping[str, bytes | str],
    *,
    modes: Mapping[str, int] | None = None,
    follow: frozenset[str] = frozenset(),
) -> list[Path]:
    """Write `files` (name relative to `folder` -> bytes or text) all at once; returns
    their paths. `modes`: permission bits by name (e.g. 0o755 for a script). `follow`: the
    names the user gave, whose symbolic links are written through (`check_target`)."""
    root = Path(folder)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, data in files.items():
            named = root / name
            try:
                named.parent.mkdir(parents=True, exist_ok=True)
                if named.is_dir():
                    raise IsADirectoryError(21, "a folder has that name", str(named))
                target = check_target(named, follow_symlink=name in follow)
                fd, tmp_name = tempfile.mkstemp(
                    dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
                )
                tmp = Path(tmp_name)
                staged.append((tmp, target))
                with os.fdopen(fd, "wb") as f:
                    f.write(_as_bytes(data))
                    f.flush()
                    os.fsync(f.fileno())
                mode = (modes or {}).get(name)
                os.chmod(tmp, 0o644 if mode is None else mode)
            except OSError as exc:
                raise OutputError(str(named), exc.strerror or str(exc)) from None
        for tmp, target in staged:
            os.replace(tmp, target)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    return [target for _, target in staged]


def write_file(path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None) -> Path:
    """Write one file atomically (see `write_files`); returns its path."""
    target = Path(path)
    return write_files(
        target.parent,
        {target.name: data},
        modes=None if mode is None else {target.name: mode},
        follow=frozenset({target.name}),
    )[0]


__all__ = ["OutputError", "check_target", "target_problem", "write_file", "write_files"]
