"""The planner's ranking checked by measuring: the top plans of a `PlanResult` run for a
few steps on this machine, measured next to predicted, and re-ranked by measurement.

    from workbench.planner import plan
    from workbench.train.measure.plan_probe import probe_plans
    probes = probe_plans(plan(model="llama-3-8b", gpu="h100", global_batch=64), k=3)

Each probe runs its plan's engine, precision, optimizer, offload and checkpointing on
`ranks` local processes (`workbench.train.launch.launch_ranks`): on this machine's GPUs
when it has them, else on CPU ranks. The planned model rarely fits here, so the probe
trains the built-in GPT (as the ladder does), and its layout is the plan's scaled to the
ranks at hand: tp and pp keep what divides the ranks, the micro-batch at most 4, the
accumulation at most 2 (at least the stages). What is compared is what ran: each rank's
measured model-state bytes next to the estimator's figure for that run, and the measured
step time; `rerank` orders the probes by it.

The built-in GPT is launch-bound on a GPU (10^-4 to 10^-3 of its peak), so its speed says
nothing about the planned model's: the efficiency the planner takes (`plan(mfu=...)`) is
measured by `probe_layer` instead, on one transformer layer of the planned model at its
real width, sequence and micro-batch (plan #1's), forward and backward in its precision:
the layer's hardware FLOPs (`workbench.estimate.flops`, counted from the built layer's own
weights) over the median step time and the device's catalog peak. A device too small for
that layer is refused, saying what it needs. On a GPU of the catalog `probe_plans` gives
every probe that efficiency; on a CPU there is no catalog peak (the layer's FLOP/s only).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from workbench.config import ConfigError, TrainConfig
from workbench.engines import engine_problems
from workbench.inputs import shown
from workbench.planner import Plan, PlanResult

#: the built-in GPT a probe trains (small enough for CPU ranks, its layers split 1, 2, 4 ways)
PROBE_MODEL: dict[str, Any] = {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 64}


@dataclass(frozen=True)
class Probe:
    """One plan measured: what ran (`settings` on `ranks`), its measured step time (the
    median of the steps after the first), rank 0's measured model-state bytes and the
    estimator's figure for them; `error` when it could not run."""

    plan: Plan
    settings: dict[str, Any]
    ranks: int
    device: str
    step_seconds: float | None
    states_bytes: int | None
    predicted_states_bytes: int | None
    efficiency: float | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.label(),
            "ran": dict(self.settings),
            "ranks": self.ranks,
            "device": self.device,
            "measured_step_seconds": self.step_seconds,
            "measured_states_bytes": self.states_bytes,
            "predicted_states_bytes": self.predicted_states_bytes,
            "measured_efficiency": self.efficiency,
            "error": self.error,
        }


def scaled_settings(plan: Plan, ranks: int, layers: int) -> dict[str, Any]:
    """The plan's settings with its layout scaled to `ranks` processes and a model of
    `layers` layers (see the module docstring)."""
    s = dict(plan.settings)
    tp = math.gcd(plan.tp, ranks)
    pp = math.gcd(plan.pp, ranks // tp, layers)
    s["tp"], s["pp"] = tp, pp
    s["micro_batch"] = min(int(s["micro_batch"]), 4)
    s["grad_accum"] = max(pp, min(int(s["grad_accum"]), 2))
    s.setdefault("attention", "sdpa")  # the kernel the plan's memory assumes
    return {k: v for k, v in s.items() if not (k in ("tp", "pp") and v == 1)}


def probe_plans(
    result: PlanResult,
    k: int = 3,
    *,
    ranks: int = 2,
    steps: int = 4,
    timeout: float = 600.0,
    model_options: dict[str, Any] | None = None,
) -> list[Probe]:
    """The first `k` plans of `result`, each run for `steps` steps on `ranks` ranks (see
    the module docstring); ValueError naming `k`, `ranks` or `steps` when out of range."""
    from workbench.train.launch import launch_ranks

    limits = (("k", k, 1, 20), ("ranks", ranks, 1, 64), ("steps", steps, 2, 100))
    for name, value, low, high in limits:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name}={shown(value)}: must be an integer from {low} to {high}")
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if cuda:
        ranks = min(ranks, torch.cuda.device_count())
    options = {**PROBE_MODEL, **(model_options or {})}
    layer = None
    if cuda and result.plans:
        try:
            layer = probe_layer(result)
        except ValueError:
            layer = None  # too large for this GPU: said by probe_layer when called alone
    probes = []
    for plan in result.plans[:k]:
        settings = scaled_settings(plan, ranks, int(options["layers"]))
        try:
            config = TrainConfig(**settings, device=device)
            problems = engine_problems(config, ranks)
            if problems:
                raise ConfigError(problems)
        except ConfigError as exc:
            probes.append(_failed(plan, settings, ranks, device, f"not run here: {exc}"))
            continue
        run = launch_ranks(
            config,
            ranks=ranks,
            model="tiny-gpt",
            model_options=options,
            steps=steps,
            timeout=timeout,
            threads=1 if not cuda else None,
        )
        if not run.ok:
            error = run.first_error.message if run.first_error else "a rank did not finish"
            probes.append(_failed(plan, settings, ranks, device, error))
            continue
        first = run.ranks[0]
        times = [r.step_seconds for r in first.records[1:]] or [first.records[-1].step_seconds]
        step = statistics.median(times)
        measured = sum(
            v or 0 for v in (first.params_bytes, first.grads_bytes, first.optimizer_bytes)
        )
        pred = first.predicted or {}
        parts = ("params_bytes", "grads_bytes", "optimizer_bytes")
        predicted = sum(int(pred.get(part) or 0) for part in parts)
        probes.append(
            Probe(
                plan=plan,
                settings=settings,
                ranks=ranks,
                device=device,
                step_seconds=step,
                states_bytes=measured,
                predicted_states_bytes=predicted or None,
                efficiency=layer.efficiency if layer is not None else None,
            )
        )
    return probes


def rerank(probes: list[Probe]) -> list[Probe]:
    """The probes that ran, fastest measured step first (those that did not, last)."""
    return sorted(probes, key=lambda p: (p.step_seconds is None, p.step_seconds or 0.0))


def _failed(plan: Plan, settings: dict[str, Any], ranks: int, device: str, error: str) -> Probe:
    return Probe(plan, settings, ranks, device, None, None, None, None, error)


@dataclass(frozen=True)
class LayerProbe:
    """One layer of the planned model measured: its shape, micro-batch, precision, the
    median forward+backward seconds, the FLOP/s it ran at and, on a GPU of the catalog,
    the efficiency (that over the peak) the planner takes."""

    hidden: int
    heads: int
    ffn_hidden: int
    seq_len: int
    micro_batch: int
    precision: str
    device: str
    seconds: float
    flops_per_s: float
    efficiency: float | None
    gpu: str | None

    def text(self) -> str:
        rate = f"{self.flops_per_s / 1e9:,.1f} GFLOP/s"
        eff = (
            f", efficiency {self.efficiency:.2f} of the {self.gpu} peak (plan(mfu=...) takes it)"
            if self.efficiency is not None
            else " (no catalog peak on this device: no efficiency)"
        )
        return (
            f"One layer of the planned model (width {self.hidden}, {self.heads} heads, MLP "
            f"{self.ffn_hidden}, sequence {self.seq_len}, micro-batch {self.micro_batch}, "
            f"{self.precision}) on {self.device}: {self.seconds * 1e3:.2f} ms forward and "
            f"backward, {rate}{eff}"
        )


class _Layer(torch.nn.Module):
    """A pre-norm decoder layer: grouped-query attention through sdpa, a GELU or SwiGLU
    MLP."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, gated: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, hidden + 2 * kv_heads * (hidden // heads), bias=False)
        self.out = torch.nn.Linear(hidden, hidden, bias=False)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, (2 if gated else 1) * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)
        self.gated = gated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.norm1(x)).split([h, self.kv_heads * d, self.kv_heads * d], -1)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.view(b, s, self.heads, d).transpose(1, 2),
            k.view(b, s, self.kv_heads, d).transpose(1, 2),
            v.view(b, s, self.kv_heads, d).transpose(1, 2),
            is_causal=True,
            enable_gqa=self.kv_heads != self.heads,
        )
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        u = self.up(self.norm2(x))
        if self.gated:
            gate, up = u.chunk(2, dim=-1)
            u = torch.nn.functional.silu(gate) * up
        else:
            u = torch.nn.functional.gelu(u)
        out: torch.Tensor = x + self.down(u)
        return out


def probe_layer(
    result: PlanResult,
    *,
    steps: int = 5,
    device: str | None = None,
    memory_bytes: int | None = None,
) -> LayerProbe:
    """One layer of `result`'s model at plan #1's micro-batch and sequence, run forward and
    backward `steps` times on `device` (the GPU when there is one, else the CPU); see the
    module docstring. ValueError naming the device when the layer's weights, gradients and
    activations (the estimator's figure for one layer) exceed `memory_bytes` (the device's
    free memory when not given)."""
    from workbench.estimate import estimate_memory, find_gpu
    from workbench.estimate.flops import FlopCount

    if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= 100:
        raise ValueError(f"steps={shown(steps)}: must be an integer from 2 to 100")
    best = result.plans[0]
    shape = result.model_shape
    hidden, heads, ffn = int(shape["hidden"]), int(shape["heads"]), int(shape["ffn_hidden"])
    kv_heads = int(shape.get("kv_heads") or heads)
    gated = shape.get("mlp") == "swiglu"
    seq, mb = int(result.seq_len), int(best.settings["micro_batch"])
    precision = str(best.settings.get("precision", "fp32"))
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    one = estimate_memory(
        layers=1, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn,
        mlp="swiglu" if gated else "gelu",
        vocab=8, seq_len=seq, micro_batch=mb, precision=precision, dropout=False,
    )  # fmt: skip
    needed = int(one.total_bytes)
    if memory_bytes is None:
        if dev.startswith("cuda"):
            memory_bytes = int(torch.cuda.mem_get_info(torch.device(dev))[0])
        else:
            import psutil  # type: ignore[import-untyped]

            memory_bytes = int(psutil.virtual_memory().available)
    if needed > memory_bytes:
        raise ValueError(
            f"device={shown(dev)}: one layer of the planned model (width {hidden}, sequence "
            f"{seq}, micro-batch {mb}) needs {needed / 2**30:.1f} GiB, {memory_bytes / 2**30:.1f}"
            " GiB free: too small to measure its efficiency here; give plan(mfu=...) or "
            "calibrate from a run on the GPU"
        )
    sixteen = precision != "fp32"
    pure = precision in ("bf16", "fp16", "bf16-true")  # 16-bit weights, no autocast
    dtype = torch.bfloat16 if "bf16" in precision else torch.float16
    layer = _Layer(hidden, heads, kv_heads, ffn, gated).to(
        dev, dtype=dtype if pure else torch.float32
    )
    x = torch.randn(mb, seq, hidden, device=dev, dtype=dtype if pure else torch.float32)
    x.requires_grad_(True)
    autocast = torch.autocast(dev.split(":")[0], dtype=dtype, enabled=sixteen and not pure)
    times = []
    for _ in range(steps):
        if dev.startswith("cuda"):
            torch.cuda.synchronize(dev)  # the host waits for the device: a clean start
        start = _now()
        with autocast:
            y = layer(x)
        y.float().sum().backward()
        if dev.startswith("cuda"):
            torch.cuda.synchronize(dev)  # the host waits for the step to finish
        times.append(_now() - start)
    seconds = statistics.median(times[1:])
    weights = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    count = FlopCount(matmul_params=weights, layers=1, attention_width=hidden, seq_len=seq)
    flops_per_s = count.hardware_per_token("none") * mb * seq / seconds
    gpu = (
        find_gpu(torch.cuda.get_device_name(torch.device(dev))) if dev.startswith("cuda") else None
    )
    efficiency = name = None
    if gpu is not None and not isinstance(gpu, str):
        peak = gpu.peak_flops(sixteen, bf16="bf16" in precision) or gpu.peak_fp32_flops
        efficiency, name = float(flops_per_s / peak), gpu.name
    return LayerProbe(
        hidden, heads, ffn, seq, mb, precision, dev, seconds, flops_per_s, efficiency, name
    )


def _now() -> float:
    import time

    return time.perf_counter()


def text(probes: list[Probe]) -> str:
    """The probes as a table, re-ranked by the measured step time."""
    lines = [
        f"Probes on {probes[0].ranks} {probes[0].device} rank(s), the built-in GPT "
        "(measured next to predicted; ranked by the measured step):",
        f"{'plan':<48} {'ran as':<26} {'step':>9} {'states':>10} {'predicted':>10}",
    ]
    for p in rerank(probes):
        s = p.settings
        ran = f"tp{s.get('tp', 1)} pp{s.get('pp', 1)} mb{s['micro_batch']}x{s['grad_accum']}"
        if p.error is not None:
            lines.append(f"{p.plan.label():<48} {ran:<26} {p.error}")
            continue
        assert p.step_seconds is not None
        lines.append(
            f"{p.plan.label():<48} {ran:<26} {p.step_seconds * 1e3:>7.1f}ms "
            f"{(p.states_bytes or 0) / 1024:>8.1f}Ki "
            f"{(p.predicted_states_bytes or 0) / 1024:>8.1f}Ki"
        )
    measured = next((p.efficiency for p in probes if p.efficiency is not None), None)
    if measured is not None:
        lines.append(
            f"Efficiency measured on one layer of the planned model: {measured:.2f} of the "
            f"peak (`workbench plan ... --mfu {measured:.2f}` ranks with it)"
        )
    return "\n".join(lines)


__all__ = [
    "PROBE_MODEL",
    "LayerProbe",
    "Probe",
    "probe_layer",
    "probe_plans",
    "rerank",
    "scaled_settings",
    "text",
]
