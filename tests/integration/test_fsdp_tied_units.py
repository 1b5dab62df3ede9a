"""FSDP units that split a tied weight are refused where the units are resolved.

The built-in GPT ties its output head to its embedding (`head.weight is wte.weight`, as
GPT-2 does). FSDP2 shards each weight in one unit, so `fsdp_units` naming the head (or the
embedding) as a unit of its own, with the other module left in the root or in another
unit, stops `fully_shard` half-way ("Parameter 'head.weight' is shared with a parameter
already managed by another FSDP group"). The one resolver (`job_parallel.resolve_units`)
refuses it before anything is built or sharded, naming the field, the value and what is
allowed: the Session (a new one, and a live change that leaves the running one as it was),
the dry run and the exported jobs; "blocks" keeps the tied head with the embedding.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import TINY
from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.export.job_parallel import resolve_units
from workbench.models import build_model
from workbench.train.dry_run import simulate_memory
from workbench.train.dry_run.problems import DryRunError
from workbench.train.techniques.recompute import checkpointable_modules

GPT = {**TINY, "dropout": 0.0}
ALLOWED = "the tied weight's modules must be in one unit"


def _config(**kw: Any) -> TrainConfig:
    return TrainConfig(device="cpu", micro_batch=4, seed=0, fsdp="full_shard", **kw)


def test_the_resolver_refuses_a_tied_weight_in_two_units() -> None:
    gpt, _, _, _ = build_model("tiny-gpt", **GPT)
    assert gpt.head.weight is gpt.wte.weight
    blocks = checkpointable_modules(gpt)
    for spec in ("blocks", "blocks-only", "Block", "blocks.*, ln_f", "blocks.0"):
        assert resolve_units(gpt, spec, blocks)[1] is None, spec
    _, problem = resolve_units(gpt, "Block,head", blocks)
    assert problem is not None
    assert problem.startswith("'head.weight' is 'wte.weight'")
    assert "'head.weight' in unit 'head' and 'wte.weight' in the root" in problem
    assert ALLOWED in problem and "leave 'head' out" in problem
    _, problem = resolve_units(gpt, "wte, head", blocks)  # each in a unit of its own
    assert problem is not None and "leave 'wte' and 'head' out" in problem
    # a name matching no module is still told first, naming the modules that exist
    _, problem = resolve_units(gpt, "head, nope", blocks)
    assert problem is not None and problem.startswith("'nope' matches no module")


def test_the_dry_run_and_the_lightning_job_refuse_it(capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.export.train_lightning import job_units

    gpt, _, _, _ = build_model("tiny-gpt", **GPT)
    with pytest.raises(DryRunError) as dry:
        simulate_memory(
            "tiny-gpt",
            _config(fsdp_units="Block,head"),
            model_options=GPT,
            world_size=2,
            progress=False,
        )
    assert [(p.field, p.value) for p in dry.value.problems] == [("fsdp_units", "Block,head")]
    assert ALLOWED in str(dry.value)
    with pytest.raises(SystemExit):
        job_units(gpt, {"fsdp_units": "Block,head"})
    assert (
        "config.fsdp_units 'Block,head': 'head.weight' is 'wte.weight'" in capsys.readouterr().err
    )


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of 2 ranks: a Session given the split refused; a running one refusing it as a
    change and training on as it was; the exported FSDP job's sharding refusing it."""
    import torch

    from workbench.export import train_fsdp

    result: dict[str, Any] = {}
    try:
        Session(_config(fsdp_units="Block,head"), model_options=GPT).close()
        result["new"] = "accepted"
    except ConfigError as exc:
        result["new"] = [[p.field, p.value, p.message] for p in exc.problems]
    with Session(_config(fsdp_units="Block"), model_options=GPT) as s:
        first = s.run(optimizer_steps=1, progress=False)
        try:
            s.update(fsdp_units="Block,head")
            result["change"] = "accepted"
        except ValueError as exc:
            result["change"] = str(exc)
        after = s.run(optimizer_steps=1, progress=False)
        result["running"] = {
            "units": s.config.fsdp_units,
            "steps": [r.step for r in first + after],
            "losses": [r.loss for r in first + after],
            "errors": [e.message for e in s.events if e.kind == "error"],
        }
    gpt, _, _, _ = build_model("tiny-gpt", **GPT)
    job = {"fsdp": "full_shard", "precision": "fp32", "fsdp_units": "Block,head"}
    try:
        train_fsdp.shard(gpt, job, torch.device("cpu"))
        result["job"] = "sharded"
    except SystemExit as stop:
        result["job"] = f"exit {stop.code}"
    return result


def test_two_ranks_refuse_it_before_anything_is_sharded(tmp_path: Any) -> None:
    for r, got in enumerate(run_ranks(_rank, tmp_path)):
        assert "error" not in got, (r, got["error"])
        assert [p[:2] for p in got["new"]] == [["fsdp_units", "Block,head"]], got["new"]
        assert ALLOWED in got["new"][0][2]
        assert got["change"].startswith("invalid setting: fsdp_units='Block,head': "), got
        assert ALLOWED in got["change"]
        running = got["running"]
        assert running["units"] == "Block" and running["steps"] == [1, 2]
        assert not running["errors"], running["errors"]
        assert got["job"] == "exit 2"
