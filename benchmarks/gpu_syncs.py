"""gpu_check's syncs and anchors sections: host-device syncs per optimizer step, counted,
and the anchors (`benchmarks/anchors.py`) on the GPU.

* syncs (~8 s): a Session on CUDA (fp32, amp-bf16, fp32 with clipping, bf16-true, and the
  optimizers Adam, SGD with and without momentum, Adafactor, torchao's and bitsandbytes' paged 8-bit AdamW; the
  default loader settings, no pinned memory) trains warm-up steps, then
  `STEPS` steps with `torch.cuda.set_sync_debug_mode("warn")` (which warns at every
  operation that makes the host wait: `.item()`, `.tolist()`, a copy to pageable host
  memory) and with `torch.cuda.synchronize` and the event and stream `synchronize` methods
  counted. Fails when a step of the default setups syncs more than once, or clipping adds
  a sync. bitsandbytes' optimizers sync after every parameter (and once more when paged):
  "one sync a step" does not hold for them, and their bound is that count. amp-fp16 is reported, not judged: its GradScaler checks for inf itself. Each
  sync is attributed to the file and line that made it.
* anchors (~5 s): `anchors.compare` on CUDA for the tiny MLP (the fixed cost) and a GPT of
  6 layers x 512 (throughput), two interleaved repeats, under the plain loop, the Session
  and accelerate (Lightning's and the Hugging Face Trainer's start-up do not fit gpu_check's
  8-minute budget: `benchmarks/anchors.py --device cuda` runs all five); the table is
  printed and kept in the results; checks that every trainer ran and that the Session's
  ratio to the plain loop on the GPT is at most 1.10.

On `--cpu-smoke` the same code runs on the CPU: the syncs section counts the step's reads of
device values (`read_device_values`, once per step) instead, the anchors run a few steps.
The section functions take gpu_check's `Ctx` and its `check` function.
"""

from __future__ import annotations

import contextlib
import statistics
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

SYNC_WARNING = "called a synchronizing CUDA operation"
MLP_64 = {"in_features": 32, "hidden": 64, "depth": 2, "out_features": 8}
#: a GPT whose step loads an H200 (the built-in tiny-gpt's step is launch-bound there)
#: the trainers gpu_check's anchors section runs (quick to start; anchors.py runs all)
GPU_CHECK_TRAINERS = ("plain", "session", "accelerate")
GPU_GPT = {"layers": 6, "hidden": 512, "heads": 8, "seq_len": 256, "dropout": 0.0}
STEPS = 10
WARMUP_STEPS = 3
#: bitsandbytes' 8-bit optimizers synchronize after every parameter they step, and once
#: more when paged (bitsandbytes/optim/optimizer.py `Optimizer8bit.step`: `sync_gpu(p)`
#: per parameter): their bound is the step's one read plus those
PER_PARAMETER = "one per parameter"
#: setup -> the most syncs per steady optimizer step allowed (None: reported only)
BOUNDS: dict[str, int | str | None] = {
    "fp32": 1,
    "amp-bf16": 1,
    "fp32+clip": 1,
    "bf16-true": 1,
    "amp-fp16": None,
    "sgd": 1,
    "sgd-nomomentum": 1,
    "adam": 1,
    "adafactor": 1,
    "adam8bit": 1,
    "paged-adam8bit": PER_PARAMETER,
}
SETTINGS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "amp-bf16": {"precision": "amp-bf16"},
    "fp32+clip": {"clip_grad_norm": 1.0},
    "bf16-true": {"precision": "bf16-true"},
    "amp-fp16": {"precision": "amp-fp16"},
    "sgd": {"optimizer": "sgd"},
    "sgd-nomomentum": {"optimizer": "sgd-nomomentum"},
    "adam": {"optimizer": "adam"},
    "adafactor": {"optimizer": "adafactor"},
    "adam8bit": {"optimizer": "adam8bit"},  # torchao's: its step compiles (GPU only here)
    "paged-adam8bit": {"optimizer": "paged-adam8bit"},
}
#: left out of the CPU smoke run: fp16 is what the GradScaler checks, torchao's step
#: compiles for minutes on a CPU (its own tests cover it there)
SMOKE_SKIPS = ("amp-fp16", "adam8bit")


@contextlib.contextmanager
def counted_syncs(torch: Any) -> Iterator[Counter[str]]:
    """Every host-device sync inside the block, by 'file:line' of the code that made it."""
    where: Counter[str] = Counter()
    explicit = [
        (torch.cuda, "synchronize"),
        (torch.cuda.Event, "synchronize"),
        (torch.cuda.Stream, "synchronize"),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name in explicit]

    def counting(label: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            import sys

            frame = sys._getframe(1)
            where[f"{label} at {frame.f_code.co_filename}:{frame.f_lineno}"] += 1
            return original(*args, **kwargs)

        return wrapper

    for owner, name, original in originals:
        setattr(owner, name, counting(f"{getattr(owner, '__name__', owner)}.{name}", original))
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield where
            finally:
                torch.cuda.set_sync_debug_mode(0)
        for w in seen:
            if SYNC_WARNING in str(w.message):
                where[f"{w.filename}:{w.lineno}"] += 1
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def syncs_section(ctx: Any, check: Callable[..., bool]) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        from workbench import Session, TrainConfig
        from workbench.train import step as step_module

        torch = ctx.torch
        for setup, settings in SETTINGS.items():
            if ctx.smoke and setup in SMOKE_SKIPS:
                continue
            cfg = TrainConfig(
                micro_batch=8,
                lr=1e-3,
                seed=1,
                device=ctx.device,
                **settings,
            )
            with Session(cfg, model="mlp", model_options={"hidden": 256, "depth": 2}) as s:
                s.run(WARMUP_STEPS, progress=False)
                if ctx.smoke:
                    reads = [0]
                    real = step_module.read_device_values

                    def counted(*a: Any, _real: Any = real, _reads: list[int] = reads) -> Any:
                        _reads[0] += 1
                        return _real(*a)

                    step_module.read_device_values = counted  # type: ignore[assignment]
                    try:
                        s.run(STEPS, progress=False)
                    finally:
                        step_module.read_device_values = real  # type: ignore[assignment]
                    where: Counter[str] = Counter({"read_device_values": reads[0]})
                else:
                    with counted_syncs(torch) as where:
                        s.run(STEPS, progress=False)
                records = list(s.history)[-STEPS:]
                opt = s.backend.optimizer
                stepped = sum(1 for g in opt.param_groups for p in g["params"] if p.requires_grad)
                paged = bool(getattr(opt, "is_paged", False))
            per_step = sum(where.values()) / STEPS
            out[setup] = {
                "syncs_per_step": per_step,
                "by_place": dict(where.most_common()),
                "grad_norm_last": records[-1].grad_norm,
                # the typical step, for scale beside the sync counts (no rate is read from it)
                "step_seconds_median": statistics.median(r.step_seconds for r in records),
            }
            print(f"  {setup}: {per_step:g} syncs per step {dict(where.most_common(4))}")
            bound = BOUNDS[setup]
            if bound == PER_PARAMETER:
                expected = 1 if ctx.smoke else 1 + stepped + int(paged)
                out[setup]["bitsandbytes_syncs_expected"] = expected
                check(
                    "syncs",
                    f"{setup}: the step's read plus bitsandbytes' one per parameter "
                    f"({stepped} parameters{', paged' if paged else ''}): at most {expected}",
                    per_step <= expected,
                    where,
                )
            elif bound is not None:
                check("syncs", f"{setup}: at most {bound} sync per step", per_step <= bound, where)
            check(
                "syncs",
                f"{setup}: records carry loss, grad norm and step time",
                all(r.grad_norm is not None and r.step_seconds > 0 for r in records),
            )
        if "fp32" in out and "fp32+clip" in out:
            check(
                "syncs",
                "clipping adds no sync",
                out["fp32+clip"]["syncs_per_step"] <= out["fp32"]["syncs_per_step"],
                (out["fp32"]["syncs_per_step"], out["fp32+clip"]["syncs_per_step"]),
            )

    return run


def anchors_section(ctx: Any, check: Callable[..., bool]) -> Callable[[dict[str, Any]], None]:
    def run(out: dict[str, Any]) -> None:
        import anchors

        if ctx.smoke:  # the code paths, a few steps of the tiny MLP
            models = [anchors.Model("mlp-64", "mlp", MLP_64, 1, 2)]
        else:
            models = [
                anchors.Model("mlp-64", "mlp", MLP_64, 3, 50),
                anchors.Model("gpt-6x512", "tiny-gpt", GPU_GPT, 2, 5, micro_batch=16),
            ]
        trainers, missing = anchors.available()
        trainers = [t for t in trainers if t in GPU_CHECK_TRAINERS]
        for name, why in missing.items():
            if name in GPU_CHECK_TRAINERS:
                check("anchors", f"{name} installed", False, why)
        anchors._quiet()
        results = anchors.compare(models, trainers, reps=1 if ctx.smoke else 2, device=ctx.device)
        out["models"] = results
        out["table_markdown"] = anchors.table(results, trainers)
        print(out["table_markdown"])
        failures = results.get("_failures", {}).get("trainers", {})
        check("anchors", "every trainer ran", not failures, failures)
        gpt = results.get("gpt-6x512", {}).get("trainers", {}).get("session")
        if gpt and not ctx.smoke:
            check(
                "anchors",
                "session within 10% of the plain loop on a GPT that loads the GPU",
                gpt["ratio_to_plain"] <= 1.10,
                gpt["ratio_to_plain"],
            )

    return run
