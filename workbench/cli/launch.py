"""`workbench launch`: train one config on N local ranks and show each rank's measured
model-state memory next to the estimator's prediction (`workbench.train.launch` runs it).

Files it reads are data: the DeepSpeed config (`--config`, read bounded and strict through
`workbench.inputs`) holds settings only, and the checkpoints of `--resume` are weights and
state: the ranks build the model this command names (`--model`), never one a file names.
Every problem of a command line (a number out of range, options JSON with a duplicate key,
a FIFO as the config) is named in one message, exit status 2, before anything starts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from workbench.cli import report_json
from workbench.cli.config_flags import (
    CONFIG_FLAGS,
    add_config_flags,
    config_from_args,
    parse_number,
)
from workbench.cli.model_flags import add_model_options_flag, parse_model_options
from workbench.config import FsdpMode, SettingProblem, TrainConfig, problem_lines
from workbench.inputs import InputFileError, read_json, shown, typed
from workbench.outputs import target_problem
from workbench.train.launch import (
    EXIT_PREEMPTED,
    LAUNCHERS,
    MAX_RANKS,
    LaunchError,
    LaunchResult,
    launch_problems,
    launch_ranks,
    print_commands,
    ranks_problem,
    worker_args,
)
from workbench.train.records import StepRecord

#: The exit status after Ctrl-C (SIGINT), as a shell reports a command it interrupted.
EXIT_INTERRUPTED = 130
#: The largest DeepSpeed config read (a real one is a few kB).
MAX_DS_CONFIG_BYTES = 1 << 20
#: Keys of a --config that would choose the model: refused (a file never chooses code).
_NOT_SETTINGS = ("model", "model_options", "model_spec", "factory")
#: The launch API's argument names -> this command's flags.
_FLAG_OF = {
    "ranks": "--ranks",
    "steps": "--steps",
    "model": "--model",
    "launcher": "--launcher",
    "timeout": "--timeout",
    "resume": "--resume",
    "threads": "--threads",
    "model_options": "--model-options",
    "checkpoint_dir": "--checkpoint-dir",
}

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
    "tp",
    "sequence_parallel",
    "pp",
    "pp_schedule",
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
    add_model_options_flag(run)
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
        help="print the launch commands (one node, several nodes) and exit; nothing runs, "
        "so this machine's cores and GPUs do not limit --ranks",
    )
    return lambda args: run_launch(args, parser)


def _cli_config(
    args: argparse.Namespace, ranks: int | None
) -> tuple[TrainConfig | None, list[str]]:
    """The TrainConfig of --config and the settings flags, and every problem of them: a
    number flag that is no number, and what TrainConfig says of the others, at once."""
    base = TrainConfig()
    problems: list[str] = []
    if args.config is not None:
        from workbench.deepspeed import import_deepspeed

        try:
            raw = read_json(args.config, what="--config", max_bytes=MAX_DS_CONFIG_BYTES)
            named = sorted(set(raw) & set(_NOT_SETTINGS)) if isinstance(raw, dict) else []
            if named:
                raise InputFileError(
                    "--config",
                    args.config,
                    f"{', '.join(f'{k}={shown(raw[k])}' for k in named)}: a DeepSpeed config "
                    "holds settings only; the model is this command's own (--model, "
                    "--model-options), never a file's",
                )
            imported = import_deepspeed(raw, world_size=ranks)
            if imported.auto_keys:  # filled with the settings the ranks run (flags included)
                final, _ = config_from_args(
                    args, fields=_CLI_FIELDS, base=imported.config, check_numbers=True
                )
                if final is not None:  # a flag's problem is named below with the others
                    imported = import_deepspeed(raw, world_size=ranks, base=final)
        except InputFileError as exc:
            problems.append(f"--config {typed(args.config)}: {exc.reason}")
        except (ValueError, OSError) as exc:
            problems.append(f"--config {typed(args.config)}: " + " ".join(str(exc).split()))
        else:
            base = imported.config
            for w in imported.warnings:
                print(f"workbench launch: warning: {w}", file=sys.stderr)
    config, cfg_problems = config_from_args(args, fields=_CLI_FIELDS, base=base, check_numbers=True)
    problems += cfg_problems
    return (None if problems else config), problems


def run_launch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench launch` on parsed arguments; returns the exit status. Every problem
    of the command line is named in one message (exit status 2) before anything starts."""
    problems: list[str] = []
    unparsed: set[str] = set()

    def number(name: str, kind: str) -> Any:
        text = getattr(args, name)
        if text is None:
            return None
        value = parse_number(text, kind, _FLAG_OF[name], problems)
        if value is None:
            unparsed.add(name)
        return value

    ranks = number("ranks", "int")
    steps = number("steps", "int")
    timeout = number("timeout", "float")
    threads = number("threads", "int")
    if args.launcher not in LAUNCHERS:
        problems.append(f"--launcher {typed(args.launcher)}: must be one of {', '.join(LAUNCHERS)}")
        unparsed.add("launcher")
    options = parse_model_options(args.model_options, problems)
    if options is None and args.model_options is not None:
        unparsed.add("model_options")
    world = ranks if ranks is not None and 1 <= ranks <= MAX_RANKS else None
    config, cfg_problems = _cli_config(args, world)
    problems += cfg_problems
    if config is None:
        unparsed.add("config")
    api = launch_problems(
        config,
        1 if ranks is None else ranks,
        args.model,
        1 if steps is None else steps,
        args.launcher,
        timeout,
        None,
        options,
        threads,
    )
    # --print-command runs nothing here: the commands are for the machine that will run
    # them (a GPU node prepared from a laptop), so this machine's cores and GPUs do not count
    here = ranks_problem(config, ranks) if config is not None and world is not None else None
    if args.print_command and here is not None:
        api = [p for p in api if p != here]
    problems += [_as_flag(p, args) for p in api if p.field not in unparsed]
    if config is None and world is not None and not args.print_command:
        # the machine's limit, said with the others
        try:
            device_only = TrainConfig(device=args.device or "auto")
        except ValueError:
            device_only = None
        machine = None if device_only is None else ranks_problem(device_only, world)
        if machine:
            problems.append(_as_flag(machine, args))
    if args.checkpoint_dir is not None:
        problems += _folder_problems("--checkpoint-dir", args.checkpoint_dir)
    if problems:
        parser.error("; ".join(problems))
    assert config is not None and ranks is not None and steps is not None
    if args.print_command:
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
    except KeyboardInterrupt:  # Ctrl-C: launch_ranks has ended every rank before this
        print("workbench launch: interrupted; every rank was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except LaunchError as exc:
        parser.error("; ".join(_as_flag(p, args) for p in exc.problems))
    except ValueError as exc:
        parser.error("; ".join(" ".join(line.split()) for line in problem_lines(exc)))
    if args.json:
        print(report_json(result.to_dict()))
    else:
        fsdp = FsdpMode(config.fsdp) is not FsdpMode.OFF
        print(_table(result, accounting="fsdp" if fsdp else "deepspeed"))
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


def _as_flag(problem: SettingProblem, args: argparse.Namespace | None = None) -> str:
    """A problem of the launch API (or of a TrainConfig setting) written with the flag
    of its argument and the value as typed (from `args`), from its data: "--ranks 999: this
    machine has ..."; one this command has no flag for as it is."""
    flag = _FLAG_OF.get(problem.field)
    if flag is None and problem.field in _CLI_FIELDS:
        flag = CONFIG_FLAGS[problem.field].flag
    if flag is None:
        return " ".join(str(problem).split())
    given = getattr(args, problem.field, None) if args is not None else None
    value = typed(given) if isinstance(given, str) else shown(problem.value)
    return f"{flag} {value}: " + " ".join(problem.message.split())


def _folder_problems(flag: str, path: str) -> list[str]:
    """A folder flag's path must be a folder, or a place one can be made."""
    reason = target_problem(path, folder=True)
    return [] if reason is None else [f"{flag} {typed(path)}: {reason}"]


def _table(result: LaunchResult, accounting: str = "deepspeed") -> str:
    """The per-rank table; `accounting`: the layout the predictions were made with (FSDP2's
    under `fsdp`, else DeepSpeed's), named in the header."""

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
    split = any(r.layout for r in result.ranks)
    piped = any((r.layout or {}).get("pp", 1) > 1 for r in result.ranks)
    if split:  # model parallel: each rank's place and its activations too
        head[1:1] = ["stage" if piped else "tp rank", "dp rank"]
        head += ["activations KiB", "pred"]
        if piped:
            head += ["bubble", "ideal"]
    rows = []
    for r in result.ranks:
        p = r.predicted or {}
        s = r.summary()
        row = [
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
        if split:
            layout = r.layout or {}
            place = layout.get("stage" if piped else "tp_rank", "-")
            row[1:1] = [str(place), str(layout.get("dp_rank", "-"))]
            row += [kib(r.activation_bytes), kib(p.get("activation_bytes"))]
            if piped:
                row += [_share(layout.get("bubble_measured")), _share(layout.get("bubble_ideal"))]
        rows.append(row)
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    layout = next((r.layout for r in result.ranks if r.layout), None)
    if layout and piped:
        what = (
            f"pp={layout['pp']} stages"
            + (f" x tp={layout['tp']}" if layout.get("tp", 1) > 1 else "")
            + f" x dp={layout['dp']}, {layout.get('schedule')} over "
            f"{layout.get('micro_batches')} micro-batches; measured from each rank's tensors "
            "vs the estimator's largest stage (activations: the first stage's in-flight "
            "peak); bubble: the last step's idle share of the schedule vs (pp-1)/(m+pp-1)"
        )
    elif layout:
        what = (
            f"tp={layout['tp']} x dp={layout['dp']}; measured from each rank's tensors vs "
            "the estimator's tensor-parallel share"
        )
    else:
        what = f"measured from each rank's tensors vs predicted (accounting={accounting!r})"
    lines = [
        f"{result.world_size} ranks ({result.launcher}), {result.n_params or '?'} parameters; "
        + what
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *rows]]
    return "\n".join(lines)


def _share(v: Any) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.0%}"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workbench.cli.launch ...`: the same as `workbench launch ...`."""
    from workbench.cli import Parser

    parser = Parser(prog="workbench launch")
    runner = add_parser(parser)
    return runner(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
