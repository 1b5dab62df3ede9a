"""`workbench compress CHECKPOINT`: compress a trained model and measure before and after.

Rebuilds the model a Session checkpoint (or a `save_weights` file, with `--model`) holds
(`workbench.compress.load_trained`), compresses copies of it with each method, and prints
the report of `workbench.compress.compress`: weights and file size, latency per batch
and held-out loss/accuracy, before and after, with a verdict per method.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.cli.config_flags import parse_number


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
    what.add_argument(
        "--model-options",
        default=None,
        metavar="JSON",
        help="options of the model, e.g. '{\"layers\": 2}' (default: the checkpoint's)",
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
    from workbench.compress.compare import METHODS, method_problems
    from workbench.compress.layers import sparsity_problem
    from workbench.compress.quantize import ENGINES

    problems: list[str] = []
    values: dict[str, Any] = {}
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for p in method_problems(methods):
        problems.append("--methods " + args.methods + ": " + p.split(": ", 1)[-1])
    values["methods"] = methods
    sparsity = parse_number(args.sparsity, "float", "--sparsity", problems)
    if sparsity is not None:
        bad = sparsity_problem(sparsity)
        if bad:
            problems.append(f"--sparsity {args.sparsity}: " + bad.split(": ", 1)[-1])
    values["sparsity"] = sparsity
    if args.engine not in ENGINES:
        problems.append(f"--engine {args.engine}: must be one of {', '.join(ENGINES)}")
    held = parse_number(args.held_out, "float", "--held-out", problems)
    if held is not None and not 0 < held < 1:
        problems.append(f"--held-out {args.held_out}: must be a fraction in (0, 1)")
    values["held_out"] = held
    for flag, attr, minimum in (
        ("--batch-size", "batch_size", 1),
        ("--repeats", "repeats", 3),
        ("--eval-samples", "eval_samples", 1),
        ("--threads", "threads", 1),
    ):
        raw = getattr(args, attr)
        if raw is None:
            values[attr] = None
            continue
        number = parse_number(raw, "int", flag, problems)
        if number is not None and number < minimum:
            problems.append(f"{flag} {raw}: must be an integer >= {minimum}")
        values[attr] = number
    options = None
    if args.model_options is not None:
        try:
            options = json.loads(args.model_options)
            if not isinstance(options, dict):
                raise ValueError
        except ValueError:
            problems.append(f"--model-options {args.model_options}: must be a JSON object")
    values["model_options"] = options
    if not methods:
        problems.append(f"--methods {args.methods!r}: name at least one of {', '.join(METHODS)}")
    return values, problems


def run_compress(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench compress` on parsed arguments; returns the exit status."""
    values, problems = _problems(args)
    if problems:
        parser.error("; ".join(problems))
    import torch

    from workbench.compress import compress, held_out_split, load_trained

    if values["threads"] is not None:
        torch.set_num_threads(values["threads"])
    try:
        trained = load_trained(
            args.checkpoint, model=args.model, model_options=values["model_options"]
        )
        _, held_out = held_out_split(trained.dataset, values["held_out"])
    except ValueError as exc:
        parser.error(_flagged(str(exc)))
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
        )
    except (ValueError, ImportError) as exc:
        parser.error(_flagged(str(exc)))
    held_note = (
        f"held-out split: the last {values['held_out']:.0%} of the model's data set; a model "
        "trained on the whole set has seen it (train on workbench.compress.held_out_split)"
    )
    written: list[str] = []
    if args.out is not None:
        written = _write(report, Path(args.out))
    if args.json:
        data = report.to_dict()
        data["held_out"] = held_note
        data["written"] = written
        print(json.dumps(data, indent=2))
    else:
        print(report)
        print(f"  note: {held_note}")
        for path in written:
            print(f"wrote {path}")
    return 0


def _flagged(message: str) -> str:
    """An API message in the command's words (its flags instead of keyword arguments)."""
    text = " ".join(message.split())
    for api, flag in (
        ("model_options", "--model-options"),
        ("model=", "--model"),
        ("unit='channels'", "--methods channels"),
        ("unit='heads'", "--methods heads"),
        ("prune_unstructured()", "--methods prune"),
    ):
        text = text.replace(api, flag)
    return text


def _write(report: Any, out: Path) -> list[str]:
    """Each compressed model's state dict, the report as JSON and its chart as PNG."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for method, model in report.models.items():
        path = out / f"{method}.pt"
        torch.save(model.state_dict(), path)
        written.append(str(path))
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
    (out / "report.png").write_bytes(report.chart_png())
    written += [str(out / "report.json"), str(out / "report.png")]
    return written
