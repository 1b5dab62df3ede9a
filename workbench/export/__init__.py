"""`workbench export --format deepspeed`: a TrainConfig as a ready-to-run DeepSpeed job.

    from workbench import TrainConfig
    from workbench.export import export_deepspeed

    result = export_deepspeed(TrainConfig(zero_stage=2, precision="bf16"), gpus=8, out_dir="job")
    print(result.command)   # deepspeed --num_gpus 8 train_deepspeed.py --deepspeed_config ...

writes into `out_dir`:

* `ds_config.json`: `to_deepspeed(config, world_size=gpus * nodes)`, exactly what the
  in-notebook DeepSpeed backend derives its engine config from;
* `train_deepspeed.py` and `job_common.py`: the training script, the package's own
  modules `workbench/export/train_deepspeed.py` and `job_common.py` copied as is (needs
  torch, deepspeed and, for a built-in model, workbench). It trains the model on N ranks
  through `deepspeed.initialize`, reading the JSON, under the `deepspeed` launcher, under
  `torchrun`, and as a plain `python train_deepspeed.py` (one process: it sets up the
  rank-0-of-1 environment itself; CPU with gloo works too). Rank 0 prints one JSON line
  per optimizer step;
* `job.json`: what DeepSpeed JSON cannot say (model, options, seed, steps, data-loader
  settings, activation checkpointing); the number of steps defaults to
  `config.total_steps` and the script's `--steps` overrides it;
* `launch.sh`: runs the launch command; its comments hold the torchrun and multi-node
  variants;
* `hostfile`: the given `hostfile=` copied (the folder is what goes to the cluster;
  launch.sh names it relatively), or for `nodes > 1` without one a template to fill in.

Exporting into a folder that holds a job already loses nothing edited there
(`workbench.export.edits`): an edited script, and any other file it writes that the last
export did not write as it is (`.workbench-export.json` records them), is kept as
`NAME.edited`, a filled-in hostfile is kept instead of the template, and a warning says so;
a folder holding another format's job is refused.

The model is a built-in name (`tiny-gpt`, `mlp`, `cnn`; `model_options` as in
`workbench.models.build_model`) or an importable factory `"pkg.module:function"` called
as `function(**model_options)` after `torch.manual_seed(seed)`, returning
`(module, dataset, loss_fn)` (or `build_model`'s 4-tuple): batches are `(inputs, targets)`
and `loss_fn(outputs, targets)` gets fp32 outputs, as in a Session.

A factory is code, so a job's `job.json` alone never chooses it: the scripts import the
factory only when their command line names it too (`--model SPEC`, which `launch.sh` and
the commands here pass) or says `--trust-model-spec`, and then print what they import.

Everything is validated before anything is written, every problem at once (numbers
range-checked, the built-in model's options checked and its size measured on the meta
device before anything is allocated); the files are written with
`workbench.outputs.write_files` (each staged beside its target, renamed when all are
written), so a failure leaves the previous job whole and no half-written one behind.

Past 700 lines because every argument of an export (format, GPUs and nodes, hostfile,
model and its options, steps, folder) is checked here, for the three formats at once; the
scripts and their shared code are the modules beside it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import (
    Documents,
    Engine,
    FsdpMode,
    OptimizerName,
    SettingProblem,
    TrainConfig,
    plain_value,
    problem_lines,
)
from workbench.deepspeed import to_deepspeed
from workbench.engines import ENGINES, engine_for, tp_problems
from workbench.export.edits import (
    MANIFEST_NAME,
    keep_edited_scripts,
    keep_user_files,
    kept_hostfile,
    manifest_text,
)
from workbench.export.launch_files import (  # noqa: F401  (re-exported: a job's names, commands)
    CONFIG_NAME,
    MASTER_PORT,
    SCRIPT_NAME,
    SCRIPTS,
    describe,
    hostfile_template,
    launch_commands,
    launch_sh,
    model_flag,
)
from workbench.export.problems import ExportError as ExportError  # re-exported
from workbench.export.problems import ExportProblem as ExportProblem  # re-exported
from workbench.export.refusals import (
    factory_option_problems,
    factory_problems,
    factory_warning,
    format_problems,
    model_parallel_problems,
    model_problems,
    stale_format,
)
from workbench.inputs import InputFileError, is_int, plain_number, read_text, shown
from workbench.outputs import OutputError, write_files

#: The job's distributed strategy for the engine a config needs (`engine_for`), from the
#: engines' rows: data parallel replicas (DDP) when the config asks for neither DeepSpeed nor
#: FSDP; the model-parallel engines' are refused by the checks below where a format does
#: not carry them.
STRATEGY: dict[Engine, str] = {engine: row.export_strategy for engine, row in ENGINES.items()}

FORMATS = ("deepspeed", "fsdp", "lightning")
COMMON_NAME = "job_common.py"
#: the modules job_common.py and the scripts import from their folder, copied as is too
JOB_MODULES = ("job_files.py", "job_parallel.py", "job_checkpoints.py")
JOB_NAME = "job.json"
LAUNCH_NAME = "launch.sh"
HOSTFILE_NAME = "hostfile"

_FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")

#: Upper bounds of the job's numbers: (bound, why a larger value is nonsense).
MAX_GPUS = (1024, "more ranks than one node runs")
MAX_NODES = (65536, "more nodes than any cluster has")
MAX_STEPS = (10**12, "longer than any training run")
#: the seed each format's script can take: torch's 64-bit generator; Lightning's
#: `seed_everything` (NumPy's) 32 bits
MAX_SEED = {
    "deepspeed": (2**64 - 1, "torch.manual_seed takes a 64-bit seed"),
    "fsdp": (2**64 - 1, "torch.manual_seed takes a 64-bit seed"),
    "lightning": (2**32 - 1, "Lightning's seed_everything takes a 32-bit seed"),
}
#: The job builds the model and its data whole in host memory on every rank; the export
#: measures them on the meta device (nothing allocated) for its estimate, and refuses
#: more than this (the built-in models' own bounds, `workbench.models.option_problems`,
#: come first and are tighter).
MAX_MODEL_BYTES = 64 * 2**30
#: The largest text a built-in tiny-gpt trains on (read at export to count its vocabulary).
MAX_TEXT_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ExportResult:
    """What `export_deepspeed` wrote (absolute paths) and how to run it.

    The commands are meant to be run in `out_dir` (`launch.sh` changes into it itself).
    `command` is the one `launch.sh` runs: `deepspeed --num_gpus N ...` on one node, the
    hostfile variant on several. `multinode_command` uses the job folder's `hostfile`
    (`hostfile_path`: the given hostfile's copy, or the template written for `nodes > 1`;
    for one node without one, a file you write). `paths`: every file written.
    `estimate` is the memory estimator's per-GPU figure for the built-in model
    (`workbench.estimate.MemoryEstimate`), None for a factory model.
    """

    out_dir: str
    ds_config_path: str | None  # None when the job has no DeepSpeed config (fsdp, ...)
    script_path: str
    launch_path: str
    hostfile_path: str | None
    world_size: int
    gpus: int
    nodes: int
    model: str
    command: str
    torchrun_command: str
    multinode_command: str
    multinode_torchrun_command: str
    ds_config: dict[str, Any]
    paths: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    estimate: Any | None = None
    format: str = "deepspeed"
    description: str = ""  # the job's settings in one line, as job.json says them

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["estimate"] = None if self.estimate is None else self.estimate.to_dict()
        return data


@dataclass(frozen=True)
class _Job:
    """Everything validated, with the file contents, before anything is written."""

    out: Path
    files: dict[str, str] = field(default_factory=dict)
    executable: frozenset[str] = frozenset()


# --------------------------------------------------------------------------- public API
def export_deepspeed(config: TrainConfig, **options: Any) -> ExportResult:
    """`export_job(config, format="deepspeed", ...)`: `ds_config.json`,
    `train_deepspeed.py`, `job_common.py`, `job.json` and `launch.sh` (see the module
    docstring)."""
    return export_job(config, format="deepspeed", **options)


def export_job(
    config: TrainConfig,
    *,
    format: str = "deepspeed",
    gpus: int,
    out_dir: str | os.PathLike[str],
    model: str = "tiny-gpt",
    nodes: int = 1,
    hostfile: str | os.PathLike[str] | None = None,
    model_options: dict[str, Any] | None = None,
    steps: int | None = None,
    warnings: tuple[str, ...] | list[str] = (),
) -> ExportResult:
    """Write a ready-to-run training job for `gpus` ranks on each of `nodes` nodes into
    `out_dir`: `format` "deepspeed" (DeepSpeed's engine and launcher), "fsdp" (PyTorch
    FSDP2 under torchrun; needs `config.fsdp`) or "lightning" (a Lightning Trainer with
    DeepSpeed's strategy for ZeRO / DeepSpeed 16-bit, FSDP's for `fsdp`, else data
    parallel). Every job has its script (a module of this package, copied as is),
    `job_common.py`, `job.json` and `launch.sh`; DeepSpeed jobs also `ds_config.json`.

    `steps`: optimizer steps the script runs by default (None: `config.total_steps`).
    `warnings`: lines to carry into the result (e.g. from importing a DeepSpeed config).
    Raises ValueError naming every bad argument at once; nothing is written then.
    """
    if not isinstance(config, TrainConfig):
        raise ExportError([SettingProblem("config", config, "must be a workbench.TrainConfig")])
    gpus, nodes, steps = plain_number(gpus), plain_number(nodes), plain_number(steps)
    checked = _check(
        config,
        format=format,
        gpus=gpus,
        out_dir=out_dir,
        model=model,
        nodes=nodes,
        hostfile=hostfile,
        model_options=model_options,
        steps=steps,
    )
    if checked.problems:
        raise ExportError(checked.problems)
    out, options, host_path, ds, info = (
        checked.out,
        checked.options,
        checked.host_path,
        checked.ds,
        checked.info,
    )
    assert out is not None
    strategy = STRATEGY[engine_for(config)]

    world = gpus * nodes
    script = SCRIPTS[format]
    total_steps = int(config.total_steps) if steps is None else steps
    template = format == "deepspeed" and nodes > 1 and host_path is None
    commands = launch_commands(
        format, gpus=gpus, nodes=nodes, hostfile=HOSTFILE_NAME, model=model, options=options
    )
    several = nodes > 1 or (format == "deepspeed" and host_path is not None)
    primary = commands["multinode"] if several else commands["single"]
    ddp = format == "lightning" and strategy == STRATEGY[Engine.PLAIN]
    estimate = None if info is None else _estimate(config, info, world, ddp=ddp)
    named = strategy if format == "lightning" else None  # what the description names
    job = _job(config, model=model, options=options, steps=total_steps, world=world)
    job["description"] = describe(config, model, named)
    if format == "lightning":
        job["strategy"] = strategy
        if strategy == "deepspeed":  # Lightning runs the optimizer, schedule and batches
            ds = {k: v for k, v in ds.items() if k in _LIGHTNING_DS_KEYS}
    files: dict[str, str] = {}
    if ds:
        files[CONFIG_NAME] = json.dumps(ds, indent=2) + "\n"
    files[script] = _script_text(script)
    files[COMMON_NAME] = _script_text(COMMON_NAME)
    files.update((n, _script_text(n)) for n in JOB_MODULES)
    files[JOB_NAME] = json.dumps(job, indent=2) + "\n"
    files[LAUNCH_NAME] = launch_sh(
        format, config, model, gpus, nodes, primary, commands, options=options, strategy=named
    )
    if host_path is not None:  # copied: the folder is what goes to the cluster
        files[HOSTFILE_NAME] = checked.host_text
    verbatim = (script, COMMON_NAME, *JOB_MODULES)
    kept, edited = keep_edited_scripts(out, files, verbatim)  # the user's text is not lost
    derived = tuple(n for n in files if n not in verbatim)
    mine, changed = keep_user_files(out, files, derived)
    kept.update(mine)
    edited += changed
    filled = kept_hostfile(out, HOSTFILE_NAME, nodes, gpus) if template else None
    if template and filled is None:
        files[HOSTFILE_NAME] = hostfile_template(nodes, gpus)
    elsewhere = factory_warning(model, out) if ":" in model else None
    warnings = (*warnings, *edited, *([filled] if filled else []), *filter(None, [elsewhere]))
    files.update(kept)
    written = {**files, MANIFEST_NAME: manifest_text(files)}
    _write(_Job(out, written, frozenset({script, LAUNCH_NAME})))  # ExportError on failure
    if template or host_path is not None:
        host_path = out / HOSTFILE_NAME
    return ExportResult(
        out_dir=str(out),
        ds_config_path=str(out / CONFIG_NAME) if ds else None,
        script_path=str(out / script),
        launch_path=str(out / LAUNCH_NAME),
        hostfile_path=None if host_path is None else str(host_path),
        world_size=world,
        gpus=gpus,
        nodes=nodes,
        model=model,
        command=primary,
        torchrun_command=commands["torchrun"],
        multinode_command=commands["multinode"],
        multinode_torchrun_command=commands["multinode_torchrun"],
        ds_config=ds,
        paths=tuple(str(out / name) for name in files),
        warnings=tuple(warnings),
        estimate=estimate,
        format=format,
        description=job["description"],
    )


@dataclass
class _Checked:
    """What `check_export` found: every problem, and what the export writes from."""

    problems: list[SettingProblem] = field(default_factory=list)
    out: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    host_path: Path | None = None
    host_text: str = ""  # the given hostfile's text, copied into the job
    ds: dict[str, Any] = field(default_factory=dict)
    info: Any | None = None  # the built-in model's ModelInfo (measured on the meta device)
    module: Any | None = None  # the built-in model, on the meta device


def check_export(
    config: TrainConfig | None,
    *,
    format: str = "deepspeed",
    gpus: Any,
    out_dir: Any,
    model: Any = "tiny-gpt",
    nodes: Any = 1,
    hostfile: Any = None,
    model_options: Any = None,
    steps: Any = None,
) -> list[SettingProblem]:
    """Every problem `export_job` would refuse these arguments for, as `SettingProblem`s
    (`str()` of each: its line; empty when it would write the job); nothing is written. `config` None: the settings are
    being reported elsewhere (the CLI's flags), so only the other arguments are checked."""
    return _check(
        config,
        format=format,
        gpus=plain_number(gpus),
        out_dir=out_dir,
        model=model,
        nodes=plain_number(nodes),
        hostfile=hostfile,
        model_options=model_options,
        steps=plain_number(steps),
    ).problems


def _bounded_int(
    name: str,
    value: Any,
    bound: tuple[int, str],
    problems: list[SettingProblem],
    *,
    minimum: int = 1,
) -> bool:
    """Whether `value` is an integer in [minimum, bound]; else a problem naming it."""
    top, why = bound
    if not is_int(value) or not minimum <= value <= top:
        problems.append(SettingProblem(name, value, _integer(minimum, top, why)))
        return False
    return True


def _check(
    config: TrainConfig | None,
    *,
    format: Any,
    gpus: Any,
    out_dir: Any,
    model: Any,
    nodes: Any,
    hostfile: Any,
    model_options: Any,
    steps: Any,
) -> _Checked:
    c = _Checked()
    problems = c.problems
    if format not in FORMATS:
        problems.append(SettingProblem("format", format, f"must be one of {', '.join(FORMATS)}"))
    gpus_ok = _bounded_int("gpus", gpus, MAX_GPUS, problems)
    nodes_ok = _bounded_int("nodes", nodes, MAX_NODES, problems)
    if steps is not None and not is_int(steps) or is_int(steps) and not 1 <= steps <= MAX_STEPS[0]:
        message = _integer(1, *MAX_STEPS)
        problems.append(ExportProblem("steps", steps, message, unset="total_steps"))
    before = len(problems)
    c.options = _check_model(model, model_options, problems, out_dir)
    if config is not None:
        c.options = _with_documents(config, model, c.options, problems)
    if isinstance(model, str) and ":" not in model and len(problems) == before:
        measured = _measure(model, c.options, 0, problems)  # the seed changes no size
        if measured is not None:
            c.info, c.module = measured
    if hostfile is not None and format in FORMATS and format != "deepspeed":
        why = (
            f"is for DeepSpeed's launcher; the --format {format} job starts under torchrun on "
            "each node (its launch.sh says how): leave it out"
        )
        problems.append(ExportProblem("hostfile", hostfile, why, value_text=shown(str(hostfile))))
    else:
        c.host_path, c.host_text = _check_hostfile(hostfile, nodes, gpus, problems)
    c.out = _check_out_dir(out_dir, problems)
    stale = stale_format(c.out, format) if c.out is not None and format in FORMATS else None
    if stale is not None:
        problems.append(_out_dir_problem(out_dir, stale))
    if config is None:
        return c
    if steps is None:
        _bounded_int("total_steps", int(config.total_steps), MAX_STEPS, problems)
    if format in MAX_SEED:
        _bounded_int("seed", int(config.seed), MAX_SEED[format], problems, minimum=0)
    engine = engine_for(config)  # the engine the config itself needs, on any cluster
    refused = ENGINES[engine].fsdp_export_refusal
    if format == "fsdp" and refused == "fsdp" and FsdpMode(config.fsdp) is FsdpMode.OFF:
        message = "--format fsdp needs an FSDP mode (full_shard, shard_grad_op, no_shard)"
        if engine is Engine.TENSOR_PARALLEL:  # what a plan of DDP x TP asks for
            message = (
                "no exported job carries plain data parallel (DDP) over tensor-parallel "
                "ranks: the FSDP job shards its data-parallel ranks with FSDP2; use "
                "full_shard or shard_grad_op with `tp` > 1"
            )
        problems.append(SettingProblem("fsdp", FsdpMode(config.fsdp).value, message))
    if format == "fsdp" and refused == "zero_stage":
        message = "--format fsdp exports PyTorch FSDP jobs"
        problems.append(SettingProblem("zero_stage", config.zero_stage, message))
    row = OptimizerName(config.optimizer).row
    for name, value, why in (
        (
            "optimizer_in_backward",
            bool(config.optimizer_in_backward),
            "the exported jobs step one optimizer after backward; a Session trains it",
        ),
        (
            "qlora",
            bool(config.qlora),
            "the exported jobs put LoRA's adapters on a base in its own dtype; QLoRA's 4-bit "
            "base (bitsandbytes) is not sharded by their engines here; a Session trains it",
        ),
        (  # what each optimizer's row says the jobs do not train
            "optimizer",
            bool(row.export_tp_reason) and format != "deepspeed" and config.tp > 1,
            row.export_tp_reason or "",
        ),
        ("optimizer", bool(row.export_reason), row.export_reason or ""),
    ):
        if value:
            problems.append(SettingProblem(name, plain_value(getattr(config, name)), why))
    problems += model_parallel_problems(format, config.tp, config.pp)
    if format in ("fsdp", "lightning") and int(config.tp) > 1 and gpus_ok and nodes_ok:
        problems += tp_problems(config, gpus * nodes)  # fsdp no_shard among them
        off = FsdpMode(config.fsdp) is FsdpMode.OFF
        if format == "lightning" and off and gpus * nodes > int(config.tp):
            problems.append(
                SettingProblem(
                    "fsdp",
                    "off",
                    "the Lightning job's ModelParallelStrategy runs its data-parallel ranks "
                    "through FSDP2, not plain data parallel: use full_shard or shard_grad_op "
                    f"with `tp` > 1 on more than `tp`={config.tp} GPUs",
                )
            )
    strategy = STRATEGY[engine]
    if format in FORMATS:
        problems += format_problems(config, format, strategy)
    if c.module is not None:
        problems += model_problems(config, c.module)
    if (
        gpus_ok
        and nodes_ok
        and format in FORMATS
        and (format == "deepspeed" or strategy == "deepspeed")
    ):
        try:
            c.ds = to_deepspeed(config, world_size=gpus * nodes)
        except ValueError as exc:
            problems += _config_problems(exc, config)
    return c


def _integer(minimum: int, top: int, why: str) -> str:
    return f"must be an integer >= {minimum}, at most {top:,} ({why})"


def _config_problems(exc: ValueError, config: TrainConfig) -> list[SettingProblem]:
    """What the DeepSpeed mapping refused `config` for, as the SettingProblems its error
    carries (`ConfigError.problems`); an error without them (a bug, not a setting) as one
    problem of the config as a whole, its text shown as it is."""
    carried = getattr(exc, "problems", None)
    if isinstance(carried, (list, tuple)) and carried:
        found = [p for p in carried if isinstance(p, SettingProblem)]
        if len(found) == len(carried):
            return found
    return [ExportProblem("config", config, str(exc), value_text="")]


#: the DeepSpeed settings a Lightning job passes to its strategy (the rest is Lightning's)
_LIGHTNING_DS_KEYS = frozenset(
    {"zero_optimization", "fp16", "bf16", "zero_allow_untested_optimizer"}
)


# --------------------------------------------------------------------------- checks
def one_line(exc: BaseException) -> str:
    """A multi-problem ValueError as one line."""
    return "; ".join(problem_lines(exc))


def _check_model(
    model: Any, options: Any, problems: list[SettingProblem], out_dir: Any = None
) -> dict[str, Any]:
    """The model options to bake into the script, checked as far as possible here: for a
    built-in model against its documented options and bounds, before anything is built."""
    if options is None:
        options = {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        message = "must be a dict of option name -> value"
        problems.append(SettingProblem("model_options", options, message))
        return {}
    options = {k: plain_number(v) for k, v in options.items()}  # NumPy / torch: Python's
    for k, v in options.items():
        if not (v is None or isinstance(v, (bool, int, float, str))):
            message = "must be a number, string, bool or None"
            problems.append(_option_problem(k, v, message))
        elif isinstance(v, float) and not math.isfinite(v):
            problems.append(_option_problem(k, v, "must be a finite number"))
    if not isinstance(model, str):
        message = "must be a built-in model name or a factory 'pkg.module:function'"
        problems.append(SettingProblem("model", model, message))
        return dict(options)
    if ":" in model:
        if not _FACTORY.match(model):
            message = (
                "a factory must be written 'pkg.module:function' (dotted module path, a colon, "
                "a function name)"
            )
            problems.append(SettingProblem("model", model, message))
        else:
            unfound = factory_problems(model, out_dir)
            problems += unfound or factory_option_problems(model, options, out_dir)
        return dict(options)
    from workbench.models import MODEL_NAMES, model_options

    if model not in MODEL_NAMES:
        message = f"must be one of {', '.join(MODEL_NAMES)} or a factory 'pkg.module:function'"
        problems.append(SettingProblem("model", model, message))
        return dict(options)
    defaults = model_options(model)
    if "seed" in options:
        message = "the model is seeded from the config's seed; set `seed` there"
        problems.append(
            ExportProblem("model_options", options["seed"], message, option="seed", value_text="")
        )
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(k for k in defaults if k != "seed")
        problems.append(
            ExportProblem(
                "model_options",
                {k: options[k] for k in unknown},
                f"unknown for {shown(model)}; allowed: {allowed}",
                options=tuple(unknown),
                value_text="",
            )
        )
    text_refused = False
    if "text" in options and options["text"] is not None:
        text_refused = not _check_text(options["text"], problems)
    if "text" in options and options["text"] is not None and not text_refused:
        # the job runs in its own folder (launch.sh changes into it): the path as it is here
        options = {**options, "text": str(Path(options["text"]).expanduser().resolve())}
    from workbench.models import option_problems

    known = {k: v for k, v in options.items() if k in defaults and k != "seed"}
    if text_refused:  # said once, by the reader's own reason
        known.pop("text", None)
    for found in option_problems(model, known):  # each carries its option and value
        if found.option in defaults:
            problems.append(_option_problem(found.option, found.value, found.message))
        else:  # a size past what a built-in model is for
            problems.append(
                ExportProblem(
                    "model_options",
                    dict(known),
                    f"{shown(model)} has {found.message}",
                    options=tuple(known),
                    value_text=None if known else "",
                )
            )
    return dict(options)


def _with_documents(
    config: TrainConfig, model: Any, options: dict[str, Any], problems: list[SettingProblem]
) -> dict[str, Any]:
    """The model options with `config.documents` as tiny-gpt's `documents` option (every
    format's script trains the document batches through `model(**batch)` and the
    built-in's `loss_fn(outputs, batch)`); a problem naming `documents` for any other
    model (`workbench.models.spec.documents_problem`)."""
    from workbench.models.spec import documents_problem

    documents = Documents(config.documents).value
    problem = documents_problem(documents, model, None, None, options)
    given = options.get("documents")
    if problem is not None and given is not None and model == "tiny-gpt" and given != documents:
        message = (  # the option as the user gave it, not the setting they left alone
            "the layout is the `documents` setting, not a model option: drop the option "
            f"and set `documents` to {shown(given)}"
        )
        problem = _option_problem("documents", given, message)
    if problem is not None:
        problems.append(problem)
        return options
    return {**options, "documents": documents} if documents != "stream" else options


def _option_problem(option: str, value: Any, message: str) -> ExportProblem:
    """A problem with the model option `option` (given as `value`)."""
    return ExportProblem("model_options", value, message, option=option)


def _check_text(value: Any, problems: list[SettingProblem]) -> bool:
    """Whether a tiny-gpt `text` option is a UTF-8 file of at most MAX_TEXT_BYTES (read
    through `workbench.inputs`: no FIFO, device or directory); else a problem."""
    if not isinstance(value, str) or not value.strip():
        message = "must be the path of a UTF-8 text file or None"
        problems.append(_option_problem("text", value, message))
        return False
    try:
        read_text(value, what="text", max_bytes=MAX_TEXT_BYTES)
    except InputFileError as exc:
        problems.append(_option_problem("text", value, exc.reason))
        return False
    return True


def _measure(model: str, options: dict[str, Any], seed: int, problems: list[SettingProblem]) -> Any:
    """(the built-in model's ModelInfo, the module), built on the meta device (no memory allocated, any
    size); a problem line when it cannot be built or it and its data would take more than
    MAX_MODEL_BYTES in the job."""
    import torch

    from workbench.models import build_model

    try:
        with torch.device("meta"):
            module, dataset, _loss, info = build_model(model, seed=seed, **options)
    except (ValueError, RuntimeError, TypeError, OverflowError, MemoryError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        message = f"cannot build {shown(model)} with {shown(options)}: {text}"
        problems.append(ExportProblem("model_options", options, message, value_text=""))
        return None
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [v for v in vars(dataset).values() if isinstance(v, torch.Tensor)]
    total = sum(t.numel() * t.element_size() for t in tensors)
    if total > MAX_MODEL_BYTES:
        given = ", ".join(f"{k}={v}" for k, v in options.items()) or "its defaults"
        message = (
            f"{shown(model)} with {given} has {info.n_params:,} parameters; with its "
            f"data {total / 2**30:,.1f} GiB in fp32: more than the "
            f"{MAX_MODEL_BYTES // 2**30} GiB limit (the job builds the model and its data whole "
            "in host memory on every rank)"
        )
        problems.append(ExportProblem("model_options", options, message, value_text=""))
        return None
    return info, module


#: The most bytes and host lines a hostfile may have.
MAX_HOSTFILE_BYTES = 1 << 20


def _check_hostfile(
    hostfile: Any, nodes: Any, gpus: Any, problems: list[SettingProblem]
) -> tuple[Path | None, str]:
    """The hostfile's path and text (to copy into the job), or None and its problems."""
    if hostfile is None:
        return None, ""
    if not isinstance(hostfile, (str, os.PathLike)) or not os.fspath(hostfile):
        message = "must be a path to a DeepSpeed hostfile"
        problems.append(SettingProblem("hostfile", hostfile, message))
        return None, ""
    given = os.fspath(hostfile)

    def problem(message: str) -> None:
        name = shown(given, limit=200)
        problems.append(ExportProblem("hostfile", given, message, value_text=name))

    try:
        path = Path(hostfile).expanduser().resolve()
        text = read_text(path, what="hostfile", max_bytes=MAX_HOSTFILE_BYTES)
    except InputFileError as exc:
        problem(f"cannot be read: {exc.reason}")
        return None, ""
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a name too long, a loop
        problem(f"cannot be read ({exc})")
        return None, ""
    hosts = []
    lines: dict[str, list[int]] = {}  # each host's line numbers
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _HOST_LINE.match(line)
        if m is None or len(m.group(2)) > 6:
            problem(
                f"line {number} {shown(raw.strip())}: must be 'HOSTNAME slots=N' "
                f"(N at most {MAX_GPUS[0]})"
            )
            return None, ""
        hosts.append((m.group(1), int(m.group(2))))
        lines.setdefault(m.group(1), []).append(number)
    twice = [(host, numbers) for host, numbers in lines.items() if len(numbers) > 1]
    if twice:
        said = "; ".join(f"{shown(host)} on lines {_numbers(found)}" for host, found in twice[:3])
        more = f" and {len(twice) - 3} more host(s)" if len(twice) > 3 else ""
        problem(f"names a host more than once ({said}{more}): list each host on one line")
        return None, ""
    if is_int(nodes) and len(hosts) < nodes:
        problem(f"lists {len(hosts)} host(s); --nodes {nodes} needs at least {nodes}")
    if is_int(gpus):
        short = [h for h, slots in hosts[: nodes if is_int(nodes) else None] if slots < gpus]
        if short:
            problem(
                f"{shown(', '.join(short))[1:-1]} have fewer than {gpus} slots "
                f"(`gpus`={gpus} per node)"
            )
    return path, text


def _numbers(numbers: list[int], limit: int = 5) -> str:
    """Line numbers as `2, 4` (the first `limit`, then how many more)."""
    text = ", ".join(map(str, numbers[:limit]))
    return text + (f" and {len(numbers) - limit} more" if len(numbers) > limit else "")


def _check_out_dir(out_dir: Any, problems: list[SettingProblem]) -> Path | None:
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
        problems.append(SettingProblem("out_dir", out_dir, "must be a directory path"))
        return None
    given = os.fspath(out_dir) if isinstance(out_dir, os.PathLike) else out_dir

    def problem(message: str) -> None:
        problems.append(_out_dir_problem(given, message))

    try:
        out = Path(out_dir).expanduser().resolve()
        if out.exists() and not out.is_dir():
            problem("exists and is not a directory")
            return None
        existing = out if out.exists() else next(p for p in out.parents if p.exists())
        if not existing.is_dir():
            problem(f"{existing} is not a directory")
        elif not os.access(existing, os.W_OK | os.X_OK):
            problem(f"{existing} is not writable")
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a name too long, a loop
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        problem(f"not a usable directory path ({reason})")
        return None
    return out


def _out_dir_problem(given: Any, message: str) -> ExportProblem:
    """A problem with the folder `out_dir` names (its path shown up to 200 characters)."""
    return ExportProblem("out_dir", given, message, value_text=shown(given, limit=200))


# --------------------------------------------------------------------------- writing
def _write(job: _Job) -> None:
    """Write every file with `workbench.outputs.write_files` (all staged, then renamed:
    a failure leaves what `job.out` held before whole); on failure also remove the
    folders this call created (ExportError naming out_dir)."""
    out = job.out
    missing = [p for p in (out, *out.parents) if not p.exists()]
    modes = {name: 0o755 for name in job.executable}
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_files(out, job.files, modes=modes)
    except (OutputError, OSError) as exc:
        for p in missing:  # deepest first
            with contextlib.suppress(OSError):
                p.rmdir()
        if isinstance(exc, OutputError):
            reason = f"{exc.reason} ({Path(exc.path).name}); nothing was changed there"
        else:
            reason = f"{exc.strerror or exc}; nothing was changed there"
        raise ExportError([_out_dir_problem(str(out), f"cannot write there: {reason}")]) from exc


def _estimate(config: TrainConfig, info: Any, world: int, *, ddp: bool = False) -> Any:
    """The per-GPU prediction for a built-in model from its ModelInfo (measured on the meta
    device; a factory's size is not known without importing it, so it has none). `ddp`: a
    Lightning job that is data parallel holds plain replicas on its ranks, the plain loop's
    accounting (not that of the DeepSpeed ZeRO-0 a Session's ranks train through)."""
    from workbench.prediction import predict_memory

    accounting = ENGINES[Engine.PLAIN].accounting if ddp else None
    try:
        return predict_memory(config, info, world, accounting=accounting)
    except ValueError as exc:
        message = f"the memory estimate: {one_line(exc)}"
        raise ExportError([ExportProblem("config", config, message, value_text="")]) from None


def _job(
    config: TrainConfig, *, model: str, options: dict[str, Any], steps: int, world: int
) -> dict[str, Any]:
    """`job.json`: the model, the data loader, the steps and every training setting
    (`config`, what DeepSpeed JSON cannot say for a DeepSpeed job, everything for the
    others)."""
    return {
        "description": describe(config, model),
        "model": model,
        "model_options": options,
        "seed": int(config.seed),
        "steps": steps,
        "num_workers": int(config.num_workers),
        "pin_memory": bool(config.pin_memory),
        "activation_checkpointing": str(config.activation_checkpointing),
        "activation_offload": bool(config.activation_offload),
        "exported_world_size": world,
        "config": config.to_dict(),
    }


def _script_text(name: str) -> str:
    """A job file as the package ships it (`train_deepspeed.py`, `job_common.py` beside
    this module), copied verbatim."""
    return (Path(__file__).with_name(name)).read_text()
