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
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.cli.config_flags import add_config_flags, config_from_args, parse_number
from workbench.config import LRScaling, problem_lines

# The TrainConfig fields the baseline takes as flags (the rungs change the rest).
_BASE_FIELDS = ("micro_batch", "lr", "optimizer", "seed")


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
    what.add_argument(
        "--model-options",
        default=None,
        metavar="JSON",
        help="options of the model, e.g. '{\"layers\": 2}'",
    )
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
        "--checkpointing",
        action="store_true",
        help="add an activation-checkpointing rung with a 2x micro-batch",
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
    """The rungs of a JSON file: a list, or an object with a "rungs" list. ValueError
    naming the file for anything else."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--rungs {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--rungs {path}: not JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("rungs"), list):
        data = data["rungs"]
    if not isinstance(data, list):
        raise ValueError(
            f"--rungs {path}: must be a JSON list of rungs (objects of settings with an "
            "optional name)"
        )
    return data


def _arguments(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The ladder's keyword arguments from the flags, and the problems found."""
    problems: list[str] = []
    kw: dict[str, Any] = {"model": args.model, "device": args.device, "launcher": args.launcher}
    kw["steps"] = parse_number(args.steps, "int", "--steps", problems)
    kw["repeats"] = parse_number(args.repeats, "int", "--repeats", problems)
    if args.target_loss is not None:
        kw["target_loss"] = parse_number(args.target_loss, "float", "--target-loss", problems)
    if args.ranks is not None:
        kw["ranks"] = parse_number(args.ranks, "int", "--ranks", problems)
    if args.timeout is not None:
        kw["timeout"] = parse_number(args.timeout, "float", "--timeout", problems)
    if args.lr_scaling not in LRScaling.choices():
        problems.append(
            f"--lr-scaling {args.lr_scaling}: must be one of {', '.join(LRScaling.choices())}"
        )
    kw["lr_scaling"] = args.lr_scaling
    if args.model_options is not None:
        try:
            options = json.loads(args.model_options)
            if not isinstance(options, dict):
                raise ValueError
            kw["model_options"] = options
        except ValueError:
            problems.append(f"--model-options {args.model_options}: must be a JSON object")
    if args.rungs is not None:
        if args.compile or args.checkpointing or args.ranks is not None:
            problems.append(
                "--compile, --checkpointing and --ranks shape the built-in ladder; with "
                "--rungs, put those settings in the file's rungs"
            )
        try:
            kw["rungs"] = read_rungs(args.rungs)
        except ValueError as exc:
            problems.append(str(exc))
    kw["compile"], kw["checkpointing"] = bool(args.compile), bool(args.checkpointing)
    kw["memory"] = not args.no_memory
    base, base_problems = config_from_args(
        args, fields=_BASE_FIELDS, check_numbers=True, style="parenthesized"
    )
    problems += base_problems
    kw["base"] = base
    return kw, problems


def run_ladder(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench ladder` on parsed arguments; returns the exit status (1 when a rung
    failed; a target loss never reached is reported, not a failure)."""
    from workbench.train.ladder import ladder

    kw, problems = _arguments(args)
    if problems:
        parser.error("; ".join(problems))
    try:
        result = ladder(**kw, progress=None)
    except ValueError as exc:
        parser.error("; ".join(ln.removeprefix("invalid ladder: ") for ln in problem_lines(exc)))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(result.chart_png())
    if args.json:
        print(result.to_json())
    else:
        print(result)
        if args.out:
            print(f"chart: {args.out}")
    failed = [r for r in result.rungs if r.error is not None]
    for r in failed:
        print(f"workbench ladder: rung {r.name!r} failed: {r.error}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workbench.cli.ladder ...`: the same as `workbench ladder ...`."""
    from workbench.cli import Parser

    parser = Parser(prog="workbench ladder")
    runner = add_parser(parser)
    return runner(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
