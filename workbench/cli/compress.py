"""`workbench compress CHECKPOINT`: compress a trained model and measure before and after.

Rebuilds the model a Session checkpoint (or a `save_weights` file, with `--model`) holds
(`workbench.compress.load_trained`), compresses copies of it with each method, and prints
the report of `workbench.compress.compress`: weights and file size, latency per batch
and held-out loss/accuracy, before and after, with a verdict per method. A method pays
when it is smaller or faster and keeps its held-out quality within `--max-loss-ratio`
and `--max-accuracy-drop` (1.05x the loss before, 1 accuracy point by default).

A checkpoint is data: a model factory 'pkg.module:function' it names is code, so it is
imported only with `--trust-model-spec` (a `--model` you give is your own choice and is
always honoured). Bad input of any kind (flags out of range, a FIFO or device as the
checkpoint, options JSON with a duplicate key) ends as one line naming every problem, with
exit status 2. `--out` writes its files all at once (`workbench.outputs`): a failure leaves
what the folder held before whole.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from workbench.cli import report_json
from workbench.cli.config_flags import parse_number
from workbench.cli.model_flags import add_model_options_flag, parse_model_options
from workbench.compress.report import MAX_ACCURACY_DROP, MAX_LOSS_RATIO, tolerance_problems
from workbench.inputs import shown, typed
from workbench.outputs import target_problem
from workbench.problems import ConfigError, SettingProblem

#: Integer flags: (flag, attribute, minimum, maximum, why the maximum).
_INT_FLAGS = (
    (
        "--batch-size",
        "batch_size",
        1,
        1 << 20,
        "more samples in one forward pass than any device holds",
    ),
    ("--repeats", "repeats", 3, 10_000, "more timed passes than a median needs"),
    ("--eval-samples", "eval_samples", 1, 10**9, "more samples than any held-out split"),
    ("--threads", "threads", 1, 1024, "more threads than any machine has cores"),
)


def add_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Arguments of `workbench compress`; returns its runner."""
    parser.description = (
        "Compress a trained model (a Session checkpoint, or a weights file with --model) "
        "with INT8 dynamic quantization and magnitude pruning, and measure weights, file "
        "size, latency per batch and held-out quality before and after."
    )
    parser.add_argument(
        "checkpoint",
        help="a checkpoint file or directory (the newest step-N.pt), or a weights file",
    )
    what = parser.add_argument_group("what to compress")
    what.add_argument(
        "--methods",
        default="int8,prune,channels",
        help="comma-separated: int8, prune (unstructured), channels, heads; 'a+b' applies "
        "a then b, e.g. channels+int8 (int8,prune,channels)",
    )
    what.add_argument(
        "--sparsity",
        default="0.5",
        help="fraction of weights (prune) or of channels/heads removed, in [0, 1) (0.5)",
    )
    what.add_argument(
        "--engine", default="torchao", help="int8 engine: torchao or torch.ao (torchao)"
    )
    what.add_argument(
        "--model",
        default=None,
        help="tiny-gpt, mlp, cnn or a factory 'pkg.module:function' (default: the checkpoint's)",
    )
    add_model_options_flag(what, default_text="the checkpoint's")
    what.add_argument(
        "--trust-model-spec",
        action="store_true",
        help="honour a model factory 'pkg.module:function' the checkpoint itself names: "
        "imports that module and calls the function, i.e. runs code the file chose; only "
        "for a checkpoint you trust (a --model you give is always honoured)",
    )
    how = parser.add_argument_group("how to measure")
    how.add_argument(
        "--held-out",
        default="0.1",
        metavar="FRACTION",
        help="the last FRACTION of the model's data set is the held-out split (0.1)",
    )
    how.add_argument("--batch-size", default="64", help="samples per timed batch (64)")
    how.add_argument("--repeats", default="30", help="timed forward passes per model (30)")
    how.add_argument(
        "--eval-samples",
        default=None,
        metavar="N",
        help="held-out samples to evaluate on (default: all of the split)",
    )
    how.add_argument("--threads", default=None, metavar="N", help="torch threads (torch's)")
    how.add_argument(
        "--compile",
        action="store_true",
        help="time every model after torch.compile (takes a while per model)",
    )
    how.add_argument(
        "--max-loss-ratio",
        default=str(MAX_LOSS_RATIO),
        metavar="R",
        help="a method pays only if its held-out loss is at most R times the loss before "
        f"(>= 1; {MAX_LOSS_RATIO:g})",
    )
    how.add_argument(
        "--max-accuracy-drop",
        default=f"{MAX_ACCURACY_DROP:g}",
        metavar="POINTS",
        help="... and its held-out accuracy at most POINTS percentage points lower "
        f"(0 to 100; {MAX_ACCURACY_DROP:g})",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="write METHOD.pt (each compressed model's state dict), report.json, report.png",
    )
    return lambda args: run_compress(args, parser)


def _problems(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    from workbench.compress.compare import method_problems
    from workbench.compress.layers import sparsity_problem
    from workbench.compress.quantize import ENGINES

    problems: list[str] = []
    values: dict[str, Any] = {}
    problems += _checkpoint_problems(args.checkpoint)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    problems += [f"--methods {typed(args.methods)}: {p.message}" for p in method_problems(methods)]
    values["methods"] = methods
    sparsity = parse_number(args.sparsity, "float", "--sparsity", problems)
    if sparsity is not None:
        bad = sparsity_problem(sparsity)
        if bad:
            problems.append(f"--sparsity {typed(args.sparsity)}: {bad.message}")
    values["sparsity"] = sparsity
    if args.engine not in ENGINES:
        problems.append(f"--engine {typed(args.engine)}: must be one of {', '.join(ENGINES)}")
    held = parse_number(args.held_out, "float", "--held-out", problems)
    if held is not None and not 0 < held < 1:
        problems.append(f"--held-out {typed(args.held_out)}: must be a fraction in (0, 1)")
    values["held_out"] = held
    for flag, attr, minimum, maximum, why in _INT_FLAGS:
        raw = getattr(args, attr)
        if raw is None:
            values[attr] = None
            continue
        number = parse_number(raw, "int", flag, problems)
        if number is not None and not minimum <= number <= maximum:
            problems.append(
                f"{flag} {typed(raw)}: "
                + (f"must be at most {maximum:,} ({why})" if number > maximum else "")
                + (f"must be an integer >= {minimum}" if number < minimum else "")
            )
            number = None
        values[attr] = number
    for flag, attr in (
        ("--max-loss-ratio", "max_loss_ratio"),
        ("--max-accuracy-drop", "max_accuracy_drop"),
    ):
        values[attr] = parse_number(getattr(args, attr), "float", flag, problems)
    ratio, drop = values["max_loss_ratio"], values["max_accuracy_drop"]
    problems += [  # each parsed value against its range (an unparsed one is said above)
        p.render(name=_flag_of, value_text=typed(getattr(args, p.field)), sep=" ")
        for p in tolerance_problems(
            MAX_LOSS_RATIO if ratio is None else ratio,
            MAX_ACCURACY_DROP if drop is None else drop,
        )
    ]
    options = parse_model_options(args.model_options, problems)
    values["model_options"] = options
    if args.out is not None:
        problems += _out_problems(args.out)
    return values, problems


def _checkpoint_problems(path: str) -> list[str]:
    """A checkpoint must be a regular file or a directory: a FIFO would block, a device
    read forever; a name the system cannot look up is named as such."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return [f"checkpoint {typed(path)}: no such file or directory"]
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        return [f"checkpoint {typed(path)}: cannot be read ({reason})"]
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return []
    kind = (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
    return [
        f"checkpoint {typed(path)}: {kind}; give a checkpoint file, a folder of "
        "checkpoints or a weights file"
    ]


def _out_problems(out: str) -> list[str]:
    """--out must be a folder (or a path one can be made at): said before any work."""
    reason = target_problem(out, folder=True)
    return [] if reason is None else [f"--out {typed(out)}: {reason}"]


def run_compress(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench compress` on parsed arguments; returns the exit status."""
    values, problems = _problems(args)
    if problems:
        parser.error("; ".join(problems))
    import torch

    from workbench.compress import compress, held_out_split, load_trained
    from workbench.models.spec import UntrustedSpecError
    from workbench.train.checkpoints import CheckpointError

    if values["threads"] is not None:
        torch.set_num_threads(values["threads"])
    try:
        with _warnings_to_stderr():  # a trusted factory: what is imported, said here
            trained = load_trained(
                args.checkpoint,
                model=args.model,
                model_options=values["model_options"],
                trusted=bool(args.trust_model_spec),
            )
        _, held_out = held_out_split(trained.dataset, values["held_out"])
    except UntrustedSpecError as exc:
        parser.error(_untrusted(exc))
    except ConfigError as exc:
        parser.error(_as_flags(exc.problems, args))
    except CheckpointError as exc:
        parser.error(
            f"checkpoint {typed(exc.path)}: {exc.reason}" + (f"; {exc.hint}" if exc.hint else "")
        )
    except ValueError as exc:
        parser.error(_one_line(exc))
    except Exception as exc:  # a model that cannot be built or loaded: said, not a traceback
        parser.error(
            f"checkpoint {typed(args.checkpoint)}: cannot be loaded "
            f"({type(exc).__name__}: {_one_line(exc)})"
        )
    source = f"{trained.name} from {trained.path}" + (
        f" (step {trained.step})" if trained.step is not None else ""
    )
    try:
        report = compress(
            trained.model,
            held_out,
            trained.loss_fn,
            methods=values["methods"],
            sparsity=values["sparsity"],
            engine=args.engine,
            title=f"compression of {source}",
            batch_size=values["batch_size"],
            repeats=values["repeats"],
            eval_samples=values["eval_samples"],
            compile=args.compile,
            max_loss_ratio=values["max_loss_ratio"],
            max_accuracy_drop=values["max_accuracy_drop"],
            held_out_unseen=False,  # the checkpoint's own data: it may have trained on it
        )
    except ConfigError as exc:
        parser.error(_as_flags(exc.problems, args))
    except (ValueError, ImportError) as exc:
        parser.error(_one_line(exc))
    held_note = (
        f"eval split: the last {values['held_out']:.0%} of the model's data set, held out "
        "only if the model never trained on it (a model trained on the whole set has seen "
        "it: train on workbench.compress.held_out_split for a held-out quality)"
    )
    written: list[str] = []
    if args.out is not None:
        from workbench.outputs import OutputError

        try:
            written = _write(report, Path(args.out))
        except OutputError as exc:
            parser.error(f"--out {typed(args.out)}: {exc}")
    if args.json:
        data = report.to_dict()
        data["held_out"] = held_note
        data["written"] = written
        print(report_json(data))
    else:
        print(report)
        print(f"  note: {held_note}")
        for path in written:
            print(f"wrote {path}")
    return 0


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """The "workbench" logger's warnings as "workbench compress: warning: ..." lines on
    stderr while the block runs (whatever logging is configured, and only once)."""
    logger = logging.getLogger("workbench")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("workbench compress: warning: %(message)s"))
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _untrusted(exc: Any) -> str:
    """The refusal of a factory the checkpoint names, in the command's words."""
    spec = str(getattr(exc, "spec", "?"))
    source = str(getattr(exc, "source", "the checkpoint"))
    module, _, function = spec.partition(":")
    return (
        f"{source} names the model factory {shown(spec)} (Python code: module "
        f"{shown(module)}, function {shown(function)}); a checkpoint cannot choose code to "
        "run, so nothing was imported. Name the model yourself with --model, or, if you "
        f"trust this file, pass --trust-model-spec (it imports {module} and calls {function})"
    )


#: The API's argument names -> this command's words for them.
_FLAG_OF = {
    "path": "checkpoint",
    "model": "--model",
    "model_options": "--model-options",
    "trusted": "--trust-model-spec",
    "methods": "--methods",
    "unit": "--methods",
    "sparsity": "--sparsity",
    "engine": "--engine",
    "batch_size": "--batch-size",
    "repeats": "--repeats",
    "eval_samples": "--eval-samples",
    "compile": "--compile",
    "max_loss_ratio": "--max-loss-ratio",
    "max_accuracy_drop": "--max-accuracy-drop",
}


def _flag_of(name: str) -> str:
    return _FLAG_OF.get(name, name)


def _as_flags(problems: Sequence[SettingProblem], args: argparse.Namespace) -> str:
    """The problems of an API error in the command's words, made from their data: each
    argument as its flag with the value as typed ("--model resnet: ...", "checkpoint
    PATH: ..."), the methods a `MethodProblem` suggests as `--methods` values."""
    from workbench.compress.layers import MethodProblem

    typed_as = {
        "path": args.checkpoint,
        "model": args.model,
        "model_options": args.model_options,
    }
    lines = []
    for p in problems:
        given = typed_as.get(p.field)
        if given is not None:
            value_text: str | None = typed(given)
        elif isinstance(p.value, str):
            value_text = typed(p.value)
        else:
            value_text = None
        text = SettingProblem.render(p, name=_flag_of, value_text=value_text, sep=" ")
        if isinstance(p, MethodProblem) and p.instead:
            text += f"; use {' or '.join(f'--methods {m}' for m in p.instead)} instead"
        lines.append(" ".join(text.split()))
    return "; ".join(lines)


def _one_line(exc: BaseException) -> str:
    """An error's text on one line."""
    return " ".join(str(exc).split())


def _write(report: Any, out: Path) -> list[str]:
    """Each compressed model's state dict, the report as JSON and its chart as PNG, all
    at once (`workbench.outputs.write_files`): a failure leaves the folder as it was."""
    import torch

    from workbench.outputs import write_files

    files: dict[str, bytes | str] = {}
    for method, model in report.models.items():
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        files[f"{method}.pt"] = buffer.getvalue()
    files["report.json"] = report_json(report.to_dict())
    files["report.png"] = report.chart_png()
    return [str(path) for path in write_files(out, files)]
