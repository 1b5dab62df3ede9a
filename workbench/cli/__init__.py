"""`workbench` command line: `workbench estimate | launch | export | compress | ladder | plan`.

Every command's argument parsing and printing lives in this package, one module per
command (`estimate.py`, `launch.py`, `export.py`, `compress.py`, `ladder.py`, `plan.py`; the
TrainConfig flags they share in `config_flags.py`, `--model-options` in `model_flags.py`);
the engines below never import it. Subcommands are registered in `COMMANDS`, one line
each, and each is imported only when it runs, so `workbench estimate` never imports torch,
deepspeed or ipywidgets.

Adding a subcommand:

1. In `workbench/cli/NAME.py`, write an adder that receives the subcommand's own
   `argparse.ArgumentParser`, adds its arguments and returns the function that runs it::

       def add_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
           parser.add_argument("script")
           return run  # run(args) -> exit status (0 ok; use parser.error(...) for bad input)

2. Add one line to `COMMANDS` below::

       "launch": ("workbench.cli.launch:add_parser", "run a training script on N ranks"),

Bad input anywhere should end as `parser.error("--flag VALUE: what is allowed")`: this
module's parser prints it as one line and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

Runner = Callable[[argparse.Namespace], int]
Adder = Callable[[argparse.ArgumentParser], Runner]

# name -> ("module:adder", one-line help). The module is imported only when `name` runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "estimate": (
        "workbench.cli.estimate:add_parser",
        "per-GPU memory, time and cost of a training setup (pure math, no GPU needed)",
    ),
    "launch": (
        "workbench.cli.launch:add_parser",
        "train one config on N local ranks; measured vs predicted memory per rank",
    ),
    "export": (
        "workbench.cli.export:add_parser",
        "write a DeepSpeed config, training script and launch command",
    ),
    "compress": ("workbench.cli.compress:add_parser", "quantize/prune a checkpoint, measured"),
    "ladder": ("workbench.cli.ladder:add_parser", "what each optimization buys here, measured"),
    "plan": (
        "workbench.cli.plan:add_parser",
        "every setup that fits a model on a cluster, ranked by predicted step time",
    ),
}


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument ([^:]+): ", lambda m: m.group(1).split("/")[-1] + " ", message)
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message}\n")


def json_text(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """`value` as strict JSON (indented), for every command's --json: a figure that is not
    finite (NaN, an infinity) is never printed as `NaN`/`Infinity`, which JSON does not
    have; ValueError naming where it is (`plans[0].tokens_per_s: inf`). The walk is
    bounded (64 levels; a container seen twice on one path is a cycle)."""
    where = _not_finite(value, "", set(), 0)
    if where is not None:
        raise ValueError(f"{where}: not a finite number, so the JSON output would be invalid")
    return json.dumps(value, indent=2, allow_nan=False, default=default)


def report_json(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """A run's or a report's record as strict JSON (indented): a measured figure that is not
    finite (a diverged run's NaN loss, an infinite ratio) is written `null`, "no number",
    since JSON has no NaN or Infinity and the rest of the record is still worth having.
    (`json_text` is for predictions, where such a figure is an error.)"""
    return json.dumps(_finite(value, 0), indent=2, allow_nan=False, default=default)


def _finite(value: Any, depth: int) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 64:  # json.dumps reports the depth itself
        return value
    if isinstance(value, dict):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, depth + 1) for v in value]
    return value


def _not_finite(value: Any, path: str, seen: set[int], depth: int) -> str | None:
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path or 'the value'}: {value}"
    if not isinstance(value, (dict, list, tuple)) or depth > 64 or id(value) in seen:
        return None  # json.dumps reports a cycle or depth itself
    seen.add(id(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        sub = (
            f"{path}.{key}"
            if isinstance(value, dict) and path
            else (str(key) if isinstance(value, dict) else f"{path}[{key}]")
        )
        found = _not_finite(item, sub, seen, depth + 1)
        if found is not None:
            return found
    seen.discard(id(value))
    return None


def _load(target: str) -> Adder:
    module, _, attr = target.partition(":")
    adder: Adder = getattr(importlib.import_module(module), attr)
    return adder


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, Runner | None]:
    """The top-level parser; only `command`'s own arguments are loaded (lazily)."""
    from workbench.version import __version__

    parser = Parser(
        prog="workbench",
        description="Make PyTorch training faster and leaner. Run `workbench COMMAND -h`.",
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    runner: Runner | None = None
    for name, (target, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            runner = _load(target)(sub_parser)
    return parser, runner


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `workbench` console script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser, runner = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(args_list)
    if runner is None:
        parser.error("a command is required: " + ", ".join(COMMANDS))
    try:
        return runner(args)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
