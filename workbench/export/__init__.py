"""`workbench export --format deepspeed`: a TrainConfig as a ready-to-run DeepSpeed job.

    from workbench import TrainConfig
    from workbench.export import export_deepspeed

    result = export_deepspeed(TrainConfig(zero_stage=2, precision="bf16"), gpus=8, out_dir="job")
    print(result.command)   # deepspeed --num_gpus 8 train_deepspeed.py --deepspeed_config ...

writes into `out_dir`:

* `ds_config.json`: `config.to_deepspeed(world_size=gpus * nodes)`, exactly what the
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
* `hostfile` (only for `nodes > 1` without a `hostfile=`): a template to fill in.

The model is a built-in name (`tiny-gpt`, `mlp`, `cnn`; `model_options` as in
`workbench.models.build_model`) or an importable factory `"pkg.module:function"` called
as `function(**model_options)` after `torch.manual_seed(seed)`, returning
`(module, dataset, loss_fn)` (or `build_model`'s 4-tuple): batches are `(inputs, targets)`
and `loss_fn(outputs, targets)` gets fp32 outputs, as in a Session.

Everything is validated before anything is written; the files are written into a
temporary directory next to `out_dir` and then moved into place, so a failure leaves no
half-written job behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import FsdpMode, OffloadDevice, TrainConfig, problem_lines

FORMATS = ("deepspeed", "fsdp", "lightning")
CONFIG_NAME = "ds_config.json"
SCRIPT_NAME = "train_deepspeed.py"
#: the training script of each format (a module of this package, copied as is)
SCRIPTS = {
    "deepspeed": "train_deepspeed.py",
    "fsdp": "train_fsdp.py",
    "lightning": "train_lightning.py",
}
COMMON_NAME = "job_common.py"
JOB_NAME = "job.json"
LAUNCH_NAME = "launch.sh"
HOSTFILE_NAME = "hostfile"
MASTER_PORT = 29500

_FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")


@dataclass(frozen=True)
class ExportResult:
    """What `export_deepspeed` wrote (absolute paths) and how to run it.

    The commands are meant to be run in `out_dir` (`launch.sh` changes into it itself).
    `command` is the one `launch.sh` runs: `deepspeed --num_gpus N ...` on one node, the
    hostfile variant on several. `multinode_command` uses `hostfile_path` (the given
    hostfile, the template written for `nodes > 1`, or `hostfile` for one node: a file you
    write). `paths`: every file written (a hostfile only when the template was written).
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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["estimate"] = None if self.estimate is None else self.estimate.to_dict()
        return data


class ExportError(ValueError):
    """Bad arguments to `export_deepspeed`; `problems` holds one line per problem, each
    naming the argument, the value and what is allowed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        if len(problems) == 1:
            message = f"cannot export: {problems[0]}"
        else:
            message = f"cannot export, {len(problems)} problems:\n" + "\n".join(
                f"  - {p}" for p in problems
            )
        super().__init__(message)


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
    problems: list[str] = []
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={config!r}: must be a workbench.TrainConfig")
    if format not in FORMATS:
        problems.append(f"format={format!r}: must be one of {', '.join(FORMATS)}")
    for name, value in (("gpus", gpus), ("nodes", nodes)):
        if not is_int(value) or value < 1:
            problems.append(f"{name}={value!r}: must be an integer >= 1")
    if steps is not None and (not is_int(steps) or steps < 1):
        problems.append(f"steps={steps!r}: must be an integer >= 1 or None")
    options = _check_model(model, model_options, problems)
    host_path = _check_hostfile(hostfile, nodes, gpus, problems)
    out = _check_out_dir(out_dir, problems)
    fsdp = FsdpMode(config.fsdp)
    if format == "fsdp" and fsdp is FsdpMode.OFF:
        problems.append(
            "fsdp='off': --format fsdp needs an FSDP mode (full_shard, shard_grad_op, no_shard)"
        )
    if format == "fsdp" and config.uses_deepspeed:
        problems.append(f"zero_stage={config.zero_stage}: --format fsdp exports PyTorch FSDP jobs")
    strategy = (
        "deepspeed" if config.uses_deepspeed else ("fsdp" if fsdp is not FsdpMode.OFF else "ddp")
    )
    ds: dict[str, Any] = {}
    if not problems and (format == "deepspeed" or strategy == "deepspeed"):
        try:
            ds = config.to_deepspeed(world_size=gpus * nodes)
        except ValueError as exc:
            problems.append(one_line(exc))
    if problems:
        raise ExportError(problems)
    assert out is not None

    world = gpus * nodes
    script = SCRIPTS[format]
    total_steps = int(config.total_steps) if steps is None else steps
    template = format == "deepspeed" and nodes > 1 and host_path is None
    hostfile_text = str(host_path) if host_path is not None else HOSTFILE_NAME
    commands = _commands(format, gpus=gpus, nodes=nodes, hostfile=hostfile_text)
    several = nodes > 1 or (format == "deepspeed" and host_path is not None)
    primary = commands["multinode"] if several else commands["single"]
    estimate = _estimate(config, model, options, world)
    job = _job(config, model=model, options=options, steps=total_steps, world=world)
    if format == "lightning":
        job["strategy"] = strategy
        if strategy == "deepspeed":  # Lightning runs the optimizer, schedule and batches
            ds = {k: v for k, v in ds.items() if k in _LIGHTNING_DS_KEYS}
    files: dict[str, str] = {}
    if ds:
        files[CONFIG_NAME] = json.dumps(ds, indent=2) + "\n"
    files[script] = _script_text(script)
    files[COMMON_NAME] = _script_text(COMMON_NAME)
    files[JOB_NAME] = json.dumps(job, indent=2) + "\n"
    files[LAUNCH_NAME] = _launch_sh(format, config, model, gpus, nodes, primary, commands)
    if template:
        files[HOSTFILE_NAME] = _hostfile_template(nodes, gpus)
    _write(_Job(out, files, frozenset({script, LAUNCH_NAME})))
    if template:
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
    )


#: the DeepSpeed settings a Lightning job passes to its strategy (the rest is Lightning's)
_LIGHTNING_DS_KEYS = frozenset(
    {"zero_optimization", "fp16", "bf16", "zero_allow_untested_optimizer"}
)


# --------------------------------------------------------------------------- checks
def is_int(v: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def one_line(exc: BaseException) -> str:
    """A multi-problem ValueError as one line."""
    return "; ".join(problem_lines(exc))


def _check_model(model: Any, options: Any, problems: list[str]) -> dict[str, Any]:
    """The model options to bake into the script (validated as far as possible here)."""
    if options is None:
        options = {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        problems.append(f"model_options={options!r}: must be a dict of option name -> value")
        return {}
    bad = {
        k: v
        for k, v in options.items()
        if not (v is None or isinstance(v, (bool, int, float, str)))
    }
    for k, v in bad.items():
        problems.append(f"model_options[{k!r}]={v!r}: must be a number, string, bool or None")
    if not isinstance(model, str):
        problems.append(
            f"model={model!r}: must be a built-in model name or a factory 'pkg.module:function'"
        )
        return dict(options)
    if ":" in model:
        if not _FACTORY.match(model):
            problems.append(
                f"model={model!r}: a factory must be written 'pkg.module:function' (dotted "
                "module path, a colon, a function name)"
            )
        return dict(options)
    from workbench.models import MODEL_NAMES, model_options

    if model not in MODEL_NAMES:
        problems.append(
            f"model={model!r}: must be one of {', '.join(MODEL_NAMES)} or a factory "
            "'pkg.module:function'"
        )
        return dict(options)
    defaults = model_options(model)
    if "seed" in options:
        problems.append(
            "model_options['seed']: the model is seeded from the config's seed; set seed there"
        )
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(k for k in defaults if k != "seed")
        problems.append(
            f"model_options {', '.join(unknown)}: unknown for {model!r}; allowed: {allowed}"
        )
    for key, value in options.items():
        default = defaults.get(key)
        if is_int(default) and key != "seed" and (not is_int(value) or value < 1):
            problems.append(f"model_options[{key!r}]={value!r}: must be an integer >= 1")
    return dict(options)


def _check_hostfile(hostfile: Any, nodes: Any, gpus: Any, problems: list[str]) -> Path | None:
    if hostfile is None:
        return None
    if not isinstance(hostfile, (str, os.PathLike)):
        problems.append(f"hostfile={hostfile!r}: must be a path to a DeepSpeed hostfile")
        return None
    path = Path(hostfile).expanduser().resolve()
    try:
        text = path.read_text()
    except OSError as exc:
        problems.append(f"hostfile={str(hostfile)!r}: cannot be read ({exc.strerror or exc})")
        return None
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _HOST_LINE.match(line)
        if m is None:
            problems.append(
                f"hostfile={str(hostfile)!r}: line {number} {raw.strip()!r}: must be "
                "'HOSTNAME slots=N'"
            )
            return None
        hosts.append((m.group(1), int(m.group(2))))
    if is_int(nodes) and len(hosts) < nodes:
        problems.append(
            f"hostfile={str(hostfile)!r}: lists {len(hosts)} host(s); --nodes {nodes} needs at "
            f"least {nodes}"
        )
    if is_int(gpus):
        short = [h for h, slots in hosts[: nodes if is_int(nodes) else None] if slots < gpus]
        if short:
            problems.append(
                f"hostfile={str(hostfile)!r}: {', '.join(short)} have fewer than {gpus} slots "
                f"(gpus={gpus} per node)"
            )
    return path


def _check_out_dir(out_dir: Any, problems: list[str]) -> Path | None:
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
        problems.append(f"out_dir={out_dir!r}: must be a directory path")
        return None
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not out.is_dir():
        problems.append(f"out_dir={str(out_dir)!r}: exists and is not a directory")
        return None
    existing = out if out.exists() else next(p for p in out.parents if p.exists())
    if not existing.is_dir():
        problems.append(f"out_dir={str(out_dir)!r}: {existing} is not a directory")
    elif not os.access(existing, os.W_OK | os.X_OK):
        problems.append(f"out_dir={str(out_dir)!r}: {existing} is not writable")
    return out


# --------------------------------------------------------------------------- writing
def _write(job: _Job) -> None:
    """Write every file into a temporary directory next to `job.out`, then move them into
    place; on failure remove what was created (ExportError naming out_dir)."""
    out = job.out
    missing = [p for p in (out, *out.parents) if not p.exists()]
    tmp: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        for name, text in job.files.items():
            path = tmp / name
            path.write_text(text)
            if name in job.executable:
                path.chmod(0o755)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        if not out.exists():
            tmp.rename(out)  # one atomic step when out_dir is new
            return
        for name in job.files:
            os.replace(tmp / name, out / name)  # each file complete or not there
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for p in missing:  # deepest first
            with contextlib.suppress(OSError):
                p.rmdir()
        raise ExportError(
            [f"out_dir={str(out)!r}: cannot write there ({exc.strerror or exc})"]
        ) from exc
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _commands(format: str, *, gpus: int, nodes: int, hostfile: str) -> dict[str, str]:
    script = SCRIPTS[format]
    multinode_torchrun = (
        f"torchrun --nnodes {nodes} --nproc-per-node {gpus} --node-rank $NODE_RANK "
        f"--master-addr $MASTER_ADDR --master-port {MASTER_PORT} {script}"
    )
    if format == "fsdp":
        single = f"torchrun --standalone --nproc-per-node {gpus} {script}"
        return {
            "single": single,
            "torchrun": single,
            "multinode": multinode_torchrun,
            "multinode_torchrun": multinode_torchrun,
        }
    if format == "lightning":
        devices = f"--devices {gpus}"
        return {
            "single": f"python {script} {devices}",
            "torchrun": f"torchrun --standalone --nproc-per-node {gpus} {script} {devices}",
            "multinode": f"{multinode_torchrun} {devices}",
            "multinode_torchrun": f"{multinode_torchrun} {devices}",
        }
    tail = f"{script} --deepspeed_config {CONFIG_NAME}"
    host = shlex.quote(hostfile)
    return {
        "single": f"deepspeed --num_gpus {gpus} {tail}",
        "torchrun": f"torchrun --standalone --nproc-per-node {gpus} {tail}",
        "multinode": (f"deepspeed --hostfile {host} --num_nodes {nodes} --num_gpus {gpus} {tail}"),
        "multinode_torchrun": f"{multinode_torchrun} --deepspeed_config {CONFIG_NAME}",
    }


def describe(config: TrainConfig, model: str) -> str:
    """One line naming the model and the settings that shape the job."""
    engine = FsdpMode(config.fsdp)
    parts = [
        model,
        f"FSDP {engine.value}" if engine is not FsdpMode.OFF else f"ZeRO stage {config.zero_stage}",
        str(config.precision),
        str(config.optimizer),
        f"micro-batch {config.micro_batch}",
        f"grad-accum {config.grad_accum}",
    ]
    if OffloadDevice(config.offload_optimizer) is not OffloadDevice.NONE:
        parts.append(f"optimizer offload to {config.offload_optimizer}")
    if OffloadDevice(config.offload_params) is not OffloadDevice.NONE:
        parts.append(f"parameter offload to {config.offload_params}")
    return ", ".join(parts)


def _launch_sh(
    format: str,
    config: TrainConfig,
    model: str,
    gpus: int,
    nodes: int,
    primary: str,
    commands: dict[str, str],
) -> str:
    world = gpus * nodes
    script = SCRIPTS[format]
    if format == "deepspeed" and nodes == 1:
        several = f"""# One node with torchrun instead of DeepSpeed's launcher:
#   {commands["torchrun"]}
# Several nodes: re-export with `workbench export --format deepspeed --nodes M --hostfile FILE`
# (train_batch_size = micro-batch x grad-accum x world size changes with the world size).
# One process without any launcher (rank 0 of 1, set up by the script; CPU works with gloo),
# for a config exported with --gpus 1:
#   python {script} --deepspeed_config {CONFIG_NAME} --steps 2"""
    elif format == "deepspeed":
        several = f"""# DeepSpeed's launcher runs every rank from this node over ssh (hostfile: one
# 'HOSTNAME slots=GPUS' line per node; this directory at the same path on every node).
# With torchrun instead, run on every node (NODE_RANK 0..{nodes - 1}, MASTER_ADDR = node 0):
#   {commands["multinode_torchrun"]}"""
    elif format == "fsdp":
        several = f"""# Several nodes: run on every node (NODE_RANK 0..N-1, MASTER_ADDR = node 0):
#   {commands["multinode_torchrun"].replace(f"--nnodes {nodes}", "--nnodes N")}
# One process without any launcher (rank 0 of 1; CPU works with gloo):
#   python {script} --steps 2"""
    else:
        several = f"""# Under torchrun instead of Lightning's own process launch:
#   {commands["torchrun"]}
# One process on this machine's CPU or GPU:
#   python {script} --devices 1 --steps 2"""
    return f"""#!/usr/bin/env bash
# {describe(config, model)}
# world size {world} ({gpus} GPU(s) x {nodes} node(s)); exported by `workbench export --format {format}`.
# Extra arguments go to the training script, e.g. `bash launch.sh --steps 100`.
set -euo pipefail
cd "$(dirname "$0")"
exec {primary} "$@"

{several}
"""


def _hostfile_template(nodes: int, gpus: int) -> str:
    lines = [
        "# DeepSpeed hostfile: one line per node, 'HOSTNAME slots=GPUS'. Replace the names",
        "# below with your nodes' host names (reachable by passwordless ssh).",
    ]
    lines += [f"node-{i} slots={gpus}" for i in range(1, nodes + 1)]
    return "\n".join(lines) + "\n"


def _estimate(config: TrainConfig, model: str, options: dict[str, Any], world: int) -> Any:
    """The per-GPU prediction for a built-in model (None for a factory, whose size is not
    known without importing it)."""
    if ":" in model:
        return None
    from workbench.models import build_model
    from workbench.prediction import predict_memory

    _module, _data, _loss, info = build_model(model, seed=int(config.seed), **options)
    return predict_memory(config, info, world)


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
        "activation_checkpointing": bool(config.activation_checkpointing),
        "exported_world_size": world,
        "config": config.to_dict(),
    }


def _script_text(name: str) -> str:
    """A job file as the package ships it (`train_deepspeed.py`, `job_common.py` beside
    this module), copied verbatim."""
    return (Path(__file__).with_name(name)).read_text()
