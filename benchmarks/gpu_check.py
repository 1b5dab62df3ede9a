"""The GPU check: every CUDA, NCCL and NVML path of the workbench on a real NVIDIA GPU.

    .venv/bin/python benchmarks/gpu_check.py            # or: make gpu-check
    .venv/bin/python benchmarks/gpu_check.py --cpu-smoke   # the same code paths, tiny, on CPU

Fails (exit 1) when torch has no CUDA: this script is for a GPU machine. Sections, each
with its own checks (one failing section does not stop the others):

1. nvml: NVML reads the GPU the session trains on (matched by UUID), this process's GPU
   memory grows when the session allocates.
2. session: a Session on CUDA in fp32, amp-bf16 and amp-fp16; step records carry CUDA
   memory; `memory()` measured vs predicted (model states exact, activations within 15%),
   the CUDA peak; the profiler's memory timeline on "cuda:N".
3. deepspeed: DeepSpeed bf16 and fp16 with ZeRO 0-3 and live switches 0 -> 1 -> 2 -> 3 -> 0
   on one running session; the fp16 loss scale carried across switches; after close()
   the user's module holds fp32 trained weights on the GPU; measured model states against
   the "deepspeed" accounting.
4. oom: an out-of-memory error forced with a micro-batch that cannot fit (a module that
   allocates 1 GiB per sample), recovered by halving, plain and under ZeRO-2.
5. ranks: 2 ranks over NCCL with ZeRO-2 when 2+ GPUs exist (measured vs predicted).
6. speed: a GPT sized to load the GPU, fp32 vs amp-bf16 samples/s (warm-up steps left
   out) and GPU utilization from the monitor during the run; the Session's overhead
   against a hand-written loop on the same model.
7. ladder: the optimization ladder (`workbench.ladder`) on the GPU: fp32, + AMP and loader
   workers with pinned memory, + data parallel over every GPU when there are 2 or more,
   + accumulation with a scaled LR and OneCycle, + torch.compile, + activation
   checkpointing; every rung runs, on the same samples, with memory measured and
   predicted, and the compile time reported apart from the step time.

All figures go to benchmarks/results/gpu_check.json (gpu_check_cpu_smoke.json for the
smoke run). Target: under 8 minutes end to end on one GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from _common import write_results

RESULT: dict[str, Any] = {"sections": {}}
CHECKS: list[tuple[str, str, bool, str]] = []  # (section, check, ok, detail)


def check(section: str, name: str, ok: bool, detail: Any = "") -> bool:
    CHECKS.append((section, name, bool(ok), str(detail)))
    print(f"  [{'ok' if ok else 'FAILED'}] {name}" + (f": {detail}" if detail != "" else ""))
    return bool(ok)


def section(name: str, fn: Callable[[dict[str, Any]], None]) -> None:
    print(f"\n== {name}")
    out: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        fn(out)
    except Exception as exc:
        check(name, "section ran to the end", False, f"{type(exc).__name__}: {exc}")
        out["error"] = traceback.format_exc()
        print(out["error"])
    out["seconds"] = round(time.perf_counter() - start, 1)
    RESULT["sections"][name] = out


# --------------------------------------------------------------------------- setup
class Ctx:
    """Sizes and the device for a GPU run or a CPU smoke run."""

    def __init__(self, cpu_smoke: bool) -> None:
        import torch

        self.smoke = cpu_smoke
        self.device = "cpu" if cpu_smoke else "cuda"
        self.torch = torch
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


def config(ctx: Ctx, **kw: Any) -> Any:
    from workbench import TrainConfig

    base: dict[str, Any] = {"micro_batch": 4, "lr": 1e-3, "seed": 1, "device": ctx.device}
    base.update(kw)
    return TrainConfig(**base)


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
                "samples_per_s": statistics.median(x.samples_per_s for x in records[1:] or records),
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
        out["profile"] = {
            "step_seconds": prof.step_seconds,
            "memory_peak_bytes": prof.memory_peak_bytes,
            "notes": list(prof.notes),
        }
        if not ctx.smoke:
            check(
                "session",
                "profiler memory timeline found on cuda:N",
                prof.memory_by_category is not None,
                prof.notes,
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


def ranks_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        import torch

        from workbench.train.launch import launch_ranks

        gpus = 0 if ctx.smoke else torch.cuda.device_count()
        out["gpus"] = gpus
        if not ctx.smoke and gpus < 2:
            out["note"] = f"{gpus} GPU: 2 NCCL ranks need 2 GPUs; not run"
            print(f"  {out['note']}")
            return
        result = launch_ranks(
            config(ctx, zero_stage=2, micro_batch=2),
            ranks=2,
            model="tiny-gpt",
            model_options=ctx.model_options,
            steps=3,
            timeout=300,
        )
        out["ok"] = result.ok
        out["first_error"] = None if result.first_error is None else result.first_error.message
        check(
            "ranks",
            f"2 ranks over {'gloo' if ctx.smoke else 'NCCL'} with ZeRO-2",
            result.ok,
            out["first_error"],
        )

    return run


def speed_section(ctx: Ctx) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:

        from workbench import Sampler, Session

        steps = ctx.steps + 2
        speeds: dict[str, float] = {}
        with Sampler(interval=0.2) as sampler:
            for precision in ("fp32", "amp-bf16"):
                cfg = config(ctx, precision=precision, micro_batch=ctx.big_micro_batch)
                with Session(cfg, model_options=ctx.big_options, sampler=sampler) as s:
                    start = time.time()
                    recs = [r for r in s.run(optimizer_steps=steps) if not r.warmup]
                    util = [
                        g.util_percent
                        for smp in sampler.history(since=start)
                        if (g := smp.gpu(s.gpu_uuid)) is not None and g.util_percent is not None
                    ]
                speeds[precision] = statistics.median(r.samples_per_s for r in recs)
                out[precision] = {
                    "samples_per_s": speeds[precision],
                    "tokens_per_s": statistics.median(r.tokens_per_s or 0 for r in recs),
                    "gpu_util_percent_median": statistics.median(util) if util else None,
                    "n_params": sum(p.numel() for p in s.model.parameters()),
                }
        out["amp_bf16_speedup"] = speeds["amp-bf16"] / speeds["fp32"]
        print(f"  amp-bf16 vs fp32: {out['amp_bf16_speedup']:.2f}x")
        if not ctx.smoke:
            check(
                "speed",
                "amp-bf16 faster than fp32 on the GPU",
                out["amp_bf16_speedup"] > 1.0,
                f"{out['amp_bf16_speedup']:.2f}x",
            )
            util = out["amp-bf16"]["gpu_util_percent_median"]
            check(
                "speed",
                "GPU utilization median > 50% while training",
                util is not None and util > 50,
                util,
            )

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
            repeats=1 if ctx.smoke else 2,
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
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="run every section tiny on CPU")
    parser.add_argument("--sections", default="nvml,session,deepspeed,oom,ranks,speed,ladder")
    parser.add_argument(
        "--out", default=None, help="results JSON path (default: benchmarks/results/)"
    )
    args = parser.parse_args(argv)
    import torch

    ctx = Ctx(args.cpu_smoke)
    RESULT["mode"] = "cpu-smoke" if args.cpu_smoke else "gpu"
    RESULT["torch"] = torch.__version__
    RESULT["torch_cuda"] = torch.version.cuda
    if not args.cpu_smoke:
        if not torch.cuda.is_available():
            print(
                f"FAILED: torch {torch.__version__} sees no CUDA GPU (torch.version.cuda="
                f"{torch.version.cuda}); this check needs an NVIDIA GPU and a CUDA build of torch"
            )
            return 1
        RESULT["devices"] = [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ]
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}: {RESULT['devices']}")
    sections = {
        "nvml": nvml_section,
        "session": session_section,
        "deepspeed": deepspeed_section,
        "oom": oom_section,
        "ranks": ranks_section,
        "speed": speed_section,
        "ladder": ladder_section,
    }
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in sections]
    if unknown:
        parser.error(f"--sections {args.sections}: unknown {unknown}; choose from {list(sections)}")
    start = time.perf_counter()
    for name in wanted:
        with contextlib.suppress(KeyboardInterrupt):
            section(name, sections[name](ctx))
    RESULT["seconds"] = round(time.perf_counter() - start, 1)
    RESULT["checks"] = [{"section": s, "check": c, "ok": ok, "detail": d} for s, c, ok, d in CHECKS]
    failed = [c for c in CHECKS if not c[2]]
    name = "gpu_check_cpu_smoke" if args.cpu_smoke else "gpu_check"
    path = write_results(name, RESULT, path=args.out)
    print(
        f"\n{len(CHECKS) - len(failed)} of {len(CHECKS)} checks passed in {RESULT['seconds']} s; wrote {path}"
    )
    for s, c, _, d in failed:
        print(f"FAILED [{s}] {c}: {d}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
