"""gpu_check's sections for the newest CUDA code, run first (the budget cuts the oldest):

* optim8 (~30 s): 8-bit AdamW on CUDA: bitsandbytes' paged one (`paged-adam8bit`: its
  large states in CUDA managed memory, which `max_memory_allocated` does not see, so the
  memory report must say so) and torchao's (`adam8bit`), each trained a few steps of the
  tiny GPT, its state exported (`export_state`: the paged states dequantized where their
  absmax is) and a bf16-true paged session closed (its export back to your module); the
  optimizer step in backward (`optimizer_in_backward`, AdamW and torchao's 8-bit), whose
  gradients are freed as they step: its peak below the plain step's.
* offload (~15 s): activation offload on CUDA: the same steps with and without
  `activation_offload` give the same losses; the device holds less (the probe's
  `cuda_max_allocated_bytes`, and the run's `torch.cuda.max_memory_reserved()` beside
  it), the offloaded bytes next to the prediction. Beside them the other activation
  techniques on CUDA: activation checkpointing (fewer activations kept) and the sdpa
  attention kernel (fewer: no scores kept), against the GPT's own eager one.
* lora (~20 s): LoRA (rank 8) and QLoRA (a 4-bit NF4 base, bitsandbytes' CUDA kernels):
  each trains, only the adapters hold gradients, the measured model states next to the
  prediction, and closing gives back your module's fp32 weights.
* dryrun (~35 s): dry runs on fake CUDA tensors (`device="cuda"`) against the real peak of
  a steady step of the same Session (`cuda_max_allocated_bytes` of its records): plain,
  LoRA, and FSDP over a fake group of 2 ranks (a per-rank figure: no second GPU to hold it
  against, so it is checked below the 1-rank one).
* observers (~30 s): the Hugging Face Trainer (fp16 without clipping: the gradient norm
  taken before the scaler's `unscale_`, divided by its scale) and Lightning on CUDA with
  the workbench callbacks: records carry CUDA memory (within the run's peak, which the
  observer no longer resets under the trainer), the norm is unscaled (below 1e3; a step
  that overflows reads inf and is skipped by the scaler).

On `--cpu-smoke` the same code runs tiny on the CPU; what only CUDA has (paging, the
reserved peak, the 4-bit CUDA kernels, torchao's compiled step) is left out there, the
CPU's own tests cover it. The section functions take gpu_check's `Ctx` and `check`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Section = Callable[[dict[str, Any]], None]
TINY_GPU = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "dropout": 0.0}
TINY_CPU = {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 16, "dropout": 0.0}
DRY_RUN_BOUND = 0.15  # the dry run's peak within 15% of the real steady step's


def _config(ctx: Any, **kw: Any) -> Any:
    from workbench import TrainConfig

    base: dict[str, Any] = {"micro_batch": 4, "lr": 1e-3, "seed": 1, "device": ctx.device}
    base.update(kw)
    return TrainConfig(**base)


def _options(ctx: Any) -> dict[str, Any]:
    return dict(TINY_CPU if ctx.smoke else TINY_GPU)


def _finite(values: list[Any]) -> bool:
    return bool(values) and all(v is not None and math.isfinite(v) for v in values)


def _steady_peak(records: list[Any]) -> int | None:
    """The highest CUDA peak of the steps after the first (the first creates the states)."""
    peaks = [r.cuda_max_allocated_bytes for r in records[1:] if r.cuda_max_allocated_bytes]
    return max(peaks) if peaks else None


def optim8_section(ctx: Any, check: Callable[..., bool]) -> Section:
    def run(out: dict[str, Any]) -> None:
        from workbench import Session

        steps = 3 if ctx.smoke else 6
        setups: dict[str, dict[str, Any]] = {
            "paged-adam8bit": {"optimizer": "paged-adam8bit"},
            "paged-adam8bit bf16-true": {"optimizer": "paged-adam8bit", "precision": "bf16-true"},
            "adamw in backward": {"optimizer_in_backward": True},
            "adamw": {},
        }
        if not ctx.smoke:  # torchao's step compiles: minutes on a CPU, its own tests there
            setups["adam8bit (torchao)"] = {"optimizer": "adam8bit"}
            setups["adam8bit in backward"] = {
                "optimizer": "adam8bit",
                "optimizer_in_backward": True,
            }
        for name, settings in setups.items():
            with Session(_config(ctx, **settings), model_options=_options(ctx)) as s:
                records = s.run(optimizer_steps=steps, progress=False)
                report = s.memory()
                exported = s.backend.export_state()
                opt = s.backend.optimizer
                row = {
                    "optimizer_class": f"{type(opt).__module__}.{type(opt).__name__}",
                    "losses": [r.loss for r in records],
                    "grad_norms": [r.grad_norm for r in records],
                    "steady_peak_bytes": _steady_peak(records),
                    "optimizer_bytes": report.optimizer_bytes,
                    "notes": list(report.notes),
                }
            out[name] = row  # the session is closed here: a bf16-true close exports
            check("optim8", f"{name}: losses finite", _finite(row["losses"]), row["losses"])
            states = exported.get("optimizer", {}).get("state", {})
            check("optim8", f"{name}: its state exports", bool(states), len(states))
            if "paged" in name and not ctx.smoke:
                check(
                    "optim8",
                    f"{name}: the report says the paged states are outside the CUDA peak",
                    any("managed memory" in n for n in row["notes"]),
                    row["notes"],
                )
        if not ctx.smoke:
            plain, inback = out["adamw"]["steady_peak_bytes"], out["adamw in backward"]
            check(
                "optim8",
                "the step in backward peaks below the plain step",
                plain is not None and (inback["steady_peak_bytes"] or plain) < plain,
                (inback["steady_peak_bytes"], plain),
            )

    return run


def offload_section(ctx: Any, check: Callable[..., bool]) -> Section:
    def run(out: dict[str, Any]) -> None:
        from workbench import Session

        torch = ctx.torch
        setups = {
            "off": {},
            "on": {"activation_offload": True},
            "checkpointing": {"activation_checkpointing": True},
            "sdpa attention": {"attention": "sdpa"},
        }
        for name, settings in setups.items():
            if not ctx.smoke:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            config = _config(ctx, micro_batch=8, **settings)
            with Session(config, model_options=_options(ctx)) as s:
                records = s.run(optimizer_steps=3, progress=False)
                report = s.memory()
            out[name] = {
                "losses": [r.loss for r in records],
                "activation_bytes": report.activation_bytes,
                "offloaded_activation_bytes": report.offloaded_activation_bytes,
                "predicted_offloaded_activation_bytes": report.predicted_offloaded_activation_bytes,
                "cuda_max_allocated_bytes": report.cuda_max_allocated_bytes,
                "max_memory_reserved_bytes": None
                if ctx.smoke
                else torch.cuda.max_memory_reserved(),
            }
        on, off = out["on"], out["off"]
        check("offload", "the same losses with and without", on["losses"] == off["losses"])
        for name in ("checkpointing", "sdpa attention"):
            check("offload", f"{name}: losses finite", _finite(out[name]["losses"]))
        check(
            "offload",
            "checkpointing keeps fewer activations",
            out["checkpointing"]["activation_bytes"] < off["activation_bytes"],
            (out["checkpointing"]["activation_bytes"], off["activation_bytes"]),
        )
        check(
            "offload",
            "the sdpa kernel keeps fewer activations than the GPT's eager one (no scores)",
            out["sdpa attention"]["activation_bytes"] < off["activation_bytes"],
            (out["sdpa attention"]["activation_bytes"], off["activation_bytes"]),
        )
        check(
            "offload",
            "activations moved off the device",
            on["offloaded_activation_bytes"] > 0
            and on["activation_bytes"] < off["activation_bytes"],
            (on["activation_bytes"], on["offloaded_activation_bytes"], off["activation_bytes"]),
        )
        if not ctx.smoke:
            check(
                "offload",
                "the device's allocated peak is lower (max_memory_allocated)",
                on["cuda_max_allocated_bytes"] < off["cuda_max_allocated_bytes"],
                (on["cuda_max_allocated_bytes"], off["cuda_max_allocated_bytes"]),
            )
            check(
                "offload",
                "its reserved peak is not higher (max_memory_reserved)",
                on["max_memory_reserved_bytes"] <= off["max_memory_reserved_bytes"],
                (on["max_memory_reserved_bytes"], off["max_memory_reserved_bytes"]),
            )

    return run


def lora_section(ctx: Any, check: Callable[..., bool]) -> Section:
    def run(out: dict[str, Any]) -> None:
        from workbench import Session
        from workbench.models import build_model

        torch = ctx.torch
        for name, settings in (("lora", {}), ("qlora", {"qlora": True})):
            model, data, loss_fn, _ = build_model("tiny-gpt", **_options(ctx))
            model.to(ctx.device)
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            config = _config(ctx, lora_rank=8, lr=1e-2, **settings)
            with Session(config, model=model, data=data, loss_fn=loss_fn) as s:
                records = s.run(optimizer_steps=3, progress=False)
                report = s.memory()
                with_grads = [
                    n for n, p in s.backend.trained_module.named_parameters() if p.requires_grad
                ]
            pred = report.predicted
            out[name] = {
                "losses": [r.loss for r in records],
                "params_bytes": report.params_bytes,
                "predicted_params_bytes": getattr(pred, "params_bytes", None),
                "grads_bytes": report.grads_bytes,
                "predicted_grads_bytes": getattr(pred, "grads_bytes", None),
                "trainable": len(with_grads),
            }
            check("lora", f"{name}: losses finite", _finite(out[name]["losses"]))
            check(
                "lora",
                f"{name}: only the adapters train",
                bool(with_grads) and all("lora_" in n for n in with_grads),
                with_grads[:4],
            )
            check(
                "lora",
                f"{name}: gradients as predicted",
                pred is not None and report.grads_bytes == pred.grads_bytes,
                (report.grads_bytes, getattr(pred, "grads_bytes", None)),
            )
            after = dict(model.named_parameters())
            check(
                "lora",
                f"{name}: closing gives back fp32 weights of your module",
                all(after[n].dtype == torch.float32 for n in before),
            )

    return run


def dryrun_section(ctx: Any, check: Callable[..., bool]) -> Section:
    def run(out: dict[str, Any]) -> None:
        import gc

        from workbench import Session, simulate_memory

        torch = ctx.torch
        device = "cpu" if ctx.smoke else "cuda"
        for name, settings in (("plain", {}), ("lora", {"lora_rank": 8})):
            config = _config(ctx, micro_batch=8, **settings)
            gc.collect()
            # what earlier sections left allocated is no part of this run's peak
            before = 0 if ctx.smoke else torch.cuda.memory_allocated()
            with Session(config, model_options=_options(ctx)) as s:
                records = s.run(optimizer_steps=4, progress=False)
                peak = _steady_peak(records)
            real = None if peak is None else peak - before
            dry = simulate_memory(
                "tiny-gpt", config, model_options=_options(ctx), device=device, progress=False
            )
            out[name] = {
                "dry_run_peak_bytes": dry.peak_bytes,
                "real_peak_bytes": real,
                "allocated_before_bytes": before,
            }
            if ctx.smoke:
                check("dryrun", f"{name}: a dry run on the CPU", dry.peak_bytes > 0)
                continue
            ratio = dry.peak_bytes / real if real else None
            out[name]["ratio"] = ratio
            check(
                "dryrun",
                f"{name}: the dry run on fake CUDA tensors within {DRY_RUN_BOUND:.0%} of the "
                "real steady peak",
                ratio is not None and abs(ratio - 1) <= DRY_RUN_BOUND,
                ratio,
            )
        fsdp = _config(ctx, micro_batch=8, fsdp="full_shard")
        one = simulate_memory(
            "tiny-gpt", fsdp, model_options=_options(ctx), device=device, progress=False
        )
        two = simulate_memory(
            "tiny-gpt", fsdp, world_size=2, model_options=_options(ctx), device=device,
            progress=False,
        )  # fmt: skip
        out["fsdp"] = {"one_rank_peak_bytes": one.peak_bytes, "two_rank_peak_bytes": two.peak_bytes}
        check(
            "dryrun",
            "FSDP over a fake group of 2 ranks: each rank's peak below one rank's",
            0 < two.peak_bytes < one.peak_bytes,
            (two.peak_bytes, one.peak_bytes),
        )

    return run


def observers_section(ctx: Any, check: Callable[..., bool]) -> Section:
    def run(out: dict[str, Any]) -> None:
        out["transformers"] = _hf_run(ctx, check)
        out["lightning"] = _lightning_run(ctx, check)

    return run


class _Tokens:
    def __init__(self, seq_len: int, vocab: int, n: int = 64) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf_run(ctx: Any, check: Callable[..., bool]) -> dict[str, Any]:
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from workbench.integrations import WorkbenchTrainerCallback

    torch = ctx.torch
    small = ctx.smoke
    config = GPT2Config(
        vocab_size=128, n_positions=32, n_embd=32 if small else 256, n_layer=1 if small else 4,
        n_head=2 if small else 4, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    callback = WorkbenchTrainerCallback(grad_norm=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=8, max_steps=4, logging_steps=1,
            report_to=[], save_strategy="no", disable_tqdm=True, max_grad_norm=0.0,
            fp16=not small, use_cpu=small,
        )  # fmt: skip
        trainer = Trainer(
            model=GPT2LMHeadModel(config),
            args=args,
            train_dataset=_Tokens(32, 128),
            callbacks=[callback],
        )
        trainer.train()
    records = callback.observer.records()
    norms = [r.grad_norm for r in records]
    row: dict[str, Any] = {
        "grad_norms": norms,
        "losses": [r.loss for r in records],
        "cuda_max_allocated_bytes": [r.cuda_max_allocated_bytes for r in records],
    }
    check("observers", "transformers: every step recorded", len(records) == 4, len(records))
    # fp16 starts at a loss scale of 65536: a norm still scaled reads ~1e4 or more (a step
    # that overflows reads inf either way, and the scaler skips it)
    finite = [n for n in norms if n is not None and math.isfinite(n)]
    check(
        "observers",
        "transformers: the gradient norm is the unscaled one",
        len(finite) >= 2 and max(finite) < 1e3,
        norms,
    )
    if not small:
        peak = torch.cuda.max_memory_allocated()
        row["run_peak_bytes"] = peak
        check(
            "observers",
            "transformers: CUDA memory recorded, within the run's peak",
            all(records_peak is not None for records_peak in row["cuda_max_allocated_bytes"])
            and peak >= max(row["cuda_max_allocated_bytes"]),
            (peak, row["cuda_max_allocated_bytes"]),
        )
    return row


def _lightning_run(ctx: Any, check: Callable[..., bool]) -> dict[str, Any]:
    import lightning as L

    from workbench.integrations import WorkbenchLightningCallback

    torch = ctx.torch

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            width = 32 if ctx.smoke else 1024
            self.net = torch.nn.Sequential(
                torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
            )
            self.width = width

        def training_step(self, batch: Any, idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    module = Module()
    data = torch.utils.data.TensorDataset(torch.randn(64, module.width), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    callback = WorkbenchLightningCallback(grad_norm=True)
    trainer = L.Trainer(
        accelerator="cpu" if ctx.smoke else "gpu", devices=1, max_steps=4, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )  # fmt: skip
    trainer.fit(module, loader)
    records = callback.observer.records()
    row = {
        "losses": [r.loss for r in records],
        "grad_norms": [r.grad_norm for r in records],
        "cuda_max_allocated_bytes": [r.cuda_max_allocated_bytes for r in records],
    }
    check("observers", "lightning: every step recorded", len(records) == 4, len(records))
    check("observers", "lightning: losses and norms finite", _finite(row["losses"]))
    if not ctx.smoke:
        check(
            "observers",
            "lightning: records carry CUDA memory",
            all(v is not None for v in row["cuda_max_allocated_bytes"]),
            row["cuda_max_allocated_bytes"],
        )
    return row
