"""The folders and files one Session's run writes: its run id, the folder it resumed from
(its home, whose checkpoints without a run id are its own), the folders it has claimed,
and its checkpoints written there (`RunFolders.write`: claimed, the log flushed, saved,
the run's older ones pruned), with the autosave's timing.

A folder is claimed before anything is written into it (`resume.folder_check`): another
run's checkpoints or log, or this run's own checkpoints newer than its step, refuse it
with a `CheckpointError` naming it, and nothing is changed. `workbench.train.session`
holds one `RunFolders` per Session; `workbench.train.resume` says where a save goes and
what its manifest says.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, SettingProblem, TrainConfig
from workbench.inputs import shown
from workbench.outputs import target_problem
from workbench.train import checkpoints as ckpt
from workbench.train.resume import folder_check, resumed_run, save_target


class RunFolders:
    """The run of one Session and what it may write (see the module docstring).
    `payload`: the checkpoint the Session resumes (None for a new run)."""

    def __init__(self, payload: dict[str, Any] | None) -> None:
        self.run_id, self.home = resumed_run(payload)
        self.owned: set[str] = set()
        self.last_save_time = time.time()

    def is_home(self, folder: Path) -> bool:
        home = self.home
        return home is not None and os.path.realpath(folder) == os.path.realpath(home)

    def claim_folder(self, folder: Path, step: int, log_folder: Path | None) -> None:
        """Refuse `folder` (CheckpointError, a ValueError naming it) when this run must not
        save into it, or `log_folder` when it must not keep its log.jsonl there: another
        run's checkpoints or log are in it, or its own checkpoints newer than `step`
        (`resume.folder_check`); nothing is changed. Then both are this run's."""
        folder_check(
            folder,
            run=self.run_id,
            step=step,
            home=self.home,
            log_folder=log_folder,
            own_folders=self.owned,
        )
        self.owned |= {os.path.realpath(f) for f in (folder, log_folder) if f}

    def claim_checkpoint_dir(
        self, checkpoint_dir: str, step: int, world_size: int, rank: int
    ) -> None:
        """Claim `config.checkpoint_dir` (this rank's folder in it, and the log there) for
        saves from `step` on, as `claim_folder`; a path that is no folder (a file, a FIFO,
        a device) nor a place one can be made is a ConfigError naming `checkpoint_dir`."""
        reason = target_problem(checkpoint_dir, folder=True)
        if reason is not None:
            raise ConfigError(
                [
                    SettingProblem(
                        "checkpoint_dir",
                        checkpoint_dir,
                        f"{reason}; give a folder (an existing one, or a new one to make) "
                        "for the checkpoints and the run's log",
                    )
                ]
            )
        _, folder = save_target(None, checkpoint_dir, step, world_size, rank)
        self.claim_folder(folder or Path(checkpoint_dir), step, Path(checkpoint_dir))

    def checkpoint_dir_problems(
        self, checkpoint_dir: str, step: int, world_size: int, rank: int
    ) -> list[SettingProblem]:
        """`claim_checkpoint_dir`'s refusal as a `checkpoint_dir` SettingProblem (a new
        folder holding another run's checkpoints or log, or no folder); [] once it is
        claimed."""
        try:
            self.claim_checkpoint_dir(checkpoint_dir, step, world_size, rank)
        except ckpt.CheckpointError as exc:
            return [SettingProblem("checkpoint_dir", checkpoint_dir, exc.reason)]
        except ConfigError as exc:
            return list(exc.problems)
        return []

    def claim_file(self, target: Path, step: int) -> None:
        """Refuse to write `target` over a checkpoint of another run (or any file that is
        not one of this run's checkpoints); a `step-N.pt` name is a checkpoint of the folder
        it is in, so that folder is checked as a save into it would be (another run's
        checkpoints there: its `resume_from(folder)` would pick this file up)."""
        if ckpt.is_checkpoint_name(target.name):
            self.claim_folder(target.parent, step, None)
        if not os.path.lexists(target):
            return
        m = ckpt.manifest_path(target)
        run = ckpt.manifest_run(m) if os.path.lexists(m) else ckpt.UNREADABLE
        if run == self.run_id or (run is None and self.is_home(target.parent)):
            return
        raise ckpt.CheckpointError(
            target,
            "exists and is not a checkpoint of this run (another run's, or a file without "
            "its manifest): nothing was changed; choose another file name",
        )

    def save_due(self, config: TrainConfig, step: int) -> bool:
        """Whether an autosave is due after `step` (`checkpoint_every_steps`, or
        `checkpoint_every_seconds` since the last save), with a run folder."""
        if config.checkpoint_dir is None:
            return False
        every, seconds = config.checkpoint_every_steps, config.checkpoint_every_seconds
        return bool(every and step % every == 0) or bool(
            seconds and time.time() - self.last_save_time >= seconds
        )

    def write(
        self,
        payload: dict[str, Any],
        target: Path,
        directory: Path | None,
        *,
        config: TrainConfig,
        step: int,
        flush_log: Callable[[], None],
        describe: Callable[[], dict[str, Any]],
        given: Any = None,
    ) -> Path:
        """Save `payload` as `target` (`resume.save_target`'s file and folder): the folder
        (or the file) claimed first, the run's log flushed (it holds every step up to the
        checkpoint), the checkpoint written with the manifest fields `describe()` gives,
        then the run's older checkpoints in the folder pruned to `keep_checkpoints`. An
        OSError writing it is said by `given` (the path as the user gave it)."""
        if directory is not None:
            # the log in the run folder is this session's own (update() moves it there)
            ours = config.checkpoint_dir is not None and os.path.realpath(
                directory
            ) == os.path.realpath(config.checkpoint_dir)
            self.claim_folder(directory, step, None if ours else directory)
        else:
            self.claim_file(target, step)
        flush_log()
        try:
            written = ckpt.save(payload, target, describe=describe())
        except OSError as exc:  # a folder it cannot write into, a full disk: said by path
            reason = exc.strerror or " ".join(str(exc).split())
            said = (
                f"path={shown(str(given if given is not None else target))}: cannot write the "
                f"checkpoint {target} ({reason}); the session trains on, nothing was saved"
            )
            raise (OSError(said) if exc.errno is None else type(exc)(exc.errno, said)) from None
        if directory is not None:
            ckpt.prune(
                directory,
                int(config.keep_checkpoints),
                run=self.run_id,
                written=written,
                own_unlabeled=self.is_home(directory),
            )
        self.last_save_time = time.time()
        return written
