"""`--hsdp` / `plan(hsdp=True)` pins HSDP: only layouts that shard inside a node and
replicate across are ranked, and one line says what rules HSDP out when none can."""

from __future__ import annotations

import pytest

from workbench.cli import main
from workbench.planner import plan

SHAPE = ["plan", "--model", "llama-3-8b", "--seq-len", "8192", "--global-batch", "64", "--hsdp"]


def test_hsdp_ranks_only_hsdp_layouts() -> None:
    got = plan(model="llama-3-8b", nodes=2, seq_len=8192, global_batch=64, hsdp=True)
    assert got.plans
    for p in got.plans + got.unfit:
        assert p.engine in ("full_shard", "shard_grad_op"), p.label()
        assert any(e.startswith("hsdp ") for e in p.extras), p.label()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ([], "--hsdp: HSDP shards inside a node and replicates across nodes; --nodes 1: give "
         "two or more (--nodes, --gpus), or leave --hsdp out"),
        (["--nodes", "2", "--engines", "zero3"], "--hsdp: HSDP is FSDP's (full_shard, "
         "shard_grad_op); the engines planned are zero3"),
    ],
)  # fmt: skip
def test_no_hsdp_layout_is_said_in_one_line(
    extra: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SHAPE, *extra]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err == f"workbench plan: error: {said}\n"


def test_no_layout_sharding_inside_a_node_is_said() -> None:
    with pytest.raises(ValueError, match=r"^hsdp=True: no layout of the 16 GPUs shards inside"):
        plan(model="llama-3-8b", nodes=2, seq_len=8192, global_batch=64, hsdp=True,
             pin={"cp": 16, "engine": "full_shard"})  # fmt: skip
