"""Speed of the memory estimator and of the `workbench estimate` command.

    .venv/bin/python benchmarks/estimator.py [--sweep 100000] [--cli-runs 7]

Measures (1) the latency of one `estimate_memory` call (wall time, the target's, and the
process's CPU time, which a busy shared machine does not inflate), with n_params only, with a
full transformer shape, GPU, tokens and price, and with a model preset split by tensor,
sequence and pipeline parallelism (target for the slower two: < 100 microseconds); (2) a sweep
over `--sweep` distinct configurations (precision x optimizer x stage x GPUs x offload x
checkpointing x micro-batch x GPU); (3) the start-up time of `python -m workbench.cli
estimate ...` in a subprocess (median of `--cli-runs`), next to a bare `python -c pass`
for scale. Prints the figures and writes benchmarks/results/estimator.json.
Exit status 1 when the one-call target is missed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from _common import ROOT, median_wall, positive_int, time_call, write_results

from workbench.config import OptimizerName, Precision
from workbench.estimate import GPUS, estimate_memory

TARGET_SECONDS = 100e-6
GPT3 = dict(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=50257)


def sweep_configs(count: int) -> list[dict[str, object]]:
    """`count` distinct valid configurations (cycled product of the option axes)."""
    axes = itertools.product(
        [p.value for p in Precision],
        [o.value for o in OptimizerName],
        range(4),
        [1, 8, 64, 512, 4096],
        [False, True],  # offload optimizer (stages 1-3) / params too (stage 3)
        ["none", "selective", "full"],
        [1, 2, 4, 8, 16, 32],
        list(GPUS),
    )
    out: list[dict[str, object]] = []
    for prec, opt, stage, gpus, offload, ckpt, mb, gpu in axes:
        if offload and stage == 0:
            continue
        out.append(
            dict(
                **GPT3,
                precision=prec,
                optimizer=opt,
                zero_stage=stage,
                gpus=gpus,
                offload_optimizer=offload,
                offload_params=offload and stage == 3,
                checkpointing=ckpt,
                micro_batch=mb,
                gpu=gpu,
                tokens=300e9,
            )
        )
        if len(out) == count:
            break
    n_base = len(out)
    while len(out) < count:  # more than the product asked: vary the sequence length
        base = out[len(out) % n_base]
        out.append({**base, "seq_len": 1024 + len(out)})
    return out


def cpu_time_call(fn: Callable[[], object], number: int, repeat: int = 7) -> dict[str, float]:
    """Process CPU seconds per call of `fn` (`number` calls a batch, `repeat` batches): on a
    shared machine the CPU time is what the call costs, the wall time adds the waits for a
    core. Median and min per call."""
    per_call = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            fn()
        per_call.append((time.process_time() - start) / number)
    return {"median_seconds": statistics.median(per_call), "min_seconds": min(per_call)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=positive_int("--sweep"), default=100_000)
    parser.add_argument("--cli-runs", type=positive_int("--cli-runs"), default=7)
    args = parser.parse_args(argv)

    small = time_call(
        lambda: estimate_memory(n_params=7.5e9, precision="fp16", zero_stage=2, gpus=64)
    )
    full_kw = dict(
        **GPT3,
        precision="bf16",
        zero_stage=3,
        gpus=1024,
        checkpointing="full",
        gpu="h100-80gb",
        tokens=300e9,
        price_per_gpu_hour=2.5,
    )
    full = time_call(lambda: estimate_memory(**full_kw))  # type: ignore[arg-type]
    parallel_kw = dict(
        model="llama-3-70b",
        precision="bf16",
        zero_stage=1,
        gpus=512,
        tensor_parallel=8,
        pipeline_parallel=4,
        sequence_parallel=True,
        checkpointing="selective",
        gpu="h100-80gb",
        tokens=15e12,
        price_per_gpu_hour=2.5,
    )
    parallel = time_call(lambda: estimate_memory(**parallel_kw))  # type: ignore[arg-type]

    cpu = {
        name: cpu_time_call(fn, int(timed["calls_per_batch"]))
        for name, fn, timed in (
            (
                "n_params",
                lambda: estimate_memory(n_params=7.5e9, precision="fp16", zero_stage=2, gpus=64),
                small,
            ),
            ("full", lambda: estimate_memory(**full_kw), full),  # type: ignore[arg-type]
            ("preset_parallel", lambda: estimate_memory(**parallel_kw), parallel),  # type: ignore[arg-type]
        )
    }

    configs = sweep_configs(args.sweep)
    start = time.perf_counter()
    fits = 0
    for cfg in configs:
        fits += bool(estimate_memory(**cfg).fits)  # type: ignore[arg-type]
    sweep_seconds = time.perf_counter() - start

    cli = [
        sys.executable,
        "-m",
        "workbench.cli",
        "estimate",
        "--params",
        "7.5e9",
        "--precision",
        "fp16",
        "--zero",
        "2",
        "--gpus",
        "64",
        "--json",
    ]
    bare = [sys.executable, "-c", "pass"]

    def run(cmd: list[str]) -> None:
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)

    run(cli)  # warm the file cache and bytecode
    cli_wall = median_wall(lambda: run(cli), runs=args.cli_runs)
    bare_wall = median_wall(lambda: run(bare), runs=args.cli_runs)

    one = max(full["median_seconds"], parallel["median_seconds"])
    target = f"(target < {TARGET_SECONDS * 1e6:.0f} us)"
    for label, wall, name in (
        ("n_params only:       ", small, "n_params"),
        ("shape + GPU + compute:", full, "full"),
        ("preset + tp/pp/sp:    ", parallel, "preset_parallel"),
    ):
        print(
            f"one estimate, {label} {wall['median_seconds'] * 1e6:8.1f} us wall, "
            f"{cpu[name]['median_seconds'] * 1e6:8.1f} us CPU"
            + (f"  {target}" if name != "n_params" else "")
        )
    print(
        f"sweep of {len(configs):,} configurations: {sweep_seconds:8.2f} s "
        f"({sweep_seconds / len(configs) * 1e6:.1f} us each, {fits:,} fit)"
    )
    print(
        f"`workbench estimate` start-up (median of {args.cli_runs}): "
        f"{cli_wall['median_seconds'] * 1e3:.0f} ms; bare `python -c pass`: "
        f"{bare_wall['median_seconds'] * 1e3:.0f} ms "
        f"(ratio {cli_wall['median_seconds'] / bare_wall['median_seconds']:.2f})"
    )
    path = write_results(
        "estimator",
        {
            "target_one_estimate_seconds": TARGET_SECONDS,
            "one_estimate_n_params": small,
            "one_estimate_full": full,
            "one_estimate_preset_parallel": parallel,
            "one_estimate_cpu": cpu,
            "sweep": {
                "configurations": len(configs),
                "seconds": sweep_seconds,
                "seconds_per_estimate": sweep_seconds / len(configs),
                "fitting": fits,
            },
            "cli_startup": cli_wall,
            "python_startup": bare_wall,
            "cli_over_python_startup": cli_wall["median_seconds"] / bare_wall["median_seconds"],
            "met_target": one < TARGET_SECONDS,
        },
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0 if one < TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
