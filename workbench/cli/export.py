"""`workbench export --format deepspeed`: a TrainConfig as a ready-to-run DeepSpeed job
(`workbench.export` writes it)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.cli import report_json
from workbench.cli.config_flags import (
    CONFIG_FLAGS,
    add_config_flags,
    config_from_args,
    lenient_number,
    raw_values,
)
from workbench.config import SettingProblem, TrainConfig, plain_value
from workbench.export import (
    FORMATS,
    ExportError,
    ExportProblem,
    ExportResult,
    check_export,
    describe,
    export_job,
    one_line,
)
from workbench.export.refusals import model_parallel_problems
from workbench.inputs import InputFileError, is_int, parse_json, read_json, shown, typed

# The TrainConfig fields `workbench export` takes as flags: every one in
# workbench.cli_config except --device, which an exported job does not take.
_CONFIG_FIELDS = tuple(name for name in CONFIG_FLAGS if name != "device")
_EXPORT_FLAGS = {
    "gpus": "--gpus",
    "nodes": "--nodes",
    "hostfile": "--hostfile",
    "model": "--model",
    "out_dir": "--out",
    "steps": "--steps",
    "model_options": "--model-option",
}
_FLAGS = {**{name: CONFIG_FLAGS[name].flag for name in _CONFIG_FIELDS}, **_EXPORT_FLAGS}
_HELP = {
    "total_steps": "schedule horizon, and the script's default number of steps (1000)",
}


def add_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Arguments of `workbench export`; returns its runner (see workbench/cli.py)."""
    job = parser.add_argument_group("what to export")
    job.add_argument(
        "--format",
        default="deepspeed",
        help="deepspeed (DeepSpeed's engine and launcher), fsdp (PyTorch FSDP2 under torchrun; "
        "needs --fsdp), lightning (a Lightning Trainer with the matching strategy) (deepspeed)",
    )
    job.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="directory to write into (FORMAT_job: deepspeed_job, fsdp_job, lightning_job)",
    )
    job.add_argument(
        "--gpus",
        metavar="N",
        help="GPUs (ranks) per node (1; with --config: the world size its batch keys imply)",
    )
    job.add_argument("--nodes", metavar="N", default="1", help="nodes (1)")
    job.add_argument("--hostfile", metavar="FILE", help="DeepSpeed hostfile for several nodes")
    job.add_argument(
        "--model",
        default="tiny-gpt",
        help="tiny-gpt, mlp, cnn, or a factory 'pkg.module:function' (tiny-gpt)",
    )
    job.add_argument(
        "--model-option",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="an option of the built-in model or factory, e.g. layers=2 (repeatable)",
    )
    job.add_argument(
        "--steps",
        metavar="N",
        help="the script's default number of optimizer steps (--total-steps)",
    )
    job.add_argument(
        "--config",
        metavar="DS_JSON",
        help="start from this DeepSpeed config (flags below override it)",
    )
    job.add_argument("--json", action="store_true", help="print one JSON object")
    cfg = parser.add_argument_group("training settings (TrainConfig; defaults as TrainConfig's)")
    add_config_flags(cfg, fields=_CONFIG_FIELDS, bare_offload=True, help=_HELP)
    return lambda args: run(args, parser)


def _flag_of(name: str) -> str:
    return _FLAGS.get(name, name)


def _as_flag_line(problem: SettingProblem, raw: dict[str, str]) -> str:
    """An export problem written with the CLI's flags, from its data: the value as typed
    (`raw`: argument name -> the text given) when there is one, a model option as
    `--model-option KEY=VALUE`, "(without it: --total-steps)" for an argument that may be
    left out."""
    extra = problem if isinstance(problem, ExportProblem) else None
    message = problem.message
    if extra is not None and extra.unset is not None:
        message += f" (without it: {_flag_of(extra.unset)})"
    if extra is not None and extra.option is not None:
        value_text = shown(extra.option)[1:-1]
        if extra.value_text != "":
            value_text += f"={shown(problem.value)}"
    elif extra is not None and extra.options:
        if extra.value_text == "" or not isinstance(problem.value, dict):
            value_text = ", ".join(shown(k)[1:-1] for k in extra.options)
        else:
            value_text = ", ".join(f"{k}={shown(problem.value.get(k))}" for k in extra.options)
    elif problem.field in raw:
        value_text = typed(raw[problem.field])  # as typed, cut when too long to read
    elif problem.value is None or (extra is not None and extra.value_text == ""):
        value_text = ""
    else:
        value_text = shown(plain_value(problem.value)).strip("'\"")
    line = SettingProblem(problem.field, problem.value, message)
    return line.render(name=_flag_of, value_text=value_text, sep=" ")


def _model_options(items: list[str], problems: list[str]) -> dict[str, Any]:
    """`--model-option KEY=VALUE` flags as a dict: VALUE read as strict JSON (a number, a
    bool, null, a quoted string), or as text when it is no JSON."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"--model-option {shown(item)[1:-1]}: must be KEY=VALUE, e.g. layers=2")
            continue
        if key in options:
            problems.append(
                f"--model-option {key}: given twice ({shown(options[key])} and {shown(text)}); "
                "give each option once"
            )
            continue
        try:
            options[key] = parse_json(text, what=f"--model-option {key}")
        except InputFileError as exc:
            if exc.reason.startswith("not valid JSON (") and "digits" not in exc.reason:
                options[key] = text  # plain text, e.g. a path
            else:
                problems.append(f"--model-option {key}={shown(text)[1:-1]}: {exc.reason}")
    return options


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench export` on parsed arguments; returns the exit status. Every problem
    with the flags is reported at once (exit 2), each naming the flag, the value and what
    is allowed."""
    if args.format.strip().lower() not in FORMATS:
        parser.error(f"--format {shown(args.format)[1:-1]}: allowed formats: {', '.join(FORMATS)}")
    fmt = args.format.strip().lower()
    if args.out is None:
        args.out = f"{fmt}_job"
    problems: list[str] = []
    gpus = lenient_number(args.gpus, "int") if args.gpus is not None else None
    nodes = lenient_number(args.nodes, "int")
    steps = lenient_number(args.steps, "int") if args.steps is not None else None
    options = _model_options(args.model_option, problems)

    warns: tuple[str, ...] = ()
    config: TrainConfig | None = None
    if args.config is not None:
        config, gpus, warns = _import_config(args, gpus, nodes, problems)
    if gpus is None:
        gpus = 1
    if args.config is None or config is not None:
        config, config_problems = config_from_args(
            args, fields=_CONFIG_FIELDS, base=config, strip_text=True, other_flags=_EXPORT_FLAGS
        )
        problems += config_problems
    where = {
        "format": fmt,
        "gpus": gpus,
        "out_dir": args.out,
        "model": args.model,
        "nodes": nodes,
        "hostfile": args.hostfile,
        "model_options": options,
        "steps": steps,
    }
    raw = {k: typed(v) for k, v in raw_values(args, _CONFIG_FIELDS).items()}
    raw |= _export_raw(args)
    if problems or config is None:  # the other arguments' problems too, all at once
        if config is None:  # the settings refused: a tp / pp no job carries is said first
            split = {k: lenient_number(raw.get(k, "1"), "int") for k in ("tp", "pp")}
            blocking = model_parallel_problems(fmt, split["tp"], split["pp"])
            problems[:0] = [_as_flag_line(p, raw) for p in blocking]
        problems += [_as_flag_line(p, raw) for p in check_export(config, **where)]
        parser.error("; ".join(dict.fromkeys(problems)))
    try:
        result = export_job(config, warnings=warns, **where)
    except ExportError as exc:
        parser.error("; ".join(dict.fromkeys(_as_flag_line(p, raw) for p in exc.problems)))
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if args.json:
        print(report_json(result.to_dict(), default=str))
    else:
        print(_report(result, config, given_hostfile=args.hostfile is not None))
    return 0


def _size(n: int) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:,.2f} {name}"
    return f"{n} B"


def _import_config(
    args: argparse.Namespace, gpus: Any, nodes: Any, problems: list[str]
) -> tuple[TrainConfig | None, Any, tuple[str, ...]]:
    """(config, gpus, warnings) from `--config`. Without --gpus the world size is the one
    the batch keys imply. With --gpus, batch keys that fix micro-batch and accumulation
    keep them (train_batch_size follows the new world size, with a warning); otherwise
    the missing one is solved for the new world size. "auto" values are filled with the
    settings the job is written with (the flags over the config), and the warning says
    those."""
    imported = _imported(args, problems)
    if imported is None:
        return None, gpus, ()
    warns = list(imported.warnings)
    if not (is_int(nodes) and nodes >= 1):
        return imported.config, gpus, tuple(warns)
    if gpus is None:
        if imported.world_size % nodes:
            problems.append(
                f"--nodes {args.nodes}: the config's batch keys imply world size "
                f"{imported.world_size}, not a multiple of {nodes} nodes; give --gpus"
            )
        return imported.config, max(1, imported.world_size // nodes), tuple(warns)
    if not (is_int(gpus) and gpus >= 1) or gpus * nodes == imported.world_size:
        return imported.config, gpus, tuple(warns)
    raw = read_json(args.config, what="--config")
    batch_keys = (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    )
    if all(raw.get(k, "auto") != "auto" for k in batch_keys):  # "auto": filled per world
        c = imported.config
        warns.append(
            f"train_batch_size={raw['train_batch_size']}: was for world size "
            f"{imported.world_size}; exported for world size {gpus * nodes}: "
            f"{c.micro_batch} x {c.grad_accum} x {gpus * nodes} = "
            f"{c.effective_batch_size(gpus * nodes)}"
        )
        return c, gpus, tuple(warns)
    imported = _imported(args, problems, world_size=gpus * nodes)
    if imported is None:
        return None, gpus, ()
    return imported.config, gpus, imported.warnings


def _imported(
    args: argparse.Namespace, problems: list[str], *, world_size: int | None = None
) -> Any:
    """`import_deepspeed` of `--config` (None, with a problem, when it cannot be read):
    read once with the default settings, then, when it has "auto" values, again with the
    settings the flags make of it as the base, so that those values (and the warning
    naming them) are the ones the job is written with."""
    from workbench.deepspeed import import_deepspeed

    try:
        imported = import_deepspeed(args.config, world_size=world_size)
        if imported.auto_keys:
            final, _ = config_from_args(
                args, fields=_CONFIG_FIELDS, base=imported.config, strip_text=True
            )
            if final is not None:  # a flag's problem is reported with the others later
                imported = import_deepspeed(args.config, world_size=world_size, base=final)
    except ValueError as exc:
        problems.append(f"--config {args.config}: {one_line(exc)}")
        return None
    return imported


def _export_raw(args: argparse.Namespace) -> dict[str, str]:
    """The text given for each of the export's own arguments, as a message shows it."""
    raw = {
        "gpus": args.gpus,
        "nodes": args.nodes,
        "hostfile": args.hostfile,
        "model": args.model,
        "out_dir": args.out,
        "steps": args.steps,
    }
    return {k: _as_typed(str(v)) for k, v in raw.items() if v is not None}


def _as_typed(text: str) -> str:
    """A path or number as typed ('' when empty), with characters a terminal should not
    get escaped (at most 200 characters then)."""
    if not text:
        return "''"
    return text if text.isprintable() else shown(text, limit=200)[1:-1]


def _offload_target(config: TrainConfig) -> str:
    """Where the offloaded states go: "CPU", "NVMe", or "CPU and NVMe"."""
    found = {str(plain_value(config.offload_optimizer)), str(plain_value(config.offload_params))}
    names = [name for key, name in (("cpu", "CPU"), ("nvme", "NVMe")) if key in found]
    return " and ".join(names) or "CPU"


def _replicas(config: TrainConfig, world: int) -> str:
    """The data-parallel ranks a batch is split over, as the report writes the factor:
    the world size, or "dp N" when tensor-parallel ranks share each batch."""
    tp = int(config.tp)
    return str(world) if tp <= 1 else f"dp {world // tp} ({world} ranks / tp {tp})"


def _report(result: ExportResult, config: TrainConfig, given_hostfile: bool = False) -> str:
    batch = config.effective_batch_size(result.world_size)
    lines = [
        f"wrote {result.out_dir}: " + ", ".join(Path(p).name for p in result.paths),
        result.description or describe(config, result.model),
        f"world size {result.world_size} ({result.gpus} GPU(s) x {result.nodes} node(s)): "
        f"train_batch_size {batch} = micro-batch {config.micro_batch} x grad-accum "
        f"{config.grad_accum} x {_replicas(config, result.world_size)}",
    ]
    e = result.estimate
    if e is not None:
        parts = [
            f"params {_size(e.params_bytes)}",
            f"grads {_size(e.grads_bytes)}",
            f"optimizer states {_size(e.optimizer_bytes)}",
        ]
        if e.activation_bytes is not None:
            parts.append(f"activations {_size(e.activation_bytes)}")
        line = f"estimated per GPU: {', '.join(parts)}; total {_size(e.total_bytes)}"
        if e.cpu_offload_bytes:
            line += f"; offloaded to {_offload_target(config)} {_size(e.cpu_offload_bytes)}"
        lines.append(line)
    lines += [
        f"run (in {result.out_dir}):",
        f"  {result.command}",
        f"  or: bash {shlex.quote(result.launch_path)}",
    ]
    if result.nodes == 1:
        if result.torchrun_command != result.command:  # an FSDP job runs under torchrun
            lines.append(f"  or: {result.torchrun_command}")
        how = (
            "--nodes M --hostfile FILE"
            if result.format == "deepspeed"
            else "--gpus G --nodes M (launch.sh on every node, no hostfile)"
        )
        lines.append(
            f"  several nodes: re-export with {how}; train_batch_size grows with the world "
            "size, and the job refuses to run on another world size than its export's"
        )
    elif result.multinode_torchrun_command != result.command:
        lines.append(f"  or, torchrun on every node: {result.multinode_torchrun_command}")
    if result.hostfile_path in result.paths and not given_hostfile:  # the template
        lines.append(f"  edit {result.hostfile_path}: one 'HOSTNAME slots=GPUS' line per node")
    return "\n".join(lines)


__all__ = ["FORMATS", "ExportError", "ExportResult", "add_parser"]
