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

Writing: the tensor file goes to `step-N.pt.tmp`, flushed and fsynced, then is renamed
to `step-N.pt`; then the manifest the same way; then the folder is fsynced. A save is
complete once its manifest exists: a process killed at any point leaves the previous
checkpoints whole and no half-written file under a real name (at most a `.tmp`, removed
by the next save, or a tensor file without its manifest, which is not listed). In a
folder only the newest `keep_checkpoints` complete checkpoints stay.

Previous format (1, one pickled file with the history inside, no manifest): it resumes
(read with torch's safe loader, NumPy's array type allow-listed for its RNG state), or,
if it holds anything else, the error says how to convert it (`convert`).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.inputs import InputFileError, is_int, read_json, shown
from workbench.version import __version__

CHECKPOINT_FORMAT = 2
PREVIOUS_FORMAT = 1
MANIFEST_KIND = "workbench-checkpoint"
_NAME = re.compile(r"^step-(\d+)\.pt$")
_HASH_BLOCK = 1 << 20
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few kB; its config and options are small


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed: missing, incomplete, truncated, altered, or
    holding objects a checkpoint never contains. As data: `path` (the file), `reason` (why)
    and `hint` (what to do about it, "" when nothing); the message is "path='...': reason"
    with the hint after it."""

    def __init__(self, path: str | os.PathLike[str], reason: str, hint: str = "") -> None:
        self.path = str(path)
        self.reason = reason
        self.hint = hint
        super().__init__(f"path={self.path!r}: {reason}" + (f"; {hint}" if hint else ""))

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, as a plain ValueError is
        return (type(self), (self.path, self.reason, self.hint))


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """The manifest beside a tensor file: `step-N.pt` -> `step-N.json`."""
    return Path(path).with_suffix(".json")


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
    a plain list/tuple/dict of them (what `torch.load(weights_only=True)` reads)."""
    if value is None or isinstance(value, (torch.Tensor, str, bool, int, float)):
        return
    if type(value) in (list, tuple):
        for i, v in enumerate(value):
            check_plain(v, f"{where}[{i}]")
        return
    if type(value) is dict:
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise ValueError(f"{where}: key {k!r} is not a string or integer")
            check_plain(v, f"{where}[{k!r}]")
        return
    raise ValueError(
        f"{where}={value!r}: a {type(value).__name__} cannot go into a checkpoint, which holds "
        "only tensors, numbers, strings, None and plain lists/tuples/dicts of them (so "
        "torch.load(weights_only=True) reads it)"
    )


# --------------------------------------------------------------------------- writing
class _HashingWriter:
    """A file wrapper that counts and hashes what is written through it."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        self.size += len(memoryview(data).cast("B"))
        return int(self._f.write(data))

    def flush(self) -> None:
        self._f.flush()


def _write_tmp_then_rename(target: Path, write: Any) -> tuple[int, str]:
    """`write(file)` into `target.tmp`, flush, fsync, rename over `target`; returns the
    bytes written and their SHA-256. Any failure removes the temporary file."""
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            w = _HashingWriter(f)
            write(w)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return w.size, w.sha256.hexdigest()


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
        raise ValueError(f"path={str(target)!r}: .json is the manifest's name; use .pt")
    check_plain(payload)
    target.parent.mkdir(parents=True, exist_ok=True)
    size, digest = _write_tmp_then_rename(target, lambda f: torch.save(payload, f))
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
    _write_tmp_then_rename(manifest_path(target), lambda f: f.write(text.encode("utf-8")))
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


def prune(directory: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (the manifest first, so a
    checkpoint is never half deleted) and the `.tmp` files a killed save left; returns
    the deleted tensor files."""
    d = Path(directory)
    files = [p for p in list_checkpoints(d) if manifest_path(p).is_file()]
    doomed = files[:-keep] if keep > 0 else files
    for p in doomed:
        manifest_path(p).unlink(missing_ok=True)
        p.unlink(missing_ok=True)
    for tmp in d.glob("step-*.tmp"):
        tmp.unlink(missing_ok=True)
    return doomed


def resolve(path_or_dir: str | os.PathLike[str]) -> Path:
    """The checkpoint's tensor file: the path itself (a `.json` manifest names its tensor
    file), or the newest complete checkpoint in a directory."""
    p = Path(path_or_dir)
    if p.is_dir():
        files = list_checkpoints(p)
        if not files:
            raise CheckpointError(
                p, "no checkpoint (step-N.pt with its step-N.json) in this directory"
            )
        return files[-1]
    if p.suffix == ".json" and p.is_file():
        return p.with_suffix(".pt")
    if not p.is_file():
        raise CheckpointError(p, "no such checkpoint file or directory")
    return p


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
    if not is_int(step) or step < 0:
        problems.append(f"step={shown(step)}: must be an integer >= 0")
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
    fmt = manifest.get("format")
    if fmt != CHECKPOINT_FORMAT:
        raise CheckpointError(
            tensor,
            f"checkpoint format {fmt!r}; this workbench reads format "
            f"{CHECKPOINT_FORMAT} (and {PREVIOUS_FORMAT} without a manifest)",
        )
    if not tensor.is_file():
        raise CheckpointError(
            tensor, f"missing; its manifest {manifest_path(tensor).name} is there"
        )
    size, expected = tensor.stat().st_size, int(manifest["bytes"])
    if size < expected:
        raise CheckpointError(tensor, f"truncated: {size} bytes, its manifest says {expected}")
    if size > expected:
        raise CheckpointError(tensor, f"altered: {size} bytes, its manifest says {expected}")
    digest = hashlib.sha256()
    with open(tensor, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    if digest.hexdigest() != manifest["sha256"]:
        raise CheckpointError(
            tensor,
            f"altered: its SHA-256 differs from the one in its manifest "
            f"{manifest_path(tensor).name}",
        )
    return manifest


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


def safe_load(path: str | os.PathLike[str], *, previous_format: bool = False) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU. `previous_format`: also allow
    NumPy's array type (the previous format's RNG state). A file holding other Python
    objects raises CheckpointError naming them; nothing in it runs."""
    p = Path(path)
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        names = _unsafe_globals(p)
        if not names:  # not a pickle at all, or a damaged one
            raise CheckpointError(
                p, "not a readable checkpoint: not a file torch.save wrote, or a damaged one"
            ) from exc
    except Exception as exc:
        raise CheckpointError(p, f"not a readable checkpoint: {_last_line(exc)}") from exc
    if previous_format and names and set(names) <= _PREVIOUS_FORMAT_NAMES:
        with torch.serialization.safe_globals(_previous_format_globals()):
            try:
                return torch.load(p, map_location="cpu", weights_only=True)
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


def _unsafe_globals(path: Path) -> list[str]:
    """The Python objects a file's pickle names, found without running it."""
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:
        return []


def load(path_or_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's payload (a file, or the newest in a directory), verified against its
    manifest and read with `weights_only=True`; `payload["path"]` is the tensor file,
    `payload["manifest"]` the manifest (None for the previous format)."""
    path = resolve(path_or_dir)
    manifest: dict[str, Any] | None = None
    if manifest_path(path).is_file():
        manifest = verify(path)
        payload = safe_load(path)
    else:
        payload = safe_load(path, previous_format=True)
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
            f"altered: step {payload.get('step')}, format "
            f"{payload['format']} in the file; step {manifest.get('step')}, format "
            f"{manifest.get('format')} in its manifest",
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


def _rng_problems(rng: Any) -> list[str]:
    """What keeps `set_rng_state(rng)` from restoring `rng` (this format's or the previous
    one's layout), found without touching any generator."""
    if not isinstance(rng, dict):
        return [f"rng={shown(rng)}: must be a dict of RNG states"]
    p = []
    state = rng.get("torch")
    if not (
        isinstance(state, torch.Tensor)
        and state.dtype == torch.uint8
        and state.shape == torch.get_rng_state().shape
    ):
        p.append("rng.torch: must be torch's RNG state (a uint8 tensor torch.get_rng_state gives)")
    numpy_state = rng.get("numpy")
    if isinstance(numpy_state, dict):
        key = numpy_state.get("key")
        if not (
            numpy_state.get("bit_generator") == "MT19937"
            and isinstance(key, torch.Tensor)
            and key.numel() == 624
            and all(is_int(numpy_state.get(k)) for k in ("pos", "has_gauss"))
            and isinstance(numpy_state.get("cached_gaussian"), (int, float))
        ):
            p.append("rng.numpy: must be NumPy's MT19937 state as a save writes it")
    elif not isinstance(numpy_state, tuple):
        p.append("rng.numpy: must be NumPy's RNG state")
    python_state = rng.get("python")
    if isinstance(python_state, dict):
        internal = python_state.get("state")
        if not (
            is_int(python_state.get("version"))
            and isinstance(internal, (list, tuple))
            and len(internal) == 625
            and all(is_int(x) and 0 <= x < 2**32 for x in internal)
        ):
            p.append("rng.python: must be Python's random state as a save writes it")
    elif not isinstance(python_state, tuple):
        p.append("rng.python: must be Python's random state")
    return p


def payload_problems(payload: dict[str, Any]) -> list[str]:
    """What is wrong with the layout of a loaded payload (empty when it is one `save`
    writes): each entry of the module docstring's table has the type a resume relies on."""
    p: list[str] = []
    step = payload.get("step")
    if not is_int(step) or step < 0:
        p.append(f"step={shown(step)}: must be an integer >= 0")
    if not isinstance(payload.get("config"), dict):
        p.append(f"config={shown(payload.get('config'))}: must be a dict of settings")
    backend = payload.get("backend")
    if not isinstance(backend, dict):
        p.append(f"backend={shown(backend)}: must be a dict (weights, optimizer, scaler)")
    elif not _tensors(backend.get("model")):
        p.append("backend.model: must map parameter names to tensors")
    buffers = payload.get("buffers")
    if buffers is not None and not _tensors(buffers):
        p.append("buffers: must map buffer names to tensors")
    p += _rng_problems(payload.get("rng"))
    data = payload.get("data")
    if data is not None and not (
        isinstance(data, dict)
        and set(data) <= {"epoch", "offset"}
        and all(is_int(v) and v >= 0 for v in data.values())
    ):
        p.append(f"data={shown(data)}: must be {{'epoch': int >= 0, 'offset': int >= 0}}")
    ref = payload.get("reference_batch")
    if ref is not None and (not is_int(ref) or ref < 1):
        p.append(f"reference_batch={shown(ref)}: must be an integer >= 1")
    model = payload.get("model")
    if model is not None:
        if not isinstance(model, dict):
            p.append(f"model={shown(model)}: must be a dict with 'name' and 'options' or None")
        else:
            name, options = model.get("name"), model.get("options")
            if name is not None and (not isinstance(name, str) or not name):
                p.append(f"model.name={shown(name)}: must be a model name or None")
            if options is not None and not (
                isinstance(options, dict) and all(isinstance(k, str) for k in options)
            ):
                p.append(f"model.options={shown(options)}: must map option names to values")
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
