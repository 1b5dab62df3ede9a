"""What the Session adds to one optimizer step over a plain loop, and where it goes.

    .venv/bin/python benchmarks/step_cost.py [--steps 400] [--reps 7] [--threads 1]

On a tiny MLP (2 hidden layers of 64, micro-batch 32, fp32, AdamW: a step of about a
millisecond on one CPU thread, so the Session's fixed cost is what shows):

* the total: `--reps` interleaved pairs of a plain loop (DataLoader, forward, backward,
  `opt.step()`, `opt.zero_grad(set_to_none=True)`, `loss.item()`) and `Session.run()` for
  the same steps on the same data; the extra per step is the median Session step minus the
  median plain step, also as the median of the per-pair differences, and in process CPU
  time (less sensitive to other processes on a shared machine);
* the parts: each piece of the Session's step called on its own, on a live session, many
  times (`time_call`): the gradient norm, the memory reading, building the record, the
  history, the run log (no run folder, and a queue put with one), the change queue and the
  hooks (phase labels, callbacks, locks). The parts overlap the total; their sum is what the
  Session's own code costs, the rest of the difference is noise or cache effects.

Writes benchmarks/results/step_cost.json. Target: extra <= 0.1 ms per step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from _common import positive_int, time_call, write_results
from torch.utils.data import DataLoader

from workbench import Session, TrainConfig
from workbench.models import build_model
from workbench.train.history import History
from workbench.train.runlog import RunLog

TARGET_SECONDS = 1e-4
MICRO_BATCH = 32
MLP = dict(in_features=32, hidden=64, depth=2, out_features=8, samples=4096)


def plain_seconds(steps: int, seed: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per step of a hand-written loop, same model and data."""
    torch.manual_seed(seed)
    model, dataset, loss_fn, _ = build_model("mlp", seed=seed, **MLP)
    loader = DataLoader(
        dataset,
        batch_size=MICRO_BATCH,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    batches = iter(loader)

    def step() -> float:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(10):
        step()
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def _config(seed: int) -> TrainConfig:
    return TrainConfig(micro_batch=MICRO_BATCH, seed=seed, lr=1e-3, weight_decay=0.0)


def session_seconds(steps: int, seed: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per step of `Session.run()`."""
    with Session(_config(seed), model="mlp", model_options=dict(MLP), device="cpu") as s:
        s.run(10, progress=False)
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        s.run(steps, progress=False)
        return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def parts() -> dict[str, float]:
    """Seconds per call of each piece of the Session's step, on a live session."""
    out: dict[str, float] = {}
    with Session(_config(0), model="mlp", model_options=dict(MLP), device="cpu") as s:
        s.run(10, progress=False)
        rt = s._rt
        backend = rt.backend
        record = s.history[-1]

        def med(fn: Any) -> float:
            return time_call(fn, repeat=5, min_seconds=0.05)["median_seconds"]

        # gradients present, as between backward and the optimizer step
        x, y = rt.data.next()
        rt.loss_fn(backend.module(x), y).backward()
        norm = getattr(backend, "_norm_tensor", None) or backend._grad_norm  # before: a float
        out["grad_norm"] = med(norm)
        backend.zero_grad()
        out["memory_reading"] = med(rt.read_memory)
        measure = _measure_of(record)
        out["record"] = med(lambda: s._record(measure))
        history = History(list(s.history))
        out["history_append"] = med(lambda: history.append(record))
        out["run_log_no_folder"] = med(lambda: s._log(record))
        with tempfile.TemporaryDirectory() as folder:
            log = RunLog(f"{folder}/log.jsonl")
            out["run_log_put_with_folder"] = med(lambda: log.put(record))
            log.close()
        out["change_queue"] = med(
            lambda: (s._apply_pending(raise_errors=False), s._changes.for_record())
        )

        def hooks() -> None:
            for name in ("data", "forward", "backward", "optimizer"):
                with s._label(f"workbench.{name}"):
                    pass
            with s._step_lock, s._state_lock:
                callbacks = list(s._callbacks)
            for cb in callbacks:
                cb(record)

        out["hooks_and_locks"] = med(hooks)
    return out


def _measure_of(record: Any) -> Any:
    from workbench.train.backends import StepOutcome
    from workbench.train.step import StepMeasure

    outcome = StepOutcome(record.grad_norm, record.skipped, record.scale, record.lr)
    return StepMeasure(record.loss, outcome, record.step_seconds, record.data_seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int("--steps"), default=400)
    parser.add_argument("--reps", type=positive_int("--reps"), default=7)
    parser.add_argument("--threads", type=positive_int("--threads"), default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    plain, sess, plain_cpu, sess_cpu = [], [], [], []
    for rep in range(args.reps):  # interleaved: the machine may be shared
        for runs, cpus, fn in (
            (plain, plain_cpu, plain_seconds),
            (sess, sess_cpu, session_seconds),
        ):
            wall, cpu = fn(args.steps, rep)
            runs.append(wall)
            cpus.append(cpu)
    extra = statistics.median(sess) - statistics.median(plain)
    pair = statistics.median(s - p for s, p in zip(sess, plain, strict=True))
    cpu_extra = statistics.median(sess_cpu) - statistics.median(plain_cpu)
    costs = parts()
    results = {
        "model": f"mlp {MLP}, micro-batch {MICRO_BATCH}, fp32, adamw, cpu",
        "threads": args.threads,
        "steps": args.steps,
        "plain_seconds_per_step": plain,
        "session_seconds_per_step": sess,
        "plain_median_seconds": statistics.median(plain),
        "session_median_seconds": statistics.median(sess),
        "extra_seconds_per_step": extra,
        "pairwise_median_extra_seconds": pair,
        "plain_cpu_seconds_per_step": plain_cpu,
        "session_cpu_seconds_per_step": sess_cpu,
        "cpu_extra_seconds_per_step": cpu_extra,
        "target_extra_seconds": TARGET_SECONDS,
        "parts_seconds": costs,
    }
    print(
        f"plain {statistics.median(plain) * 1e3:.3f} ms/step, session "
        f"{statistics.median(sess) * 1e3:.3f} ms/step: extra {extra * 1e6:.0f} us "
        f"(pairwise median {pair * 1e6:.0f} us; target <= {TARGET_SECONDS * 1e6:.0f} us)"
    )
    print(f"  spread: plain {_spread(plain)}, session {_spread(sess)}")
    print(f"  process CPU time: extra {cpu_extra * 1e6:.0f} us per step")
    for name, seconds in costs.items():
        print(f"  {name:26s} {seconds * 1e6:7.1f} us")
    print(f"  {'sum of parts':26s} {sum(costs.values()) * 1e6:7.1f} us")
    path = write_results("step_cost", results)
    print(f"wrote {path}")
    return 0


def _spread(values: list[float]) -> str:
    return f"{min(values) * 1e3:.3f}-{max(values) * 1e3:.3f} ms"


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
