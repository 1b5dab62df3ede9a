"""The GPU check: every CUDA, NCCL and NVML path of the workbench on a real NVIDIA GPU.

    .venv/bin/python benchmarks/gpu_check.py            # or: make gpu-check
    .venv/bin/python benchmarks/gpu_check.py --cpu-smoke   # the same code paths, tiny, on CPU

Fails (exit 1) when torch has no CUDA: this script is for a GPU machine. On a lent machine
it is run by `bash benchmarks/gpu_run.sh` (docs/gpu.md), which first refuses to start
without its wheels, then runs the `gpu`-marked tests (<= 75 s), then this. One ordered run,
the newest code first, so the budget cuts the oldest; each section has its own checks (one
failing section does not stop the others) and an estimate of its seconds on one H200 (a
section's limit is twice its estimate). The estimates are not measured yet: no GPU has
been lent since these sections were written.

The harness (checks, the results file, section limits, the clean-up of a timed-out
section's processes) is `gpu_harness.py`. Newest (`gpu_newest.py`, `gpu_syncs.py`):
optim8 (~30 s): paged and torchao 8-bit AdamW, the optimizer step in backward; offload
(~15 s): activation offload, allocated and reserved (with checkpointing and the sdpa
attention kernel beside it); lora (~20 s): LoRA and QLoRA; dryrun
(~35 s): dry runs on fake CUDA tensors (plain, LoRA, FSDP's fake group) against the real
peak; observers (~30 s): the Hugging Face and Lightning observers on CUDA; syncs (~8 s):
host-device syncs per step per setup and optimizer; then peak (~45 s, the allocator
model's reserved peak against `max_memory_reserved`) and anchors (~5 s), described below.
The planner probe's efficiency, the allocator model and paged 8-bit AdamW's and activation
offload's own GPU assertions are `gpu`-marked tests that gpu_run.sh runs before this.

Then the older sections, in this order: session, nvml, oom, compress, deepspeed, fsdp,
ranks, speed, ladder:

* nvml (~10 s): NVML reads the GPU the session trains on (matched by UUID), this
   process's GPU memory grows when the session allocates.
* session (~25 s): a Session on CUDA in fp32, amp-bf16 and amp-fp16; step records carry
   CUDA memory, each record's CUDA peak is its own step's (not an earlier allocation's);
   `memory()` measured vs predicted (model states exact, activations within 15%); the
   profiler's memory timeline on "cuda:N" and its phase split (forward, backward and
   optimizer hold the GPU time, not "other").
* deepspeed (~60 s): DeepSpeed bf16 and fp16 with ZeRO 0-3 and live switches
   0 -> 1 -> 2 -> 3 -> 0 on one running session; the fp16 loss scale carried across
   switches; after close() the user's module holds fp32 trained weights on the GPU;
   measured model states against the "deepspeed" accounting.
* fsdp (~100 s): FSDP2 `fully_shard` on the last GPU (`device="cuda:N"`: shards there, not
   on the current device) with amp-bf16 and amp-fp16 (`MixedPrecisionPolicy`, the
   GradScaler); CPU offload (`CPUOffloadPolicy(pin_memory=True)`, pinned host shards, the
   gradient norm and the full state gathered); live switches FSDP -> ZeRO-3 -> off -> FSDP
   with offload carrying the state; `torch.compile` under FSDP and under DeepSpeed.
* oom (~20 s): an out-of-memory error forced with a micro-batch that cannot fit (a module
   that allocates 1 GiB per sample), recovered by halving, plain and under ZeRO-2.
* ranks (~70 s): the multi-process path: ZeRO-2 under DeepSpeed's launcher and FSDP with
   CPU offload under torchrun, on min(2, GPUs) ranks (each rank `set_device`s its GPU and
   starts NCCL in its own process; per-rank CUDA peaks), and NCCL's all-reduce and
   broadcast checked directly on as many ranks. With one GPU they run as one rank: a
   1-rank NCCL group runs NCCL's set-up and kernels but moves nothing between GPUs, and
   NCCL refuses two ranks on one GPU, so the all-reduce between 2 ranks is recorded as not
   run (the run then exits 3 unless `--allow-partial`).
* compress (~20 s): compression on CUDA: torchao INT8 (recorded as not run without
   torchao) and magnitude pruning, measured before/after on the GPU.
* speed (~50 s): a GPT sized to load the GPU, fp32 vs amp-bf16 samples/s (all samples over
   all seconds of the steps after warm-up, not the median step's rate); GPU utilization
   sampled from NVML over a steady 5-second stretch of training (after warm-up, >= 20
   readings, judged by their median); the Session's overhead against a hand-written loop
   on the same model.
* ladder (~60 s): the optimization ladder (`workbench.ladder`) on the GPU: fp32, + AMP and
   loader workers with pinned memory, + data parallel over every GPU when there are 2 or
   more, + accumulation with a scaled LR and OneCycle, + torch.compile, + activation
   checkpointing; every rung runs, on the same samples, with memory measured and
   predicted, and the compile time reported apart from the step time.
* peak (~45 s): the estimator's peak of a step next to `torch.cuda.max_memory_allocated()`
   over one steady optimizer step of a 100M-parameter `transformers` Llama (no KV cache:
   `use_cache=False` as in the dry run; fp32, amp-bf16, bf16-true x sdpa, eager; within
   15%), the dry run's peak when
   `workbench.simulate_memory` is there (within 10%), and the caching allocator model's
   reserved peak of the dry run's trace next to `torch.cuda.max_memory_reserved()` over
   the same two steps (within 15%; the figures and the advised setting in the JSON).
* syncs (~8 s) and anchors (~5 s), in `gpu_syncs.py`: host-device syncs per optimizer
   step counted (at most one in fp32, amp-bf16, bf16-true, none added by clipping), and
   the Session beside a plain loop and accelerate (`benchmarks/anchors.py --device cuda`
   adds Lightning and the Hugging Face Trainer).

Sized to finish under 8 minutes on one H200, the machine's start included: the
estimates add up to about
603 s, the run has a 300-second budget (`--budget`; about 90 s go to the machine's start,
15 s to the wheels, 75 s to the gpu tests), and a section starts only while its estimate
fits in what is left (else "not run": the budget), its limit cut to what is left. With the
estimates as they are, the newest sections and session, nvml, oom and compress run; the
older, longer ones (deepspeed, fsdp, ranks, speed, ladder) are cut unless the estimates
prove high; a second run with `--sections` takes them.

Left out on one GPU: NCCL refuses two ranks on one GPU, so tensor parallelism, pipeline
parallelism and every 2-rank run cannot run on a lent machine (the ranks section runs
them as one rank and records the 2-rank all-reduce as not run).

Results: gpu_check.json (gpu_check_cpu_smoke.json for the smoke run) in `--out-dir`, by
default `$OUT` when set (the folder a lent machine sends back: what is written there
comes back even when the run is killed at the machine's limit), else benchmarks/results/;
written again after every section, so a run cut off keeps what it measured. A SIGTERM
writes what the run has (the section it interrupted marked "interrupted", the rest "not
run"), ends the child processes and exits 143. A section that runs past its limit is
stopped, recorded as "timed out" and the run goes on: the processes it started are ended
(those alive before it began, and Inductor's compile workers, are spared), and a process
forked from this one without exec gets its SIGTERM and SIGALRM handlers and the signal
wakeup fd reset, so ending it never reads as a SIGTERM to the run. A section that does not
return within a grace period ends the run, its results written.

Every check is "passed", "failed" or "not run" (it cannot run here: one GPU for a 2-rank
check, torchao missing, the budget spent). The summary counts the three apart and never
says "N of N passed" when something did not run. Exit status: 0 when every check passed;
1 when a check failed or a section failed or timed out; 3 when nothing failed but
something did not run, unless `--allow-partial` (then 0); 143 on SIGTERM.

Rule: the memory techniques, dry run and parallel layouts that land later add their GPU
checks to gpu_check when they land. Each CUDA path added later (a backend, an optimizer a
Session trains, a technique in workbench/train/techniques/) adds its section here or a
`gpu`-marked test in the same change, with its estimate, inside the budget, and names it
in `COVERAGE` below; tests/unit/test_gpu_coverage_rule.py fails while one has neither.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gpu_newest
import gpu_syncs
from _common import RESULTS_DIR
from gpu_harness import (  # noqa: F401 - the harness, as gpu_check's own names
    CHECKS,
    COMPILE_WORKER_MARK,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_SIGTERM,
    FAILED,
    GRACE_SECONDS,
    NOT_RUN,
    PASSED,
    RESULT,
    STALL,
    Run,
    SectionTimeout,
    StallSection,
    Watchdog,
    _on_alarm,
    check,
    descendants,
    exit_status,
    forked_child_signals,
    install_sigterm,
    kill_children,
    not_run,
    run_section,
    spared_pids,
    summary,
)

#: gpu_check's share of a lent machine's 8 minutes: ~90 s its start, ~15 s the wheels'
#: install, <= 75 s the gpu-marked tests (gpu_run.sh), the rest here
BUDGET_SECONDS = 300.0
SMOKE_BUDGET_SECONDS = 1800.0
SMOKE_LIMIT_SECONDS = 600.0  # per section on a CPU (a shared 2-core machine is slow)
MIN_START_SECONDS = 5.0  # a section starts only with at least this much budget left


# --------------------------------------------------------------------------- setup
class Ctx:
    """Sizes and the device for a GPU run or a CPU smoke run."""

    def __init__(self, cpu_smoke: bool, smoke_gpus: int = 2) -> None:
        import torch

        self.smoke = cpu_smoke
        self.device = "cpu" if cpu_smoke else "cuda"
        self.torch = torch
        self.gpus = smoke_gpus if cpu_smoke else torch.cuda.device_count()
        # the last GPU: a session there must not train on the current device (cuda:0)
        self.last_device = "cpu" if cpu_smoke else f"cuda:{self.gpus - 1}"
        small = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}
        self.model_options = (
            small if cpu_smoke else {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128}
        )
        self.big_options = (
            small
            if cpu_smoke
            else {
                "layers": 12,
                "hidden": 1024,
                "heads": 16,
                "seq_len": 512,
                "dropout": 0.0,
            }
        )
        self.big_micro_batch = 4 if cpu_smoke else 16
        self.steps = 3 if cpu_smoke else 8
        self.util_window = 0.5 if cpu_smoke else 5.0  # seconds of steady training sampled
        self.util_readings = 3 if cpu_smoke else 20


def config(ctx: Ctx, **kw: Any) -> Any:
    from workbench import TrainConfig

    base: dict[str, Any] = {"micro_batch": 4, "lr": 1e-3, "seed": 1, "device": ctx.device}
    base.update(kw)
    return TrainConfig(**base)


def _local(t: Any) -> Any:
    """A DTensor's local shard, or the tensor itself."""
    return getattr(t, "_local_tensor", t)


def judge_utilization(
    readings: Sequence[float | None], *, threshold: float = 50.0, min_readings: int = 20
) -> tuple[bool, str]:
    """Whether NVML utilization readings taken over a steady stretch of training say the
    GPU was busy: at least `min_readings` readings (None ones left out) whose median is
    above `threshold` percent. The median is robust to the odd reading taken while the
    host syncs or logs; too few readings is a failure (not enough evidence), not a pass."""
    values = [float(v) for v in readings if v is not None]
    if len(values) < min_readings:
        return False, f"{len(values)} readings, need >= {min_readings}"
    median = statistics.median(values)
    low = sum(1 for v in values if v <= threshold)
    return (
        median > threshold,
        f"median {median:.0f}% over {len(values)} readings ({low} <= {threshold:g}%)",
    )


def run_rates(records: Sequence[Any]) -> dict[str, float | None]:
    """A run's `samples_per_s` and `tokens_per_s` over `records`: all their samples (tokens)
    over all their seconds (`workbench.throughput`), not the median step's rate, which a
    loader's bursts set to a rate the run never sustains (workbench/rates.py). None: no
    steps with time, or a step without a token rate."""
    from workbench.rates import throughput

    t = throughput(records)
    return {"samples_per_s": t.samples_per_s, "tokens_per_s": t.tokens_per_s}


# --------------------------------------------------------------------------- sections
def nvml_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        from workbench import Sampler, Session

        with Sampler(interval=0.1) as sampler:
            out["source"], out["reason"] = sampler.source, sampler.reason
            if ctx.smoke:
                check("nvml", "host fallback on CPU", sampler.source == "host", sampler.reason)
                return
            check("nvml", "NVML is the source", sampler.source == "nvml", sampler.reason)
            with Session(
                config(ctx, micro_batch=8), model_options=ctx.model_options, sampler=sampler
            ) as s:
                before = sampler.sample_now().gpu(s.gpu_uuid)
                check("nvml", "the training GPU is found by UUID", before is not None, s.gpu_uuid)
                s.run(optimizer_steps=ctx.steps)
                time.sleep(0.3)
                after = sampler.sample_now().gpu(s.gpu_uuid)
                record = s.history[-1]
            assert before is not None and after is not None
            out["gpu"] = {"name": after.name, "uuid": after.uuid, "index_nvml": after.index}
            out["process_memory_before_bytes"] = before.process_memory_bytes
            out["process_memory_after_bytes"] = after.process_memory_bytes
            if after.process_memory_bytes is not None:
                check(
                    "nvml",
                    "this process's GPU memory grew while training",
                    after.process_memory_bytes > (before.process_memory_bytes or 0),
                )
            check(
                "nvml",
                "records carry the training GPU's utilization",
                record.gpu_util_percent is not None,
                record.gpu_util_percent,
            )
            check(
                "nvml",
                "power and temperature read",
                after.power_watts is not None and after.temperature_c is not None,
            )

    return run


def session_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        from workbench import Session

        for precision in ("fp32", "amp-bf16", "amp-fp16"):
            if ctx.smoke and precision == "amp-fp16":
                continue  # CPU fp16 autocast works but is not what this checks
            with Session(config(ctx, precision=precision), model_options=ctx.model_options) as s:
                records = s.run(optimizer_steps=ctx.steps)
                report = s.memory()
                device = str(s.device)
            r = records[-1]
            row = {
                "device": device,
                "loss_first": records[0].loss,
                "loss_last": r.loss,
                "samples_per_s": run_rates(records[1:] or records)["samples_per_s"],
                "cuda_allocated_bytes": r.cuda_allocated_bytes,
                "cuda_max_allocated_bytes": report.cuda_max_allocated_bytes,
                "measured": {
                    k: getattr(report, k)
                    for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activation_bytes")
                },
                "predicted": None
                if report.predicted is None
                else {
                    "params_bytes": report.predicted.params_bytes,
                    "grads_bytes": report.predicted.grads_bytes,
                    "optimizer_bytes": report.predicted.optimizer_bytes,
                    "activation_bytes": report.predicted_activation_bytes,
                },
            }
            out[precision] = row
            check(
                "session",
                f"{precision}: losses finite",
                all(math.isfinite(x.loss) for x in records),
            )
            check(
                "session",
                f"{precision}: first record is marked warm-up",
                records[0].warmup and not r.warmup,
            )
            if not ctx.smoke:
                check(
                    "session",
                    f"{precision}: device has its index",
                    device.startswith("cuda:"),
                    device,
                )
                check(
                    "session",
                    f"{precision}: records carry CUDA memory",
                    (r.cuda_allocated_bytes or 0) > 0,
                )
            pred = report.predicted
            if pred is not None:
                check(
                    "session",
                    f"{precision}: params measured == predicted",
                    report.params_bytes == pred.params_bytes,
                )
                steps = report.optimizer_bytes - report.optimizer_step_counter_bytes
                check(
                    "session",
                    f"{precision}: optimizer measured == predicted",
                    steps == pred.optimizer_bytes,
                )
                act = report.predicted_activation_bytes
                if act:
                    ratio = report.activation_bytes / act
                    check(
                        "session",
                        f"{precision}: activations within 15% of predicted",
                        abs(ratio - 1) <= 0.15,
                        f"{ratio:.3f}",
                    )
        with Session(config(ctx), model_options=ctx.model_options) as s:
            s.run(optimizer_steps=1)
            prof = s.profile(steps=2, record_memory=True)
            # each record's CUDA peak is its own step's: 1 GiB allocated and freed before
            # these steps must not show in their records
            if not ctx.smoke:
                spike = ctx.torch.empty(1 << 30, dtype=ctx.torch.uint8, device=s.device)
                del spike
            peaks = [r.cuda_max_allocated_bytes for r in s.run(optimizer_steps=2)]
            split = s.profile(steps=3)
        out["profile"] = {
            "step_seconds": prof.step_seconds,
            "memory_peak_bytes": prof.memory_peak_bytes,
            "notes": list(prof.notes),
            "phase_shares": split.phase_shares,
        }
        out["record_peaks_after_a_1gib_spike"] = peaks
        if not ctx.smoke:
            check(
                "session",
                "profiler memory timeline found on cuda:N",
                prof.memory_by_category is not None,
                prof.notes,
            )
            check(
                "session",
                "each record's CUDA peak is its own step's (below an earlier 1 GiB spike)",
                all(p is not None and 0 < p < (1 << 30) for p in peaks),
                peaks,
            )
            shares = split.phase_shares
            busy = shares["forward"] + shares["backward"] + shares["optimizer"]
            check(
                "session",
                "profiler phase split: forward + backward + optimizer hold the GPU time",
                busy > shares["other"] and shares["backward"] > 0,
                {k: round(v, 3) for k, v in shares.items()},
            )

    return run


def deepspeed_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        from workbench import Session

        precisions = ["bf16"] if ctx.smoke else ["bf16", "fp16"]
        for precision in precisions:
            torch.manual_seed(0)
            module = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
            initial = {k: v.clone() for k, v in module.state_dict().items()}
            x = torch.randn(512, 64)
            data = TensorDataset(x, x.roll(1, dims=1))
            stages, scales, losses = [], [], []
            # fp16 starts with a loss scale high enough to overflow a few times, so the scale
            # in force at each switch is below its init: a restart would show as a jump
            extra = {"loss_scale_init": 2.0**24} if precision == "fp16" else {}
            cfg = config(
                ctx, precision=precision, zero_stage=0, micro_batch=8, grad_accum=2, **extra
            )
            with Session(cfg, model=module, data=data, loss_fn=nn.functional.mse_loss) as s:
                for stage in (0, 1, 2, 3, 0):
                    s.update(zero_stage=stage)
                    recs = s.run(optimizer_steps=3)
                    stages += [r.zero_stage for r in recs]
                    scales += [r.scale for r in recs]
                    losses += [r.loss for r in recs]
                    engine = getattr(s.backend, "engine", None)
                    if engine is not None:
                        check(
                            "deepspeed",
                            f"{precision}: engine runs stage {stage}",
                            engine.zero_optimization_stage() == stage,
                        )
                    if stage in (2, 3):
                        report = s.memory()
                        if report.predicted is not None:
                            out[f"{precision}_stage{stage}_memory"] = {
                                "measured_params": report.params_bytes,
                                "predicted_params": report.predicted.params_bytes,
                                "measured_optimizer": report.optimizer_bytes
                                - report.optimizer_step_counter_bytes,
                                "predicted_optimizer": report.predicted.optimizer_bytes,
                            }
                            check(
                                "deepspeed",
                                f"{precision} ZeRO-{stage}: params measured == deepspeed accounting",
                                report.params_bytes == report.predicted.params_bytes,
                            )
            out[precision] = {"stages": stages, "losses": losses, "scales": scales}
            check(
                "deepspeed",
                f"{precision}: every stage ran",
                stages == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3 + [0] * 3,
                stages,
            )
            check("deepspeed", f"{precision}: losses finite", all(math.isfinite(v) for v in losses))
            if precision == "fp16":
                # an engine switch keeps the dynamic loss scale: it never grows back to the
                # init within these steps (growth needs 2000 clean steps), so carried means
                # the first scale after a switch is at most the last one before it
                switched = [scales[i] for i in (3, 6, 9, 12)]
                before = [scales[i] for i in (2, 5, 8, 11)]
                carried = all(
                    a is not None and b is not None and a <= b < 2.0**24
                    for a, b in zip(switched, before, strict=True)
                )
                check(
                    "deepspeed",
                    "fp16: loss scale carried across switches",
                    carried,
                    f"{before} -> {switched}",
                )
            moved = any(not torch.equal(module.state_dict()[k].cpu(), initial[k]) for k in initial)
            dtypes = {str(v.dtype) for v in module.state_dict().values()}
            devices = {str(v.device) for v in module.state_dict().values()}
            check(
                "deepspeed",
                f"{precision}: your module holds trained fp32 weights after close",
                moved and dtypes == {"torch.float32"},
                f"{dtypes} on {devices}",
            )

    return run


def oom_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        from workbench import Session

        if ctx.smoke:
            out["note"] = "a real out-of-memory error needs a GPU; not forced on CPU"
            return
        total = torch.cuda.get_device_properties(0).total_memory
        per_sample = 1 << 30

        class Hog(nn.Module):
            """Allocates 1 GiB of activations per sample (kept for backward)."""

            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(16, 1)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                big = torch.ones(x.shape[0], per_sample // 4, device=x.device, requires_grad=False)
                scale = (big.sum() * 0).detach()
                hog = big * self.lin.weight.sum()  # saved for backward: the whole tensor
                return self.lin(x) + hog[:, :1] * 0 + scale

        too_many = 1
        while too_many * per_sample <= 2 * total:
            too_many *= 2
        x = torch.randn(too_many * 4, 16)
        data = TensorDataset(x, x[:, :1])
        out["micro_batch_start"] = too_many
        for stage in (0, 2):
            cfg = config(ctx, micro_batch=too_many, zero_stage=stage, optimizer="sgd")
            with Session(cfg, model=Hog(), data=data, loss_fn=nn.functional.mse_loss) as s:
                s.run(optimizer_steps=2)
                ooms = [e for e in s.events if e.kind == "oom"]
                out[f"stage{stage}"] = {
                    "micro_batch_after": s.config.micro_batch,
                    "grad_accum_after": s.config.grad_accum,
                    "oom_events": len(ooms),
                }
                check(
                    "oom",
                    f"ZeRO-{stage}: out of memory recovered by halving",
                    len(ooms) >= 1 and s.config.micro_batch < too_many and s.state == "idle",
                    out[f"stage{stage}"],
                )
                check(
                    "oom",
                    f"ZeRO-{stage}: effective batch kept",
                    s.config.micro_batch * s.config.grad_accum == too_many,
                )
            torch.cuda.empty_cache()

    return run


def fsdp_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        from workbench import Session
        from workbench.train.backends.fsdp import FSDPBackend
        from workbench.train.backends.plain import PlainBackend

        dev = ctx.last_device
        # full_shard in 16-bit compute, on the last GPU
        for precision in ("amp-bf16", "amp-fp16"):
            cfg = config(ctx, fsdp="full_shard", precision=precision)
            with Session(cfg, model_options=ctx.model_options, device=dev) as s:
                records = s.run(optimizer_steps=ctx.steps)
                report = s.memory()
                backend = s.backend
                shards = {str(_local(p).device) for p in s.model.parameters()}
            pred = report.predicted
            out[precision] = {
                "losses": [r.loss for r in records],
                "scales": [r.scale for r in records],
                "shard_devices": sorted(shards),
                "params_bytes": report.params_bytes,
                "predicted_params_bytes": None if pred is None else pred.params_bytes,
            }
            check("fsdp", f"{precision}: the FSDP engine trains", isinstance(backend, FSDPBackend))
            check(
                "fsdp",
                f"{precision}: losses finite",
                all(math.isfinite(r.loss) for r in records),
            )
            check("fsdp", f"{precision}: shards on the session's device {dev}", shards == {dev})
            if precision == "amp-fp16":
                check(
                    "fsdp",
                    "amp-fp16: the GradScaler scales the sharded gradients",
                    all(r.scale is not None for r in records),
                    [r.scale for r in records],
                )
            if pred is not None:
                check(
                    "fsdp",
                    f"{precision}: params measured == the fsdp accounting",
                    report.params_bytes == pred.params_bytes,
                    f"{report.params_bytes} vs {pred.params_bytes}",
                )

        # CPU offload: pinned host shards; the gradient norm, the scaler's found-inf flag
        # and the full-state gathers are host tensors
        cfg = config(
            ctx,
            fsdp="full_shard",
            offload_params="cpu",
            precision="amp-fp16",
            clip_grad_norm=1.0,
        )
        with Session(cfg, model_options=ctx.model_options, device=dev) as s:
            records = s.run(optimizer_steps=ctx.steps)
            weights = s.state_dict()
            params = list(s.model.parameters())
            where = {str(_local(p).device) for p in params}
            pinned = all(_local(p).is_pinned() for p in params) if not ctx.smoke else None
        out["offload"] = {
            "losses": [r.loss for r in records],
            "grad_norms": [r.grad_norm for r in records],
            "shard_devices": sorted(where),
            "pinned": pinned,
        }
        check(
            "fsdp",
            "CPU offload: steps run, losses and gradient norms finite",
            all(math.isfinite(r.loss) and math.isfinite(r.grad_norm or math.nan) for r in records),
            out["offload"]["grad_norms"],
        )
        check("fsdp", "CPU offload: the shards live in host memory", where == {"cpu"}, where)
        if not ctx.smoke:
            check("fsdp", "CPU offload: the host shards are pinned", bool(pinned))
        check(
            "fsdp",
            "CPU offload: the full state gathered",
            bool(weights) and all(math.isfinite(float(v.float().sum())) for v in weights.values()),
        )

        # live switches, state carried: FSDP -> ZeRO-3 -> off -> FSDP with CPU offload
        precision = "amp-bf16"
        cfg = config(ctx, fsdp="full_shard", precision=precision)
        kinds: list[str] = []
        losses: list[float] = []
        with Session(cfg, model_options=ctx.model_options, device=dev) as s:
            for change in (
                {},
                {"fsdp": "off", "zero_stage": 3, "precision": "bf16"},
                {"zero_stage": 0, "precision": precision},
                {"fsdp": "full_shard", "offload_params": "cpu"},
            ):
                if change:
                    s.update(**change)
                losses += [r.loss for r in s.run(optimizer_steps=3)]
                backend = s.backend
                engine = getattr(backend, "engine", None)
                if isinstance(backend, FSDPBackend):
                    kinds.append("fsdp+offload" if backend.offload else "fsdp")
                elif engine is not None:
                    kinds.append(f"zero-{engine.zero_optimization_stage()}")
                elif isinstance(backend, PlainBackend):
                    kinds.append("off")
                else:
                    kinds.append(type(backend).__name__)
        out["switches"] = {"engines": kinds, "losses": losses}
        check(
            "fsdp",
            "live switches FSDP -> ZeRO-3 -> off -> FSDP with offload",
            kinds == ["fsdp", "zero-3", "off", "fsdp+offload"],
            kinds,
        )
        check("fsdp", "losses finite across the switches", all(math.isfinite(v) for v in losses))

        # torch.compile under FSDP and under DeepSpeed (compiling takes seconds on a GPU;
        # minutes on a small CPU, so the smoke run leaves it out)
        if ctx.smoke:
            return
        for label, extra in (
            ("FSDP", {"fsdp": "full_shard", "precision": "amp-bf16"}),
            ("DeepSpeed ZeRO-2", {"zero_stage": 2, "precision": "bf16"}),
        ):
            cfg = config(ctx, compile=True, **extra)
            with Session(cfg, model_options=ctx.model_options, device=dev) as s:
                records = s.run(optimizer_steps=4)
            out[f"compile {label}"] = {
                "step_seconds": [r.step_seconds for r in records],
                "losses": [r.loss for r in records],
            }
            check(
                "fsdp",
                f"torch.compile under {label}: steps run, losses finite",
                all(math.isfinite(r.loss) for r in records) and records[0].warmup,
                out[f"compile {label}"],
            )

    return run


#: One rank of the direct collective check (run as `python -c`, one process per rank): an
#: all-reduce of 4 MiB and a broadcast over `backend`, on the rank's own GPU under NCCL.
COLLECTIVE = r"""
import json, os, sys
import torch
import torch.distributed as dist

backend = sys.argv[1]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)  # before the group: NCCL binds this rank to its GPU
dist.init_process_group(backend)
try:
    x = torch.full((1 << 20,), float(rank + 1), device=device)
    dist.all_reduce(x)
    y = torch.full((4,), float(rank), device=device)
    dist.broadcast(y, src=world - 1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the host waits for the collectives here
    print(json.dumps({
        "rank": rank,
        "backend": str(dist.get_backend()),
        "device": str(x.device),
        "sum": float(x[0]),
        "all_equal": bool((x == x[0]).all()),
        "broadcast": y.tolist(),
    }), flush=True)
finally:
    dist.destroy_process_group()
"""


def run_collective(ranks: int, backend: str, timeout: float = 120.0) -> tuple[list[Any], str]:
    """`ranks` processes of COLLECTIVE over `backend`; returns each rank's JSON result (None
    for a rank that printed none) and the stderr tail of the ranks that failed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(ranks):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(ranks),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", COLLECTIVE, backend],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout
    results: list[Any] = []
    errors: list[str] = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            out, err = proc.communicate()
            errors.append(f"rank {rank}: timed out after {timeout:g} s")
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        results.append(json.loads(lines[-1]) if lines else None)
        if proc.returncode != 0 and not errors:
            errors.append(f"rank {rank} exited {proc.returncode}: {err.strip()[-800:]}")
    return results, "; ".join(errors)


def judge_collective(results: Sequence[Any], ranks: int, backend: str) -> tuple[bool, str]:
    """Every rank answered over `backend`: the all-reduce summed 1 + ... + ranks in every
    element, the broadcast carried the last rank's value."""
    want = ranks * (ranks + 1) / 2
    ok = len(results) == ranks and all(
        r is not None
        and r["backend"] == backend
        and r["sum"] == want
        and r["all_equal"]
        and r["broadcast"] == [float(ranks - 1)] * 4
        for r in results
    )
    shown = [None if r is None else {k: r[k] for k in ("rank", "device", "sum")} for r in results]
    return ok, f"sum {want:g} wanted: {shown}"


def ranks_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        from workbench.train.launch import launch_ranks

        net = "gloo" if ctx.smoke else "NCCL"
        ranks = min(2, ctx.gpus)
        out["gpus"], out["ranks"] = ctx.gpus, ranks
        if ranks < 1:
            not_run("ranks", "ranks under a launcher", "no GPU")
            return
        launches = (
            ("ZeRO-2 under DeepSpeed's launcher", "deepspeed", {"zero_stage": 2}),
            (
                "FSDP with CPU offload under torchrun",
                "torchrun",
                {"fsdp": "full_shard", "offload_params": "cpu", "clip_grad_norm": 1.0},
            ),
        )
        zero2 = None
        for label, launcher, extra in launches:
            result = launch_ranks(
                config(ctx, micro_batch=2, **extra),
                ranks=ranks,
                launcher=launcher,
                model="tiny-gpt",
                model_options=ctx.model_options,
                steps=3,
                timeout=240,
            )
            records = result.records
            error = None if result.first_error is None else str(result.first_error)
            out[label] = {
                "ok": result.ok,
                "first_error": error,
                "losses": {r: [x.loss for x in recs] for r, recs in records.items()},
                "grad_norms": {r: [x.grad_norm for x in recs] for r, recs in records.items()},
                "cuda_peak_bytes": {
                    r: [x.cuda_max_allocated_bytes for x in recs] for r, recs in records.items()
                },
            }
            check(
                "ranks",
                f"{label}: {ranks} rank(s) over {net} trained",
                result.ok and all(len(records.get(r, [])) == 3 for r in range(ranks)),
                error or "",
            )
            if not ctx.smoke:
                peaks = out[label]["cuda_peak_bytes"]
                check(
                    "ranks",
                    f"{label}: every rank reports its own CUDA peak",
                    all(peaks.get(r) and all((p or 0) > 0 for p in peaks[r]) for r in range(ranks)),
                    peaks,
                )
            if launcher == "deepspeed":
                zero2 = out[label]
        # the collectives themselves, on min(2, GPUs) ranks: with one GPU a 1-rank group,
        # which runs NCCL's set-up and kernels but moves nothing between GPUs
        backend = "gloo" if ctx.smoke else "nccl"
        results, error = run_collective(ranks, backend)
        out["collective"] = {"ranks": ranks, "backend": backend, "results": results}
        ok, detail = judge_collective(results, ranks, backend)
        alone = " (1 rank: nothing moves between GPUs)" if ranks == 1 else ""
        check(
            "ranks",
            f"{net} group of {ranks} rank(s): all-reduce and broadcast{alone}",
            ok and not error,
            error or detail,
        )
        name = f"{net} all-reduce between 2 ranks (ZeRO-2 gradients)"
        if ranks < 2:
            # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so two
            # processes sharing the GPU are no way to test it: this needs 2 GPUs
            not_run(
                "ranks",
                name,
                f"{ctx.gpus} GPU: NCCL needs one GPU per rank, so 2 ranks need 2 GPUs "
                "(the 1-rank group above ran NCCL's set-up and collectives, no traffic)",
            )
        elif zero2 is not None and zero2["ok"]:
            norms = zero2["grad_norms"]
            # the gradient norm of the whole reduced gradient is one value on every rank
            check("ranks", name, norms.get(0) == norms.get(1) and bool(norms.get(0)), norms)
        else:
            check("ranks", name, False, "the ZeRO-2 launch failed")

    return run


def compress_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        import torch

        from workbench.compress import compare, held_out_split, prune_unstructured, quantize_int8
        from workbench.compress.quantize import torchao_version
        from workbench.models import build_model

        options = (
            {"hidden": 32, "depth": 2, "samples": 512}
            if ctx.smoke
            else {"hidden": 1024, "depth": 3, "samples": 4096}
        )
        model, dataset, loss_fn, _ = build_model("mlp", seed=1, **options)
        _, held_out = held_out_split(dataset)
        device = torch.device(ctx.last_device)
        model.to(device).eval()
        candidates: dict[str, Any] = {}
        version = torchao_version()
        out["torchao"] = version
        if version is None:
            not_run("compress", "torchao INT8 on CUDA", "torchao is not installed")
        else:
            candidates["int8"] = quantize_int8(model)  # torchao: on the model's device
        candidates["prune"] = prune_unstructured(model, 0.5)
        report = compare(
            model, candidates, held_out, loss_fn, batch_size=64, repeats=5 if ctx.smoke else 20
        )
        out["report"] = report.to_dict()
        print("  " + str(report).replace("\n", "\n  "))
        check(
            "compress",
            f"measured on {device}",
            str(report.setup.get("device")) == str(device),
            report.setup.get("device"),
        )
        before = report.before.figures
        for method in candidates:
            row = report.row(method).figures
            if method == "int8":
                check(
                    "compress",
                    "int8: the weights are smaller",
                    row.params_bytes < before.params_bytes,
                    f"{row.params_bytes} vs {before.params_bytes} bytes",
                )
            else:
                check(
                    "compress",
                    "prune: half the weights are zero",
                    (row.zero_fraction or 0.0) >= 0.45,
                    row.zero_fraction,
                )
            check(
                "compress",
                f"{method}: held-out loss finite and near the model's",
                math.isfinite(row.loss)
                and abs(row.loss - before.loss) <= 0.5 * abs(before.loss) + 0.1,
                f"{row.loss:.4f} vs {before.loss:.4f}",
            )

    return run


def speed_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:

        from workbench import Sampler, Session

        steps = ctx.steps + 2
        speeds: dict[str, float] = {}
        with Sampler(interval=0.1) as sampler:
            for precision in ("fp32", "amp-bf16"):
                cfg = config(ctx, precision=precision, micro_batch=ctx.big_micro_batch)
                with Session(cfg, model_options=ctx.big_options, sampler=sampler) as s:
                    recs = [r for r in s.run(optimizer_steps=steps) if not r.warmup]
                    n_params = sum(p.numel() for p in s.model.parameters())
                    util = steady_utilization(ctx, s, sampler) if precision == "amp-bf16" else []
                rates = run_rates(recs)
                speeds[precision] = rates["samples_per_s"]
                out[precision] = {**rates, "n_params": n_params}
                if util:
                    out[precision]["gpu_util_readings"] = util
        out["amp_bf16_speedup"] = speeds["amp-bf16"] / speeds["fp32"]
        print(f"  amp-bf16 vs fp32: {out['amp_bf16_speedup']:.2f}x")
        if not ctx.smoke:
            check(
                "speed",
                "amp-bf16 faster than fp32 on the GPU",
                out["amp_bf16_speedup"] > 1.0,
                f"{out['amp_bf16_speedup']:.2f}x",
            )
            ok, detail = judge_utilization(
                out["amp-bf16"].get("gpu_util_readings", []), min_readings=ctx.util_readings
            )
            check("speed", "GPU utilization > 50% over a steady stretch of training", ok, detail)

        # overhead: the same model, settings and steps in a hand-written loop
        cfg = config(ctx, precision="fp32", micro_batch=ctx.big_micro_batch)
        plain_s = plain_step_seconds(ctx, steps)
        with Session(cfg, model_options=ctx.big_options) as s:
            s.run(optimizer_steps=1)
            t = time.perf_counter()
            s.run(optimizer_steps=steps)
            session_s = (time.perf_counter() - t) / steps
        out["overhead_ratio"] = session_s / plain_s
        out["plain_step_seconds"], out["session_step_seconds"] = plain_s, session_s
        print(f"  Session vs plain loop: {out['overhead_ratio']:.3f}")
        if not ctx.smoke:
            check(
                "speed",
                "Session overhead vs a plain loop <= 1.05",
                out["overhead_ratio"] <= 1.05,
                f"{out['overhead_ratio']:.3f}",
            )

    return run


def _llama_step(model: Any, opt: Any, ids: Any, autocast: Any) -> None:
    """One training step as the estimate assumes it: the output freed before backward."""
    with autocast:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def peak_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    """The estimator's peak of a step next to `torch.cuda.max_memory_allocated()` over one
    steady optimizer step of a `transformers` Llama built from a config, in a plain loop
    (the output freed before backward, as the estimate assumes), for each precision and
    attention kernel; and the dry run's peak when `workbench.simulate_memory` exists."""

    def run(out: dict[str, Any]) -> None:
        import logging

        import torch

        for noisy in ("torchao", "torch.utils._pytree"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        import transformers

        import workbench
        from workbench.estimate import estimate_memory

        device = torch.device(ctx.device)
        cuda = device.type == "cuda"
        size = (
            dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256)
            if ctx.smoke
            else dict(
                num_hidden_layers=8,
                hidden_size=1024,
                num_attention_heads=16,
                intermediate_size=2816,
            )
        )
        seq, batch = (128, 2) if ctx.smoke else (2048, 4)
        shape = dict(
            **size,
            num_key_value_heads=size["num_attention_heads"] // 4,
            vocab_size=32000,
            max_position_embeddings=seq,
            attention_dropout=0.0,
        )
        for precision in ("fp32", "amp-bf16", "bf16-true"):
            for kernel in ("sdpa", "eager"):
                name = f"{precision}, {kernel}"
                torch.manual_seed(0)
                model = transformers.LlamaForCausalLM(
                    # trained without a KV cache, as the dry run's copy (use_cache=False):
                    # with it each forward also returns the cache's keys and values
                    transformers.LlamaConfig(**shape, attn_implementation=kernel, use_cache=False)
                )
                if precision == "bf16-true":
                    model = model.to(torch.bfloat16)
                model.to(device).train()
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
                ids = torch.randint(0, 32000, (batch, seq), device=device)
                autocast = torch.autocast(
                    device.type, dtype=torch.bfloat16, enabled=precision == "amp-bf16"
                )

                _llama_step(model, opt, ids, autocast)  # optimizer states exist from here on
                if cuda:
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                _llama_step(model, opt, ids, autocast)
                measured = torch.cuda.max_memory_allocated(device) if cuda else None
                # segments are cached from the first step on (nothing empties the cache
                # until the setup is done): the reserved peak of both steps
                reserved = torch.cuda.max_memory_reserved(device) if cuda else None
                e = estimate_memory(
                    model=model,
                    seq_len=seq,
                    micro_batch=batch,
                    precision=precision,
                    attention=kernel,
                    dropout=False,
                    optimizer_impl="foreach",
                )
                row: dict[str, Any] = {
                    "use_cache": model.config.use_cache,
                    "measured_max_allocated": measured,
                    "measured_max_reserved": reserved,
                    "formula_peak": e.peak_bytes,
                    "formula_phase": e.peak.phase,
                    "formula_terms": e.peak_terms,
                }
                simulate = getattr(workbench, "simulate_memory", None)
                if simulate is not None:
                    dry = simulate(
                        model,
                        workbench.TrainConfig(precision=precision, micro_batch=batch),
                        batch={"input_ids": ids.cpu(), "labels": ids.cpu()},
                    )
                    row["dry_run_peak"] = dry.peak_bytes
                    if getattr(dry, "reserved_peak_bytes", None) is not None:
                        # the allocator model's replay of the dry run's allocations
                        row["dry_run_reserved_peak"] = dry.reserved_peak_bytes
                        row["dry_run_allocated_peak"] = dry.allocated_peak_bytes
                        row["dry_run_fragmentation"] = dry.fragmentation_bytes
                        advice = dry.allocator_advice
                        row["dry_run_allocator_advice"] = str(advice) if advice else None
                out[name] = row
                del model, opt, ids
                if cuda:
                    torch.cuda.empty_cache()
                if measured:
                    ratio = e.peak_bytes / measured
                    row["formula_over_measured"] = ratio
                    print(f"  {name}: formula / measured peak = {ratio:.3f}")
                    check(
                        "peak",
                        f"{name}: formula peak within 15% of max_memory_allocated",
                        abs(ratio - 1) <= 0.15,
                        f"{ratio:.3f}",
                    )
                    if reserved and "dry_run_reserved_peak" in row:
                        reserved_ratio = row["dry_run_reserved_peak"] / reserved
                        row["dry_run_reserved_over_measured"] = reserved_ratio
                        print(
                            f"  {name}: allocator model / max_memory_reserved = {reserved_ratio:.3f}"
                        )
                        check(
                            "peak",
                            f"{name}: the allocator model's reserved peak within 15% of "
                            "max_memory_reserved (cuBLAS's workspace is not in the trace)",
                            abs(reserved_ratio - 1) <= 0.15,
                            f"{reserved_ratio:.3f} ({row['dry_run_reserved_peak']} vs {reserved})",
                        )
                    if "dry_run_peak" in row:
                        dry_ratio = row["dry_run_peak"] / measured
                        row["dry_run_over_measured"] = dry_ratio
                        check(
                            "peak",
                            f"{name}: dry-run peak within 10% of max_memory_allocated",
                            abs(dry_ratio - 1) <= 0.10,
                            f"{dry_ratio:.3f}",
                        )

    return run


def ladder_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        from workbench import ladder

        # smoke: the in-process rungs only (the ranks section launches ranks already).
        # Steps: the accumulation rung's batch (4x, on every GPU) must divide the samples
        # into >= 2 steps.
        gpus = 1 if ctx.smoke else ctx.torch.cuda.device_count()
        result = ladder(
            None,
            "tiny-gpt",
            8 if ctx.smoke else max(16, 8 * gpus),
            base=config(ctx, micro_batch=4 if ctx.smoke else 16),
            model_options=ctx.model_options,
            repeats=1,
            ranks=1 if ctx.smoke else None,
            compile=not ctx.smoke,
            checkpointing=True,
            device=ctx.device,
            timeout=300,
            progress=False,
        )
        print("  " + str(result).replace("\n", "\n  "))
        out["result"] = result.to_dict()
        failed = {r.name: r.error for r in result.rungs if r.error is not None}
        check("ladder", "every rung ran", not failed, failed or "")
        check(
            "ladder",
            "every rung trained on the same samples",
            len({r.samples for r in result.rungs}) == 1,
            [r.samples for r in result.rungs],
        )
        check(
            "ladder",
            "memory measured and predicted for every rung",
            all(
                r.memory_measured_bytes is not None and r.memory_predicted_bytes is not None
                for r in result.rungs
            ),
            [(r.memory_measured_bytes, r.memory_predicted_bytes) for r in result.rungs],
        )
        if not ctx.smoke:
            amp = result.rungs[1]
            check(
                "ladder",
                "the AMP rung uses bf16 on a GPU that supports it",
                amp.settings["precision"] == "amp-bf16" or not ctx.torch.cuda.is_bf16_supported(),
                amp.settings["precision"],
            )
            compiled = next(r for r in result.rungs if r.settings.get("compile"))
            check(
                "ladder",
                "compile time reported apart from the step time",
                compiled.warmup_seconds is not None and compiled.step_seconds is not None,
                f"first step +{compiled.warmup_seconds} s, median step {compiled.step_seconds} s",
            )

    return run


def steady_utilization(ctx: Ctx, session: Any, sampler: Any) -> list[float | None]:
    """NVML utilization readings of the session's GPU over `ctx.util_window` seconds of
    steady training: training runs in the background on the session's built engine (past
    its warm-up step), readings start after two more steps (so no set-up or compile time
    is sampled) and are taken every 0.1 s."""
    first = session.step
    session.start()
    readings: list[float | None] = []
    try:
        deadline = time.monotonic() + 120
        while session.step < first + 2:
            if session.state != "running" or time.monotonic() > deadline:
                return readings
            time.sleep(0.02)
        end = time.monotonic() + ctx.util_window
        while time.monotonic() < end and session.state == "running":
            gpu = sampler.sample_now().gpu(session.gpu_uuid)
            readings.append(None if gpu is None else gpu.util_percent)
            time.sleep(0.1)
    finally:
        if session.state == "running":
            session.stop()
    return readings


def plain_step_seconds(ctx: Ctx, steps: int) -> float:
    """Seconds per step of a hand-written loop on the speed section's model (fp32, AdamW)."""
    import torch
    from torch.utils.data import DataLoader

    from workbench.models import build_model

    model, dataset, loss_fn, _ = build_model("tiny-gpt", seed=1, **ctx.big_options)
    device = torch.device("cpu") if ctx.smoke else torch.device("cuda", 0)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loader = DataLoader(dataset, batch_size=ctx.big_micro_batch, shuffle=True, drop_last=True)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # host waits for the device here, as the Session does once per step

    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t) / steps


# --------------------------------------------------------------------------- main
#: name -> (section, seconds estimated on one H200); the order they run in
#: one ordered run, the newest code first: the budget cuts the oldest. name -> (section,
#: its estimate in seconds on one H200: estimates, none measured yet on a GPU)
SECTIONS: dict[str, tuple[Callable[[Ctx], Callable[[dict[str, Any]], None]], float]] = {
    "optim8": (lambda ctx: gpu_newest.optim8_section(ctx, check), 30),
    "offload": (lambda ctx: gpu_newest.offload_section(ctx, check), 15),
    "lora": (lambda ctx: gpu_newest.lora_section(ctx, check), 20),
    "dryrun": (lambda ctx: gpu_newest.dryrun_section(ctx, check), 35),
    "observers": (lambda ctx: gpu_newest.observers_section(ctx, check), 30),
    "syncs": (lambda ctx: gpu_syncs.syncs_section(ctx, check), 8),
    "peak": (peak_section, 45),
    "anchors": (lambda ctx: gpu_syncs.anchors_section(ctx, check), 5),
    "session": (session_section, 25),
    "nvml": (nvml_section, 10),
    "oom": (oom_section, 20),
    "compress": (compress_section, 20),
    "deepspeed": (deepspeed_section, 60),
    "fsdp": (fsdp_section, 100),
    "ranks": (ranks_section, 70),
    "speed": (speed_section, 50),
    "ladder": (ladder_section, 60),
}


#: what only two GPUs can run: a lent machine has one, and NCCL refuses two ranks on one
NCCL_ONE_GPU = "NCCL refuses two ranks on one GPU: needs a machine with 2 GPUs"
#: each CUDA path of the package -> the sections and `gpu`-marked tests
#: ("tests/...py::test_name") that run it on a GPU: every engine (workbench/engines.py),
#: every optimizer a Session trains (workbench/optimizers.py rows with engines) and every
#: technique (workbench/train/techniques/*.py). tests/unit/test_gpu_coverage_rule.py
#: fails when one is missing here, or names a section or test that does not exist.
COVERAGE: dict[str, tuple[str, ...]] = {
    "engine:plain": ("session", "syncs", "optim8"),
    "engine:deepspeed": ("deepspeed", "oom"),
    "engine:fsdp": (
        "fsdp",
        "dryrun",
        "tests/integration/test_fsdp.py::test_fsdp_trains_on_the_sessions_cuda_device_not_the_current_one",
    ),
    "optimizer:adamw": ("session", "optim8"),
    "optimizer:adam": ("syncs",),
    "optimizer:sgd": ("syncs",),
    "optimizer:sgd-nomomentum": ("syncs",),
    "optimizer:adafactor": ("syncs",),
    "optimizer:adam8bit": ("optim8", "syncs"),
    "optimizer:paged-adam8bit": (
        "optim8",
        "syncs",
        "tests/integration/test_paged_adam8bit.py::test_on_a_gpu_its_large_states_are_paged",
    ),
    "technique:attention": ("offload", "peak"),
    "technique:lora": ("lora", "dryrun"),
    "technique:offload": (
        "offload",
        "tests/integration/test_activation_offload.py::test_on_a_gpu_the_device_holds_less_and_the_numbers_are_the_same",
    ),
    "technique:precision": ("session", "syncs", "peak"),
    "technique:recompute": ("offload", "ladder"),
    "technique:sharded_adafactor": (
        "tests/integration/test_adafactor.py::test_on_a_gpu_the_sharded_step_is_torchs_step",
    ),
}
#: what a lent machine cannot run, and why (said in the docs and the results)
LEFT_OUT: dict[str, str] = {
    "engine:tensor-parallel": NCCL_ONE_GPU,
    "engine:pipeline": NCCL_ONE_GPU,
    "technique:tensor_plan": NCCL_ONE_GPU,
    "technique:pipeline_plan": NCCL_ONE_GPU,
}


def section_limits(text: str) -> dict[str, float]:
    """`--section-limit`: "SECONDS" for every section, or "NAME=SECONDS,NAME=SECONDS"."""
    limits: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.rpartition("=")
        name = name.strip() or "*"
        if name not in ("*", STALL) and name not in SECTIONS:
            raise argparse.ArgumentTypeError(f"{part!r}: unknown section; one of {list(SECTIONS)}")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0 or not math.isfinite(seconds):
            raise argparse.ArgumentTypeError(f"{part!r}: seconds must be a number > 0")
        limits[name] = seconds
    return limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="run every section tiny on CPU")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument(
        "--out",
        default=None,
        help="results JSON path (default: gpu_check.json in --out-dir)",
    )
    parser.add_argument(
        "--out-dir",
        default=os.environ.get("OUT") or None,
        help="folder the results JSON is written to, after every section and on SIGTERM "
        "(default: $OUT when set, the folder a lent machine sends back; else "
        "benchmarks/results/)",
    )
    parser.add_argument(
        "--smoke-stall",
        action="store_true",
        help="with --cpu-smoke: first a section 'stall' that starts forked loader workers "
        "and a stand-in compile worker, then waits past its limit (checks the clean-up of "
        "a timed-out section)",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="exit 0 when nothing failed though some checks or sections did not run",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for the whole run (default {BUDGET_SECONDS:g} on a GPU, under 8 minutes)",
    )
    parser.add_argument(
        "--section-limit",
        type=section_limits,
        default={},
        metavar="SECONDS | NAME=SECONDS,...",
        help="seconds every section (or the named ones) may take (default: twice the "
        "estimate on a GPU)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=GRACE_SECONDS,
        help="seconds a section past its limit may take to return before the run ends",
    )
    parser.add_argument(
        "--smoke-gpus",
        type=int,
        default=2,
        choices=(1, 2),
        help="with --cpu-smoke: the GPU count the ranks section acts on (1: as on one GPU)",
    )
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        parser.error(f"--sections {args.sections}: unknown {unknown}; choose from {list(SECTIONS)}")
    if args.smoke_stall and not args.cpu_smoke:
        parser.error("--smoke-stall: only with --cpu-smoke (it stalls a section on purpose)")
    stall: StallSection | None = None
    if args.smoke_stall:
        stall = StallSection()
        SECTIONS[STALL] = (lambda ctx: stall, 1)  # type: ignore[assignment,return-value]
        wanted.insert(0, STALL)
    name = "gpu_check_cpu_smoke" if args.cpu_smoke else "gpu_check"
    folder = Path(args.out_dir) if args.out_dir else RESULTS_DIR
    path = Path(args.out) if args.out else folder / f"{name}.json"
    run = Run(name, path, args.allow_partial)
    install_sigterm(run)
    signal.signal(signal.SIGALRM, _on_alarm(run))
    budget = args.budget
    if budget is None:
        budget = SMOKE_BUDGET_SECONDS if args.cpu_smoke else BUDGET_SECONDS
    estimates = {n: SECTIONS[n][1] for n in wanted}

    def limit_of(section: str) -> float:
        limits = args.section_limit
        if section in limits or "*" in limits:
            return float(limits.get(section, limits.get("*")))
        return SMOKE_LIMIT_SECONDS if args.cpu_smoke else 2.0 * estimates[section]

    import torch

    RESULT["mode"] = "cpu-smoke" if args.cpu_smoke else "gpu"
    RESULT["torch"] = torch.__version__
    RESULT["torch_cuda"] = torch.version.cuda
    RESULT["budget_s"] = budget
    RESULT["plan"] = {n: {"estimate_s": estimates[n], "limit_s": limit_of(n)} for n in wanted}
    RESULT["estimated_total_s"] = sum(estimates.values())
    RESULT["left_out"] = LEFT_OUT
    plan = ", ".join(f"{n} ~{estimates[n]:g} s" for n in wanted)
    print(
        f"plan on one H200: {plan}; about {sum(estimates.values()):g} s in all, a {budget:g} s "
        "budget (under 8 minutes)"
    )
    run.pending = list(wanted)
    if not args.cpu_smoke:
        if not torch.cuda.is_available():
            message = (
                f"FAILED: torch {torch.__version__} sees no CUDA GPU (torch.version.cuda="
                f"{torch.version.cuda}); this check needs an NVIDIA GPU and a CUDA build of torch"
            )
            print(message)
            RESULT["error"] = message
            run.save(complete=True)
            return EXIT_FAILED
        RESULT["devices"] = [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ]
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}: {RESULT['devices']}")
    ctx = Ctx(args.cpu_smoke, smoke_gpus=args.smoke_gpus)
    run.save()
    for section in wanted:
        left = budget - (time.monotonic() - run.started)
        if left < max(MIN_START_SECONDS, estimates[section]):
            note = (
                f"not started: {left:.0f} s of the run's {budget:g} s budget left, its "
                f"estimate {estimates[section]:g} s"
            )
            print(f"\n== {section}: {note}")
            with run.lock:
                run.pending.remove(section)
                RESULT["sections"][section] = {"status": NOT_RUN, "note": note}
                CHECKS.append((section, "section ran", NOT_RUN, note))
            run.save()
            continue
        limit = min(limit_of(section), left)
        run_section(
            run,
            section,
            SECTIONS[section][0](ctx),
            limit=limit,
            estimate=estimates[section],
            grace=args.grace,
        )
    if stall is not None:
        stall.close()
    run.save(complete=True)
    code = exit_status(CHECKS, args.allow_partial)
    print(f"\n{RESULT['summary']['line']} in {RESULT['seconds']} s; wrote {path}")
    for s, c, status, d in CHECKS:
        if status != PASSED:
            print(f"{status.upper()} [{s}] {c}: {d}")
    if code == EXIT_PARTIAL:
        print("some checks did not run: exit 3 (--allow-partial accepts a partial run)")
    return code


if __name__ == "__main__":
    sys.exit(main())
