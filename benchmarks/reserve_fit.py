"""The fit of the estimate's allocator reserve over dry runs replayed through the allocator model.

    .venv/bin/python benchmarks/reserve_fit.py [--quick]

Each grid point is a dry run (`workbench.simulate_memory`, 2 steps on fake CPU tensors,
AdamW/SGD foreach) whose allocation trace is replayed through the caching-allocator model
(`workbench.estimate.allocator`, no `PYTORCH_CUDA_ALLOC_CONF`): its reserve is the reserved
peak minus the allocated peak (`DryRun.reserved_peak_bytes - DryRun.allocated_peak_bytes`).
Beside it, the estimate's own terms for the same setup (`DryRun.formula`): the segment
rounding of the model states live at the peak (`Reserve.rounding_bytes`) and the transient bytes
at the peak (the peak minus its parameters, gradients and optimizer states: activations,
the loss's and the backward's temporaries, the tensors a step frees and makes again, which
leave the cached segments fragmented).

The fitted form (`workbench.estimate.reserve.allocator_reserve_from`):

    allocator reserve = rounding + TRANSIENT_SHARE x transient bytes

one coefficient, least squares over the grid weighted by 1 / the reserved peak squared (no
intercept; the rounding is the floor). The
error is |fitted - replayed reserve| / the replayed reserved peak, largest and mean over the
grid. Writes benchmarks/results/reserve_fit.json: every point, the coefficient and the error.

The grid: the built-in tiny GPT scaled (layers, hidden, sequence, micro-batch) x fp32 /
amp-bf16 x AdamW / SGD x activation checkpointing off / on, and small transformers Llama and
GPT-2 models built from a config. `--quick` runs the first points only (a check that it runs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_results  # noqa: E402
from workbench.estimate.reserve import transient_bytes  # noqa: E402

#: (layers, hidden, heads, sequence, micro-batch) of the tiny GPT's scaled shapes.
SHAPES = (
    (2, 64, 2, 64, 4),
    (4, 128, 4, 64, 8),
    (4, 256, 4, 128, 4),
    (6, 384, 6, 256, 2),
    (8, 512, 8, 256, 4),
    (8, 1024, 16, 512, 2),
    (12, 1536, 12, 512, 2),
    (20, 2048, 16, 512, 2),
)
#: (precision, optimizer, activation checkpointing) tried on each shape.
SETUPS = (
    ("fp32", "adamw", False),
    ("amp-bf16", "adamw", False),
    ("fp32", "sgd", True),
    ("amp-bf16", "adamw", True),
)
#: transformers models built from a config: (family, layers, hidden, heads, sequence, batch).
TRANSFORMERS = (
    ("llama", 2, 256, 4, 256, 2),
    ("gpt2", 2, 256, 4, 256, 2),
)


def grid() -> list[dict[str, Any]]:
    """Every grid point as the keyword arguments of `point`."""
    out: list[dict[str, Any]] = []
    for layers, hidden, heads, seq, batch in SHAPES:
        for precision, optimizer, ckpt in SETUPS:
            out.append(
                {
                    "model": "tiny-gpt",
                    "shape": [layers, hidden, heads, seq, batch],
                    "precision": precision,
                    "optimizer": optimizer,
                    "checkpointing": ckpt,
                }
            )
    for family, layers, hidden, heads, seq, batch in TRANSFORMERS:
        for precision, optimizer, ckpt in SETUPS:
            out.append(
                {
                    "model": family,
                    "shape": [layers, hidden, heads, seq, batch],
                    "precision": precision,
                    "optimizer": optimizer,
                    "checkpointing": ckpt,
                }
            )
    return out


def _transformers_model(family: str, layers: int, hidden: int, heads: int, seq: int) -> Any:
    import transformers

    if family == "llama":
        config: Any = transformers.LlamaConfig(
            vocab_size=2048,
            hidden_size=hidden,
            intermediate_size=hidden * 11 // 4,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=seq,
        )
        config._attn_implementation = "sdpa"
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(
        vocab_size=2048, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=seq
    )
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config)


def point(
    model: str, shape: list[int], precision: str, optimizer: str, checkpointing: bool
) -> dict[str, Any]:
    """One dry run replayed: the replayed reserve beside the estimate's terms."""
    import workbench
    from workbench import TrainConfig

    layers, hidden, heads, seq, batch = shape
    config = TrainConfig(
        micro_batch=batch,
        precision=precision,
        optimizer=optimizer,
        activation_checkpointing=checkpointing,
    )
    started = time.perf_counter()
    if model == "tiny-gpt":
        opts = {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq}
        run = workbench.simulate_memory(
            "tiny-gpt", config, model_options=opts, device="cpu", progress=False
        )
    else:
        module = _transformers_model(model, layers, hidden, heads, seq)
        run = workbench.simulate_memory(module, config, seq_len=seq, device="cpu", progress=False)
    seconds = time.perf_counter() - started
    formula = run.formula
    assert formula is not None and formula.reserve is not None and formula.peak is not None
    assert run.reserved_peak_bytes is not None and run.allocated_peak_bytes is not None
    return {
        "model": model,
        "shape": shape,
        "precision": precision,
        "optimizer": optimizer,
        "checkpointing": checkpointing,
        "allocated_peak_bytes": run.allocated_peak_bytes,
        "reserved_peak_bytes": run.reserved_peak_bytes,
        "replayed_reserve_bytes": run.reserved_peak_bytes - run.allocated_peak_bytes,
        "estimate_peak_bytes": formula.peak_bytes,
        "rounding_bytes": formula.reserve.rounding_bytes,
        "transient_bytes": transient_bytes(formula.peak.terms),
        "estimate_reserve_bytes": formula.reserve.allocator_bytes,
        "seconds": round(seconds, 2),
    }


def fit(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The least-squares TRANSIENT_SHARE of `reserve - rounding = share x transient`, and its
    error over `points` (largest and mean |fitted - replayed| / replayed reserved peak)."""
    num = den = 0.0
    for p in points:  # weighted by 1 / reserved peak^2: the error is relative to it
        t, w = p["transient_bytes"], 1 / p["reserved_peak_bytes"] ** 2
        num += w * t * (p["replayed_reserve_bytes"] - p["rounding_bytes"])
        den += w * t * t
    share = round(max(0.0, num / den) if den else 0.0, 4)
    errors = []
    for p in points:
        fitted = p["rounding_bytes"] + share * p["transient_bytes"]
        p["fitted_reserve_bytes"] = round(fitted)
        errors.append(abs(fitted - p["replayed_reserve_bytes"]) / p["reserved_peak_bytes"])
    return {
        "form": "allocator reserve = model states' segment rounding + transient_share x transient bytes",
        "transient_share": share,
        "max_error": round(max(errors), 4),
        "mean_error": round(sum(errors) / len(errors), 4),
        "error_is": "|fitted - replayed reserve| / replayed reserved peak",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first 3 points only")
    args = parser.parse_args()
    points = []
    todo = grid()[:3] if args.quick else grid()
    for n, kwargs in enumerate(todo, 1):
        p = point(**kwargs)
        points.append(p)
        print(
            f"{n}/{len(todo)} {p['model']} {p['shape']} {p['precision']} {p['optimizer']} "
            f"ckpt={p['checkpointing']}: replayed {p['replayed_reserve_bytes'] / 2**20:.2f} MiB, "
            f"rounding {p['rounding_bytes'] / 2**20:.2f} MiB, transient "
            f"{p['transient_bytes'] / 2**20:.2f} MiB ({p['seconds']} s)",
            flush=True,
        )
    result = fit(points)
    for p in points:  # the estimate's own reserve, under the coefficient the run found
        del p["estimate_reserve_bytes"]
    print(result)
    if not args.quick:
        write_results("reserve_fit", {"fit": result, "points": points})


if __name__ == "__main__":
    main()
