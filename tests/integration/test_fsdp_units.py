"""FSDP's units are the recipe's: `fsdp_units` names the modules `fully_shard` makes units.

"blocks" (the default): each transformer block, the embedding and the output head (with
the final norm) units of their own, as torchtitan's `apply_fsdp` shards a Llama
(`tok_embeddings`; each block; `[norm, output]`, kept gathered after forward) and as
torchtune's 70B recipes ask (`custom_sharded_layers: ['tok_embeddings', 'output']`);
"blocks-only": the embedding and head gathered with the root (the wrapping before); or
the user's own list of class names and qualified-name patterns. The Session, the dry run,
the exported job and the estimator read the one setting; a name that matches no module is
refused naming the modules that exist.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import Dataset

from workbench import Session, TrainConfig
from workbench.estimate import estimate_memory
from workbench.export.job_parallel import fsdp_units
from workbench.models import build_model
from workbench.train.dry_run import simulate_memory
from workbench.train.dry_run.problems import DryRunError
from workbench.train.techniques.recompute import checkpointable_modules, mark_checkpointable

VOCAB, SEQ = 1024, 32


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 32) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def llama(marked: bool = True) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    if marked:
        mark_checkpointable(model.model.layers)
    return model


def _names(model: torch.nn.Module, units: list[Any]) -> list[Any]:
    where = {id(m): n for n, m in model.named_modules()}
    return [
        [where[id(u)] for u in unit] if isinstance(unit, list) else where[id(unit)]
        for unit in units
    ]


def test_the_policies_pick_the_recipes_units() -> None:
    model = llama()
    blocks = checkpointable_modules(model)
    layers = ["model.layers.0", "model.layers.1"]
    units, missing = fsdp_units(model, "blocks", blocks)
    assert (_names(model, units), missing) == (
        ["model.embed_tokens", *layers, ["model.norm", "lm_head"]],
        [],
    )
    assert _names(model, fsdp_units(model, "blocks-only", blocks)[0]) == layers
    for own in ("LlamaDecoderLayer", "model.layers.*"):
        assert _names(model, fsdp_units(model, own, blocks)[0]) == layers
    units, missing = fsdp_units(model, "lm_head, model.layers.?.mlp, nope", blocks)
    assert missing == ["nope"]
    assert sorted(_names(model, units)) == ["lm_head", "model.layers.0.mlp", "model.layers.1.mlp"]
    # a head tied to the embedding stays in the root with it (one weight, one unit)
    gpt, _, _, _ = build_model("tiny-gpt")
    assert fsdp_units(gpt, "blocks", checkpointable_modules(gpt))[0] == checkpointable_modules(gpt)


@pytest.mark.parametrize(
    ("units", "own"), [("blocks", True), ("blocks-only", False), ("LlamaDecoderLayer", False)]
)
def test_the_session_shards_the_units_it_is_given(units: str, own: bool) -> None:
    config = TrainConfig(fsdp="full_shard", fsdp_units=units, micro_batch=4, device="cpu", seed=0)
    with Session(config, model=llama(), data=Tokens()) as s:
        records = s.run(optimizer_steps=2, progress=False)
        module = s.backend.trained_module
        assert all(isinstance(layer, FSDPModule) for layer in module.model.layers)
        assert isinstance(module.model.embed_tokens, FSDPModule) is own
        assert isinstance(module.lm_head, FSDPModule) is own
    assert len(records) == 2 and all(torch.isfinite(torch.tensor(r.loss)) for r in records)


def test_a_unit_name_that_matches_nothing_names_the_modules_that_exist() -> None:
    config = TrainConfig(fsdp="full_shard", fsdp_units="Block,nope", micro_batch=4, device="cpu")
    with (
        pytest.raises(ValueError, match="fsdp_units='Block,nope'") as info,
        Session(config, model=llama(), data=Tokens()) as s,
    ):
        s.run(optimizer_steps=1, progress=False)
    text = str(info.value)
    assert "'Block', 'nope' match no module" in text
    assert "LlamaDecoderLayer" in text and "model.layers.*.self_attn" in text
    with pytest.raises(DryRunError) as dry:
        simulate_memory(llama(), config, world_size=2, progress=False)
    assert [p.field for p in dry.value.problems] == ["fsdp_units"]
    assert "LlamaDecoderLayer" in str(dry.value)
    with pytest.raises(ValueError, match="fsdp_units='a b'"):
        TrainConfig(fsdp_units="a b")


def _most(trace: Any, category: str) -> int:
    sizes: dict[int, int] = {}
    now = best = 0
    for e in trace.events:
        if e.kind == "alloc" and e.category == category:
            sizes[e.block] = e.nbytes
            now += e.nbytes
        elif e.kind == "free" and e.block in sizes:
            now -= sizes.pop(e.block)
        best = max(best, now)
    return best


def test_the_dry_run_and_the_formula_gather_a_unit_at_a_time() -> None:
    """On 2 fake ranks, a Llama whose embedding and head are a third of it: own units
    halve what is gathered at once, in the dry run and in the formula alike."""
    runs = {
        units: simulate_memory(
            llama(marked=False),
            TrainConfig(fsdp="full_shard", fsdp_units=units, micro_batch=2),
            world_size=2,
            progress=False,
        )
        for units in ("blocks", "blocks-only")
    }
    dry = {u: _most(r.trace, "gathered parameters") for u, r in runs.items()}
    formula = {
        u: max(m.get("FSDP gathered parameters", 0) for m in r.formula.peak.moments.values())
        for u, r in runs.items()
    }
    formula = {
        u: max(v, runs[u].formula.peak.points["forward end"]["FSDP gathered parameters"])
        for u, v in formula.items()
    }
    assert dry["blocks"] < 0.7 * dry["blocks-only"]
    assert formula["blocks"] < 0.8 * formula["blocks-only"]
    for u in runs:  # the formula within 40% of the dry run's most gathered
        assert abs(formula[u] - dry[u]) <= 0.4 * dry[u], (u, formula[u], dry[u])


def test_the_estimator_gathers_a_70b_one_unit_at_a_time() -> None:
    """Llama 3 70B, 8 GPUs, bf16 compute: the embedding and the head (1,050,673,152 and
    1,050,681,344 parameters with the final norm) are no longer gathered as one root for
    the whole step; at the forward's end the head is (its copy and its all-gather output)."""
    kw: dict[str, Any] = {
        "model": "llama-3-70b", "gpus": 8, "micro_batch": 1, "seq_len": 2048,
        "precision": "amp-bf16", "checkpointing": "full", "fsdp": "full_shard",
    }  # fmt: skip
    head, embedding = 128256 * 8192 + 8192, 128256 * 8192
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    own = estimate_memory(**kw)
    root = estimate_memory(fsdp_units="blocks-only", **kw)
    assert own.peak.points["forward end"]["FSDP gathered parameters"] == 2 * 2 * head
    assert root.peak.points["forward end"]["FSDP gathered parameters"] == 2 * (
        head + embedding + 2 * layer
    )
    assert own.peak.moments["backward end"]["FSDP gathered parameters"] == 2 * embedding
    # CPU offload: the units in flight are the whole of what the GPU holds of the model
    off = estimate_memory(offload_params=True, **kw)
    off_root = estimate_memory(offload_params=True, fsdp_units="blocks-only", **kw)
    assert off.peak_bytes < off_root.peak_bytes - 2**30


def test_the_exported_fsdp_job_shards_the_units_its_config_names(tmp_path: Any) -> None:
    """The job's `config.fsdp_units` is the Session's: a list of names trains, a name that
    matches no module stops the job naming the modules that exist."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.integration.job_runs import run_script
    from workbench.export import export_job

    config = TrainConfig(micro_batch=4, seed=3, fsdp="full_shard", fsdp_units="Block,ln_f")
    out = Path(export_job(config, format="fsdp", gpus=1, out_dir=tmp_path / "ok").out_dir)
    lines, _ = run_script("train_fsdp.py", out, steps=1)
    assert len(lines) == 1
    bad = Path(
        export_job(config.replace(fsdp_units="Block,nope"), format="fsdp", gpus=1,
                   out_dir=tmp_path / "bad").out_dir
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "train_fsdp.py", "--steps", "1"], cwd=bad, capture_output=True,
        text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    assert done.returncode != 0
    assert "config.fsdp_units 'Block,nope': 'nope' matches no module" in done.stderr
    assert "CausalSelfAttention" in done.stderr


def test_the_exported_lightning_fsdp_strategy_wraps_the_configs_units() -> None:
    """The Lightning job's FSDP strategy (FSDP1, built here without running: it needs a GPU
    to train) wraps each module of the units `fsdp_units` names, and nothing else."""
    from workbench.export.train_lightning import strategy

    model = llama()
    job = {"strategy": "fsdp", "config": {"fsdp": "full_shard", "fsdp_units": "blocks"}}
    policy = strategy(job, model, 2).kwargs["auto_wrap_policy"]
    wrapped = [
        n for n, m in model.named_modules() if policy(module=m, recurse=False, nonwrapped_numel=0)
    ]
    assert wrapped == [
        "model.embed_tokens",
        "model.layers.0",
        "model.layers.1",
        "model.norm",
        "lm_head",
    ]
