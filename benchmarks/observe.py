"""What observing a run costs: the same Trainer with and without the workbench's callback.

    .venv/bin/python benchmarks/observe.py [--steps 30] [--reps 5]

A Hugging Face `Trainer` (GPT-2, 2 layers, hidden 64, micro-batch 4, 32 tokens, CPU) and
a Lightning `Trainer` (tiny-gpt, 2 layers, hidden 64) each train `--steps` optimizer
steps with `WorkbenchTrainerCallback` / `WorkbenchLightningCallback` and without, in
`--reps` interleaved pairs (back to back, so a shared machine's load changes both alike;
the order within a pair alternates). The time is the trainer's whole `train()` / `fit()`
call after one warm-up run of each. The ratio with / without is reported per pair and as
the median of the pairs' ratios: the callback's cost per step is one host read of the
loss and gradient norm, the norm itself, and a few microseconds of bookkeeping; the
target is <= 1.01 on these tiny models, whose steps take a few milliseconds.

Writes benchmarks/results/observe.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch
from _common import positive_int, write_results

VOCAB = 128


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seq: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, VOCAB, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def hf_run(steps: int, observed: bool, out: str) -> float:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from workbench.integrations import WorkbenchTrainerCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=4,
        max_steps=steps,
        logging_steps=10**6,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    callbacks = [WorkbenchTrainerCallback()] if observed else []
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(4 * steps), callbacks=callbacks)
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def lightning_run(steps: int, observed: bool) -> float:
    import lightning as L

    from workbench.integrations import WorkbenchLightningCallback
    from workbench.models import build_model

    model, data, loss_fn, _ = build_model("tiny-gpt", layers=2, hidden=64, heads=4, seq_len=32)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            return loss_fn(self.model(x), y)  # type: ignore[no-any-return]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WorkbenchLightningCallback()] if observed else [],
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    start = time.perf_counter()
    trainer.fit(Module(), loader)
    return time.perf_counter() - start


def pairs(run: Any, reps: int) -> dict[str, Any]:
    run(False), run(True)  # warm-up: imports, first kernels
    rows = []
    for rep in range(reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        seconds = {observed: run(observed) for observed in order}
        rows.append(
            {
                "without_s": seconds[False],
                "with_s": seconds[True],
                "ratio": seconds[True] / seconds[False],
            }
        )
    return {
        "pairs": rows,
        "ratio_median": statistics.median(r["ratio"] for r in rows),
        "without_median_s": statistics.median(r["without_s"] for r in rows),
        "with_median_s": statistics.median(r["with_s"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int("--steps"), default=30)
    parser.add_argument("--reps", type=positive_int("--reps"), default=5)
    a = parser.parse_args()
    torch.set_num_threads(1)  # steady timings on a shared machine
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as out:
        hf = pairs(lambda observed: hf_run(a.steps, observed, out), a.reps)
    pl = pairs(lambda observed: lightning_run(a.steps, observed), a.reps)
    results = {
        "steps": a.steps,
        "reps": a.reps,
        "threads": 1,
        "transformers_trainer": hf,
        "lightning_trainer": pl,
    }
    path = write_results("observe", results)
    for name, r in (("transformers Trainer", hf), ("Lightning Trainer", pl)):
        per_step = (r["with_median_s"] - r["without_median_s"]) / a.steps
        print(
            f"{name}: with / without the callback = {r['ratio_median']:.4f} (median of "
            f"{a.reps} pairs; {r['without_median_s'] / a.steps * 1e3:.2f} ms a step without, "
            f"{per_step * 1e6:+.0f} us a step with)"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
