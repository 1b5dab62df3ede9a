"""Fault injection: a process SIGKILLed in the middle of writing a checkpoint leaves the
previous checkpoint loadable and no half-written file under a real name; the same for
every rank of a multi-rank save."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.models import build_model
from workbench.train import checkpoints as ckpt
from workbench.train import runlog
from workbench.train.launch import launch_ranks, resume_step

ROOT = Path(__file__).resolve().parents[2]
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16}
KILL_POINTS = ("tensor-write", "between-files", "manifest-write")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_during(point: str, step: int) -> None:
    """From now on, this process SIGKILLs itself while writing the checkpoint of `step`:
    half-way through the tensor file, after the tensor file but before the manifest, or
    half-way through the manifest."""
    real_save, real_replace = torch.save, os.replace
    manifest_name = Path(ckpt.checkpoint_name(step)).with_suffix(".json").name

    def dying_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if point == "tensor-write" and isinstance(obj, dict) and obj.get("step") == step:
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            _die()
        real_save(obj, f, *args, **kwargs)

    def dying_replace(src: Any, dst: Any) -> None:
        name = Path(dst).name
        if point == "between-files" and name == manifest_name:
            _die()
        if point == "manifest-write" and name == manifest_name:
            text = Path(src).read_bytes()
            Path(src).write_bytes(text[: len(text) // 2])  # as if the write stopped there
            _die()
        real_replace(src, dst)

    torch.save = dying_save  # type: ignore[assignment]
    os.replace = dying_replace  # type: ignore[assignment]


def child() -> None:
    """A training script killed while saving step 4: `python -c '...child()' FOLDER POINT`."""
    folder, point = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    cfg = TrainConfig(micro_batch=2, seed=3, checkpoint_dir=folder)
    with Session(cfg, model_options=TINY) as s:
        s.run(2)
        s.save_checkpoint()
        s.run(2)
        _kill_during(point, 4)
        s.save_checkpoint()
    raise SystemExit("not killed")


def _real_files_are_whole(folder: Path) -> None:
    """Every file under a real checkpoint name is complete: manifests parse, tensor files
    load with weights_only."""
    for p in folder.glob("step-*.json"):
        json.loads(p.read_text())
    for p in folder.glob("step-*.pt"):
        torch.load(p, weights_only=True)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_kill_mid_save_leaves_the_previous_checkpoint(tmp_path: Path, point: str) -> None:
    folder = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.integration.test_checkpoint_faults import child; child()",
            str(folder),
            point,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    names = sorted(p.name for p in folder.iterdir())
    assert "step-00000004.json" not in names  # the killed save is not complete
    assert {"step-00000002.pt", "step-00000002.json", "log.jsonl"} <= set(names)
    left = {  # where the kill struck, as the files show it
        "tensor-write": "step-00000004.pt.tmp",
        "between-files": "step-00000004.pt",  # whole, but without its manifest
        "manifest-write": "step-00000004.json.tmp",
    }[point]
    assert left in names and (folder / left).stat().st_size > 0
    _real_files_are_whole(folder)
    assert [p.name for p in ckpt.list_checkpoints(folder)] == ["step-00000002.pt"]

    killed = {r.step: r.loss for r in runlog.read_records(folder / runlog.LOG_NAME)}
    assert sorted(killed) == [1, 2, 3, 4]  # the log had every step before the save began
    with Session.resume_from(folder) as s:
        assert s.step == 2 and [r.step for r in s.history] == [1, 2]
        assert [r.loss for r in s.run(2)] == [killed[3], killed[4]]  # the same trajectory
        s.save_checkpoint()
    assert not list(folder.glob("*.tmp"))  # what the killed save left is cleaned up
    assert [p.name for p in ckpt.list_checkpoints(folder)] == [
        "step-00000002.pt",
        "step-00000004.pt",
    ]


# --------------------------------------------------------------------------- several ranks
MLP = {"in_features": 15, "hidden": 33, "depth": 2, "out_features": 5, "samples": 256}


def dying_mlp(*, kill_ranks: list[int], kill_step: int, **options: Any) -> tuple[Any, ...]:
    """The built-in MLP, in a rank that SIGKILLs itself half-way through writing its
    checkpoint of `kill_step` when its rank is in `kill_ranks`."""
    if int(os.environ.get("RANK", "0")) in kill_ranks:
        _kill_during("tensor-write", kill_step)
    return build_model("mlp", **options)


@pytest.mark.parametrize("kill_ranks", [[0, 1], [1]], ids=["every-rank", "one-rank"])
def test_ranks_killed_mid_save_resume_from_the_last_step_all_saved(
    tmp_path: Path, kill_ranks: list[int]
) -> None:
    folder = tmp_path / "ckpt"
    result = launch_ranks(
        TrainConfig(device="cpu", micro_batch=4, zero_stage=0, checkpoint_every_steps=2),
        ranks=2,
        model="tests.integration.test_checkpoint_faults:dying_mlp",
        model_options={**MLP, "kill_ranks": kill_ranks, "kill_step": 4},
        steps=6,
        checkpoint_dir=folder,
        timeout=420,
    )
    assert not result.ok and not result.timed_out
    for r in (0, 1):
        rank_dir = folder / f"rank-{r}"
        _real_files_are_whole(rank_dir)
        steps = [int(p.stem.split("-")[1]) for p in ckpt.list_checkpoints(rank_dir)]
        assert steps == ([2] if r in kill_ranks else [2, 4]), (r, steps)
        if r in kill_ranks:  # killed half-way through the tensor file
            assert (rank_dir / "step-00000004.pt.tmp").stat().st_size > 0
        assert ckpt.load(rank_dir / ckpt.checkpoint_name(2))["step"] == 2
    assert resume_step(folder, 2) == 2  # the newest step every rank saved whole
