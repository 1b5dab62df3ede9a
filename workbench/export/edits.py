"""What a re-export does with the files of a job folder the user edited.

An export rewrites its job whole, so that the script, `job_common.py`, `job.json`,
`launch.sh` and `ds_config.json` always describe one job. The files a user is told or likely
to edit are not lost to that:

* a script copied verbatim from the package (`train_*.py`, `job_common.py`, `job_files.py`,
  `job_parallel.py`) that differs from the package's copy (edited, or from another version of
  the workbench) is replaced, and the old text is kept beside it as `NAME.edited` (`.edited.2`,
  ... when that name holds other text), written with the job in the same all-or-nothing write;
* every other file the export writes (`ds_config.json`, `job.json`, `launch.sh`) that is in
  the folder already and is not, byte for byte, what an earlier export wrote there (the
  export records a SHA-256 of each file it writes in `MANIFEST_NAME`): the user's own file
  (`--out .` beside their `ds_config.json`, the `--config` file itself) or one they edited
  since, kept the same way as `NAME.edited`;
* the `hostfile` template an export writes for several nodes (the report says to fill it in)
  is not written over a hostfile that is no template: the filled-in one is kept.

Each of these is one warning line of the export (`ExportResult.warnings`, printed by the
command line). Pure: reads the folder, writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

#: the suffix of a kept copy of an edited script
EDITED_SUFFIX = ".edited"
#: the file in a job folder recording what the export wrote there (name -> SHA-256)
MANIFEST_NAME = ".workbench-export.json"
_TEMPLATE_HOST = re.compile(r"^node-(\d+) slots=(\d+)$")


def _read(path: Path) -> str | None:
    """The text of the regular file `path`, None when there is none (or it is no text)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _kept_name(out: Path, name: str, text: str) -> str | None:
    """The first `NAME.edited[.k]` free for `text` in `out` (None: a copy holds it already)."""
    for k in range(1, 1000):
        kept = f"{name}{EDITED_SUFFIX}" + (f".{k}" if k > 1 else "")
        held = out / kept
        if not held.exists() and not held.is_symlink():
            return kept
        if _read(held) == text:
            return None
    return None


def keep_edited_scripts(
    out: Path, files: dict[str, str], verbatim: tuple[str, ...]
) -> tuple[dict[str, str], list[str]]:
    """(the kept copies to write with the job, a warning per copy) for the `verbatim` files
    of `files` whose text in `out` differs from the one about to be written."""
    kept: dict[str, str] = {}
    warnings: list[str] = []
    for name in verbatim:
        old = _read(out / name)
        if old is None or old == files[name]:
            continue
        copy = _kept_name(out, name, old)
        if copy is not None:
            kept[copy] = old
        where = copy or "an earlier copy beside it"
        warnings.append(
            f"{name} in {out} differed from the workbench's (edited, or from another "
            f"version): replaced by the workbench's, so that the job's files agree; your text "
            f"is kept in {where}"
        )
    return kept, warnings


def digest(text: str) -> str:
    """The SHA-256 of `text` (UTF-8), as the manifest records it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest_text(files: dict[str, str]) -> str:
    """The manifest of the files an export writes: each name's SHA-256."""
    return json.dumps({"sha256": {n: digest(t) for n, t in sorted(files.items())}}, indent=2) + "\n"


def _written(out: Path) -> dict[str, str]:
    """name -> SHA-256 of what the last export wrote in `out` (empty without a manifest)."""
    text = _read(out / MANIFEST_NAME)
    try:
        found = json.loads(text)["sha256"] if text is not None else {}
    except (ValueError, KeyError, TypeError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def keep_user_files(
    out: Path, files: dict[str, str], names: tuple[str, ...]
) -> tuple[dict[str, str], list[str]]:
    """(the kept copies to write with the job, a warning per copy) for the `names` of
    `files` (the files an export derives from the settings: ds_config.json, job.json,
    launch.sh) that `out` holds with other text than about to be written and not as the
    last export wrote them: the user's own file, or one they edited since."""
    written = _written(out)
    kept: dict[str, str] = {}
    warnings: list[str] = []
    for name in names:
        old = _read(out / name)
        if old is None or old == files[name] or written.get(name) == digest(old):
            continue
        copy = _kept_name(out, name, old)
        if copy is not None:
            kept[copy] = old
        where = copy or "an earlier copy beside it"
        how = "edited since the last export" if name in written else "not written by an export"
        warnings.append(
            f"{name} in {out} was {how}: replaced by the exported one, so that the job's files "
            f"agree; your text is kept in {where}"
        )
    return kept, warnings


def is_hostfile_template(text: str) -> bool:
    """Whether `text` is a hostfile template as an export writes it (node-1 ... node-N)."""
    from workbench.export.launch_files import hostfile_template

    hosts = [line for line in text.splitlines() if line and not line.startswith("#")]
    found = [_TEMPLATE_HOST.match(line) for line in hosts]
    if not hosts or not all(found):
        return False
    slots = int(found[0].group(2)) if found[0] else 0
    return text == hostfile_template(len(hosts), slots)


def kept_hostfile(out: Path, name: str, nodes: int, gpus: int) -> str | None:
    """A warning when `out`'s hostfile was filled in (not a template): it is kept, not
    written over; None when the template may be written."""
    old = _read(out / name)
    if old is None or is_hostfile_template(old):
        return None
    return (
        f"{name} in {out} was filled in (no template): kept as it is, not written over; it must "
        f"list {nodes} host(s), each with slots={gpus} or more"
    )


__all__ = [
    "EDITED_SUFFIX",
    "MANIFEST_NAME",
    "is_hostfile_template",
    "keep_edited_scripts",
    "keep_user_files",
    "kept_hostfile",
    "manifest_text",
]
