"""The Session beside the trainers users compare it with: same models, data and steps.

    .venv/bin/python benchmarks/anchors.py [--reps 5] [--threads 1] [--device cpu|cuda]
                                           [--only NAME,...] [--quick]

Trains each model for the same optimizer steps (fp32, AdamW, lr 1e-3, no weight decay, no
clipping, one micro-batch per step; micro-batch 32, tiny-gpt 8) under

* plain: a hand-written loop (DataLoader, forward, backward, `opt.step()`,
  `opt.zero_grad(set_to_none=True)`, `loss.item()` every step, as a loop that prints it);
* session: `workbench.Session.run()`, every record with its loss, lr, samples/s, step split,
  gradient norm and memory (what the Session always measures);
* lightning: `lightning.Trainer.fit` (logger, checkpointing, progress bar and model
  summary off; a LightningModule whose `training_step` returns the loss);
* accelerate: `Accelerator().prepare(model, optimizer, loader)` and the plain loop with
  `accelerator.backward`;
* hf-trainer: `transformers.Trainer` (logging, saving and reporting off, constant rate,
  `max_grad_norm=0` so it does not clip: the others do not either).

A trainer that is not installed is skipped with why. Each run builds its model from the
same seed and times the steps after its warm-up steps, from the start of the first timed
step to the end of the last (callbacks of Lightning and the Hugging Face Trainer mark
them; on CUDA the device is synchronized at both marks). Runs are interleaved: every
repeat runs every trainer, in an order rotated each repeat, so a shared machine's load
falls on all of them alike. Prints, per model, the median seconds per step, the extra per
step over plain and the ratio to plain (the JSON also has each in process CPU time, less
sensitive to other processes on a shared machine); writes benchmarks/results/anchors.json (or
anchors-cuda.json with --device cuda).

Models: `mlp-64` (2 hidden layers of 64: a step of about half a millisecond on one CPU
thread, where the fixed cost per step shows), wider MLPs (256, 1024, 2048: the step grows,
the fixed cost stays, so the ratio goes to 1) and `tiny-gpt` (4 layers, hidden 128,
sequence 64: throughput).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from _common import positive_int, write_results
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench import Session, TrainConfig
from workbench.models import build_model

LR = 1e-3
TRAINERS = ("plain", "session", "lightning", "accelerate", "hf-trainer")
#: the package each trainer needs beyond torch and workbench
NEEDS = {"lightning": "lightning", "accelerate": "accelerate", "hf-trainer": "transformers"}


@dataclass(frozen=True)
class Model:
    name: str
    builtin: str  # workbench's built-in model name
    options: dict[str, Any]
    warmup_steps: int
    steps: int  # timed steps
    micro_batch: int = 32


MODELS = (
    Model("mlp-64", "mlp", dict(in_features=32, hidden=64, depth=2, out_features=8), 20, 300),
    Model("mlp-256", "mlp", dict(in_features=32, hidden=256, depth=2, out_features=8), 10, 200),
    Model("mlp-1024", "mlp", dict(in_features=32, hidden=1024, depth=2, out_features=8), 5, 60),
    Model("mlp-2048", "mlp", dict(in_features=32, hidden=2048, depth=2, out_features=8), 5, 30),
    Model("tiny-gpt", "tiny-gpt", dict(dropout=0.0), 3, 20, micro_batch=8),
)


def _build(model: Model, seed: int) -> tuple[nn.Module, Dataset[Any], Any]:
    options = dict(model.options)
    if model.builtin == "mlp":
        options["samples"] = 4096
    module, data, loss_fn, _ = build_model(model.builtin, seed=seed, **options)
    return module, data, loss_fn


def _loader(data: Dataset[Any], seed: int, micro_batch: int) -> DataLoader[Any]:
    return DataLoader(
        data,
        batch_size=micro_batch,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # host waits for the device: the timing marks


def _cycle(loader: Any) -> Any:
    while True:
        yield from loader


# --------------------------------------------------------------------------- the trainers
def run_plain(model: Model, seed: int, device: str) -> tuple[float, float]:
    torch.manual_seed(seed)
    module, data, loss_fn = _build(model, seed)
    module.to(device).train()
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=0.0)
    batches = _cycle(_loader(data, seed, model.micro_batch))

    def step() -> float:
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = loss_fn(module(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return _time_loop(step, model, device)


def run_accelerate(model: Model, seed: int, device: str) -> float:
    from accelerate import Accelerator

    torch.manual_seed(seed)
    module, data, loss_fn = _build(model, seed)
    accelerator = Accelerator(cpu=device == "cpu")
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=0.0)
    module, opt, loader = accelerator.prepare(module, opt, _loader(data, seed, model.micro_batch))
    module.train()
    batches = _cycle(loader)

    def step() -> float:
        x, y = next(batches)
        loss = loss_fn(module(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    try:
        return _time_loop(step, model, device)
    finally:
        accelerator.free_memory()


def _time_loop(step: Callable[[], float], model: Model, device: str) -> tuple[float, float]:
    for _ in range(model.warmup_steps):
        step()
    gc.collect()
    _sync(device)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(model.steps):
        step()
    _sync(device)
    return (time.perf_counter() - start) / model.steps, (time.process_time() - cpu) / model.steps


def run_session(model: Model, seed: int, device: str) -> tuple[float, float]:
    cfg = TrainConfig(micro_batch=model.micro_batch, seed=seed, lr=LR, weight_decay=0.0)
    options = dict(model.options)
    if model.builtin == "mlp":
        options["samples"] = 4096
    with Session(cfg, model=model.builtin, model_options=options, device=device) as s:
        s.run(model.warmup_steps, progress=False)
        gc.collect()
        _sync(device)
        start, cpu = time.perf_counter(), time.process_time()
        records = s.run(model.steps, progress=False)
        _sync(device)
        seconds = (time.perf_counter() - start) / model.steps
        cpu_seconds = (time.process_time() - cpu) / model.steps
        last = records[-1]
        assert last.grad_norm is not None and last.samples_per_s > 0  # all measured
    return seconds, cpu_seconds


class _Marks:
    """perf_counter at the start of the first timed step and the end of the last."""

    def __init__(self, model: Model, device: str) -> None:
        self.first, self.last = model.warmup_steps, model.warmup_steps + model.steps
        self.device = device
        self.start = self.end = self.cpu_start = self.cpu_end = 0.0

    def begin(self, done: int) -> None:
        if done == self.first:
            _sync(self.device)
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def finish(self, done: int) -> None:
        if done == self.last:
            _sync(self.device)
            self.end, self.cpu_end = time.perf_counter(), time.process_time()

    def seconds_per_step(self, steps: int) -> tuple[float, float]:
        if not self.end:
            raise RuntimeError("the timed steps did not all run")
        return (self.end - self.start) / steps, (self.cpu_end - self.cpu_start) / steps


def run_lightning(model: Model, seed: int, device: str) -> float:
    import lightning as L

    torch.manual_seed(seed)
    module, data, loss_fn = _build(model, seed)
    marks = _Marks(model, device)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = module

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return loss_fn(self.model(x), y)  # type: ignore[no-any-return]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=0.0)

    class Timing(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            marks.begin(trainer.global_step)

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            marks.finish(trainer.global_step)

    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        max_steps=marks.last,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Timing()],
    )
    trainer.fit(Module(), train_dataloaders=_loader(data, seed, model.micro_batch))
    return marks.seconds_per_step(model.steps)


class _Named(Dataset[dict[str, torch.Tensor]]):
    """(x, y) samples as the mappings the Hugging Face Trainer collates."""

    def __init__(self, data: Dataset[Any]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.data[i]
        return {"inputs": x, "labels": y}


class _WithLoss(nn.Module):
    """A module returning `{"loss": ...}`, as the Hugging Face Trainer expects."""

    def __init__(self, module: nn.Module, loss_fn: Any) -> None:
        super().__init__()
        self.module, self.loss_fn = module, loss_fn

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.loss_fn(self.module(inputs), labels)}


def run_hf_trainer(model: Model, seed: int, device: str) -> float:
    import transformers

    torch.manual_seed(seed)
    module, data, loss_fn = _build(model, seed)
    marks = _Marks(model, device)

    class Timing(transformers.TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks.begin(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks.finish(state.global_step)

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=marks.last,
            per_device_train_batch_size=model.micro_batch,
            learning_rate=LR,
            weight_decay=0.0,
            lr_scheduler_type="constant",
            optim="adamw_torch",
            max_grad_norm=0.0,
            logging_strategy="no",
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            use_cpu=device == "cpu",
            dataloader_num_workers=0,
            seed=seed,
        )
        trainer = transformers.Trainer(
            model=_WithLoss(module, loss_fn),
            args=args,
            train_dataset=_Named(data),
            callbacks=[Timing()],
        )
        trainer.train()
    return marks.seconds_per_step(model.steps)


RUNNERS: dict[str, Callable[[Model, int, str], tuple[float, float]]] = {
    "plain": run_plain,
    "session": run_session,
    "lightning": run_lightning,
    "accelerate": run_accelerate,
    "hf-trainer": run_hf_trainer,
}


def available() -> tuple[list[str], dict[str, str]]:
    """(trainers that can run here, why each other cannot)."""
    ok, missing = [], {}
    for name in TRAINERS:
        package = NEEDS.get(name)
        if package and importlib.util.find_spec(package) is None:
            missing[name] = f"{package} is not installed (pip install {package})"
        else:
            ok.append(name)
    return ok, missing


def compare(
    models: list[Model], trainers: list[str], *, reps: int, device: str
) -> dict[str, dict[str, Any]]:
    """Seconds per step of every trainer on every model, interleaved (see the docstring)."""
    seconds: dict[str, dict[str, list[float]]] = {m.name: {t: [] for t in trainers} for m in models}
    cpu: dict[str, dict[str, list[float]]] = {m.name: {t: [] for t in trainers} for m in models}
    failures: dict[str, str] = {}
    threads = torch.get_num_threads()  # each run starts with them, whatever the last one set
    for rep in range(reps):
        for model in models:
            order = trainers[rep % len(trainers) :] + trainers[: rep % len(trainers)]
            for name in order:
                if name in failures:
                    continue
                torch.set_num_threads(threads)
                gc.collect()
                try:
                    wall, cpu_s = RUNNERS[name](model, rep, device)
                except Exception as exc:
                    failures[name] = f"{type(exc).__name__}: {exc}"
                    print(
                        f"{name}: failed ({failures[name]}); skipped from here on",
                        file=sys.__stdout__,
                    )
                    continue
                seconds[model.name][name].append(wall)
                cpu[model.name][name].append(cpu_s)
    results: dict[str, dict[str, Any]] = {}
    for model in models:
        # each run's figure is its timed window over its steps (a ratio of sums); the median
        # is over the interleaved runs, never over one run's steps
        runs, cpus = seconds[model.name], cpu[model.name]
        plain = statistics.median(runs["plain"]) if runs.get("plain") else None
        plain_cpu = statistics.median(cpus["plain"]) if cpus.get("plain") else None
        rows = {}
        for name in trainers:
            if not runs[name]:
                continue
            median, median_cpu = statistics.median(runs[name]), statistics.median(cpus[name])
            rows[name] = {
                "seconds_per_step": runs[name],
                "cpu_seconds_per_step": cpus[name],
                "median_seconds_per_step": median,
                "median_cpu_seconds_per_step": median_cpu,
                "extra_seconds_per_step": None if plain is None else median - plain,
                "ratio_to_plain": None if plain is None else median / plain,
                "cpu_ratio_to_plain": None if plain_cpu is None else median_cpu / plain_cpu,
            }
        results[model.name] = {
            "model": f"{model.builtin} {model.options}",
            "micro_batch": model.micro_batch,
            "warmup_steps": model.warmup_steps,
            "timed_steps": model.steps,
            "trainers": rows,
        }
    if failures:
        results["_failures"] = {"trainers": failures}
    return results


def table(results: dict[str, dict[str, Any]], trainers: list[str]) -> str:
    """Markdown: per model, each trainer's ms per step, extra over plain, ratio."""
    lines = [
        "| model | plain ms/step | " + " | ".join(t for t in trainers if t != "plain") + " |",
        "|---|---:|" + "---:|" * (len(trainers) - 1),
    ]
    for name, result in results.items():
        if name.startswith("_"):
            continue
        rows = result["trainers"]
        plain = rows.get("plain", {}).get("median_seconds_per_step")
        cells = [name, f"{plain * 1e3:.3f}" if plain else "-"]
        for t in trainers:
            if t == "plain":
                continue
            row = rows.get(t)
            if not row or row["extra_seconds_per_step"] is None:
                cells.append("-")
                continue
            cells.append(
                f"{row['extra_seconds_per_step'] * 1e3:+.3f} ms ({row['ratio_to_plain']:.2f}x)"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _quiet() -> None:
    """The trainers' banners and warnings about this small setup (no GPU, few batches)."""
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=positive_int("--reps"), default=5)
    parser.add_argument("--threads", type=positive_int("--threads"), default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated models (default: all): " + ", ".join(m.name for m in MODELS),
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tenth of the timed steps (a smoke run)"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here")
        return 2
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {m.name for m in MODELS})
    if unknown:
        print(f"--only {args.only}: unknown model(s) {', '.join(unknown)}")
        return 2
    models = [m for m in MODELS if not names or m.name in names]
    if args.quick:
        models = [
            Model(m.name, m.builtin, m.options, 2, max(3, m.steps // 10), m.micro_batch)
            for m in models
        ]
    torch.set_num_threads(args.threads)
    _quiet()
    trainers, missing = available()
    for name, why in missing.items():
        print(f"{name}: not run: {why}")
    with (
        open(os.devnull, "w") as null,  # the trainers' banners and summaries
        contextlib.redirect_stderr(null),
        contextlib.redirect_stdout(null),
    ):
        results = compare(models, trainers, reps=args.reps, device=args.device)
    text = table(results, trainers)
    print(
        f"{args.device}, {args.threads} thread(s), fp32, AdamW; "
        f"median of {args.reps} interleaved runs; extra per step over plain (ratio):"
    )
    print(text)
    path = write_results(
        "anchors" if args.device == "cpu" else f"anchors-{args.device}",
        {
            "device": args.device,
            "threads": args.threads,
            "reps": args.reps,
            "not_run": missing,
            "models": results,
            "table_markdown": text,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
