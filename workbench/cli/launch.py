"""`workbench launch`: train one config on N local ranks and show each rank's measured
model-state memory next to the estimator's prediction (`workbench.train.launch` runs it)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from workbench.cli.config_flags import add_config_flags, config_from_args, parse_number
from workbench.config import TrainConfig
from workbench.train.launch import (
    EXIT_PREEMPTED,
    LAUNCHERS,
    LaunchResult,
    launch_ranks,
    print_commands,
    validate_launch,
    worker_args,
)
from workbench.train.records import StepRecord

# The TrainConfig fields `workbench launch` takes as flags (see workbench.cli_config);
# flags left out keep the config's (or default) value.
_CLI_FIELDS = (
    "precision",
    "optimizer",
    "micro_batch",
    "grad_accum",
    "lr",
    "zero_stage",
    "fsdp",
    "offload_optimizer",
    "offload_params",
    "nvme_path",
    "seed",
    "device",
)


def add_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Arguments of `workbench launch`; returns its runner."""
    parser.description = (
        "Train one config on N local ranks (torchrun or DeepSpeed's launcher) and show "
        "each rank's measured model-state memory next to the estimator's prediction."
    )
    run = parser.add_argument_group("run")
    run.add_argument("--ranks", default="2", metavar="N", help="local ranks (2)")
    run.add_argument("--steps", default="3", metavar="N", help="train to this step (3)")
    run.add_argument(
        "--model",
        default="tiny-gpt",
        help="tiny-gpt, mlp, cnn or a factory 'pkg.module:function' (tiny-gpt)",
    )
    run.add_argument(
        "--model-options",
        default=None,
        metavar="JSON",
        help="options of the built-in model, e.g. '{\"layers\": 2}'",
    )
    run.add_argument("--launcher", default="torchrun", help="torchrun or deepspeed (torchrun)")
    run.add_argument("--checkpoint-dir", default=None, help="where a SIGTERM checkpoint goes")
    run.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue from the checkpoints in DIR (rank-<r>/step-N.pt)",
    )
    run.add_argument("--timeout", default=None, metavar="SECONDS")
    run.add_argument("--threads", default=None, metavar="N", help="torch threads per rank")
    cfg = parser.add_argument_group("training settings (TrainConfig)")
    cfg.add_argument(
        "--config",
        default=None,
        metavar="DS_CONFIG.json",
        help="a DeepSpeed JSON config (imported; other flags override it)",
    )
    add_config_flags(cfg, fields=_CLI_FIELDS)
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--print-command",
        action="store_true",
        help="print the launch commands (one node, several nodes) and exit",
    )
    return lambda args: run_launch(args, parser)


def _cli_config(
    args: argparse.Namespace, ranks: int | None
) -> tuple[TrainConfig | None, list[str]]:
    base = TrainConfig()
    if args.config is not None:
        from workbench.dsconfig import import_deepspeed

        try:
            imported = import_deepspeed(args.config, world_size=ranks)
        except (ValueError, OSError) as exc:
            return None, [f"--config {args.config}: " + " ".join(str(exc).split())]
        base = imported.config
        for w in imported.warnings:
            print(f"workbench launch: warning: {w}", file=sys.stderr)
    return config_from_args(
        args, fields=_CLI_FIELDS, base=base, check_numbers=True, style="parenthesized"
    )


def run_launch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench launch` on parsed arguments; returns the exit status."""
    problems: list[str] = []
    ranks = parse_number(args.ranks, "int", "--ranks", problems)
    steps = parse_number(args.steps, "int", "--steps", problems)
    timeout = (
        None if args.timeout is None else parse_number(args.timeout, "float", "--timeout", problems)
    )
    threads = (
        None if args.threads is None else parse_number(args.threads, "int", "--threads", problems)
    )
    if args.launcher not in LAUNCHERS:
        problems.append(f"--launcher {args.launcher}: must be one of {', '.join(LAUNCHERS)}")
    options = None
    if args.model_options is not None:
        try:
            options = json.loads(args.model_options)
            if not isinstance(options, dict):
                raise ValueError
        except ValueError:
            problems.append(f"--model-options {args.model_options}: must be a JSON object")
    if problems:
        parser.error("; ".join(problems))
    config, cfg_problems = _cli_config(args, ranks)
    if cfg_problems or config is None:
        parser.error("; ".join(cfg_problems))
    assert config is not None
    flag_of = {
        "ranks": "--ranks",
        "steps": "--steps",
        "model": "--model",
        "launcher": "--launcher",
        "timeout": "--timeout",
        "resume": "--resume",
        "threads": "--threads",
        "model_options": "--model-options",
    }
    if args.print_command:
        try:
            validate_launch(config, ranks, args.model, steps, args.launcher, timeout, None, options)
        except ValueError as exc:
            parser.error(_flagged(str(exc), flag_of))
        worker = worker_args(
            "CONFIG.json",
            args.model,
            options or {},
            steps,
            "RUN_DIR/events",
            args.checkpoint_dir,
            args.resume,
            None if args.resume is None else 0,
            threads,
        )
        if args.resume is not None:
            i = worker.index("--resume-step")
            del worker[i : i + 2]
        print(print_commands(args.launcher, ranks, worker))
        print("# CONFIG.json: " + json.dumps(config.to_dict()))
        return 0

    def progress(record: StepRecord) -> None:
        if not args.json:
            print(
                f"rank {record.rank} step {record.step} loss {record.loss:.4f} "
                f"({record.step_seconds * 1000:.0f} ms)",
                file=sys.stderr,
                flush=True,
            )

    try:
        result = launch_ranks(
            config,
            ranks=ranks,
            model=args.model,
            steps=steps,
            launcher=args.launcher,
            resume=args.resume,
            checkpoint_dir=args.checkpoint_dir,
            on_record=progress,
            timeout=timeout,
            model_options=options,
            threads=threads,
        )
    except ValueError as exc:
        parser.error(_flagged(str(exc), flag_of))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(_table(result))
    if result.first_error is not None:
        err = result.first_error
        print(f"workbench launch: {err}", file=sys.stderr)
        if err.traceback_tail:
            print(err.traceback_tail.rstrip(), file=sys.stderr)
        return 1
    if result.preempted:
        print(
            f"workbench launch: stopped by SIGTERM at step {result.checkpoint_step}; "
            f"continue with --resume {result.checkpoint_dir}",
            file=sys.stderr,
        )
        return EXIT_PREEMPTED
    return 0


def _flagged(message: str, flag_of: dict[str, str]) -> str:
    text = " ".join(message.split())
    for name, flag in flag_of.items():
        if text.startswith(f"{name}="):
            return f"{flag} ({text})"
    return text


def _table(result: LaunchResult) -> str:
    def kib(v: int | None) -> str:
        return "-" if v is None else f"{v / 1024:,.1f}"

    head = [
        "rank",
        "steps",
        "last loss",
        "params KiB",
        "pred",
        "grads KiB",
        "pred",
        "optimizer KiB",
        "pred",
    ]
    rows = []
    for r in result.ranks:
        p = r.predicted or {}
        s = r.summary()
        rows.append(
            [
                str(r.rank),
                str(s.get("last_step", 0)),
                "-" if "last_loss" not in s else f"{s['last_loss']:.4f}",
                kib(r.params_bytes),
                kib(p.get("params_bytes")),
                kib(r.grads_bytes),
                kib(p.get("grads_bytes")),
                kib(r.optimizer_bytes),
                kib(p.get("optimizer_bytes")),
            ]
        )
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    lines = [
        f"{result.world_size} ranks ({result.launcher}), {result.n_params or '?'} parameters; "
        "measured from each rank's tensors vs predicted (accounting='deepspeed')"
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *rows]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workbench.cli.launch ...`: the same as `workbench launch ...`."""
    from workbench.cli import Parser

    parser = Parser(prog="workbench launch")
    runner = add_parser(parser)
    return runner(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
