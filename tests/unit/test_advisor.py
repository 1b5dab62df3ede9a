"""Advisor rules: each with records that should trigger it and records that should not."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

import workbench
from workbench.advisor import (
    MAX_CALIBRATION_SKIPS,
    MIN_LEAK_STEPS,
    MIN_OVERFLOW_SKIPS,
    MIN_PRECISION_STEPS,
    MIN_SPIKE_BASELINE,
    MIN_STEPS,
    SHORT_GROWTH_INTERVAL,
    Advice,
    advise,
)
from workbench.config import TrainConfig
from workbench.monitor import GpuSample, Sample
from workbench.train.records import StepRecord

MiB = 2**20


def rec(step: int, **kw: Any) -> StepRecord:
    base: dict[str, Any] = dict(
        step=step,
        micro_steps=1,
        loss=2.0,
        samples_per_s=100.0,
        tokens_per_s=None,
        step_seconds=0.1,
        data_seconds=0.001,
        compute_seconds=0.099,
        lr=3e-4,
        grad_norm=1.0,
        scale=None,
        skipped=False,
        precision="fp32",
        micro_batch=8,
        grad_accum=1,
        zero_stage=0,
    )
    base.update(kw)
    return StepRecord(**base)


def run(n: int, start: int = 1, **kw: Any) -> list[StepRecord]:
    return [rec(start + i, **kw) for i in range(n)]


def ids(advice: list[Advice]) -> list[str]:
    return [a.id for a in advice]


def one(advice: list[Advice], rule: str) -> Advice:
    found = [a for a in advice if a.id == rule]
    assert len(found) == 1, ids(advice)
    return found[0]


def gpu_sample(util: float, used: int = 10 * 2**30, total: int = 80 * 2**30) -> Sample:
    g = GpuSample(0, "GPU", util, used, total, None, None, None, None, None, None, None)
    return Sample(0.0, "nvml", (g,), 10.0, 100.0, 1, 1, 2)


# ------------------------------------------------------------------ healthy run
def test_healthy_run_gets_no_advice() -> None:
    assert advise(run(100)) == []
    assert advise([]) == []


def test_exported_lazily_from_package() -> None:
    assert workbench.advise is advise


def test_accepts_dicts_and_any_order() -> None:
    records = [r.to_dict() for r in run(10)]
    records[3]["loss"] = math.nan
    a = one(advise(list(reversed(records))), "nonfinite-loss")
    assert a.evidence["steps"] == [4]


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(records="abc"), r"records='abc': must be a sequence"),
        (dict(records=[1]), r"records\[0\]\.step=None"),
        (
            dict(records=[{"step": 1, "loss": "high"}]),
            r"records\[0\]\.loss='high': must be a number",
        ),
        (dict(records=[{"step": 1.5}]), r"records\[0\]\.step=1.5: must be an integer"),
        (dict(records=[], device="tpu"), r"device='tpu': must be one of cpu, cuda"),
        (dict(records=[], config={"lr": 1}), r"config=\{'lr': 1\}: must be a TrainConfig"),
        (dict(records=[], model_dims={"hidden_size": 0}), r"model_dims\['hidden_size'\]=0"),
        (dict(records=[], model_dims=[768]), r"model_dims=\[768\]: must be a dict"),
        (dict(records=[], samples=[1]), r"samples\[0\]=1: must be a monitor Sample"),
    ],
)
def test_bad_input_names_field_value_and_allowed(kwargs: dict[str, Any], match: str) -> None:
    records = kwargs.pop("records")
    with pytest.raises(ValueError, match=match):
        advise(records, **kwargs)


# ------------------------------------------------------------------ non-finite loss
def test_nan_loss_in_fp16_suggests_bf16() -> None:
    records = run(20, precision="amp-fp16", scale=1024.0)
    records.append(rec(21, loss=math.inf, precision="amp-fp16", scale=1024.0))
    a = one(advise(records), "nonfinite-loss")
    assert a.severity == "critical"
    assert a.apply == {"precision": "amp-bf16"}
    assert "step 21" in a.message
    assert a.evidence["steps"] == [21]


def test_nan_loss_in_fp32_halves_lr_and_clips() -> None:
    records = run(10) + [rec(11, loss=math.nan)]
    cfg = TrainConfig(lr=1e-3)
    a = one(advise(records, config=cfg), "nonfinite-loss")
    assert a.apply == {"lr": 5e-4, "clip_grad_norm": 1.0}
    cfg = TrainConfig(lr=1e-3, clip_grad_norm=0.5)
    assert one(advise(records, config=cfg), "nonfinite-loss").apply == {"lr": 5e-4}


def test_a_nan_before_the_fix_was_applied_does_not_fire_again() -> None:
    records = run(10) + [rec(11, loss=math.nan)]
    cfg = TrainConfig(lr=1e-3)
    fix = one(advise(records, config=cfg), "nonfinite-loss").apply
    assert fix is not None
    after = [rec(12, changes=dict(fix))] + run(5, start=13)  # applied, resumed: finite
    assert "nonfinite-loss" not in ids(advise(records + after, config=cfg.replace(**fix)))
    again = records + after + [rec(18, loss=math.nan)]  # the fix did not hold: said again
    a = one(advise(again, config=cfg.replace(**fix)), "nonfinite-loss")
    assert a.evidence["steps"] == [18] and "of the last 7 steps" in a.message


def test_finite_losses_or_old_nan_do_not_fire() -> None:
    assert "nonfinite-loss" not in ids(advise(run(30, loss=1e30)))
    records = [rec(1, loss=math.nan)] + run(60, start=2)  # outside the recent window
    assert "nonfinite-loss" not in ids(advise(records))


# ------------------------------------------------------------------ loss scale
def _scaled(n: int, start: int = 1, scale: float = 1024.0, **kw: Any) -> list[StepRecord]:
    return run(n, start=start, precision="amp-fp16", scale=scale, **kw)


def test_repeated_overflow_after_calibration_fires() -> None:
    records = _scaled(12)
    for i, step in enumerate(range(13, 13 + MIN_OVERFLOW_SKIPS)):
        records += [rec(step, precision="amp-fp16", scale=512.0 / 2**i, skipped=True)]
    a = one(advise(records), "loss-scale-collapse")
    assert a.severity == "warning"
    assert a.apply == {"precision": "amp-bf16"}
    assert a.evidence["skipped_steps"] == [13, 14, 15]
    # after calibration the scale no longer depends on loss_scale_init: the gradients grow
    assert "lower lr" in a.message
    assert "loss_scale_init" not in a.message


def _regrowing(interval: int, n: int = 12 + 50) -> list[StepRecord]:
    """A scaler with growth interval `interval` at its ceiling: every growth overflows."""
    records, scale, step = _scaled(12, scale=1024.0), 1024.0, 13
    while len(records) < n:
        records += [rec(step, precision="amp-fp16", scale=scale / 2, skipped=True)]
        records += _scaled(interval, start=step + 1, scale=scale / 2)
        step += interval + 1
    return records


@pytest.mark.parametrize("interval", [1, 2, SHORT_GROWTH_INTERVAL])
def test_a_short_growth_interval_is_named_and_restored(interval: int) -> None:
    records = _regrowing(interval)
    cfg = TrainConfig(precision="amp-fp16", loss_scale_interval=interval)
    a = one(advise(records, config=cfg), "loss-scale-collapse")
    default = TrainConfig().loss_scale_interval
    assert a.apply == {"loss_scale_interval": default}
    assert f"loss_scale_interval={interval} grows the scale again" in a.message
    assert f"Set loss_scale_interval={default}" in a.message
    assert "amp-bf16" in a.message  # the other way out, where the GPU has bf16
    assert "loss_scale_init" not in a.message and "lower lr" not in a.message
    assert a.evidence["loss_scale_interval"] == interval


def test_a_default_growth_interval_is_not_blamed() -> None:
    records = _regrowing(1)  # the same overflows, with an interval that cannot cause them
    cfg = TrainConfig(precision="amp-fp16", loss_scale_interval=SHORT_GROWTH_INTERVAL + 1)
    a = one(advise(records, config=cfg), "loss-scale-collapse")
    assert a.apply == {"precision": "amp-bf16"}
    assert "lower lr" in a.message and "loss_scale_interval" not in a.message


def test_nan_loss_in_fp16_is_told_apart_from_skipped_steps() -> None:
    # a non-finite loss is a forward overflow: the loss scale does not enter the forward pass
    records = run(20, precision="amp-fp16", scale=1024.0)
    records.append(rec(21, loss=math.nan, precision="amp-fp16", scale=1024.0))
    a = one(advise(records), "nonfinite-loss")
    assert "forward pass" in a.message
    assert "loss_scale_init does not change it" in a.message
    assert "lower loss_scale_init" not in a.message
    assert "loss-scale-collapse" not in ids(advise(records))


def test_deepspeed_fp16_overflow_suggests_deepspeed_bf16() -> None:
    records = run(12, precision="fp16", scale=2.0**10) + [
        rec(13 + i, precision="fp16", scale=0.5, skipped=True) for i in range(3)
    ]
    a = one(advise(records), "loss-scale-collapse")
    assert a.apply == {"precision": "bf16"}
    assert a.severity == "critical"  # scale under 1


def test_initial_calibration_skips_do_not_fire() -> None:
    # GradScaler starts at 65536 and skips while it halves down: normal, not a problem
    calib = [rec(i + 1, precision="amp-fp16", scale=65536.0 / 2**i, skipped=True) for i in range(6)]
    records = calib + _scaled(30, start=7)
    assert "loss-scale-collapse" not in ids(advise(records))


def test_a_run_that_never_steps_fires_past_calibration() -> None:
    # loss_scale_init=2**100: every step overflows; that is not calibration any more
    records = [
        rec(i + 1, precision="amp-fp16", scale=2.0 ** (100 - i), skipped=True) for i in range(40)
    ]
    a = one(advise(records), "loss-scale-collapse")
    assert a.evidence["calibration_steps"] == MAX_CALIBRATION_SKIPS
    assert len(a.evidence["skipped_steps"]) == 40 - MAX_CALIBRATION_SKIPS
    assert "loss_scale_init=65536" in a.message  # not the astronomic scale it is stuck at
    assert a.apply == {"loss_scale_init": 65536.0}  # the cause's fix, not a precision switch
    # the same number of leading skips that stop within the cap stay quiet
    calib = [
        rec(i + 1, precision="amp-fp16", scale=2.0 ** (24 - i), skipped=True) for i in range(24)
    ]
    assert "loss-scale-collapse" not in ids(advise(calib + _scaled(16, start=25)))


def test_a_run_that_settles_past_calibration_starts_where_it_settled() -> None:
    """loss_scale_init=2**50: 33 skips down to 2**17, then it trains. Past the 24 skips
    calibration explains, the advice names the scale it settled at and applies it."""
    records = [
        rec(i + 1, precision="amp-fp16", scale=2.0 ** (49 - i), skipped=True) for i in range(33)
    ] + _scaled(7, start=34, scale=2.0**17)
    a = one(advise(records, config=TrainConfig(precision="amp-fp16")), "loss-scale-collapse")
    assert a.apply == {"loss_scale_init": 2.0**17}
    assert f"more than {MAX_CALIBRATION_SKIPS} skips from the start" in a.message
    assert "Set loss_scale_init=131072" in a.message
    TrainConfig(precision="amp-fp16").replace(**a.apply)  # a change the config takes


def test_too_few_overflows_or_steps_do_not_fire() -> None:
    few = _scaled(20) + [rec(21, precision="amp-fp16", scale=512.0, skipped=True)]
    few += [rec(22, precision="amp-fp16", scale=256.0, skipped=True)]
    assert "loss-scale-collapse" not in ids(advise(few))
    short = _scaled(2) + [
        rec(3 + i, precision="amp-fp16", scale=8.0, skipped=True) for i in range(4)
    ]
    assert "loss-scale-collapse" not in ids(advise(short))  # under MIN_SCALED_STEPS


# ------------------------------------------------------------------ data-loader stall
def test_data_stall_fires_with_num_workers_and_pin_memory() -> None:
    records = run(10, step_seconds=0.1, data_seconds=0.05, num_workers=0)
    a = one(advise(records, device="cuda", config=TrainConfig()), "data-loader-stall")
    assert a.apply == {"num_workers": min(os.cpu_count() or 1, 2), "pin_memory": True}
    assert a.evidence["data_fraction"] == pytest.approx(0.5)
    assert "50%" in a.message


def test_data_stall_on_cpu_does_not_ask_for_pinned_memory() -> None:
    records = run(10, step_seconds=0.1, data_seconds=0.05, num_workers=1)
    a = one(advise(records, device="cpu"), "data-loader-stall")
    cpus = os.cpu_count() or 1
    if cpus > 1:
        assert a.apply == {"num_workers": min(cpus, 2)}
    else:
        assert a.apply is None and "num_workers=1 with 1 CPU cores" in a.message


def test_slow_first_step_and_fast_loader_do_not_fire() -> None:
    # only the first step waits (workers starting), the rest fetch in 10% of the step
    records = [rec(1, step_seconds=1.0, data_seconds=0.9)] + run(
        10, start=2, step_seconds=0.1, data_seconds=0.01
    )
    assert "data-loader-stall" not in ids(advise(records))
    # stalls, but too few steps to say
    few = run(MIN_STEPS, step_seconds=0.1, data_seconds=0.05)  # first is dropped
    assert "data-loader-stall" not in ids(advise(few))


# ------------------------------------------------------------------ low GPU util
def test_low_gpu_util_with_small_batch_keeps_effective_batch() -> None:
    records = run(10, micro_batch=4, grad_accum=4)
    samples = [gpu_sample(20.0) for _ in range(10)]
    a = one(advise(records, samples=samples, device="cuda"), "low-gpu-util")
    assert a.apply == {"micro_batch": 8, "grad_accum": 2}
    assert a.evidence["gpu_util_percent_median"] == 20.0


def test_low_gpu_util_from_records_and_full_memory() -> None:
    records = run(10, micro_batch=4, grad_accum=1, gpu_util_percent=30.0)
    full = [gpu_sample(float("nan"), used=79 * 2**30) for _ in range(10)]  # util unknown
    a = one(advise(records, samples=full, device="cuda"), "low-gpu-util")
    assert a.apply == {"micro_batch": 8, "activation_checkpointing": True}
    assert "step records" in a.message


def test_busy_gpu_big_batch_few_readings_or_stall_do_not_fire() -> None:
    busy = [gpu_sample(95.0) for _ in range(10)]
    idle = [gpu_sample(10.0) for _ in range(10)]
    assert "low-gpu-util" not in ids(advise(run(10, micro_batch=4), samples=busy))
    assert "low-gpu-util" not in ids(advise(run(10, micro_batch=256), samples=idle))
    assert "low-gpu-util" not in ids(advise(run(10), samples=idle[: MIN_STEPS - 1]))
    stalled = run(10, micro_batch=4, step_seconds=0.1, data_seconds=0.08)
    out = ids(advise(stalled, samples=idle, device="cuda"))
    assert "data-loader-stall" in out and "low-gpu-util" not in out


def test_low_gpu_util_reads_the_gpu_the_session_trains_on() -> None:
    """Two GPUs: an idle one listed first, the busy training GPU second (by UUID)."""
    idle = GpuSample(0, "GPU", 5.0, 1, 80, None, None, None, None, None, None, None, uuid="GPU-a")
    busy = GpuSample(1, "GPU", 97.0, 1, 80, None, None, None, None, None, None, None, uuid="GPU-b")
    samples = [Sample(0.0, "nvml", (idle, busy), 10.0, 100.0, 1, 1, 2) for _ in range(10)]
    records = run(10, micro_batch=4)
    assert "low-gpu-util" in ids(advise(records, samples=samples, device="cuda"))
    assert "low-gpu-util" not in ids(
        advise(records, samples=samples, device="cuda", gpu_uuid="GPU-b")
    )
    with pytest.raises(ValueError, match="gpu_uuid=3: must be an NVML UUID"):
        advise(records, gpu_uuid=3)  # type: ignore[arg-type]


# ------------------------------------------------------------------ memory growth
def test_steady_rss_growth_at_fixed_config_fires() -> None:
    records = [rec(i, rss_bytes=500 * MiB + i * MiB) for i in range(1, 41)]
    a = one(advise(records), "memory-growth")
    assert a.evidence["metric"] == "rss_bytes"
    assert a.evidence["bytes_per_step"] == pytest.approx(MiB)
    assert a.apply is None
    assert "1024 KiB per step" in a.message


def test_cuda_allocated_growth_fires() -> None:
    records = [rec(i, cuda_allocated_bytes=100 * MiB + i * 256 * 1024) for i in range(1, 41)]
    a = one(advise(records), "memory-growth")
    assert a.evidence["metric"] == "cuda_allocated_bytes"


def test_noise_one_jump_changes_or_short_runs_do_not_fire() -> None:
    noisy = [rec(i, rss_bytes=500 * MiB + (3 * MiB if i % 2 else 0)) for i in range(1, 41)]
    assert "memory-growth" not in ids(advise(noisy))
    jump = [rec(i, rss_bytes=500 * MiB + (50 * MiB if i > 20 else 0)) for i in range(1, 41)]
    assert "memory-growth" not in ids(advise(jump))
    # growth comes from setting changes (micro_batch raised at each step of 10)
    changed = [
        rec(
            i,
            rss_bytes=500 * MiB + i * MiB,
            changes={"micro_batch": 8 + i} if i % 10 == 0 else {},
        )
        for i in range(1, 41)
    ]
    assert "memory-growth" not in ids(advise(changed))
    short = [rec(i, rss_bytes=500 * MiB + i * MiB) for i in range(1, MIN_LEAK_STEPS)]
    assert "memory-growth" not in ids(advise(short))


# ------------------------------------------------------------------ alignment
def test_misaligned_dims_in_16_bit_on_gpu_fire() -> None:
    dims = {"hidden_size": 1000, "vocab_size": 50257, "heads": 16}
    a = one(
        advise(run(3, precision="amp-bf16"), device="cuda", model_dims=dims),
        "tensor-core-alignment",
    )
    assert a.evidence["misaligned"] == {"vocab_size": 50257}  # 1000 = 8 * 125
    assert "vocab_size=50257 -> 50264" in a.message


def test_alignment_quiet_in_fp32_on_cpu_or_aligned() -> None:
    dims = {"hidden_size": 1001}
    assert advise(run(3), device="cuda", model_dims=dims) == []
    assert advise(run(3, precision="amp-bf16"), device="cpu", model_dims=dims) == []
    assert advise(run(3, precision="amp-bf16"), device="cuda", model_dims={"h": 1024}) == []


# ------------------------------------------------------------------ lr scaling
def test_batch_change_without_lr_change_suggests_scaled_lr() -> None:
    records = run(5, micro_batch=8, lr=1e-3) + run(5, start=6, micro_batch=32, lr=1e-3)
    records[5] = rec(6, micro_batch=32, lr=1e-3, changes={"micro_batch": 32})
    a = one(advise(records, config=TrainConfig(lr=1e-3, micro_batch=32)), "lr-not-scaled")
    assert a.evidence["lr_linear"] == pytest.approx(4e-3)
    assert a.evidence["lr_sqrt"] == pytest.approx(2e-3)
    assert a.apply == {"lr": pytest.approx(2e-3)}  # adamw: square-root rule
    sgd = TrainConfig(lr=1e-3, micro_batch=32, optimizer="sgd")
    assert one(advise(records, config=sgd), "lr-not-scaled").apply == {"lr": pytest.approx(4e-3)}


def test_lr_scaled_or_set_or_auto_scaling_do_not_fire() -> None:
    scaled = run(5, micro_batch=8, lr=1e-3) + run(5, start=6, micro_batch=32, lr=4e-3)
    assert "lr-not-scaled" not in ids(advise(scaled))
    by_hand = run(5, micro_batch=8) + run(5, start=6, micro_batch=32)
    by_hand[7] = rec(8, micro_batch=32, changes={"lr": 3e-4})
    assert "lr-not-scaled" not in ids(advise(by_hand))
    unscaled = run(5, micro_batch=8) + run(5, start=6, micro_batch=32)
    auto = TrainConfig(micro_batch=32, lr_scaling="linear")
    assert "lr-not-scaled" not in ids(advise(unscaled, config=auto))
    assert "lr-not-scaled" not in ids(advise(run(10)))  # batch never changed


# ------------------------------------------------------------------ precision speed
def test_bf16_slower_than_fp32_on_cpu_says_so_with_numbers() -> None:
    n = MIN_PRECISION_STEPS + 1
    records = run(n, samples_per_s=120.0) + run(
        n, start=n + 1, precision="amp-bf16", samples_per_s=40.0
    )
    a = one(advise(records, device="cpu"), "precision-slower")
    assert a.apply == {"precision": "fp32"}
    assert a.evidence["samples_per_s"] == pytest.approx({"fp32": 120.0, "amp-bf16": 40.0})
    assert "120.0 samples/s" in a.message and "40.0 samples/s" in a.message
    assert "0.33x" in a.message


def test_precision_faster_or_unmeasured_do_not_fire() -> None:
    n = MIN_PRECISION_STEPS + 1
    faster = run(n, samples_per_s=100.0) + run(
        n, start=n + 1, precision="amp-bf16", samples_per_s=180.0
    )
    assert "precision-slower" not in ids(advise(faster))
    within_noise = run(n, samples_per_s=100.0) + run(
        n, start=n + 1, precision="amp-bf16", samples_per_s=97.0
    )
    assert "precision-slower" not in ids(advise(within_noise))
    few = run(n, samples_per_s=120.0) + run(
        MIN_PRECISION_STEPS, start=n + 1, precision="amp-bf16", samples_per_s=40.0
    )  # the first bf16 step is dropped: too few left
    assert "precision-slower" not in ids(advise(few))
    other_batch = run(n, samples_per_s=120.0, micro_batch=64) + run(
        n, start=n + 1, precision="amp-bf16", samples_per_s=40.0
    )  # not comparable: different micro_batch
    assert "precision-slower" not in ids(advise(other_batch))


# ------------------------------------------------------------------ grad-norm spikes
def test_grad_norm_spike_suggests_clipping() -> None:
    records = run(MIN_SPIKE_BASELINE + 10, grad_norm=0.5)
    records[15] = rec(16, grad_norm=10.0)
    a = one(advise(records), "grad-norm-spike")
    assert a.apply == {"clip_grad_norm": 1.0}
    assert a.evidence["spikes"] == [{"step": 16, "grad_norm": 10.0, "median_before": 0.5}]


def test_a_diverging_run_gets_one_clip_value_from_the_most_severe_advice() -> None:
    """Notebook 06's diverging run: the NaN loss (critical) asks for clipping at 1.0 and the
    spikes before it (a warning) would ask for twice their median, 15; applying every piece
    of advice must not undo the critical fix, so the warning names it instead."""
    records = run(MIN_SPIKE_BASELINE + 5, grad_norm=7.5)
    records += [rec(len(records) + 1, grad_norm=1e6)]
    records += [rec(len(records) + 1, loss=math.nan)]
    advice = advise(records, config=TrainConfig(lr=1.0))
    critical = one(advice, "nonfinite-loss")
    spike = one(advice, "grad-norm-spike")
    assert critical.apply == {"lr": 0.5, "clip_grad_norm": 1.0}
    assert spike.apply is None
    assert "[critical] nonfinite-loss advice above sets clip_grad_norm=1.0" in spike.message
    assert "clip at 15" in spike.message  # its own finding is still said
    merged: dict[str, Any] = {}
    for a in advice:
        merged.update(a.apply or {})
    assert merged["clip_grad_norm"] == 1.0


def test_no_spike_early_spike_clipped_or_skipped_do_not_fire() -> None:
    steady = run(30, grad_norm=0.5)
    assert "grad-norm-spike" not in ids(advise(steady))
    early = run(30, grad_norm=0.5)
    early[MIN_SPIKE_BASELINE - 1] = rec(MIN_SPIKE_BASELINE, grad_norm=10.0)  # no baseline yet
    assert "grad-norm-spike" not in ids(advise(early))
    spiky = run(30, grad_norm=0.5)
    spiky[20] = rec(21, grad_norm=10.0)
    assert "grad-norm-spike" not in ids(advise(spiky, config=TrainConfig(clip_grad_norm=1.0)))
    assert "grad-norm-spike" in ids(advise(spiky, config=TrainConfig(clip_grad_norm=100.0)))
    overflow = run(30, grad_norm=0.5)
    overflow[20] = rec(21, grad_norm=1e6, skipped=True)
    assert "grad-norm-spike" not in ids(advise(overflow))


# ------------------------------------------------------------------ ordering
def test_most_severe_first() -> None:
    records = run(30, step_seconds=0.1, data_seconds=0.05, grad_norm=0.5)
    records[20] = rec(21, grad_norm=10.0, step_seconds=0.1, data_seconds=0.05)
    records.append(rec(31, loss=math.nan, step_seconds=0.1, data_seconds=0.05))
    out = advise(records, device="cpu")
    assert out[0].id == "nonfinite-loss"
    assert {"data-loader-stall", "grad-norm-spike"} <= set(ids(out))
    order = {"critical": 0, "warning": 1, "info": 2}
    assert [order[a.severity] for a in out] == sorted(order[a.severity] for a in out)


def test_multi_rank_records_use_one_rank() -> None:
    records = run(10, rank=0) + run(10, rank=1, loss=math.nan)
    assert advise(records) == []
