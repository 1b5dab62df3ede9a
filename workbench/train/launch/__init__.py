"""Run one TrainConfig on N local ranks and read their step records live.

    from workbench.train.launch import launch_ranks
    result = launch_ranks(TrainConfig(zero_stage=2), ranks=2, model="mlp", steps=20,
                          on_record=print)
    result.ranks[1].optimizer_bytes, result.ranks[1].predicted["optimizer_bytes"]

Each rank is `python -m workbench.train.launch.rank_worker` (a workbench `Session`), started by
`torchrun` (`python -m torch.distributed.run --standalone`) or by DeepSpeed's per-node
launcher (`python -m deepspeed.launcher.launch`); gloo on CPU, NCCL on GPUs (DeepSpeed
picks). Ranks append JSON lines to `<run dir>/rank-<r>.jsonl`, which this process tails
(see `workbench.train.launch.rank_worker` for the line types).

Failures: the first error line from any rank (rank, message, traceback tail), a launcher
that exits with an error, a callback that raises or `timeout` seconds passing ends the
whole tree at once: SIGTERM to every descendant process, SIGKILL after a short grace,
then a wait, so no rank is left behind (ranks blocked in a collective with a dead peer do
not answer SIGTERM). The launcher runs in its own session with a parent-death signal
(Linux): when this process dies without ending it (SIGKILL, a closed terminal), the launcher
gets SIGTERM and its ranks end with it. torchrun's agent keeps its folders in the launch's
run folder, removed at the end, not in a `torchelastic_*` folder of the temporary directory.

Pre-emption: a SIGTERM to the ranks (from the launcher, which passes its own SIGTERM on,
from the cluster, or from this process when it receives SIGTERM on the main thread)
makes every rank finish its current step, agree on stopping, write its checkpoint to
`<checkpoint_dir>/rank-<r>/step-N.pt` and exit 0. `launch_ranks(..., resume=that dir)`
continues from the newest step every rank has.

`steps` is the step to train to: a resumed run continues from its checkpoint's step up
to `steps`, so re-running the same command after a pre-emption finishes the job.

The parts, one concept each: `launch_checks.py` (the arguments' problems, the checkpoints
a launch resumes), `launch_commands.py` (the launchers' commands and the ranks'
environment), `launch_procs.py` (the running ranks, their events, ending them),
`launch_result.py` (what a launch returns); the rank side is `rank_worker.py`. Every name
they export is importable from here too.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config import FsdpMode, TrainConfig
from workbench.inputs import shown
from workbench.problems import SettingProblem
from workbench.train.launch.checks import (
    MAX_RANKS,
    MAX_STEPS,
    MAX_THREADS,
    MAX_TIMEOUT,
    LaunchError,
    check_ranks,
    checkpoint_dir_problems,
    integer_problem,
    json_number,
    launch_problems,
    options_problem,
    ranks_problem,
    resume_model_problem,
    resume_payload_problem,
    resume_step,
    seconds_problem,
    uses_cuda,
    validate_launch,
)
from workbench.train.launch.commands import (
    LAUNCHERS,
    WORKER_MODULE,
    child_env,
    deepspeed_device_ids,
    launcher_command,
    print_commands,
    worker_args,
)
from workbench.train.launch.procs import (
    ERROR_GRACE_SECONDS,
    KILL_GRACE_SECONDS,
    LAUNCHER_LOGS,
    LOG_TAIL_CHARS,
    POLL_SECONDS,
    EventsTail,
    LaunchState,
    SigtermForward,
    alive,
    clean_run_dir,
    die_with_parent,
    read_log_tail,
    terminate_tree,
)
from workbench.train.launch.result import EXIT_PREEMPTED, LaunchResult, RankError, RankReport
from workbench.train.records import StepRecord

__all__ = [
    "ERROR_GRACE_SECONDS",
    "EXIT_PREEMPTED",
    "KILL_GRACE_SECONDS",
    "LAUNCHERS",
    "LOG_TAIL_CHARS",
    "MAX_RANKS",
    "MAX_STEPS",
    "MAX_THREADS",
    "MAX_TIMEOUT",
    "POLL_SECONDS",
    "WORKER_MODULE",
    "LaunchError",
    "LaunchResult",
    "RankError",
    "RankReport",
    "check_ranks",
    "deepspeed_device_ids",
    "integer_problem",
    "launch_problems",
    "launch_like",
    "launch_ranks",
    "launcher_command",
    "options_problem",
    "print_commands",
    "ranks_problem",
    "resume_model_problem",
    "resume_step",
    "seconds_problem",
    "terminate_tree",
    "validate_launch",
    "worker_args",
]


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
    threads per rank. Bad arguments raise `LaunchError` (a ValueError whose `.problems`
    name each argument, its value and what is allowed) before anything starts.
    """
    validate_launch(
        config, ranks, model, steps, launcher, timeout, on_record, model_options, threads
    )
    ranks, steps = int(ranks), int(steps)
    timeout = None if timeout is None else float(timeout)
    threads = None if threads is None else int(threads)
    model_options = json.loads(json.dumps(model_options or {}, default=json_number))
    paths = []
    if resume is not None and not isinstance(resume, (str, os.PathLike)):
        paths.append(
            SettingProblem("resume", resume, "must be a directory of rank-<r> checkpoints")
        )
    if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
        paths.append(
            SettingProblem("checkpoint_dir", checkpoint_dir, "must be a directory or None")
        )
    if paths:
        raise LaunchError(paths)
    resume_str = None if resume is None else str(resume)
    resume_at = None
    if resume_str is not None:
        resume_at = resume_step(resume_str, ranks)
        problems = []
        if resume_at >= steps:
            problems.append(
                SettingProblem(
                    "steps",
                    steps,
                    f"the checkpoint in {shown(resume_str)} is already at step {resume_at}; "
                    "ask for more steps",
                )
            )
        mismatch = resume_model_problem(resume_str, ranks, resume_at, model, model_options)
        if mismatch:
            problems.append(mismatch)
        elif not problems:  # what each rank's Session checks when it loads its file
            damaged = resume_payload_problem(resume_str, ranks, resume_at)
            if damaged:
                problems.append(damaged)
        if problems:
            raise LaunchError(problems)
    cuda = uses_cuda(config)
    chosen_dir = (
        str(checkpoint_dir) if checkpoint_dir is not None else config.checkpoint_dir or resume_str
    )
    if chosen_dir is not None:  # checked as each rank's Session checks it, before any starts
        folder_problems = checkpoint_dir_problems(chosen_dir, ranks, resume_str, resume_at)
        if folder_problems:
            raise LaunchError(folder_problems)
    run_dir = Path(tempfile.mkdtemp(prefix="workbench-launch-"))
    ckpt_dir = chosen_dir or str(run_dir / "checkpoints")
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
    env = child_env(cuda, ranks)
    command = launcher_command(
        launcher,
        ranks,
        rank_args,
        visible=env.get("CUDA_VISIBLE_DEVICES"),
        log_dir=str(run_dir / LAUNCHER_LOGS),
    )
    log_path = run_dir / "launcher.log"

    state = LaunchState(ranks, on_record)
    sigterm = SigtermForward(state)
    import subprocess

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            # the launcher (and so its ranks) ends when this process dies, however it dies
            preexec_fn=die_with_parent(),
        )
    timed_out = False
    error_deadline: float | None = None
    aborted: BaseException | None = None
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    tails = [EventsTail(events_dir / f"rank-{r}.jsonl") for r in range(ranks)]
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
            leftovers = [pid for pid in state.pids() if alive(pid)]
            if leftovers:
                terminate_tree(proc, leftovers)
    if aborted is not None:
        clean_run_dir(run_dir, keep=False)
        raise aborted

    tail_text = read_log_tail(log_path)
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
    clean_run_dir(run_dir, keep=keep)
    return result


def launch_like(
    config: TrainConfig,
    model_name: str | None,
    model_options: dict[str, Any],
    ranks: int,
    steps: int,
    **kwargs: Any,
) -> LaunchResult:
    """`launch_ranks` for a Session's settings and model (`Session.launch`); ValueError
    when the session trains your own module (the ranks build the model by its name)."""
    if model_name is None:
        raise ValueError(
            "model: multi-rank launch needs a built-in model name (tiny-gpt, mlp, cnn) or an "
            "importable factory 'pkg.module:function'; this session trains your own module"
        )
    kwargs.setdefault("model_options", dict(model_options) or None)
    return launch_ranks(config, ranks=ranks, model=model_name, steps=steps, **kwargs)


def _predictions(config: TrainConfig, n_params: int | None, ranks: int) -> tuple[Any, Any]:
    """Per-rank model states predicted with the engine's layout (DeepSpeed's, or FSDP2's
    under `fsdp`) and with the ZeRO paper's."""
    if not n_params or int(config.tp) > 1 or int(config.pp) > 1:  # each rank's own then
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
    state: LaunchState,
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
                predicted=final.get("predicted_rank") or predicted,
                predicted_paper=paper,
                pid=(state.hello.get(r) or {}).get("pid"),
                layout=final.get("layout"),
                activation_bytes=final.get("activation_bytes"),
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
