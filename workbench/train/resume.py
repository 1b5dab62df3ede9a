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
  own `log.jsonl` only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, SettingProblem, TrainConfig, plain_value
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
    if path is None:
        if checkpoint_dir is None:
            raise ValueError(
                "path=None: pass a file or directory, or set checkpoint_dir in the config"
            )
        path = checkpoint_dir
    p = Path(path)
    directory = p if (p.is_dir() or p.suffix == "") else None
    if directory is not None and world_size > 1 and directory.name != f"rank-{rank}":
        directory = directory / f"rank-{rank}"
    return (directory / ckpt.checkpoint_name(step) if directory else p), directory


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
) -> dict[str, Any]:
    """What a checkpoint's manifest says beyond the payload: the model, the ranks, and
    where the run's log is (relative to the checkpoint when it is beside it)."""
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
    }


def resume_settings(
    payload: dict[str, Any], model: Any, config_changes: dict[str, Any]
) -> tuple[TrainConfig, Any, dict[str, Any] | None]:
    """(config, model, model options) for a Session continuing `payload`.

    The saved settings with `config_changes` applied; a run that saved checkpoints goes on
    saving beside the one it resumed from. `model` None rebuilds the built-in model the
    checkpoint names (a built-in name only: resolving it never imports anything);
    ValueError when it holds a module of your own, which you pass as `model`."""
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
                        f"{plain_value(saved_config.documents)!r}, and the layout decides "
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
    return config, model, options


def resumed_records(payload: dict[str, Any]) -> list[StepRecord]:
    """The history a resumed session starts with: the newest records, up to the
    checkpoint's step, of the run's log named in its manifest (or, for the previous
    format, the records inside the checkpoint). Only a file named `log.jsonl` is read."""
    if "history" in payload:  # previous format
        return [StepRecord.from_dict(r) for r in payload["history"][-RECENT_RECORDS:]]
    manifest = payload.get("manifest") or {}
    log_name = manifest.get("log")
    if not isinstance(log_name, str) or not log_name:
        return []
    log_file = Path(payload["path"]).parent / log_name
    # the manifest names the run's own log; any other file is not read
    if log_file.name != LOG_NAME or not log_file.is_file():
        return []
    return tail_records(log_file, up_to_step=int(payload["step"]), limit=RECENT_RECORDS)


__all__ = ["manifest_fields", "resume_settings", "resumed_records", "save_target"]
