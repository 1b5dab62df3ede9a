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

This module reads checkpoints (`load`, `verify`, `safe_load`, `convert`, under the
`MAX_CHECKPOINT_BYTES` a caller may raise here) and re-exports the modules beside it, one
concept each: `checkpoint_files` (names, constants, `CheckpointError`, listing),
`checkpoint_payload` (RNG states, a Session's payload, the layout checks of a loaded one),
`checkpoint_write` (atomic writes) and `checkpoint_runs` (run ids, the folders a run must
not write into, pruning).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.inputs import InputFileError, is_int, read_json, shown
from workbench.train.checkpointing.files import (
    CHECKPOINT_FORMAT,
    MANIFEST_KIND,
    MAX_COUNT,
    MAX_MANIFEST_BYTES,
    PREVIOUS_FORMAT,
    RUN_ID,
    CheckpointError,
    checkpoint_name,
    is_checkpoint_name,
    is_count,
    list_checkpoints,
    manifest_path,
    open_regular,
)
from workbench.train.checkpointing.payload import (
    check_plain,
    payload_problems,
    rng_as_plain,
    rng_state,
    set_rng_state,
    settings_problem,
    training_payload,
)
from workbench.train.checkpointing.runs import (
    UNREADABLE,
    checkpoint_runs,
    manifest_run,
    new_run_id,
    prune,
    run_folder_problem,
)
from workbench.train.checkpointing.write import save, write_atomic
from workbench.version import safe_loading_problem

__all__ = [
    "CHECKPOINT_FORMAT",
    "MANIFEST_KIND",
    "MAX_CHECKPOINT_BYTES",
    "MAX_COUNT",
    "MAX_MANIFEST_BYTES",
    "PREVIOUS_FORMAT",
    "RUN_ID",
    "UNREADABLE",
    "CheckpointError",
    "check_plain",
    "checkpoint_name",
    "checkpoint_runs",
    "convert",
    "is_checkpoint_name",
    "list_checkpoints",
    "load",
    "manifest_path",
    "manifest_run",
    "max_checkpoint_bytes",
    "new_run_id",
    "open_regular",
    "payload_problems",
    "prune",
    "read_manifest",
    "resolve",
    "rng_state",
    "run_folder_problem",
    "safe_load",
    "save",
    "set_rng_state",
    "settings_problem",
    "training_payload",
    "verify",
    "write_atomic",
]

_HASH_BLOCK = 1 << 20
#: The largest tensor file `load` reads, in bytes; None: this machine's memory. torch.load
#: reads the whole file into memory (on the CPU), so a larger one cannot be resumed here,
#: and the bound is checked before any byte is read (a sparse file claims any size for
#: free). A caller with a bigger checkpoint and the memory for it can raise it.
MAX_CHECKPOINT_BYTES: int | None = None


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
    if not is_count(step):
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
    problem = safe_loading_problem()
    if problem is not None:  # an older torch's weights_only loader could run code
        raise CheckpointError(p, problem)
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
            raise CheckpointError(p, f"not a readable checkpoint: {_NOT_TORCH_SAVE}") from exc
    except Exception as exc:  # the zip reader says what is damaged; other loader errors
        # (a KeyError of a byte value for a text file) are its internals, not a reason
        reason = _last_line(exc) if isinstance(exc, RuntimeError) else _NOT_TORCH_SAVE
        raise CheckpointError(p, f"not a readable checkpoint: {reason}") from exc
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


_NOT_TORCH_SAVE = "not a file torch.save wrote, or a damaged one"


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
        new["rng"] = rng_as_plain(old["rng"])
        save(new, f)
        done.append(f)
    return done
