#!/usr/bin/env python
"""Train with PyTorch FSDP2: the job `workbench export --format fsdp` wrote beside this file.

Run it in its directory:

    torchrun --standalone --nproc-per-node N train_fsdp.py
    python train_fsdp.py                                  # one process, no launcher

on as many ranks as it was exported for (job.json's `exported_world_size`; N x nodes):
another number is refused before training, as train_deepspeed.py refuses it, since the
global batch (micro-batch x grad-accum x data-parallel ranks) would change with it.

`job.json` holds the model (a workbench built-in name, or an importable factory
"pkg.module:function" found from the current folder, imported only when `--model SPEC`
names it too or `--trust-model-spec` is given), its options, the seed, the number
of steps and the training settings (`config`: the workbench TrainConfig as a dict). This
file and `job_common.py` beside it are the same for every job (the workbench ships them
in `workbench/export/` and copies them as is). It needs torch only; workbench only for a
built-in model or activation checkpointing.

FSDP2 (`torch.distributed.fsdp.fully_shard`) wraps the units `config.fsdp_units` names
(`job_parallel.fsdp_units`): by default each block the workbench marked (the built-in
GPT's transformer blocks), the embedding and the output head as units of their own, as
torchtitan and torchtune shard them; "blocks-only" the blocks alone; or the modules a list
of class names or qualified-name patterns matches), then the root: "full_shard" reshards parameters
after forward, "shard_grad_op" keeps them gathered until backward, "no_shard" replicates
(a 2-D mesh, N replicas x 1 shard). "amp-bf16"/"amp-fp16" gather parameters in 16 bit for
compute (`MixedPrecisionPolicy`; fp16 adds torch's GradScaler); "bf16-true" (pure bf16)
casts the model to bf16 before sharding (`model.to(torch.bfloat16)`: bf16 shards,
gradients and optimizer states, no fp32 master copy; floating inputs cast to bf16);
`offload_params="cpu"` keeps shards in host memory; `tp` > 1 splits the layers over
tensor-parallel groups of that many ranks first (`job_common.tensor_parallelize`: the
workbench GPT and transformers Llama-style decoders, `sequence_parallel` for both),
FSDP2 then sharding over the data-parallel dimension of the 2-D mesh, the loss
vocabulary-parallel; `activation_offload` the forward's
saved activations, in pinned memory on a side stream (`job_common.offloaded_activations`,
nothing moves on a CPU). Rank 0 prints one JSON line per
optimizer step, as `train_deepspeed.py` and `train_lightning.py` do: {"step", "loss" (the
mean over ranks and the step's micro-batches), "lr" (the rate the step applied),
"grad_norm" (before clipping), "skipped" (a step the loss scaler skipped),
"step_seconds"}. `--save-dir DIR` writes the trained weights
at the end, gathered from the shards (`job_common.save_trained`: model.safetensors, or
with LoRA the adapters alone in peft's format).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported from the package (the workbench, its tests): the package's modules
    from workbench.export import job_checkpoints as ckpt
    from workbench.export.job_common import (
        JOB_NAME,
        add_model_arguments,
        add_save_argument,
        approve_model,
        batches,
        build,
        check_save_dir,
        check_world_size,
        count_parameters,
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
        set_lr,
        sharded_grad_norm,
        single_process_env,
        tensor_parallelize,
        to_device,
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
        batches,
        build,
        check_save_dir,
        check_world_size,
        count_parameters,
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
        set_lr,
        sharded_grad_norm,
        single_process_env,
        tensor_parallelize,
        to_device,
    )

HALF = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}
PURE = {"bf16-true": torch.bfloat16}  # the model itself in this dtype: pure bf16


def parse_args(job: dict[str, Any], argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=f"Train with FSDP: {job['description']}")
    steps = int(job["steps"])
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps ({steps})")
    add_model_arguments(parser)
    add_save_argument(parser)
    ckpt.add_checkpoint_arguments(parser, job["config"])
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: must be an integer >= 1")
    check_save_dir(args.save_dir)
    args.resume_folder = ckpt.resume_folder(args)
    return args


def shard(
    module: torch.nn.Module, config: dict[str, Any], device: torch.device, dp_mesh: Any = None
) -> None:
    """Apply FSDP2 to the marked blocks, then to the root (see the module docstring);
    over `dp_mesh` (the data-parallel dimension of a tensor-parallel job) when given."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    mode, world = config["fsdp"], dist.get_world_size()
    half = HALF.get(config["precision"])
    reduce_fp32 = config.get("fsdp_reduce_fp32", True)
    if half is not None:  # 16-bit copies gathered for compute
        policy = MixedPrecisionPolicy(
            param_dtype=half, reduce_dtype=torch.float32 if reduce_fp32 else half
        )
    elif config["precision"] in PURE and reduce_fp32:  # bf16 shards, gradients reduced in fp32
        policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)
    if dp_mesh is not None:
        mesh = dp_mesh
    elif mode == "no_shard":
        mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,))
    offload = config.get("offload_params") == "cpu"
    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": policy,
        "offload_policy": (
            CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
        ),
        "reshard_after_forward": mode == "full_shard",
    }
    spec = str(config.get("fsdp_units", "blocks"))
    blocks = marked_blocks(module)
    units, problem = resolve_units(module, spec, blocks)
    if problem is not None:
        fail(f"config.fsdp_units {spec!r}: {problem}")
    # the output head (the last unit under "blocks") stays gathered after forward, as
    # torchtitan keeps it: its backward needs it at once
    head = spec.strip() == "blocks" and len(units) > len(blocks)
    for unit in units:
        keep = head and unit is units[-1]
        fully_shard(unit, **{**options, "reshard_after_forward": mode == "full_shard" and not keep})
    fully_shard(module, **options)


def cast_to_pure(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Pure 16-bit: the model's floating parameters and buffers in `dtype`, and a forward
    pre-hook casting its floating inputs to it (integer token ids pass unchanged)."""

    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        return x

    def hook(m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    module.to(dtype)
    module.register_forward_pre_hook(hook, with_kwargs=True)


def process_group_backend(cuda: bool) -> str:
    """The process group's backends: on GPUs NCCL for CUDA tensors and gloo for host ones,
    since CPU offload reduces host tensors (the gradient norm, the GradScaler's found-inf,
    the full-state gathers), which NCCL alone refuses ("No backend type associated with
    device type cpu"); gloo alone on CPUs."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def resume(
    folder: str, module: torch.nn.Module, optimizer: Any, world: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load the checkpoint `folder` (DIR/step-N): the sharded weights and optimizer states,
    this rank's generators; returns (its complete.json, this rank's own state: the steps
    the schedule applied, the loss scaler's state)."""
    done = ckpt.read_complete(folder)
    if done.get("format") != "fsdp" or done.get("world_size") != world:
        fail(
            f"--resume {folder!r}: a {done.get('format')} checkpoint of "
            f"{done.get('world_size')} rank(s); this is an fsdp job on {world}"
        )
    ckpt.load_sharded(folder, module, optimizer)
    return done, ckpt.load_rank_state(folder)


def main(argv: list[str] | None = None) -> int:
    job_path = os.path.join(HERE, JOB_NAME)
    job = read_job(job_path, extra=("config",))
    args = parse_args(job, argv)
    approved = approve_model(job, args.model, args.trust_model_spec, job_path, text=args.text)
    config = job["config"]
    if config.get("fsdp", "off") == "off":
        fail(f"{JOB_NAME}: config.fsdp is 'off'; export with --fsdp full_shard (or another mode)")
    single_process_env()
    launched = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's, or 1 without a launcher
    check_world_size(
        job, launched, f"{launched} rank(s)", f"workbench export --format fsdp --gpus {launched}"
    )
    cuda = torch.cuda.is_available() and config.get("device") != "cpu"
    dist.init_process_group(process_group_backend(cuda))
    world, rank = dist.get_world_size(), dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    module, dataset, loss_fn = build(job, approved=approved)
    if config["precision"] in PURE:
        cast_to_pure(module, PURE[config["precision"]])
    module.to(device)
    tp = int(config.get("tp", 1))
    dp_mesh = None
    if tp > 1:  # a 2-D mesh: FSDP2 over the data-parallel ranks, the layers split over tp
        from torch.distributed.device_mesh import init_device_mesh

        if world % tp or config["fsdp"] == "no_shard":
            fail(
                f"tp={tp}: needs ranks that tp divides ({world}) and fsdp full_shard or "
                "shard_grad_op"
            )
        mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
        tensor_parallelize(module, mesh["tp"], tp, bool(config.get("sequence_parallel")))
        dp_mesh = mesh["dp"]
    shard(module, config, device, dp_mesh)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = make_optimizer(config, params)
    scaler = (
        torch.amp.GradScaler(
            device.type,
            init_scale=float(config["loss_scale_init"]),
            growth_factor=float(config["loss_scale_growth"]),
            backoff_factor=float(config["loss_scale_backoff"]),
            growth_interval=int(config["loss_scale_interval"]),
        )
        if config["precision"] == "amp-fp16"
        else None
    )
    micro, accum = int(config["micro_batch"]), int(config["grad_accum"])
    clip = config.get("clip_grad_norm")
    base_lr = float(config["lr"])
    # dropout draws from torch's global RNG: seeded where a Session seeds it, once the
    # engine is built, so the job's masks are a Session's
    torch.manual_seed(int(job["seed"]))
    checkpoints = ckpt.Checkpoints(args, device)
    first, applied = 1, 0
    if args.resume_folder is not None:
        done, mine = resume(args.resume_folder, module, optimizer, world)
        first, applied = int(done["step"]) + 1, int(mine["applied"])
        if scaler is not None:
            scaler.load_state_dict(mine["scaler"])
    # a tp group: one sample set
    data = batches(job, dataset, micro, world // tp, rank // tp, skip=(first - 1) * accum)
    offload = offload_stream(bool(job["activation_offload"]), device)
    n_params = count_parameters(module)
    if rank == 0:
        start = {
            "event": "start",
            "model": job["model"],
            "world_size": world,
            "fsdp": config["fsdp"],
            "precision": config["precision"],
            "param_dtype": str(params[0].dtype).replace("torch.", ""),
            "n_params": n_params,
            "micro_batch": micro,
            "grad_accum": accum,
            "steps": args.steps,
        }
        if args.resume_folder is not None:
            start["resumed_from"] = args.resume_folder
        print(json.dumps(start), flush=True)
    vocabulary_parallel: Any = contextlib.nullcontext
    if tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        vocabulary_parallel = loss_parallel
    stopped = False
    for step in range(first, args.steps + 1):
        lr = base_lr * lr_multiplier(
            config["lr_schedule"], applied, int(config["warmup_steps"]), int(config["total_steps"])
        )
        set_lr(optimizer, lr)
        t0 = time.perf_counter()
        total = torch.zeros((), device=device)
        for _ in range(accum):
            batch = to_device(next(data), device)
            with vocabulary_parallel():  # the split logits' cross-entropy under tp
                loss = loss_of(module, batch, loss_fn, offload)
                loss = loss.to_local() if hasattr(loss, "to_local") else loss
                scaled = loss / accum
                if scaler is not None:
                    scaled = scaler.scale(scaled)
                torch.autograd.backward(scaled)
            total += loss.detach().float()
        if scaler is not None:
            scaler.unscale_(optimizer)
        if tp > 1:  # DTensors on two meshes: the norm over shards and replicas
            grad_norm = sharded_grad_norm(params, world, None if clip is None else float(clip))
        else:
            if clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(params, float(clip))
            else:
                norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            full = getattr(norm, "full_tensor", None)
            grad_norm = float(full() if callable(full) else norm)  # host waits for the device
        skipped = False
        if scaler is not None:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped = scaler.get_scale() < before
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        applied += 0 if skipped else 1
        dist.all_reduce(total)  # mean loss over ranks and micro-batches
        loss_value = total.item() / (accum * world)
        if rank == 0:
            record = {
                "step": step,
                "loss": loss_value,
                "lr": lr,
                "grad_norm": grad_norm,
                "skipped": skipped,
                "step_seconds": time.perf_counter() - t0,
            }
            print(json.dumps(record), flush=True)
        save, stop = checkpoints.due(step, args.steps)
        if save:
            folder = checkpoints.folder(step)
            ckpt.save_sharded(folder, module, optimizer)
            scaler_state = scaler.state_dict() if scaler is not None else {}
            ckpt.save_rank_state(folder, {"applied": applied, "scaler": scaler_state})
            path = checkpoints.commit(step, {"format": "fsdp"})
            if stop:
                checkpoints.stopped(step, path)
                stopped = True
                break
    if rank == 0 and not stopped:
        print(json.dumps({"event": "done", "steps": args.steps}), flush=True)
    if args.save_dir and not stopped:
        state = full_state(module)  # every rank: the shards gathered to rank 0
        if rank == 0:
            print(json.dumps(save_trained(module, state, args.save_dir)), flush=True)
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # End without the interpreter's teardown: the device mesh keeps gloo's process groups
    # alive past destroy_process_group(), and destroying them during finalization aborts a
    # rank now and then ("terminate called without an active exception") after it finished.
    os._exit(code)
