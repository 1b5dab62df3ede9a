"""Panel costs: EstimatorPanel recompute + redraw latency, and the TrainingPanel's
overhead on a running Session.

    .venv/bin/python benchmarks/panels.py [--changes 60] [--pairs 5] [--steps 30]

1. Estimator: the median wall time of one input change (parse, estimate, compare stages,
   redraw the persistent figure into PNG) over many changes; target under 150 ms.
2. Training: optimizer steps per second of the built-in tiny GPT with a TrainingPanel's
   refresh timer stopped and running at its fastest allowed rate (4 Hz), interleaved in
   pairs; the overhead ratio is the median over pairs of (steps/s without) / (steps/s
   with), target 1.05 or lower. The CPU share of the panel's thread is printed too: it
   does not depend on what else the machine runs, the ratio does.
Writes benchmarks/results/panels.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from _common import write_results

ESTIMATOR_TARGET_SECONDS = 0.150
OVERHEAD_TARGET_RATIO = 1.05


def bench_estimator(changes: int) -> dict[str, Any]:
    from workbench.ui import EstimatorPanel

    panel = EstimatorPanel()
    edits = [
        ("micro_batch", ["1", "2", "4", "8"]),
        ("zero_stage", [0, 1, 2, 3]),
        ("gpus", ["1", "8", "64", "512"]),
        ("precision", ["fp32", "amp-bf16", "bf16", "fp16"]),
        ("seq_len", ["1024", "2048", "4096", "8192"]),
        ("checkpointing", ["none", "selective", "full"]),
    ]
    seconds = []
    i = 0
    renders = panel.chart.renders
    while len(seconds) < changes:
        name, values = edits[i % len(edits)]
        widget = panel.fields[name].widget
        value = values[(i // len(edits)) % len(values)]
        i += 1
        if widget.value == value:
            continue
        start = time.perf_counter()
        widget.value = value  # observe -> parse -> estimate -> compare stages -> redraw
        seconds.append(time.perf_counter() - start)
    assert panel.chart.renders - renders == len(seconds), "every change must redraw"
    assert not panel.errors(), panel.errors()
    panel.close()
    median = statistics.median(seconds)
    return {
        "changes": len(seconds),
        "median_seconds": median,
        "p90_seconds": sorted(seconds)[int(0.9 * (len(seconds) - 1))],
        "max_seconds": max(seconds),
        "target_seconds": ESTIMATOR_TARGET_SECONDS,
        "meets_target": median < ESTIMATOR_TARGET_SECONDS,
    }


def bench_training_overhead(pairs: int, steps: int) -> dict[str, Any]:
    """Steps/s of one session with the panel's refresh timer running (at 4 Hz, its fastest)
    and stopped, in interleaved pairs (alternating which goes first). The panel is built
    once, outside the timed runs; the ratio per pair cancels slow drifts in machine load."""
    from workbench.config import TrainConfig
    from workbench.train.session import Session
    from workbench.ui import TrainingPanel

    session = Session(TrainConfig(micro_batch=8), model="tiny-gpt")
    panel = None
    try:
        session.run(optimizer_steps=3)  # warm-up: allocations, first-step costs
        panel = TrainingPanel(session, refresh_s=0.25, autostart=False)
        panel.wait_for_tasks(timeout=300)  # its one automatic memory measurement

        def timed_run() -> float:
            start = time.perf_counter()
            session.run(optimizer_steps=steps)
            return steps / (time.perf_counter() - start)

        without: list[float] = []
        with_panel: list[float] = []
        pair_ratios: list[float] = []
        renders = panel.chart.renders
        wall_with = 0.0
        for pair in range(pairs):
            order = ("without", "with") if pair % 2 == 0 else ("with", "without")
            got: dict[str, float] = {}
            for kind in order:
                if kind == "without":
                    got[kind] = timed_run()
                else:
                    panel.timer.start()
                    start = time.perf_counter()
                    try:
                        got[kind] = timed_run()
                    finally:
                        wall_with += time.perf_counter() - start
                        panel.timer.stop()
            without.append(got["without"])
            with_panel.append(got["with"])
            pair_ratios.append(got["without"] / got["with"])
        ratio = statistics.median(pair_ratios)
        return {
            "pairs": pairs,
            "steps_per_run": steps,
            "steps_per_s_without_panel": without,
            "steps_per_s_with_panel": with_panel,
            "pair_ratios": pair_ratios,
            "pair_ratio_quartiles": statistics.quantiles(pair_ratios, n=4) if pairs > 1 else None,
            "median_steps_per_s_without": statistics.median(without),
            "median_steps_per_s_with": statistics.median(with_panel),
            "panel_redraws": panel.chart.renders - renders,
            "panel_ticks": panel.timer.ticks,
            # load-independent: CPU the panel's refresh thread used per second of training
            "panel_cpu_seconds": panel.timer.cpu_seconds,
            "panel_cpu_share": panel.timer.cpu_seconds / wall_with,
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "overhead_ratio": ratio,
            "target_ratio": OVERHEAD_TARGET_RATIO,
            "meets_target": ratio <= OVERHEAD_TARGET_RATIO,
        }
    finally:
        if panel is not None:
            panel.close()
        session.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=60, help="estimator input changes to time")
    ap.add_argument("--pairs", type=int, default=20, help="interleaved with/without pairs")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per timed run")
    args = ap.parse_args(argv)
    for name in ("changes", "pairs", "steps"):
        if getattr(args, name) < 1:
            print(f"--{name}={getattr(args, name)}: must be an integer >= 1", file=sys.stderr)
            return 2

    est = bench_estimator(args.changes)
    print(
        f"EstimatorPanel recompute + redraw: median {est['median_seconds'] * 1000:.1f} ms, "
        f"p90 {est['p90_seconds'] * 1000:.1f} ms over {est['changes']} changes "
        f"(target < {ESTIMATOR_TARGET_SECONDS * 1000:.0f} ms: "
        f"{'met' if est['meets_target'] else 'NOT met'})"
    )
    train = bench_training_overhead(args.pairs, args.steps)
    print(
        f"TrainingPanel overhead: {train['median_steps_per_s_without']:.2f} steps/s without, "
        f"{train['median_steps_per_s_with']:.2f} with ({train['panel_redraws']} redraws); "
        f"median pair ratio {train['overhead_ratio']:.3f} (quartiles "
        f"{', '.join(f'{q:.2f}' for q in train['pair_ratio_quartiles'] or [])}) (target <= {OVERHEAD_TARGET_RATIO}: "
        f"{'met' if train['meets_target'] else 'NOT met'}); the panel's thread used "
        f"{train['panel_cpu_share']:.1%} of one core (load average "
        f"{train['load_average_1min']})"
    )
    path = write_results("panels", {"estimator_panel": est, "training_panel": train})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
