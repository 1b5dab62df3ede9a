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

Checkpoints take the flags of `train_deepspeed.py` and `train_fsdp.py` (`job_checkpoints.py`
beside this file; their defaults the config's): `--checkpoint-dir DIR` with
`--checkpoint-every-steps N` or `--checkpoint-every-seconds S` saves DIR/step-N/ after an
optimizer step (Lightning's `trainer.save_checkpoint` as `lightning.ckpt`, a file, under the
DeepSpeed strategy its engine's folder; each rank's generators as `rank-R.pt`; complete.json
last) and keeps the newest `--keep-checkpoints` (2). With a checkpoint folder, SIGTERM makes
every rank save at the next optimizer-step boundary; the Trainer stops there, the run prints
{"event": "stopped", "signal": "SIGTERM", "step": N, "checkpoint": DIR/step-N} and exits 0
(no "done" line, no `--save-dir`).
Lightning's own SIGTERM handler is not installed then: it would end the run at the end of
the micro-batch under way (mid-accumulation, nothing saved) after a collective broadcast from
inside the handler. `--resume DIR|auto` continues from the newest complete checkpoint and
prints {"event": "resumed", "step": N, "checkpoint": ...}: Lightning restores the weights,
the optimizer, the schedule, the loss scaler and its loops' counters; the loader goes on
where its epoch was (Lightning would start a plain DataLoader's epoch over: `EpochLoader`
reads the rest of it), and each rank's generators (dropout) are set back, so the steps that
follow have the uninterrupted run's losses. A checkpoint is checked before any of it is
read: it must be this job's (format, strategy, world size), hold regular files only (no
link, FIFO or device), and every pickle in it must name plain data only
(`job_checkpoints.safe_to_load`): Lightning reads its file with `weights_only=True`, but
DeepSpeed's engine (`torch.load(weights_only=False)`) and the FSDP strategy's reader of a
full state (an unpickler of Lightning's) would build what the file names, and a DeepSpeed
`latest` must name the checkpoint's own tag. Tensor parallel saves one file of whole tensors
(`save_distributed_checkpoint=False`) and FSDP its full state (Lightning's default): the
readers of their sharded formats (torch.distributed.checkpoint) unpickle what the files name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

import lightning as L
import torch
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported from the package (the workbench, its tests): the package's modules
    from workbench.export import job_checkpoints as ckpt
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
        rest_of_epoch,
        save_trained,
        sharded_grad_norm,
        tensor_parallelize,
    )
else:  # run as a script: the job_common.py beside it, as exported (or as its user edited
    # it), never an installed workbench's copy, which may be another version
    sys.path.insert(0, HERE)
    import job_checkpoints as ckpt  # type: ignore[no-redef, import-not-found]
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
        rest_of_epoch,
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
        self,
        model: torch.nn.Module,
        loss_fn: Any,
        config: dict[str, Any],
        strategy: str = "ddp",
        checkpoints: JobCheckpoints | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.settings = config
        self.strategy_kind = strategy
        self.checkpoints = checkpoints
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

    def on_train_start(self) -> None:
        """Training starts (a resumed run's checkpoint restored): count steps from its step."""
        self._steps_done = int(self.trainer.global_step)
        if self.checkpoints is not None:
            self.checkpoints.start(self.trainer)

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
        if self.global_rank == 0:
            record = {
                "step": done,
                "loss": float(loss),
                "lr": step["lr"],
                "grad_norm": grad_norm,
                "skipped": skipped,
                "step_seconds": time.perf_counter() - step["t0"],
            }
            print(json.dumps(record), flush=True)
        if self.checkpoints is not None:  # every rank: a save is collective
            self.checkpoints.after_step(self.trainer, done)

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

    def train_dataloader(self) -> EpochLoader:
        """Called once the strategy has set up its processes: the rank and the number of
        data-parallel ranks are the strategy's (tensor parallel: the data-parallel
        dimension's). Lightning keeps a DistributedSampler it is given (and calls its
        set_epoch each epoch), so the sampler must be this rank's own."""
        trainer: Any = self.trainer  # set by the time Lightning asks for the loader
        shard = trainer.distributed_sampler_kwargs or {"num_replicas": 1, "rank": 0}
        micro = int(self.job["config"]["micro_batch"])
        world, rank = int(shard["num_replicas"]), int(shard["rank"])
        loader = data_loader(self.job, self.dataset, micro, world, rank)

        def position() -> tuple[int, int]:  # asked in a save, after a step's last micro-batch
            return int(trainer.current_epoch), int(trainer.fit_loop.epoch_loop.batch_idx) + 1

        return EpochLoader(loader, position)


class EpochLoader:
    """This rank's loader (`job_common.data_loader`) as Lightning sees it, saying where the
    run is in its epoch. Lightning keeps a loader's `state_dict` in its checkpoints and gives
    it back to a resumed run (`load_state_dict`), but starts a plain DataLoader over at its
    epoch's first batch; this one reads the rest of that epoch instead
    (`job_common.rest_of_epoch`: the batches the checkpoint's steps trained passed over
    unread), so a resumed run trains on the batches the uninterrupted run would have."""

    def __init__(self, loader: DataLoader[Any], position: Callable[[], tuple[int, int]]) -> None:
        self.loader = loader
        self.sampler = loader.sampler  # Lightning sets its epoch as each epoch starts
        self.batch_sampler = loader.batch_sampler  # its batch size: the DeepSpeed strategy's
        self.position = position
        self.resume: tuple[int, int] | None = None  # (epoch, batches trained in it)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if self.resume is None:
            return iter(self.loader)
        (epoch, trained), self.resume = self.resume, None
        return iter(rest_of_epoch(self.loader, epoch, trained))

    def state_dict(self) -> dict[str, int]:
        epoch, trained = self.position()
        return {"epoch": epoch, "batches": trained}

    def load_state_dict(self, state: Any) -> None:
        """A resumed run's position (the checkpoint's `state_dict`), checked: its next
        iteration reads the rest of that epoch (at an epoch's end: the next epoch)."""
        epoch = state.get("epoch") if isinstance(state, dict) else None
        trained = state.get("batches") if isinstance(state, dict) else None
        if not (_count(epoch) and _count(trained) and trained <= len(self)):
            fail(
                "--resume: the checkpoint's loader state (loops.fit_loop.state_dict."
                f"combined_loader) {str(state)[:200]}: must be an epoch >= 0 and the batches "
                f"trained in it, 0..{len(self)}"
            )
        if trained == len(self):  # at the epoch's end: the next one starts
            epoch, trained = epoch + 1, 0
        self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        self.resume = (epoch, trained) if trained else None


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: Lightning's checkpoint in a DIR/step-N folder: a file (DeepSpeed's strategy: its folder)
CHECKPOINT_NAME = "lightning.ckpt"
#: the tag Lightning's DeepSpeed strategy saves under (its folder's `latest` names it)
DEEPSPEED_TAG = "checkpoint"


class JobCheckpoints:
    """The job's checkpoints (`job_checkpoints.py`: the flags, DIR/step-N folders committed
    by complete.json, SIGTERM) under Lightning. After each optimizer step every rank asks
    `Checkpoints.due`; a save is `trainer.save_checkpoint` into the step's folder (the
    weights, the optimizer, the schedule, the loss scaler, the loops' counters and where the
    loader is in its epoch: `EpochLoader`) and each rank's generators; a signal's save stops
    the Trainer there. A resumed run's generators are set back as training starts."""

    def __init__(self, args: argparse.Namespace, kind: str) -> None:
        # the flags' device is the strategy's, known once it is set up (`start`)
        self.checkpoints = ckpt.Checkpoints(args, torch.device("cpu"))
        self.kind = kind
        self.last = int(args.steps)
        self.resume: str | None = args.resume_folder
        self.stopped = False

    def start(self, trainer: L.Trainer) -> None:
        self.checkpoints.device = trainer.strategy.root_device
        if self.resume is not None:  # the checkpoint's step's dropout masks go on
            ckpt.load_rank_state(self.resume)
            if trainer.global_rank == 0:
                line = {"event": "resumed", "step": trainer.global_step, "checkpoint": self.resume}
                print(json.dumps(line), flush=True)

    def after_step(self, trainer: L.Trainer, step: int) -> None:
        save, stop = self.checkpoints.due(step, self.last)
        if not save:
            return
        folder = self.checkpoints.folder(step)
        trainer.save_checkpoint(os.path.join(folder, CHECKPOINT_NAME), weights_only=False)
        ckpt.save_rank_state(folder)
        path = self.checkpoints.commit(step, {"format": "lightning", "strategy": self.kind})
        if stop:
            self.checkpoints.stopped(step, path)
            self.stopped = True
            trainer.should_stop = True  # the loop ends after this batch: a step boundary


def leave_sigterm_to_the_job(trainer: L.Trainer) -> None:
    """With checkpoints on, SIGTERM is the job's (`job_checkpoints.Checkpoints`: every rank
    saves at the next optimizer step, then stops). Lightning's signal connector would replace
    its handler when fit starts with one that broadcasts from inside the handler (a
    collective only the ranks the signal reached enter, wherever they are), and raises
    SIGTERMException at the end of the micro-batch under way: mid-accumulation, no
    checkpoint. Lightning has no switch for it, so its connector installs nothing here (the
    job's handler also reaches every rank through `Checkpoints.due`'s all-reduce)."""
    connector = trainer._signal_connector
    connector.register_signal_handlers = lambda: None  # type: ignore[method-assign]


def check_resume(folder: str, kind: str, world: int) -> str:
    """The path of Lightning's checkpoint in `folder` (a complete DIR/step-N) for
    `trainer.fit(ckpt_path=...)`, once it is known to be this job's and to name only plain
    data: Lightning reads its file with `weights_only=True`, but DeepSpeed's engine
    (`torch.load(weights_only=False)`) and the FSDP strategy's full-state reader (an
    unpickler of its own) would build whatever their pickles name, so every pickle is
    checked first (`job_checkpoints.safe_to_load`), and nothing is read through a link or
    from another folder than the checkpoint's own; exits naming what cannot be loaded."""
    done = ckpt.read_complete(folder)
    mine = {"format": "lightning", "strategy": kind, "world_size": world}
    if any(done.get(key) != value for key, value in mine.items()):
        what = f"{done.get('format')} job's checkpoint"
        if done.get("strategy") is not None:
            what += f" (Lightning's {done.get('strategy')} strategy)"
        fail(
            f"--resume {folder!r}: a {what} of {done.get('world_size')} rank(s); this is a "
            f"lightning job (Lightning's {kind} strategy) on {world} rank(s)"
        )
    ckpt.only_plain_files(folder)
    path = os.path.join(folder, CHECKPOINT_NAME)
    if kind == "deepspeed":  # DeepSpeed's folder: its `latest` names the tag it loads
        latest = os.path.join(path, "latest")
        tag = None
        if os.path.isfile(latest):
            with open(latest) as f:
                tag = f.read(256).strip()
        if tag != DEEPSPEED_TAG:
            fail(
                f"--resume {folder!r}: {CHECKPOINT_NAME}/latest names {tag!r}; Lightning's "
                f"DeepSpeed checkpoint names its own folder, {DEEPSPEED_TAG!r}"
            )
        import deepspeed  # noqa: F401 - its data classes, which its files name, known by name
    elif not os.path.isfile(path):
        fail(f"--resume {folder!r}: holds no {CHECKPOINT_NAME} file (Lightning's checkpoint)")
    ckpt.safe_to_load(folder, (".pt", ".ckpt"))
    return path


def strategy(job: dict[str, Any], model: torch.nn.Module, devices: int) -> Any:
    """Lightning's strategy for the job's settings (see the module docstring)."""
    kind = job["strategy"]
    if kind == "tensor-parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy

        tp = int(job["config"]["tp"])
        if devices % tp:
            fail(f"tp={tp}: must divide --devices {devices}")
        # its checkpoints one file of whole tensors, which Lightning reads as weights only
        # (its sharded format's reader unpickles what the files name)
        return ModelParallelStrategy(
            data_parallel_size=devices // tp,
            tensor_parallel_size=tp,
            save_distributed_checkpoint=False,
        )
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


def parse_args(job: dict[str, Any], argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before anything is built (a --resume checkpoint too:
    `check_resume`; `args.ckpt_path` is what `trainer.fit` resumes from, or None)."""
    parser = argparse.ArgumentParser(description=f"Train with Lightning: {job['description']}")
    steps = int(job["steps"])
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps ({steps})")
    parser.add_argument("--devices", type=int, default=1, help="processes, one per GPU (1)")
    parser.add_argument("--num-nodes", type=int, default=1, help="nodes, each with --devices (1)")
    add_model_arguments(parser)
    add_save_argument(parser)
    ckpt.add_checkpoint_arguments(parser, job["config"])
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
    args.resume_folder = ckpt.resume_folder(args)
    args.ckpt_path = None
    if args.resume_folder is not None:
        world = args.devices * args.num_nodes
        args.ckpt_path = check_resume(args.resume_folder, str(job["strategy"]), world)
    return args


def main(argv: list[str] | None = None) -> int:
    job_path = os.path.join(HERE, JOB_NAME)
    job = read_job(job_path, extra=("config", "strategy"))
    args = parse_args(job, argv)
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
    checkpoints = JobCheckpoints(args, str(job["strategy"]))
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
    if checkpoints.checkpoints.enabled:
        leave_sigterm_to_the_job(trainer)
    module = JobModule(model, loss_fn, config, str(job["strategy"]), checkpoints)
    # a resumed run: Lightning's file read as weights only (DeepSpeed's and FSDP's loaders
    # ignore it: their files were checked to name plain data, `check_resume`)
    trainer.fit(
        module, datamodule=JobData(job, dataset), ckpt_path=args.ckpt_path, weights_only=True
    )
    if checkpoints.stopped:  # a signal's checkpoint is saved; the run ends there
        return 0
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
