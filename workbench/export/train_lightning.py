#!/usr/bin/env python
"""Train with Lightning: the job `workbench export --format lightning` wrote beside this file.

Run it in its directory:

    python train_lightning.py --devices N       # Lightning starts the N processes itself
    torchrun --standalone --nproc-per-node N train_lightning.py --devices N
    torchrun --nnodes M --nproc-per-node N --node-rank R --master-addr HOST0 ...
        train_lightning.py --devices N --num-nodes M     # on every node (launch.sh says all)

N x M must be the world size the job was exported for (job.json's `exported_world_size`:
the global batch is chosen for it); another is refused before training, as are a launcher's
WORLD_SIZE other than N x M and a node rank past M - 1. `--num-nodes` is the Trainer's
`num_nodes`: one model trains over every node's ranks.

`job.json` holds the model (a workbench built-in name, or an importable factory
"pkg.module:function" found from the current folder, imported only when `--model SPEC`
names it too or `--trust-model-spec` is given), its options, the seed, the number
of steps, the training settings (`config`: the workbench TrainConfig as a dict) and the
Lightning strategy the settings map to: DeepSpeed's (`ds_config.json` beside this file:
the ZeRO stage, offload and 16-bit settings; Lightning runs the optimizer, schedule and
batch sizes) for ZeRO or DeepSpeed 16-bit, FSDP's (`sharding_strategy` from `fsdp`,
blocks the workbench marked wrapped, `offload_params="cpu"` as its `cpu_offload`, and
with `fsdp_reduce_fp32` a MixedPrecision reducing gradients in fp32) for FSDP, Lightning's ModelParallelStrategy for
`tp` > 1 (`configure_model` splits the layers over the tensor-parallel dimension with
`job_common.tensor_parallelize`, then shards over the data-parallel one with FSDP2; the
loss and its backward vocabulary-parallel), else data parallel. This file and
`job_common.py` are the same for every job (shipped in `workbench/export/`, copied as is).
It needs torch and lightning (and deepspeed for its strategy); workbench only for a
built-in model or activation checkpointing. Lightning's DeepSpeed and FSDP strategies run
on CUDA GPUs only (the script says so and stops on a CPU); data parallel runs anywhere.
The precision is Lightning's name for it (`PRECISION`: "amp-bf16" is "bf16-mixed", pure
bf16 "bf16-true" is "bf16-true", Lightning's model cast to bf16 without a master copy).
`activation_offload` runs each training step's forward under `job_common`'s offload hooks
(saved activations in pinned host memory on a GPU; nothing moves on a CPU).
Each data-parallel rank reads its own share of the samples, in the order of the Session's
ranks and the FSDP and DeepSpeed jobs (`JobData`: `job_common.data_loader` built once the
strategy knows the ranks).

Rank 0 prints one JSON line per optimizer step, as `train_deepspeed.py` and `train_fsdp.py`
do: {"step", "loss" (the mean over ranks and the step's micro-batches), "lr" (the rate the
step applied), "grad_norm" (before clipping; None under Lightning's FSDP strategy, whose
sharded norm Lightning does not give), "skipped" (a step the loss scaler skipped),
"step_seconds"}. Lightning's FSDP strategy does not clip by norm (its FSDPPrecision raises):
the export refuses `clip_grad_norm` with it, and so does this script.
`--save-dir DIR` writes the trained weights at the end (data parallel and tensor parallel:
model.safetensors, or with LoRA the adapters alone in peft's format).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported from the package (the workbench, its tests): the package's modules
    from workbench.export.job_common import (
        JOB_NAME,
        add_model_arguments,
        add_save_argument,
        approve_model,
        build,
        check_save_dir,
        check_world_size,
        data_loader,
        fail,
        full_state,
        loss_of,
        lr_multiplier,
        make_optimizer,
        marked_blocks,
        offload_stream,
        read_job,
        resolve_units,
        save_trained,
        sharded_grad_norm,
        tensor_parallelize,
    )
else:  # run as a script: the job_common.py beside it, as exported (or as its user edited
    # it), never an installed workbench's copy, which may be another version
    sys.path.insert(0, HERE)
    from job_common import (  # type: ignore[no-redef, import-not-found]
        JOB_NAME,
        add_model_arguments,
        add_save_argument,
        approve_model,
        build,
        check_save_dir,
        check_world_size,
        data_loader,
        fail,
        full_state,
        loss_of,
        lr_multiplier,
        make_optimizer,
        marked_blocks,
        offload_stream,
        read_job,
        resolve_units,
        save_trained,
        sharded_grad_norm,
        tensor_parallelize,
    )

CONFIG_NAME = "ds_config.json"
#: the workbench's precision -> Lightning's
PRECISION = {
    "fp32": "32-true",
    "amp-bf16": "bf16-mixed",
    "amp-fp16": "16-mixed",
    "bf16-true": "bf16-true",  # pure bf16: the model cast to bf16, no fp32 master copy
    "bf16": "bf16-mixed",  # with DeepSpeed's strategy: its bf16 mode
    "fp16": "16-mixed",  # with DeepSpeed's strategy: its loss-scaled fp16
}
SHARDING = {"full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP", "no_shard": "NO_SHARD"}


class JobModule(L.LightningModule):
    """The job's model, loss, optimizer and schedule as a LightningModule."""

    def __init__(
        self, model: torch.nn.Module, loss_fn: Any, config: dict[str, Any], strategy: str = "ddp"
    ) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.settings = config
        self.strategy_kind = strategy
        self._offload: Any = None  # activation offload's side stream, made on the device
        self._step: dict[str, Any] | None = None  # the optimizer step under way (`_open_step`)
        self._steps_done = 0

    @property
    def tp(self) -> int:
        return int(self.settings.get("tp", 1))

    def configure_model(self) -> None:
        """Under `tp` > 1 (Lightning's ModelParallelStrategy): the layers split over the
        mesh's tensor-parallel dimension (`job_common.tensor_parallelize`), then FSDP2 over
        its data-parallel one, the units of `fsdp_units` first (`job_units`)."""
        if self.tp == 1 or getattr(self, "_split", False):
            return
        from torch.distributed.fsdp import fully_shard

        mesh: Any = self.device_mesh  # ModelParallelStrategy's ("data_parallel", "tensor_parallel")
        sequence = bool(self.settings.get("sequence_parallel"))
        tensor_parallelize(self.model, mesh["tensor_parallel"], self.tp, sequence)
        reshard = self.settings.get("fsdp") != "shard_grad_op"
        for unit in job_units(self.model, self.settings):
            fully_shard(unit, mesh=mesh["data_parallel"], reshard_after_forward=reshard)
        fully_shard(self.model, mesh=mesh["data_parallel"], reshard_after_forward=reshard)
        self._split = True

    def _vocabulary_parallel(self) -> Any:
        """The split logits' cross-entropy under tensor parallelism (forward and backward)."""
        if self.tp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self._offload is None:
            self._offload = offload_stream(bool(self.settings["activation_offload"]), self.device)
        with self._vocabulary_parallel():
            loss = loss_of(self.model, batch, self.loss_fn, self._offload)
        loss = loss.to_local() if hasattr(loss, "to_local") else loss
        assert self._step is not None
        self._step["loss"] += loss.detach().float()
        self._step["micro_batches"] += 1
        return loss

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        with self._vocabulary_parallel():
            super().backward(loss, *args, **kwargs)

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        """Called before each optimizer step (the gradients unscaled, not yet clipped):
        the gradient norm the step's line prints, then the clipping."""
        assert self._step is not None
        params = [p for p in self.parameters() if p.requires_grad]
        if self.tp > 1:  # DTensors on two meshes: over shards and replicas
            clip = None if gradient_clip_val is None else float(gradient_clip_val)
            self._step["grad_norm"] = sharded_grad_norm(params, self.trainer.world_size, clip)
            return
        if self.strategy_kind == "ddp":  # every rank holds the averaged gradients whole
            grads = [p.grad for p in params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else None
            self._step["grad_norm"] = None if norm is None else float(norm)  # host waits here
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def _open_step(self) -> dict[str, Any]:
        """What an optimizer step's line needs from before its first micro-batch: the
        rate the step applies (the schedule stepped after the previous one), the loss
        scale (a smaller one after the step: skipped) and the DeepSpeed engine's count of
        skipped steps."""
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        scaler = scaler if scaler is not None and scaler.is_enabled() else None
        return {
            "t0": time.perf_counter(),
            "lr": float(self.trainer.optimizers[0].param_groups[0]["lr"]),
            "loss": torch.zeros((), device=self.device),
            "micro_batches": 0,
            "grad_norm": None,
            "scaler": scaler,
            "scale": None if scaler is None else scaler.get_scale(),
            "engine_skipped": getattr(self.trainer.model, "skipped_steps", None),
        }

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._step is None:  # the first micro-batch of an optimizer step
            self._step = self._open_step()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After the optimizer step (the last micro-batch of its accumulation): the line of
        `train_deepspeed.py` and `train_fsdp.py`, the same keys with the same meaning."""
        done = int(self.trainer.global_step)
        if done == self._steps_done:  # accumulating: no optimizer step yet
            return
        self._steps_done, step = done, self._step
        assert step is not None
        self._step = None
        # mean loss over ranks and micro-batches (every rank reduces; the host waits here)
        loss = self.trainer.strategy.reduce(step["loss"] / step["micro_batches"], reduce_op="mean")
        grad_norm, skipped = step["grad_norm"], False
        if self.strategy_kind == "deepspeed":  # the engine clipped and stepped: its norm
            engine: Any = self.trainer.model  # the DeepSpeedEngine
            norm = engine.get_global_grad_norm()
            grad_norm = None if norm is None else float(norm)
            skipped = engine.skipped_steps > step["engine_skipped"]
        elif step["scaler"] is not None:  # amp fp16: the scaler skips a step with inf/NaN
            skipped = step["scaler"].get_scale() < step["scale"]
        if self.global_rank != 0:
            return
        record = {
            "step": done,
            "loss": float(loss),
            "lr": step["lr"],
            "grad_norm": grad_norm,
            "skipped": skipped,
            "step_seconds": time.perf_counter() - step["t0"],
        }
        print(json.dumps(record), flush=True)

    def configure_optimizers(self) -> Any:
        cfg = self.settings
        optimizer = make_optimizer(cfg, [p for p in self.parameters() if p.requires_grad])
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: lr_multiplier(
                cfg["lr_schedule"], step, int(cfg["warmup_steps"]), int(cfg["total_steps"])
            ),
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class JobData(L.LightningDataModule):
    """The job's samples: each data-parallel rank its own share, in the order of the Session
    and the FSDP and DeepSpeed jobs (`job_common.data_loader`)."""

    def __init__(self, job: dict[str, Any], dataset: Any) -> None:
        super().__init__()
        self.job = job
        self.dataset = dataset

    def train_dataloader(self) -> DataLoader[Any]:
        """Called once the strategy has set up its processes: the rank and the number of
        data-parallel ranks are the strategy's (tensor parallel: the data-parallel
        dimension's). Lightning keeps a DistributedSampler it is given (and calls its
        set_epoch each epoch), so the sampler must be this rank's own."""
        trainer: Any = self.trainer  # set by the time Lightning asks for the loader
        shard = trainer.distributed_sampler_kwargs or {"num_replicas": 1, "rank": 0}
        micro = int(self.job["config"]["micro_batch"])
        world, rank = int(shard["num_replicas"]), int(shard["rank"])
        return data_loader(self.job, self.dataset, micro, world, rank)


def strategy(job: dict[str, Any], model: torch.nn.Module, devices: int) -> Any:
    """Lightning's strategy for the job's settings (see the module docstring)."""
    kind = job["strategy"]
    if kind == "tensor-parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy

        tp = int(job["config"]["tp"])
        if devices % tp:
            fail(f"tp={tp}: must divide --devices {devices}")
        return ModelParallelStrategy(data_parallel_size=devices // tp, tensor_parallel_size=tp)
    if kind == "deepspeed":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(config=os.path.join(HERE, CONFIG_NAME))
    if kind == "fsdp":
        # FSDP1 wraps each module of the config's units (`fsdp_units`) on its own
        from functools import partial

        from lightning.pytorch.strategies import FSDPStrategy
        from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

        wrapped = {
            id(m)
            for unit in job_units(model, job["config"])
            for m in (unit if isinstance(unit, list) else [unit])
        }
        policy = partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in wrapped)
        return FSDPStrategy(
            sharding_strategy=SHARDING[job["config"]["fsdp"]],  # type: ignore[arg-type]
            auto_wrap_policy=policy if wrapped else None,
            cpu_offload=job["config"].get("offload_params") == "cpu",
            mixed_precision=fsdp_mixed_precision(job["config"]),
        )
    return "auto"


#: the dtype of each 16-bit precision's FSDP parameters (Lightning's FSDPPrecision's)
FSDP_HALF = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16, "bf16-true": torch.bfloat16}


def fsdp_mixed_precision(config: dict[str, Any]) -> Any:
    """FSDP's MixedPrecision for a 16-bit precision whose gradients are reduced in fp32
    (`fsdp_reduce_fp32`, the default): Lightning's own for the precision reduces in the
    16-bit dtype; None (Lightning's own) otherwise."""
    half = FSDP_HALF.get(str(config.get("precision", "fp32")))
    if half is None or not config.get("fsdp_reduce_fp32", True):
        return None
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=half, reduce_dtype=torch.float32, buffer_dtype=half)


def job_units(model: torch.nn.Module, config: dict[str, Any]) -> list[Any]:
    """The FSDP units of `config.fsdp_units` (`job_parallel.fsdp_units`: "blocks", the
    marked blocks with the embedding and head their own; "blocks-only"; or module names);
    a name matching no module stops the job naming the modules that exist, a tied weight
    split over two units naming its modules."""
    spec = str(config.get("fsdp_units", "blocks"))
    units, problem = resolve_units(model, spec, marked_blocks(model))
    if problem is not None:
        fail(f"config.fsdp_units {spec!r}: {problem}")
    return units


def check_ranks(job: dict[str, Any], devices: int, nodes: int) -> None:
    """Stop before training unless `--devices` x `--num-nodes` is the world size the job was
    exported for (its global batch) and the launcher's environment agrees: torchrun's
    WORLD_SIZE and GROUP_RANK, or the NODE_RANK Lightning's own launch reads."""
    ranks = devices * nodes
    check_world_size(
        job,
        ranks,
        f"--devices {devices} x --num-nodes {nodes} = {ranks} rank(s)",
        f"workbench export --format lightning --gpus {devices} --nodes {nodes}",
    )
    launched = os.environ.get("WORLD_SIZE")
    if launched is not None and launched.strip() != str(ranks):
        fail(
            f"WORLD_SIZE={launched!r}: the launcher started that many ranks, but --devices "
            f"{devices} x --num-nodes {nodes} = {ranks}; start {devices} per node on {nodes} "
            f"node(s) (torchrun --nnodes {nodes} --nproc-per-node {devices})"
        )
    for key in ("GROUP_RANK", "NODE_RANK"):
        node = os.environ.get(key, "0").strip()
        if not node.isdigit() or int(node) >= nodes:
            fail(f"{key}={node!r}: must be a node index 0..{nodes - 1} (--num-nodes {nodes})")


def main(argv: list[str] | None = None) -> int:
    job_path = os.path.join(HERE, JOB_NAME)
    job = read_job(job_path, extra=("config", "strategy"))
    parser = argparse.ArgumentParser(description=f"Train with Lightning: {job['description']}")
    steps = int(job["steps"])
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps ({steps})")
    parser.add_argument("--devices", type=int, default=1, help="processes, one per GPU (1)")
    parser.add_argument("--num-nodes", type=int, default=1, help="nodes, each with --devices (1)")
    add_model_arguments(parser)
    add_save_argument(parser)
    args = parser.parse_args(argv)
    if min(args.steps, args.devices, args.num_nodes) < 1:
        parser.error(
            f"--steps {args.steps} / --devices {args.devices} / --num-nodes {args.num_nodes}: "
            "must be integers >= 1"
        )
    check_ranks(job, args.devices, args.num_nodes)
    check_save_dir(args.save_dir)
    if args.save_dir and job["strategy"] in ("deepspeed", "fsdp"):
        fail(
            f"--save-dir {args.save_dir!r}: the job saves data-parallel and tensor-parallel "
            f"runs; Lightning's {job['strategy']} strategy keeps its own sharded checkpoint "
            "format (trainer.save_checkpoint), which this job does not write"
        )
    clip = job["config"].get("clip_grad_norm")
    if job["strategy"] == "fsdp" and clip is not None:  # refused at export; job.json edited
        fail(
            f"{job_path}: config.clip_grad_norm={clip!r}: Lightning's FSDP strategy cannot "
            "clip by norm (its FSDPPrecision raises at the first step); export --format fsdp, "
            "whose script clips the norm over the shards, or set it null"
        )
    approved = approve_model(job, args.model, args.trust_model_spec, job_path, text=args.text)
    config = job["config"]
    if job["seed"] > 2**32 - 1:
        fail(f"{job_path}: seed={job['seed']}: Lightning's seed_everything takes a 32-bit seed")
    L.seed_everything(int(job["seed"]), verbose=False)
    model, dataset, loss_fn = build(job, approved=approved)
    cpu = config.get("device") == "cpu" or not torch.cuda.is_available()
    if cpu and job["strategy"] in ("deepspeed", "fsdp"):
        name = {"deepspeed": "DeepSpeed", "fsdp": "FSDP"}[job["strategy"]]
        fail(f"Lightning's {name} strategy runs on CUDA GPUs only; this run is on the CPU")
    trainer = L.Trainer(
        accelerator="cpu" if cpu else "gpu",
        devices=args.devices,
        num_nodes=args.num_nodes,  # one model over every node's ranks
        strategy=strategy(job, model, args.devices),
        precision=PRECISION[config["precision"]],  # type: ignore[arg-type]
        max_steps=args.steps,
        accumulate_grad_batches=int(config["grad_accum"]),
        gradient_clip_val=config.get("clip_grad_norm"),
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = JobModule(model, loss_fn, config, strategy=str(job["strategy"]))
    trainer.fit(module, datamodule=JobData(job, dataset))
    if trainer.global_rank == 0:
        print(json.dumps({"event": "done", "steps": int(trainer.global_step)}), flush=True)
    if args.save_dir:
        state = full_state(model)  # every rank (tensor parallel: the shards gathered)
        if trainer.global_rank == 0:
            print(json.dumps(save_trained(model, state, args.save_dir)), flush=True)
        trainer.strategy.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
