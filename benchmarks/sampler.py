"""Cost of the hardware sampler: CPU time of its thread as a share of one core.

    .venv/bin/python benchmarks/sampler.py [--seconds 20] [--interval 0.5]

Runs one `Sampler` for `--seconds` while the main thread sleeps, and measures the CPU
time of the sampler thread two ways: `time.thread_time()` summed inside the thread
(`Sampler.thread_cpu_seconds`) and the kernel's per-thread counters via psutil. Prints
the share of one core and writes benchmarks/results/sampler.json. Budget: < 1% at 2 Hz.
Exit status 1 when the budget is exceeded, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import psutil
from _common import ROOT, write_results

from workbench.monitor import Sampler

BUDGET_PERCENT = 1.0


def _positive(name: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(
                f"{name}={text!r}: must be a finite number of seconds > 0"
            )
        return value

    return parse


def _kernel_thread_cpu(native_id: int | None) -> float | None:
    if native_id is None:
        return None
    try:
        for t in psutil.Process().threads():
            if t.id == native_id:
                return t.user_time + t.system_time
    except (psutil.Error, OSError):
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=_positive("--seconds"), default=20.0)
    p.add_argument("--interval", type=_positive("--interval"), default=0.5)
    args = p.parse_args(argv)

    sampler = Sampler(interval=args.interval)
    native_id = sampler._thread.native_id  # the thread's kernel id, for psutil
    kernel_start = _kernel_thread_cpu(native_id)
    inside_start = sampler.thread_cpu_seconds
    taken_start = sampler.samples_taken
    wall_start = time.monotonic()
    time.sleep(args.seconds)
    wall = time.monotonic() - wall_start
    inside = sampler.thread_cpu_seconds - inside_start
    kernel_end = _kernel_thread_cpu(native_id)
    taken = sampler.samples_taken - taken_start
    source, reason = sampler.source, sampler.reason
    sampler.close()

    kernel = None
    if kernel_start is not None and kernel_end is not None:
        kernel = kernel_end - kernel_start
    percent_inside = 100.0 * inside / wall
    percent_kernel = None if kernel is None else 100.0 * kernel / wall
    worst = max(percent_inside, percent_kernel or 0.0)
    ok = worst < BUDGET_PERCENT

    print(f"sampler source: {source}" + (f" ({reason})" if reason else ""))
    print(f"interval {args.interval} s, {taken} samples in {wall:.1f} s wall")
    print(
        f"sampler thread CPU (thread_time inside the thread): {inside * 1000:.1f} ms "
        f"= {percent_inside:.3f}% of one core"
    )
    if percent_kernel is not None:
        print(
            f"sampler thread CPU (kernel per-thread counters):   {kernel * 1000:.1f} ms "
            f"= {percent_kernel:.3f}% of one core (10 ms tick resolution)"
        )
    if taken:
        print(f"per sample: {inside / taken * 1e6:.0f} us of CPU")
    print(f"budget < {BUDGET_PERCENT}% of one core: {'PASS' if ok else 'FAIL'}")

    path = write_results(
        "sampler",
        {
            "interval_seconds": args.interval,
            "wall_seconds": wall,
            "samples": taken,
            "source": source,
            "reason": reason,
            "thread_cpu_seconds": inside,
            "thread_cpu_percent_of_core": percent_inside,
            "kernel_thread_cpu_seconds": kernel,
            "kernel_thread_cpu_percent_of_core": percent_kernel,
            "cpu_seconds_per_sample": inside / taken if taken else None,
            "budget_percent_of_core": BUDGET_PERCENT,
            "within_budget": ok,
        },
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
