"""Running an exported job's script the way a user does, for the tests that train one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_script(
    script: str, cwd: Path, steps: int, ranks: int = 1, extra: tuple[str, ...] = ()
) -> tuple[list[dict[str, Any]], str]:
    """(the job's step lines, its stderr) after `python SCRIPT --steps N EXTRA...` in `cwd`, one
    process with no distributed environment, or under torchrun on `ranks` processes (as
    the job's launch.sh runs it); a failed run fails the test with its stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    argv = [sys.executable, script, "--steps", str(steps), *extra]
    if ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        argv = [*launcher, f"--nproc-per-node={ranks}", script, "--steps", str(steps), *extra]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith('{"step"')]
    return lines, done.stderr


def shm_segments() -> set[str]:
    """The shared-memory segments of this user's DeepSpeed CPU comm op in /dev/shm (each
    rank of a one-host run under DeepSpeed's launcher makes one of 66 MB)."""
    return {p.name for p in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*")}
