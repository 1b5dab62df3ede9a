"""How long the planner takes to rank a whole search space (`workbench.planner.plan`).

    .venv/bin/python benchmarks/planner.py [--runs 5]

For each case (a model, a cluster, a global batch) the median wall time of `--runs` calls
of `plan(...)` (each a full search: every engine, offload, tp x pp x dp layout,
micro-batch x accumulation, checkpointing and optimizer (and context-parallel degree on a long sequence) the Session trains there, each
setup's peak from the estimator and its step time from the model), with how many setups
it ranked and how many fit. The target is under a second on this CPU.

Writes benchmarks/results/planner.json.
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import median_wall, positive_int, write_results

CASES: list[dict[str, Any]] = [
    {"model": "llama-3-8b", "gpu": "h100", "seq_len": 4096, "global_batch": 256},
    {"model": "llama-3-70b", "gpu": "h100", "nodes": 8, "seq_len": 4096, "global_batch": 512},
    {"model": "gpt3-175b", "gpu": "a100-80gb", "nodes": 128, "global_batch": 1536},
    {"model": "llama-3-8b", "gpu": "l4", "gpus_per_node": 2, "global_batch": 8},
    # a long sequence: context parallelism searched too
    {"model": "llama-3-8b", "gpu": "h100", "nodes": 8, "seq_len": 131072, "global_batch": 64},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int("--runs"), default=5)
    a = parser.parse_args()
    from workbench.planner import plan

    rows = []
    for case in CASES:
        result = plan(**case)
        wall = median_wall(lambda case=case: plan(**case), runs=a.runs)
        rows.append(
            {
                "case": case,
                "ranked": result.searched,
                "fit": len(result.plans),
                "best": result.best.label(),
                "seconds": wall,
            }
        )
        print(
            f"{case['model']} on {result.cluster.gpus} x {result.cluster.gpu.name}: "
            f"{result.searched} setups ranked ({len(result.plans)} fit) in "
            f"{wall['median_seconds']:.3f} s; best {result.best.label()}"
        )
    path = write_results("planner", {"runs": a.runs, "cases": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
