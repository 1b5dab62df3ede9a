"""What tensor and pipeline parallelism cost and hold on this machine: samples per second and
each rank's memory, one rank vs tp=2, tp=2 with sequence parallelism, pp=2 under 1F1B and
pp=2 under GPipe, all on the same samples.

    .venv/bin/python benchmarks/model_parallel.py [--steps 8] [--reps 2]

tiny-gpt (4 layers, hidden 128, 4 heads, sequence 64, dropout 0), micro-batch 4, 4
micro-batches a step, fp32 AdamW. Each setup is launched on 2 CPU ranks through
`workbench.train.launch.launch_ranks` (the one-rank setup on 1), `--reps` times,
interleaved; a run's samples/s is the samples of its steps after the first over their
seconds (`workbench.throughput`: a ratio of sums, not the median step's rate), and the
ratio to the one-rank run is reported per rep and as the median of them (a median of
whole runs: one rep slowed by the shared machine does not set it). Each rank's
measured parameter, gradient, optimizer and activation bytes sit next to the
estimator's figure for that rank (the launch's own report), and a pipeline's last-step
bubble next to (p - 1) / (m + p - 1).

On 2 CPU processes sharing 2 cores the split setups are slower than one rank: each
layer's all-reduces (tp) and the point-to-point sends between stages (pp) go through gloo
on the same cores that compute; the benchmark measures that rather than a GPU cluster's
speed-up. Writes benchmarks/results/model_parallel.json.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

from _common import positive_int, write_results

from workbench import TrainConfig
from workbench.rates import throughput
from workbench.train.launch import launch_ranks

MODEL = {"layers": 4, "hidden": 128, "heads": 4, "seq_len": 64, "dropout": 0.0}
BASE = {"micro_batch": 4, "grad_accum": 4, "lr": 1e-3, "seed": 1, "device": "cpu"}
SETUPS: dict[str, tuple[dict[str, Any], int]] = {  # name -> (settings, ranks)
    "one rank": ({}, 1),
    "tp=2": ({"tp": 2}, 2),
    "tp=2, sequence parallel": ({"tp": 2, "sequence_parallel": True}, 2),
    "pp=2, 1f1b": ({"pp": 2}, 2),
    "pp=2, gpipe": ({"pp": 2, "pp_schedule": "gpipe"}, 2),
}


def run_samples_per_s(records: Sequence[Any]) -> float | None:
    """A run's samples/s: the samples of its steps after the first (warm-up) over their
    seconds, never the median step's rate (workbench/rates.py)."""
    return throughput(records[1:]).samples_per_s


def one_run(settings: dict[str, Any], ranks: int, steps: int) -> dict[str, Any]:
    config = TrainConfig(**BASE, **settings)
    # the same rank worker for every setup; one rank: one process, the plain loop
    result = launch_ranks(
        config, ranks=ranks, model="tiny-gpt", steps=steps, model_options=MODEL, threads=1
    )
    if not result.ok:
        raise RuntimeError(f"{settings}: {result.first_error}")
    rank0 = result.ranks[0]
    return {
        "samples_per_s": run_samples_per_s(rank0.records),
        "losses": [r.loss for r in rank0.records],
        "ranks": [
            {
                "rank": r.rank,
                "layout": r.layout,
                "params_bytes": r.params_bytes,
                "grads_bytes": r.grads_bytes,
                "optimizer_bytes": r.optimizer_bytes,
                "activation_bytes": r.activation_bytes,
                "predicted": r.predicted,
            }
            for r in result.ranks
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int("--steps"), default=8)
    parser.add_argument("--reps", type=positive_int("--reps"), default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETUPS}
    for _ in range(args.reps):  # interleaved: a shared machine's load changes every setup alike
        for name, (settings, ranks) in SETUPS.items():
            runs[name].append(one_run(settings, ranks, args.steps))
    results: dict[str, Any] = {"model": MODEL, "settings": BASE, "steps": args.steps, "setups": {}}
    base = [r["samples_per_s"] for r in runs["one rank"]]
    print(
        f"tiny-gpt {MODEL}, micro-batch 4 x 4 micro-batches, {args.steps} steps, {args.reps} reps"
    )
    print(
        f"{'setup':<26} {'samples/s':>10} {'vs one rank':>12}  rank 0: params / activations KiB (measured, predicted)"
    )
    for name, reps in runs.items():
        # over whole runs, each one's rate a ratio of sums: one rep slowed by the machine's
        # load does not set it
        speed = statistics.median(r["samples_per_s"] for r in reps)
        ratios = [r["samples_per_s"] / b for r, b in zip(reps, base, strict=True)]
        last = reps[-1]
        r0 = last["ranks"][0]
        pred = r0["predicted"] or {}
        bubble = (r0["layout"] or {}).get("bubble_measured")
        print(
            f"{name:<26} {speed:>10.1f} {statistics.median(ratios):>11.2f}x  "
            f"{r0['params_bytes'] / 1024:,.1f} / {pred.get('params_bytes', 0) / 1024:,.1f}; "
            + (
                f"{(r0['activation_bytes'] or 0) / 1024:,.1f} / {(pred.get('activation_bytes') or 0) / 1024:,.1f}"
                if r0["activation_bytes"] is not None
                else "activations: the one-rank report has none"
            )
            + (
                f"; bubble {bubble:.0%} (ideal {r0['layout']['bubble_ideal']:.0%})"
                if bubble is not None
                else ""
            )
        )
        results["setups"][name] = {
            "samples_per_s_median": speed,
            "ratio_to_one_rank_per_rep": ratios,
            "ratio_to_one_rank_median": statistics.median(ratios),
            "runs": reps,
        }
    path = write_results("model_parallel", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
