"""`workbench plan`: every setup that fits a model on a cluster, ranked by predicted step
time (`workbench.planner`); pure math, no GPU needed.

    workbench plan --model llama-3-8b --gpu h100 --gpus-per-node 8 --seq-len 4096 \\
        --global-batch 256 [--nodes N] [--tokens 1T --price 2.5] [--top 10] [--json]

The model flags are `workbench estimate`'s (--model, --hf-config, --params with the shape
flags, --seq-len). A bad value is refused naming the flag, the value and what is allowed;
so is a model no setup fits (with the term that breaks the best one and by how much).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from workbench.cli import json_text
from workbench.inputs import typed

#: a negative number or count as typed: -1, -0.5, -1T, -4Mi, -2e12
_NEGATIVE_COUNT = re.compile(r"^-[0-9.,_]*[0-9](e[+-]?[0-9]+)? ?([kmgt]i|[kmbgt])?$", re.IGNORECASE)
_SHAPE = ("layers", "hidden", "heads", "vocab", "kv_heads", "ffn_hidden")


def add_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    # a count typed negative (--tokens -1T) is a value to refuse by name, not a flag: argparse
    # takes only "-1" and "-1.5" for numbers by itself
    parser._negative_number_matcher = _NEGATIVE_COUNT
    model = parser.add_argument_group("model (as `workbench estimate` takes it)")
    model.add_argument("--model", metavar="NAME", help="a preset, e.g. llama-3-8b")
    model.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json on disk")
    model.add_argument("--params", metavar="N", help="parameter count (7B, 1.5e9) with a shape")
    for name in _SHAPE:
        model.add_argument("--" + name.replace("_", "-"), metavar="N")
    model.add_argument("--seq-len", metavar="S", help="tokens a sample (the model's own)")
    hw = parser.add_argument_group("the cluster")
    hw.add_argument("--gpu", default="h100", help="a GPU of the catalog (h100)")
    hw.add_argument("--gpus", metavar="N", help="GPUs in all (nodes = N / --gpus-per-node)")
    hw.add_argument("--gpus-per-node", default=None, metavar="N", help="(8, or --gpus if fewer)")
    hw.add_argument("--nodes", default=None, metavar="N", help="(1, or from --gpus)")
    hw.add_argument("--intra-node-gbps", metavar="GB/s", help="per GPU per direction (catalog)")
    hw.add_argument("--inter-node-gbps", metavar="GB/s", help="per GPU per direction (catalog)")
    run = parser.add_argument_group("the run")
    run.add_argument("--global-batch", default=None, metavar="B", help="samples a step (256)")
    run.add_argument("--global-tokens", metavar="T", help="or tokens a step (e.g. 4Mi)")
    run.add_argument("--precision", metavar="P", help="pin one precision (e.g. bf16-true)")
    run.add_argument("--lora-rank", metavar="R", help="plan a LoRA fine-tune of rank R")
    run.add_argument("--headroom", metavar="F", help="fraction of GPU memory kept free (0)")
    run.add_argument("--tokens", metavar="T", help="tokens to train (e.g. 1T): time and cost")
    run.add_argument("--price", metavar="USD", help="price per GPU hour: the cost")
    run.add_argument(
        "--mfu",
        metavar="F",
        help="the share of the peak FLOP/s compute reaches (default: published runs on the GPU)",
    )
    run.add_argument("--efficiency", metavar="F", help="the same as --mfu (its older name)")
    run.add_argument(
        "--calibrate",
        metavar="LOG",
        nargs="?",
        const="",
        help="the efficiency measured from your steps of this model on this GPU: a Session's "
        "run folder or its log.jsonl, or a step record's JSON",
    )
    run.add_argument(
        "--nccl-tests",
        metavar="FILE",
        action="append",
        help="your cluster's network as nccl-tests measured it: the saved output of "
        "all_reduce_perf, all_gather_perf or reduce_scatter_perf over 2+ nodes (repeatable)",
    )
    run.add_argument(
        "--nccl-ib-defaults",
        action="store_true",
        help="your jobs run NCCL's default InfiniBand settings (no NCCL_IB_QPS_PER_CONNECTION=2, "
        "NCCL_IB_AR_THRESHOLD=0): collectives across nodes at 0.80 of NCCL's rates, as one "
        "cluster's rings measured without them",
    )
    run.add_argument(
        "--pin",
        metavar="K=V,...",
        help="plan only this layout: tp, pp, cp (context parallel), dp, engine, micro_batch, "
        "checkpointing (e.g. tp=8,pp=16,dp=8,engine=ddp)",
    )
    run.add_argument("--engines", metavar="LIST", help="comma-separated, e.g. zero3,full_shard")
    run.add_argument("--no-offload", action="store_true", help="leave CPU offload out")
    run.add_argument(
        "--attention", metavar="KERNEL", help="pin the kernel: sdpa (searched) or eager"
    )
    run.add_argument(
        "--optimizer", metavar="OPT", help="adamw (searched) or adam8bit (the plain loop)"
    )
    run.add_argument(
        "--pp-schedule",
        metavar="S",
        help="1f1b (default), gpipe, interleaved-1f1b, zero-bubble, or search",
    )
    run.add_argument("--virtual-stages", metavar="V", help="stages a rank (interleaved: 2)")
    run.add_argument("--compile", action="store_true", help="pin torch.compile")
    run.add_argument("--float8", action="store_true", help="pin float8 matmuls (Hopper)")
    run.add_argument(
        "--hsdp", action="store_true", help="pin HSDP (FSDP sharded in a node, replicated across)"
    )
    out = parser.add_argument_group("output")
    out.add_argument("--top", default="10", metavar="N", help="plans in the table (10)")
    out.add_argument("--json", action="store_true", help="every plan as JSON, best first")
    out.add_argument(
        "--probe",
        metavar="K",
        help="run the top K plans for a few steps here (GPUs, else 2 CPU ranks, the built-in "
        "GPT) and re-rank them by the measured step",
    )
    out.add_argument(
        "--export",
        metavar="DIR",
        help="write the best plan a job can carry (#1 where it can) into DIR, "
        "with the steps --tokens takes",
    )
    out.add_argument(
        "--export-model",
        metavar="SPEC",
        help="the module the job trains: pkg.module:function that builds your model, or a "
        "built-in name (needed with --export: a preset is a shape, not a model)",
    )
    out.add_argument(
        "--export-format",
        metavar="F",
        help="deepspeed, fsdp or lightning (default: deepspeed for ZeRO and DDP, fsdp else)",
    )
    return lambda args: run_plan(args, parser)


def _number(
    flag: str,
    text: str | None,
    kind: type,
    problems: list[str],
    low: float,
    high: float | None = None,
    *,
    below: bool = False,
    allowed: str = "",
) -> Any:
    """`text` read as a `kind` from `low` to `high` (below `high` when `below`), or None
    after adding a problem naming `flag`, the text as typed and the whole range (`allowed`,
    else "a number >= low")."""
    if text is None:
        return None
    try:  # ASCII digits only: int() and float() read other scripts' digits ("١٢" = 12)
        value = kind(text) if text.isascii() else None
    except ValueError:
        value = None
    over = high is not None and value is not None and (value >= high if below else value > high)
    if value is None or not math.isfinite(value) or value < low or over:
        what = "an integer" if kind is int else "a number"
        problems.append(f"{flag} {typed(text)}: must be {allowed or f'{what} >= {low:g}'}")
        return None
    return value


def _gbps(flag: str, text: str | None, problems: list[str]) -> Any:
    """A link's GB/s per GPU per direction, in the catalog's range (`MIN_GBPS`, `MAX_GBPS`)."""
    from workbench.planner.hardware import MAX_GBPS, MIN_GBPS

    allowed = f"a number of GB/s from {MIN_GBPS:g} to 10^{math.log10(MAX_GBPS):.0f}"
    return _number(flag, text, float, problems, MIN_GBPS, MAX_GBPS, allowed=allowed)


def _bounded(flag: str, text: str | None, problems: list[str], limit: str) -> Any:
    """A number in the estimator's range `LIMITS[limit]` (the efficiency of --mfu and
    --efficiency, the --price), or None after adding a problem naming `flag`, the text as
    typed and the range, as `workbench estimate` says it."""
    from workbench.estimate.limits import LIMITS, check_number

    value = _number(flag, text, float, problems, -math.inf, allowed=LIMITS[limit].allowed)
    if value is None:
        return None
    number, problem = check_number(limit, value, LIMITS[limit])
    if problem is not None:
        problems.append(f"{flag} {typed(str(text))}: {problem}")
    return number


def _or(text: str | None, default: str) -> str:
    """A flag's text, or its default when the flag was left out (an empty value stays
    and is refused)."""
    return default if text is None else text


#: plan()'s fields as this command's flags, for its errors
FLAGS = {
    "gpu": "--gpu",
    "gpus_per_node": "--gpus-per-node",
    "nodes": "--nodes",
    "global_batch": "--global-batch",
    "global_tokens": "--global-tokens",
    "seq_len": "--seq-len",
    "efficiency": "--efficiency",
    "mfu": "--mfu",
    "calibrate": "--calibrate",
    "nccl_tests": "--nccl-tests",
    "pin": "--pin",
    "headroom": "--headroom",
    "lora_rank": "--lora-rank",
    "precision": "--precision",
    "attention": "--attention",
    "optimizer": "--optimizer",
    "pp_schedule": "--pp-schedule",
    "virtual_stages": "--virtual-stages",
    "engines": "--engines",
    "intra_node_gbps": "--intra-node-gbps",
    "inter_node_gbps": "--inter-node-gbps",
    "tokens": "--tokens",
    "price_per_gpu_hour": "--price",
    "gpus": "--gpus",
}


#: the model's fields as this command's flags, named bare (`layers=` with no value) in
#: plan()'s errors: a value after them is another module's figure (`layers=32`), left as is
_MODEL_FLAGS = {
    "model": "--model",
    "hf_config": "--hf-config",
    "n_params": "--params",
    **{name: "--" + name.replace("_", "-") for name in _SHAPE},
}
#: plan()'s switches as this command's flags (`float8=True` is `--float8`)
_SWITCHES = {
    "compile": "--compile",
    "float8": "--float8",
    "hsdp": "--hsdp",
    "nccl_ib_defaults": "--nccl-ib-defaults",
}


def _as_flag(message: str, args: argparse.Namespace | None = None) -> str:
    """A planner error said with the flags: each field it names with a value
    (`efficiency=0.0: ...`, `... not nodes=3`) as the flag (`--efficiency 0.0: ...`), a
    field named bare (`more GPUs (nodes=)`, `layers=, hidden=, heads= with n_params=`) as
    the flag alone, a switch (`float8=True`) as the flag, and an error about the model
    (`model: ...`) under the model flag given (`--params 7B: ...`)."""
    message = re.sub(r"^pin (?=[a-z_ ]+)", "--pin ", message)  # "pin tp=3: ..." (one pin)
    if message.startswith("model: "):
        message = _model_given(args) + message[len("model") :]
    message = re.sub(
        r"\b([a-z_0-9]+)=True\b",
        lambda m: _SWITCHES.get(m.group(1), m[0]),
        message,
    )
    bare = {**FLAGS, **_MODEL_FLAGS}
    message = re.sub(r"\b([a-z_0-9]+)=(?=[,;)\s]|$)", lambda m: bare.get(m.group(1), m[0]), message)
    return re.sub(
        r"\b([a-z_]+)=", lambda m: FLAGS[m.group(1)] + " " if m.group(1) in FLAGS else m[0], message
    )


def _model_given(args: argparse.Namespace | None) -> str:
    """The model flag given with its value as typed (`--params 7B`), or `--model`."""
    for flag, dest in (("--model", "model"), ("--hf-config", "hf_config"), ("--params", "params")):
        value = getattr(args, dest, None) if args is not None else None
        if value is not None:
            return f"{flag} {typed(str(value))}"
    return "--model"


def _estimate_problems(exc: ValueError, args: argparse.Namespace) -> list[str] | None:
    """The estimator's problems behind a plan() error, one line each with the flags and the
    values as typed (as `workbench estimate` says them); None when it is not one."""
    from workbench.cli.estimate import estimate_problem_lines
    from workbench.estimate import EstimateInputError

    cause = exc if isinstance(exc, EstimateInputError) else exc.__cause__
    if not isinstance(cause, EstimateInputError):
        return None
    return estimate_problem_lines(cause, args)


def run_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from workbench.estimate import parse_count
    from workbench.planner import plan

    problems: list[str] = []
    kw: dict[str, Any] = {
        "model": args.model,
        "hf_config": args.hf_config,
        "n_params": args.params,
        "gpu": args.gpu,
        # None: plan()'s defaults (8 a node, or --gpus when fewer; the nodes --gpus makes)
        "gpus": _number("--gpus", args.gpus, int, problems, 1),
        "gpus_per_node": _number("--gpus-per-node", args.gpus_per_node, int, problems, 1),
        "nodes": _number("--nodes", args.nodes, int, problems, 1),
        "global_batch": _number("--global-batch", _or(args.global_batch, "256"), int, problems, 1),
        "intra_node_gbps": _gbps("--intra-node-gbps", args.intra_node_gbps, problems),
        "inter_node_gbps": _gbps("--inter-node-gbps", args.inter_node_gbps, problems),
        "price_per_gpu_hour": _bounded("--price", args.price, problems, "price_per_gpu_hour"),
        "offload": not args.no_offload,
    }
    for flag, given in (("--model", args.model), ("--hf-config", args.hf_config)):
        if given is not None and args.params is not None:
            problems.append(
                f"{flag} {typed(given)} and --params {typed(args.params)}: give one (the model "
                "counts its own parameters; the shape flags change its shape)"
            )
    if args.global_tokens is not None:
        if args.global_batch is not None:
            problems.append("--global-tokens: give it or --global-batch, not both")
        count = parse_count(args.global_tokens)
        if not count:
            problems.append(
                f"--global-tokens {typed(args.global_tokens)}: must be a count > 0, e.g. 4Mi"
            )
        else:
            kw["global_tokens"] = count
    if args.precision is not None:
        kw["precision"] = args.precision
    if args.attention is not None:
        kw["attention"] = args.attention
    if args.optimizer is not None:
        kw["optimizer"] = args.optimizer
    if args.pp_schedule is not None:
        kw["pp_schedule"] = args.pp_schedule
    if args.virtual_stages is not None:
        kw["virtual_stages"] = _number("--virtual-stages", args.virtual_stages, int, problems, 1)
    kw.update(compile=args.compile, float8=args.float8, hsdp=args.hsdp)
    if args.lora_rank is not None:
        kw["lora_rank"] = _number("--lora-rank", args.lora_rank, int, problems, 1)
    if args.headroom is not None:
        kw["headroom"] = _number(
            "--headroom",
            args.headroom,
            float,
            problems,
            0,
            1,
            below=True,
            allowed="a number >= 0 and < 1",
        )
    top = _number("--top", args.top, int, problems, 1)
    probe = _number("--probe", args.probe, int, problems, 1)
    if probe is not None and probe > 20:
        problems.append(f"--probe {probe}: must be an integer from 1 to 20")
    for name in ("efficiency", "mfu"):
        if getattr(args, name) is not None:
            kw[name] = _bounded("--" + name, getattr(args, name), problems, "mfu")
    if args.calibrate is not None:
        if not args.calibrate:
            from workbench.planner.efficiency import WHERE_CLI

            problems.append(f"--calibrate: needs a measured step (a run's log.jsonl); {WHERE_CLI}")
        else:
            kw["calibrate"] = args.calibrate
    if args.nccl_tests is not None:
        kw["nccl_tests"] = args.nccl_tests
    if args.nccl_ib_defaults:
        kw["nccl_ib_defaults"] = True
    if args.pin is not None:
        kw["pin"] = args.pin
    if args.seq_len is not None:
        kw["seq_len"] = _number("--seq-len", args.seq_len, int, problems, 1)
    for name in _SHAPE:
        text = getattr(args, name)
        if text is not None:
            kw[name] = _number("--" + name.replace("_", "-"), text, int, problems, 1)
    if args.engines is not None:
        kw["engines"] = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    if args.tokens is not None:
        from workbench.estimate.limits import LIMITS, check_number

        count = parse_count(args.tokens)
        too_many = check_number("tokens", count, LIMITS["tokens"])[1] if count else None
        if not count:
            allowed = LIMITS["tokens"].allowed
            problems.append(f"--tokens {typed(args.tokens)}: must be a count, {allowed} (e.g. 1T)")
        elif too_many is not None:  # said here, with the count as typed
            problems.append(f"--tokens {typed(args.tokens)}: {too_many}")
        else:
            kw["tokens"] = float(count)
    if args.export is not None and not args.export_model:
        problems.append(
            f"--export {typed(args.export)}: give --export-model SPEC, the function that builds "
            "the model the job trains (pkg.module:function) or a built-in name; a preset or "
            "a parameter count is a shape the planner ranks, not a model a job can build"
        )
    formats = ("deepspeed", "fsdp", "lightning")
    if args.export_format is not None and args.export_format not in formats:
        problems.append(
            f"--export-format {typed(args.export_format)}: must be one of {', '.join(formats)}"
        )
    if problems:
        for p in problems:
            print(f"{parser.prog}: error: {p}", file=sys.stderr)
        return 2
    from workbench.planner.checks import GlobalTokensError
    from workbench.planner.efficiency import CalibrateError
    from workbench.planner.nccl_tests import NcclTestsError

    try:
        result = plan(**kw)
    except (CalibrateError, NcclTestsError) as exc:
        print(f"{parser.prog}: error: {exc.cli_text()}", file=sys.stderr)
        return 2
    except GlobalTokensError as exc:
        print(f"{parser.prog}: error: {_global_tokens_line(exc, args.global_tokens)}",
              file=sys.stderr)  # fmt: skip
        return 2
    except ValueError as exc:
        lines = _estimate_problems(exc, args) or [_as_flag(str(exc), args)]
        for line in lines:
            print(f"{parser.prog}: error: {line}", file=sys.stderr)
        return 2
    probes = None
    if probe:
        from workbench.train.measure.plan_probe import probe_plans

        probes = probe_plans(result, probe)
    exported = None
    if args.export is not None:
        exported = _export(result, args, parser)
    if args.json:
        got = result.to_dict()
        if exported is not None:
            got["exported"] = exported
        if probes is not None:
            from workbench.train.measure.plan_probe import rerank

            got["probes"] = [p.to_dict() for p in rerank(probes)]
        try:
            text = json_text(got)
        except ValueError as exc:
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return 2
        print(text)
    else:
        print(result.text(top=top))
        if probes is not None:
            from workbench.train.measure.plan_probe import text

            print("\n" + text(probes))
        if exported is not None:
            _print_exported(exported)
    return 0 if exported is not None or args.export is None else 2


def _print_exported(exported: dict[str, Any]) -> None:
    """Which plan was written where, why the better ones were not, and its steps."""
    rank = exported["rank"]
    print(f"\nPlan #{rank} written to {exported['out_dir']} ({exported['format']}): "
          f"{exported['command']}")  # fmt: skip
    if rank > 1:
        print(f"  the best plan that can be exported; not {exported['skipped'][0]}")
        if rank > 2:
            print(f"  nor #2 to #{rank - 1} (--json lists why in exported.skipped)")
    print(f"  {exported['steps_note']}")


def _global_tokens_line(exc: Any, text: str | None) -> str:
    """--global-tokens that is not a whole number of sequences, said with the count as typed
    and, for a decimal suffix (4M), the binary spelling (4Mi) where it is a whole number."""
    from workbench.estimate import parse_count

    line = f"--global-tokens {typed(str(text))}: {_as_flag(exc.reason)}"
    m = re.fullmatch(r"\s*(.*[0-9]) ?([kmgtKMGT])\s*", str(text))
    binary = parse_count(f"{m[1]}{m[2]}i") if m else None
    if m and binary and binary % exc.seq_len == 0:
        line += f"; or {m[1]}{m[2]}i = {binary:,} ({binary // exc.seq_len} sequences)"
    return line


def _steps_of(result: Any, best: Any) -> tuple[int | None, str]:
    """The optimizer steps that train --tokens with `best` (tokens / the tokens a step,
    rounded up) and a line saying so; (None, why) when no tokens were given or the count is
    past TrainConfig's total_steps range."""
    if result.tokens is None:
        return None, "steps: the job's default (give --tokens to carry the run's length)"
    per_step = best.tokens_per_step
    steps = max(1, math.ceil(result.tokens / per_step))
    said = f"{result.tokens:,.0f} tokens / {per_step:,} tokens a step, rounded up"
    if steps > 10**12:
        return None, f"steps: the job's default: {said} = {steps:,} is past 10^12 steps"
    return steps, f"steps: {steps:,} ({said})"


def _export(result: Any, args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """The best plan that can be exported, written as a job (`workbench.export.export_job`):
    what was written, with why each better plan could not be; None after printing why no
    plan can be."""
    from workbench.config import ConfigError, TrainConfig
    from workbench.export import check_export, export_job

    where = {"gpus": result.cluster.gpus_per_node, "nodes": result.cluster.nodes,
             "out_dir": args.export, "model": args.export_model}  # fmt: skip
    fmt0 = args.export_format or "deepspeed"
    general = check_export(None, format=fmt0, **where)  # nothing about the plans: say it once
    if general:
        for problem in general:
            print(f"{parser.prog}: error: --export {typed(args.export)}: {problem}",
                  file=sys.stderr)  # fmt: skip
        return None
    skipped: list[str] = []
    for rank, p in enumerate(result.plans, 1):
        fmt = args.export_format or ("fsdp" if "fsdp" in p.settings or p.tp > 1 else "deepspeed")
        steps, steps_line = _steps_of(result, p)
        why = ""
        if p.extras:
            why = f"{', '.join(p.extras)}: planner-only choices no exported job carries"
        else:
            try:
                settings = dict(p.settings) | ({"total_steps": steps} if steps else {})
                config = TrainConfig(**settings)
            except (ConfigError, ValueError) as exc:
                why = str(exc).splitlines()[0]
            else:
                problems = check_export(config, format=fmt, steps=steps, **where)
                why = str(problems[0]) if problems else ""
        if why:
            skipped.append(f"#{rank} ({p.label()}): {why}")
            continue
        job = export_job(config, format=fmt, steps=steps, **where)
        return {"out_dir": job.out_dir, "format": fmt, "command": job.command,
                "plan": p.label(), "rank": rank, "steps": steps, "steps_note": steps_line,
                "skipped": skipped}  # fmt: skip
    print(f"{parser.prog}: error: --export {typed(args.export)}: none of the "
          f"{len(result.plans)} plans can be exported; {skipped[0]}", file=sys.stderr)  # fmt: skip
    return None
