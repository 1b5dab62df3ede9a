"""Advisor: plain rules that turn step records and hardware samples into advice.

    advise(session.records(), samples=sampler.history(), config=cfg, device="cuda")

Each rule looks at measured values only, needs a stated minimum of evidence before it
fires, and returns an `Advice` whose `apply` (when not None) is a settings change a
panel can hand to `session.update(**advice.apply)` (TrainConfig field names).

Rules and their minimum evidence (records counted after the warm-up ones are dropped):

=====================  ==============================================================
id                     fires when
=====================  ==============================================================
nonfinite-loss         a non-finite loss in the last RECENT_STEPS steps (1 is enough)
loss-scale-collapse    >= MIN_OVERFLOW_SKIPS skipped steps after the scaler's initial
                       calibration (at most MAX_CALIBRATION_SKIPS leading skips) in the
                       last RECENT_STEPS, or the scale fell below 1; the advice names the
                       cause: a loss_scale_interval <= SHORT_GROWTH_INTERVAL, a
                       loss_scale_init the calibration could not come down from, or
                       gradients that keep growing
data-loader-stall      the data wait > 20% of the time (all data_seconds over all
                       step_seconds: `workbench.rates`) over the last RECENT_STEPS
                       steps since the settings last changed (>= MIN_STEPS steps; the
                       first step and a change's step, which pay for new workers, dropped).
                       More workers past one a core only where the host CPU (a Sampler's
                       readings) is under CPU_SATURATED_PERCENT busy
low-gpu-util           median GPU utilization < 50% over >= MIN_STEPS readings with
                       micro_batch <= SMALL_MICRO_BATCH (skipped while the loader stalls)
memory-growth          rss_bytes or cuda_allocated_bytes rises steadily over
                       >= MIN_LEAK_STEPS steps with no settings change in between
tensor-core-alignment  16-bit precision on a GPU and a model dimension not divisible by 8
lr-not-scaled          the effective batch changed, lr did not, lr_scaling is "none"
                       (>= 1 step before and the step of the change)
precision-slower       the current precision ran > 5% slower (all samples over all
                       seconds) than another precision measured at the same batch
                       settings (>= MIN_PRECISION_STEPS each)
grad-norm-spike        a grad_norm > 5x the median of the >= MIN_SPIKE_BASELINE steps
                       before it, in the last RECENT_STEPS, without effective clipping
=====================  ==============================================================

Past 600 lines because each rule is one function with its evidence and message; they share
the context and the thresholds above.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from workbench.advisor.readings import (
    Reading,
    Rec,
    read_model_dims,
    read_records,
    read_samples,
)
from workbench.config import LRScaling, OptimizerName, Precision, TrainConfig
from workbench.inputs import shown
from workbench.rates import throughput

Severity = Literal["info", "warning", "critical"]
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

RECENT_STEPS = 50  # rules look at this many newest records
MIN_STEPS = 5
MIN_OVERFLOW_SKIPS = 3
MIN_SCALED_STEPS = 10
# a scaler at its ceiling that grows again after this many clean steps or fewer overflows
# (once per interval + 1 steps) MIN_OVERFLOW_SKIPS times within RECENT_STEPS by itself:
# then the interval is the fault
SHORT_GROWTH_INTERVAL = RECENT_STEPS // MIN_OVERFLOW_SKIPS - 1
# a scaler halving from 2**24 reaches 1 in 24 skipped steps (the defaults start at 2**16);
# leading skips beyond this are overflows, not calibration
MAX_CALIBRATION_SKIPS = 24
MIN_LEAK_STEPS = 20
LEAK_WARMUP_STEPS = 3  # allocator caches and optimizer state appear in the first steps
MIN_PRECISION_STEPS = 3
MIN_SPIKE_BASELINE = 10
SPIKE_FACTOR = 5.0
STALL_FRACTION = 0.20
# a host this busy (percent of all cores) while the loop waits has no room for more loader
# workers; below it, more workers overlap the waits (or use the idle cores)
CPU_SATURATED_PERCENT = 85.0
MAX_WORKERS = 1024  # TrainConfig's limit
LOW_GPU_UTIL_PERCENT = 50.0
SMALL_MICRO_BATCH = 32
SLOWER_MARGIN = 0.05
LEAK_MIN_RSS_BYTES = 8 * 2**20
LEAK_MIN_CUDA_BYTES = 2**20
LEAK_MIN_FRACTION = 0.02
_SIXTEEN_BIT = {p.value for p in Precision if p is not Precision.FP32}
_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Advice:
    """One piece of advice. `apply` is a TrainConfig change for `session.update(**apply)`."""

    id: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    apply: dict[str, Any] | None = None


# --------------------------------------------------------------------------- helpers
def _finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _sig(x: float, digits: int = 2) -> float:
    """`x` rounded to `digits` significant figures."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class _Ctx:
    recs: list[Rec]
    recent: list[Rec]
    readings: list[Reading]  # the monitor's samples
    config: TrainConfig | None
    device: str | None
    dims: dict[str, int]

    @property
    def latest(self) -> Rec | None:
        return self.recs[-1] if self.recs else None

    def setting(self, name: str) -> Any:
        """Current value of a setting: the config's, else the newest record's."""
        if self.config is not None:
            value = getattr(self.config, name)
            return value.value if hasattr(value, "value") else value
        return getattr(self.latest, name, None) if self.latest is not None else None


# --------------------------------------------------------------------------- rules
def _since_change(c: _Ctx) -> list[Rec]:
    """The recent steps from the newest one that changed a setting on: the steps before it
    measured other settings (a fix applied from this advice among them)."""
    start = 0
    for i, r in enumerate(c.recent):
        if r.changes:
            start = i
    return c.recent[start:]


def _rule_nonfinite_loss(c: _Ctx) -> list[Advice]:
    window = _since_change(c)
    bad = [r for r in window if r.loss is not None and not math.isfinite(r.loss)]
    if not bad:
        return []
    precision = c.setting("precision")
    lr = c.setting("lr")
    steps = [r.step for r in bad]
    apply: dict[str, Any]
    if precision in (Precision.AMP_FP16.value, Precision.FP16.value):
        target = "amp-bf16" if precision == Precision.AMP_FP16.value else "bf16"
        apply = {"precision": target}
        what = (
            "a non-finite loss comes from the forward pass (an fp16 value above 65504, or "
            "weights or data already not finite), before the loss scale is applied: the "
            "scaler cannot skip it and loss_scale_init does not change it (a gradient "
            "overflow in the backward pass is a skipped step instead, which the scaler "
            f"handles). {target} has the fp32 exponent range; on a GPU without bf16 "
            "(before Ampere), lower lr or keep the overflowing layers in fp32"
        )
    else:
        apply = {}
        what = "the run is diverging"
        if isinstance(lr, (int, float)):
            apply["lr"] = _sig(lr / 2, 3)
            what += f"; halve lr ({lr:g} -> {apply['lr']:g})"
        if c.setting("clip_grad_norm") is None:
            apply["clip_grad_norm"] = 1.0
            what += " and clip gradients at 1.0"
    return [
        Advice(
            id="nonfinite-loss",
            severity="critical",
            message=(
                f"Loss was not finite at {len(bad)} of the last {len(window)} steps "
                f"(first at step {steps[0]}, value {bad[0].loss}) with precision "
                f"{precision}: {what}."
            ),
            evidence={"steps": steps, "losses": [r.loss for r in bad], "precision": precision},
            apply=apply or None,
        )
    ]


def _rule_loss_scale(c: _Ctx) -> list[Advice]:
    scaled = [r for r in c.recs if r.scale is not None]
    if len(scaled) < MIN_SCALED_STEPS:
        return []
    # skipped steps from the very start are the scaler calibrating down from its init value
    calib = 0
    while calib < min(len(scaled), MAX_CALIBRATION_SKIPS) and scaled[calib].skipped:
        calib += 1
    window = scaled[calib:][-RECENT_STEPS:]
    if not window:
        return []
    skips = [r.step for r in window if r.skipped]
    last_scale = window[-1].scale
    assert last_scale is not None
    collapsed = last_scale < 1.0
    if len(skips) < MIN_OVERFLOW_SKIPS and not collapsed:
        return []
    precision = c.setting("precision")
    target = "bf16" if precision == Precision.FP16.value else "amp-bf16"
    apply: dict[str, Any] = {"precision": target}
    bf16 = f"switch to {target} (no loss scaling needed) if the GPU supports bf16"
    interval = c.setting("loss_scale_interval")
    if isinstance(interval, int) and interval <= SHORT_GROWTH_INTERVAL:
        # the scaler itself regrows the scale into overflow: only a longer interval fixes it
        default = TrainConfig().loss_scale_interval
        apply = {"loss_scale_interval": default}
        cause = (
            f"loss_scale_interval={interval} grows the scale again after every {interval} "
            f"clean step(s), so it overflows again each time. Set loss_scale_interval="
            f"{default} (torch's default), or {bf16}."
        )
    elif calib == MAX_CALIBRATION_SKIPS:
        # the calibration never ended: loss_scale_init far too high. A loss_scale_init at or
        # below the scale the run settled at avoids the calibration skips (a run that never
        # stepped has settled nowhere: the default 2**16 is the place to start)
        stepped = any(not r.skipped for r in scaled)
        settled_at = last_scale if stepped else min(last_scale, 2.0**16)
        settled = max(1.0, 2.0 ** math.floor(math.log2(max(settled_at, 1.0))))
        apply = {"loss_scale_init": settled}  # the cause's own fix, as for the interval
        cause = (
            f"more than {MAX_CALIBRATION_SKIPS} skips from the start: loss_scale_init is far "
            f"too high. Set loss_scale_init={settled:g}, or {bf16}."
        )
    else:
        cause = (
            "each overflow halves the scale, so overflows that keep coming after it came down "
            f"mean the gradients themselves keep growing: lower lr, or {bf16}."
        )
    return [
        Advice(
            id="loss-scale-collapse",
            severity="critical" if collapsed else "warning",
            message=(
                f"The fp16 loss scaler overflowed at {len(skips)} of the last {len(window)} "
                f"steps after calibration (scale now {last_scale:g}); every skipped step is "
                f"lost work: {cause}"
            ),
            evidence={
                "skipped_steps": skips,
                "scale_first": window[0].scale,
                "scale_last": last_scale,
                "calibration_steps": calib,
                "loss_scale_interval": interval,
            },
            apply=apply,
        )
    ]


def _stall_window(c: _Ctx) -> list[Rec]:
    """The newest RECENT_STEPS steps since the settings last changed: the step of a change
    (new loader workers, a rebuilt engine) and the first step (starting the workers) pay
    one-off costs, and the steps before a change measured other settings."""
    start = 1
    for i, r in enumerate(c.recs):
        if r.changes or r.warmup:
            start = max(start, i + 1)
    return [
        r
        for r in c.recs[start:][-RECENT_STEPS:]
        if r.data_seconds is not None and r.step_seconds is not None
    ]


def _rule_data_stall(c: _Ctx) -> list[Advice]:
    recs = _stall_window(c)
    if len(recs) < MIN_STEPS:
        return []
    # ratios of sums: workers hand over batches in bursts, so a median step (of the waits,
    # the steps or their ratios) is one of the fast ones (`workbench.rates`)
    t = throughput(recs)
    share = t.data_share
    if share is None or share <= STALL_FRACTION:
        return []
    workers = c.setting("num_workers")
    workers = workers if isinstance(workers, int) else 0
    apply: dict[str, Any] = {}
    fix = ""
    if c.device == "cuda" and c.setting("pin_memory") is False:
        apply["pin_memory"] = True
        fix += " and pin host memory for faster copies to the GPU"
    rate = t.samples_per_s or 0.0
    busy = _cpu_busy_percent(c, recs)
    return [
        Advice(
            id="data-loader-stall",
            severity="warning",
            message=(
                f"The loop waits for data {share:.0%} of the time over the last {t.steps} "
                f"steps ({t.data_seconds:.3g} s of {t.seconds:.3g} s; {rate:.1f} samples/s): "
                f"{_more_workers(workers, busy, apply)}{fix}."
            ),
            evidence={
                "data_seconds_total": t.data_seconds,
                "step_seconds_total": t.seconds,
                "data_fraction": share,
                "samples_per_s": rate,
                "num_workers": workers,
                "cpu_util_percent": busy,
                "cpus": os.cpu_count() or 1,
                "steps": t.steps,
            },
            apply=apply or None,
        )
    ]


def _cpu_busy_percent(c: _Ctx, recs: list[Rec]) -> float | None:
    """How busy the host's CPU was (percent of all cores) over the steps `recs`: the
    sampler's readings the records carry, each weighted by its step's time, else the
    samples taken within the steps' span; None without readings."""
    pairs = [
        (r.cpu_util_percent, r.step_seconds or 0.0)
        for r in recs
        if r.cpu_util_percent is not None and math.isfinite(r.cpu_util_percent)
    ]
    weight = sum(w for _, w in pairs)
    if pairs and weight > 0:
        return sum(u * w for u, w in pairs) / weight
    first, last = recs[0], recs[-1]
    if first.wall_time is None or last.wall_time is None:
        return None
    begin = first.wall_time - (first.step_seconds or 0.0)
    inside = _finite(
        g.cpu_util_percent
        for g in c.readings
        if g.time is not None and begin <= g.time <= last.wall_time
    )
    return sum(inside) / len(inside) if inside else None


def _more_workers(workers: int, busy: float | None, apply: dict[str, Any]) -> str:
    """What to do about the loader: more workers where the CPU has room for them (or, not
    knowing, up to one a core), else a cheaper pipeline; sets `apply["num_workers"]`."""
    cpus = os.cpu_count() or 1
    cheaper = "make the data pipeline cheaper (pre-tokenize, cache decoded samples)"
    if busy is not None and busy >= CPU_SATURATED_PERCENT:
        return (
            f"the CPU is {busy:.0f}% busy over its {cpus} cores, so more loader workers would "
            f"only share them: {cheaper}"
        )
    if busy is not None:  # the CPU has room: workers that wait (storage, network) overlap
        more = apply["num_workers"] = min(MAX_WORKERS, max(2, workers * 2))
        past = (
            f"; more workers than the {cpus} cores help here: with {workers} the CPU still "
            "has room, so the loader waits (on storage or the network) rather than computes"
            if more > cpus and workers >= cpus
            else ""
        )
        return (
            f"the CPU is {busy:.0f}% busy over its {cpus} cores, so it has room: raise "
            f"num_workers from {workers} to {more}{past}"
        )
    if workers < cpus:
        apply["num_workers"] = min(cpus, max(2, workers * 2))
        return f"raise num_workers from {workers} to {apply['num_workers']}"
    return (
        f"num_workers={workers} with {cpus} CPU cores: if the loader computes (decoding, "
        f"augmenting), more workers only share the cores, so {cheaper}; if it "
        f"waits on storage or the network, more workers than cores help (try num_workers="
        f"{min(MAX_WORKERS, workers * 2)}). A Sampler (Session(sampler=...), or advise("
        "samples=...)) tells the two apart by how busy the CPU is"
    )


def _rule_low_gpu_util(c: _Ctx, stalled: bool) -> list[Advice]:
    if stalled or c.device == "cpu":
        return []  # the loader is the cause; its advice comes first
    utils = _finite(g.util_percent for g in c.readings[-RECENT_STEPS:])
    source = "samples"
    if len(utils) < MIN_STEPS:
        utils = _finite(r.gpu_util_percent for r in c.recent)
        source = "step records"
    if len(utils) < MIN_STEPS:
        return []
    util = _median(utils)
    mb = c.setting("micro_batch")
    ga = c.setting("grad_accum")
    if util >= LOW_GPU_UTIL_PERCENT or not isinstance(mb, int) or mb > SMALL_MICRO_BATCH:
        return []
    ga = ga if isinstance(ga, int) else 1
    apply: dict[str, Any] = {"micro_batch": mb * 2}
    if ga >= 2 and ga % 2 == 0:
        apply["grad_accum"] = ga // 2
        how = (
            f"micro_batch {mb} -> {mb * 2} with grad_accum {ga} -> {ga // 2} keeps the "
            "effective batch (and the optimization) the same"
        )
    else:
        how = f"micro_batch {mb} -> {mb * 2} (this doubles the effective batch; rescale lr)"
    fractions = [
        g.memory_used_bytes / g.memory_total_bytes
        for g in c.readings[-RECENT_STEPS:]
        if g.memory_used_bytes is not None and g.memory_total_bytes
    ]
    mem_frac = _median(fractions) if fractions else None
    if mem_frac is not None and mem_frac > 0.85:
        apply["activation_checkpointing"] = True
        how += "; GPU memory is nearly full, so turn on activation checkpointing to make room"
    return [
        Advice(
            id="low-gpu-util",
            severity="warning",
            message=(
                f"The GPU is busy only {util:.0f}% of the time (median of {len(utils)} "
                f"{source}) at micro_batch={mb}: larger batches give it more work per launch; "
                f"{how}."
            ),
            evidence={
                "gpu_util_percent_median": util,
                "readings": len(utils),
                "micro_batch": mb,
                "grad_accum": ga,
                "gpu_memory_used_fraction": mem_frac,
            },
            apply=apply,
        )
    ]


def _third_medians(values: list[float]) -> tuple[float, float, float]:
    n = len(values)
    a, b = n // 3, 2 * n // 3
    return _median(values[:a]), _median(values[a:b]), _median(values[b:])


def _rule_memory_growth(c: _Ctx) -> list[Advice]:
    # the newest stretch of steps with no settings change
    start = 0
    for i, r in enumerate(c.recs):
        if r.changes:
            start = i
    segment = c.recs[start:][LEAK_WARMUP_STEPS:]
    out: list[Advice] = []
    metrics: list[tuple[str, Callable[[Rec], float | None], float]] = [
        ("cuda_allocated_bytes", lambda r: r.cuda_allocated_bytes, LEAK_MIN_CUDA_BYTES),
        ("rss_bytes", lambda r: r.rss_bytes, LEAK_MIN_RSS_BYTES),
    ]
    for name, get, floor in metrics:
        pts = [(r.step, v) for r in segment if (v := get(r)) is not None and math.isfinite(v)]
        if len(pts) < MIN_LEAK_STEPS:
            continue
        values = [v for _, v in pts]
        m1, m2, m3 = _third_medians(values)
        grew = m3 - m1
        if grew <= max(floor, LEAK_MIN_FRACTION * m1):
            continue
        # steady growth, not one jump: each half of the run adds a share of it
        if m2 - m1 < 0.25 * grew or m3 - m2 < 0.25 * grew:
            continue
        # rate between the middles of the first and last thirds, robust to single outliers
        s1, _, s3 = _third_medians([float(step) for step, _ in pts])
        span = s3 - s1
        per_step = grew / span if span > 0 else grew
        total = per_step * (pts[-1][0] - pts[0][0])
        out.append(
            Advice(
                id="memory-growth",
                severity="warning",
                message=(
                    f"{name} grew by about {_mib(total)} between steps {pts[0][0]} and "
                    f"{pts[-1][0]} (about {per_step / 1024:.0f} KiB per step) with no setting "
                    "changed: something keeps references across steps, e.g. a loss tensor "
                    "stored without .item(), a growing list of outputs, or a cache."
                ),
                evidence={
                    "metric": name,
                    "first_step": pts[0][0],
                    "last_step": pts[-1][0],
                    "median_first_third_bytes": m1,
                    "median_middle_third_bytes": m2,
                    "median_last_third_bytes": m3,
                    "bytes_per_step": per_step,
                },
                apply=None,
            )
        )
    return out


def _rule_alignment(c: _Ctx) -> list[Advice]:
    precision = c.setting("precision")
    if precision not in _SIXTEEN_BIT or c.device == "cpu" or not c.dims:
        return []
    bad = {k: v for k, v in c.dims.items() if v % 8}
    if not bad:
        return []
    pads = ", ".join(f"{k}={v} -> {math.ceil(v / 8) * 8}" for k, v in bad.items())
    return [
        Advice(
            id="tensor-core-alignment",
            severity="info",
            message=(
                f"With {precision}, Tensor Cores run matrix multiplies fastest when the sizes "
                f"are multiples of 8; pad {pads}."
            ),
            evidence={"precision": precision, "misaligned": bad},
            apply=None,
        )
    ]


def _rule_lr_scaling(c: _Ctx) -> list[Advice]:
    if c.config is not None and LRScaling(c.config.lr_scaling) is not LRScaling.NONE:
        return []
    change = None
    for i in range(len(c.recs) - 1, 0, -1):
        before, after = c.recs[i - 1], c.recs[i]
        if "lr" in after.changes:
            return []  # lr was set by hand after (or with) the last batch change
        eb0, eb1 = before.effective_batch, after.effective_batch
        if eb0 is not None and eb1 is not None and eb0 != eb1:
            change = (before, after)
            break
    if change is None:
        return []
    before, after = change
    if before.lr is None or after.lr is None or before.lr <= 0:
        return []
    if abs(after.lr / before.lr - 1) > 0.05:
        return []  # lr moved with the batch
    eb0, eb1 = before.effective_batch, after.effective_batch
    assert eb0 is not None and eb1 is not None
    base = float(c.config.lr) if c.config is not None else after.lr
    ratio = eb1 / eb0
    linear = _sig(base * ratio, 3)
    sqrt = _sig(base * math.sqrt(ratio), 3)
    optimizer = c.setting("optimizer")
    adam_like = optimizer in (OptimizerName.ADAM.value, OptimizerName.ADAMW.value)
    rule, new_lr = ("sqrt", sqrt) if adam_like else ("linear", linear)
    if adam_like:
        why = "the square-root rule suits Adam-type optimizers"
    elif optimizer is None:
        why = "optimizer not known: linear suits SGD, square-root suits Adam"
    else:
        why = "the linear rule suits SGD"

    return [
        Advice(
            id="lr-not-scaled",
            severity="info",
            message=(
                f"The effective batch changed from {eb0} to {eb1} at step {after.step} but lr "
                f"stayed {base:g}. Linear rule: lr={linear:g}; square-root rule: lr={sqrt:g} "
                f"({why}; or set lr_scaling to have it done automatically)."
            ),
            evidence={
                "step": after.step,
                "effective_batch_before": eb0,
                "effective_batch_after": eb1,
                "lr": base,
                "lr_linear": linear,
                "lr_sqrt": sqrt,
                "rule": rule,
            },
            apply={"lr": new_lr},
        )
    ]


def _rule_precision_speed(c: _Ctx) -> list[Advice]:
    latest = c.latest
    if latest is None or latest.precision is None:
        return []

    def key(r: Rec) -> tuple[Any, ...]:
        return (r.micro_batch, r.grad_accum, r.world_size, r.zero_stage, r.activation_checkpointing)

    # group by precision at the current batch settings; drop each stretch's first step
    # (it pays for the switch: new autocast kernels, a rebuilt engine). A precision's speed
    # is its samples over its seconds (`workbench.rates`), not a median step's
    speeds: dict[str, list[Rec]] = {}
    prev: Rec | None = None
    for r in c.recs:
        first_of_stretch = prev is None or prev.precision != r.precision or key(prev) != key(r)
        prev = r
        if first_of_stretch or r.changes or r.skipped or key(r) != key(latest):
            continue
        if r.precision is None or r.samples_per_s is None or not math.isfinite(r.samples_per_s):
            continue
        speeds.setdefault(r.precision, []).append(r)
    rates = {
        p: rate
        for p, v in speeds.items()
        if len(v) >= MIN_PRECISION_STEPS and (rate := throughput(v).samples_per_s) is not None
    }
    current = latest.precision
    if current not in rates or len(rates) < 2:
        return []
    best = max(rates, key=lambda p: rates[p])
    if best == current or rates[current] >= rates[best] * (1 - SLOWER_MARGIN):
        return []
    ratio = rates[current] / rates[best]
    where = f" on this device ({c.device})" if c.device else ""
    note = (
        " Most CPUs have no fast 16-bit matrix units, so autocast adds conversions "
        "without speeding up the math."
        if c.device == "cpu" and current in _SIXTEEN_BIT
        else ""
    )
    return [
        Advice(
            id="precision-slower",
            severity="warning",
            message=(
                f"Measured{where}: {current} runs at {rates[current]:.1f} samples/s, "
                f"{best} at {rates[best]:.1f} samples/s ({ratio:.2f}x); switch to {best}." + note
            ),
            evidence={
                "samples_per_s": rates,
                "steps": {p: len(speeds[p]) for p in rates},
                "current": current,
                "faster": best,
            },
            apply={"precision": best},
        )
    ]


def _rule_grad_spike(c: _Ctx) -> list[Advice]:
    norms = [
        (r.step, r.grad_norm)
        for r in c.recs
        if not r.skipped and r.grad_norm is not None and math.isfinite(r.grad_norm)
    ]
    recent_steps = {r.step for r in c.recent}
    spikes: list[tuple[int, float, float]] = []
    first_spike: int | None = None  # index in `norms` of the first spike in the history
    for i in range(MIN_SPIKE_BASELINE, len(norms)):
        step, g = norms[i]
        baseline = _median([n for _, n in norms[max(0, i - RECENT_STEPS) : i]])
        if baseline > 0 and g > SPIKE_FACTOR * baseline:
            first_spike = i if first_spike is None else first_spike
            if step in recent_steps:
                spikes.append((step, g, baseline))
    if not spikes or first_spike is None:
        return []
    # the typical norm is the run's before it first spiked: the spikes and a diverged
    # stretch after them (norms growing step by step, no longer spikes against their own
    # running median) would otherwise raise it, and the clip suggested from it
    typical = _median([n for _, n in norms[:first_spike]])
    clip = c.setting("clip_grad_norm")
    if isinstance(clip, (int, float)) and clip <= SPIKE_FACTOR * typical:
        return []  # clipping already caps these spikes
    suggest = _sig(2 * typical, 2)
    now = f"clip_grad_norm={clip:g} is above the spikes' level" if clip else "clipping is off"
    return [
        Advice(
            id="grad-norm-spike",
            severity="warning",
            message=(
                f"Gradient norm spiked {len(spikes)} time(s) in the last {len(c.recent)} steps "
                f"(largest {max(s[1] for s in spikes):.3g} vs a running median of "
                f"{spikes[0][2]:.3g}) and {now}: clip at {suggest:g} (about twice the "
                "median norm before the first spike) to keep single bad batches from derailing "
                "training."
            ),
            evidence={
                "spikes": [{"step": s, "grad_norm": g, "median_before": b} for s, g, b in spikes],
                "grad_norm_median": typical,
                "clip_grad_norm": clip,
            },
            apply={"clip_grad_norm": suggest},
        )
    ]


# --------------------------------------------------------------------------- entry
def advise(
    records: Sequence[Any],
    *,
    samples: Sequence[Any] | None = None,
    config: TrainConfig | None = None,
    device: str | None = None,
    model_dims: Mapping[str, int] | None = None,
    gpu_uuid: str | None = None,
) -> list[Advice]:
    """Advice for a run, most severe first.

    records: StepRecord objects (or dicts with their field names), any order.
    samples: monitor `Sample`s; the GPU read is the one with NVML UUID `gpu_uuid` (the
    session's `gpu_uuid`), or the first GPU when it is None; config: the run's TrainConfig;
    device: "cpu" or "cuda" (default: config.device, else "cuda" when records carry CUDA
    memory); model_dims: sizes such as {"hidden_size": 1000, "vocab_size": 50257}.
    """
    recs = read_records(records)
    if gpu_uuid is not None and not isinstance(gpu_uuid, str):
        raise ValueError(
            f"gpu_uuid={shown(gpu_uuid)}: must be an NVML UUID string ('GPU-...') or None"
        )
    gpu = read_samples(samples, gpu_uuid)
    if config is not None and not isinstance(config, TrainConfig):
        raise ValueError(f"config={shown(config)}: must be a TrainConfig or None")
    if device is not None and device not in _DEVICES:
        raise ValueError(f"device={shown(device)}: must be one of {', '.join(_DEVICES)} or None")
    if device is None:
        if config is not None and str(config.device) in _DEVICES:
            device = str(config.device)
        elif any(r.cuda_allocated_bytes is not None for r in recs):
            device = "cuda"
    ctx = _Ctx(
        recs=recs,
        recent=recs[-RECENT_STEPS:],
        readings=gpu,
        config=config,
        device=device,
        dims=read_model_dims(model_dims),
    )
    stall = _rule_data_stall(ctx)
    advice = [
        *_rule_nonfinite_loss(ctx),
        *_rule_loss_scale(ctx),
        *stall,
        *_rule_low_gpu_util(ctx, stalled=bool(stall)),
        *_rule_memory_growth(ctx),
        *_rule_grad_spike(ctx),
        *_rule_precision_speed(ctx),
        *_rule_lr_scaling(ctx),
        *_rule_alignment(ctx),
    ]
    return _one_value_a_setting(sorted(advice, key=lambda a: _SEVERITY_ORDER[a.severity]))


def _one_value_a_setting(advice: list[Advice]) -> list[Advice]:
    """Advice in severity order, each setting applied by the first (most severe) advice that
    sets it: a later advice's other value for it leaves its `apply` and says which advice
    sets it, so applying every piece of advice never undoes the more severe one's fix."""
    taken: dict[str, tuple[Any, str]] = {}
    out: list[Advice] = []
    for a in advice:
        apply = dict(a.apply or {})
        clashes = [k for k, v in apply.items() if k in taken and taken[k][0] != v]
        if clashes:
            for k in clashes:
                del apply[k]
            said = ", ".join(f"{k}={taken[k][0]!r}" for k in clashes)
            owners = ", ".join(sorted({taken[k][1] for k in clashes}))
            a = replace(
                a,
                message=f"{a.message} (the {owners} advice above sets {said}: applied once, "
                "from there)",
                apply=apply or None,
            )
        for k, v in (a.apply or {}).items():
            taken.setdefault(k, (v, f"[{a.severity}] {a.id}"))
        out.append(a)
    return out
