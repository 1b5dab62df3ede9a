"""Checkpoints of an exported job that a cluster can stop: every N steps or S seconds, on
SIGTERM at the next step boundary, and a run that continues from the newest one.

Every script of an export (`train_deepspeed.py`, `train_fsdp.py`, `train_lightning.py`)
takes the same flags, their defaults from the exported config (`checkpoint_dir`,
`checkpoint_every_steps`, `checkpoint_every_seconds`):

    --checkpoint-dir DIR            where checkpoints go: DIR/step-N/, one folder a save
    --checkpoint-every-steps N      save after every N-th optimizer step
    --checkpoint-every-seconds S    save after the step that ends S seconds after the last save
    --keep-checkpoints K            the newest K complete ones are kept (0: all; default 2)
    --resume DIR | auto             continue from DIR's newest complete checkpoint; "auto":
                                    --checkpoint-dir's newest if it has one, else start afresh

With a checkpoint folder, SIGTERM (what Slurm, Kubernetes and the launchers send before
they stop a job; torchrun and the deepspeed launcher pass theirs on to the ranks) ends the
run at the next optimizer-step boundary: every rank saves, the run prints
{"event": "stopped", "signal": "SIGTERM", "step": N, "checkpoint": DIR/step-N} and exits 0.
The ranks agree on when to save and stop (one small all-reduce a step of the flags each
rank raised), so a signal or a clock seen by one rank first stops them all at one step.

A save is complete once `complete.json` is in its folder, written by rank 0 after every
rank wrote its part: a run killed while saving leaves an incomplete folder, which resume
passes over (and the next save of that step replaces). Older complete checkpoints are
removed only after a newer one is complete. What each rank resumes beyond the weights and
the optimizer: its random-number generators (dropout), and where it was in its data
(`job_common.batches(..., skip=...)` skips what the steps trained, without loading it).

Nothing read from a checkpoint chooses code to run: each rank's own state is read with
`torch.load(weights_only=True)`, and every pickle the engines read back (DeepSpeed's and
Lightning's files, torch.distributed.checkpoint's metadata) is checked first to name only
plain data types (`safe_to_load`); one that names anything else is refused, naming it.

The workbench ships this file as `workbench/export/job_checkpoints.py` and copies it as
is beside every job's script.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import shutil
import signal
import stat
import sys
import time
import zipfile
from typing import Any

import torch
import torch.distributed as dist

if __package__:  # a module of the package
    from workbench.export.job_files import fail, writable_folder
else:  # the exported folder's own copy, imported by its script
    from job_files import fail, writable_folder  # type: ignore[no-redef, import-not-found]

PREFIX = "step-"
COMPLETE = "complete.json"
RANK_FILE = "rank-{rank}.pt"
AUTO = "auto"
KEEP = 2


# --------------------------------------------------------------------------- flags
def add_checkpoint_arguments(parser: argparse.ArgumentParser, config: dict[str, Any]) -> None:
    """The checkpoint flags (see the module docstring), their defaults the exported
    config's."""
    config = checkpoint_defaults(config)
    group = parser.add_argument_group("checkpoints (continue a stopped run)")
    group.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        default=config.get("checkpoint_dir"),
        help="save checkpoints here (DIR/step-N/); with one, SIGTERM saves and stops at the "
        f"next step (default: the exported config's, {config.get('checkpoint_dir')})",
    )
    group.add_argument(
        "--checkpoint-every-steps",
        metavar="N",
        type=_whole,
        default=config.get("checkpoint_every_steps"),
        help="save after every N-th optimizer step "
        f"(default: {config.get('checkpoint_every_steps')})",
    )
    group.add_argument(
        "--checkpoint-every-seconds",
        metavar="S",
        type=_seconds,
        default=config.get("checkpoint_every_seconds"),
        help="save after the step that ends S seconds after the last save "
        f"(default: {config.get('checkpoint_every_seconds')})",
    )
    group.add_argument(
        "--keep-checkpoints",
        metavar="K",
        type=_count,
        default=KEEP,
        help=f"keep the newest K complete checkpoints, 0 for all (default {KEEP})",
    )
    group.add_argument(
        "--resume",
        metavar="DIR|auto",
        default=None,
        help="continue from DIR's newest complete checkpoint; 'auto': the newest in "
        "--checkpoint-dir if there is one, else start afresh",
    )


def checkpoint_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The exported config's checkpoint settings, each checked (a job.json edited by hand
    gets an error naming the key, the value and what is allowed)."""
    checks: dict[str, tuple[str, Any]] = {
        "checkpoint_dir": ("a folder path or null", lambda v: isinstance(v, str) and v != ""),
        "checkpoint_every_steps": (
            "an integer >= 1 or null",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        ),
        "checkpoint_every_seconds": (
            "a number of seconds > 0 or null",
            lambda v: (
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v > 0
            ),
        ),
    }
    out: dict[str, Any] = {}
    for key, (allowed, ok) in checks.items():
        value = config.get(key)
        if value is not None and not ok(value):
            fail(f"job.json config.{key}={value!r}: must be {allowed}")
        out[key] = value
    return out


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= 1")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= 0")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number of seconds > 0")
    return value


def resume_folder(args: argparse.Namespace) -> str | None:
    """The checkpoint (a DIR/step-N folder) this run continues from, or None; checks the
    checkpoint flags first (exits naming the flag and the value when one cannot hold):
    a period needs a --checkpoint-dir, --checkpoint-dir must be a writable folder (or a
    path to make one at) that holds no checkpoints of another run unless this run resumes
    from it, --resume DIR must hold a complete checkpoint."""
    ckdir, resume = args.checkpoint_dir, args.resume
    every = [
        f"{flag} {value}"
        for flag, value in (
            ("--checkpoint-every-steps", args.checkpoint_every_steps),
            ("--checkpoint-every-seconds", args.checkpoint_every_seconds),
        )
        if value is not None
    ]
    if every and not ckdir:
        fail(f"{every[0]}: needs --checkpoint-dir DIR (where the checkpoints go)")
    if resume == AUTO and not ckdir:
        fail("--resume auto: needs --checkpoint-dir DIR (it continues from the newest there)")
    if ckdir is not None:
        writable_folder(ckdir, "--checkpoint-dir", make=True)
    found = None
    if resume is not None and resume != AUTO:
        if not os.path.isdir(resume):
            fail(f"--resume {resume!r}: must be a checkpoint folder (or 'auto'); none is there")
        found = newest(resume)
        if found is None:
            fail(
                f"--resume {resume!r}: holds no complete checkpoint ({PREFIX}N folder with "
                f"{COMPLETE}); 'auto' starts afresh when there is none"
            )
    elif resume == AUTO:
        found = newest(ckdir)
    if ckdir is not None and found is None:
        there = newest(ckdir)
        if there is not None:
            fail(
                f"--checkpoint-dir {ckdir!r}: holds another run's checkpoint "
                f"({os.path.basename(there)}); continue it with --resume auto, or pass "
                "another folder"
            )
    return found


def step_of(folder: str) -> int:
    """N of a DIR/step-N folder's name."""
    return int(os.path.basename(os.path.normpath(folder))[len(PREFIX) :])


def newest(directory: str | None) -> str | None:
    """The newest complete checkpoint folder in `directory` (the highest N of its step-N
    folders with a readable `complete.json`), or None."""
    if not directory or not os.path.isdir(directory):
        return None
    steps = []
    for name in os.listdir(directory):
        digits = name[len(PREFIX) :]
        if name.startswith(PREFIX) and digits.isdigit():
            steps.append(int(digits))
    for step in sorted(steps, reverse=True):
        folder = os.path.join(directory, f"{PREFIX}{step}")
        try:
            with open(os.path.join(folder, COMPLETE)) as f:
                done = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(done, dict) and done.get("step") == step:
            return folder
    return None


def read_complete(folder: str) -> dict[str, Any]:
    """A complete checkpoint's `complete.json` (what rank 0 wrote once every rank saved)."""
    with open(os.path.join(folder, COMPLETE)) as f:
        done: dict[str, Any] = json.load(f)
    return done


# --------------------------------------------------------------------------- saving
class Checkpoints:
    """When to save (every N steps, every S seconds, SIGTERM) and the bookkeeping of a
    save; a job script calls `due(step)` after each optimizer step, saves its engine's
    state into `folder(step)` on every rank when it says so, then `commit(...)`."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.directory: str | None = args.checkpoint_dir
        self.every_steps: int | None = args.checkpoint_every_steps
        self.every_seconds: float | None = args.checkpoint_every_seconds
        self.keep: int = args.keep_checkpoints
        self.device = device
        self.signal: str | None = None
        self.last_save = time.monotonic()
        if self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)
            signal.signal(signal.SIGTERM, self._on_signal)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signal = signal.Signals(signum).name

    def due(self, step: int, last: int) -> tuple[bool, bool]:
        """(save now, stop after saving) after optimizer step `step` of `last`, agreed by
        every rank (the flags each rank raised, all-reduced with MAX)."""
        if self.directory is None:
            return False, False
        periodic = self.every_steps is not None and step % self.every_steps == 0
        elapsed = time.monotonic() - self.last_save
        timed = self.every_seconds is not None and elapsed >= self.every_seconds
        flags = [float(self.signal is not None), float(periodic or timed)]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            agreed = torch.tensor(flags, device=self.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            flags = agreed.tolist()
        stop = flags[0] > 0 and step < last  # at the last step the run ends anyway
        return stop or flags[1] > 0, stop

    def folder(self, step: int) -> str:
        """Where step `step`'s checkpoint goes (an incomplete one there is replaced)."""
        assert self.directory is not None
        path = os.path.join(self.directory, f"{PREFIX}{step}")
        if rank() == 0 and os.path.exists(path):
            shutil.rmtree(path)
        barrier()
        if rank() == 0:
            os.makedirs(path)
        barrier()
        return path

    def commit(self, step: int, fields: dict[str, Any]) -> str:
        """Mark step `step`'s checkpoint complete (rank 0, once every rank saved), remove
        the complete ones beyond the newest `keep`; returns its folder."""
        path = os.path.join(str(self.directory), f"{PREFIX}{step}")
        barrier()  # every rank's files are written
        if rank() == 0:
            done = {"step": step, "world_size": world_size(), **fields}
            write_atomically(os.path.join(path, COMPLETE), json.dumps(done) + "\n")
            self._prune()
            print(json.dumps({"event": "checkpoint", "step": step, "path": path}), flush=True)
        barrier()
        self.last_save = time.monotonic()
        return path

    def _prune(self) -> None:
        if not self.keep or self.directory is None:
            return
        complete = []
        for name in os.listdir(self.directory):
            digits = name[len(PREFIX) :]
            folder = os.path.join(self.directory, name)
            done = os.path.exists(os.path.join(folder, COMPLETE))
            if name.startswith(PREFIX) and digits.isdigit() and done:
                complete.append((int(digits), folder))
        for _, folder in sorted(complete, reverse=True)[self.keep :]:
            shutil.rmtree(folder, ignore_errors=True)

    def stopped(self, step: int, path: str) -> None:
        """Rank 0's line for a run that a signal stopped after saving `path`."""
        if rank() == 0:
            line = {"event": "stopped", "signal": self.signal or "SIGTERM", "step": step}
            print(json.dumps({**line, "checkpoint": path}), flush=True)


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- each rank's own
def save_rank_state(folder: str, extra: dict[str, Any] | None = None) -> None:
    """This rank's random-number generators (and `extra`: plain tensors and numbers) in
    folder/rank-R.pt."""
    state: dict[str, Any] = {"cpu_rng": torch.get_rng_state(), **(extra or {})}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda_rng"] = torch.cuda.get_rng_state()
    torch.save(state, os.path.join(folder, RANK_FILE.format(rank=rank())))


def load_rank_state(folder: str) -> dict[str, Any]:
    """This rank's state saved by `save_rank_state`, its generators restored; read with
    `weights_only=True` (exits naming the file when it is missing or not plain data)."""
    path = os.path.join(folder, RANK_FILE.format(rank=rank()))
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, pickle.UnpicklingError, RuntimeError, zipfile.BadZipFile) as exc:
        fail(f"--resume {folder!r}: cannot read {os.path.basename(path)} ({_first_line(exc)})")
    torch.set_rng_state(state["cpu_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])
    return state


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- the engines' files
#: globals a pickle an engine writes may name beyond torch's own weights-only set: plain
#: containers and the engines' data classes (no function, nothing that runs code when built)
SAFE_MODULES = ("torch.distributed.checkpoint.", "deepspeed.", "lightning.", "torch.")
SAFE_GLOBALS = frozenset(
    {
        "collections.OrderedDict",
        "collections.defaultdict",
        "builtins.set",
        "builtins.frozenset",
        "builtins.slice",
        "builtins.complex",
        "argparse.Namespace",
        "pathlib.PosixPath",
        "pathlib.PurePosixPath",
        "copyreg._reconstructor",
        "builtins.object",
        "_codecs.encode",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.ndarray",
        "numpy.dtype",
        # DeepSpeed's loss scalers, pickled whole into its optimizer states: plain attributes
        # set back on load (no __setstate__, no __reduce__)
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    }
)


def _plain_type(module: str, name: str) -> bool:
    """A class of one of the engines' packages that is plain data (a dataclass, an enum,
    a named tuple, a torch dtype/Size/device/layout), never a function."""
    if f"{module}.{name}" in SAFE_GLOBALS:
        return True
    if not module.startswith(SAFE_MODULES) and module != "torch":
        return False
    obj: Any = sys.modules.get(module)  # never imported for a file's sake: loaded ones only
    try:
        for part in name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return False
    if isinstance(obj, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return True
    if not isinstance(obj, type):
        return False
    import dataclasses
    import enum

    plain = (torch.Size, torch.dtype, torch.device, torch.layout, torch.memory_format)
    return (
        dataclasses.is_dataclass(obj)
        or issubclass(obj, (enum.Enum, *plain))
        or (issubclass(obj, tuple) and hasattr(obj, "_fields"))
    )


#: opcodes that push a string (the operands of a STACK_GLOBAL) and that store/fetch memo
_STRINGS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING"}
)
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
UNKNOWN = "<a global built at load time>"


def _globals_in(blob: bytes) -> set[str]:
    """The globals one pickle names, read from its opcodes (nothing is built): GLOBAL's
    operand, or STACK_GLOBAL's two strings when the opcodes just before push them (a
    STACK_GLOBAL whose operands come from elsewhere is `UNKNOWN`, and so unsafe)."""
    import pickletools

    names: set[str] = set()
    memo: dict[int, Any] = {}
    recent: list[Any] = []  # what the last opcodes pushed (strings, or None for anything else)
    memo_count = 0
    for op, arg, _pos in pickletools.genops(blob):
        name = op.name
        if name == "GLOBAL":
            names.add(str(arg).replace(" ", "."))
            recent.append(None)
        elif name == "STACK_GLOBAL":
            if len(recent) >= 2 and isinstance(recent[-1], str) and isinstance(recent[-2], str):
                names.add(f"{recent[-2]}.{recent[-1]}")
            else:
                names.add(UNKNOWN)
            recent.append(None)
        elif name in _STRINGS:
            recent.append(arg if isinstance(arg, str) else None)
        elif name == "MEMOIZE":
            memo[memo_count] = recent[-1] if recent else None
            memo_count += 1
        elif name in _PUTS:
            memo[int(arg or 0)] = recent[-1] if recent else None
        elif name in _GETS:
            recent.append(memo.get(int(arg or 0)))
        else:
            recent.append(None)
        del recent[:-2]
    return names


def pickled_globals(path: str) -> set[str]:
    """The globals the pickle(s) in file `path` name (a torch.save zip: its .pkl records;
    else the file as one pickle), read without building any of them; a file that is no
    pickle gives `UNKNOWN`."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            blobs = [z.read(n) for n in z.namelist() if n.endswith(".pkl")]
    else:
        with open(path, "rb") as f:
            blobs = [f.read()]
    names: set[str] = set()
    for blob in blobs:
        try:
            names |= _globals_in(blob)
        except Exception:  # noqa: BLE001 - not a pickle pickletools can read: not plain data
            names.add(UNKNOWN)
    return names


def only_plain_files(folder: str) -> None:
    """Every entry under `folder` is a regular file or a folder: a link (to files or a folder
    nothing checked) or a FIFO (a read that blocks) is refused, naming it."""
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                fail(
                    f"--resume {folder!r}: {os.path.relpath(path, folder)} is a link, FIFO or "
                    "device, not a regular file or folder; a checkpoint's files are its own"
                )


def safe_to_load(folder: str, suffixes: tuple[str, ...]) -> None:
    """Every entry under `folder` is a regular file or folder (`only_plain_files`) and every
    file ending in one of `suffixes` is a pickle of plain data (see `_plain_type`), else
    exits naming the file and the global it names."""
    only_plain_files(folder)
    for root, _dirs, files in os.walk(folder):
        for name in sorted(files):
            if not name.endswith(suffixes):
                continue
            path = os.path.join(root, name)
            for global_name in sorted(pickled_globals(path)):
                module, _, attr = global_name.rpartition(".")
                if not _plain_type(module, attr) and global_name not in _TORCH_SAFE:
                    fail(
                        f"--resume {folder!r}: {os.path.relpath(path, folder)} names "
                        f"{global_name}, which is not plain data; it is not loaded (nothing "
                        "read from a checkpoint chooses code to run)"
                    )


def _torch_safe() -> frozenset[str]:
    """The globals torch's weights-only unpickler allows (its rebuild functions, storages)."""
    from torch._weights_only_unpickler import _get_allowed_globals

    return frozenset(_get_allowed_globals())


_TORCH_SAFE = _torch_safe()


# --------------------------------------------------------------------------- sharded states
def save_sharded(folder: str, module: torch.nn.Module, optimizer: Any) -> None:
    """The module's and the optimizer's sharded states (FSDP2's and tensor parallel's
    DTensors, each rank its own shards) in `folder`, with torch.distributed.checkpoint;
    every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    dcp_save: Any = dcp.save  # type: ignore[attr-defined]
    model_state, optim_state = get_state_dict(module, optimizer)
    dcp_save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)


def load_sharded(folder: str, module: torch.nn.Module, optimizer: Any) -> None:
    """`save_sharded`'s states from `folder` into the module and the optimizer (sharded
    as they are now); its metadata is checked to name plain data first and what it holds
    beyond tensors is read with `weights_only=True`; every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    class PlainLoadPlanner(DefaultLoadPlanner):
        """DCP's default loader, whose non-tensor items are read as weights only."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = torch.load(value, map_location="cpu", weights_only=True)
            if self.flatten_state_dict:
                set_element(
                    self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded
                )
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    safe_to_load(folder, (".metadata",))
    model_state, optim_state = get_state_dict(module, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    dcp_load: Any = dcp.load  # type: ignore[attr-defined]
    dcp_load(state, checkpoint_id=folder, planner=PlainLoadPlanner())
    set_state_dict(
        module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
