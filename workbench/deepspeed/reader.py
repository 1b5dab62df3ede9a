"""Reading a DeepSpeed config before its keys are mapped: the `Reader` that collects
errors and warnings while the keys are read, loading the config from a dict or a JSON
file, and the checks of its shape (depth, keys that are not strings, values JSON cannot
hold, strings that read as booleans or numbers). Pure.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from workbench.deepspeed.problems import KeyProblem, keyed
from workbench.estimate.limits import nesting_problem
from workbench.inputs import shown


class Reader:
    """Collects, while a config is read: errors (key path, value, what is allowed), the
    keys not modelled, the "auto" values filled, and other notes."""

    def __init__(self) -> None:
        self.errors: list[KeyProblem] = []
        self.ignored: list[str] = []  # read by DeepSpeed, not modelled by the workbench
        self.unread: list[str] = []  # not read by DeepSpeed either
        # read by an estimate's DeepSpeed buffer terms, not set in a session
        self.estimate_only: list[str] = []
        self.filled: list[str] = []  # "auto" values filled from the session's settings
        self.defaulted: list[str] = []  # "auto" values left to DeepSpeed's defaults
        self.auto_paths: set[str] = set()
        self.notes: list[str] = []  # warnings of their own

    def ignore(self, entry: str) -> None:
        self.ignored.append(entry.replace("; ", ", "))  # "; " separates the entries

    def warnings(self, deepspeed_name: str) -> tuple[str, ...]:
        out: list[str] = []
        if self.filled or self.defaulted:
            text = '"auto" values'
            if self.filled:
                text += " filled from the session's settings: " + "; ".join(self.filled)
            if self.defaulted:
                text += ("; and" if self.filled else "") + " left to DeepSpeed's defaults: "
                text += "; ".join(self.defaulted)
            out.append(text)
        if self.ignored or self.unread:
            parts = []
            if self.ignored:
                parts.append(
                    f"not modelled by the workbench, ignored ({len(self.ignored)}): "
                    + "; ".join(self.ignored)
                )
            if self.unread:
                parts.append(
                    f"not read by {deepspeed_name} either, ignored ({len(self.unread)}): "
                    + "; ".join(self.unread)
                )
            out.append(". ".join(parts))
        if self.estimate_only:
            out.append(
                "read by `workbench estimate --deepspeed-config` (its DeepSpeed buffer "
                "terms), not set in the session, whose engine sizes its own "
                f"({len(self.estimate_only)}): " + "; ".join(self.estimate_only)
            )
        return (*out, *self.notes)

    def block(self, parent: dict[str, Any], key: str, path: str) -> dict[str, Any] | None:
        if key not in parent:
            return None
        value = parent[key]
        if not isinstance(value, dict):
            self.errors.append(KeyProblem(path, value, "must be a JSON object"))
            return None
        return value

    def integer(self, block: dict[str, Any], key: str, path: str, minimum: int) -> int | None:
        if key not in block:
            return None
        v = block[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.errors.append(KeyProblem(path, v, f"must be an integer >= {minimum}"))
            return None
        return v

    def number(
        self, block: dict[str, Any], key: str, path: str, *, allow_zero: bool = True
    ) -> float | None:
        if key not in block:
            return None
        v = block[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = ok and (v >= 0 if allow_zero else v > 0)
        if not ok:
            rng = ">= 0" if allow_zero else "> 0"
            self.errors.append(KeyProblem(path, v, f"must be a finite number {rng}"))
            return None
        return float(v)

    def boolean(self, block: dict[str, Any], key: str, path: str) -> bool | None:
        if key not in block:
            return None
        v = block[key]
        if not isinstance(v, bool):
            self.errors.append(KeyProblem(path, v, "must be true or false"))
            return None
        return v

    def string(self, block: dict[str, Any], key: str, path: str) -> str | None:
        if key not in block:
            return None
        v = block[key]
        if not isinstance(v, str):
            self.errors.append(KeyProblem(path, v, "must be a string"))
            return None
        return v


#: The largest integer a DeepSpeed config may hold: past 2**53 a JSON number is no longer
#: exact in most JSON readers (a float's 53-bit mantissa), and no batch size, step count or
#: bucket size comes near it.
MAX_INTEGER = 2**53
#: Keys that only say how often DeepSpeed logs: the workbench allocates and loops over
#: nothing by them, so any positive integer is taken (configs write 2e16 to mean "never
#: print", e.g. LMFlow's ds_config_chatbot.json: `"steps_per_print": 20000000000000000`).
LOG_INTERVAL_KEYS = frozenset({"steps_per_print"})
#: How deep a DeepSpeed config may nest: the deepest real one nests 4 levels.
MAX_DEPTH = 32
#: A string value that reads as a boolean or a number where DeepSpeed expects one (keys
#: whose names say they hold a name, a path or a kind are strings by nature).
_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off"})
_STRING_KEY = re.compile(
    r"(path|name|dir|file|project|team|group|tag|backend|type|dtype|device|mode|label|prefix|entity)$",
    re.I,
)


def load_config(source: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The config as a dict: a dict as given, or the strict JSON of a regular file
    (`workbench.inputs.read_json`: size and depth bounded, duplicate keys refused)."""
    from workbench.inputs import read_json

    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)):
        data = read_json(source, what="DeepSpeed config", max_depth=MAX_DEPTH)
        if not isinstance(data, dict):
            raise ValueError(
                f"DeepSpeed config {shown(os.fspath(source))}: must hold a JSON object, "
                f"not {type(data).__name__}"
            )
        return data
    raise ValueError(f"source={shown(source)}: must be a dict or a path to a JSON file")


def too_deep(ds: Any) -> KeyProblem | None:
    """The problem when `ds` nests deeper than MAX_DEPTH, contains itself or holds more
    values than any config (a list reached by many paths counted each time), naming the
    key path where it shows; each container is looked at once, so a config nested 200,000
    levels deep or `L = [L, L]` forty times over is refused at once, not a RecursionError
    or a walk of 2^40 values."""
    found = nesting_problem(ds, MAX_DEPTH)
    if found is None:
        return None
    why, at = found
    path = ".".join(shown(k) if not isinstance(k, (str, int)) else str(k) for k in at[:40])
    return keyed(path[:200] or "the config", why)


_DROP = object()


def cleaned(ds: dict[str, Any]) -> tuple[dict[str, Any], list[KeyProblem], list[str]]:
    """`ds` without the values that make it no JSON-like DeepSpeed config, the problem
    line of each (keys that are not strings, values JSON cannot hold: NaN, infinity,
    integers past MAX_INTEGER (but a log interval), other objects; strings that read as a boolean or a number,
    which DeepSpeed would take as true or coerce) and their key paths. `ds` nests at most
    MAX_DEPTH levels (checked first)."""
    problems: list[KeyProblem] = []
    dropped: list[str] = []

    def drop(path: str, problem: KeyProblem) -> object:
        problems.append(problem)
        dropped.append(path)
        return _DROP

    def clean(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, child in value.items():
                if not isinstance(key, str):
                    drop(
                        path,
                        keyed(f"{path + '.' if path else ''}{shown(key)}", "keys must be strings"),
                    )
                    continue
                kept = clean(child, f"{path}.{key}" if path else key)
                if kept is not _DROP:
                    out[key] = kept
            return out
        if isinstance(value, (list, tuple)):
            items = [clean(child, f"{path}[{i}]") for i, child in enumerate(value)]
            return _DROP if _DROP in items else items
        if value is None or isinstance(value, (bool, str)):
            bad = _string_problem(path, value) if isinstance(value, str) else None
            return value if bad is None else drop(path, bad)
        if isinstance(value, int):
            if abs(value) > MAX_INTEGER and not (path in LOG_INTERVAL_KEYS and value > 0):
                return drop(
                    path,
                    KeyProblem(
                        path,
                        value,
                        f"larger than {MAX_INTEGER:,} (2**53, the largest integer a JSON "
                        "number holds exactly)",
                    ),
                )
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                return drop(path, KeyProblem(path, value, "must be a finite number"))
            return value
        return drop(
            path,
            KeyProblem(
                path,
                value,
                f"a {type(value).__name__} is no JSON value (numbers, strings, true/false, "
                "null, lists and objects)",
            ),
        )

    return clean(ds, ""), problems, dropped


def _string_problem(path: str, value: str) -> KeyProblem | None:
    """The problem of a string that reads as a boolean or a number, else None."""
    key = re.sub(r"\[\d+\]$", "", path).rpartition(".")[2]
    if _STRING_KEY.search(key) or value == "auto":
        return None
    text = value.strip().lower()
    if text in _BOOL_WORDS:
        meant = "true" if text in ("true", "yes", "on") else "false"
        return KeyProblem(
            path,
            value,
            f"a string where DeepSpeed expects true or false; write {meant} without quotes",
        )
    try:
        number = float(text)
    except ValueError:
        return None
    if "_" in text:
        return KeyProblem(
            path,
            value,
            "a string where DeepSpeed expects a number; write it without quotes and "
            "without '_' separators",
        )
    written = shown(
        number if not number.is_integer() or "e" in text or "." in text else int(number)
    )
    return KeyProblem(
        path, value, f"a string where DeepSpeed expects a number; write {written} without quotes"
    )
