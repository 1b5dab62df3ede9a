#!/usr/bin/env python
"""Train with DeepSpeed: the job `workbench export --format deepspeed` wrote beside this file.

Run it in its directory:

    deepspeed --num_gpus N train_deepspeed.py --deepspeed_config ds_config.json
    torchrun --standalone --nproc-per-node N train_deepspeed.py --deepspeed_config ds_config.json
    python train_deepspeed.py --deepspeed_config ds_config.json     # one process, no launcher

`ds_config.json` holds the batch sizes, optimizer, learning-rate schedule, precision,
gradient clipping and ZeRO settings; `job.json` what DeepSpeed JSON cannot say: the model
(a workbench built-in name, or an importable factory "pkg.module:function" found from the
current folder, imported only when `--model SPEC` names it too or `--trust-model-spec` is
given: job.json alone never chooses code), its options, the seed, the number of steps, the data loader,
activation checkpointing and activation offload (the forward's saved activations kept in
pinned host memory, `job_common.offloaded_activations`). This file and `job_common.py` beside it are the same for every
job (the workbench ships them in `workbench/export/` and copies them as is). It needs
torch and deepspeed; workbench only for a built-in model or activation checkpointing.

A batch is an `(inputs, targets)` pair with `loss_fn(outputs, targets)`, or a mapping of
the model's keyword arguments (`model(**batch)`; without a loss_fn the output's `.loss`),
as in a workbench Session. Rank 0 prints one JSON line per optimizer step, as
`train_fsdp.py` and `train_lightning.py` do: {"step", "loss" (the mean over ranks and the
step's micro-batches), "lr" (the rate the step applied), "grad_norm" (DeepSpeed's, before
clipping; None where DeepSpeed has none), "skipped" (a step the loss scaler skipped),
"step_seconds"}; `--save_dir DIR` saves a DeepSpeed checkpoint at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported from the package (the workbench, its tests): the package's modules
    from workbench.export import job_checkpoints as ckpt
    from workbench.export.job_common import (
        JOB_NAME,
        add_model_arguments,
        approve_model,
        batches,
        build,
        check_save_dir,
        count_parameters,
        fail,
        loss_of,
        offload_stream,
        read_job,
        read_json_file,
        release_shm_segment,
        single_process_env,
        to_device,
    )
else:  # run as a script: the job_common.py beside it, as exported (or as its user edited
    # it), never an installed workbench's copy, which may be another version
    sys.path.insert(0, HERE)
    import job_checkpoints as ckpt  # type: ignore[no-redef, import-not-found]
    from job_common import (  # type: ignore[no-redef, import-not-found]
        JOB_NAME,
        add_model_arguments,
        approve_model,
        batches,
        build,
        check_save_dir,
        count_parameters,
        fail,
        loss_of,
        offload_stream,
        read_job,
        read_json_file,
        release_shm_segment,
        single_process_env,
        to_device,
    )

CONFIG_NAME = "ds_config.json"


def parse_args(job: dict[str, Any], argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=f"Train with DeepSpeed: {job['description']}")
    parser.add_argument(
        "--deepspeed_config", "--deepspeed-config", default=os.path.join(HERE, CONFIG_NAME)
    )
    parser.add_argument(
        "--local_rank",
        "--local-rank",
        type=int,
        default=None,
        help="set by the deepspeed launcher",
    )
    steps = int(job["steps"])
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps ({steps})")
    parser.add_argument(
        "--save_dir", "--save-dir", default=None, help="save a DeepSpeed checkpoint here at the end"
    )
    add_model_arguments(parser)
    ckpt.add_checkpoint_arguments(parser, job.get("config") or {})
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: must be an integer >= 1")
    check_save_dir(args.save_dir, "--save_dir")  # before training: nothing trained is lost
    args.resume_folder = ckpt.resume_folder(args)
    return args


def half_dtype(ds_config: dict[str, Any]) -> torch.dtype | None:
    """The dtype DeepSpeed casts the weights to (inputs are cast to match)."""
    if ds_config.get("fp16", {}).get("enabled"):
        return torch.float16
    for key in ("bf16", "bfloat16"):
        if ds_config.get(key, {}).get("enabled"):
            return torch.bfloat16
    return None


def resume(engine: Any, folder: str, world: int) -> int:
    """Load the checkpoint `folder` (DIR/step-N) into `engine` (weights, optimizer, loss
    scaler, learning-rate schedule) and this rank's generators; returns N. Its files are
    checked to hold plain data first (`job_checkpoints.safe_to_load`)."""
    done = ckpt.read_complete(folder)
    if done.get("format") != "deepspeed" or done.get("world_size") != world:
        fail(
            f"--resume {folder!r}: a {done.get('format')} checkpoint of "
            f"{done.get('world_size')} rank(s); this is a deepspeed job on {world}"
        )
    ckpt.safe_to_load(folder, (".pt",))
    loaded, _ = engine.load_checkpoint(os.path.dirname(folder), tag=os.path.basename(folder))
    if loaded is None:
        fail(f"--resume {folder!r}: DeepSpeed found no checkpoint there")
    ckpt.load_rank_state(folder)
    return int(done["step"])


def main(argv: list[str] | None = None) -> int:
    job_path = os.path.join(HERE, JOB_NAME)
    job = read_job(job_path)
    args = parse_args(job, argv)
    approved = approve_model(job, args.model, args.trust_model_spec, job_path, text=args.text)
    ds_config = read_json_file(args.deepspeed_config, "--deepspeed_config")
    if not isinstance(ds_config, dict) or not all(
        isinstance(ds_config.get(k, 1), int) and not isinstance(ds_config.get(k, 1), bool)
        for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    ):
        fail(
            f"--deepspeed_config {args.deepspeed_config}: must be a DeepSpeed config object with "
            "integer train_micro_batch_size_per_gpu and gradient_accumulation_steps"
        )
    single_process_env()
    accelerator = get_accelerator()
    deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name())
    release_shm_segment()  # DeepSpeed's CPU comm op leaves its segment in /dev/shm otherwise
    world, rank = dist.get_world_size(), dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    if accelerator.device_name() != "cpu":
        accelerator.set_device(local_rank)

    micro = int(ds_config.get("train_micro_batch_size_per_gpu", 1))
    accum = int(ds_config.get("gradient_accumulation_steps", 1))
    exported = int(job["exported_world_size"])
    if ds_config.get("train_batch_size", micro * accum * world) != micro * accum * world:
        fail(
            f"{args.deepspeed_config}: train_batch_size={ds_config['train_batch_size']} was "
            f"exported for world size {exported} (micro {micro} x accum {accum} x world size); "
            f"this run has {world} rank(s). Launch {exported} ranks, or re-export with "
            f"`workbench export --format deepspeed --gpus {world}`"
        )

    module, dataset, loss_fn = build(job, approved=approved)
    dtype = half_dtype(ds_config)
    if dtype is not None:

        def cast_inputs(
            _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            def cast(x: Any) -> Any:
                return x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x

            return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

        module.register_forward_pre_hook(cast_inputs, with_kwargs=True)
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=ds_config,
    )
    # dropout draws from torch's global RNG: seeded where a Session seeds it, once the
    # engine is built, so the job's masks are a Session's
    torch.manual_seed(int(job["seed"]))
    checkpoints = ckpt.Checkpoints(args, engine.device)
    first = 1
    if args.resume_folder is not None:
        first = resume(engine, args.resume_folder, world) + 1
    data = batches(job, dataset, micro, world, rank, skip=(first - 1) * accum)
    offload = offload_stream(bool(job["activation_offload"]), engine.device)
    n_params = count_parameters(engine.module)
    if rank == 0:
        start = {
            "event": "start",
            "model": job["model"],
            "world_size": world,
            "zero_stage": engine.zero_optimization_stage(),
            "n_params": n_params,
            "micro_batch": micro,
            "grad_accum": accum,
            "steps": args.steps,
        }
        if args.resume_folder is not None:
            start["resumed_from"] = args.resume_folder
        print(json.dumps(start), flush=True)
    stopped = False
    for step in range(first, args.steps + 1):
        t0 = time.perf_counter()
        lr = float(engine.get_lr()[0])  # the rate this step applies (its scheduler steps after it)
        skipped_before = engine.skipped_steps
        total = torch.zeros((), device=engine.device)
        for _ in range(accum):
            batch = to_device(next(data), engine.device)
            loss = loss_of(engine, batch, loss_fn, offload)
            engine.backward(loss)
            engine.step()  # steps the optimizer at the accumulation boundary only
            total += loss.detach().float()
        dist.all_reduce(total)  # mean loss over ranks and micro-batches
        loss_value = total.item() / (accum * world)  # host waits for the device here
        norm = engine.get_global_grad_norm()
        if rank == 0:
            record = {
                "step": step,
                "loss": loss_value,
                "lr": lr,
                "grad_norm": None if norm is None else float(norm),
                "skipped": engine.skipped_steps > skipped_before,
                "step_seconds": time.perf_counter() - t0,
            }
            print(json.dumps(record), flush=True)
        save, stop = checkpoints.due(step, args.steps)
        if save:
            folder = checkpoints.folder(step)
            engine.save_checkpoint(
                os.path.dirname(folder), tag=os.path.basename(folder), save_latest=False
            )
            ckpt.save_rank_state(folder)
            path = checkpoints.commit(step, {"format": "deepspeed"})
            if stop:
                checkpoints.stopped(step, path)
                stopped = True
                break
    if args.save_dir and not stopped:
        engine.save_checkpoint(args.save_dir)
    if rank == 0 and not stopped:
        print(json.dumps({"event": "done", "steps": args.steps}), flush=True)
    engine.destroy()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
