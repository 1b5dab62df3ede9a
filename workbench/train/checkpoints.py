"""Training checkpoints: one file per save, written atomically, the newest N kept.

A checkpoint (a `torch.save` dict) holds everything needed to continue a run exactly:

    format        CHECKPOINT_FORMAT
    step          optimizer steps attempted so far (the Session's step counter)
    config        TrainConfig.to_dict()
    backend       Backend.export_state(): fp32 weights by parameter name, optimizer state
                  by parameter name, loss scaler, schedule position (backend-neutral)
    buffers       the model's persistent buffers by name
    rng           torch CPU (+ CUDA) generator states, numpy's and Python's `random`
    data          data position {"epoch", "offset"}
    reference_batch  effective batch the LR scaling is relative to
    model         built-in model name and options, or None for a user module
    history       the StepRecords so far (as dicts)

Files are written to `<name>.tmp` in the target directory, flushed and fsynced, then
`os.replace`d into place, so a crash never leaves a half-written checkpoint under the
real name. In a directory, files are named `step-00000042.pt`; after each save only the
newest `keep_checkpoints` of them stay.

Loading uses `torch.load(weights_only=False)` because the RNG states are Python
objects: load only checkpoints you wrote yourself.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_FORMAT = 1
_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def training_payload(
    *,
    step: int,
    config: Any,
    runtime: Any,
    reference_batch: int,
    model_name: str | None,
    model_options: dict[str, Any],
    history: list[Any],
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
        "history": [r.to_dict() for r in history],
    }


def write_atomic(payload: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """`torch.save` to a temporary file beside `path`, fsync, then rename over `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints named `step-N.pt` in `directory`, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def prune(directory: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints; returns the deleted paths."""
    files = list_checkpoints(directory)
    doomed = files[:-keep] if keep > 0 else files
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed


def resolve(path_or_dir: str | os.PathLike[str]) -> Path:
    """The checkpoint file itself, or the newest one in a directory."""
    p = Path(path_or_dir)
    if p.is_dir():
        files = list_checkpoints(p)
        if not files:
            raise ValueError(f"path={str(p)!r}: no checkpoint (step-N.pt) in this directory")
        return files[-1]
    if not p.is_file():
        raise ValueError(f"path={str(p)!r}: no such checkpoint file or directory")
    return p


def load(path_or_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = resolve(path_or_dir)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"path={str(path)!r}: not a readable checkpoint: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"path={str(path)!r}: not a workbench checkpoint (format {CHECKPOINT_FORMAT})"
        )
    payload["path"] = str(path)
    return payload
