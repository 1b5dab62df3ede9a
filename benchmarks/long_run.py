"""Long runs: memory per step, checkpoint size and chart redraw time at 1,000 vs 1,000,000
steps, and what the run log costs the training thread.

    .venv/bin/python benchmarks/long_run.py [--steps 1000000]

1. History: `--steps` synthetic StepRecords (realistic values, a loss spike now and then)
   appended to a Session's `History`; the memory it holds (tracemalloc, after a garbage
   collection) at 1k, 10k, 100k and `--steps` steps. For scale, a plain list of the first
   10k records (what `session.history` was): bytes per step.
2. Log: the same records through a `RunLog` into a temporary folder (deleted after):
   microseconds per record on the caller's thread (the queue put, what the training thread
   pays) and on the writer thread (JSON and the write), and the log's bytes per step.
3. Checkpoint: a real tiny-gpt Session trained 1,000 steps and saved; the same checkpoint
   with every step counter at `--steps` (step, optimizer and schedule steps, data epoch),
   saved again. The two sizes (target: within 10%). For contrast, the previous format
   (the records inside the checkpoint) with 1k and 100k steps' records.
4. Redraw: TrainingPanels over session stand-ins whose histories receive the records, one
   at 1k steps and one at `--steps`, ticked in turns (`--ticks` pairs, each panel first in
   half of them): the median time of a refresh tick that redraws (one new step each), the
   median of the per-pair ratio (target: within 10%), and the points the loss chart draws.

Writes benchmarks/results/long_run.json.
"""

from __future__ import annotations

import argparse
import gc
import io
import math
import random
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import positive_int, write_results

FLAT_TARGET = 1.10  # checkpoint size and redraw time: 1M steps within 10% of 1k steps
MARKS = (1_000, 10_000, 100_000)
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16}


def synthetic_records(n: int, seed: int = 0) -> Iterator[Any]:
    """StepRecords as a long tiny-gpt run writes them: a decaying noisy loss with a spike
    every ~50k steps, noisy throughput and step times, the memory fields filled."""
    from workbench.train.records import StepRecord

    rng = random.Random(seed)
    t0 = 1.8e9
    for step in range(1, n + 1):
        loss = 4.0 * math.exp(-step / 200_000) + 0.5 + rng.gauss(0, 0.02)
        if rng.random() < 2e-5:
            loss *= 5.0
        step_s = 0.05 + abs(rng.gauss(0, 0.003))
        data_s = 0.004 + abs(rng.gauss(0, 0.001))
        yield StepRecord(
            step=step,
            micro_steps=4,
            loss=loss,
            samples_per_s=32 / step_s,
            tokens_per_s=32 * 256 / step_s,
            step_seconds=step_s,
            data_seconds=data_s,
            compute_seconds=step_s - data_s,
            lr=3e-4,
            grad_norm=1.0 + rng.random(),
            scale=None,
            skipped=False,
            precision="amp-bf16",
            micro_batch=8,
            grad_accum=4,
            zero_stage=0,
            params_bytes=40_000_000,
            grads_bytes=40_000_000,
            optimizer_bytes=80_000_000,
            rss_bytes=2_000_000_000 + rng.randrange(1 << 20),
            cpu_util_percent=90.0 + rng.random(),
            wall_time=t0 + step * step_s,
        )


# --------------------------------------------------------------------------- 1. history
def bench_history(steps: int) -> dict[str, Any]:
    from workbench.train.history import History

    marks = sorted({m for m in MARKS if m < steps} | {steps})
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    plain: list[Any] = []
    for r in synthetic_records(10_000):
        plain.append(r)
    gc.collect()
    list_bytes = tracemalloc.get_traced_memory()[0] - base
    del plain, r
    gc.collect()

    base = tracemalloc.get_traced_memory()[0]
    history = History()
    held: dict[int, int] = {}
    kept: dict[int, int] = {}
    for r in synthetic_records(steps):
        history.append(r)
        if r.step in marks:
            gc.collect()
            held[r.step] = tracemalloc.get_traced_memory()[0] - base
            kept[r.step] = len(history)
    del r
    tracemalloc.stop()
    per_record = list_bytes / 10_000
    limit = history.recent_limit + 2 * (history.bucket_limit + 1)
    return {
        "list_bytes_per_step": per_record,
        "list_bytes_at_steps_extrapolated": per_record * steps,
        "history_bytes": {str(k): v for k, v in held.items()},
        "history_records_kept": {str(k): v for k, v in kept.items()},
        "history_records_limit": limit,
        "history_bytes_per_step": held[steps] / steps,
        "bounded": max(held.values()) <= 1.1 * limit * per_record,
    }


# --------------------------------------------------------------------------- 2. log
def bench_log(steps: int) -> dict[str, Any]:
    from workbench.train.runlog import RunLog

    class TimedLog(RunLog):
        writer_seconds = 0.0

        def _write(self, items: list[Any]) -> None:
            start = time.thread_time()
            super()._write(items)
            TimedLog.writer_seconds += time.thread_time() - start

    folder = Path(tempfile.mkdtemp(prefix="workbench-long-run-"))
    try:
        log = TimedLog(folder / "log.jsonl", name="bench")
        put_seconds = 0.0
        batch = 5_000  # below the queue's limit: puts never wait for the writer here
        for i, r in enumerate(synthetic_records(steps), 1):
            start = time.perf_counter()
            log.put(r)
            put_seconds += time.perf_counter() - start
            if i % batch == 0:
                log.flush()
        log.close()
        size = (folder / "log.jsonl").stat().st_size
        lines = log.written
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "records": lines,
        "caller_us_per_record": put_seconds / steps * 1e6,
        "writer_us_per_record": TimedLog.writer_seconds / steps * 1e6,
        "log_bytes_per_step": size / steps,
    }


# --------------------------------------------------------------------------- 3. checkpoint
def bench_checkpoint(steps: int) -> dict[str, Any]:
    import torch

    from workbench import Session, TrainConfig
    from workbench.train import checkpoints as ckpt

    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="workbench-long-run-"))
    try:
        cfg = TrainConfig(micro_batch=1, seed=0, checkpoint_dir=str(folder / "run"))
        start = time.perf_counter()
        with Session(cfg, model_options=TINY) as s:
            s.run(1_000, progress=False)
            path = Path(s.save_checkpoint())
        train_seconds = time.perf_counter() - start
        small = path.stat().st_size + path.with_suffix(".json").stat().st_size

        # the same state with every counter at `steps`
        payload = ckpt.load(path)
        payload.pop("path")
        manifest = payload.pop("manifest")
        describe = {k: manifest[k] for k in ("model", "world_size", "rank", "log")}
        payload["step"] = steps
        backend = payload["backend"]
        backend["steps"] = backend["scheduler"]["steps"] = steps
        for state in backend["optimizer"]["state"].values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"].fill_(float(steps))
        payload["data"]["epoch"] = steps // 1_000
        big_path = ckpt.save(
            payload, folder / "big" / ckpt.checkpoint_name(steps), describe=describe
        )
        big = big_path.stat().st_size + big_path.with_suffix(".json").stat().st_size

        # the previous format: the records inside
        def previous_format_bytes(n: int) -> int:
            buffer = io.BytesIO()
            history = [r.to_dict() for r in synthetic_records(n)]
            torch.save({**payload, "format": 1, "history": history}, buffer)
            return len(buffer.getvalue())

        old_small, old_big = previous_format_bytes(1_000), previous_format_bytes(100_000)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "train_1k_steps_seconds": train_seconds,
        "bytes_at_1k": small,
        f"bytes_at_{steps}": big,
        "ratio": big / small,
        "flat": abs(big / small - 1) <= FLAT_TARGET - 1,
        "previous_format_bytes_at_1k": old_small,
        "previous_format_bytes_at_100k": old_big,
        "previous_format_bytes_per_step": (old_big - old_small) / 99_000,
    }


# --------------------------------------------------------------------------- 4. redraw
class RecordedSession:
    """What the training panel reads of a Session, over a History of given records."""

    def __init__(self) -> None:
        from workbench import TrainConfig
        from workbench.train.history import History

        self.config = TrainConfig(micro_batch=8, grad_accum=4, precision="amp-bf16")
        self.state = "running"
        self.history = History()
        self.version = 0
        self.failure = None
        self.pending_changes: dict[str, Any] = {}

    def add(self, record: Any) -> None:
        self.history.append(record)
        self.version += 1

    def records_since(self, index: int) -> list[Any]:
        return self.history.since(index)

    def events_since(self, index: int) -> list[Any]:
        return []

    def update(self, **changes: Any) -> None:
        raise ValueError("read-only")

    def start(self) -> None: ...

    def stop(self) -> None: ...


def bench_redraw(steps: int, ticks: int) -> dict[str, Any]:
    """Two panels, one over a 1k-step run and one over a `steps`-step run, ticked in
    turns (so the machine's load drifts the same way for both)."""
    from workbench.ui import TrainingPanel
    from workbench.ui.charts import SERIES_POINTS

    runs = {"1k": 1_000, "end": steps}
    sessions = {k: RecordedSession() for k in runs}
    panels = {
        k: TrainingPanel(s, autostart=False, measure_memory=False) for k, s in sessions.items()
    }
    streams = {k: synthetic_records(n + ticks + 1) for k, n in runs.items()}
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    try:
        for k, n in runs.items():
            session, panel, records = sessions[k], panels[k], streams[k]
            while session.history.total < n:
                for _ in range(min(1_000, n - session.history.total)):
                    session.add(next(records))
                panel.refresh()  # the panel keeps up, drawing within its time budget
            panel.refresh(draw_now=True)
        for i in range(ticks):
            for k in list(runs)[:: 1 if i % 2 else -1]:  # each goes first in half the pairs
                sessions[k].add(next(streams[k]))  # one new step, then a tick that redraws
                start = time.perf_counter()
                panels[k].refresh(draw_now=True)
                seconds[k].append(time.perf_counter() - start)
        result: dict[str, Any] = {}
        for k in runs:
            result[f"tick_seconds_at_{k}"] = statistics.median(seconds[k])
            result[f"loss_points_at_{k}"] = len(panels[k].chart_data()["steps"])
            result[f"panel_records_kept_at_{k}"] = len(panels[k].records)
        result["chart_points_bound"] = SERIES_POINTS + 1
        result["ratio"] = statistics.median(
            b / a for a, b in zip(seconds["1k"], seconds["end"], strict=True)
        )
    finally:
        for panel in panels.values():
            panel.close()
    result["flat"] = result["ratio"] <= FLAT_TARGET
    return result


# --------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int("--steps"), default=1_000_000)
    parser.add_argument("--ticks", type=positive_int("--ticks"), default=100)
    args = parser.parse_args()
    steps = max(args.steps, 2_000)

    history = bench_history(steps)
    print(
        f"history: {history['history_bytes_per_step']:.1f} bytes per step at {steps:,} steps "
        f"({history['history_bytes'][str(steps)] / 1e6:.1f} MB held, "
        f"{history['history_records_kept'][str(steps)]:,} records kept of at most "
        f"{history['history_records_limit']:,}); a plain list holds "
        f"{history['list_bytes_per_step']:.0f} bytes per step "
        f"({history['list_bytes_at_steps_extrapolated'] / 1e9:.2f} GB at {steps:,}); "
        f"bounded: {history['bounded']}"
    )
    log = bench_log(steps)
    print(
        f"log: {log['caller_us_per_record']:.2f} us per record on the training thread, "
        f"{log['writer_us_per_record']:.1f} us on the writer thread; "
        f"{log['log_bytes_per_step']:.0f} bytes per step on disk"
    )
    checkpoint = bench_checkpoint(steps)
    print(
        f"checkpoint: {checkpoint['bytes_at_1k']:,} bytes at 1k steps, "
        f"{checkpoint[f'bytes_at_{steps}']:,} at {steps:,}: ratio {checkpoint['ratio']:.4f} "
        f"(target within {FLAT_TARGET - 1:.0%}); the previous format grew "
        f"{checkpoint['previous_format_bytes_per_step']:.0f} bytes per step "
        f"({checkpoint['previous_format_bytes_at_1k']:,} at 1k, "
        f"{checkpoint['previous_format_bytes_at_100k']:,} at 100k)"
    )
    redraw = bench_redraw(steps, args.ticks)
    print(
        f"redraw: a refresh tick with a redraw takes {redraw['tick_seconds_at_1k'] * 1e3:.1f} ms "
        f"at 1k steps ({redraw['loss_points_at_1k']} loss points), "
        f"{redraw['tick_seconds_at_end'] * 1e3:.1f} ms at {steps:,} "
        f"({redraw['loss_points_at_end']} points): ratio {redraw['ratio']:.3f} "
        f"(target <= {FLAT_TARGET})"
    )
    path = write_results(
        "long_run",
        {
            "steps": steps,
            "history": history,
            "log": log,
            "checkpoint": checkpoint,
            "redraw": redraw,
            "targets": {"flat_ratio": FLAT_TARGET},
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
