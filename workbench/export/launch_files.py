"""A job's launch commands and the text of its `launch.sh` and `hostfile` template.

`workbench.export` writes them beside the training script; `launch_commands` gives the command
of each way to start a job (DeepSpeed's launcher, torchrun, Lightning's own launch, one
node or several), `launch_sh` the script that runs the primary one with the others in its
comments.
"""

from __future__ import annotations

import shlex
from typing import Any

from workbench.config import FsdpMode, OffloadDevice, TrainConfig

CONFIG_NAME = "ds_config.json"
SCRIPT_NAME = "train_deepspeed.py"
#: the training script of each format (a module of this package, copied as is)
SCRIPTS = {
    "deepspeed": "train_deepspeed.py",
    "fsdp": "train_fsdp.py",
    "lightning": "train_lightning.py",
}
MASTER_PORT = 29500
#: why a job is re-exported for another world size, ending a launch.sh comment
RESIZED = """
# (the job refuses to run on another world size: its global batch, micro-batch x
# grad-accum x data-parallel ranks, and learning rate were chosen for this one)."""


def model_flag(model: str, options: dict[str, Any] | None = None) -> str:
    """ " --model SPEC" for a factory model (the scripts import a factory only when their
    command line names it too), " --text PATH" for a built-in's text file (read only when
    the command line names it too), "" for a built-in one on its own data."""
    if ":" in model:
        return f" --model {shlex.quote(model)}"
    text = (options or {}).get("text")
    return f" --text {shlex.quote(str(text))}" if text is not None else ""


def launch_commands(
    format: str,
    *,
    gpus: int,
    nodes: int,
    hostfile: str,
    model: str,
    options: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The launch commands of a job; each passes `--model SPEC` for a factory model and
    `--text PATH` for a built-in's text file."""
    script = SCRIPTS[format]
    multinode_torchrun = (
        f"torchrun --nnodes {nodes} --nproc-per-node {gpus} --node-rank $NODE_RANK "
        f"--master-addr $MASTER_ADDR --master-port {MASTER_PORT} {script}"
    )
    if format == "fsdp":
        single = f"torchrun --standalone --nproc-per-node {gpus} {script}"
        commands = {
            "single": single,
            "torchrun": single,
            "multinode": multinode_torchrun,
            "multinode_torchrun": multinode_torchrun,
        }
    elif format == "lightning":
        devices = f"--devices {gpus}"
        commands = {
            "single": f"python {script} {devices}",
            "torchrun": f"torchrun --standalone --nproc-per-node {gpus} {script} {devices}",
            "multinode": f"{multinode_torchrun} {devices} --num-nodes {nodes}",
            "multinode_torchrun": f"{multinode_torchrun} {devices} --num-nodes {nodes}",
        }
    else:
        tail = f"{script} --deepspeed_config {CONFIG_NAME}"
        host = shlex.quote(hostfile)
        commands = {
            "single": f"deepspeed --num_gpus {gpus} {tail}",
            "torchrun": f"torchrun --standalone --nproc-per-node {gpus} {tail}",
            "multinode": f"deepspeed --hostfile {host} --num_nodes {nodes} --num_gpus {gpus} {tail}",
            "multinode_torchrun": f"{multinode_torchrun} --deepspeed_config {CONFIG_NAME}",
        }
    flag = model_flag(model, options)
    return {kind: command + flag for kind, command in commands.items()}


def describe(config: TrainConfig, model: str, strategy: str | None = None) -> str:
    """One line naming the model and the settings that shape the job; `strategy`: a
    Lightning job's strategy (its data-parallel and tensor-parallel jobs run no ZeRO)."""
    engine = FsdpMode(config.fsdp)
    if engine is not FsdpMode.OFF:
        layout = f"FSDP {engine.value}" + (f", tp {config.tp}" if int(config.tp) > 1 else "")
    elif strategy == "tensor-parallel":
        layout = f"tensor parallel tp {config.tp}"
    elif strategy == "ddp":
        layout = "data parallel (DDP)"
    else:
        layout = f"ZeRO stage {config.zero_stage}"
    parts = [
        model,
        layout,
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


def launch_sh(
    format: str,
    config: TrainConfig,
    model: str,
    gpus: int,
    nodes: int,
    primary: str,
    commands: dict[str, str],
    *,
    options: dict[str, Any] | None = None,
    strategy: str | None = None,
) -> str:
    """The job's `launch.sh`: runs `primary`, with the other ways to start it in comments
    (`strategy`: a Lightning job's, for its description)."""
    world = gpus * nodes
    script = SCRIPTS[format]
    flag = model_flag(model, options)
    if format == "deepspeed" and nodes == 1:
        several = f"""# One node with torchrun instead of DeepSpeed's launcher:
#   {commands["torchrun"]}
# Several nodes: re-export with `workbench export --format deepspeed --nodes M --hostfile FILE`
# (train_batch_size = micro-batch x grad-accum x world size changes with the world size).
# One process without any launcher (rank 0 of 1, set up by the script; CPU works with gloo),
# for a config exported with --gpus 1:
#   python {script} --deepspeed_config {CONFIG_NAME} --steps 2{flag}"""
    elif format == "deepspeed":
        several = f"""# DeepSpeed's launcher runs every rank from this node over ssh (hostfile: one
# 'HOSTNAME slots=GPUS' line per node; this directory at the same path on every node).
# With torchrun instead, run on every node (NODE_RANK 0..{nodes - 1}, MASTER_ADDR = node 0):
#   {commands["multinode_torchrun"]}"""
    elif nodes == 1:
        devices = " --devices 1" if format == "lightning" else ""
        several = f"""# Several nodes: re-export with `workbench export --format {format} --gpus G --nodes M`,
# whose launch.sh runs torchrun on every node{RESIZED}
# One process without any launcher (CPU works with gloo), for a job exported with --gpus 1:
#   python {script}{devices} --steps 2{flag}"""
        if format == "lightning":
            several = f"""# Under torchrun instead of Lightning's own process launch:
#   {commands["torchrun"]}
{several}"""
    else:
        several = f"""# Run this on every node: NODE_RANK 0..{nodes - 1}, MASTER_ADDR = node 0's address, this
# directory at the same path on each. Other GPU or node counts: re-export with
# `workbench export --format {format} --gpus G --nodes M`{RESIZED}"""
    factory = (
        f"\n# --model {model}: the scripts import a factory only when their command line names it"
        if ":" in model
        else "\n# --text: the scripts read the text file job.json names only when their command "
        "line names it too"
        if flag
        else ""
    )
    resume = (
        f"# Checkpoints: every {config.checkpoint_every_steps or '-'} steps / "
        f"{config.checkpoint_every_seconds or '-'} s into {config.checkpoint_dir} and on "
        "SIGTERM; run again with\n# `--resume auto` to continue from the newest."
        if config.checkpoint_dir
        else "# A job the cluster may stop: `bash launch.sh --checkpoint-dir DIR "
        "--checkpoint-every-steps N --resume auto`\n# saves every N steps and on SIGTERM, "
        "and goes on from DIR's newest checkpoint when run again."
    )
    return f"""#!/usr/bin/env bash
# {describe(config, model, strategy)}
# world size {world} ({gpus} GPU(s) x {nodes} node(s)); exported by `workbench export --format {format}`.
# Extra arguments go to the training script, e.g. `bash launch.sh --steps 100`.{factory}
{resume}
set -euo pipefail
cd "$(dirname "$0")"
exec {primary} "$@"

{several}
"""


def hostfile_template(nodes: int, gpus: int) -> str:
    """A DeepSpeed hostfile to fill in: one line per node."""
    lines = [
        "# DeepSpeed hostfile: one line per node, 'HOSTNAME slots=GPUS'. Replace the names",
        "# below with your nodes' host names (reachable by passwordless ssh).",
    ]
    lines += [f"node-{i} slots={gpus}" for i in range(1, nodes + 1)]
    return "\n".join(lines) + "\n"
