"""Reading what a user hands the workbench: bounded files, strict JSON, values shown safely.

Every file the workbench reads on a user's behalf (a config.json, a DeepSpeed config, a
hostfile, a ladder's rung file, a job's job.json, a checkpoint's manifest) goes through
`read_text` or `read_json`, which guarantee:

* only a regular file is opened: a directory, a FIFO, a device (`/dev/zero`,
  `/dev/urandom`) or a socket is refused before `open()`, and the file is opened
  non-blocking and checked again with `fstat` on the open descriptor (`open_regular`), so a
  file swapped for a FIFO between the check and the open blocks nothing;
* at most `max_bytes` are read, and a larger file is refused with its size and the limit;
* the text must be UTF-8; a decode error names the path and the byte offset;
* JSON is strict: a key given twice in one object, `NaN` / `Infinity`, a number too large
  for a float (`1e400`) or an integer of more than 4,300 digits are errors, never a silent
  last-value-wins or `inf`; nesting deeper than `max_depth` is refused (no RecursionError).

Every failure is an `InputFileError` (a `ValueError`) that carries `what` (the flag or
field that named the file), `path` and `reason` as data; its text is made from them.
`shown(value)` is the `repr` to put in an error message: bounded in length and in the work
it takes to build (a deep or self-sharing container is looked at to a few levels only), and
safe for integers too large for `repr` (Python refuses to print more than 4,300 digits).

Pure: imports nothing of the package and no torch.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import reprlib
import stat
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

#: Default size limit of a settings file (a config.json, a DeepSpeed config, a job.json).
MAX_SETTINGS_BYTES = 16 * 1024 * 1024
#: Default nesting limit of a settings file: the deepest real config nests fewer than 10.
MAX_JSON_DEPTH = 64


class InputFileError(ValueError):
    """A file (or JSON text) the workbench cannot read: `what` named it, `path` is where it
    is, `reason` says what is wrong."""

    def __init__(self, what: str, path: str, reason: str) -> None:
        self.what = what
        self.path = path
        self.reason = reason
        super().__init__(f"{what} {shown(path)}: {reason}")


#: Python's own types, answered without the ABC checks below (the hot path of every
#: TrainConfig: the planner builds thousands).
_PLAIN_NOT_BOOL = frozenset({int, float, str, type(None)})
_PLAIN_NOT_INT = frozenset({bool, float, str, type(None)})
_PLAIN_NOT_NUMBER = frozenset({bool, str, type(None)})


def _torch_scalar(v: Any) -> str | None:
    """What a 0-dim torch tensor holds: "bool", "int" or "float" (a real dtype with its data
    on a device, not a subclass such as a fake tensor), else None. torch is not imported
    here: a tensor exists only where the caller imported it."""
    torch = sys.modules.get("torch")
    if torch is None or type(v) is not getattr(torch, "Tensor", None):
        return None
    if v.dim() != 0 or v.is_meta:
        return None
    if v.dtype is torch.bool:
        return "bool"
    if v.dtype.is_floating_point:
        return "float"
    integers = ("uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64")
    return "int" if any(v.dtype is getattr(torch, name, None) for name in integers) else None


def is_bool(v: Any) -> bool:
    """True/False, NumPy's booleans and a 0-dim torch bool tensor included (no number)."""
    t = type(v)
    if t is bool:
        return True
    if t in _PLAIN_NOT_BOOL:
        return False
    if isinstance(v, bool) or (t.__name__ in ("bool_", "bool") and hasattr(v, "item")):
        return True
    return _torch_scalar(v) == "bool"


def is_int(v: Any) -> bool:
    """An integer: int, a NumPy integer scalar or a 0-dim torch tensor of an integer dtype,
    never a bool (`plain_number` gives the Python int it holds)."""
    t = type(v)
    if t is int:
        return True
    if t in _PLAIN_NOT_INT:
        return False
    if isinstance(v, numbers.Integral):
        return not is_bool(v)
    return _torch_scalar(v) == "int"


def is_number(v: Any) -> bool:
    """A finite real number: int, float, a NumPy scalar of either or a 0-dim torch tensor
    of an integer or floating dtype, never a bool."""
    t = type(v)
    if t is float:
        return math.isfinite(v)
    if t in _PLAIN_NOT_NUMBER:
        return False
    if not isinstance(v, numbers.Real):
        return _torch_scalar(v) in ("int", "float") and math.isfinite(float(v))
    if is_bool(v):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def plain_number(v: Any) -> Any:
    """A NumPy or torch scalar as the Python bool, int or float it holds (`is_bool`,
    `is_int`, `is_number`); any other value unchanged."""
    t = type(v)
    if t in _PLAIN_NOT_BOOL or t is bool:
        return v
    if is_bool(v):
        return bool(v)
    if is_int(v):
        return int(v)
    if is_number(v):
        return float(v)
    return v


#: How much of a container `shown` looks at: nesting levels, and items per level. The
#: work is bounded by these, not by the value: a list of shared references nested 40 deep
#: (`[L, L]` with `L = [L', L']`, a few bytes in a file) has 2^40 leaves, and its full
#: `repr()` never finishes.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 3
_SHOWN.maxdict = _SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxset = _SHOWN.maxfrozenset = 8
_SHOWN.maxdeque = _SHOWN.maxarray = 8
_SHOWN.maxlong = 40
_SHOWN.maxstring = _SHOWN.maxother = 100


def shown(value: Any, limit: int = 80) -> str:
    """`repr(value)` for an error message, built with bounded work: an integer of more than
    30 digits as its size ("an integer of 61 digits"), a container to 3 levels and 8 items a
    level (`reprlib`), a string from its first `limit` characters, and anything longer than
    `limit` characters cut with '...'."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
    try:
        if isinstance(value, (str, bytes)):
            text = repr(value[: limit + 1])
        elif isinstance(value, (dict, list, tuple, set, frozenset)):
            text = _SHOWN.repr(value)
        else:
            text = repr(value)
    except Exception:  # a value whose repr fails still gets a message
        text = f"<{type(value).__name__}>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


_GROUPED = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?$")


def ungrouped(text: str) -> str | None:
    """`text` without its thousands separators when they group digits in threes
    ("1,000,000" -> "1000000"), the text itself when it has no comma, and None when its
    commas group nothing ("1,2,3" is no number: never read as 123)."""
    if "," not in text:
        return text
    return text.replace(",", "") if _GROUPED.match(text.strip()) else None


def typed(text: str) -> str:
    """A flag's text for a message: as typed, unless it is empty, longer than 80
    characters, not printable or padded with spaces (then quoted and cut by `shown`), so a
    message stays one readable line whatever was typed."""
    plain = bool(text) and text == text.strip() and len(text) <= 80 and text.isprintable()
    return text if plain else shown(text)


def file_kind(mode: int) -> str:
    """What a file of `st_mode` `mode` is, for a message ("a FIFO (named pipe)", ...)."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bytes(
    path: str | os.PathLike[str], *, what: str, max_bytes: int = MAX_SETTINGS_BYTES
) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` of them; InputFileError
    naming `what` and the path for anything else."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise InputFileError(what, str(path), "must be a path to a file")
    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    try:
        info = os.stat(name)
    except FileNotFoundError:
        raise InputFileError(what, name, "no such file") from None
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, no permission
        raise InputFileError(what, name, f"cannot be read ({_reason(exc)})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(what, name, f"{file_kind(info.st_mode)}, not a regular file")
    if info.st_size > max_bytes:
        raise InputFileError(
            what, name, f"{info.st_size:,} bytes: larger than the {max_bytes:,}-byte limit"
        )
    try:
        with open_regular(name, what=what) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(what, name, f"cannot be read ({_reason(exc)})") from None
    if len(data) > max_bytes:  # grew since the stat
        raise InputFileError(what, name, f"larger than the {max_bytes:,}-byte limit")
    return data


def open_regular(path: str | os.PathLike[str], *, what: str) -> BinaryIO:
    """`path` opened for reading in binary, checked on the open descriptor: opened
    non-blocking (a FIFO swapped in after a `stat` by name cannot block the open), then
    `fstat` must say a regular file, else InputFileError naming `what` and the path. The
    caller closes the file (`with open_regular(...) as f`)."""
    name = os.fsdecode(os.fspath(path))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:
        raise InputFileError(what, name, "no such file") from None
    except (OSError, ValueError) as exc:
        raise InputFileError(what, name, f"cannot be read ({_reason(exc)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputFileError(what, name, f"{file_kind(mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(
    path: str | os.PathLike[str], *, what: str, max_bytes: int = MAX_SETTINGS_BYTES
) -> str:
    """`read_bytes` decoded as UTF-8; a decode error names the byte offset."""
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(
            what,
            os.fspath(path),
            f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
        ) from None


def read_json(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = MAX_SETTINGS_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """The strict JSON value in the file `path` (see the module docstring)."""
    text = read_text(path, what=what, max_bytes=max_bytes)
    return parse_json(text, what=what, path=os.fspath(path), max_depth=max_depth)


class DuplicateKey(Exception):
    """A JSON object gives `key` twice (`no_duplicate_keys`)."""

    def __init__(self, key: str) -> None:
        self.key = key


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' object_pairs_hook that refuses a key given twice (DuplicateKey)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


class _NotFinite(Exception):
    def __init__(self, text: str) -> None:
        self.text = text


def _refuse_constant(text: str) -> Any:
    raise _NotFinite(text)


def parse_json(text: str, *, what: str, path: str = "", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The strict JSON value of `text`; InputFileError naming `what` (and `path`, or the
    text itself when it came from a flag) for anything else."""
    where = path or text
    try:
        value = json.loads(
            text,
            object_pairs_hook=no_duplicate_keys,
            parse_float=_finite_float,
            parse_constant=_refuse_constant,
        )
    except DuplicateKey as dup:
        raise InputFileError(
            what, where, f"key {shown(dup.key)} appears twice in one object (which one is meant?)"
        ) from None
    except _NotFinite as bad:
        raise InputFileError(
            what, where, f"{shown(bad.text)}: JSON numbers must be finite (no NaN, Infinity, 1e400)"
        ) from None
    except RecursionError:
        raise InputFileError(what, where, f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise InputFileError(
            what, where, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except ValueError:  # Python reads no integer of more than 4,300 digits
        raise InputFileError(
            what, where, "not valid JSON (an integer of more than 4,300 digits)"
        ) from None
    if _depth_exceeds(value, max_depth):
        raise InputFileError(what, where, f"nested deeper than {max_depth} levels")
    return value


def _children(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, list):
        yield from value


def _depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether `value` nests containers more than `max_depth` deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return True
            stack.extend((child, depth + 1) for child in _children(item))
    return False


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_SETTINGS_BYTES",
    "InputFileError",
    "parse_json",
    "read_bytes",
    "read_json",
    "file_kind",
    "is_bool",
    "open_regular",
    "is_int",
    "is_number",
    "plain_number",
    "read_text",
    "shown",
    "typed",
    "ungrouped",
]
