"""Every field of every estimate, compared between two source trees.

    .venv/bin/python benchmarks/estimate_equality.py OTHER_TREE [--count 20000]

Runs the same varied configurations (benchmarks/estimator.py's `sweep_configs`, plus
random mixes of presets, Hugging Face configs, LoRA/QLoRA, FSDP and its units, compile,
paged optimizers, tensor/pipeline/sequence parallelism, offload, activation offload,
DeepSpeed configs, grad accumulation, chunked loss and the other peak keywords) through
`estimate_memory` of this tree and of OTHER_TREE, each in its own process (PYTHONPATH at
that tree), and compares `to_dict()` of each estimate (or its error text): every field both trees
have (a field only one has, a new one, is listed apart). Prints the number compared and
the first differences; exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}
GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}


def mixed_configs(count: int, seed: int = 0) -> list[dict[str, object]]:
    """`count` random configurations over every keyword family (some invalid on purpose:
    their error text is compared too)."""
    from workbench.config import OptimizerName, Precision
    from workbench.estimate import GPUS, model_names

    rng = random.Random(seed)
    pick = rng.choice
    out: list[dict[str, object]] = []
    for _ in range(count):
        cfg: dict[str, object] = {}
        source = pick(["preset", "preset", "shape", "n_params", "hf", "shape+n"])
        if source == "preset":
            cfg["model"] = pick(model_names())
        elif source == "hf":
            cfg["hf_config"] = dict(pick([LLAMA_3_8B, GPT2]))
        else:
            if source != "n_params":
                heads = pick([4, 8, 16, 32])
                cfg.update(
                    layers=pick([2, 12, 24, 48]),
                    hidden=heads * pick([32, 64, 128]),
                    heads=heads,
                    seq_len=pick([128, 512, 2048, 4096]),
                    vocab=pick([1000, 32000, 50257]),
                )
                if rng.random() < 0.3:
                    cfg["kv_heads"] = heads // 2
                if rng.random() < 0.3:
                    cfg["mlp"] = "swiglu"
            if source != "shape":
                cfg["n_params"] = pick([1e8, 7.5e9, "1.3B", 70e9])
        stage = pick([0, 0, 1, 2, 3])
        fsdp = pick(["off"] * 3 + ["full_shard", "shard_grad_op", "no_shard"])
        if fsdp != "off":
            stage = 0
        cfg.update(
            precision=pick([p.value for p in Precision]),
            optimizer=pick([o.value for o in OptimizerName]),
            zero_stage=stage,
            fsdp=fsdp,
            gpus=pick([1, 2, 8, 16, 64]),
            micro_batch=pick([1, 2, 4, 8, 16]),
            checkpointing=pick(["none", "selective", "full"]),
            gpu=pick([None, *GPUS]),
        )
        if rng.random() < 0.3:
            tp, pp = pick([1, 2, 4]), pick([1, 2])
            cfg.update(tensor_parallel=tp, pipeline_parallel=pp, gpus=tp * pp * pick([1, 2, 4]))
            cfg["sequence_parallel"] = tp > 1 and rng.random() < 0.5
        if stage >= 1 and rng.random() < 0.3:
            cfg["offload_optimizer"] = True
            cfg["offload_params"] = stage == 3 and rng.random() < 0.5
        if rng.random() < 0.3:
            cfg["lora_rank"] = pick([8, 16, 64])
            cfg["lora_targets"] = pick(["all-linear", "attention"])
            cfg["lora_dropout"] = pick([0.0, 0.1])
            cfg["qlora"] = rng.random() < 0.5
            cfg["lora_dtype"] = pick(["auto", "fp32"])
        if fsdp != "off":
            cfg["precision"] = pick(["fp32", "amp-bf16", "amp-fp16", "bf16-true"])
            cfg["fsdp_units"] = pick(["blocks", "blocks-only"])
            cfg["fsdp_reduce_fp32"] = rng.random() < 0.5
        for key, values in (
            ("compile", [True]),
            ("activation_offload", [True]),
            ("document_mask", [True]),
            ("optimizer_in_backward", [True]),
            ("bucket_view", [True]),
            ("grad_accum", [2, 8]),
            ("loss_chunks", [2, 8, 16]),
            ("attention", ["eager", "sdpa"]),
            ("optimizer_impl", ["foreach", "for-loop", "fused"]),
            ("weight_decay", [0.01, 0.1]),
            ("dropout", [False, True]),
            ("overhead_gib", [0.0, 2.5]),
            ("lazy_loading", [False]),
            ("accounting", ["deepspeed", "fsdp"]),
            ("tokens", [1e9, "300B"]),
            ("price_per_gpu_hour", [2.5]),
            ("mfu", [0.3, 0.5]),
            ("deepspeed_config", [{"zero_optimization": {"reduce_bucket_size": 2e8}}]),
        ):
            if rng.random() < 0.2:
                cfg[key] = pick(values)
        if fsdp != "off":  # mostly valid: DeepSpeed's keywords off an FSDP setup
            cfg.pop("deepspeed_config", None)
            if cfg.get("accounting") == "deepspeed":
                cfg["accounting"] = "fsdp"
        if cfg.get("optimizer_in_backward") and rng.random() < 0.8:
            cfg.update(gpus=1, zero_stage=0, fsdp="off", grad_accum=1, tensor_parallel=1)
            cfg.update(pipeline_parallel=1, sequence_parallel=False, offload_optimizer=False)
            cfg.update(offload_params=False)
        out.append(cfg)
    return out


def all_configs(count: int) -> list[dict[str, object]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from estimator import sweep_configs

    half = count // 2
    return sweep_configs(half) + mixed_configs(count - half)


def run_here(count: int, out_path: str) -> None:
    """Every configuration's `to_dict()` (or error text) from the tree on sys.path."""
    from workbench.estimate import estimate_memory

    results = []
    for cfg in all_configs(count):
        try:
            results.append(("ok", estimate_memory(**cfg).to_dict()))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - the error text is compared
            results.append(("error", f"{type(exc).__name__}: {exc}"))
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


def results_of(tree: Path, count: int, workdir: str) -> list[tuple[str, object]]:
    out = os.path.join(workdir, f"{abs(hash(str(tree)))}.pickle")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--worker", out, "--count", str(count)]
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    with open(out, "rb") as f:
        return pickle.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", nargs="?", type=Path, help="the tree to compare with")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_here(args.count, args.worker)
        return 0
    if args.other is None:
        parser.error("give the tree to compare with")
    with tempfile.TemporaryDirectory() as tmp:
        mine = results_of(ROOT, args.count, tmp)
        theirs = results_of(args.other.resolve(), args.count, tmp)
    added: set[str] = set()  # fields one tree has and the other lacks: new, not changed
    differ = []
    for k, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a[0] == b[0] == "ok":
            x, y = a[1], b[1]
            added |= x.keys() ^ y.keys()  # type: ignore[union-attr]
            if any(x[f] != y[f] for f in x.keys() & y.keys()):  # type: ignore[union-attr,index]
                differ.append(k)
        elif a != b:
            differ.append(k)
    errors = sum(kind == "error" for kind, _ in mine)
    print(f"{len(mine):,} configurations ({errors:,} refused), {len(differ):,} differ")
    if added:
        print(f"  fields in one tree only (not compared): {', '.join(sorted(added))}")
    for k in differ[:5]:
        a, b = mine[k], theirs[k]
        if a[0] == b[0] == "ok":
            keys = [f for f in a[1] if a[1][f] != b[1].get(f)]  # type: ignore[union-attr]
            print(f"  #{k}: fields {keys}")
        else:
            print(f"  #{k}: {a!r:.200} != {b!r:.200}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
