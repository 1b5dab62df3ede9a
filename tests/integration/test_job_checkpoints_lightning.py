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


# one device (Lightning's single-device strategy) is resumed step for step by the epoch test
@pytest.mark.parametrize(("tp", "devices"), [(1, 2), (2, 2)], ids=["ddp-2", "tensor-parallel-2"])
def test_a_resumed_run_trains_the_uninterrupted_runs_steps(
    tp: int, devices: int, tmp_path: Path
) -> None:
    """4 steps saving every 2 (`--checkpoint-every-steps 2`), and a run resumed from its
    step-2 checkpoint to 4: steps 3 and 4 have the same losses, learning rates and gradient
    norms (the weights, the optimizer, the schedule, the data's place in its epoch and the
    dropout generators all restored; measured: equal to the last bit)."""
    settings = {"tp": 2, "lr": 1e-2} if tp > 1 else {}
    job = export(tmp_path / "job", gpus=devices, **settings)
    ranks = ("--devices", str(devices))
    saving = (*ranks, "--checkpoint-dir", "ck", "--checkpoint-every-steps", "2")
    straight, _ = run_script(
        "train_lightning.py", job, steps=4, extra=(*saving, "--keep-checkpoints", "0")
    )
    assert sorted(os.listdir(job / "ck")) == ["step-2", "step-4"]
    assert sorted(os.listdir(job / "ck" / "step-2")) == sorted(
        ["complete.json", "lightning.ckpt", *(f"rank-{r}.pt" for r in range(devices))]
    )
    done = json.loads((job / "ck" / "step-2" / "complete.json").read_text())
    strategy = "tensor-parallel" if tp > 1 else "ddp"
    assert done == {"step": 2, "world_size": devices, "format": "lightning", "strategy": strategy}
    shutil.copytree(job / "ck" / "step-2", job / "from-2" / "step-2")
    resume = (*ranks, "--checkpoint-dir", "resumed", "--resume", "from-2")
    second, _ = run_script("train_lightning.py", job, steps=4, extra=resume)
    assert [ln["step"] for ln in straight] == [1, 2, 3, 4]
    assert [ln["step"] for ln in second] == [3, 4]
    for key in ("loss", "lr", "grad_norm"):
        assert [ln[key] for ln in second] == pytest.approx(
            [ln[key] for ln in straight[2:]], rel=1e-6
        ), key
    assert abs(straight[3]["loss"] - straight[2]["loss"]) > 1e-4  # the steps train


def test_a_resume_continues_the_data_across_an_epochs_end(tmp_path: Path) -> None:
    """Epochs of 10 micro-batches, 3 a step: Lightning steps at the 3rd, 6th, 9th and the
    epoch's 10th. Resumed after step 4 (the epoch's end) and 5 (in the next epoch; mid-epoch
    in the first: the test above), each run trains the uninterrupted run's steps on: the
    loader reads the rest of the checkpoint's epoch, then the next epochs in their order."""
    mlp = {"samples": 40, "in_features": 6, "hidden": 8, "out_features": 2, "depth": 2}
    job = export(tmp_path / "job", model_options=mlp, grad_accum=3, clip_grad_norm=None)
    saving = ("--checkpoint-dir", "ck", "--checkpoint-every-steps", "1", "--keep-checkpoints", "0")
    straight, _ = run_script("train_lightning.py", job, steps=7, extra=saving)
    assert [ln["step"] for ln in straight] == list(range(1, 8))
    for step in (4, 5):
        shutil.copytree(job / "ck" / f"step-{step}", job / f"from-{step}" / f"step-{step}")
        resumed, _ = run_script(
            "train_lightning.py", job, steps=7, extra=("--resume", f"from-{step}")
        )
        assert [ln["step"] for ln in resumed] == list(range(step + 1, 8))
        assert [ln["loss"] for ln in resumed] == pytest.approx(
            [ln["loss"] for ln in straight[step:]], rel=1e-6
        ), step


@pytest.mark.parametrize("devices", [2])
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
    assert {f"rank-{r}.pt" for r in range(devices)} | {"lightning.ckpt"} <= set(os.listdir(folder))
    extra = ("--devices", str(devices), "--checkpoint-dir", "ck", "--resume", "auto")
    resumed, _ = run_script("train_lightning.py", job, steps=step + 2, extra=extra)
    assert [ln["step"] for ln in resumed] == [step + 1, step + 2]
    assert all(math.isfinite(ln["loss"]) for ln in resumed)


class RunsCode:
    """Pickled, a call of os.system: what a crafted checkpoint would run when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def crafted(path: Path, marker: Path) -> None:
    """A torch file whose pickle names os.system (posix.system on Linux), which would make
    `marker` if it ran."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "loops": RunsCode(marker)}, path)


def complete(folder: Path, strategy: str | None, fmt: str = "lightning") -> None:
    """`folder` made a complete checkpoint of step 1 on one rank (its complete.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {"step": 1, "world_size": 1, "format": fmt}
    if strategy is not None:
        done["strategy"] = strategy
    (folder / "complete.json").write_text(json.dumps(done))


SYSTEM = f"{os.system.__module__}.system"


def test_a_checkpoint_naming_code_is_refused_before_anything_of_it_is_loaded(
    tmp_path: Path,
) -> None:
    """`--resume` checks a checkpoint's pickles to name only plain data before Lightning (or
    DeepSpeed's engine, or the FSDP strategy's reader) loads them, before anything is
    built: Lightning's file of a real checkpoint made to name os.system is refused by name
    and nothing runs; so is a DeepSpeed-strategy checkpoint's engine file, before the
    strategy's need for a GPU is said (its engine unpickles without `weights_only`)."""
    marker = tmp_path / "PWNED"
    job = export(tmp_path / "ddp")
    saving = ("--checkpoint-dir", "ck", "--checkpoint-every-steps", "1")
    run_script("train_lightning.py", job, steps=1, extra=saving)
    crafted(job / "ck" / "step-1" / "lightning.ckpt", marker)
    err = refused(job, "--checkpoint-dir", "ck", "--resume", "auto")
    assert f"--resume 'ck/step-1': lightning.ckpt names {SYSTEM}, which is not plain data" in err
    deepspeed = export(tmp_path / "deepspeed", zero_stage=2)
    folder = deepspeed / "ck" / "step-1"
    complete(folder, "deepspeed")
    crafted(folder / "lightning.ckpt" / "checkpoint" / "mp_rank_00_model_states.pt", marker)
    (folder / "lightning.ckpt" / "latest").write_text("checkpoint")
    err = refused(deepspeed, "--resume", "ck")
    assert f"mp_rank_00_model_states.pt names {SYSTEM}, which is not plain data" in err
    assert not marker.exists()


def test_what_a_resume_checks_before_lightning_reads_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check_resume` (before anything is built) and the loader's own state (as training
    starts): a rank's file naming code, a link, another job's checkpoint, a DeepSpeed
    `latest` naming another folder than the checkpoint's, an FSDP checkpoint that is a
    sharded folder (whose reader unpickles without `weights_only`) or names code, a loader
    position past its epoch: each refused naming `--resume` and what is wrong."""
    from workbench.export.train_lightning import EpochLoader, check_resume

    marker = tmp_path / "PWNED"

    def refusal(folder: Path, kind: str) -> str:
        with pytest.raises(SystemExit) as exc:
            check_resume(str(folder), kind, 1)
        assert exc.value.code == 2
        return capsys.readouterr().err

    folder = tmp_path / "ddp" / "step-1"
    complete(folder, "ddp")
    torch.save({"state_dict": {}}, folder / "lightning.ckpt")
    assert check_resume(str(folder), "ddp", 1) == str(folder / "lightning.ckpt")
    crafted(folder / "rank-0.pt", marker)  # read as weights only, checked all the same
    assert f"rank-0.pt names {SYSTEM}, which is not plain data" in refusal(folder, "ddp")
    os.unlink(folder / "rank-0.pt")
    os.symlink(tmp_path / "elsewhere.pt", folder / "rank-0.pt")
    err = refusal(folder, "ddp")
    assert "rank-0.pt is a link, FIFO or device, not a regular file or folder" in err
    other = tmp_path / "other" / "step-1"
    complete(other, None, fmt="deepspeed")  # train_deepspeed.py's
    assert (
        f"--resume {str(other)!r}: a deepspeed job's checkpoint of 1 rank(s); this is a "
        "lightning job (Lightning's ddp strategy) on 1 rank(s)"
    ) in refusal(other, "ddp")
    assert "(Lightning's ddp strategy) of 1 rank(s); this is a lightning job (Lightning's fsdp" in (
        refusal(folder, "fsdp")
    )

    folder = tmp_path / "deepspeed" / "step-1"
    complete(folder, "deepspeed")
    (folder / "lightning.ckpt" / "checkpoint").mkdir(parents=True)
    torch.save({"module": {}}, folder / "lightning.ckpt" / "checkpoint" / "states.pt")
    (folder / "lightning.ckpt" / "latest").write_text("../../elsewhere")
    err = refusal(folder, "deepspeed")
    assert "lightning.ckpt/latest names '../../elsewhere'; Lightning's DeepSpeed" in err
    (folder / "lightning.ckpt" / "latest").write_text("checkpoint")
    assert check_resume(str(folder), "deepspeed", 1) == str(folder / "lightning.ckpt")

    folder = tmp_path / "fsdp" / "step-1"
    complete(folder, "fsdp")
    (folder / "lightning.ckpt").mkdir()  # a sharded (torch.distributed.checkpoint) folder
    (folder / "lightning.ckpt" / ".metadata").write_bytes(b"")
    err = refusal(folder, "fsdp")
    assert "holds no lightning.ckpt file (Lightning's checkpoint)" in err
    shutil.rmtree(folder / "lightning.ckpt")
    crafted(folder / "lightning.ckpt", marker)
    assert f"lightning.ckpt names {SYSTEM}, which is not plain data" in refusal(folder, "fsdp")
    assert not marker.exists()

    loader = EpochLoader(torch.utils.data.DataLoader(list(range(40)), batch_size=4), lambda: (0, 0))
    assert len(loader) == 10
    assert loader.batch_sampler.batch_size == 4  # what the DeepSpeed strategy takes as its micro
    with pytest.raises(SystemExit):
        loader.load_state_dict({"epoch": 0, "batches": 11})
    err = capsys.readouterr().err
    assert (
        "--resume: the checkpoint's loader state (loops.fit_loop.state_dict.combined_loader) "
        "{'epoch': 0, 'batches': 11}: must be an epoch >= 0 and the batches trained in it, 0..10"
    ) in err
