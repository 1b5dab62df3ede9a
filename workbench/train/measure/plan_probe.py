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
step time; `rerank` orders the probes by it. On a GPU of the catalog the probes also
measure the efficiency (the planner's model FLOPs a second over the local GPU's catalog
peak at the plan's precision) that `plan(efficiency=...)` takes for the next ranking; on a
CPU there is no catalog peak to measure it against.
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
                efficiency=_efficiency(run, step, settings, options) if cuda else None,
            )
        )
    return probes


def rerank(probes: list[Probe]) -> list[Probe]:
    """The probes that ran, fastest measured step first (those that did not, last)."""
    return sorted(probes, key=lambda p: (p.step_seconds is None, p.step_seconds or 0.0))


def _failed(plan: Plan, settings: dict[str, Any], ranks: int, device: str, error: str) -> Probe:
    return Probe(plan, settings, ranks, device, None, None, None, None, error)


def _efficiency(
    run: Any, step: float, settings: dict[str, Any], options: dict[str, Any]
) -> float | None:
    """The probe's model FLOPs a second over this machine's GPUs' catalog peak at its
    precision: the planner's count (6N + 12Lhs a token, the recomputed forward under
    checkpointing) of the step's tokens over its median step time. None when this GPU
    is not in the catalog."""
    from workbench.estimate import find_gpu

    gpu = find_gpu(torch.cuda.get_device_name(0))
    last = run.ranks[0].records[-1]
    if isinstance(gpu, str) or not last.tokens_per_s or not run.n_params:
        return None
    tokens = last.tokens_per_s * last.step_seconds  # the step's tokens, all replicas
    per_token = 6 * run.n_params + 12 * options["layers"] * options["hidden"] * options["seq_len"]
    ckpt = str(settings.get("activation_checkpointing", "none"))
    core = 4 * options["layers"] * options["hidden"] * options["seq_len"]
    if ckpt == "full":
        per_token += 2 * run.n_params + core
    elif ckpt == "selective":
        per_token += core
    precision = str(settings.get("precision", "fp32"))
    peak = gpu.peak_flops(precision != "fp32", bf16="bf16" in precision) or gpu.peak_fp32_flops
    ranks = len(run.ranks)
    return float(per_token * tokens / (step * ranks * peak))


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
    return "\n".join(lines)


__all__ = ["PROBE_MODEL", "Probe", "probe_plans", "rerank", "scaled_settings", "text"]
