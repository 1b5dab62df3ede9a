"""What sequence packing buys on the built-in text: real tokens per second, packed vs padded.

    .venv/bin/python benchmarks/packing.py [--steps 10] [--reps 5] [--seq-len 1024]

tiny-gpt (2 layers, hidden 64, 4 heads) on the sonnets at `--seq-len`, micro-batch 4, fp32,
trained by a Session for `--steps` steps with `documents="padded"` (one sonnet per
sample, padded) and `documents="packed"` (sonnets packed into each sample), `--reps`
interleaved pairs. Every sample costs the same compute in both layouts (the same shapes),
so what differs is how many of its tokens are real: a step's real tokens are counted from
the very batches the Session read (its data stream replayed from the same seed), and
real tokens per second = those / the steps' measured seconds (the first two steps of each
run, warm-up, left out). The ratio packed / padded is the payoff, reported as the median
of the interleaved pairs' ratios (each pair ran back to back, so a shared machine's load
changes both alike); the padding fraction of each layout (`Session.data_report()`)
predicts it: (1 - packed's) / (1 - padded's) when the step time is the same, and the
pairs' step-time ratio says how far that holds. Per second of this process's CPU time
too (`time.process_time()` over the timed steps), which other processes on a shared
machine disturb far less than the wall clock.

Writes benchmarks/results/packing.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from _common import positive_int, write_results

from workbench import Session, TrainConfig
from workbench.train.data import DataStream

MICRO_BATCH = 4
WARMUP = 2
MODEL = {"layers": 2, "hidden": 64, "heads": 4}


def real_tokens(session: Session, steps: int) -> list[int]:
    """Each step's real (not padding) input tokens, from the Session's own data order."""
    stream = DataStream(session.data, micro_batch=MICRO_BATCH, seed=int(session.config.seed))
    try:
        return [int((stream.next()["doc_ids"] >= 0).sum()) for _ in range(steps)]
    finally:
        stream.close()


def one_run(layout: str, steps: int, seq_len: int, seed: int) -> dict[str, Any]:
    config = TrainConfig(documents=layout, micro_batch=MICRO_BATCH, seed=seed)
    with Session(config, model_options={**MODEL, "seq_len": seq_len}, device="cpu") as session:
        report = session.data_report()
        session.run(WARMUP, progress=False)
        cpu = time.process_time()
        timed = session.run(steps, progress=False)
        cpu_seconds = time.process_time() - cpu
        real = real_tokens(session, steps + WARMUP)[WARMUP:]
    seconds = sum(r.step_seconds for r in timed)
    slots = steps * MICRO_BATCH * seq_len
    return {
        "padding_fraction": report.padding_fraction,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "real_tokens": sum(real),
        "slot_tokens": slots,
        "real_tokens_per_s": sum(real) / seconds,
        "slot_tokens_per_s": slots / seconds,
        "real_tokens_per_cpu_s": sum(real) / cpu_seconds,
        "slot_tokens_per_cpu_s": slots / cpu_seconds,
        "final_loss": timed[-1].loss,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int("--steps"), default=10)
    parser.add_argument("--reps", type=positive_int("--reps"), default=5)
    parser.add_argument("--seq-len", type=positive_int("--seq-len"), default=1024)
    parser.add_argument("--threads", type=positive_int("--threads"), default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs: dict[str, list[dict[str, Any]]] = {"padded": [], "packed": []}
    for rep in range(args.reps):  # interleaved, the order alternating: the machine may be shared
        for layout in list(runs)[:: 1 if rep % 2 else -1]:
            runs[layout].append(one_run(layout, args.steps, args.seq_len, rep))

    def median(layout: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[layout])

    pairs = list(zip(runs["packed"], runs["padded"], strict=True))
    ratio = statistics.median(a["real_tokens_per_s"] / b["real_tokens_per_s"] for a, b in pairs)
    cpu_ratio = statistics.median(
        a["real_tokens_per_cpu_s"] / b["real_tokens_per_cpu_s"] for a, b in pairs
    )
    cpu_slot_ratio = statistics.median(
        a["slot_tokens_per_cpu_s"] / b["slot_tokens_per_cpu_s"] for a, b in pairs
    )
    slot_ratio = statistics.median(
        a["slot_tokens_per_s"] / b["slot_tokens_per_s"] for a, b in pairs
    )
    padded_pad = runs["padded"][0]["padding_fraction"]
    packed_pad = runs["packed"][0]["padding_fraction"]
    predicted = (1 - packed_pad) / (1 - padded_pad)
    results = {
        "model": f"tiny-gpt {MODEL}, seq_len {args.seq_len}, micro-batch {MICRO_BATCH}, fp32, cpu",
        "threads": args.threads,
        "steps": args.steps,
        "runs": runs,
        "padding_fraction": {"padded": padded_pad, "packed": packed_pad},
        "real_tokens_per_s_median": {k: median(k, "real_tokens_per_s") for k in runs},
        "pair_ratios_real_tokens_per_s": [
            a["real_tokens_per_s"] / b["real_tokens_per_s"] for a, b in pairs
        ],
        "real_tokens_per_s_ratio_packed_over_padded": ratio,
        "real_tokens_per_cpu_s_ratio_packed_over_padded": cpu_ratio,
        "slot_tokens_per_cpu_s_ratio_packed_over_padded": cpu_slot_ratio,
        "slot_tokens_per_s_ratio_packed_over_padded": slot_ratio,
        "predicted_ratio_from_padding": predicted,
    }
    print(
        f"padding: padded {padded_pad:.1%}, packed {packed_pad:.1%}; real tokens/s: padded "
        f"{median('padded', 'real_tokens_per_s'):,.0f}, packed "
        f"{median('packed', 'real_tokens_per_s'):,.0f}: x{ratio:.2f} (median of {args.reps} "
        f"pairs; from the padding x{predicted:.2f}; all tokens/s x{slot_ratio:.2f}); per "
        f"process CPU second x{cpu_ratio:.2f} (all tokens x{cpu_slot_ratio:.2f})"
    )
    path = write_results("packing", results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
