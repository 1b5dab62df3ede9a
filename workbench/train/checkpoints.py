"""Training checkpoints: a tensor file and a JSON manifest per save, safe to load and share.

A checkpoint is two files, `step-00000042.pt` and `step-00000042.json` in a run folder
(or `NAME.pt` and `NAME.json` for a file name you give):

`step-N.pt`, the tensor file (`torch.save`), holds everything needed to continue a run
exactly, and nothing but tensors, numbers, strings, None and plain lists, tuples and
dicts, so `torch.load(path, weights_only=True)` reads it and no file can run code when
it is resumed:

    format        CHECKPOINT_FORMAT (2)
    step          optimizer steps attempted so far (the Session's step counter)
    config        TrainConfig.to_dict()
    backend       Backend.export_state(): fp32 weights by parameter name, optimizer state
                  by parameter name, loss scaler, schedule position (backend-neutral)
    buffers       the model's persistent buffers by name
    rng           {"torch": uint8 tensor, "cuda": [uint8 tensors] or None,
                   "numpy": {"bit_generator", "key": int64 tensor, "pos", "has_gauss",
                   "cached_gaussian"}, "python": {"version", "state": [ints], "gauss_next"}}
    data          data position {"epoch", "offset"}
    reference_batch  effective batch the LR scaling is relative to
    model         built-in model name and options, or None for a user module

`step-N.json`, the manifest, is for people and tools that do not run torch: format,
step, config, model (name, options, parameter count), data position, world size and rank,
the run's log, and the tensor file's size and SHA-256. Resuming checks the size and hash
first, so a truncated or altered tensor file is named as such instead of failing inside
the unpickler; then it loads with `weights_only=True`. A file holding any other Python
object is refused with the names of the objects, and nothing in it runs.

The step records are not in the checkpoint (its size does not grow with the run): they
are in the run's log (`workbench.train.runlog`), and a resumed Session's history starts
with the newest of them.

Writing: the tensor file goes to `step-N.pt.tmp` and the manifest to `step-N.json.tmp`,
each flushed and fsynced; then the tensor file is renamed to `step-N.pt`, the manifest to
`step-N.json`, and the folder is fsynced. A save is complete once its manifest exists: a
process killed at any point leaves the previous checkpoints whole and no half-written file
under a real name (at most a `.tmp`, removed by the next save, or a tensor file without
its manifest, which is not listed). Ctrl-C during a save removes its `.tmp` files and is
raised as the KeyboardInterrupt it is; a full disk is one OSError (ENOSPC) naming the file
and saying the previous checkpoints are whole. A save never writes over a device, FIFO,
socket or folder (`workbench.outputs.check_target`).

Runs: every manifest names the run that wrote it (`"run"`, `Session.run_id`). Pruning
(`prune`) deletes only the checkpoints of the run that saves, oldest step first, never the
one just written, until `keep_checkpoints` of that run remain; `run_folder_problem` says
why a run must not write into a folder (another run's checkpoints or log are there, or
checkpoints of its own run newer than its step).

Reading is bounded: a file is opened without following a swap to a FIFO or device
(non-blocking, then `fstat`: a regular file only), its size is checked against its
manifest and `MAX_CHECKPOINT_BYTES` before a byte is read, and the zip archive torch wrote
must hold stored (uncompressed) entries whose sizes add up to at most the file's size.

Previous format (1, one pickled file with the history inside, no manifest): it resumes
(read with torch's safe loader, NumPy's array type allow-listed for its RNG state), or,
if it holds anything else, the error says how to convert it (`convert`).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import pickle
import random
import re
import stat
import uuid
import zipfile
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch

from workbench import inputs
from workbench.inputs import InputFileError, is_int, read_json, shown
from workbench.outputs import check_target
from workbench.version import __version__

CHECKPOINT_FORMAT = 2
PREVIOUS_FORMAT = 1
MANIFEST_KIND = "workbench-checkpoint"
_NAME = re.compile(r"^step-(\d+)\.pt$")
_HASH_BLOCK = 1 << 20
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few kB; its config and options are small
#: The largest tensor file `load` reads, in bytes; None: this machine's memory. torch.load
#: reads the whole file into memory (on the CPU), so a larger one cannot be resumed here,
#: and the bound is checked before any byte is read (a sparse file claims any size for
#: free). A caller with a bigger checkpoint and the memory for it can raise it.
MAX_CHECKPOINT_BYTES: int | None = None
#: Steps, data offsets and batch sizes are at most this (a 64-bit counter's range).
MAX_COUNT = 2**63 - 1
#: A run id: what `new_run_id` gives, or a previous save's (letters, digits, '-').
RUN_ID = re.compile(r"^[0-9a-z][0-9a-z-]{0,63}$")
#: Plain settings (config values, model options) nest at most this deep and hold at most
#: this many items in all: a TrainConfig and a model's options are a flat dict of scalars.
_SETTINGS_DEPTH = 4
_SETTINGS_ITEMS = 10_000
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


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
    return _NAME.match(name) is not None


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """The manifest beside a tensor file: `step-N.pt` -> `step-N.json`."""
    return Path(path).with_suffix(".json")


def new_run_id() -> str:
    """A short unique id for a new run (what its manifests' `"run"` says)."""
    return uuid.uuid4().hex[:12]


def max_checkpoint_bytes() -> int:
    """`MAX_CHECKPOINT_BYTES`, or this machine's memory when it is None."""
    if MAX_CHECKPOINT_BYTES is not None:
        return int(MAX_CHECKPOINT_BYTES)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # no sysconf: a bound that still holds
        return 1 << 40


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


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


# --------------------------------------------------------------------------- RNG states
def rng_state() -> dict[str, Any]:
    """Every RNG a run draws from, as tensors and plain values."""
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state_all()
    return _rng_as_plain(
        {
            "torch": torch.get_rng_state(),
            "cuda": cuda,
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }
    )


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()` (this format's, or the previous format's tuples)."""
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):
        numpy_state = (
            numpy_state["bit_generator"],
            numpy_state["key"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    np.random.set_state(numpy_state)
    python_state = state["python"]
    if isinstance(python_state, dict):
        python_state = (
            python_state["version"],
            tuple(python_state["state"]),
            python_state["gauss_next"],
        )
    random.setstate(python_state)
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- payload
def training_payload(
    *,
    step: int,
    config: Any,
    runtime: Any,
    reference_batch: int,
    model_name: str | None,
    model_options: dict[str, Any],
) -> dict[str, Any]:
    """A checkpoint of a Session at a step boundary (the layout in the module docstring):
    `runtime` (`workbench.train.runtime.Runtime`) gives the backend-neutral state, the
    trained module's buffers and the data position."""
    from workbench.train.runtime import persistent_buffers

    return {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "config": config.to_dict(),
        "backend": runtime.backend.export_state(),
        "buffers": persistent_buffers(runtime.trained_module),
        "rng": rng_state(),
        "data": vars(runtime.data.position),
        "reference_batch": reference_batch,
        "model": {"name": model_name, "options": model_options},
    }


def check_plain(value: Any, where: str = "payload") -> None:
    """ValueError naming the first value that is not a tensor, number, string, None or
    a plain list/tuple/dict of them (what `torch.load(weights_only=True)` reads). Each
    container is walked once, however often it is referenced."""
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, at = stack.pop()
        if v is None or isinstance(v, (torch.Tensor, str, bool, int, float)):
            continue
        if type(v) in (list, tuple, dict):
            if id(v) in seen:
                continue
            seen.add(id(v))
            if type(v) is dict:
                for k in v:
                    if not isinstance(k, (str, int)):
                        raise ValueError(f"{at}: key {shown(k)} is not a string or integer")
                items = [(item, f"{at}[{shown(k)}]") for k, item in v.items()]
            else:
                items = [(item, f"{at}[{i}]") for i, item in enumerate(v)]
            stack.extend(reversed(items))  # the first bad value is the one named
            continue
        raise ValueError(
            f"{at}={shown(v)}: a {type(v).__name__} cannot go into a checkpoint, which "
            "holds only tensors, numbers, strings, None and plain lists/tuples/dicts of them "
            "(so torch.load(weights_only=True) reads it)"
        )


# --------------------------------------------------------------------------- writing
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


# --------------------------------------------------------------------------- listing
def _step_files(directory: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)))


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints in `directory` (`step-N.pt` with its manifest), oldest first.
    A folder without any manifest is one of the previous format: its `step-N.pt` files."""
    d = Path(directory)
    if not d.is_dir():
        return []
    files = _step_files(d)
    complete = [p for _, p in files if manifest_path(p).is_file()]
    if complete or any(d.glob("step-*.json")):
        return complete
    return [p for _, p in files]


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
        m = _NAME.match(p.name)
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


def resolve(path_or_dir: str | os.PathLike[str]) -> Path:
    """The checkpoint's tensor file: the path itself (a `.json` manifest names its tensor
    file), or the newest complete checkpoint in a directory. ValueError for anything but
    a non-empty str or os.PathLike."""
    name = os.fspath(path_or_dir) if isinstance(path_or_dir, (str, os.PathLike)) else None
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"path={shown(path_or_dir)}: must be a checkpoint file or folder path (a "
            "non-empty str or os.PathLike)"
        )
    p = Path(name)
    if p.is_dir():
        files = list_checkpoints(p)
        if not files:
            raise CheckpointError(
                p, "no checkpoint (step-N.pt with its step-N.json) in this directory"
            )
        return files[-1]
    if p.suffix == ".json" and p.is_file():
        return p.with_suffix(".pt")
    if not os.path.lexists(p):
        raise CheckpointError(p, "no such checkpoint file or directory")
    with contextlib.suppress(OSError):
        mode = os.stat(p).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointError(
                p,
                f"no such checkpoint file or directory ({_kind(mode)}, not a regular file); "
                "nothing was read",
            )
    return p  # a swap after this check is refused when it is opened (`open_regular`)


# --------------------------------------------------------------------------- reading
def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a checkpoint (its tensor file's path, or the manifest's own), read
    as strict, bounded JSON (`workbench.inputs.read_json`) and checked for the fields a
    resume relies on (kind, format, file size and SHA-256, step)."""
    m = manifest_path(resolve(path))
    if not m.exists():
        raise CheckpointError(m, "no manifest")
    try:
        manifest = read_json(m, what="checkpoint manifest", max_bytes=MAX_MANIFEST_BYTES)
    except InputFileError as exc:
        raise CheckpointError(
            m, f"the manifest is not readable JSON (truncated or altered): {exc.reason}"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        raise CheckpointError(m, "not a workbench checkpoint manifest")
    problems = []
    size = manifest.get("bytes")
    if not is_int(size) or size < 0:
        problems.append(f"bytes={shown(size)}: must be the tensor file's size, an integer >= 0")
    digest = manifest.get("sha256")
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        problems.append(f"sha256={shown(digest)}: must be 64 hexadecimal digits")
    step = manifest.get("step")
    if not _count(step):
        problems.append(f"step={shown(step)}: must be an integer >= 0 (and below 2**63)")
    run = manifest.get("run")
    if run is not None and not (isinstance(run, str) and RUN_ID.match(run)):
        problems.append(
            f"run={shown(run)}: must be a run id (letters a-z, digits and '-', at most 64)"
        )
    if problems:
        raise CheckpointError(
            m,
            f"altered manifest ({'; '.join(problems)}); a checkpoint is "
            "only resumed after its size and SHA-256 are checked",
        )
    return manifest


def verify(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a checkpoint's tensor file against its manifest (size, then SHA-256); returns
    the manifest, or raises CheckpointError naming a truncated or altered file."""
    tensor = resolve(path)
    manifest = read_manifest(tensor)
    with _open_tensor_file(tensor, manifest) as f:
        _check_hash(f, tensor, manifest)
    return manifest


def _open_tensor_file(tensor: Path, manifest: dict[str, Any] | None) -> Any:
    """The tensor file, opened as a regular file (`open_regular`), its size checked
    against `MAX_CHECKPOINT_BYTES` and the manifest's `bytes` before anything is read."""
    if manifest is not None:
        fmt = manifest.get("format")
        if fmt != CHECKPOINT_FORMAT:
            raise CheckpointError(
                tensor,
                f"checkpoint format {shown(fmt)}; this workbench reads format "
                f"{CHECKPOINT_FORMAT} (and {PREVIOUS_FORMAT} without a manifest)",
            )
        if not os.path.lexists(tensor):
            raise CheckpointError(
                tensor, f"missing; its manifest {manifest_path(tensor).name} is there"
            )
    f = open_regular(tensor)
    try:
        size, limit = os.fstat(f.fileno()).st_size, max_checkpoint_bytes()
        if manifest is not None:
            expected = int(manifest["bytes"])
            if size < expected:
                raise CheckpointError(
                    tensor, f"truncated: {size} bytes, its manifest says {expected}"
                )
            if size > expected:
                raise CheckpointError(
                    tensor, f"altered: {size} bytes, its manifest says {expected}"
                )
        if size > limit:
            raise CheckpointError(
                tensor,
                f"{size} bytes, more than this workbench reads ({limit} bytes, "
                "workbench.train.checkpoints.MAX_CHECKPOINT_BYTES, by default this "
                "machine's memory: torch.load reads the whole file into it); nothing was read",
                hint="raise MAX_CHECKPOINT_BYTES if the machine has the memory for it",
            )
        return f
    except BaseException:
        f.close()
        raise


def _check_hash(f: Any, tensor: Path, manifest: dict[str, Any]) -> None:
    """The SHA-256 of the open file `f` (read to its end, then rewound) against the
    manifest's."""
    digest = hashlib.sha256()
    f.seek(0)
    while block := f.read(_HASH_BLOCK):
        digest.update(block)
    f.seek(0)
    if digest.hexdigest() != manifest["sha256"]:
        raise CheckpointError(
            tensor,
            f"altered: its SHA-256 differs from the one in its manifest "
            f"{manifest_path(tensor).name}",
        )


def _check_archive(f: Any, tensor: Path) -> None:
    """torch.save's zip archive holds stored entries only: a compressed one (which could
    inflate far past the file's size when loaded) or entries adding up to more than the
    file's size are refused, read from the zip's central directory before torch.load.
    A file that is not a zip archive is left to torch.load (the legacy format, read as
    it is on disk)."""
    f.seek(0)
    if not zipfile.is_zipfile(f):
        f.seek(0)
        return
    f.seek(0)
    size = os.fstat(f.fileno()).st_size
    try:
        with zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(tensor, f"not a readable checkpoint: {exc}") from None
    finally:
        f.seek(0)
    compressed = [e.filename for e in entries if e.compress_type != zipfile.ZIP_STORED]
    if compressed:
        raise CheckpointError(
            tensor,
            f"holds compressed entries ({shown(compressed[0])}"
            f"{f' and {len(compressed) - 1} more' if len(compressed) > 1 else ''}); "
            "torch.save stores them uncompressed, and a compressed one can inflate far past "
            "the file's size: nothing in it was loaded",
        )
    total = sum(e.file_size for e in entries)
    if total > size:
        raise CheckpointError(
            tensor,
            f"its entries add up to {total} bytes, more than the file's {size}: not an "
            "archive torch.save wrote; nothing in it was loaded",
        )


def _previous_format_globals() -> list[Any]:
    """What NumPy's RNG state (a uint32 array) needs in the previous format's pickle."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


_PREVIOUS_FORMAT_NAMES = {
    "numpy.ndarray",
    "numpy.dtype",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray._reconstruct",
    "numpy.dtypes.UInt32DType",
}


def safe_load(
    path: str | os.PathLike[str], *, previous_format: bool = False, file: Any = None
) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU. `previous_format`: also allow
    NumPy's array type (the previous format's RNG state). A file holding other Python
    objects raises CheckpointError naming them; nothing in it runs. `file`: the open,
    checked file object of `path` to read (`load` passes it); without it the file is
    opened as `load` does (a regular file, bounded, stored entries only)."""
    p = Path(path)
    if file is None:
        with _open_tensor_file(p, None) as f:
            _check_archive(f, p)
            return safe_load(p, previous_format=previous_format, file=f)
    file.seek(0)
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        file.seek(0)
        names = _unsafe_globals(file)
        if not names:  # not a pickle at all, or a damaged one
            raise CheckpointError(
                p, "not a readable checkpoint: not a file torch.save wrote, or a damaged one"
            ) from exc
    except Exception as exc:
        raise CheckpointError(p, f"not a readable checkpoint: {_last_line(exc)}") from exc
    if previous_format and names and set(names) <= _PREVIOUS_FORMAT_NAMES:
        with torch.serialization.safe_globals(_previous_format_globals()):
            try:
                file.seek(0)
                return torch.load(file, map_location="cpu", weights_only=True)
            except Exception as exc:
                raise CheckpointError(p, f"not a readable checkpoint: {exc}") from exc
    raise CheckpointError(
        p,
        f"refused: it holds Python objects a checkpoint never contains "
        f"({', '.join(names)}); unpickling them could run code, so nothing in it was loaded",
        hint=(
            "if it is a previous-format checkpoint you wrote yourself, convert it once: "
            f"workbench.train.checkpoints.convert({str(p)!r}, trusted=True)"
            if previous_format
            else ""
        ),
    )


def _last_line(exc: BaseException) -> str:
    """The informative line of an exception (torch's loader errors run to many lines)."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return lines[-1] if lines else type(exc).__name__


def _unsafe_globals(file: Any) -> list[str]:
    """The Python objects a file's pickle names, found without running it."""
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(file))
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            file.seek(0)


def load(path_or_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's payload (a file, or the newest in a directory), verified against its
    manifest and read with `weights_only=True`; `payload["path"]` is the tensor file,
    `payload["manifest"]` the manifest (None for the previous format)."""
    path = resolve(path_or_dir)
    manifest: dict[str, Any] | None = None
    if os.path.lexists(manifest_path(path)):
        manifest = read_manifest(path)
    with _open_tensor_file(path, manifest) as f:  # one descriptor: checked, hashed, loaded
        if manifest is not None:
            _check_hash(f, path, manifest)
        _check_archive(f, path)
        payload = safe_load(path, previous_format=manifest is None, file=f)
    if not isinstance(payload, dict) or payload.get("format") not in (
        CHECKPOINT_FORMAT,
        PREVIOUS_FORMAT,
    ):
        raise CheckpointError(path, f"not a workbench checkpoint (format {CHECKPOINT_FORMAT})")
    if manifest is None and payload["format"] == CHECKPOINT_FORMAT:
        raise CheckpointError(
            path,
            f"incomplete: its manifest {manifest_path(path).name} is "
            "missing (a save that was killed before it finished, or a copy without it); "
            "resume from an earlier checkpoint, or copy the manifest along",
        )
    if manifest is not None and (
        manifest.get("step") != payload.get("step") or payload["format"] != CHECKPOINT_FORMAT
    ):
        raise CheckpointError(
            path,
            f"altered: step {shown(payload.get('step'))}, format "
            f"{shown(payload['format'])} in the file; step {shown(manifest.get('step'))}, format "
            f"{shown(manifest.get('format'))} in its manifest",
        )
    problems = payload_problems(payload)
    if problems:
        raise CheckpointError(
            path,
            "not a checkpoint this workbench wrote ("
            + "; ".join(problems)
            + "); nothing in it was used",
        )
    payload["path"] = str(path)
    payload["manifest"] = manifest
    return payload


def _tensors(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
    )


def _not_dense(value: Any) -> list[str]:
    """Names of the tensors in a name -> tensor dict that are not dense (strided): a
    sparse or otherwise laid out weight that loading into a module would fail on."""
    return [k for k, v in value.items() if v.layout != torch.strided]


def _tensors_problem(name: str, value: Any, what: str) -> str | None:
    if not _tensors(value):
        return f"{name}: must map {what} names to tensors"
    bad = _not_dense(value)
    if bad:
        return (
            f"{name}[{shown(bad[0])}]: must be a dense (strided) tensor, as a save writes "
            f"it{f' ({len(bad) - 1} more)' if len(bad) > 1 else ''}"
        )
    return None


def _first_not_dense(value: Any, where: str) -> str | None:
    """Where in `value` (nested dicts, lists and tuples, each walked once however often it
    is referenced) the first tensor that is not dense (strided) is; None when none is."""
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided:
                return at
            continue
        if type(v) not in (list, tuple, dict) or id(v) in seen:
            continue
        seen.add(id(v))
        items = v.items() if type(v) is dict else enumerate(v)
        stack.extend((x, f"{at}.{str(k)[:40]}") for k, x in items)
    return None


def _count(value: Any) -> bool:
    return is_int(value) and 0 <= value <= MAX_COUNT


def settings_problem(value: Any) -> str | None:
    """Why `value` (a config or a model's options, as a checkpoint holds them) is not a
    plain settings dict: string keys, values that are None, booleans, numbers, strings or
    lists/dicts of them, nested at most a few levels and a bounded number of items in all
    (so no message or check downstream walks a structure of shared references); None
    when it is one."""
    if not isinstance(value, dict):
        return "must be a dict"
    items = 0
    stack: list[tuple[Any, int, str]] = [(v, 1, str(k)[:40]) for k, v in value.items()]
    if not all(isinstance(k, str) for k in value):
        return "its keys must be strings"
    while stack:
        v, depth, where = stack.pop()
        items += 1
        if items > _SETTINGS_ITEMS:
            return f"more than {_SETTINGS_ITEMS} values in all"
        if v is None or isinstance(v, (bool, int, float, str)):
            if isinstance(v, str) and len(v) > 1 << 16:
                return f"{where}: a string of {len(v)} characters"
            continue
        if type(v) not in (list, tuple, dict):
            return f"{where}: a {type(v).__name__}, not a plain value"
        if depth >= _SETTINGS_DEPTH:
            return f"{where}: nested more than {_SETTINGS_DEPTH} levels"
        if type(v) is dict:
            if not all(isinstance(k, str) for k in v):
                return f"{where}: keys must be strings"
            stack.extend((x, depth + 1, f"{where}.{str(k)[:40]}") for k, x in v.items())
        else:
            stack.extend((x, depth + 1, f"{where}[{i}]") for i, x in enumerate(v))
    return None


def _rng_problems(rng: Any) -> list[str]:
    """What keeps `set_rng_state(rng)` from restoring `rng` (this format's or the previous
    one's layout), found without touching any generator."""
    if not isinstance(rng, dict):
        return [f"rng={shown(rng)}: must be a dict of RNG states"]
    p = []
    state = rng.get("torch")
    if not (
        _dense(state) and state.dtype == torch.uint8 and state.shape == torch.get_rng_state().shape
    ):
        p.append("rng.torch: must be torch's RNG state (a uint8 tensor torch.get_rng_state gives)")
    cuda = rng.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, (list, tuple))
        and len(cuda) <= 1024
        and all(_dense(t) and t.dtype == torch.uint8 and t.dim() == 1 for t in cuda)
    ):
        p.append("rng.cuda: must be None or a list of uint8 tensors (one per GPU)")
    numpy_state = rng.get("numpy")
    if isinstance(numpy_state, dict):
        key = numpy_state.get("key")
        if not (
            numpy_state.get("bit_generator") == "MT19937"
            and _dense(key)
            and key.dtype == torch.int64
            and key.numel() == 624
            and all(is_int(numpy_state.get(k)) for k in ("pos", "has_gauss"))
            and 0 <= numpy_state["pos"] <= 624
            and numpy_state["has_gauss"] in (0, 1)
            and _real(numpy_state.get("cached_gaussian"))
        ):
            p.append("rng.numpy: must be NumPy's MT19937 state as a save writes it")
    elif isinstance(numpy_state, tuple):  # the previous format: NumPy's own tuple
        if not (
            len(numpy_state) == 5
            and numpy_state[0] == "MT19937"
            and isinstance(numpy_state[1], np.ndarray)
            and numpy_state[1].shape == (624,)
            and numpy_state[1].dtype == np.uint32
            and is_int(numpy_state[2])
            and 0 <= numpy_state[2] <= 624
            and is_int(numpy_state[3])
            and numpy_state[3] in (0, 1)
            and _real(numpy_state[4])
        ):
            p.append(
                "rng.numpy: must be NumPy's MT19937 state ('MT19937', 624 uint32 keys, "
                "pos, has_gauss, cached_gaussian)"
            )
    else:
        p.append("rng.numpy: must be NumPy's RNG state")
    python_state = rng.get("python")
    if isinstance(python_state, dict):
        version, internal = python_state.get("version"), python_state.get("state")
        gauss = python_state.get("gauss_next")
    elif isinstance(python_state, tuple) and len(python_state) == 3:  # the previous format
        version, internal, gauss = python_state
    else:
        version = internal = gauss = "missing"
    if not (
        is_int(version)
        and version == 3
        and isinstance(internal, (list, tuple))
        and len(internal) == 625
        and all(is_int(x) and 0 <= x < 2**32 for x in internal)
        and (gauss is None or _real(gauss))
    ):
        p.append(
            "rng.python: must be Python's random state (version 3, 625 integers, "
            "gauss_next) as a save writes it"
        )
    return p


def _dense(value: Any) -> TypeGuard[torch.Tensor]:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _real(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
        isinstance(v, torch.Tensor) and v.numel() == 1
    )


def _backend_problems(backend: dict[str, Any]) -> list[str]:
    """What keeps a backend's `load_state` from reading `backend` beyond its weights: the
    step counters, the schedule position, the optimizer state by parameter name (each a
    dict of tensors and numbers) and the loss scaler, as `export_state` writes them."""
    p = []
    for key in ("steps", "overflow_steps"):
        if key in backend and not _count(backend[key]):
            p.append(f"backend.{key}={shown(backend[key])}: must be an integer from 0 to 2**63 - 1")
    scheduler = backend.get("scheduler")
    if scheduler is not None and not (
        isinstance(scheduler, dict) and ("steps" not in scheduler or _count(scheduler["steps"]))
    ):
        p.append(f"backend.scheduler={shown(scheduler)}: must be {{'steps': int >= 0}} or None")
    optim = backend.get("optimizer")
    if optim is not None:
        state = optim.get("state") if isinstance(optim, dict) else None
        family = optim.get("family") if isinstance(optim, dict) else None
        if not isinstance(optim, dict) or not (family is None or isinstance(family, str)):
            p.append(
                f"backend.optimizer={shown(optim)}: must be a dict with 'family' (a name or "
                "None) and 'state'"
            )
        elif state is not None and not (
            isinstance(state, dict)
            and all(
                isinstance(name, str)
                and isinstance(st, dict)
                and all(isinstance(k, str) and _real_or_tensor(v) for k, v in st.items())
                for name, st in state.items()
            )
        ):
            p.append(
                f"backend.optimizer.state={shown(state)}: must map parameter names to dicts "
                "of tensors and numbers"
            )
    scaler = backend.get("scaler")
    if scaler is not None and not (
        isinstance(scaler, dict)
        and all(isinstance(k, str) for k in scaler)
        and all(_real(scaler[k]) for k in ("scale", "init_scale", "growth_tracker") if k in scaler)
    ):
        p.append(f"backend.scaler={shown(scaler)}: must be the loss scaler's numbers or None")
    return p


def _real_or_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor) or _real(v)


def payload_problems(payload: dict[str, Any]) -> list[str]:
    """What is wrong with the layout of a loaded payload (empty when it is one `save`
    writes): each entry of the module docstring's table has the type a resume relies on."""
    p: list[str] = []
    step = payload.get("step")
    if not _count(step):
        p.append(f"step={shown(step)}: must be an integer >= 0 (and below 2**63)")
    config = payload.get("config")
    bad = settings_problem(config)
    if bad:
        p.append(f"config={shown(config)}: must be a dict of settings ({bad})")
    backend = payload.get("backend")
    if not isinstance(backend, dict):
        p.append(f"backend={shown(backend)}: must be a dict (weights, optimizer, scaler)")
    else:
        bad = _tensors_problem("backend.model", backend.get("model"), "parameter")
        if bad:
            p.append(bad)
        else:
            where = _first_not_dense(backend, "backend")
            if where:
                p.append(f"{where}: must be a dense (strided) tensor, as a save writes it")
        p += _backend_problems(backend)
    buffers = payload.get("buffers")
    if buffers is not None:
        bad = _tensors_problem("buffers", buffers, "buffer")
        if bad:
            p.append(bad)
    p += _rng_problems(payload.get("rng"))
    data = payload.get("data")
    if data is not None and not (
        isinstance(data, dict)
        and set(data) <= {"epoch", "offset"}
        and all(_count(v) for v in data.values())
    ):
        p.append(
            f"data={shown(data)}: must be {{'epoch': int, 'offset': int}}, each from 0 to 2**63 - 1"
        )
    ref = payload.get("reference_batch")
    if ref is not None and (not _count(ref) or ref < 1):
        p.append(f"reference_batch={shown(ref)}: must be an integer >= 1 (and below 2**63)")
    model = payload.get("model")
    if model is not None:
        if not isinstance(model, dict):
            p.append(f"model={shown(model)}: must be a dict with 'name' and 'options' or None")
        else:
            name, options = model.get("name"), model.get("options")
            if name is not None and (not isinstance(name, str) or not name):
                p.append(f"model.name={shown(name)}: must be a model name or None")
            bad = None if options is None else settings_problem(options)
            if bad:
                p.append(
                    f"model.options={shown(options)}: must map option names to plain values ({bad})"
                )
    return p


def convert(path_or_dir: str | os.PathLike[str], *, trusted: bool = False) -> list[Path]:
    """Rewrite previous-format checkpoints (a file, or every one in a directory) in this
    format, in place, each with its manifest; returns the converted files. The previous
    format is read with the safe loader; `trusted=True` reads it with
    `weights_only=False` instead, which can run code: only for files you wrote yourself."""
    p = Path(path_or_dir)
    files = list_checkpoints(p) if p.is_dir() else [resolve(p)]
    done = []
    for f in files:
        if manifest_path(f).is_file():
            continue
        if trusted:
            old = torch.load(f, map_location="cpu", weights_only=False)
        else:
            old = safe_load(f, previous_format=True)
        if not isinstance(old, dict) or old.get("format") != PREVIOUS_FORMAT:
            raise CheckpointError(f, f"not a format-{PREVIOUS_FORMAT} checkpoint")
        new = {k: v for k, v in old.items() if k not in ("history", "path")}
        new["format"] = CHECKPOINT_FORMAT
        new["rng"] = _rng_as_plain(old["rng"])
        save(new, f)
        done.append(f)
    return done


def _rng_as_plain(state: dict[str, Any]) -> dict[str, Any]:
    """RNG states as NumPy and Python give them (tuples with an array) as tensors and
    plain values (this format's layout; the previous format stored the tuples)."""
    np_name, key, pos, has_gauss, cached = state["numpy"]
    version, internal, gauss_next = state["python"]
    return {
        "torch": state["torch"],
        "cuda": state.get("cuda"),
        "numpy": {
            "bit_generator": str(np_name),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(version), "state": list(internal), "gauss_next": gauss_next},
    }
