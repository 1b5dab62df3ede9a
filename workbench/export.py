"""`workbench export --format deepspeed`: a TrainConfig as a ready-to-run DeepSpeed job.

    from workbench import TrainConfig
    from workbench.export import export_deepspeed

    result = export_deepspeed(TrainConfig(zero_stage=2, precision="bf16"), gpus=8, out_dir="job")
    print(result.command)   # deepspeed --num_gpus 8 train_deepspeed.py --deepspeed_config ...

writes into `out_dir`:

* `ds_config.json`: `config.to_deepspeed(world_size=gpus * nodes)`, exactly what the
  in-notebook DeepSpeed backend derives its engine config from;
* `train_deepspeed.py`: a standalone training script (needs torch, deepspeed and, for a
  built-in model, workbench) that trains the model on N ranks through
  `deepspeed.initialize`, reading the JSON. It runs under the `deepspeed` launcher, under
  `torchrun`, and as a plain `python train_deepspeed.py` (one process: it sets up the
  rank-0-of-1 environment itself; CPU with gloo works too). What DeepSpeed JSON cannot say
  (model, seed, steps, data-loader settings, activation checkpointing) is written into
  the script's constants; the number of steps defaults to `config.total_steps` and
  `--steps` overrides it. Rank 0 prints one JSON line per optimizer step;
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

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.cli_config import (
    CONFIG_FLAGS,
    add_config_flags,
    as_flag_value,
    config_from_args,
    lenient_number,
    problem_lines,
    raw_values,
)
from workbench.config import OffloadDevice, TrainConfig

FORMATS = ("deepspeed",)
CONFIG_NAME = "ds_config.json"
SCRIPT_NAME = "train_deepspeed.py"
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
    ds_config_path: str
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
def export_deepspeed(
    config: TrainConfig,
    *,
    gpus: int,
    out_dir: str | os.PathLike[str],
    model: str = "tiny-gpt",
    nodes: int = 1,
    hostfile: str | os.PathLike[str] | None = None,
    model_options: dict[str, Any] | None = None,
    steps: int | None = None,
    warnings: tuple[str, ...] | list[str] = (),
) -> ExportResult:
    """Write `ds_config.json`, `train_deepspeed.py` and `launch.sh` into `out_dir` for
    `gpus` ranks on each of `nodes` nodes (see the module docstring).

    `steps`: optimizer steps the script runs by default (None: `config.total_steps`).
    `warnings`: lines to carry into the result (e.g. from importing a DeepSpeed config).
    Raises ValueError naming every bad argument at once; nothing is written then.
    """
    problems: list[str] = []
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={config!r}: must be a workbench.TrainConfig")
    for name, value in (("gpus", gpus), ("nodes", nodes)):
        if not _is_int(value) or value < 1:
            problems.append(f"{name}={value!r}: must be an integer >= 1")
    if steps is not None and (not _is_int(steps) or steps < 1):
        problems.append(f"steps={steps!r}: must be an integer >= 1 or None")
    options = _check_model(model, model_options, problems)
    host_path = _check_hostfile(hostfile, nodes, gpus, problems)
    out = _check_out_dir(out_dir, problems)
    ds: dict[str, Any] = {}
    if not problems:
        try:
            ds = config.to_deepspeed(world_size=gpus * nodes)
        except ValueError as exc:
            problems.append(_one_line(exc))
    if problems:
        raise ExportError(problems)
    assert out is not None

    world = gpus * nodes
    total_steps = int(config.total_steps) if steps is None else steps
    template = nodes > 1 and host_path is None
    hostfile_text = str(host_path) if host_path is not None else HOSTFILE_NAME
    commands = _commands(gpus=gpus, nodes=nodes, hostfile=hostfile_text)
    primary = commands["multinode"] if (nodes > 1 or host_path is not None) else commands["single"]
    estimate = _estimate(config, model, options, world)
    files = {
        CONFIG_NAME: json.dumps(ds, indent=2) + "\n",
        SCRIPT_NAME: _script(config, model=model, options=options, steps=total_steps, world=world),
        LAUNCH_NAME: _launch_sh(config, model, gpus, nodes, primary, commands),
    }
    if template:
        files[HOSTFILE_NAME] = _hostfile_template(nodes, gpus)
    _write(_Job(out, files, frozenset({SCRIPT_NAME, LAUNCH_NAME})))
    if template:
        host_path = out / HOSTFILE_NAME
    return ExportResult(
        out_dir=str(out),
        ds_config_path=str(out / CONFIG_NAME),
        script_path=str(out / SCRIPT_NAME),
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
    )


# --------------------------------------------------------------------------- checks
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _one_line(exc: BaseException) -> str:
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
        if _is_int(default) and key != "seed" and (not _is_int(value) or value < 1):
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
    if _is_int(nodes) and len(hosts) < nodes:
        problems.append(
            f"hostfile={str(hostfile)!r}: lists {len(hosts)} host(s); --nodes {nodes} needs at "
            f"least {nodes}"
        )
    if _is_int(gpus):
        short = [h for h, slots in hosts[: nodes if _is_int(nodes) else None] if slots < gpus]
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


def _commands(*, gpus: int, nodes: int, hostfile: str) -> dict[str, str]:
    tail = f"{SCRIPT_NAME} --deepspeed_config {CONFIG_NAME}"
    host = shlex.quote(hostfile)
    return {
        "single": f"deepspeed --num_gpus {gpus} {tail}",
        "torchrun": f"torchrun --standalone --nproc-per-node {gpus} {tail}",
        "multinode": (f"deepspeed --hostfile {host} --num_nodes {nodes} --num_gpus {gpus} {tail}"),
        "multinode_torchrun": (
            f"torchrun --nnodes {nodes} --nproc-per-node {gpus} --node-rank $NODE_RANK "
            f"--master-addr $MASTER_ADDR --master-port {MASTER_PORT} {tail}"
        ),
    }


def _describe(config: TrainConfig, model: str) -> str:
    parts = [
        model,
        f"ZeRO stage {config.zero_stage}",
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
    config: TrainConfig,
    model: str,
    gpus: int,
    nodes: int,
    primary: str,
    commands: dict[str, str],
) -> str:
    world = gpus * nodes
    if nodes == 1:
        several = f"""# One node with torchrun instead of DeepSpeed's launcher:
#   {commands["torchrun"]}
# Several nodes: re-export with `workbench export --format deepspeed --nodes M --hostfile FILE`
# (train_batch_size = micro-batch x grad-accum x world size changes with the world size)."""
    else:
        several = f"""# DeepSpeed's launcher runs every rank from this node over ssh (hostfile: one
# 'HOSTNAME slots=GPUS' line per node; this directory at the same path on every node).
# With torchrun instead, run on every node (NODE_RANK 0..{nodes - 1}, MASTER_ADDR = node 0):
#   {commands["multinode_torchrun"]}"""
    return f"""#!/usr/bin/env bash
# {_describe(config, model)}
# world size {world} ({gpus} GPU(s) x {nodes} node(s)); exported by `workbench export --format deepspeed`.
# Extra arguments go to the training script, e.g. `bash launch.sh --steps 100`.
set -euo pipefail
cd "$(dirname "$0")"
exec {primary} "$@"

{several}
# One process without any launcher (rank 0 of 1, set up by the script; CPU works with gloo),
# for a config exported with --gpus 1:
#   python {SCRIPT_NAME} --deepspeed_config {CONFIG_NAME} --steps 2
"""


def _hostfile_template(nodes: int, gpus: int) -> str:
    lines = [
        "# DeepSpeed hostfile: one line per node, 'HOSTNAME slots=GPUS'. Replace the names",
        "# below with your nodes' host names (reachable by passwordless ssh).",
    ]
    lines += [f"node-{i} slots={gpus}" for i in range(1, nodes + 1)]
    return "\n".join(lines) + "\n"


def _estimate(config: TrainConfig, model: str, options: dict[str, Any], world: int) -> Any:
    """The estimator's per-GPU figure for a built-in model (None for a factory)."""
    if ":" in model:
        return None
    from workbench.estimate import estimate_memory
    from workbench.models import build_model

    _module, _data, _loss, info = build_model(model, seed=int(config.seed), **options)
    shape: dict[str, Any] = {}
    if info.is_transformer:
        shape = dict(
            layers=info.layers,
            hidden=info.hidden,
            heads=info.heads,
            seq_len=info.seq_len,
            vocab=info.vocab,
        )
    return estimate_memory(
        n_params=info.n_params,
        precision=str(config.precision),
        optimizer=str(config.optimizer),
        zero_stage=int(config.zero_stage),
        gpus=world,
        micro_batch=int(config.micro_batch),
        offload_optimizer=OffloadDevice(config.offload_optimizer) is not OffloadDevice.NONE,
        offload_params=OffloadDevice(config.offload_params) is not OffloadDevice.NONE,
        checkpointing="full" if config.activation_checkpointing else "none",
        **shape,
    )


def _script(
    config: TrainConfig, *, model: str, options: dict[str, Any], steps: int, world: int
) -> str:
    constants = "\n".join(
        [
            f"MODEL = {model!r}",
            f"MODEL_OPTIONS: dict[str, Any] = {options!r}",
            f"SEED = {int(config.seed)!r}",
            f"STEPS = {steps!r}",
            f"NUM_WORKERS = {int(config.num_workers)!r}",
            f"PIN_MEMORY = {bool(config.pin_memory)!r}",
            f"ACTIVATION_CHECKPOINTING = {bool(config.activation_checkpointing)!r}",
            f"EXPORTED_WORLD_SIZE = {world!r}",
        ]
    )
    header = _SCRIPT_HEAD.replace("@DESCRIPTION@", _describe(config, model))
    return header + constants + "\n" + _SCRIPT_BODY


_SCRIPT_HEAD = '''#!/usr/bin/env python
"""Train with DeepSpeed: @DESCRIPTION@.

Exported by `workbench export --format deepspeed`. Run it in this directory:

    deepspeed --num_gpus N train_deepspeed.py --deepspeed_config ds_config.json
    torchrun --standalone --nproc-per-node N train_deepspeed.py --deepspeed_config ds_config.json
    python train_deepspeed.py --deepspeed_config ds_config.json     # one process, no launcher

ds_config.json holds the batch sizes, optimizer, learning-rate schedule, precision,
gradient clipping and ZeRO settings. This file holds what DeepSpeed JSON cannot: the model,
the seed, the number of steps and the data loader. Rank 0 prints one JSON line per
optimizer step ({"step": ..., "loss": ...}); `--save_dir DIR` saves a DeepSpeed checkpoint
at the end.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import sys
import time
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from torch.utils.data import DataLoader, DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
'''

_SCRIPT_BODY = '''

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--deepspeed_config", "--deepspeed-config",
                        default=os.path.join(HERE, "ds_config.json"))
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help="set by the deepspeed launcher")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps ({STEPS})")
    parser.add_argument("--save_dir", "--save-dir", default=None,
                        help="save a DeepSpeed checkpoint here at the end")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: must be an integer >= 1")
    return args


def fail(message: str) -> None:
    print(f"train_deepspeed.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def single_process_env() -> None:
    """Without a launcher: rank 0 of 1 on a free loopback port."""
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      LOCAL_RANK="0", WORLD_SIZE="1")


def build(seed: int) -> tuple[torch.nn.Module, Any, Any]:
    """(module, dataset, loss_fn) of MODEL: a workbench built-in or 'pkg.module:function'."""
    torch.manual_seed(seed)
    if ":" in MODEL:
        module_name, _, function = MODEL.partition(":")
        sys.path.insert(0, os.getcwd())
        try:
            factory = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as exc:
            fail(f"model {MODEL!r}: cannot import the factory ({exc})")
        built = factory(**MODEL_OPTIONS)
    else:
        try:
            from workbench.models import build_model
        except ImportError as exc:
            fail(f"model {MODEL!r} is a workbench built-in: pip install workbench ({exc})")
        built = build_model(MODEL, seed=seed, **MODEL_OPTIONS)
    if not (isinstance(built, tuple) and len(built) in (3, 4)
            and isinstance(built[0], torch.nn.Module) and callable(built[2])):
        fail(f"model {MODEL!r}: the factory must return (module, dataset, loss_fn)")
    module, dataset, loss_fn = built[0], built[1], built[2]
    if ACTIVATION_CHECKPOINTING:
        from workbench.train.checkpointing import (
            checkpointable_modules,
            set_activation_checkpointing,
        )

        if not checkpointable_modules(module):
            fail("activation checkpointing is on but the model has no checkpointable blocks")
        set_activation_checkpointing(module, True)
    return module, dataset, loss_fn


def half_dtype(ds_config: dict[str, Any]) -> torch.dtype | None:
    """The dtype DeepSpeed casts the weights to (inputs are cast to match)."""
    if ds_config.get("fp16", {}).get("enabled"):
        return torch.float16
    for key in ("bf16", "bfloat16"):
        if ds_config.get(key, {}).get("enabled"):
            return torch.bfloat16
    return None


def batches(loader: DataLoader, sampler: DistributedSampler) -> Any:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with open(args.deepspeed_config) as f:
        ds_config = json.load(f)
    single_process_env()
    accelerator = get_accelerator()
    deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name())
    world, rank = dist.get_world_size(), dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    if accelerator.device_name() != "cpu":
        accelerator.set_device(local_rank)

    micro = int(ds_config["train_micro_batch_size_per_gpu"])
    accum = int(ds_config.get("gradient_accumulation_steps", 1))
    if ds_config.get("train_batch_size", micro * accum * world) != micro * accum * world:
        fail(
            f"{args.deepspeed_config}: train_batch_size={ds_config['train_batch_size']} was "
            f"exported for world size {EXPORTED_WORLD_SIZE} (micro {micro} x accum {accum} x "
            f"world size); this run has {world} rank(s). Launch {EXPORTED_WORLD_SIZE} ranks, or "
            f"re-export with `workbench export --format deepspeed --gpus {world}`"
        )

    module, dataset, loss_fn = build(SEED)
    dtype = half_dtype(ds_config)
    if dtype is not None:
        def cast_inputs(_module: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x
                         for x in inputs)

        module.register_forward_pre_hook(cast_inputs)
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=ds_config,
    )
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=SEED, drop_last=True)
    loader = DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=True,
                        num_workers=NUM_WORKERS, pin_memory=PIN_MEMORY)
    data = batches(loader, sampler)
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                   for p in engine.module.parameters())
    if rank == 0:
        print(json.dumps({"event": "start", "model": MODEL, "world_size": world,
                          "zero_stage": engine.zero_optimization_stage(), "n_params": n_params,
                          "micro_batch": micro, "grad_accum": accum, "steps": args.steps}),
              flush=True)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        skipped_before = engine.skipped_steps
        total = torch.zeros((), device=engine.device)
        for _ in range(accum):
            inputs, targets = next(data)
            inputs, targets = inputs.to(engine.device), targets.to(engine.device)
            outputs = engine(inputs)
            loss = loss_fn(outputs.float(), targets)
            engine.backward(loss)
            engine.step()  # steps the optimizer at the accumulation boundary only
            total += loss.detach().float()
        dist.all_reduce(total)  # mean loss over ranks and micro-batches
        loss_value = total.item() / (accum * world)  # host waits for the device here
        norm = engine.get_global_grad_norm()
        if rank == 0:
            print(json.dumps({
                "step": step,
                "loss": loss_value,
                "lr": float(engine.get_lr()[0]),
                "grad_norm": None if norm is None else float(norm),
                "skipped": engine.skipped_steps > skipped_before,
                "step_seconds": time.perf_counter() - t0,
            }), flush=True)
    if args.save_dir:
        engine.save_checkpoint(args.save_dir)
    if rank == 0:
        print(json.dumps({"event": "done", "steps": args.steps}), flush=True)
    engine.destroy()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


# --------------------------------------------------------------------------- CLI
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
    job.add_argument("--format", default="deepspeed", help="export format: deepspeed (deepspeed)")
    job.add_argument(
        "--out",
        metavar="DIR",
        default="deepspeed_job",
        help="directory to write into (deepspeed_job)",
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


def _as_flags(line: str, raw: dict[str, str]) -> str:
    """An export problem line with argument names written as the CLI's flags and the
    values as typed."""
    line = re.sub(r"^model_options\['(\w+)'\]=", r"--model-option \1=", line)
    line = re.sub(r"^model_options ", "--model-option ", line)
    return as_flag_value(line, _FLAGS, raw)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `workbench export` on parsed arguments; returns the exit status."""
    if args.format.strip().lower() not in FORMATS:
        parser.error(f"--format {args.format}: allowed formats: {', '.join(FORMATS)}")
    problems: list[str] = []
    gpus = lenient_number(args.gpus, "int") if args.gpus is not None else None
    nodes = lenient_number(args.nodes, "int")
    steps = lenient_number(args.steps, "int") if args.steps is not None else None
    for flag, value, text in (
        ("--gpus", gpus, args.gpus),
        ("--nodes", nodes, args.nodes),
        ("--steps", steps, args.steps),
    ):
        if value is not None and (not _is_int(value) or value < 1):
            problems.append(f"{flag} {text}: must be an integer >= 1")
    options: dict[str, Any] = {}
    for item in args.model_option:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"--model-option {item}: must be KEY=VALUE, e.g. layers=2")
            continue
        try:
            options[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            options[key.strip()] = text

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
    if problems:
        parser.error("; ".join(problems))
    assert config is not None
    try:
        result = export_deepspeed(
            config,
            gpus=gpus,
            out_dir=args.out,
            model=args.model,
            nodes=nodes,
            hostfile=args.hostfile,
            model_options=options,
            steps=steps,
            warnings=warns,
        )
    except ExportError as exc:
        raw = raw_values(args, _CONFIG_FIELDS) | _export_raw(args)
        parser.error("; ".join(_as_flags(p, raw) for p in exc.problems))
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(_report(result, config))
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
    the missing one is solved for the new world size."""
    from workbench.dsconfig import import_deepspeed

    try:
        imported = import_deepspeed(args.config)
    except ValueError as exc:
        problems.append(f"--config {args.config}: {_one_line(exc)}")
        return None, gpus, ()
    warns = list(imported.warnings)
    if not (_is_int(nodes) and nodes >= 1):
        return imported.config, gpus, tuple(warns)
    if gpus is None:
        if imported.world_size % nodes:
            problems.append(
                f"--nodes {args.nodes}: the config's batch keys imply world size "
                f"{imported.world_size}, not a multiple of {nodes} nodes; give --gpus"
            )
        return imported.config, max(1, imported.world_size // nodes), tuple(warns)
    if not (_is_int(gpus) and gpus >= 1) or gpus * nodes == imported.world_size:
        return imported.config, gpus, tuple(warns)
    with open(args.config) as f:
        raw = json.load(f)
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
    try:
        imported = import_deepspeed(args.config, world_size=gpus * nodes)
    except ValueError as exc:
        problems.append(f"--config {args.config}: {_one_line(exc)}")
        return None, gpus, ()
    return imported.config, gpus, imported.warnings


def _export_raw(args: argparse.Namespace) -> dict[str, str]:
    raw = {
        "gpus": args.gpus,
        "nodes": args.nodes,
        "hostfile": args.hostfile,
        "model": args.model,
        "out_dir": args.out,
        "steps": args.steps,
    }
    return {k: str(v) for k, v in raw.items() if v is not None}


def _report(result: ExportResult, config: TrainConfig) -> str:
    ds = result.ds_config
    lines = [
        f"wrote {result.out_dir}: " + ", ".join(Path(p).name for p in result.paths),
        f"{_describe(config, result.model)}",
        f"world size {result.world_size} ({result.gpus} GPU(s) x {result.nodes} node(s)): "
        f"train_batch_size {ds['train_batch_size']} = micro-batch "
        f"{ds['train_micro_batch_size_per_gpu']} x grad-accum "
        f"{ds['gradient_accumulation_steps']} x {result.world_size}",
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
            line += f"; offloaded to CPU {_size(e.cpu_offload_bytes)}"
        lines.append(line)
    lines += [
        f"run (in {result.out_dir}):",
        f"  {result.command}",
        f"  or: bash {shlex.quote(result.launch_path)}",
    ]
    if result.nodes == 1:
        lines += [
            f"  or: {result.torchrun_command}",
            "  several nodes: re-export with --nodes M --hostfile FILE (train_batch_size grows "
            "with the world size)",
        ]
    else:
        lines.append(f"  or, torchrun on every node: {result.multinode_torchrun_command}")
    if result.hostfile_path in result.paths:
        lines.append(f"  edit {result.hostfile_path}: one 'HOSTNAME slots=GPUS' line per node")
    return "\n".join(lines)


__all__ = ["FORMATS", "ExportError", "ExportResult", "add_parser", "export_deepspeed"]
