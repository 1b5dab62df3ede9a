"""An exported DeepSpeed or FSDP job that a cluster stops loses nothing: it saves every N
steps and on SIGTERM (at the next step, every rank), and a resumed run continues the
uninterrupted run's trajectory (weights, optimizer, schedule, dropout's generator, data
position); a checkpoint that names code is refused before anything of it is built."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.config import TrainConfig
from workbench.export import export_job

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# dropout on: a resumed run must restore the generator its masks draw from
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "dropout": 0.1}
CONFIG = {
    "micro_batch": 2,
    "grad_accum": 2,
    "lr_schedule": "cosine",
    "warmup_steps": 1,
    "total_steps": 20,
    "clip_grad_norm": 1.0,
    "seed": 3,
}
LAUNCH = {
    "deepspeed": [sys.executable, "train_deepspeed.py"],
    "fsdp": [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "train_fsdp.py"],
}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]


def _run(fmt: str, job: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run(
        [*LAUNCH[fmt], *args],
        cwd=job,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=420,
        start_new_session=True,
    )
    return done.returncode, _lines(done.stdout), done.stderr


def _losses(lines: list[dict[str, Any]]) -> dict[int, float]:
    return {ln["step"]: ln["loss"] for ln in lines if "step" in ln and "loss" in ln}


def _export(fmt: str, tmp_path: Path) -> Path:
    config = TrainConfig(**CONFIG, fsdp="full_shard" if fmt == "fsdp" else "off")
    gpus = 2 if fmt == "fsdp" else 1
    out = export_job(config, format=fmt, gpus=gpus, out_dir=tmp_path / fmt, model_options=TINY)
    return Path(out.out_dir)


@pytest.mark.parametrize("fmt", ["deepspeed", "fsdp"])
def test_a_job_saves_resumes_and_stops_on_sigterm_without_losing_a_step(
    fmt: str, tmp_path: Path
) -> None:
    job = _export(fmt, tmp_path)
    ck = tmp_path / "ck"
    # three steps, a checkpoint after the second: its third step is the reference
    code, lines, err = _run(fmt, job, "--steps", "3", "--checkpoint-dir", str(ck),
                            "--checkpoint-every-steps", "2")  # fmt: skip
    assert code == 0, err[-3000:]
    straight = _losses(lines)
    assert sorted(straight) == [1, 2, 3]
    assert [ln["step"] for ln in lines if ln.get("event") == "checkpoint"] == [2]
    assert sorted(os.listdir(ck / "step-2"))[:1] and (ck / "step-2" / "complete.json").exists()
    # the same folder again without --resume: refused, it holds this run's checkpoint
    code, _, err = _run(fmt, job, "--steps", "3", "--checkpoint-dir", str(ck))
    assert code != 0 and "holds another run's checkpoint (step-2)" in err
    assert "--resume auto" in err
    # resumed from step 2, and SIGTERM to the whole run (as Slurm signals every process of
    # a step) once it trained step 3: step 3 has the very loss the uninterrupted run had,
    # every rank saves at the next step boundary and the run ends there, nothing lost
    proc = subprocess.Popen(
        [*LAUNCH[fmt], "--steps", "100000", "--checkpoint-dir", str(ck), "--resume", "auto"],
        cwd=job,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith('{"step"'):
                os.killpg(proc.pid, signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = _lines("".join(seen) + out)
    assert lines[0]["event"] == "start" and lines[0]["resumed_from"].endswith("step-2")
    assert _losses(lines)[3] == straight[3]
    stopped = [ln for ln in lines if ln.get("event") == "stopped"]
    assert len(stopped) == 1, err[-3000:]
    step = stopped[0]["step"]
    assert stopped[0]["signal"] == "SIGTERM" and 3 <= step < 100000
    assert Path(stopped[0]["checkpoint"]) == ck / f"step-{step}"
    assert (ck / f"step-{step}" / "complete.json").exists()
    assert max(_losses(lines)) == step and not any(ln.get("event") == "done" for ln in lines)
    if fmt == "deepspeed":  # one process, no launcher: the run's own status
        assert proc.returncode == 0, err[-3000:]
    # the newest two complete checkpoints kept (--keep-checkpoints 2)
    kept = sorted(int(n.removeprefix("step-")) for n in os.listdir(ck) if n.startswith("step-"))
    assert kept[-1] == step and len(kept) <= 2
    # and it goes on from there
    code, lines, err = _run(
        fmt, job, "--steps", str(step + 1), "--checkpoint-dir", str(ck), "--resume", "auto"
    )
    assert code == 0, err[-3000:]
    assert sorted(_losses(lines)) == [step + 1]
    assert lines[-1] == {"event": "done", "steps": step + 1}


def test_a_checkpoint_that_names_code_is_refused_before_it_is_loaded(tmp_path: Path) -> None:
    job = _export("deepspeed", tmp_path)
    ck = tmp_path / "ck" / "step-2"
    ck.mkdir(parents=True)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    (ck / "mp_rank_00_model_states.pt").write_bytes(pickle.dumps({"module": Payload()}))
    (ck / "complete.json").write_text(
        json.dumps({"step": 2, "world_size": 1, "format": "deepspeed"})
    )
    code, lines, err = _run("deepspeed", job, "--steps", "3", "--resume", str(ck.parent))
    assert code == 2 and not marker.exists()
    assert "mp_rank_00_model_states.pt names posix.system, which is not plain data" in err
    assert not any("step" in ln for ln in lines)
    # another format's checkpoint (or another number of ranks): refused by name
    (ck / "complete.json").write_text(json.dumps({"step": 2, "world_size": 2, "format": "fsdp"}))
    code, _, err = _run("deepspeed", job, "--steps", "3", "--resume", str(ck.parent))
    assert code == 2 and not marker.exists()
    assert "a fsdp checkpoint of 2 rank(s); this is a deepspeed job on 1" in err
