"""`workbench ladder`: measure what each optimization buys on this machine.

Runs `workbench.ladder` (the default ladder, or the rungs of a JSON file) and prints its
table (or one JSON object with `--json`); `--out` writes the speed-up chart as a PNG. A
progress bar goes to stderr when it is a terminal.

A rungs file is a JSON list; each rung is an object of `TrainConfig` settings (and
`ranks` for data parallelism) with an optional "name", applied on top of the rungs
before it; the first is the baseline:

    [{"name": "baseline", "precision": "fp32"},
     {"name": "+ AMP", "precision": "amp-bf16", "num_workers": 2},
     {"name": "+ 2 ranks", "ranks": 2},
     {"name": "+ accumulation", "grad_accum": 4, "lr_scaling": "sqrt"}]

A rungs file is data: it is read bounded and strict (`workbench.inputs`: a regular file of
at most 1 MiB, no duplicate key, no NaN), holds settings only (a rung naming `model` is
refused: the model is `--model`'s, never a file's) and an object form may hold nothing but
its "rungs". Every problem of a command line is named in one message, exit status 2,
before anything trains; the chart is written atomically (`workbench.outputs`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from workbench.cli.config_flags import (
    add_config_flags,
    config_from_args,
    parse_number,
)
from workbench.cli.model_flags import add_model_options_flag, parse_model_options
from workbench.config import LRScaling, problem_lines
from workbench.inputs import InputFileError, read_json, shown, typed
from workbench.outputs import target_problem

if TYPE_CHECKING:
    from workbench.train.ladder import LadderProblem

# The TrainConfig fields the baseline takes as flags (the rungs change the rest).
_BASE_FIELDS = ("micro_batch", "lr", "optimizer", "seed")
#: The largest rungs file read (a ladder of a dozen rungs is a few hundred bytes).
MAX_RUNGS_BYTES = 1 << 20
#: The deepest rungs file: an object, its list, a rung, a value.
MAX_RUNGS_DEPTH = 8
#: The ladder's argument names -> this command's flags.
_FLAG_OF = {
    "steps": "--steps",
    "repeats": "--repeats",
    "target_loss": "--target-loss",
    "ranks": "--ranks",
    "timeout": "--timeout",
    "model_options": "--model-options",
    "model": "--model",
    "device": "--device",
    "launcher": "--launcher",
    "lr_scaling": "--lr-scaling",
}


def add_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Arguments of `workbench ladder`; returns its runner."""
    parser.description = (
        "Measure what each optimization buys on this machine: a ladder of cumulative "
        "settings changes (fp32 baseline, + AMP and loader workers, + data parallel, + "
        "gradient accumulation with a scaled LR and OneCycle, ...), every rung on the same "
        "samples, repeated and interleaved; samples/s, speed-up with its spread, time to a "
        "target loss, memory measured vs predicted, and whether each rung helped."
    )
    what = parser.add_argument_group("the ladder")
    what.add_argument(
        "--rungs",
        default=None,
        metavar="FILE.json",
        help="a JSON list of rungs (objects of settings with an optional name; the first "
        "is the baseline); default: the built-in ladder",
    )
    what.add_argument(
        "--steps",
        default="32",
        metavar="N",
        help="the baseline's optimizer steps; every rung trains on the same samples (32)",
    )
    what.add_argument("--repeats", default="3", metavar="N", help="runs per rung, interleaved (3)")
    what.add_argument(
        "--target-loss",
        default=None,
        metavar="LOSS",
        help="also report the steps and time to reach this training loss",
    )
    what.add_argument(
        "--model",
        default="tiny-gpt",
        help="tiny-gpt, mlp, cnn or a factory 'pkg.module:function' (tiny-gpt)",
    )
    add_model_options_flag(what)
    what.add_argument("--device", default=None, help="auto, cpu or cuda (auto)")
    default = parser.add_argument_group("the built-in ladder")
    default.add_argument(
        "--lr-scaling",
        default="linear",
        help="how the accumulation rung scales the learning rate: linear, sqrt or none (linear)",
    )
    default.add_argument(
        "--ranks",
        default=None,
        metavar="N",
        help="data-parallel ranks (default: every GPU; 2 on a CPU; 1 leaves the rung out)",
    )
    default.add_argument("--compile", action="store_true", help="add a torch.compile rung")
    default.add_argument(
        "--memory",
        action="store_true",
        help="the memory ladder instead: + sdpa, + checkpointing, + 8-bit AdamW, + the "
        "optimizer step in backward, each rung's memory freed and step time cost",
    )
    default.add_argument(
        "--checkpointing",
        action="store_true",
        help="add an activation-checkpointing rung with a 2x micro-batch",
    )
    default.add_argument(
        "--model-parallel",
        action="store_true",
        help="add a + model parallel rung: the data-parallel ranks as one tensor-parallel "
        "group (tp = ranks; tiny-gpt and transformers Llama-style models)",
    )
    base = parser.add_argument_group("the baseline's settings (TrainConfig)")
    add_config_flags(base, fields=_BASE_FIELDS)
    run = parser.add_argument_group("running")
    run.add_argument(
        "--launcher", default="torchrun", help="for data-parallel rungs: torchrun or deepspeed"
    )
    run.add_argument("--timeout", default=None, metavar="SECONDS", help="per multi-rank launch")
    run.add_argument(
        "--no-memory",
        action="store_true",
        help="skip measuring each rung's memory next to the prediction",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--out", default=None, metavar="CHART.png", help="write the speed-up chart as a PNG"
    )
    return lambda args: run_ladder(args, parser)


def read_rungs(path: str) -> list[Any]:
    """The rungs of a JSON file: a list, or an object whose only key is "rungs" (a list).
    ValueError naming the file for anything else: not a regular file, too large, not
    strict JSON (a duplicate key, NaN), nested too deep, another shape."""
    where = f"--rungs {typed(str(path))}"
    try:
        data = read_json(path, what="--rungs", max_bytes=MAX_RUNGS_BYTES, max_depth=MAX_RUNGS_DEPTH)
    except InputFileError as exc:
        raise ValueError(f"{where}: {exc.reason}") from None
    if isinstance(data, dict):
        others = sorted(k for k in data if k != "rungs")
        if others:
            raise ValueError(
                f"{where}: {', '.join(shown(k) for k in others[:5])}: not allowed; an object "
                'holds only "rungs" (the model and the run are this command\'s flags, never '
                "a file's)"
            )
        data = data.get("rungs")
    if not isinstance(data, list):
        raise ValueError(
            f"{where}: must be a JSON list of rungs (objects of settings with an optional "
            'name), or an object {"rungs": [...]}'
        )
    return data


def _flag_of(name: str) -> str:
    return _FLAG_OF.get(name, name)


def _as_flag(problem: LadderProblem, raw: dict[str, str | None]) -> str:
    """A problem of one of the ladder's arguments written with its flag and the value as
    typed ("--steps 0: ..."); a rung's problems (and those naming no flag) as they are."""
    if problem.where or problem.field not in _FLAG_OF:
        return str(problem)
    given = raw.get(problem.field)
    return problem.render(
        name=_flag_of, value_text=None if given is None else typed(given), sep=" "
    )


def _config_problems(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The baseline's TrainConfig from its flags, and every problem of them at once (a
    number flag that is no number, and what TrainConfig says of the others)."""
    return config_from_args(args, fields=_BASE_FIELDS, check_numbers=True, style="parenthesized")


def _out_problems(out: str) -> list[str]:
    """--out must name a file that can be written: said before the ladder runs."""
    reason = target_problem(out, folder=False)
    if reason is not None and reason.startswith("is a folder"):
        reason = "is a folder; name the chart's file (CHART.png)"
    return [] if reason is None else [f"--out {typed(out)}: {reason}"]


def _arguments(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The ladder's keyword arguments from the flags, and every problem found."""
    from workbench.train.ladder import number_problems

    problems: list[str] = []
    kw: dict[str, Any] = {"model": args.model, "device": args.device, "launcher": args.launcher}
    raw: dict[str, str | None] = {
        "steps": args.steps,
        "repeats": args.repeats,
        "target_loss": args.target_loss,
        "ranks": args.ranks,
        "timeout": args.timeout,
        "model_options": args.model_options,
    }
    numbers: dict[str, Any] = {}
    for name, kind in (
        ("steps", "int"),
        ("repeats", "int"),
        ("target_loss", "float"),
        ("ranks", "int"),
        ("timeout", "float"),
    ):
        text = raw[name]
        if text is not None:
            numbers[name] = parse_number(text, kind, _FLAG_OF[name], problems)
    parsed = {k: v for k, v in numbers.items() if v is not None}
    problems += [_as_flag(p, raw) for p in number_problems(**parsed)]
    kw.update(numbers)
    if args.lr_scaling not in LRScaling.choices():
        problems.append(
            f"--lr-scaling {typed(args.lr_scaling)}: must be one of "
            f"{', '.join(LRScaling.choices())}"
        )
    kw["lr_scaling"] = args.lr_scaling
    options = parse_model_options(args.model_options, problems)
    if options is not None:
        kw["model_options"] = options
    if args.rungs is not None:
        if args.compile or args.checkpointing or args.model_parallel or args.ranks is not None:
            problems.append(
                "--compile, --checkpointing, --model-parallel and --ranks shape the built-in "
                "ladder; with --rungs, put those settings in the file's rungs"
            )
        try:
            kw["rungs"] = read_rungs(args.rungs)
        except ValueError as exc:
            problems.append(str(exc))
    kw["compile"], kw["checkpointing"] = bool(args.compile), bool(args.checkpointing)
    kw["model_parallel"] = bool(args.model_parallel)
    kw["memory"] = not args.no_memory
    if args.memory:
        kw["kind"] = "memory"
    base, base_problems = _config_problems(args)
    problems += base_problems
    kw["base"] = base
    if args.out:
        problems += _out_problems(args.out)
    return kw, problems


def run_ladder(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench ladder` on parsed arguments; returns the exit status (1 when a rung
    failed; a target loss never reached is reported, not a failure; 2 for bad input, and
    when the chart cannot be written, after the table is printed)."""
    from workbench.outputs import OutputError, write_file
    from workbench.train.ladder import LadderError, ladder

    kw, problems = _arguments(args)
    if problems:
        parser.error("; ".join(problems))
    raw = {"model": args.model, "device": args.device, "launcher": args.launcher}
    try:
        result = ladder(**kw, progress=None)
    except LadderError as exc:
        parser.error("; ".join(_as_flag(p, raw) for p in exc.problems))
    except ValueError as exc:
        parser.error("; ".join(problem_lines(exc)))
    chart_error = None
    if args.out:
        try:
            write_file(args.out, result.chart_png())
        except OutputError as exc:
            chart_error = f"--out {typed(args.out)}: {exc}"
    if args.json:
        print(result.to_json())
    else:
        print(result)
        if args.out and chart_error is None:
            print(f"chart: {args.out}")
    failed = [r for r in result.rungs if r.error is not None]
    for r in failed:
        print(f"workbench ladder: rung {shown(r.name)} failed: {r.error}", file=sys.stderr)
    if chart_error is not None:
        print(f"{parser.prog}: error: {chart_error}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workbench.cli.ladder ...`: the same as `workbench ladder ...`."""
    from workbench.cli import Parser

    parser = Parser(prog="workbench ladder")
    runner = add_parser(parser)
    return runner(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
