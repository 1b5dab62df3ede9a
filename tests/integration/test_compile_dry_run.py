"""The dry run with `compile=True`: the graphs torch.compile's partitioner makes, run on fake
tensors (`workbench.train.dry_run.compiled`), or, where they cannot be traced, eager steps
with a note naming the formula's compile term."""

from __future__ import annotations

import sys
from pathlib import Path

import workbench
from workbench.estimate.compiled import COMPILE_TERM

sys.path.insert(0, str(Path(__file__).parent))
from peak_measure import tiny_llama  # noqa: E402

GPT = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32}


def _compile_notes(run: workbench.DryRun) -> list[str]:
    return [n for n in run.notes if n.startswith("compile:")]


def test_a_compiled_dry_run_keeps_what_the_partitioner_saves() -> None:
    eager = workbench.simulate_memory(
        "tiny-gpt", workbench.TrainConfig(micro_batch=2), model_options=GPT
    )
    compiled = workbench.simulate_memory(
        "tiny-gpt", workbench.TrainConfig(micro_batch=2, compile=True), model_options=GPT
    )
    (note,) = _compile_notes(compiled)
    assert "partitioner" in note and "op by op" in note
    assert not _compile_notes(eager)
    # in backward the compiled step holds fewer saved activations (the layer norms' means
    # are recomputed) and makes every gradient inside its one backward graph
    assert compiled.points["backward"]["activations"] < eager.points["backward"]["activations"]
    assert compiled.formula is not None and compiled.formula.peak is not None


def test_a_forward_that_cannot_be_traced_runs_eagerly_with_the_formulas_term() -> None:
    model = tiny_llama(layers=2, hidden=64, heads=4, kv_heads=4, ffn=96, vocab=100, seq_len=32)
    run = workbench.simulate_memory(model, workbench.TrainConfig(micro_batch=2, compile=True))
    (note,) = _compile_notes(run)
    assert "ran eagerly" in note and "cannot be traced" in note
    peak = run.formula.peak
    term = max(-terms.get(COMPILE_TERM, 0) for terms in peak.points.values())
    # 2 layers x the SiLU output in fp32, 4·sbf bytes, and the 2 x 2 + 1 RMSNorms' normalised
    # inputs (transformers' RMSNorm keeps them eagerly; compile recomputes them), 4·sbh
    assert term == 2 * 4 * 32 * 2 * 96 + (2 * 2 + 1) * 4 * 32 * 2 * 64
    assert workbench.display.fmt_bytes(term) in note


def test_compile_on_fsdp_runs_eagerly_and_says_why() -> None:
    config = workbench.TrainConfig(micro_batch=2, compile=True, fsdp="full_shard")
    run = workbench.simulate_memory("tiny-gpt", config, world_size=2, model_options=GPT)
    (note,) = _compile_notes(run)
    assert "fsdp engine" in note and "ran eagerly" in note


def test_workbench_estimate_simulate_compile_passes_compile_to_the_dry_run(
    tmp_path, capsys
) -> None:
    import json

    from workbench.cli import main

    config = tmp_path / "config.json"
    llama = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 96,
        "vocab_size": 100,
        "max_position_embeddings": 32,
    }
    config.write_text(json.dumps(llama))
    args = ["estimate", "--hf-config", str(config), "--micro-batch", "2", "--compile"]
    assert main([*args, "--simulate", "--json"]) in (0, None)
    data = json.loads(capsys.readouterr().out)
    (note,) = [n for n in data["dry_run"]["notes"] if n.startswith("compile:")]
    assert "ran eagerly" in note  # transformers' forward reads values: not traced
    silu, norms = 2 * 4 * 32 * 2 * 96, (2 * 2 + 1) * 4 * 32 * 2 * 64
    assert data["estimate"]["peak"]["compile_not_kept_bytes"] == silu + norms
