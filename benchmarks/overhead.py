"""Overhead of the live Session over a hand-written PyTorch loop.

    .venv/bin/python benchmarks/overhead.py [--steps 20] [--reps 7] [--threads 1]

Trains tiny-gpt at its default size (4 layers, hidden 128, 4 heads, seq 64), fp32,
AdamW, micro-batch 8, with grad_accum 1 and 4, for the same number of optimizer steps:

* A, plain: the model, a shuffled DataLoader, `loss / accum` backward, `opt.step()`,
  `opt.zero_grad(set_to_none=True)`, `loss.item()` once per step;
* B, Session: `Session.run()` with its records and, when `workbench.monitor` imports, a
  hardware `Sampler` running and attached to every record.

Runs are interleaved A B A B (the machine may be shared), each after 2 untimed warm-up
steps on fresh objects. Prints, per accumulation, the median wall time of each side,
`ratio` = median Session / median plain, and the median of the per-pair ratios, and
also the ratio of process CPU time (less sensitive to other processes on a shared
machine; it includes the sampler thread). Writes benchmarks/results/overhead.json.
Target: ratio <= 1.03. Exit status 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any

import torch
from _common import positive_int, write_results
from torch.utils.data import DataLoader

from workbench import Session, TrainConfig
from workbench.models import build_model

TARGET = 1.03
MICRO_BATCH = 8


def _timed(fn: Any) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of `fn()`, after a garbage collection."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def plain_run(accum: int, steps: int, seed: int) -> tuple[float, float]:
    """Seconds for `steps` optimizer steps of a hand-written loop (after 2 warm-up steps)."""
    torch.manual_seed(seed)
    model, dataset, loss_fn, _ = build_model("tiny-gpt", seed=seed)
    model.train()
    loader = DataLoader(
        dataset,
        batch_size=MICRO_BATCH,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    batches = iter(loader)

    def step() -> float:
        nonlocal batches
        total = 0.0
        for _ in range(accum):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            loss = loss_fn(model(x), y)
            (loss / accum).backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / accum

    for _ in range(2):
        step()

    def timed_steps() -> None:
        for _ in range(steps):
            step()

    return _timed(timed_steps)


def session_run(accum: int, steps: int, seed: int, sampler: Any | None) -> tuple[float, float]:
    cfg = TrainConfig(micro_batch=MICRO_BATCH, grad_accum=accum, seed=seed)
    with Session(cfg, sampler=sampler) as s:
        s.run(2)
        times = _timed(lambda: s.run(steps))
        assert len(s.history) == steps + 2
        if sampler is not None:
            assert s.history[-1].cpu_util_percent is not None
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=positive_int("--steps"),
        default=20,
        help="timed optimizer steps per run (grad_accum 4 runs half as many)",
    )
    parser.add_argument("--reps", type=positive_int("--reps"), default=7, help="A/B pairs")
    parser.add_argument(
        "--threads",
        type=positive_int("--threads"),
        default=1,
        help="torch intra-op threads (1 on a shared 2-core machine)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    sampler = None
    try:
        from workbench.monitor import Sampler

        sampler = Sampler()
    except Exception as exc:  # the monitor is optional here
        print(f"no hardware sampler: {exc}")
    results: dict[str, Any] = {
        "model": "tiny-gpt (4 layers, hidden 128, 4 heads, seq 64)",
        "precision": "fp32",
        "optimizer": "adamw",
        "micro_batch": MICRO_BATCH,
        "threads": args.threads,
        "sampler": sampler is not None,
        "target_ratio": TARGET,
        "runs": {},
    }
    worst = 0.0
    try:
        for accum in (1, 4):
            steps = args.steps if accum == 1 else max(2, args.steps // 2)
            plain, sess, plain_cpu, sess_cpu = [], [], [], []
            for rep in range(args.reps):
                wall, cpu = plain_run(accum, steps, seed=rep)
                plain.append(wall)
                plain_cpu.append(cpu)
                wall, cpu = session_run(accum, steps, seed=rep, sampler=sampler)
                sess.append(wall)
                sess_cpu.append(cpu)
            ratio = statistics.median(sess) / statistics.median(plain)
            pair = statistics.median(s / p for s, p in zip(sess, plain, strict=True))
            cpu_ratio = statistics.median(sess_cpu) / statistics.median(plain_cpu)
            worst = max(worst, ratio)
            results["runs"][f"grad_accum_{accum}"] = {
                "grad_accum": accum,
                "optimizer_steps": steps,
                "plain_seconds": plain,
                "session_seconds": sess,
                "plain_cpu_seconds": plain_cpu,
                "session_cpu_seconds": sess_cpu,
                "plain_median_seconds": statistics.median(plain),
                "session_median_seconds": statistics.median(sess),
                "ratio": ratio,
                "pairwise_median_ratio": pair,
                "cpu_ratio": cpu_ratio,
            }
            print(
                f"grad_accum={accum}: {steps} steps, plain {statistics.median(plain):.3f}s, "
                f"session {statistics.median(sess):.3f}s, ratio {ratio:.3f} "
                f"(pairwise median {pair:.3f}; process CPU time ratio {cpu_ratio:.3f})"
            )
    finally:
        if sampler is not None:
            sampler.close()
    results["ratio"] = worst
    path = write_results("overhead", results)
    print(f"ratio {worst:.3f} (target <= {TARGET}); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
