"""What an export refuses because its job cannot train it: checked at export, so that a
job that would stop at its start (or silently train something else) is never written.

* `format_problems`: a setting a format's script does not carry (an optimizer the FSDP
  and Lightning scripts do not build, torch's amp precisions under Lightning's DeepSpeed
  strategy, norm clipping under Lightning's FSDP strategy, amp-fp16 under DeepSpeed,
  `compile`);
* `model_problems`: what a built-in model itself (built on the meta device) cannot train
  of the settings, as a Session checks it (recomputation of blocks the model does not
  mark, an attention kernel it has none of, LoRA targets that match no layer); a factory
  is not built at export (that would run the user's code): not checked for one;
* `factory_option_problems`: model options a factory `pkg.module:function` cannot take,
  checked against its function's parameters as its source declares them (read, never
  imported or run: what a built-in's `model_problems` checks needs the model built, which
  for a factory means running the user's code, and an export does not);
* `factory_warning`: a factory `pkg.module:function` that imports only from the folder
  the export was run in (the job runs in its own folder);
* `stale_format`: a job folder that holds another format's job;
* `model_parallel_problems`: `tp` / `pp` > 1 a format's job does not carry (checked from
  the numbers alone, so the CLI says it first even when the rest of the config is refused).

Each problem is a `SettingProblem` naming the setting, the value and why.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from workbench.config import OptimizerName, Precision, SettingProblem, TrainConfig
from workbench.engines import AMP_FP16_DEEPSPEED
from workbench.export.problems import ExportProblem
from workbench.inputs import shown
from workbench.optimizers import OPTIMIZERS

#: the optimizers the FSDP and Lightning scripts build (their copy of these rows is
#: `job_common.OPTIMIZER_CLASSES`; tests/unit/test_optimizers.py holds the two equal)
SCRIPT_OPTIMIZERS = tuple(
    r.name for r in OPTIMIZERS if r.in_session and r.export_reason is None and "fsdp" in r.engines
)

#: why no exported job compiles
COMPILE_REASON = (
    "the exported jobs do not run torch.compile (their scripts train the model eagerly); "
    "export without it, or add torch.compile to the script (each block before FSDP wraps "
    "it); a Session and `workbench launch` compile it"
)

#: why the Lightning job under Lightning's FSDP strategy does not clip by norm
LIGHTNING_FSDP_CLIP = (
    "--format lightning with --fsdp (Lightning's FSDP strategy) cannot clip by norm: "
    "Lightning's FSDPPrecision raises \"gradient_clip_algorithm='norm' is currently not "
    'supported" at the first step; use --format fsdp, whose script clips the norm over the '
    "shards, or export without --clip-grad-norm"
)


#: Why the exported jobs do not carry `tp` / `pp` (each target, the setting).
MODEL_PARALLEL_EXPORT = {
    "deepspeed": "the exported DeepSpeed job writes neither DeepSpeed's AutoTP training "
    "(`tensor_parallel.autotp_size` in the config, DeepSpeed 0.16.4+, ZeRO 0-2) nor its "
    "pipeline engine (PipelineModule, which needs the model rewritten as a list of layers)",
    "fsdp": "the exported FSDP job splits layers over tensor-parallel ranks (`tp`) but does "
    "not cut the model into pipeline stages",
    "lightning": "the exported Lightning job splits layers over tensor-parallel ranks (`tp`, "
    "Lightning's ModelParallelStrategy) but does not cut the model into pipeline stages",
}


def model_parallel_problems(format: Any, tp: Any, pp: Any) -> list[SettingProblem]:
    """`tp` or `pp` > 1 where `format`'s job does not carry it (the FSDP and Lightning jobs
    split layers over tensor-parallel ranks; no job cuts pipeline stages)."""
    problems = []
    for name, value in (("tp", tp), ("pp", pp)):
        carried = name == "tp" and format in ("fsdp", "lightning")
        if isinstance(value, int) and value > 1 and format in MODEL_PARALLEL_EXPORT and not carried:
            why = (
                f"not exported to --format {format}: {MODEL_PARALLEL_EXPORT[format]}; a "
                f"Session and `workbench launch --{name}` train it"
            )
            problems.append(SettingProblem(name, value, why))
    return problems


def format_problems(config: TrainConfig, format: str, strategy: str) -> list[SettingProblem]:
    """The settings of `config` the `format` job (its Lightning `strategy`) does not
    train, one problem each."""
    p: list[SettingProblem] = []
    optimizer = OptimizerName(config.optimizer)
    row = optimizer.row
    scripted = format in ("fsdp", "lightning") and optimizer.value in SCRIPT_OPTIMIZERS
    if format in ("fsdp", "lightning") and row.export_reason is None and not scripted:
        why = (
            f"the --format {format} script builds {', '.join(SCRIPT_OPTIMIZERS)} "
            "(torch's and torchao's classes); DeepSpeed's optimizers train in "
            "--format deepspeed"
        )
        p.append(SettingProblem("optimizer", optimizer.value, why))
    precision = Precision(config.precision)
    if format == "lightning" and strategy == "deepspeed" and precision.value.startswith("amp-"):
        why = (
            "Lightning's DeepSpeed strategy trains DeepSpeed's own 16-bit modes, not torch's "
            "autocast: use precision bf16 or fp16 with --format lightning and ZeRO, or "
            "--format deepspeed"
        )
        p.append(SettingProblem("precision", precision.value, why))
    elif format == "deepspeed" and precision is Precision.AMP_FP16:
        p.append(SettingProblem("precision", precision.value, AMP_FP16_DEEPSPEED))
    if format == "lightning" and strategy == "fsdp" and config.clip_grad_norm is not None:
        p.append(SettingProblem("clip_grad_norm", config.clip_grad_norm, LIGHTNING_FSDP_CLIP))
    if config.compile:
        p.append(SettingProblem("compile", True, COMPILE_REASON))
    return p


def model_problems(config: TrainConfig, module: Any) -> list[SettingProblem]:
    """What `module` (the job's model, on the meta device) cannot train of `config`: the
    checks a Session runs on its model (`workbench.train.changes.session_problems`)."""
    from workbench.train.techniques.attention import attention_problem
    from workbench.train.techniques.lora import lora_problem
    from workbench.train.techniques.recompute import checkpointable_modules, selective_supported

    p: list[SettingProblem] = []
    mode = str(config.activation_checkpointing)
    if mode == "full" and not checkpointable_modules(module):
        why = (
            "the model has no checkpointable blocks (the built-in GPT's blocks, or a "
            "factory's marked with workbench.train.techniques.recompute.mark_checkpointable)"
        )
        p.append(SettingProblem("activation_checkpointing", mode, why))
    if mode == "selective" and not selective_supported(module):
        why = (
            "selective recomputation needs an attention core to recompute (the built-in "
            "GPT's, or a transformers model's attention function); use 'full' for a model "
            "with marked blocks"
        )
        p.append(SettingProblem("activation_checkpointing", mode, why))
    for found in (lora_problem(module, config), attention_problem(module, config.attention)):
        if found is not None:
            p.append(found)
    return p


def factory_problems(model: str, out_dir: Any) -> list[SettingProblem]:
    """A factory `pkg.module:function` that does not import, checked as `workbench launch`
    checks it (`workbench.models.spec.spec_problems`: the current folder on the path), or
    lies in the job folder `out_dir` already (the job imports from its own folder)."""
    from workbench.models.spec import spec_problems

    top = model.partition(":")[0].split(".")[0]
    with contextlib.suppress(OSError, ValueError, TypeError):
        out = Path(out_dir).expanduser()
        if (out / f"{top}.py").is_file() or (out / top).is_dir():
            return []
    found = spec_problems(model)
    return [
        SettingProblem(
            p.field,
            p.value,
            p.message + "; the job imports it from its own folder or the Python path: "
            "install it, or put it in the job folder before exporting",
        )
        for p in found
    ]


def factory_option_problems(
    model: str, options: dict[str, Any], out_dir: Any
) -> list[SettingProblem]:
    """The model options the factory `pkg.module:function` cannot take, checked against
    its function's parameters as its source declares them (`models.factory_source`: read,
    never imported or run; nothing is checked where the source does not say for certain):
    an option it has no parameter for (without `**kwargs`), a parameter without a default
    that no option gives, a positional-only one without a default (the job calls it with
    keyword options only)."""
    from workbench.models.factory_source import factory_parameters

    folder = None
    with contextlib.suppress(OSError, ValueError, TypeError):
        folder = Path(out_dir).expanduser()
    params = factory_parameters(model, folder)
    if params is None:
        return []
    where = f"{params.function}() in {params.path}, line {params.line}"
    p: list[SettingProblem] = []
    if params.positional_only:
        names = ", ".join(params.positional_only)
        why = (
            f"{where} has positional-only parameters without a default ({names}); the job "
            f"calls it as {params.function}(**model_options): give them defaults or make them "
            "keyword parameters"
        )
        p.append(SettingProblem("model", model, why))
    unknown = [] if params.any_keyword else [k for k in options if k not in params.keywords]
    if unknown:
        takes = ", ".join(params.keywords) if params.keywords else "no options"
        why = f"unknown for {shown(model)}; {where} takes {takes}"
        given = {k: options[k] for k in unknown}
        p.append(ExportProblem("model_options", given, why, options=tuple(unknown), value_text=""))
    missing = [k for k in params.required if k not in options]
    if missing:
        why = f"needed by {shown(model)}: {where} has no default for it; give it as a model option"
        p.append(ExportProblem("model_options", {}, why, options=tuple(missing), value_text=""))
    return p


def factory_warning(model: str, out: Path) -> str | None:
    """A warning when the factory `pkg.module:function` imports here only because the
    current folder is on the path (`workbench.models.spec` puts it there) while the job,
    which runs in its own folder `out`, would not find it: not in `out`, not on
    PYTHONPATH, not installed. None when the job finds it as the export did."""
    from workbench.models.spec import importable_origin

    module = model.partition(":")[0]
    top_name = module.split(".")[0]
    if (out / f"{top_name}.py").is_file() or (out / top_name).is_dir():
        return None  # the job's own folder holds it
    origin = importable_origin(model)
    if not os.path.isabs(origin):
        return None
    cwd = Path.cwd().resolve()
    top = Path(origin).resolve().parent
    for _ in module.split(".")[1:] + ([""] if Path(origin).name == "__init__.py" else []):
        top = top.parent
    given = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    paths = [Path(p).resolve() for p in given if p]
    if top != cwd or cwd in paths or top == out.resolve():
        return None
    return (
        f"--model {model}: module {module!r} imports here from the folder you export from "
        f"({cwd}), but the job runs in its own folder ({out}): copy it there, install it, or "
        f"set PYTHONPATH={cwd} where the job runs"
    )


#: each format's script: the file that tells which format a job folder holds
_SCRIPTS = {
    "deepspeed": "train_deepspeed.py",
    "fsdp": "train_fsdp.py",
    "lightning": "train_lightning.py",
}


def stale_format(out: Path, format: str) -> str | None:
    """Why `out` cannot take a `format` job: it holds another format's job (that format's
    script), whose files would be left beside the new job's; None when it holds none."""
    held = [f for f, script in _SCRIPTS.items() if f != format and (out / script).exists()]
    if not held:
        return None
    return (
        f"holds a --format {held[0]} job ({_SCRIPTS[held[0]]}); a --format {format} job "
        f"written there would leave that job's files beside it: export into another folder, "
        "or move that job's files away first"
    )


__all__ = [
    "COMPILE_REASON",
    "LIGHTNING_FSDP_CLIP",
    "MODEL_PARALLEL_EXPORT",
    "SCRIPT_OPTIMIZERS",
    "factory_option_problems",
    "factory_warning",
    "format_problems",
    "model_parallel_problems",
    "model_problems",
    "stale_format",
]
