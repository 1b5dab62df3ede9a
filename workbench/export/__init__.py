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

Every argument is checked in `workbench.export.checks` (`check_export`); the scripts and
their shared code are the modules beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import Engine, SettingProblem, TrainConfig
from workbench.engines import ENGINES, engine_for
from workbench.export.checks import FORMATS as FORMATS  # re-exported
from workbench.export.checks import STRATEGY as STRATEGY  # re-exported
from workbench.export.checks import check_export as check_export  # re-exported
from workbench.export.checks import checked_export, out_dir_problem
from workbench.export.checks import one_line as one_line  # re-exported
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
from workbench.export.refusals import factory_warning
from workbench.inputs import plain_number
from workbench.outputs import OutputError, write_files

COMMON_NAME = "job_common.py"
#: the modules job_common.py and the scripts import from their folder, copied as is too
JOB_MODULES = ("job_files.py", "job_parallel.py", "job_checkpoints.py")
JOB_NAME = "job.json"
LAUNCH_NAME = "launch.sh"
HOSTFILE_NAME = "hostfile"


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
    checked = checked_export(
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


#: the DeepSpeed settings a Lightning job passes to its strategy (the rest is Lightning's)
_LIGHTNING_DS_KEYS = frozenset(
    {"zero_optimization", "fp16", "bf16", "zero_allow_untested_optimizer"}
)


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
        raise ExportError([out_dir_problem(str(out), f"cannot write there: {reason}")]) from exc


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
