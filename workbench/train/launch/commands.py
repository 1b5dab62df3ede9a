"""The commands and environment that start a launch's ranks: torchrun's or DeepSpeed's
per-node launcher running `python -m workbench.train.launch.rank_worker` with its arguments, the
multi-node variants printed for the user, and the environment the ranks inherit.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import socket
import sys
from collections.abc import Sequence
from typing import Any

from workbench.train.launch.toolchain import child_path

LAUNCHERS = ("torchrun", "deepspeed")
WORKER_MODULE = "workbench.train.launch.rank_worker"
_DIST_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "CROSS_RANK",
    "CROSS_SIZE",
    "LOCAL_SIZE",
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launcher_command(
    launcher: str,
    ranks: int,
    worker_args: Sequence[str],
    *,
    port: int | None = None,
    visible: str | None = None,
    log_dir: str | None = None,
) -> list[str]:
    """The local (single-node) command that starts `ranks` workers. `log_dir`: where
    torchrun's agent keeps its per-run folders (a folder of the launch, removed with it;
    without it the agent makes a `torchelastic_*` folder in the temporary directory and
    leaves it there). `visible`: the ranks'
    `CUDA_VISIBLE_DEVICES` ("" hides every GPU: CPU ranks). DeepSpeed's launcher writes the
    device ids of its `--world_info` into each rank's `CUDA_VISIBLE_DEVICES`, so they are
    the visible ones (a parent restricted to GPUs 2,3 trains on 2,3, not 0,1), and "-1" for
    CPU ranks, which then see no GPU."""
    if launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
            *(["--log-dir", log_dir] if log_dir else []),
            "-m",
            WORKER_MODULE,
            *worker_args,
        ]
    world = base64.urlsafe_b64encode(
        json.dumps({"localhost": deepspeed_device_ids(ranks, visible)}).encode()
    ).decode()
    return [
        sys.executable,
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={world}",
        "--node_rank=0",
        "--master_addr=127.0.0.1",
        f"--master_port={port or _free_port()}",
        "--module",
        WORKER_MODULE,
        *worker_args,
    ]


def deepspeed_device_ids(ranks: int, visible: str | None) -> list[int | str]:
    """The device id DeepSpeed's launcher gives each local rank: the first `ranks` of
    `visible` (a CUDA_VISIBLE_DEVICES value: indices or GPU UUIDs), 0..ranks-1 when it is
    not set, and -1 for each rank when it is "" (no GPU: CPU ranks)."""
    if visible is None:
        return list(range(ranks))
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not ids:
        return [-1] * ranks
    return [int(v) if v.lstrip("-").isdigit() else v for v in ids[:ranks]]


def print_commands(launcher: str, ranks: int, worker_args: Sequence[str]) -> str:
    """Single-node command and the multi-node variants (hostfile / rendezvous), which
    the real launchers run on every node; nothing is started."""
    args = " ".join(shlex.quote(a) for a in worker_args)
    lines = ["# this machine"]
    if launcher == "torchrun":
        lines.append(f"torchrun --standalone --nproc-per-node {ranks} -m {WORKER_MODULE} {args}")
        lines += [
            "# several nodes: run on every node (NODE_RANK 0..NNODES-1, HOST = node 0)",
            f"torchrun --nnodes NNODES --node-rank NODE_RANK --nproc-per-node {ranks} "
            f"--rdzv-backend c10d --rdzv-endpoint HOST:29500 -m {WORKER_MODULE} {args}",
        ]
    else:
        lines.append(f"deepspeed --num_gpus {ranks} --module {WORKER_MODULE} {args}")
        lines += [
            "# several nodes: a hostfile with one line per node, e.g.",
            f"#   node1 slots={ranks}",
            f"#   node2 slots={ranks}",
            f"deepspeed --hostfile hostfile --num_gpus {ranks} --module {WORKER_MODULE} {args}",
        ]
    lines.append("# paths (--config, --events-dir, --checkpoint-dir) must exist on every node")
    return "\n".join(lines)


def worker_args(
    config_path: str,
    model: str,
    options: dict[str, Any],
    steps: int,
    events_dir: str,
    checkpoint_dir: str | None,
    resume: str | None,
    resume_at: int | None,
    threads: int | None,
) -> list[str]:
    args = [
        "--config",
        config_path,
        "--model",
        model,
        "--steps",
        str(steps),
        "--events-dir",
        events_dir,
    ]
    if options:
        args += ["--model-options", json.dumps(options)]
    if checkpoint_dir:
        args += ["--checkpoint-dir", checkpoint_dir]
    if resume is not None:
        args += ["--resume-dir", resume, "--resume-step", str(resume_at)]
    if threads:
        args += ["--threads", str(threads)]
    return args


def child_env(cuda: bool, ranks: int) -> dict[str, str]:
    """The environment the launcher and its ranks start with: this process's, without the
    distributed variables of a launch it runs in; CPU ranks see no GPU."""
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}
    env["PYTHONUNBUFFERED"] = "1"
    # The ranks' tools (torchrun, DeepSpeed's launcher, the ninja that JIT-builds DeepSpeed's
    # ops) come from this interpreter's environment: a second ninja on PATH (a notebook kernel
    # started without the venv's bin) would invalidate the cached op builds, a minute each.
    env["PATH"] = child_path(env.get("PATH", ""))
    cwd = os.getcwd()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH", "")) if p)
    if not cuda:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
        # CPU ranks on a GPU machine: hide the GPUs, so neither torch nor DeepSpeed's
        # accelerator (which picks NCCL and cuda:LOCAL_RANK whenever a GPU exists) uses one
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["DS_ACCELERATOR"] = "cpu"
    elif env.get("DS_ACCELERATOR") == "cpu":
        del env["DS_ACCELERATOR"]  # inherited from a CPU session's process: GPU ranks need CUDA
    return env
