"""The Session's checkpoints: `save_checkpoint()` at a step boundary and the autosave
after a step (`checkpoint_every_steps` / `checkpoint_every_seconds`).

`SessionSaves` is a base class of `workbench.train.session.Session`. The payload is
`workbench.train.checkpoints.training_payload`'s (taken with this session's RNG stream
installed), where it goes is `workbench.train.resume.save_target`'s, and the write (the
folder claimed, the log flushed, older checkpoints pruned) is the session's
`RunFolders.write` (`workbench.train.run_folders`). Of the Session's private state it
uses only what is declared on `SessionSaves`; the rest is the Session's public API.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from torch import nn

from workbench.config import TrainConfig
from workbench.modelstats import count_parameters
from workbench.train import checkpoints as ckpt
from workbench.train.records import Event
from workbench.train.resume import manifest_fields, save_target
from workbench.train.run_folders import RunFolders
from workbench.train.runtime import Runtime


class SessionSaves:
    """Checkpoints of a live Session (see the module docstring)."""

    # The Session's side (workbench.train.session defines them).
    _model: nn.Module  # your module
    _rt: Runtime  # the data stream and backend the settings in effect are built into
    _config: TrainConfig  # the settings in effect
    _step: int  # optimizer steps so far
    _step_lock: threading.RLock  # held between steps
    _folders: RunFolders  # the run's id and the folders it claimed
    world_size: int
    rank: int
    run_id: str
    reference_batch: int
    model_name: str | None
    model_options: dict[str, Any]

    def _event(self, kind: str, message: str, severity: str = "info", **details: Any) -> Event:
        """Record an event."""
        raise NotImplementedError

    def _check_open(self, action: str) -> None:
        """SessionStateError naming `action` when the session is closed."""
        raise NotImplementedError

    def _apply_pending(self, *, raise_errors: bool) -> None:
        """Apply the queued changes (the step lock held)."""
        raise NotImplementedError

    def _rng_installed(self) -> contextlib.AbstractContextManager[None]:
        """This session's RNG stream in torch's global generators for a block."""
        raise NotImplementedError

    @property
    def log_path(self) -> str | None:
        raise NotImplementedError

    def flush_log(self) -> None:
        raise NotImplementedError

    def _autosave(self) -> None:
        if self._folders.save_due(self._config, self._step):
            try:
                self.save_checkpoint()
            except Exception as exc:
                self._event("checkpoint-failed", f"autosave failed: {exc}", "warning")

    def save_checkpoint(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write a checkpoint at the current step boundary; returns its path. `path`: a file
        name (used as is; its manifest beside it, `NAME.json`), a directory (`step-N.pt` and
        `step-N.json` in it, then only the newest `keep_checkpoints` kept), or None for
        `config.checkpoint_dir`; with several ranks a directory gets each rank's own folder
        in it (`rank-<r>`, as `workbench launch` lays them out). The layout is in
        `workbench.train.checkpoints`; `torch.load(path, weights_only=True)` reads it, the
        trained weights under `payload["backend"]["model"]` (fp32, by parameter name). The
        step records are in the run's log. An OSError (a folder it cannot write) names
        `path`; the session trains on."""
        self._check_open("save_checkpoint")
        with self._step_lock:
            self._apply_pending(raise_errors=False)
            cfg = self._config
            target, directory = save_target(
                path, cfg.checkpoint_dir, self._step, self.world_size, self.rank
            )
            with self._rng_installed():  # the payload's RNG states are this session's
                payload = ckpt.training_payload(
                    step=self._step,
                    config=cfg,
                    runtime=self._rt,
                    reference_batch=self.reference_batch,
                    model_name=self.model_name,
                    model_options=self.model_options,
                )
            written = self._folders.write(
                payload,
                target,
                directory,
                config=cfg,
                step=self._step,
                flush_log=self.flush_log,
                describe=lambda: self._manifest_fields(target),
                given=path if path is not None else cfg.checkpoint_dir,
            )
        self._event("checkpoint", f"saved checkpoint {written}", path=str(written))
        return str(written)

    def _manifest_fields(self, target: Path) -> dict[str, Any]:
        return manifest_fields(
            target=target,
            model_name=self.model_name,
            model_options=self.model_options,
            module_type=type(self._model).__name__,
            n_params=count_parameters(self._model),
            world_size=self.world_size,
            rank=self.rank,
            log_path=self.log_path,
            run=self.run_id,
        )
