"""One rank of a multi-rank launch: a workbench `Session` that reports as JSON lines.

Started by `torchrun` or DeepSpeed's launcher (see `workbench.train.launch`), never by
hand; every rank runs the same command:

    python -m workbench.train.launch.rank_worker --config CONFIG.json --model tiny-gpt \
        --steps 20 --events-dir RUN_DIR [--checkpoint-dir DIR] [--resume-dir DIR \
        --resume-step N]

The launcher sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; the
Session reads them, shards the data by rank and trains through `DeepSpeedBackend`.

Reporting: rank r appends one JSON object per line to `RUN_DIR/rank-<r>.jsonl`, flushed
after each line, which the parent reads live:

    {"type": "hello", "rank", "pid", "world_size", "local_rank"}      first thing
    {"type": "ready", "rank", "n_params", "device", "start_step"}     Session built
    {"type": "record", "rank", "record": StepRecord.to_dict()}        each optimizer step
    {"type": "checkpoint", "rank", "step", "path"}                    a checkpoint written
    {"type": "final", "rank", "step", "params_bytes", "grads_bytes",
     "optimizer_bytes", "preempted": bool}                            clean end
        (under `tp` or `pp` > 1 also "layout", "activation_bytes", "predicted_rank": this
        rank's place, its measured activations and the estimator's figures for it)
    {"type": "error", "rank", "message", "traceback", "wall_time"}    then exit status 1

Stopping (SIGTERM: a spot notice, a pre-emption, or the launcher passing one on): the
handler only sets a flag. After every optimizer step the ranks agree on the flag with
one all-reduce (MAX), so all of them stop after the same step even when the signal
reached them at slightly different times; then each rank writes its checkpoint (the
Session's full backend-neutral state, gathered on every rank under ZeRO-3, plus that
rank's RNG and data position) to `CHECKPOINT_DIR/rank-<r>/step-N.pt` and exits 0. A
SIGTERM before training started exits at once (nothing to save).

The model is the one `--model` names (the launching user's choice); a checkpoint resumed
from gives weights and state only, and whatever model it names is not imported. The
config and options are read as strict, bounded JSON (`workbench.inputs`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from workbench.inputs import parse_json, read_json, shown
from workbench.models.spec import build_from_spec
from workbench.modelstats import count_parameters
from workbench.train.measure.memory import step_counter_bytes

EXIT_ERROR = 1
TRACEBACK_TAIL_CHARS = 4000
#: The largest TrainConfig file read (one is well under a kilobyte).
MAX_CONFIG_BYTES = 1 << 20


class _Reporter:
    """JSON lines to this rank's events file (one write + flush per line)."""

    def __init__(self, events_dir: str, rank: int) -> None:
        path = Path(events_dir) / f"rank-{rank}.jsonl"
        self.rank = rank
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process

    def emit(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"type": kind, "rank": self.rank, **fields}, default=str)
        self._f.write(line + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class _StopFlag:
    """Set by SIGTERM; before the training loop starts a SIGTERM exits at once."""

    def __init__(self) -> None:
        self.requested = False
        self.in_loop = False

    def handler(self, signum: int, frame: Any) -> None:
        self.requested = True
        if not self.in_loop:
            raise SystemExit(128 + signum)


def _agree_to_stop(flag: bool, device: Any) -> bool:
    """True on every rank when any rank wants to stop (one all-reduce MAX)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # host waits for every rank here
    return bool(t.item() > 0)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.train.launch.rank_worker")
    p.add_argument("--config", required=True, help="TrainConfig JSON file (or JSON text)")
    p.add_argument("--model", default="tiny-gpt")
    p.add_argument("--model-options", default="{}", help="JSON object")
    p.add_argument("--steps", type=int, required=True, help="train until this step")
    p.add_argument("--events-dir", required=True)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--resume-dir", default=None)
    p.add_argument("--resume-step", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _read_config(text: str) -> Any:
    """The TrainConfig of --config: JSON text, or a file of it (read bounded and strict:
    a regular file, no duplicate key, no NaN). Settings only: nothing in it names code."""
    from workbench.config import TrainConfig

    if text.lstrip().startswith("{"):
        raw = parse_json(text, what="--config")
    else:
        raw = read_json(text, what="--config", max_bytes=MAX_CONFIG_BYTES)
    return TrainConfig.from_dict(raw)


def _read_options(text: str) -> dict[str, Any]:
    """--model-options: a strict JSON object."""
    options = parse_json(text, what="--model-options")
    if not isinstance(options, dict):
        raise ValueError(f"--model-options {shown(text)}: must be a JSON object")
    return options


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    os.environ["LOCAL_RANK"] = str(local_rank)
    reporter = _Reporter(args.events_dir, rank)
    stop = _StopFlag()
    signal.signal(signal.SIGTERM, stop.handler)
    reporter.emit(
        "hello",
        pid=os.getpid(),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        local_rank=local_rank,
    )
    session = None
    try:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        config = _read_config(args.config)
        if torch.cuda.is_available() and str(config.device) != "cpu":
            torch.cuda.set_device(local_rank)  # "cuda" below then means this rank's GPU
        if args.checkpoint_dir:
            # Each rank its own directory: RNG and data position are per rank.
            config = config.replace(checkpoint_dir=str(Path(args.checkpoint_dir) / f"rank-{rank}"))
        resume = None
        if args.resume_dir is not None:
            from workbench.train import checkpoints as ckpt

            rank_dir = Path(args.resume_dir) / f"rank-{rank}"
            resume = str(
                rank_dir / ckpt.checkpoint_name(args.resume_step)
                if args.resume_step is not None
                else rank_dir
            )
        from workbench.train.session import Session

        source = build_from_spec(args.model, _read_options(args.model_options))
        session = Session(config, resume=resume, **source)
        # the whole model's count (a pipeline rank's module is its stage)
        info = getattr(session, "info", None)
        n_params = info.n_params if info is not None else count_parameters(session.model)
        reporter.emit(
            "ready",
            n_params=int(n_params),
            device=str(session.device),
            start_step=session.step,
            world_size=session.world_size,
        )
        session.on_record(lambda r: reporter.emit("record", record=r.to_dict()))
        stop.in_loop = True
        preempted = False
        while session.step < args.steps:
            session.run(optimizer_steps=1)
            if _agree_to_stop(stop.requested, session.device):
                preempted = session.step < args.steps
                break
        if preempted:
            if config.checkpoint_dir is None:
                raise RuntimeError(
                    "stopped by SIGTERM but no checkpoint_dir was given: nothing was saved"
                )
            path = session.save_checkpoint()
            reporter.emit("checkpoint", step=session.step, path=path)
        states = session.backend.model_state_bytes()
        # optimizer states without the 0-d step counters, as the estimator counts them
        counters = step_counter_bytes(session.backend.optimizer)
        reporter.emit(
            "final",
            step=session.step,
            preempted=preempted,
            params_bytes=states.params_bytes,
            grads_bytes=states.grads_bytes,
            optimizer_bytes=states.optimizer_bytes - counters,
            # a probe step (collective) only after a full run, not on the way out of a stop
            **({} if preempted else _model_parallel_report(session, config, rank)),
        )
        session.close()
        session = None
        return 0
    except BaseException as exc:
        if isinstance(exc, SystemExit) and not stop.in_loop:
            reporter.emit(
                "stopped", message="SIGTERM before training started", wall_time=time.time()
            )
            return int(exc.code) if isinstance(exc.code, int) else EXIT_ERROR
        tb = traceback.format_exc()
        if session is not None:  # the Session keeps the step's own traceback in its events
            errors = [e for e in session.events if e.kind == "error"]
            if errors and errors[-1].details.get("traceback"):
                tb = str(errors[-1].details["traceback"])
        reporter.emit(
            "error",
            message=f"{type(exc).__name__}: {exc}"
            if not errors_message(session)
            else errors_message(session),
            traceback=tb[-TRACEBACK_TAIL_CHARS:],
            wall_time=time.time(),
        )
        return EXIT_ERROR
    finally:
        reporter.close()


def _model_parallel_report(session: Any, config: Any, rank: int) -> dict[str, Any]:
    """Under tensor or pipeline parallelism (`tp` or `pp` > 1): this rank's place in the
    layout (a pipeline's stage, its layers and the last step's bubble too), its
    activations measured by one probe step (`Session.memory()`, collective: every rank
    runs it) and the estimator's figures for this rank's share; empty otherwise."""
    tp, pp = int(config.tp), int(config.pp)
    if tp == 1 and pp == 1:
        return {}
    report = session.memory()
    pred = report.predicted
    predicted = None
    if pred is not None:
        predicted = {
            "params_bytes": pred.params_bytes,
            "grads_bytes": pred.grads_bytes,
            "optimizer_bytes": pred.optimizer_bytes,
            "cpu_offload_bytes": pred.cpu_offload_bytes,
            "activation_bytes": report.predicted_activation_bytes,
            "logits_bytes": pred.activations.logits_bytes if pred.activations else None,
        }
    layout: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "dp": config.data_parallel(session.world_size),
        "tp_rank": rank % tp,
        "stage": (rank // tp) % pp,
        "dp_rank": rank // (tp * pp),
    }
    pipeline = session.backend.pipeline_report()
    if pipeline is not None:  # the last step's bubble, measured and ideal
        layout.update(pipeline)
    return {
        "layout": layout,
        "activation_bytes": report.activation_bytes,
        "predicted_rank": predicted,
    }


def errors_message(session: Any) -> str | None:
    """The message of the Session's last error event, if any."""
    if session is None:
        return None
    errors = [e for e in session.events if e.kind == "error"]
    return str(errors[-1].details.get("error") or errors[-1].message) if errors else None


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown of DeepSpeed/gloo state that can hang after an error.
    os._exit(code)
