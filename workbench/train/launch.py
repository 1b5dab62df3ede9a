"""Run one TrainConfig on N local ranks and read their step records live.

    from workbench.train.launch import launch_ranks
    result = launch_ranks(TrainConfig(zero_stage=2), ranks=2, model="mlp", steps=20,
                          on_record=print)
    result.ranks[1].optimizer_bytes, result.ranks[1].predicted["optimizer_bytes"]

Each rank is `python -m workbench.train.rank_worker` (a workbench `Session`), started by
`torchrun` (`python -m torch.distributed.run --standalone`) or by DeepSpeed's per-node
launcher (`python -m deepspeed.launcher.launch`); gloo on CPU, NCCL on GPUs (DeepSpeed
picks). Ranks append JSON lines to `<run dir>/rank-<r>.jsonl`, which this process tails
(see `workbench.train.rank_worker` for the line types).

Failures: the first error line from any rank (rank, message, traceback tail), a launcher
that exits with an error, a callback that raises or `timeout` seconds passing ends the
whole tree at once: SIGTERM to every descendant process, SIGKILL after a short grace,
then a wait, so no rank is left behind (ranks blocked in a collective with a dead peer do
not answer SIGTERM).

Pre-emption: a SIGTERM to the ranks (from the launcher, which passes its own SIGTERM on,
from the cluster, or from this process when it receives SIGTERM on the main thread)
makes every rank finish its current step, agree on stopping, write its checkpoint to
`<checkpoint_dir>/rank-<r>/step-N.pt` and exit 0. `launch_ranks(..., resume=that dir)`
continues from the newest step every rank has.

`steps` is the step to train to: a resumed run continues from its checkpoint's step up
to `steps`, so re-running the same command after a pre-emption finishes the job.

Past 600 lines because starting, tailing, stopping and resuming ranks is one lifecycle; the
rank side is `rank_worker.py`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import numbers
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import Device, FsdpMode, Precision, TrainConfig, runtime_problems
from workbench.inputs import InputFileError, read_json, shown
from workbench.train.records import StepRecord
from workbench.train.toolchain import child_path

LAUNCHERS = ("torchrun", "deepspeed")
WORKER_MODULE = "workbench.train.rank_worker"
POLL_SECONDS = 0.05
KILL_GRACE_SECONDS = 5.0  # SIGTERM lets a rank release a build lock (JIT ops) before SIGKILL
LOG_TAIL_CHARS = 3000
EXIT_PREEMPTED = 143  # 128 + SIGTERM: stopped early, checkpoint written
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


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class RankError:
    """The first failure of a launch. `rank` is None for launcher-level failures
    (timeout, a launcher that died without any rank reporting)."""

    rank: int | None
    message: str
    traceback_tail: str = ""

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "launcher"
        return f"{who}: {self.message}"


@dataclass(frozen=True)
class RankReport:
    """One rank: its step records and the model-state bytes counted from its tensors
    (None when the rank never finished), next to the estimator's figures."""

    rank: int
    records: tuple[StepRecord, ...]
    params_bytes: int | None
    grads_bytes: int | None
    optimizer_bytes: int | None
    predicted: dict[str, int] | None  # accounting="deepspeed"
    predicted_paper: dict[str, int] | None  # accounting="paper"
    pid: int | None = None

    def summary(self) -> dict[str, Any]:
        """A short step summary: first/last step and loss, mean step seconds."""
        recs = self.records
        if not recs:
            return {"steps": 0}
        return {
            "steps": len(recs),
            "first_step": recs[0].step,
            "last_step": recs[-1].step,
            "first_loss": recs[0].loss,
            "last_loss": recs[-1].loss,
            "mean_step_seconds": sum(r.step_seconds for r in recs) / len(recs),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "predicted": self.predicted,
            "predicted_paper": self.predicted_paper,
            "summary": self.summary(),
            "losses": [r.loss for r in self.records],  # from summary's first_step on
        }


@dataclass(frozen=True)
class LaunchResult:
    ranks: tuple[RankReport, ...]
    world_size: int
    launcher: str
    command: tuple[str, ...]
    returncode: int | None
    first_error: RankError | None
    timed_out: bool
    preempted: bool  # the ranks stopped early on SIGTERM (checkpoint written)
    checkpoint_dir: str | None  # where rank-<r>/step-N.pt files were written, if any
    checkpoint_step: int | None
    n_params: int | None
    log_tail: str = ""
    run_dir: str | None = None  # kept only when it holds the checkpoints
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every rank finished cleanly (a pre-empted run is ok too: it saved its state)."""
        return (
            self.first_error is None
            and not self.timed_out
            and all(r.params_bytes is not None for r in self.ranks)
        )

    @property
    def records(self) -> dict[int, list[StepRecord]]:
        return {r.rank: list(r.records) for r in self.ranks}

    def to_dict(self) -> dict[str, Any]:
        err = self.first_error
        return {
            "world_size": self.world_size,
            "launcher": self.launcher,
            "returncode": self.returncode,
            "ok": self.ok,
            "error": None
            if err is None
            else {
                "rank": err.rank,
                "message": err.message,
                "traceback_tail": err.traceback_tail,
            },
            "timed_out": self.timed_out,
            "preempted": self.preempted,
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_step": self.checkpoint_step,
            "n_params": self.n_params,
            "command": list(self.command),
            "ranks": [r.to_dict() for r in self.ranks],
        }


# --------------------------------------------------------------------------- checks
#: Local ranks one launch starts (per node): more processes than one machine runs.
MAX_RANKS = 1024
#: The step a launch trains to: TrainConfig's own horizon limit (longer than any run).
MAX_STEPS = 10**12
#: torch threads per rank: more than any machine has cores.
MAX_THREADS = 1024
#: A launch's timeout in seconds (30 days); leave it None for no limit.
MAX_TIMEOUT = 30 * 24 * 3600.0


def _is_int(v: Any) -> bool:
    """An integer: int or a NumPy integer scalar, never a bool."""
    return isinstance(v, numbers.Integral) and not _is_bool(v)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or (type(v).__name__ in ("bool_", "bool") and hasattr(v, "item"))


def integer_problem(
    name: str, value: Any, minimum: int, maximum: int, why: str, *, meaning: str = ""
) -> str | None:
    """The message for `value` when it is no integer in [minimum, maximum] (a NumPy
    integer counts), else None. `why`: why a larger one is nonsense; `meaning`: what the
    value is, said when it is no integer at all."""
    extra = f" ({meaning})" if meaning else ""
    if not _is_int(value):
        return f"{name}={shown(value)}: must be an integer >= {minimum}{extra}"
    if value < minimum:
        return f"{name}={shown(int(value))}: must be an integer >= {minimum}{extra}"
    if value > maximum:
        return f"{name}={shown(int(value))}: must be at most {maximum:,} ({why})"
    return None


def seconds_problem(name: str, value: Any, maximum: float = MAX_TIMEOUT) -> str | None:
    """The message for a timeout that is not None and not a finite number of seconds in
    (0, maximum], else None."""
    if value is None:
        return None
    ok = isinstance(value, numbers.Real) and not _is_bool(value)
    try:
        finite = ok and math.isfinite(value) and value > 0
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        return f"{name}={shown(value)}: must be a finite number of seconds > 0, or None (no limit)"
    if value > maximum:
        return (
            f"{name}={shown(value)}: must be at most {maximum:,.0f} seconds (30 days); "
            "leave it out (None) for no limit"
        )
    return None


def options_problem(name: str, options: Any) -> str | None:
    """The message for model options that are not None and not a mapping of option names
    to JSON values (the ranks get them as JSON: finite numbers, no objects), else None."""
    if options is None:
        return None
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        return f"{name}={shown(options)}: must be a dict of option names (strings) and values"
    try:
        json.dumps(options, allow_nan=False, default=_plain_number)
    except (TypeError, ValueError) as exc:
        return f"{name}={shown(options)}: must hold JSON values only (finite numbers): {exc}"
    return None


def _plain_number(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds, for json.dumps."""
    if _is_int(value):
        return int(value)
    if isinstance(value, numbers.Real) and not _is_bool(value):
        return float(value)
    raise TypeError(f"{shown(value)} is not JSON data")


def _uses_cuda(config: TrainConfig) -> bool:
    device = Device(config.device)
    if device is Device.CPU:
        return False
    import torch

    return device is Device.CUDA or torch.cuda.is_available()


def _check_model(model: Any) -> list[str]:
    from workbench.models.spec import spec_problems

    return spec_problems(model)


def ranks_problem(config: TrainConfig, ranks: Any) -> str | None:
    """The message when `ranks` local processes do not fit this machine (cores or GPUs)."""
    bad = integer_problem("ranks", ranks, 1, MAX_RANKS, "more local ranks than one machine runs")
    if bad:
        return bad
    ranks = int(ranks)
    if _uses_cuda(config):
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if ranks > gpus:
            return (
                f"ranks={ranks}: this machine has {gpus} CUDA GPU(s); use at most {gpus} "
                "ranks (one per GPU), or device='cpu'"
            )
    else:
        cores = os.cpu_count() or 1
        if ranks > cores:
            return (
                f"ranks={ranks}: this machine has {cores} CPU core(s); use at most {cores} "
                "ranks on CPU (multi-node runs: see --print-command)"
            )
    return None


def check_ranks(config: TrainConfig, ranks: Any) -> None:
    """ValueError unless `ranks` local processes fit this machine (cores or GPUs)."""
    bad = ranks_problem(config, ranks)
    if bad:
        raise ValueError(bad)


def resume_step(resume: str | os.PathLike[str], ranks: int) -> int:
    """The newest step for which every rank 0..ranks-1 has a checkpoint under `resume`
    (each a regular file: a FIFO or device there would block a rank)."""
    from workbench.train import checkpoints as ckpt

    where = f"resume={shown(str(resume))}"
    try:
        root = Path(resume)
        if not root.is_dir():
            raise ValueError(f"{where}: not a directory of rank-<r> checkpoints")
        common: set[int] | None = None
        for r in range(ranks):
            files = ckpt.list_checkpoints(root / f"rank-{r}")
            if not files:
                raise ValueError(
                    f"{where}: no checkpoint for rank {r} (rank-{r}/step-N.pt); resume with "
                    "the rank count that saved it"
                )
            steps = {int(p.stem.split("-")[1]) for p in files}
            common = steps if common is None else common & steps
        if not common:
            raise ValueError(f"{where}: the ranks have no checkpoint step in common")
        step = max(common)
        for r in range(ranks):
            path = root / f"rank-{r}" / ckpt.checkpoint_name(step)
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ValueError(f"{where}: rank-{r}/{path.name} is not a regular file")
    except OSError as exc:  # a name too long, no permission
        raise ValueError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    return step


def resume_model_problem(
    resume: str | os.PathLike[str], ranks: int, step: int, model: str
) -> str | None:
    """The message when the checkpoints a launch resumes were not trained as `model`.

    The ranks always build the model the caller names; the model a checkpoint's manifest
    names is only compared with it, never imported (a factory a file names is code the
    user did not choose). A manifest that cannot be read is left to the ranks' own load,
    which verifies it."""
    from workbench.models.spec import is_factory
    from workbench.train import checkpoints as ckpt

    where = f"resume={shown(str(resume))}"
    for r in range(ranks):
        path = Path(resume) / f"rank-{r}" / ckpt.checkpoint_name(step)
        manifest = ckpt.manifest_path(path)
        try:
            data = read_json(manifest, what="manifest", max_bytes=ckpt.MAX_MANIFEST_BYTES)
        except InputFileError:
            continue
        saved = data.get("model") if isinstance(data, dict) else None
        name = saved.get("name") if isinstance(saved, dict) else None
        if name is None or name == model:
            continue
        if isinstance(name, str) and is_factory(name):
            return (
                f"{where}: rank-{r}/{path.name} names the model factory {shown(name)}, and "
                f"this launch trains model={shown(model)}; a checkpoint cannot choose code "
                "to run, so nothing of it was imported; resume with the model that saved it"
            )
        return (
            f"{where}: rank-{r}/{path.name} holds model {shown(name)}, and this launch "
            f"trains model={shown(model)}; resume with the model (and model_options) that "
            "saved it"
        )
    return None


def launch_problems(
    config: Any,
    ranks: Any,
    model: Any,
    steps: Any,
    launcher: Any,
    timeout: Any,
    on_record: Any,
    model_options: Any,
    threads: Any = None,
) -> list[str]:
    """Every problem of a launch's arguments, each naming its argument (empty when it can
    start); this machine's limits (cores, GPUs, what it can run) included."""
    problems: list[str] = []
    if not isinstance(config, TrainConfig):
        problems.append(f"config={shown(config)}: must be a workbench.TrainConfig")
    bad_ranks = integer_problem(
        "ranks", ranks, 1, MAX_RANKS, "more local ranks than one machine runs"
    )
    for bad in (
        bad_ranks,
        integer_problem(
            "steps",
            steps,
            1,
            MAX_STEPS,
            "longer than any training run",
            meaning="the step to train to",
        ),
        seconds_problem("timeout", timeout),
        None
        if threads is None
        else integer_problem(
            "threads", threads, 1, MAX_THREADS, "more threads than any machine has cores"
        ),
        options_problem("model_options", model_options),
    ):
        if bad:
            problems.append(bad)
    if launcher not in LAUNCHERS:
        problems.append(f"launcher={shown(launcher)}: must be one of {', '.join(LAUNCHERS)}")
    if on_record is not None and not callable(on_record):
        problems.append(f"on_record={shown(on_record)}: must be callable(record) or None")
    problems += _check_model(model)
    if not isinstance(config, TrainConfig):
        return problems
    problems += runtime_problems(config)  # what the ranks could not run here, said up front
    prec = Precision(config.precision)
    if prec is Precision.AMP_FP16:
        problems.append(
            "precision='amp-fp16': several ranks train through DeepSpeed; use 'fp16' "
            "(DeepSpeed's loss-scaled fp16, GPUs only) or 'amp-bf16'"
        )
    if prec is Precision.FP16 and not _uses_cuda(config):
        problems.append("precision='fp16': DeepSpeed does not support fp16 on CPU; use 'bf16'")
    if str(config.optimizer) == "adam8bit":
        problems.append("optimizer='adam8bit': is available in the memory estimator only")
    if bad_ranks is None:
        machine = ranks_problem(config, ranks)
        if machine:
            problems.append(machine)
    return problems


def validate_launch(
    config: Any,
    ranks: Any,
    model: Any,
    steps: Any,
    launcher: Any,
    timeout: Any,
    on_record: Any,
    model_options: Any,
    threads: Any = None,
) -> None:
    """ValueError naming every problem of a launch's arguments (`launch_problems`)."""
    problems = launch_problems(
        config, ranks, model, steps, launcher, timeout, on_record, model_options, threads
    )
    if problems:
        raise ValueError(problems[0] if len(problems) == 1 else "; ".join(problems))


# --------------------------------------------------------------------------- commands
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
) -> list[str]:
    """The local (single-node) command that starts `ranks` workers. `visible`: the ranks'
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


def _child_env(cuda: bool, ranks: int) -> dict[str, str]:
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


# --------------------------------------------------------------------------- processes
def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def terminate_tree(
    proc: Any, extra_pids: Sequence[int] = (), grace: float = KILL_GRACE_SECONDS
) -> None:
    """SIGTERM the launcher and every descendant (and `extra_pids`), SIGKILL what is left
    after `grace` seconds, and reap them all."""
    import psutil

    procs: dict[int, Any] = {}
    for p in _descendants(proc.pid):
        procs[p.pid] = p
    for pid in extra_pids:
        if pid not in procs:
            with contextlib.suppress(psutil.Error):
                procs[pid] = psutil.Process(pid)
    with contextlib.suppress(psutil.Error):
        procs[proc.pid] = psutil.Process(proc.pid)
    alive = []
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.terminate()
            alive.append(p)
    _, alive = psutil.wait_procs(alive, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


class _Tail:
    """New complete lines of one rank's events file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


def _log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_CHARS))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- launch
def launch_ranks(
    config: TrainConfig,
    *,
    ranks: int,
    model: str = "tiny-gpt",
    steps: int,
    launcher: str = "torchrun",
    resume: str | os.PathLike[str] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    on_record: Callable[[StepRecord], None] | None = None,
    timeout: float | None = None,
    model_options: dict[str, Any] | None = None,
    threads: int | None = None,
) -> LaunchResult:
    """Train `config` on `ranks` local processes up to step `steps` (see the module
    docstring). Returns when every rank has ended; never leaves a rank running.

    `model`: a built-in name or an importable factory 'pkg.module:function' returning
    `(module, dataset, loss_fn[, info])` (called with `model_options`). `checkpoint_dir`:
    where a SIGTERM checkpoint goes (default: `config.checkpoint_dir`, else `resume`,
    else a new temporary directory kept only if a checkpoint is written). `on_record`:
    called in this thread with each rank's StepRecord as it arrives. `threads`: torch
    threads per rank. Bad arguments raise ValueError before anything starts.
    """
    validate_launch(
        config, ranks, model, steps, launcher, timeout, on_record, model_options, threads
    )
    ranks, steps = int(ranks), int(steps)
    timeout = None if timeout is None else float(timeout)
    threads = None if threads is None else int(threads)
    model_options = json.loads(json.dumps(model_options or {}, default=_plain_number))
    if resume is not None and not isinstance(resume, (str, os.PathLike)):
        raise ValueError(f"resume={shown(resume)}: must be a directory of rank-<r> checkpoints")
    if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
        raise ValueError(f"checkpoint_dir={shown(checkpoint_dir)}: must be a directory or None")
    resume_str = None if resume is None else str(resume)
    resume_at = None
    if resume_str is not None:
        resume_at = resume_step(resume_str, ranks)
        problems = []
        if resume_at >= steps:
            problems.append(
                f"steps={steps}: the checkpoint in {shown(resume_str)} is already at step "
                f"{resume_at}; ask for more steps"
            )
        mismatch = resume_model_problem(resume_str, ranks, resume_at, model)
        if mismatch:
            problems.append(mismatch)
        if problems:
            raise ValueError("; ".join(problems))
    cuda = _uses_cuda(config)
    run_dir = Path(tempfile.mkdtemp(prefix="workbench-launch-"))
    ckpt_dir = (
        str(checkpoint_dir)
        if checkpoint_dir is not None
        else config.checkpoint_dir or resume_str or str(run_dir / "checkpoints")
    )
    worker_config = config.replace(checkpoint_dir=None)
    config_path = run_dir / "config.json"
    config_path.write_text(json.dumps(worker_config.to_dict()), encoding="utf-8")
    events_dir = run_dir / "events"
    events_dir.mkdir()
    rank_args = worker_args(
        str(config_path),
        model,
        dict(model_options or {}),
        steps,
        str(events_dir),
        ckpt_dir,
        resume_str,
        resume_at,
        threads,
    )
    child_env = _child_env(cuda, ranks)
    command = launcher_command(
        launcher, ranks, rank_args, visible=child_env.get("CUDA_VISIBLE_DEVICES")
    )
    log_path = run_dir / "launcher.log"

    state = _LaunchState(ranks, on_record)
    sigterm = _SigtermForward(state)
    import subprocess

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
        )
    timed_out = False
    error_deadline: float | None = None
    aborted: BaseException | None = None
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    tails = [_Tail(events_dir / f"rank-{r}.jsonl") for r in range(ranks)]
    sigterm.install()
    try:
        while True:
            for tail in tails:
                for msg in tail.read():
                    state.handle(msg)
            if sigterm.pending:
                sigterm.forward()
            if state.first_error is not None:
                # A failing rank usually takes its peers down with a communication error a
                # moment later; give the ranks a short grace to report the root cause.
                if error_deadline is None:
                    error_deadline = time.monotonic() + ERROR_GRACE_SECONDS
                if time.monotonic() > error_deadline or state.all_reported():
                    break
            elif proc.poll() is not None:
                for tail in tails:  # the last lines written before exit
                    for msg in tail.read():
                        state.handle(msg)
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(POLL_SECONDS)
    except BaseException as exc:  # a callback raised, or KeyboardInterrupt
        aborted = exc
    finally:
        sigterm.restore()
        if proc.poll() is None:
            terminate_tree(proc, state.pids())
        else:
            # The launcher is gone; make sure no rank outlived it.
            leftovers = [pid for pid in state.pids() if _alive(pid)]
            if leftovers:
                terminate_tree(proc, leftovers)
    if aborted is not None:
        _cleanup(run_dir, keep=False)
        raise aborted

    tail_text = _log_tail(log_path)
    first_error = state.first_error
    if timed_out and first_error is None:
        first_error = RankError(
            None,
            f"timeout={timeout}: the ranks did not finish in time; all were stopped",
            tail_text[-LOG_TAIL_CHARS:],
        )
    finished = all(state.final.get(r) is not None for r in range(ranks))
    launcher_failed = proc.returncode not in (0, None) or not finished
    if first_error is None and launcher_failed and not (state.preempted and finished):
        first_error = RankError(
            None,
            f"the {launcher} launcher exited with status {proc.returncode} before every "
            "rank finished",
            tail_text,
        )
    result = _result(
        config,
        state,
        ranks,
        launcher,
        command,
        proc.returncode,
        first_error,
        timed_out,
        tail_text,
        run_dir,
    )
    keep = result.checkpoint_dir is not None and Path(result.checkpoint_dir).is_relative_to(run_dir)
    _cleanup(run_dir, keep=keep)
    return result


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cleanup(run_dir: Path, *, keep: bool) -> None:
    if keep:
        for name in ("events", "config.json", "launcher.log"):
            target = run_dir / name
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        return
    shutil.rmtree(run_dir, ignore_errors=True)


ERROR_GRACE_SECONDS = 5.0
# Messages of ranks that failed only because another rank went away (gloo, NCCL, c10d).
_PEER_FAILURE = re.compile(
    r"connection closed by peer|remote worker crash|connection reset|broken pipe|"
    r"nccl.*(watchdog|timeout|abort)|process ?group.*(abort|timed out)",
    re.IGNORECASE,
)


class _LaunchState:
    def __init__(self, ranks: int, on_record: Callable[[StepRecord], None] | None) -> None:
        self.ranks = ranks
        self.on_record = on_record
        self.records: dict[int, list[StepRecord]] = {r: [] for r in range(ranks)}
        self.hello: dict[int, dict[str, Any]] = {}
        self.ready: dict[int, dict[str, Any]] = {}
        self.final: dict[int, dict[str, Any]] = {}
        self.checkpoints: dict[int, dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []
        self.first_error: RankError | None = None
        self.preempted = False

    def pids(self) -> list[int]:
        return [int(h["pid"]) for h in self.hello.values() if h.get("pid")]

    def handle(self, msg: dict[str, Any]) -> None:
        kind, rank = msg.get("type"), int(msg.get("rank", -1))
        if kind == "hello":
            self.hello[rank] = msg
        elif kind == "ready":
            self.ready[rank] = msg
        elif kind == "record":
            record = StepRecord.from_dict(msg["record"])
            self.records.setdefault(rank, []).append(record)
            if self.on_record is not None:
                self.on_record(record)
        elif kind == "checkpoint":
            self.checkpoints[rank] = msg
        elif kind == "final":
            self.final[rank] = msg
            if msg.get("preempted"):
                self.preempted = True
        elif kind == "error":
            self.errors.append(msg)
            # The root cause: the earliest error that is not a peer's communication failure
            # ("connection closed by peer" on the ranks a crashed rank leaves behind).
            causes = [m for m in self.errors if not _PEER_FAILURE.search(str(m.get("message")))]
            first = min(causes or self.errors, key=lambda m: float(m.get("wall_time") or 0))
            self.first_error = RankError(
                int(first["rank"]),
                str(first.get("message", "")),
                str(first.get("traceback", "")),
            )

    def all_reported(self) -> bool:
        """Every rank has sent an error or its final message."""
        done = {int(m.get("rank", -1)) for m in self.errors} | set(self.final)
        return all(r in done for r in range(self.ranks))


class _SigtermForward:
    """While a launch runs on the main thread, a SIGTERM to this process is passed on to
    the ranks (they checkpoint and exit) instead of killing this process."""

    def __init__(self, state: _LaunchState) -> None:
        self.state = state
        self.pending = False
        self.sent = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._handler)
        self._installed = True

    def _handler(self, signum: int, frame: Any) -> None:
        self.pending = True

    def forward(self) -> None:
        if self.sent:
            self.pending = False
            return
        pids = self.state.pids()
        if len(pids) < self.state.ranks:
            return  # not every rank has started; stays pending for the next poll
        self.pending = False
        self.sent = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


def _predictions(config: TrainConfig, n_params: int | None, ranks: int) -> tuple[Any, Any]:
    """Per-rank model states predicted with the engine's layout (DeepSpeed's, or FSDP2's
    under `fsdp`) and with the ZeRO paper's."""
    if not n_params:
        return None, None
    from workbench.prediction import predict_memory

    setups = [(config, "deepspeed"), (config, "paper")]
    fsdp = FsdpMode(config.fsdp)
    if fsdp is not FsdpMode.OFF:
        # FSDP2's own layout, and the paper's figure for its ZeRO equivalent at rest
        paper = config.replace(fsdp="off", zero_stage=3 if fsdp.shards else 0)
        setups = [(config, "fsdp"), (paper, "paper")]
    out = []
    for setup, accounting in setups:
        e = predict_memory(setup, n_params, ranks, accounting=accounting)
        out.append(
            {
                "params_bytes": e.params_bytes,
                "grads_bytes": e.grads_bytes,
                "optimizer_bytes": e.optimizer_bytes,
                "cpu_offload_bytes": e.cpu_offload_bytes,
            }
        )
    return out[0], out[1]


def _result(
    config: TrainConfig,
    state: _LaunchState,
    ranks: int,
    launcher: str,
    command: list[str],
    returncode: int | None,
    first_error: RankError | None,
    timed_out: bool,
    log_tail: str,
    run_dir: Path,
) -> LaunchResult:
    n_params = next((int(m["n_params"]) for m in state.ready.values() if m.get("n_params")), None)
    predicted, paper = _predictions(config, n_params, ranks)
    reports = []
    for r in range(ranks):
        final = state.final.get(r) or {}
        reports.append(
            RankReport(
                rank=r,
                records=tuple(state.records.get(r, [])),
                params_bytes=final.get("params_bytes"),
                grads_bytes=final.get("grads_bytes"),
                optimizer_bytes=final.get("optimizer_bytes"),
                predicted=predicted,
                predicted_paper=paper,
                pid=(state.hello.get(r) or {}).get("pid"),
            )
        )
    ckpt_dir = ckpt_step = None
    if state.checkpoints:
        steps = {int(m["step"]) for m in state.checkpoints.values()}
        ckpt_step = min(steps)
        path = Path(next(iter(state.checkpoints.values()))["path"])
        ckpt_dir = str(path.parent.parent)  # <dir>/rank-<r>/step-N.pt
    return LaunchResult(
        ranks=tuple(reports),
        world_size=ranks,
        launcher=launcher,
        command=tuple(command),
        returncode=returncode,
        first_error=first_error,
        timed_out=timed_out,
        preempted=state.preempted,
        checkpoint_dir=ckpt_dir,
        checkpoint_step=ckpt_step,
        n_params=n_params,
        log_tail=log_tail,
        run_dir=str(run_dir) if ckpt_dir and Path(ckpt_dir).is_relative_to(run_dir) else None,
    )
