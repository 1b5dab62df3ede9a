"""What observing a run costs: the same Trainer with and without the workbench's callback.

    .venv/bin/python benchmarks/observe.py [--steps 3000] [--runs 3] [--block 16] [--reps 5]

A Hugging Face `Trainer` (GPT-2, 2 layers, hidden 64, micro-batch 4, 32 tokens, CPU) and a
Lightning `Trainer` (tiny-gpt, 2 layers, hidden 64, micro-batch 4) each train with
`WorkbenchTrainerCallback` / `WorkbenchLightningCallback` and without it.

The hot path, in each of `--runs` runs of `--steps` optimizer steps: the callback is in the
trainer's list of callbacks for `--block` steps, then out of it for `--block` steps, and so on (a
timer callback, in both halves, takes each step's end time and moves the workbench's in or
out; out, the `Trainer` callback's forward hook is removed too). Each step's time is
counted with the half it ran in, so a shared machine's slow drifts fall on both halves
alike, which separate runs cannot give: on this 2-core machine two identical runs differ
by 1-5%, more than the callback costs. A run's ratio is its mean step time with / without
(the first two blocks left out); the runs differ by a few tenths of a percent (where a
run's objects land in memory), so the ratio reported is the mean of the runs'. The
difference is what the callback adds to a step, Lightning's or transformers' own calls
of its hooks included, every host read of the pending losses (every `FLUSH_EVERY` steps),
the gradient norm (`grad_norm="auto"`, the default: every step while it costs under 0.1%
of the step, else every k-th) and the process RSS (read at most every 0.25 s).

Also reported: `--reps` interleaved pairs of whole `train()` / `fit()` runs of `--steps`
// 10 steps (start-up included, with that run-to-run noise), and the microseconds a step
spends inside the callback's own hooks (perf_counter around each call, one observed run).
The target is <= 1.01 on these tiny models, whose steps take a few milliseconds.

Writes benchmarks/results/observe.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
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


class Halves:
    """Each step's time, in the half (callback in / out) it ran in; `switch(step)` says
    whether to move the callback at the end of `step`."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.active = True
        self.last: float | None = None
        self.times: dict[bool, list[float]] = {True: [], False: []}

    def tick(self, step: int) -> bool:
        now = time.perf_counter()
        if self.last is not None:
            self.times[self.active].append(now - self.last)
        self.last = now
        if step % self.block == 0:
            self.active = not self.active
            return True
        return False

    def summary(self, warmup: int) -> dict[str, Any]:
        # the first steps (kernels, allocator) are left out of both halves
        skip = warmup // 2
        on, off = self.times[True][skip:], self.times[False][skip:]
        mean_on, mean_off = statistics.fmean(on), statistics.fmean(off)
        # the ratio is of mean steps (all seconds over the steps); the medians compare the
        # typical step of each half beside it
        med_on, med_off = statistics.median(on), statistics.median(off)
        return {
            "steps_with": len(on),
            "steps_without": len(off),
            "step_ms_with": 1e3 * mean_on,
            "step_ms_without": 1e3 * mean_off,
            "ratio": mean_on / mean_off,
            "us_per_step": 1e6 * (mean_on - mean_off),
            "ratio_of_medians": med_on / med_off,
        }


def hf_trainer(steps: int, callbacks: list[Any], out: str) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

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
    return Trainer(model=model, args=args, train_dataset=Tokens(4 * steps), callbacks=callbacks)


def hf_run(steps: int, observed: bool, out: str) -> float:
    from workbench.integrations import WorkbenchTrainerCallback

    callbacks = [WorkbenchTrainerCallback()] if observed else []
    trainer = hf_trainer(steps, callbacks, out)
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def hf_hot_path(steps: int, block: int, out: str) -> dict[str, Any]:
    from transformers import TrainerCallback

    from workbench.integrations import WorkbenchTrainerCallback

    halves = Halves(block)
    workbench = WorkbenchTrainerCallback()
    holder: dict[str, Any] = {}

    class Timer(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not halves.tick(state.global_step):
                return
            handler = holder["trainer"].callback_handler
            # a new list: the one the trainer is calling this hook from stays as it is
            if halves.active:  # back in: its forward hook too, its clock restarted
                handler.callbacks = [workbench, *handler.callbacks]
                workbench._hook = kwargs["model"].register_forward_hook(
                    workbench._capture, with_kwargs=True
                )
                workbench.observer._last_end = None
            else:
                handler.callbacks = [c for c in handler.callbacks if c is not workbench]
                workbench._hook.remove()

    trainer = hf_trainer(steps, [workbench, Timer()], out)
    holder["trainer"] = trainer
    trainer.train()
    return halves.summary(2 * block)


def lightning_trainer(steps: int, callbacks: list[Any]) -> tuple[Any, Any, Any]:
    import lightning as L

    from workbench.models import build_model

    torch.manual_seed(0)
    model, data, loss_fn, _ = build_model("tiny-gpt", layers=2, hidden=64, heads=4, seq_len=32)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            return loss_fn(self.model(x), y)  # type: ignore[no-any-return,unused-ignore]

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
        callbacks=callbacks,
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    return trainer, Module(), loader


def lightning_run(steps: int, observed: bool, grad_norm: bool | str = "auto") -> float:
    from workbench.integrations import WorkbenchLightningCallback

    callbacks = [WorkbenchLightningCallback(grad_norm=grad_norm)] if observed else []
    trainer, module, loader = lightning_trainer(steps, callbacks)
    start = time.perf_counter()
    trainer.fit(module, loader)
    return time.perf_counter() - start


def lightning_hot_path(steps: int, block: int) -> dict[str, Any]:
    import lightning as L

    from workbench.integrations import WorkbenchLightningCallback

    halves = Halves(block)
    workbench = WorkbenchLightningCallback()

    class Timer(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if not halves.tick(trainer.global_step):
                return
            # a new list: the one Lightning is calling this hook from stays as it is
            if halves.active:  # back in, its clock restarted
                trainer.callbacks = [workbench, *trainer.callbacks]
                workbench.observer._last_end = None
            else:
                trainer.callbacks = [c for c in trainer.callbacks if c is not workbench]

    trainer, module, loader = lightning_trainer(steps, [workbench, Timer()])
    trainer.fit(module, loader)
    return halves.summary(2 * block)


def runs(hot_path: Callable[[], dict[str, Any]], n: int) -> dict[str, Any]:
    """`n` hot-path runs: each run's figures, and the mean of their ratios and costs."""
    each = [hot_path() for _ in range(n)]
    return {
        "ratio": statistics.fmean(r["ratio"] for r in each),
        "ratios": [r["ratio"] for r in each],
        "us_per_step": statistics.fmean(r["us_per_step"] for r in each),
        "step_ms_without": statistics.fmean(r["step_ms_without"] for r in each),
        "runs": each,
    }


def hook_seconds(cls: Any, run: Callable[[bool], Any], steps: int, micro: bool) -> float:
    """Seconds per step spent inside the callback's own hooks (and, `micro`, in the
    Observer's `micro_batch`, which the `Trainer` callback's forward hook calls), timed with
    perf_counter around each call in one observed run."""
    from workbench.integrations import observer

    spent = [0.0]
    # the hooks it has (those it leaves None, Lightning does not call)
    names = [n for n, f in vars(cls).items() if n.startswith("on_") and callable(f)]
    originals = {n: getattr(cls, n) for n in names}
    micro_batch = observer.Observer.micro_batch

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
        if micro:
            observer.Observer.micro_batch = timed(micro_batch)  # type: ignore[method-assign]
        run(True)
    finally:
        for n in names:
            setattr(cls, n, originals[n])
        observer.Observer.micro_batch = micro_batch  # type: ignore[method-assign]
    return spent[0] / steps


def pairs(run: Callable[[bool], float], reps: int) -> dict[str, Any]:
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
    parser.add_argument("--steps", type=positive_int("--steps"), default=3000)
    parser.add_argument("--runs", type=positive_int("--runs"), default=3)
    parser.add_argument("--block", type=positive_int("--block"), default=16)
    parser.add_argument("--reps", type=positive_int("--reps"), default=5)
    a = parser.parse_args()
    if a.steps < 8 * a.block:
        parser.error(f"--steps {a.steps}: must be at least 8 blocks (--block {a.block})")
    torch.set_num_threads(1)  # steady timings on a shared machine
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from workbench.integrations import WorkbenchLightningCallback, WorkbenchTrainerCallback

    short = max(a.steps // 10, 2 * a.block)
    with tempfile.TemporaryDirectory() as out:
        hf: dict[str, Any] = {"hot_path": runs(lambda: hf_hot_path(a.steps, a.block, out), a.runs)}
        hf["whole_runs"] = pairs(lambda observed: hf_run(short, observed, out), a.reps)
        hf["hook_us_per_step"] = 1e6 * hook_seconds(
            WorkbenchTrainerCallback, lambda o: hf_run(short, o, out), short, micro=True
        )
    pl: dict[str, Any] = {"hot_path": runs(lambda: lightning_hot_path(a.steps, a.block), a.runs)}
    pl["whole_runs"] = pairs(lambda observed: lightning_run(short, observed), a.reps)
    pl["hook_us_per_step"] = 1e6 * hook_seconds(
        WorkbenchLightningCallback, lambda o: lightning_run(short, o), short, micro=False
    )
    # the gradient norm (the advisor's spike rule reads it) is the costly part on a model
    # of many small tensors: the hooks timed without it too
    pl["hook_us_per_step_without_grad_norm"] = 1e6 * hook_seconds(
        WorkbenchLightningCallback,
        lambda o: lightning_run(short, o, grad_norm=False),
        short,
        micro=False,
    )
    results = {
        "steps": a.steps,
        "runs": a.runs,
        "block": a.block,
        "whole_run_steps": short,
        "reps": a.reps,
        "threads": 1,
        "transformers_trainer": hf,
        "lightning_trainer": pl,
    }
    path = write_results("observe", results)
    for name, r in (("transformers Trainer", hf), ("Lightning Trainer", pl)):
        hot, whole = r["hot_path"], r["whole_runs"]
        print(
            f"{name}: with / without the callback = {hot['ratio']:.4f} on the hot path (mean of "
            f"{a.runs} runs: {', '.join(f'{x:.4f}' for x in hot['ratios'])}; "
            f"{hot['step_ms_without']:.2f} ms a step without, {hot['us_per_step']:+.0f} us "
            f"with); whole runs of {short} steps: {whole['ratio_median']:.4f} (median of "
            f"{a.reps} pairs); inside the callback's hooks: {r['hook_us_per_step']:.0f} us a step"
        )
    print(
        f"Lightning Trainer without the gradient norm (grad_norm=False): "
        f"{pl['hook_us_per_step_without_grad_norm']:.0f} us a step inside the hooks"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
