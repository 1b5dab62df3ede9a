"""An exported Lightning job's checkpoints (`train_lightning.py` with `job_checkpoints.py`'s
flags): a run stopped at a checkpoint and resumed trains the uninterrupted run's steps, a
SIGTERM saves at the next optimizer step and ends the run with status 0, and a checkpoint
whose pickles name code is refused before anything of it is loaded. On the CPU: Lightning's
data parallel (one device, two over gloo) and its tensor-parallel strategy; its DeepSpeed
and FSDP strategies need a GPU, but their checkpoints are checked before that is refused."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.job_runs import REPO, run_script
from workbench.config import TrainConfig
from workbench.export import export_job

#: tiny-gpt with dropout: a resumed run's masks are the uninterrupted run's only when each
#: rank's generator is set back to where the checkpoint's step left it
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "dropout": 0.1}


def export(path: Path, gpus: int = 1, model_options: Any = None, **settings: Any) -> Path:
    """A Lightning job with a warm-up, a cosine schedule, clipping and accumulation."""
    base: dict[str, Any] = dict(
        micro_batch=4, grad_accum=2, lr_schedule="cosine", warmup_steps=1, total_steps=10,
        clip_grad_norm=1.0, seed=3,
    )  # fmt: skip
    base.update(settings)
    model = "mlp" if model_options and "samples" in model_options else "tiny-gpt"
    out = export_job(
        TrainConfig(**base),
        format="lightning",
        gpus=gpus,
        out_dir=path,
        model=model,
        model_options=model_options or TINY,
    )
    return Path(out.out_dir)


def env() -> dict[str, str]:
    out = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{out.get('PATH', '')}"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        out.pop(key, None)
    return out


def refused(job: Path, *argv: str) -> str:
    """The stderr of `train_lightning.py ARGV` that must stop with status 2."""
    done = subprocess.run(
        [sys.executable, "train_lightning.py", "--steps", "4", *argv],
        cwd=job, env=env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done.stderr


def losses(lines: list[dict[str, Any]]) -> dict[int, float]:
    return {ln["step"]: ln["loss"] for ln in lines}


@pytest.mark.parametrize(
    ("tp", "devices"), [(1, 1), (1, 2), (2, 2)], ids=["ddp-1", "ddp-2", "tensor-parallel-2"]
)
def test_a_resumed_run_trains_the_uninterrupted_runs_steps(
    tp: int, devices: int, tmp_path: Path
) -> None:
    """4 steps straight, and 2 steps saved by `--checkpoint-every-steps 2` then `--resume
    auto` to 4: steps 3 and 4 have the same losses, learning rates and gradient norms (the
    weights, the optimizer, the schedule, the data's place in its epoch and the dropout
    generators all restored; measured: equal to the last bit)."""
    settings = {"tp": 2, "lr": 1e-2} if tp > 1 else {}
    job = export(tmp_path / "job", gpus=devices, **settings)
    ranks = ("--devices", str(devices))
    straight, _ = run_script("train_lightning.py", job, steps=4, extra=ranks)
    saving = (*ranks, "--checkpoint-dir", "ck", "--checkpoint-every-steps", "2")
    first, _ = run_script("train_lightning.py", job, steps=2, extra=saving)
    assert sorted(os.listdir(job / "ck" / "step-2")) == sorted(
        ["complete.json", "lightning.ckpt", *(f"rank-{r}.pt" for r in range(devices))]
    )
    done = json.loads((job / "ck" / "step-2" / "complete.json").read_text())
    strategy = "tensor-parallel" if tp > 1 else "ddp"
    assert done == {"step": 2, "world_size": devices, "format": "lightning", "strategy": strategy}
    resume = (*ranks, "--checkpoint-dir", "ck", "--resume", "auto")
    second, _ = run_script("train_lightning.py", job, steps=4, extra=resume)
    assert [ln["step"] for ln in first] == [1, 2] and [ln["step"] for ln in second] == [3, 4]
    assert losses(first) == pytest.approx(losses(straight[:2]), rel=1e-6)
    for key in ("loss", "lr", "grad_norm"):
        assert [ln[key] for ln in second] == pytest.approx(
            [ln[key] for ln in straight[2:]], rel=1e-6
        ), key
    assert abs(straight[3]["loss"] - straight[2]["loss"]) > 1e-4  # the steps train


def test_a_resume_continues_the_data_mid_epoch_and_across_its_end(tmp_path: Path) -> None:
    """Epochs of 10 micro-batches, 3 a step: Lightning steps at the 3rd, 6th, 9th and the
    epoch's 10th. Resumed after step 3 (mid-epoch), 4 (the epoch's end) and 5 (in the next
    epoch), each run trains the uninterrupted run's steps on: the loader reads the rest of
    the checkpoint's epoch, then the next epochs in their order."""
    mlp = {"samples": 40, "in_features": 6, "hidden": 8, "out_features": 2, "depth": 2}
    job = export(tmp_path / "job", model_options=mlp, grad_accum=3, clip_grad_norm=None)
    saving = ("--checkpoint-dir", "ck", "--checkpoint-every-steps", "1", "--keep-checkpoints", "0")
    straight, _ = run_script("train_lightning.py", job, steps=7, extra=saving)
    assert [ln["step"] for ln in straight] == list(range(1, 8))
    for step in (3, 4, 5):
        shutil.copytree(job / "ck" / f"step-{step}", job / f"from-{step}" / f"step-{step}")
        resumed, _ = run_script(
            "train_lightning.py", job, steps=7, extra=("--resume", f"from-{step}")
        )
        assert [ln["step"] for ln in resumed] == list(range(step + 1, 8))
        assert [ln["loss"] for ln in resumed] == pytest.approx(
            [ln["loss"] for ln in straight[step:]], rel=1e-6
        ), step


@pytest.mark.parametrize("devices", [1, 2])
def test_sigterm_saves_at_the_next_step_and_the_run_resumes_after_it(
    devices: int, tmp_path: Path
) -> None:
    """SIGTERM to the job's process group once its first step is printed: every rank saves at
    the next optimizer-step boundary (Lightning's own handler, which would end the run
    mid-accumulation without a checkpoint, is not installed), `{"event": "stopped"}` names
    the checkpoint, the run exits 0, and `--resume auto` goes on from the step after it."""
    job = export(tmp_path / "job", gpus=devices, grad_accum=4)
    argv = [sys.executable, "train_lightning.py", "--steps", "1000", "--devices", str(devices)]
    proc = subprocess.Popen(
        [*argv, "--checkpoint-dir", "ck"], cwd=job, env=env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        head = []
        for line in proc.stdout:
            head.append(line)
            if line.startswith('{"step"'):
                os.killpg(proc.pid, signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    lines = [json.loads(ln) for ln in [*head, *out.splitlines()] if ln.startswith("{")]
    stopped = [ln for ln in lines if ln.get("event") == "stopped"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGTERM", lines
    step = stopped[0]["step"]
    assert stopped[0]["checkpoint"] == os.path.join("ck", f"step-{step}")
    assert [ln["step"] for ln in lines if "loss" in ln] == list(range(1, step + 1))
    assert not any(ln.get("event") == "done" for ln in lines)
    folder = job / "ck" / f"step-{step}"
    done = json.loads((folder / "complete.json").read_text())
    assert done["step"] == step and done["world_size"] == devices
    assert {f"rank-{r}.pt" for r in range(devices)} | {"lightning.ckpt"} <= set(
        os.listdir(folder)
    )
    extra = ("--devices", str(devices), "--checkpoint-dir", "ck", "--resume", "auto")
    resumed, _ = run_script("train_lightning.py", job, steps=step + 2, extra=extra)
    assert [ln["step"] for ln in resumed] == [step + 1, step + 2]
    assert all(math.isfinite(ln["loss"]) for ln in resumed)


class RunsCode:
    """Pickled, a call of os.system: what a crafted checkpoint would run when unpickled."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch PWNED",))


def crafted(path: Path) -> None:
    """A torch file whose pickle names os.system (posix.system on Linux)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "loops": RunsCode()}, path)


def complete(folder: Path, strategy: str | None, fmt: str = "lightning") -> None:
    """`folder` made a complete checkpoint of step 1 on one rank (its complete.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {"step": 1, "world_size": 1, "format": fmt}
    if strategy is not None:
        done["strategy"] = strategy
    (folder / "complete.json").write_text(json.dumps(done))


def test_a_checkpoint_naming_code_is_refused_before_anything_of_it_is_loaded(
    tmp_path: Path,
) -> None:
    """A checkpoint's pickles are checked to name only plain data before Lightning (or
    DeepSpeed's engine, or the FSDP strategy's reader) loads them: one naming os.system is
    refused by name and nothing runs (no PWNED file); so is a file that is a link, a
    DeepSpeed `latest` naming another folder, another job's checkpoint. The DeepSpeed and
    FSDP strategies' checkpoints are checked before their need for a GPU is said."""
    system = f"{os.system.__module__}.system"
    job = export(tmp_path / "ddp")
    run_script(
        "train_lightning.py", job, steps=1,
        extra=("--checkpoint-dir", "ck", "--checkpoint-every-steps", "1"),
    )  # fmt: skip
    good = job / "ck" / "step-1" / "lightning.ckpt"
    kept = good.read_bytes()
    crafted(good)
    err = refused(job, "--checkpoint-dir", "ck", "--resume", "auto")
    assert f"--resume 'ck/step-1': lightning.ckpt names {system}, which is not plain data" in err
    good.write_bytes(kept)  # the rank's own file: read as weights only, checked all the same
    crafted(job / "ck" / "step-1" / "rank-0.pt")
    err = refused(job, "--checkpoint-dir", "ck", "--resume", "auto")
    assert f"rank-0.pt names {system}, which is not plain data" in err
    os.unlink(job / "ck" / "step-1" / "rank-0.pt")
    os.symlink(tmp_path / "elsewhere.pt", job / "ck" / "step-1" / "rank-0.pt")
    err = refused(job, "--checkpoint-dir", "ck", "--resume", "auto")
    assert "rank-0.pt is a link, FIFO or device, not a regular file or folder" in err
    other = tmp_path / "other" / "step-1"
    complete(other, None, fmt="deepspeed")  # train_deepspeed.py's
    err = refused(job, "--resume", str(other.parent))
    assert (
        f"--resume {str(other)!r}: a deepspeed job's checkpoint of 1 rank(s); this is a "
        "lightning job (Lightning's ddp strategy) on 1 rank(s)" in err
    )

    deepspeed = export(tmp_path / "deepspeed", zero_stage=2)  # DeepSpeed's engine's files
    folder = deepspeed / "ck" / "step-1"
    complete(folder, "deepspeed")
    crafted(folder / "lightning.ckpt" / "checkpoint" / "mp_rank_00_model_states.pt")
    (folder / "lightning.ckpt" / "latest").write_text("../../elsewhere")
    err = refused(deepspeed, "--resume", "ck")
    assert "lightning.ckpt/latest names '../../elsewhere'; Lightning's DeepSpeed" in err
    (folder / "lightning.ckpt" / "latest").write_text("checkpoint")
    err = refused(deepspeed, "--resume", "ck")
    assert f"mp_rank_00_model_states.pt names {system}, which is not plain data" in err

    fsdp = export(tmp_path / "fsdp", fsdp="full_shard", clip_grad_norm=None)  # its own reader
    folder = fsdp / "ck" / "step-1"
    complete(folder, "fsdp")
    (folder / "lightning.ckpt").mkdir()  # a sharded (torch.distributed.checkpoint) folder
    err = refused(fsdp, "--resume", "ck")
    assert "holds no lightning.ckpt file (Lightning's checkpoint)" in err
    os.rmdir(folder / "lightning.ckpt")
    crafted(folder / "lightning.ckpt")
    err = refused(fsdp, "--resume", "ck")
    assert f"lightning.ckpt names {system}, which is not plain data" in err
    for path in (job, deepspeed, fsdp):
        assert not (path / "PWNED").exists()
    assert zipfile.is_zipfile(folder / "lightning.ckpt")  # a torch file, as Lightning's are
