"""Saving a Session and continuing one: where a save goes, what its manifest says, and what a
loaded checkpoint gives the Session that resumes it.

`workbench.train.checkpoints` owns the files (the payload, the manifest, atomic writes,
the checks); this module is the Session's side of them:

* `save_target(path, checkpoint_dir, step, world_size, rank)`: the file a
  `save_checkpoint(path)` writes and the folder to prune, if it saves into one (each
  rank's own, `rank-<r>`, with several ranks);
* `manifest_fields(...)`: what the manifest says beyond the payload (model, ranks, log);
* `resume_settings(payload, model, config_changes)`: the config, model and model options
  `Session.resume_from` builds with; the file never chooses code (a built-in model name
  only) nor where the resumed run writes (beside the checkpoint it read);
* `resumed_records(payload)`: the history a resumed session starts with, from the run's
  own `log.jsonl` only (in the checkpoint's folder or one below it);
* `resumed_run(payload)`: the run a resumed session continues (its id, and the folder whose
  checkpoints without a run id are that run's);
* `folder_check(...)`: refuses a folder a run must not write into (another run's
  checkpoints or log, or its own newer checkpoints), before anything is written;
* `check_resumed_weights(module, payload, ...)`: the checkpoint's weights fit the module
  a resumed session trains, else ValueError naming the checkpoint and `model=`;
* `check_checkpoint_arg(name, value)`: a checkpoint argument (`resume`, `path_or_dir`)
  is a path (or a loaded payload), else ValueError naming it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError, SettingProblem, TrainConfig, plain_value
from workbench.inputs import file_kind, shown
from workbench.models import options_from_file
from workbench.train import checkpoints as ckpt
from workbench.train.history import RECENT_RECORDS
from workbench.train.records import StepRecord
from workbench.train.runlog import LOG_NAME, tail_records


def save_target(
    path: str | os.PathLike[str] | None,
    checkpoint_dir: str | None,
    step: int,
    world_size: int = 1,
    rank: int = 0,
) -> tuple[Path, Path | None]:
    """(the tensor file to write, the folder to prune or None). `path`: a file name (used
    as is), a directory (`step-N.pt` in it), or None for `checkpoint_dir`. With several
    ranks a directory gets each rank's own folder in it, `rank-<r>` (unless it is that
    folder already, as `workbench launch` hands each rank): ranks writing one `step-N.pt`
    would overwrite each other's."""
    if path is not None and (not isinstance(path, (str, os.PathLike)) or not _text(path)):
        raise ValueError(
            f"path={shown(path)}: must be a file or folder path (a non-empty str or "
            "os.PathLike), or None for config.checkpoint_dir"
        )
    name = "path"
    if path is None:
        if checkpoint_dir is None:
            raise ValueError(
                "path=None: pass a file or directory, or set checkpoint_dir in the config"
            )
        path, name = checkpoint_dir, "checkpoint_dir"
    p = Path(path)
    kind = _special_kind(p)
    if kind is not None:
        raise ValueError(
            f"{name}={shown(str(p), 1000)}: exists and is {kind}, where a checkpoint file or a "
            "folder for checkpoints is needed; nothing was written"
        )
    directory = p if (p.is_dir() or (p.suffix == "" and not os.path.lexists(p))) else None
    if directory is not None and world_size > 1 and directory.name != f"rank-{rank}":
        directory = directory / f"rank-{rank}"
    return (directory / ckpt.checkpoint_name(step) if directory else p), directory


def _special_kind(path: Path) -> str | None:
    """What an existing `path` is when it is neither a folder nor a regular file (a FIFO,
    a device, a socket; a link followed), else None."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISDIR(mode) or stat.S_ISREG(mode) else file_kind(mode)


def _text(path: Any) -> str:
    """A path's text ("" for an empty one; bytes paths are refused: not text)."""
    name = os.fspath(path)
    return name.strip() if isinstance(name, str) else ""


def resumed_run(payload: dict[str, Any] | None) -> tuple[str, Path | None]:
    """(the run id a session continues, the folder whose checkpoints without a run id are
    its own). A new session: a new id, no folder. A resumed one: the id its checkpoint's
    manifest names, or a new one for a checkpoint of the previous layout (none named);
    either way the checkpoints without a run id in the folder it resumed from count as
    this run's (the previous layout's, which this run continues)."""
    if payload is None:
        return ckpt.new_run_id(), None
    manifest = payload.get("manifest") or {}
    run = manifest.get("run")
    home = Path(str(payload["path"])).parent if payload.get("path") else None
    if isinstance(run, str) and ckpt.RUN_ID.match(run):
        return run, home
    return ckpt.new_run_id(), home


def folder_check(
    directory: Path,
    *,
    run: str,
    step: int,
    home: Path | None,
    log_folder: Path | None,
    own_folders: set[str],
) -> None:
    """ValueError (CheckpointError naming `directory`) when run `run` at step `step` must
    not write checkpoints into `directory` (`checkpoints.run_folder_problem`), or its log
    into `log_folder`'s log.jsonl; `home`: the folder it resumed from; `own_folders`:
    folders (resolved) this session already writes into."""
    checks: list[tuple[Path, Path | None]] = [(directory, None)]
    if log_folder is not None:
        log_file = log_folder / LOG_NAME
        if _same(log_folder, directory):
            checks = [(directory, log_file)]
        else:
            checks.append((log_folder, log_file))
    for folder, log in checks:
        is_home = home is not None and _same(folder, home)
        problem = ckpt.run_folder_problem(
            folder,
            run,
            step,
            own_unlabeled=is_home,
            log=log,
            log_is_own=is_home or _key(folder) in own_folders,
        )
        if problem is not None:
            raise ckpt.CheckpointError(folder, problem)


def _key(folder: Path) -> str:
    return os.path.realpath(folder)


def _same(a: Path, b: Path) -> bool:
    return _key(a) == _key(b)


def manifest_fields(
    *,
    target: Path,
    model_name: str | None,
    model_options: dict[str, Any],
    module_type: str,
    n_params: int,
    world_size: int,
    rank: int,
    log_path: str | None,
    run: str | None = None,
) -> dict[str, Any]:
    """What a checkpoint's manifest says beyond the payload: the model, the ranks, the run
    that wrote it, and where the run's log is (relative to the checkpoint when it is
    beside it)."""
    log_file = log_path
    if log_file is not None:
        with contextlib.suppress(ValueError):
            log_file = os.path.relpath(log_file, target.parent)
    return {
        "model": {
            "name": model_name,
            "options": model_options,
            "module": module_type,
            "n_params": int(n_params),
        },
        "world_size": world_size,
        "rank": rank,
        "log": log_file,
        **({} if run is None else {"run": run}),
    }


def resume_settings(
    payload: dict[str, Any],
    model: Any,
    config_changes: dict[str, Any],
    model_options: dict[str, Any] | None = None,
) -> tuple[TrainConfig, Any, dict[str, Any] | None]:
    """(config, model, model options) for a Session continuing `payload`.

    The saved settings with `config_changes` applied; a run that saved checkpoints goes on
    saving beside the one it resumed from. `model` None rebuilds the built-in model the
    checkpoint names (a built-in name only: resolving it never imports anything);
    ValueError when it holds a module of your own, which you pass as `model`.
    `model_options`: yours, instead of the saved ones. Saved options that would make the
    workbench read another file (tiny-gpt's `text`) are refused: a file read never chooses
    which other file is read; pass them yourself."""
    config = TrainConfig.from_dict(payload["config"])
    if config.checkpoint_dir is not None:  # the file does not choose where to write
        config = config.replace(checkpoint_dir=str(Path(payload["path"]).parent))
    if config_changes:
        saved_config = config
        config = config.replace(**config_changes)
        if config.documents != saved_config.documents:
            raise ConfigError(
                [
                    SettingProblem(
                        "documents",
                        plain_value(config.documents),
                        f"the checkpoint was trained with documents="
                        f"{shown(plain_value(saved_config.documents))}, and the layout decides "
                        "the samples, the data position and the vocabulary; resume with it",
                    )
                ]
            )
    saved = payload.get("model") or {}
    options = None
    if model is None:
        if not saved.get("name"):
            raise ValueError(
                "model=None: the checkpoint holds a user module; pass model= (a module of "
                "the same architecture), data= and loss_fn="
            )
        model, options = saved["name"], saved.get("options") or None
    elif isinstance(model, str) and model == saved.get("name"):
        options = saved.get("options") or None
    if model_options is not None:
        return config, model, model_options
    problems = options_from_file(model, options, source=f"checkpoint {shown(payload['path'])}")
    if problems:
        raise ConfigError([SettingProblem("model_options", p.value, str(p)) for p in problems])
    return config, model, options


def resumed_records(payload: dict[str, Any]) -> list[StepRecord]:
    """The history a resumed session starts with: the newest records, up to the
    checkpoint's step, of the run's log named in its manifest (or, for the previous
    format, the records inside the checkpoint). Only a `log.jsonl` in the checkpoint's
    folder or a folder below it is read (`_own_log`), and only when it is a regular file
    (none: an empty history)."""
    if "history" in payload:  # previous format
        history = payload["history"]
        records = []
        for r in history[-RECENT_RECORDS:] if isinstance(history, list) else []:
            with contextlib.suppress(TypeError, ValueError, KeyError, AttributeError):
                records.append(StepRecord.from_dict(r))  # a record of another shape: skipped
        return records
    manifest = payload.get("manifest") or {}
    log_name = manifest.get("log")
    if not isinstance(log_name, str) or not log_name:
        return []
    log_file = _own_log(Path(payload["path"]).parent, log_name)
    if log_file is None or not os.path.lexists(log_file):
        return []
    try:
        return tail_records(log_file, up_to_step=int(payload["step"]), limit=RECENT_RECORDS)
    except (OSError, ValueError):  # not a regular file, or unreadable: no history
        return []


def _own_log(folder: Path, name: str) -> Path | None:
    """The log a manifest names, `name` relative to the checkpoint's `folder`, when it is a
    `log.jsonl` in that folder or one below it, reached without a symbolic link (a save's
    own run folder, beside the checkpoint or the `checkpoint_dir` it was saved from);
    None for anything else ("../other/log.jsonl", an absolute path): a file never
    chooses which other file is read."""
    parts = Path(name).parts
    if not parts or parts[-1] != LOG_NAME or Path(name).is_absolute():
        return None
    if any(p in ("", ".", "..") for p in parts) or len(parts) > 8:
        return None
    here = folder
    for part in parts[:-1]:
        here = here / part
        if os.path.islink(here):
            return None
    return folder.joinpath(*parts)


__all__ = [
    "check_resumed_weights",
    "folder_check",
    "manifest_fields",
    "resume_settings",
    "resumed_records",
    "resumed_run",
    "save_target",
]


def check_resumed_weights(
    module: nn.Module, payload: dict[str, Any], *, model: Any, model_options: Any
) -> None:
    """ValueError naming the checkpoint and `model=` (and `model_options=`) when the
    checkpoint's weights do not fit `module`: a parameter it trains that the checkpoint
    has no weights for, or one of another shape. Read before anything changes (a running
    Session on `module` keeps training); a LoRA checkpoint's base layers are matched by
    their names without peft's `base_layer`, and packed 4-bit weights are left to the
    backend."""
    weights = (payload.get("backend") or {}).get("model")
    if not isinstance(weights, dict):
        return  # the backend names what the state lacks
    saved = {k.replace(".base_layer.", "."): v for k, v in weights.items() if isinstance(k, str)}
    missing, shapes = [], []
    for name, p in module.named_parameters():
        w = saved.get(name)
        if w is None:
            if p.requires_grad:
                missing.append(name)
        elif isinstance(w, torch.Tensor) and w.is_floating_point() and w.shape != p.shape:
            shapes.append(f"{name} is {tuple(w.shape)} there, {tuple(p.shape)} in the model")
    if not missing and not shapes:
        return
    what = [f"parameter {shapes[0]}"] if shapes else []
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        what.append(f"no weights for {', '.join(missing[:3])}{more}")
    given = f"model= (your {type(module).__name__})"
    if isinstance(model, str):
        given = f"model={shown(model)}, model_options={shown(model_options)}"
    raise ValueError(
        f"resume: the checkpoint {payload.get('path')} holds another model's weights than "
        f"{given} ({'; '.join(what)}); pass the model the checkpoint was trained with "
        "(the same architecture and options); nothing was changed"
    )


def check_checkpoint_arg(name: str, value: Any, *, payload_too: bool = False) -> None:
    """ValueError naming `name` unless `value` is a checkpoint file or folder path (with
    `payload_too`: None, or a payload `checkpoints.load` returned)."""
    if payload_too and value is None:
        return
    if payload_too and isinstance(value, dict):
        problems = ckpt.payload_problems(value)
        if problems or "path" not in value:
            raise ValueError(
                f"{name}: a dict that is not a payload workbench.train.checkpoints.load "
                f"returned ({'; '.join(problems) or 'no path'}); pass the checkpoint's path"
            )
        return
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.strip():
        more = ", a payload workbench.train.checkpoints.load returned, or None"
        raise ValueError(
            f"{name}={shown(value)}: must be a checkpoint file or folder path (a non-empty "
            f"str or os.PathLike){more if payload_too else ''}"
        )
