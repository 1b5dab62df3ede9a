"""Which run a checkpoint belongs to: every manifest names the run that wrote it
(`"run"`, `Session.run_id`). A run never writes into a folder holding another run's
checkpoints or log, nor over its own newer ones (`run_folder_problem`), and pruning deletes
only the saving run's checkpoints (`prune`)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import uuid
from pathlib import Path

from workbench.inputs import shown
from workbench.train.checkpointing.files import (
    MANIFEST_KIND,
    MAX_MANIFEST_BYTES,
    RUN_ID,
    STEP_NAME,
    CheckpointError,
    list_checkpoints,
    manifest_path,
    open_regular,
)


def new_run_id() -> str:
    """A short unique id for a new run (what its manifests' `"run"` says)."""
    return uuid.uuid4().hex[:12]


#: `checkpoint_runs`' run of a checkpoint whose manifest cannot be read.
UNREADABLE = "<unreadable manifest>"


def manifest_run(manifest: str | os.PathLike[str]) -> str | None:
    """The run a manifest names (`"run"`), None for one without (the previous layout), or
    UNREADABLE; read as a regular file of at most MAX_MANIFEST_BYTES, links not followed."""
    try:
        with open_regular(manifest, follow=False) as f:
            text = f.read(MAX_MANIFEST_BYTES + 1)
        data = json.loads(text) if len(text) <= MAX_MANIFEST_BYTES else None
    except (CheckpointError, OSError, ValueError, RecursionError):
        return UNREADABLE
    if not isinstance(data, dict) or data.get("kind") != MANIFEST_KIND:
        return UNREADABLE
    run = data.get("run")
    if run is None:
        return None
    return run if isinstance(run, str) and RUN_ID.match(run) else UNREADABLE


def checkpoint_runs(directory: str | os.PathLike[str]) -> list[tuple[int, Path, str | None]]:
    """(step, tensor file, run) of each checkpoint `list_checkpoints` lists, oldest first:
    the run its manifest names, None without one (the previous layout, or a previous-format
    file without a manifest), UNREADABLE for a manifest that cannot be read."""
    out = []
    for p in list_checkpoints(directory):
        m = STEP_NAME.match(p.name)
        step = int(m.group(1)) if m else 0
        run = manifest_run(manifest_path(p)) if manifest_path(p).exists() else None
        out.append((step, p, run))
    return out


def run_folder_problem(
    directory: str | os.PathLike[str],
    run: str,
    step: int,
    *,
    own_unlabeled: bool = False,
    log: str | os.PathLike[str] | None = None,
    log_is_own: bool = False,
) -> str | None:
    """Why run `run`, at step `step`, must not save into `directory` (None when it may):
    a checkpoint of another run is there (one whose manifest names another run, or none
    unless `own_unlabeled`: the previous layout's, in the folder the run resumed from), or
    one of its own run newer than `step` (a resumed run would overwrite it), or, with no
    checkpoint of its own there, `log` (the run's log.jsonl there) holds another run's
    lines (unless `log_is_own`). Nothing is changed."""
    d = Path(directory)
    if not d.is_dir():
        return None
    runs = checkpoint_runs(d)
    mine = [(s, p) for s, p, r in runs if r == run or (r is None and own_unlabeled)]
    others = [(s, p, r) for s, p, r in runs if not (r == run or (r is None and own_unlabeled))]
    if others:
        s_, p_, r_ = others[-1]
        who = {None: "a run without a run id", UNREADABLE: "a manifest that cannot be read"}.get(
            r_, f"run {r_}"
        )
        return (
            f"holds checkpoints of another run ({who}; its newest is {p_.name}): nothing in "
            "it was changed; choose another checkpoint_dir, or continue that run with "
            f"Session.resume_from({shown(str(d), 1000)})"
        )
    newer = [p for s_, p in mine if s_ > step]
    if newer:
        return (
            f"holds checkpoints of this run newer than its step {step} (the newest is "
            f"{newer[-1].name}), which its saves would overwrite: nothing in it was changed; "
            "to continue from an earlier checkpoint, pass checkpoint_dir= a new folder to "
            "Session.resume_from (or resume from the newest)"
        )
    if log is not None and not mine and not log_is_own:
        with contextlib.suppress(OSError):
            if os.lstat(log).st_size > 0 or not stat.S_ISREG(os.lstat(log).st_mode):
                return (
                    f"holds {Path(log).name} of another run (and no checkpoint of this one): "
                    "nothing in it was changed; choose another checkpoint_dir (to continue "
                    "that run, resume from one of its checkpoints)"
                )
    return None


def prune(
    directory: str | os.PathLike[str],
    keep: int,
    *,
    run: str,
    written: str | os.PathLike[str] | None = None,
    own_unlabeled: bool = False,
) -> list[Path]:
    """Delete the checkpoints of run `run` (and, with `own_unlabeled`, those whose manifest
    names no run) but its newest `keep`, oldest step first, never `written` (the one just
    saved), each manifest first so a checkpoint is never half deleted; then the `.tmp`
    files a killed save left. Another run's checkpoints are never touched. Returns the
    deleted tensor files."""
    d = Path(directory)
    just = None if written is None else Path(written).name
    mine = [
        p
        for _, p, r in checkpoint_runs(d)
        if (r == run or (r is None and own_unlabeled)) and manifest_path(p).is_file()
    ]
    survivors = {p.name for p in mine[-keep:]} if keep > 0 else set()
    doomed = [p for p in mine if p.name not in survivors and p.name != just]
    for p in doomed:
        manifest_path(p).unlink(missing_ok=True)
        p.unlink(missing_ok=True)
    for tmp in d.glob("step-*.tmp"):
        tmp.unlink(missing_ok=True)
    return doomed
