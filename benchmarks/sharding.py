"""ZeRO or FSDP for the same model: per-rank memory and step time, side by side.

    .venv/bin/python benchmarks/sharding.py [--steps 12] [--ranks 2]

One run: the same model (tiny-gpt, 4 layers, hidden 128), settings and steps on 2 local
ranks (CPU, gloo; NCCL on GPUs) under unsharded data parallel (DeepSpeed stage 0, the
baseline), ZeRO-2, ZeRO-3, FSDP shard_grad_op and FSDP full_shard, each through the real
launcher (`workbench.train.launch.launch_ranks`). For each: the measured per-rank model
states (rank 0's own tensors at the end), the estimator's prediction for that engine's
layout, and the step time of the steps after the first two (warm-up) as a ratio to the
baseline: their mean, all their seconds over the steps (`workbench.throughput`; at a fixed
batch the inverse of samples/s, so a ratio of sums), what the run paid a step. Their
median (`median_step_seconds`, the typical step) is kept beside it, not compared: where
some steps are long (a wait in gloo, the shared machine), the median leaves out their cost.
Writes benchmarks/results/sharding.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from _common import positive_int, write_results

from workbench import TrainConfig
from workbench.rates import throughput
from workbench.train.launch import launch_ranks

MODEL_OPTIONS = {"layers": 4, "hidden": 128, "heads": 4, "seq_len": 64, "dropout": 0.0}
SETUPS: dict[str, dict[str, Any]] = {
    "data parallel (ZeRO-0)": {"zero_stage": 0},
    "ZeRO-2": {"zero_stage": 2},
    "ZeRO-3": {"zero_stage": 3},
    "FSDP shard_grad_op": {"fsdp": "shard_grad_op"},
    "FSDP full_shard": {"fsdp": "full_shard"},
}


def step_times(records: Sequence[Any]) -> dict[str, float | None]:
    """The steps after the first two (warm-up): `step_seconds`, their mean (all seconds
    over the steps, what the engines are compared by), and `median_step_seconds`, the
    typical step, beside it."""
    steady = records[2:]
    return {
        "step_seconds": throughput(steady).step_seconds,
        "median_step_seconds": statistics.median(r.step_seconds for r in steady),
    }


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:8.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int("--steps"), default=12)
    p.add_argument("--ranks", type=positive_int("--ranks"), default=2)
    args = p.parse_args(argv)
    if args.steps < 4:
        p.error(f"--steps {args.steps}: must be >= 4 (2 warm-up steps are left out)")
    rows: dict[str, dict[str, Any]] = {}
    for name, setting in SETUPS.items():
        config = TrainConfig(device="cpu", micro_batch=8, seed=0, **setting)
        start = time.perf_counter()
        result = launch_ranks(
            config,
            ranks=args.ranks,
            model="tiny-gpt",
            model_options=MODEL_OPTIONS,
            steps=args.steps,
            timeout=900,
        )
        if not result.ok:
            print(f"{name}: failed: {result.first_error}", file=sys.stderr)
            return 1
        rank0 = result.ranks[0]
        rows[name] = {
            "setting": setting,
            "params_bytes": rank0.params_bytes,
            "grads_bytes": rank0.grads_bytes,
            "optimizer_bytes": rank0.optimizer_bytes,
            "predicted": rank0.predicted,
            **step_times(rank0.records),
            "wall_seconds": time.perf_counter() - start,
        }
    base = rows["data parallel (ZeRO-0)"]["step_seconds"]
    print(f"tiny-gpt {MODEL_OPTIONS}, {args.ranks} ranks on CPU (gloo), per rank, MiB:")
    print(f"{'':24} {'params':>8} {'grads':>8} {'optim':>8} {'total':>8}  step time vs DP")
    for name, row in rows.items():
        total = row["params_bytes"] + row["grads_bytes"] + row["optimizer_bytes"]
        row["total_bytes"] = total
        row["step_time_ratio"] = row["step_seconds"] / base
        print(
            f"{name:24} {_mib(row['params_bytes'])} {_mib(row['grads_bytes'])} "
            f"{_mib(row['optimizer_bytes'])} {_mib(total)}  {row['step_time_ratio']:.2f}x "
            f"({row['step_seconds'] * 1e3:.0f} ms a step)"
        )
    path = write_results(
        "sharding",
        {"ranks": args.ranks, "steps": args.steps, "model_options": MODEL_OPTIONS, "rows": rows},
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
