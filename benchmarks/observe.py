"""What observing a run costs: the same Trainer with and without the workbench's callback.

    .venv/bin/python benchmarks/observe.py [--steps 30] [--reps 5]

A Hugging Face `Trainer` (GPT-2, 2 layers, hidden 64, micro-batch 4, 32 tokens, CPU) and
a Lightning `Trainer` (tiny-gpt, 2 layers, hidden 64) each train `--steps` optimizer
steps with `WorkbenchTrainerCallback` / `WorkbenchLightningCallback` and without, in
`--reps` interleaved pairs (back to back, so a shared machine's load changes both alike;
the order within a pair alternates). The time is the trainer's whole `train()` / `fit()`
call after one warm-up run of each. The ratio with / without is reported per pair and as
the median of the pairs' ratios. On a shared 2-core machine single pairs vary by several
percent either way, more than the callback costs, so one more observed run times what is
spent inside the callback's hooks themselves (perf_counter around each call): the
bookkeeping of a step, the host read of the pending steps' losses (every `FLUSH_EVERY`
steps), the gradient norm where the callback takes it (`grad_norm="auto"`, the default:
every step while it costs under 0.2% of the step, else every k-th; the Lightning run is
timed with `grad_norm=False` too) and the process RSS (read at most every 50 ms). The
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


def lightning_run(steps: int, observed: bool, grad_norm: bool | str = "auto") -> float:
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
        callbacks=[WorkbenchLightningCallback(grad_norm=grad_norm)] if observed else [],
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    start = time.perf_counter()
    trainer.fit(Module(), loader)
    return time.perf_counter() - start


def hook_seconds(cls: Any, run: Any, steps: int) -> float:
    """Seconds per step spent inside the callback's own hooks (and the forward hook it
    puts on the model), timed with perf_counter around each call in one observed run."""
    from workbench.integrations import observer

    spent = [0.0]
    names = [n for n in vars(cls) if n.startswith("on_")]
    originals = {n: getattr(cls, n) for n in names}
    micro = observer.Observer.micro_batch

    def timed(f: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        return call

    try:
        for n in names:
            setattr(cls, n, timed(originals[n]))
        observer.Observer.micro_batch = timed(micro)  # type: ignore[method-assign]
        run(True)
    finally:
        for n in names:
            setattr(cls, n, originals[n])
        observer.Observer.micro_batch = micro  # type: ignore[method-assign]
    return spent[0] / steps


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
    from workbench.integrations import WorkbenchLightningCallback, WorkbenchTrainerCallback

    with tempfile.TemporaryDirectory() as out:
        hf = pairs(lambda observed: hf_run(a.steps, observed, out), a.reps)
        hf["hook_us_per_step"] = 1e6 * hook_seconds(
            WorkbenchTrainerCallback, lambda o: hf_run(a.steps, o, out), a.steps
        )
    pl = pairs(lambda observed: lightning_run(a.steps, observed), a.reps)
    pl["hook_us_per_step"] = 1e6 * hook_seconds(
        WorkbenchLightningCallback, lambda o: lightning_run(a.steps, o), a.steps
    )
    # the gradient norm (the advisor's spike rule reads it) is most of the Lightning
    # callback's cost on a model of many small tensors: timed without it too
    pl["hook_us_per_step_without_grad_norm"] = 1e6 * hook_seconds(
        WorkbenchLightningCallback, lambda o: lightning_run(a.steps, o, grad_norm=False), a.steps
    )
    for r in (hf, pl):
        r["hook_share_of_step"] = r["hook_us_per_step"] * 1e-6 / (r["without_median_s"] / a.steps)
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
            f"{per_step * 1e6:+.0f} us a step with); inside the callback's hooks: "
            f"{r['hook_us_per_step']:.0f} us a step = {r['hook_share_of_step']:.2%} of a step"
        )
    print(
        f"Lightning Trainer without the gradient norm (grad_norm=False): "
        f"{pl['hook_us_per_step_without_grad_norm']:.0f} us a step inside the hooks"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
