"""`workbench estimate`: per-GPU memory, time and cost of a training setup (pure math; this
module imports no torch, deepspeed or ipywidgets).

Every bad input, however hostile, ends in one line on stderr and exit status 2: the flag,
the value as typed (cut when long, escaped when not printable) and what is allowed; the
ranges are those of `workbench.estimate.limits`. Numbers are read as written: digits may be
grouped by three (`1,000,000`, `1_000_000`) but `1,2,3` is an error, never 123."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from workbench.cli import Runner, json_text
from workbench.cli.estimate_report import (
    gpu_table,
    model_table,
    offload_devices,
    report,
    stages_table,
)
from workbench.estimate.schema import CLI_GROUPS, FIELDS, SCHEMA, EstimateField
from workbench.inputs import shown, typed

_EMBEDDINGS = {"tied": True, "untied": False}
_REDUCE = {"fp32": True, "compute": False}
#: An offload device as a switch of the estimate (NVMe and CPU free the GPU alike).
_OFFLOAD = {"none": False, "cpu": True, "nvme": True}
_UNITS = {"gib": (1 << 30, "GiB"), "gb": (10**9, "GB")}
#: Where the parsed arguments keep the spelling each flag was given as (an old alias).
_SPELLED = "_spelled_as"
#: Where they keep the warnings of --deepspeed-config's import ("auto" values filled).
_DS_WARNINGS = "_deepspeed_warnings"
#: Where they keep the offload devices --deepspeed-config names.
_DS_OFFLOAD = "_deepspeed_offload"
#: Where they keep every spelling a flag with an old alias was given as, with its value
#: (a bare flag's value None): an old spelling and its new one that disagree are refused.
_GIVEN_AS = "_given_as"


class _Spelled(argparse.Action):
    """Stores the flag's value and the spelling it was given as, so an error names the
    flag as the user typed it (`--checkpointing`, the old spelling of
    `--activation-checkpointing`)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        spelled = dict(getattr(namespace, _SPELLED, None) or {})
        spelled[self.dest] = option_string
        setattr(namespace, _SPELLED, spelled)
        given = dict(getattr(namespace, _GIVEN_AS, None) or {})
        bare = self.nargs == "?" and values is self.const  # `--activation-checkpointing`
        given[self.dest] = {**given.get(self.dest, {}), option_string: None if bare else values}
        setattr(namespace, _GIVEN_AS, given)


def _setting_help(field: EstimateField) -> str:
    """The help of a flag shared with TrainConfig: the setting's own (`Setting.help`), with
    what it accepts and the estimate's default."""
    from workbench.config import SETTINGS, setting_choices

    assert field.config_field is not None
    spec = SETTINGS[field.config_field]
    if field.read == "offload":
        accepts = ", ".join(setting_choices(field.config_field))
        return f"{accepts} (none); {spec.help}; bare: cpu"
    if spec.kind == "choice":
        return f"{', '.join(map(str, field.choices))} ({field.default}); {spec.help}"
    if spec.kind == "bool":
        return spec.help
    return f"{spec.help} ({field.default})"


def _add_flag(group: Any, field: EstimateField, flag: str) -> None:
    """Add `field`'s flag (declared in `workbench.estimate.schema`) to `group`: text,
    default None (the estimator's default), read later by `_estimate_options`."""
    text = field.help or (_setting_help(field) if field.config_field else None)
    names = (flag, *field.aliases)
    if field.aliases and text is not None:
        old = ", ".join(field.aliases)
        text += f"; {old}: the old spelling, still accepted (deprecated)"
    kw: dict[str, Any] = {"default": None, "help": text}
    if field.read in ("switch", "nodrop"):
        group.add_argument(*names, action="store_true", **kw)
    elif field.read in ("offload", "recompute"):
        const = "cpu" if field.read == "offload" else "full"
        action = _Spelled if field.aliases else "store"
        metavar = field.cli_metavar
        group.add_argument(*names, nargs="?", const=const, metavar=metavar, action=action, **kw)
    else:
        action = _Spelled if field.aliases else "store"
        group.add_argument(*names, metavar=field.cli_metavar, action=action, **kw)


def add_parser(parser: argparse.ArgumentParser) -> Runner:
    """Arguments of `workbench estimate`; returns its runner. The estimator's flags are
    made from `workbench.estimate.schema` (a flag shared with TrainConfig is the setting's
    own: the same name, metavar and meaning as in export, launch and ladder; the
    estimate's defaults)."""
    groups = {key: parser.add_argument_group(title) for key, title in CLI_GROUPS.items()}
    for field in FIELDS:
        flag = field.cli_flag
        if flag is not None:
            _add_flag(groups[field.cli], field, flag)
    out = parser.add_argument_group("output")
    out.add_argument("--units", default="gib", help="gib (2^30 bytes, default) or gb (1e9 bytes)")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--compare-stages", action="store_true", help="ZeRO stages 0-3 side by side")
    out.add_argument(
        "--simulate",
        action="store_true",
        help="also run a dry run of the model (--hf-config, a transformers --model preset or "
        "a shape): real training steps on fake "
        "tensors (nothing allocated), its measured peak beside the formula's",
    )
    out.add_argument(
        "--timeline",
        metavar="FILE",
        help="with --simulate: write the picture of the step's memory over time (allocated "
        "and reserved, stacked by category, the peak and its ten largest tensors) to FILE, "
        "a .png or an .html page",
    )
    out.add_argument(
        "--snapshot",
        metavar="FILE",
        help="with --simulate: write the dry run's allocations as a memory snapshot pickle "
        "for torch's memory viewer (https://pytorch.org/memory_viz, "
        "torch.cuda.memory._memory_viz), to set beside a real GPU's snapshot",
    )
    out.add_argument("--list-gpus", action="store_true", help="list the GPU catalog and exit")
    out.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    return lambda args: run_estimate(args, parser)


_GROUPED_INT = re.compile(r"[+-]?[0-9]{1,3}(?:(?P<sep>[,_])[0-9]{3})(?:(?P=sep)[0-9]{3})*")


def _read(text: str, kind: str) -> Any:
    """Flag text -> number. Text that is not a number of that kind is passed on as it is:
    `estimate_memory` then reports it together with every other problem. Thousands
    separators are read only where they group digits by three."""
    text = text.strip()
    if not text.isascii():  # int() and float() read other scripts' digits too ("١٢" = 12)
        return text
    if _GROUPED_INT.fullmatch(text):
        text = text.replace(",", "").replace("_", "")
    elif "," in text or "_" in text:
        return text  # "1,2,3" or "1_0": not a number (Python would read "1_0" as 10)
    try:
        if kind == "float":
            return float(text)
        try:
            return int(text)
        except ValueError:
            f = float(text)
            if math.isfinite(f) and f.is_integer():
                return int(f)
    except ValueError:
        pass
    return text


def _flag(field: str, args: argparse.Namespace | None = None) -> str:
    """The flag of estimator keyword `field` as given in `args` (an old spelling too);
    the keyword itself when it has no flag."""
    known = SCHEMA.get(field)
    flag = known.cli_flag if known is not None else None
    if flag is None:
        return field
    spelled = (getattr(args, _SPELLED, None) or {}) if args is not None else {}
    return str(spelled.get(_dest(flag), flag))


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _arg(args: argparse.Namespace, flag: str) -> Any:
    return getattr(args, _dest(flag), None)


def _estimate_options(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """(keyword arguments for estimate_memory, problems only the CLI knows about). A flag
    not given leaves its keyword out: the estimator's default."""
    options: dict[str, Any] = {}
    problems = []
    for f in FIELDS:
        flag = f.cli_flag
        value = None if flag is None else _arg(args, flag)
        if flag is None or value is None:
            continue
        field, kind, shown_flag = f.name, f.read, _flag(f.name, args)
        if kind == "switch":
            options[field] = True
        elif kind == "nodrop":
            options[field] = False
        elif kind == "reduce":
            options[field] = _REDUCE.get(value.strip().lower())
            if options[field] is None:
                problems.append(f"{shown_flag} {typed(value)}: must be fp32 or compute")
                options[field] = True
        elif kind == "tied":
            options[field] = _EMBEDDINGS.get(value.strip().lower())
            if options[field] is None:
                problems.append(f"{shown_flag} {typed(value)}: must be tied or untied")
        elif kind == "offload":  # a device, as in every command; the estimate's is a switch
            device = value.strip().lower()
            options[field] = _OFFLOAD.get(device, False)
            if device not in _OFFLOAD:
                problems.append(f"{shown_flag} {typed(value)}: must be one of none, cpu, nvme")
        elif kind == "kernel":  # TrainConfig's "model": the model's own kernel
            allowed = ("model", *f.choices)
            if value.strip().lower() not in allowed:
                problems.append(f"{shown_flag} {typed(value)}: must be one of {', '.join(allowed)}")
            elif value.strip().lower() != "model":
                options[field] = value
        elif kind in ("str", "count", "recompute"):
            options[field] = value
        else:
            options[field] = _read(value, kind)
    problems += _deepspeed_setup(args, options) + _conflicts(args)
    if options.get("zero_stage") is None:
        options["zero_stage"] = 0
    if args.zero is not None and args.compare_stages:
        problems.append(
            f"--zero {typed(args.zero)}: leave it out with --compare-stages (stages 0-3)"
        )
    fsdp = _arg(args, _flag("fsdp"))
    if fsdp is not None and fsdp.strip().lower() != "off" and args.compare_stages:
        options.pop("fsdp", None)  # one message: the stages are not estimated under FSDP
        problems.append(
            f"{_flag('fsdp', args)} {typed(fsdp)}: leave it out with --compare-stages (it "
            "compares DeepSpeed's ZeRO stages 0-3)"
        )
    if args.units.strip().lower() not in _UNITS:
        problems.append(f"--units {typed(args.units)}: must be gib or gb")
    return options, problems


def _conflicts(args: argparse.Namespace) -> list[str]:
    """Flags that say two things: a preset or a config.json with --params (the model
    counts its own parameters), and a flag's old spelling beside its new one with another
    value (`--checkpointing selective --activation-checkpointing`)."""
    problems = [
        f"{_flag(source, args)} {typed(_arg(args, _flag(source, args)))} and "
        f"{_flag('n_params', args)} {typed(args.params)}: give one (the model counts its own "
        "parameters; the shape flags change its shape)"
        for source in ("model", "hf_config")
        if args.params is not None and _arg(args, _flag(source, args)) is not None
    ]
    for dest, spellings in (getattr(args, _GIVEN_AS, None) or {}).items():
        read = {flag: _same(value) for flag, value in spellings.items()}
        if len(spellings) > 1 and len(set(read.values())) > 1:
            said = [
                f"{f} {typed(v)}" if v is not None else f"{f} (bare: full)"
                for f, v in spellings.items()
            ]
            field = next(f for f in FIELDS if f.cli_flag is not None and _dest(f.cli_flag) == dest)
            problems.append(
                f"{' and '.join(said)}: one setting given two values ({', '.join(field.aliases)}: "
                f"the old spelling of {field.cli_flag}); give one"
            )
    return problems


def _same(value: str | None) -> Any:
    """A flag's value as compared between its spellings: a number read as a number, text
    without case or spaces, a bare flag as its constant."""
    if value is None:
        return "full"  # the recomputation flags' bare value (the only bare flags aliased)
    got = _read(value, "float")
    return got.strip().lower() if isinstance(got, str) else got


def _deepspeed_setup(args: argparse.Namespace, options: dict[str, Any]) -> list[str]:
    """Fill the options no flag gave from `--deepspeed-config` (read by
    `workbench.deepspeed.import_deepspeed`, which runs nothing from the file); returns
    its problems, each naming the flag and the key."""
    path = args.deepspeed_config
    if path is None:
        return []
    from workbench.deepspeed import import_deepspeed

    gpus = options.get("gpus")
    world = gpus if isinstance(gpus, int) and args.gpus not in (None, "1") else None
    try:
        # DeepSpeed logs to stdout when it is first imported: keep --json's stdout clean
        with contextlib.redirect_stdout(sys.stderr):
            imported = import_deepspeed(path, world_size=world)
    except ValueError as exc:
        options["deepspeed_config"] = None  # one message for the file, not two
        return [f"--deepspeed-config {typed(path)}: {' '.join(str(exc).split())}"]
    # "auto" values filled and keys not modelled: said once, as `workbench export` says them
    setattr(args, _DS_WARNINGS, list(imported.warnings))
    cfg = imported.config
    setattr(
        args,
        _DS_OFFLOAD,
        {
            "offload_optimizer": str(cfg.offload_optimizer),
            "offload_params": str(cfg.offload_params),
        },
    )
    given = {
        "precision": str(cfg.precision),
        "optimizer": str(cfg.optimizer),
        "zero_stage": int(cfg.zero_stage),
        "micro_batch": int(cfg.micro_batch),
        "grad_accum": int(cfg.grad_accum),
        "offload_optimizer": str(cfg.offload_optimizer) != "none",
        "offload_params": str(cfg.offload_params) != "none",
    }
    flags = {
        "precision": args.precision,
        "optimizer": args.optimizer,
        "zero_stage": args.zero,
        "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum,
        "offload_optimizer": args.offload_optimizer,
        "offload_params": args.offload_params,
    }
    for field, value in given.items():
        if flags[field] is None:
            options[field] = value
    if args.gpus in (None, "1") and imported.world_size > 1:
        options["gpus"] = imported.world_size
    return []


def _asked_devices(args: argparse.Namespace) -> dict[str, str | None]:
    """The offload device each of --offload-optimizer and --offload-params names (a bare
    flag: cpu), else the one --deepspeed-config names; None where neither names one."""
    from_file = getattr(args, _DS_OFFLOAD, None) or {}
    asked: dict[str, str | None] = {}
    for name in ("offload_optimizer", "offload_params"):
        given = _arg(args, _flag(name))
        device = given.strip().lower() if isinstance(given, str) else from_file.get(name)
        asked[name] = device if device in ("cpu", "nvme") else None
    return asked


def _with_devices(e: Any, asked: dict[str, str | None], args: argparse.Namespace) -> dict[str, Any]:
    """Estimate `e` as JSON (`to_dict`), with the device each offload goes to
    (`offload_optimizer_device`, `offload_params_device`: "cpu", "nvme" or None; given
    when either offloads) and the notes its report prints (`notes`, given when there are
    any): an estimate without offload or notes is `to_dict()` as it is."""
    got: dict[str, Any] = dict(e.to_dict())
    devices = offload_devices(e, asked)
    if any(devices.values()):
        got["offload_optimizer_device"] = devices["offload_optimizer"]
        got["offload_params_device"] = devices["offload_params"]
    notes = _notes(e, args)
    if notes:
        got["notes"] = notes
    return got


#: The precisions that train fp32 weights (autocast computes in 16 bits over them).
_FP32_WEIGHTS = ("fp32", "amp-bf16", "amp-fp16")


def _notes(e: Any, args: argparse.Namespace, options: dict[str, Any] | None = None) -> list[str]:
    """What the report says beside the figures: DeepSpeed's own layout where it holds more
    than the ZeRO paper's accounting (`_layout_note`), and a config.json saved in a 16-bit
    dtype estimated at a precision that trains fp32 weights (the precision decides, as in
    the dry run, which casts them), and what the shape assumed of an MLP activation
    function the config names and the estimator does not know."""
    notes = _layout_note(e, options) if options is not None else []
    activation = [e.activation_function_note] if e.activation_function_note else []
    shape = [e.shape_note] if e.shape_note else []
    return notes + _dtype_note(e, args) + activation + shape


def _layout_note(e: Any, options: dict[str, Any]) -> list[str]:
    """A DeepSpeed setup counted with the ZeRO paper's accounting (the estimator's default):
    what DeepSpeed's engine holds where its layout differs by more than 1% of the peak (ZeRO
    1/2 keep an fp32 master partition even in fp32 training, stage 0's 16-bit modes a whole
    fp32 master copy, stage 3 a reduce bucket beside its gradient partition; padding:
    `workbench.estimate.deepspeed_layout`), which the dry run's formula column and a
    Session's prediction count."""
    runs_deepspeed = e.fsdp == "off" and (e.zero_stage >= 1 or e.precision in ("fp16", "bf16"))
    if e.accounting != "paper" or not runs_deepspeed:
        return []
    from workbench.estimate import estimate_memory

    try:
        engine = estimate_memory(**{**options, "accounting": "deepspeed"})
    except ValueError:
        return []
    states = e.params_bytes + e.grads_bytes + e.optimizer_bytes
    engine_states = engine.params_bytes + engine.grads_bytes + engine.optimizer_bytes
    more = engine.peak_bytes - e.peak_bytes
    if abs(more) <= 0.01 * max(1, e.peak_bytes):
        return []
    gib = 2**30
    return [
        f"these figures count model states as the ZeRO paper does; DeepSpeed's engine lays "
        f"them out otherwise (docs/deepspeed.md: ZeRO 1/2 keep an fp32 master partition even "
        f"in fp32 training, stage 0's 16-bit modes a whole fp32 master copy, stage 3 a "
        f"reduce bucket beside its gradients): model states {engine_states / gib:.2f} GiB "
        f"(here {states / gib:.2f}), peak of a step {engine.peak_bytes / gib:.2f} GiB "
        f"(here {e.peak_bytes / gib:.2f}); a Session's prediction and the dry run count "
        "DeepSpeed's"
    ]


def _dtype_note(e: Any, args: argparse.Namespace) -> list[str]:
    if args.hf_config is None or e.precision not in _FP32_WEIGHTS:
        return []
    from workbench.estimate.hf_config import config_dtype, load_config

    config, _, problem = load_config(args.hf_config, "hf_config")
    dtype, _ = config_dtype(config) if problem is None and config is not None else (None, None)
    if dtype is None or dtype in ("float32", "float64"):
        return []
    return [
        f"the config.json names {dtype} weights; {_flag('precision', args)} {e.precision} "
        f"trains fp32 weights, so the estimate counts fp32 (the precision decides: "
        f"{_flag('precision', args)} bf16-true trains bf16 weights, bf16 or fp16 DeepSpeed's "
        "16-bit weights over an fp32 master copy)"
    ]


def estimate_problem_lines(exc: ValueError, args: argparse.Namespace) -> list[str]:
    """The estimator's problems with flag names and the values as typed (`workbench plan`
    says them so too)."""
    from workbench.estimate import EstimateInputError

    if not isinstance(exc, EstimateInputError):
        return [" ".join(str(exc).split())]
    lines = []

    def name(field: str) -> str:
        return _flag(field, args)

    for p in exc.problems:
        known = SCHEMA.get(p.field)
        flag = (known.cli_flag if known is not None else None) or p.field
        kind = known.read if known is not None else ""
        bare = kind == "offload" and _arg(args, flag) in (None, "cpu")
        if kind == "switch" or bare:  # a switch (or a bare offload flag): no value to show
            lines.append(p.render(name, value_text="", sep=""))
        else:
            raw = _arg(args, flag)
            text = p.render(name, sep=" ") if raw is None else None
            lines.append(text or p.render(name, value_text=typed(str(raw)), sep=" "))
    return lines


def run_estimate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench estimate` on parsed arguments; returns the exit status."""
    from workbench.estimate import compare_stages, estimate_memory

    if args.list_gpus:
        print(gpu_table(as_json=args.json))
        return 0
    if args.list_models:
        print(model_table(as_json=args.json))
        return 0
    options, problems = _estimate_options(args)
    for warning in getattr(args, _DS_WARNINGS, None) or ():
        said = f"{_flag('deepspeed_config', args)} {typed(args.deepspeed_config)}"
        print(f"workbench estimate: warning: {said}: {' '.join(warning.split())}", file=sys.stderr)
    try:
        if args.compare_stages:
            options.pop("zero_stage", None)
            stages = compare_stages(**options)
        else:
            stages = (estimate_memory(**options),)
    except ValueError as exc:
        parser.error("; ".join(estimate_problem_lines(exc, args) + problems))
    if problems:
        parser.error("; ".join(problems))
    problems += _picture_problems(args)
    if problems:
        parser.error("; ".join(problems))
    unit_bytes, unit_name = _UNITS[args.units.strip().lower()]
    if args.simulate:
        return _simulate(args, parser, stages[0], unit_bytes, unit_name)
    if args.json:
        asked = _asked_devices(args)
        got = (
            {"stages": [_with_devices(e, asked, args) for e in stages]}
            if args.compare_stages
            else None
        )
        try:
            print(json_text(got if got is not None else _with_devices(stages[0], asked, args)))
        except ValueError as exc:
            parser.error(str(exc))
    elif args.compare_stages:
        print(stages_table(stages, unit_bytes, unit_name, _asked_devices(args)))
    else:
        print(
            report(
                stages[0],
                unit_bytes,
                unit_name,
                _asked_devices(args),
                _notes(stages[0], args, options),
            )
        )
    return 0


def _simulate(
    args: argparse.Namespace, parser: argparse.ArgumentParser, e: Any, unit: int, name: str
) -> int:
    """`--simulate`: the dry run of the model with the estimate's settings: the
    --hf-config model, or the transformers model of a --model preset or a shape (its
    config.json made by `workbench.train.dry_run.fake.shape_config`)."""
    from workbench.train.dry_run.fake import CONTEXT_KEYS, shape_config

    problems = []
    source: Any = args.hf_config
    options, _ = _estimate_options(args)
    problems += _not_simulated(options, args)
    if source is None:
        source, missing = shape_config(options)
        if source is None:
            what = {
                "model": f"{_flag('model', args)} PRESET (a transformers family: gpt2, llama, "
                "mistral, mixtral, qwen, pythia)",
                "hf_config": f"{_flag('hf_config', args)} FILE",
                "shape": f"a shape ({_flag('layers', args)}, {_flag('hidden', args)}, "
                f"{_flag('heads', args)})",
            }
            given = options.get("n_params") is not None and options.get("model") is None
            why = (
                f"{_flag('n_params', args)} gives a count, not a model to build"
                if given
                else str(missing)
            )
            problems.append(
                f"--simulate: needs a model to build on fake tensors: {what['model']}, "
                f"{what['hf_config']} or {what['shape']}; {why}"
            )
    if args.compare_stages:
        problems.append("--simulate: leave out --compare-stages")
    if e.offload_optimizer or e.offload_params:
        problems.append(
            "--simulate: offload is not simulated (the plain loop, FSDP and DeepSpeed's "
            "ZeRO 0-3 are)"
        )
    if e.checkpointing not in ("none", "full"):
        problems.append(
            f"{_flag('checkpointing', args)} {e.checkpointing}: the dry run recomputes whole layers (full) "
            "or nothing (none)"
        )
    if e.tensor_parallel > 1 or e.pipeline_parallel > 1:
        problems.append("--simulate: tensor and pipeline parallelism are not simulated")
    if e.context_parallel > 1:
        problems.append("--simulate: context parallelism is not simulated")
    seq_len = e.seq_len if e.seq_len is not None else options.get("seq_len")
    if seq_len is None and args.hf_config is not None and _context_of(args.hf_config) is None:
        problems.append(
            f"--simulate: {_flag('hf_config', args)} {typed(args.hf_config)} gives no sequence "
            f"length to run (its config.json sets none of {', '.join(CONTEXT_KEYS)}): give "
            f"{_flag('seq_len', args)}"
        )
    if problems:
        parser.error("; ".join(problems))
    from workbench.choices import session_recompute
    from workbench.config import TrainConfig
    from workbench.estimate.hf_build import meta_module
    from workbench.train.dry_run import simulate_memory

    module, found = meta_module(source)
    if module is None:
        parser.error("; ".join(p.render(_flag, sep=" ") for p in found))
    try:
        recompute = session_recompute(e.checkpointing)
    except ValueError as exc:
        parser.error(f"{_flag('checkpointing', args)} {typed(e.checkpointing)}: {exc}")
    impl = e.optimizer_impl if e.optimizer_impl in ("foreach", "for-loop", "fused") else "foreach"
    try:  # the dry run's settings are checked as the estimate's are: one line, exit 2
        config = TrainConfig(
            precision=e.precision,
            optimizer=e.optimizer,
            micro_batch=e.micro_batch,
            grad_accum=e.grad_accum,
            activation_checkpointing=recompute,
            fsdp=e.fsdp,
            zero_stage=e.zero_stage,
            # the estimate's own weight decay (none unless given: the estimator's default)
            weight_decay=float(options.get("weight_decay", 0.0)),
            **{field: options[field] for field in _SIMULATED if field in options},
        )
        dry = simulate_memory(
            module,
            config,
            world_size=e.gpus,
            seq_len=seq_len,
            optimizer_impl=impl,
            progress=None if not args.json else False,
        )
    except ValueError as exc:
        parser.error(" ".join(str(exc).split()))
    _write_pictures(args, parser, dry)
    if args.json:
        try:
            estimate = _with_devices(e, _asked_devices(args), args)
            print(json_text({"estimate": estimate, "dry_run": dry.to_dict()}, default=str))
        except ValueError as exc:
            parser.error(str(exc))
    else:
        print(report(e, unit, name, _asked_devices(args), _notes(e, args, options)))
        print()
        print(dry)
        print()
        print(dry.compare())
    return 0


def _context_of(path: str) -> int | None:
    """The context length the --hf-config file names (t5's n_positions too), which the dry
    run's token ids span when no --seq-len is given (`fake.context_length`); None: none."""
    from workbench.estimate.hf_config import load_config
    from workbench.train.dry_run.fake import context_length

    config, _, _ = load_config(path, "hf_config")
    return None if config is None else context_length(config)


#: the estimate's settings the dry run takes as TrainConfig fields of the same names (the
#: model, its sequence, the GPUs and the settings above are the dry run's own arguments)
_SIMULATED = (
    "attention", "fsdp_reduce_fp32", "fsdp_units", "optimizer_in_backward",
    "activation_offload", "compile", "lora_rank", "lora_targets", "lora_dropout", "qlora",
    "lora_dtype",
)  # fmt: skip
#: what only sizes the estimate (the model, its sequence, the GPUs, the run's cost) or is
#: an argument of the dry run itself
_NEUTRAL = frozenset({
    "model", "hf_config", "n_params", "seq_len", "gpus", "gpu", "overhead_gib", "tokens",
    "mfu", "price_per_gpu_hour", "optimizer_impl", "deepspeed_config", "precision",
    "optimizer", "micro_batch", "grad_accum", "zero_stage", "fsdp", "checkpointing",
    "offload_optimizer", "offload_params", "tensor_parallel", "pipeline_parallel",
    "context_parallel", "sequence_parallel", "weight_decay",
})  # fmt: skip
_SHAPE_KEYS = frozenset({
    "layers", "hidden", "heads", "vocab", "kv_heads", "ffn_hidden", "mlp", "norm", "bias",
    "positions", "tied_embeddings", "parallel_residual", "activation_function", "qk_norm",
    "post_norms",
})  # fmt: skip


def _not_simulated(options: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Each flag given that the dry run cannot honour, named: it runs the model built as
    it is (a config.json's own shape, its own dropout and loss), so a flag that changes
    them would make its comparison another setup than the estimate above it."""
    problems = []
    for field, value in options.items():
        if field in _NEUTRAL or field in _SIMULATED or value is None:
            continue
        if field in _SHAPE_KEYS and args.hf_config is None:
            continue  # a preset's or a shape's config is built with them
        where = (
            "the dry run builds the config.json as it is: edit it there"
            if field in _SHAPE_KEYS
            else "the dry run runs the model as it is built, not this"
        )
        problems.append(
            f"{_flag(field, args)}: not simulated ({where}); leave it out with --simulate"
        )
    return problems


def _picture_problems(args: argparse.Namespace) -> list[str]:
    """--timeline and --snapshot: with --simulate, a file that can be written (and the
    picture's suffix), said before the dry run."""
    from workbench.outputs import target_problem

    problems = []
    for flag, path in (("--timeline", args.timeline), ("--snapshot", args.snapshot)):
        if path is None:
            continue
        from workbench.train.dry_run.timeline import TIMELINE_SUFFIXES

        if not args.simulate:
            problems.append(f"{flag} {typed(path)}: needs --simulate (it draws the dry run)")
            continue
        suffix = Path(path).suffix.lower()
        if flag == "--timeline" and suffix not in TIMELINE_SUFFIXES:
            problems.append(
                f"{flag} {typed(path)}: the suffix {shown(suffix or '(none)')} is not one "
                f"written; allowed: {', '.join(TIMELINE_SUFFIXES)}"
            )
            continue
        reason = target_problem(path, folder=False) or _folder_problem(path)
        if reason is not None:
            problems.append(f"{flag} {typed(path)}: {reason}")
    return problems


def _folder_problem(path: str) -> str | None:
    """Why the folder a picture goes in cannot take it (None when it can), found before
    the dry run by trying: an existing folder must take a new file (one is made there and
    removed), a missing one must be one the write could make (made and removed again, so
    nothing is left behind by the check)."""
    import tempfile

    from workbench.outputs import OutputError, check_target

    try:
        folder = check_target(path).parent  # a link the user named: where it points
    except OutputError as exc:
        return exc.reason
    made: list[Path] = []
    current = folder
    try:
        missing = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
        for current in reversed(missing):
            current.mkdir()
            made.append(current)
        current = folder
        fd, name = tempfile.mkstemp(dir=folder, prefix=".workbench-check-")
        os.close(fd)
        os.unlink(name)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        what = "cannot be made" if current in missing else "takes no new file"
        return f"the folder {shown(str(current), 200)} {what} ({reason}); nothing was written"
    finally:
        for p in reversed(made):  # deepest first
            with contextlib.suppress(OSError):
                p.rmdir()
    return None


def _write_pictures(args: argparse.Namespace, parser: argparse.ArgumentParser, dry: Any) -> None:
    """Write --timeline's picture and --snapshot's pickle of the dry run `dry`."""
    from workbench.outputs import OutputError
    from workbench.train.dry_run.timeline import write_snapshot, write_timeline

    said = sys.stderr if args.json else sys.stdout
    try:
        if args.timeline is not None:
            write_timeline(dry.timeline(), args.timeline)
            print(f"timeline: {args.timeline}", file=said)
        if args.snapshot is not None:
            write_snapshot(dry.memory_snapshot(), args.snapshot)
            print(f"memory snapshot (for torch's memory viewer): {args.snapshot}", file=said)
    except OutputError as exc:
        parser.error(str(exc))
