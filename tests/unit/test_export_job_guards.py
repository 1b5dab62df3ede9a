"""An exported job refuses what it cannot finish before it trains, and an export refuses
what its job cannot train (each with the setting named), so nothing trained is lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workbench.config import TrainConfig
from workbench.export import export_job

REPO = Path(__file__).resolve().parents[2]
TINY_GPT = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def test_the_deepspeed_job_checks_its_save_dir_before_training(tmp_path: Path) -> None:
    out = tmp_path / "job"
    export_job(TrainConfig(micro_batch=2), gpus=1, out_dir=out, model_options=TINY_GPT, steps=1)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for bad, said in ((str(blocker), "must be a folder"), ("/proc/nope", "cannot write there")):
        done = subprocess.run(
            [sys.executable, "train_deepspeed.py", "--save_dir", bad],
            cwd=out, env=_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"--save_dir {bad!r}: {said}" in done.stderr
        assert '"step"' not in done.stdout  # refused before the first step
