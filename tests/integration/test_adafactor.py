"""torch's Adafactor (`optimizer="adafactor"`) trained in a Session: the same losses as a
hand-written torch loop, its factored states counted to the byte by the estimator, and
refused by name where an engine does not train it. Under FSDP2 (2 gloo ranks) its shards
step with `ShardedAdafactor`: the same parameters and states as torch's Adafactor on the
whole tensors, the same losses as the plain loop, and each rank's states the estimator's
per-rank figure."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.optimizers import row

STEPS = 5
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "dropout": 0.0}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))


def _batches() -> DataLoader:
    """The same 8 samples STEPS times over, in order: the loss must fall."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
    data = TensorDataset(x.repeat(STEPS, 1), y.repeat(STEPS, 1))
    return DataLoader(data, batch_size=8, shuffle=False)


def _config(**kw: object) -> TrainConfig:
    base: dict[str, object] = {"micro_batch": 8, "lr": 1e-2, "seed": 0, "optimizer": "adafactor"}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """torch's own state bytes, the 0-dim step counters left out (as for every optimizer)."""
    return sum(
        v.numel() * v.element_size()
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )


def test_the_session_trains_it_as_a_hand_written_torch_loop() -> None:
    module = _model()
    hand = _model()
    optimizer = torch.optim.Adafactor(
        hand.parameters(), lr=1e-2, weight_decay=_config().weight_decay
    )
    want = []
    for x, y in _batches():
        loss = nn.functional.mse_loss(hand(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        want.append(loss.item())
    with Session(_config(), model=module, data=_batches(), loss_fn=nn.functional.mse_loss) as s:
        got = [r.loss for r in s.run(optimizer_steps=STEPS)]
        assert type(s.backend.optimizer).__name__ == "Adafactor"
    assert got == pytest.approx(want, abs=1e-6)
    assert want[-1] < want[0]


def test_its_factored_states_are_predicted_to_the_byte() -> None:
    with Session(_config(), model="tiny-gpt", model_options=TINY) as s:
        records = s.run(optimizer_steps=3)
        report = s.memory()
        measured = state_bytes(s.backend.optimizer)
    assert records[-1].loss < records[0].loss
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == measured
    assert report.predicted.optimizer_bytes == measured
    n = sum(p.numel() for p in s.model.parameters())
    assert measured < 4 * n // 2  # factored: far under a full second moment


def test_deepspeed_which_cannot_train_it_refuses_it_by_name() -> None:
    refused = pytest.raises(ConfigError, match=r"optimizer='adafactor': .*DeepSpeed has no")
    with refused, Session(_config(zero_stage=2), model="mlp") as s:
        s.run(optimizer_steps=1)


def test_torchs_own_class_still_fails_fsdp2s_shards_so_the_row_names_a_sharded_step() -> None:
    """Why the row's `sharded_factory` exists, as torch 2.13 says it: on FSDP2's sharded
    parameters (one gloo rank here) torch's Adafactor squares the column norm, a partial
    DTensor, in place, which needs a placement change. When torch steps it, this fails,
    and the row can drop its `sharded_factory` (the tests below then hold torch's class)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    assert "fsdp" in row("adafactor").engines
    assert (row("adafactor").sharded_factory or "").endswith(":ShardedAdafactor")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        module = fully_shard(_model())
        opt = torch.optim.Adafactor(module.parameters(), lr=1e-2)
        module(torch.randn(4, 8)).sum().backward()
        with pytest.raises(RuntimeError, match="placement changes are not supported"):
            opt.step()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("impl", ["for-loop", "foreach"])
def test_its_step_temporaries_are_the_formulas(impl: str) -> None:
    """The second step's allocations beyond the states, measured on the tiny Llama: foreach
    one copy of every parameter (exact); the for-loop `row_var @ col_var` with the previous
    one still bound, and the row and column means the formula bounds (within 1%)."""
    from peak_measure import LiveBytes, estimator_inputs, tiny_llama

    from workbench.estimate.peak import engine_of, optimizer_temporaries, resolve_impl

    model = tiny_llama()
    opt = torch.optim.Adafactor(model.parameters(), lr=1e-2, foreach=impl == "foreach")
    ids = torch.randint(0, 100, (3, 32), generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # the first step makes the states, the second is measured
        model(input_ids=ids, labels=ids).loss.backward()
        with LiveBytes(scalars=False) as live:
            opt.step()
        opt.zero_grad(set_to_none=True)
    i = estimator_inputs(model=tiny_llama(), optimizer="adafactor", optimizer_impl=impl)
    formula = optimizer_temporaries(i, engine_of(i), impl)
    if impl == "foreach":
        assert formula == live.peak_bytes
    else:
        assert live.peak_bytes <= formula <= 1.01 * live.peak_bytes
    auto = estimator_inputs(model=tiny_llama(), optimizer="adafactor")
    assert resolve_impl(auto, engine_of(auto)) == "for-loop"  # what torch builds untold


def test_stepped_inside_backward_it_trains_the_same_losses() -> None:
    """Adafactor's statistics are per parameter: one optimizer per parameter
    (`optimizer_in_backward`) steps exactly as one over all of them."""
    options = {**TINY, "hidden": 32}
    with Session(_config(), model="tiny-gpt", model_options=options) as s:
        want = [r.loss for r in s.run(optimizer_steps=3)]
    with Session(_config(optimizer_in_backward=True), model="tiny-gpt", model_options=options) as s:
        got = [r.loss for r in s.run(optimizer_steps=3)]
    assert got == want


@pytest.mark.parametrize(("settings", "ranks"), [({}, 1), ({"fsdp": "full_shard"}, 2)])
def test_a_dry_run_refuses_it_by_name(settings: dict[str, object], ranks: int) -> None:
    """Plain, and under FSDP on a fake group of 2 ranks: its sharded step reads the norms
    with .item() as torch's does."""
    from workbench import simulate_memory
    from workbench.train.dry_run.problems import DryRunError

    with pytest.raises(DryRunError, match=r"optimizer='adafactor': .*fake tensors cannot"):
        simulate_memory("tiny-gpt", _config(**settings), world_size=ranks)


# --------------------------------------------------------------------------- FSDP2, 2 ranks
#: the sharded step against torch's on every kind of parameter, each with an odd number
#: of rows (FSDP2's uneven shards): a vector, a matrix, a matrix with fewer rows than
#: ranks, 3 dimensions
SHAPES = ((5,), (5, 3), (1, 4), (3, 2, 5))
#: seq_len 15: the position embedding's 15 rows split 8 + 7, so the ranks hold different
#: state bytes (tiny-gpt has a shape: the estimator counts its factored states from it)
GPT = {**TINY, "seq_len": 15}


def held_bytes(optimizer: Any) -> int:
    """The state bytes this rank holds: each DTensor state's local shard, the 0-dim step
    counters left out (as `state_bytes`)."""
    return sum(
        t.numel() * t.element_size()
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
        for t in [v.to_local() if hasattr(v, "to_local") else v]
    )


def _sharded_against_torch(foreach: bool) -> dict[str, Any]:
    """`ShardedAdafactor` on dim-0 shards of SHAPES and torch's Adafactor on the whole
    tensors, 4 steps of the same gradients with weight decay: the largest difference of
    any parameter or state, and where the shards keep their statistics."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from workbench.train.techniques.sharded_adafactor import ShardedAdafactor

    mesh = init_device_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(0)
    whole = [nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]
    shards = [nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in whole]
    kw: dict[str, Any] = {"lr": 1e-2, "weight_decay": 0.1, "foreach": foreach}
    theirs, ours = torch.optim.Adafactor(whole, **kw), ShardedAdafactor(shards, **kw)
    for _ in range(4):
        for p, q in zip(whole, shards, strict=True):
            grad = torch.randn(p.shape, generator=g)
            p.grad, q.grad = grad.clone(), distribute_tensor(grad, mesh, [Shard(0)])
        theirs.step()
        ours.step()
    worst, placed = 0.0, {}
    for p, q in zip(whole, shards, strict=True):
        worst = max(worst, (q.full_tensor() - p).abs().max().item())
        assert theirs.state[p].keys() == ours.state[q].keys()
        for key, want in theirs.state[p].items():
            got = ours.state[q][key]
            got = got.full_tensor() if hasattr(got, "full_tensor") else got
            assert got.shape == want.shape, (p.shape, key)
            worst = max(worst, (got - want).abs().max().item())
            if key != "step":
                placed[f"{tuple(p.shape)} {key}"] = str(ours.state[q][key].placements[0])
    return {"worst": worst, "placed": placed}


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of 2 ranks: the sharded step against torch's, then a Session under FSDP2."""
    result: dict[str, Any] = {}
    result["step"] = {str(f): _sharded_against_torch(f) for f in (False, True)}
    config = _config(device="cpu", fsdp="full_shard")
    with Session(config, model="tiny-gpt", model_options=GPT) as s:
        records = s.run(optimizer_steps=STEPS)
        report = s.memory()
        assert report.predicted is not None
        result["session"] = {
            "optimizer": type(s.backend.optimizer).__name__,
            "losses": [r.loss for r in records],
            "held": held_bytes(s.backend.optimizer),
            "measured": report.optimizer_bytes - report.optimizer_step_counter_bytes,
            "predicted": report.predicted.optimizer_bytes,
            "errors": [e.message for e in s.events if e.kind == "error"],
        }
        gathered = s.backend.export_state()["optimizer"]["state"]  # collective
        torch.save(gathered, os.path.join(out_dir, f"state-{rank}.pt"))
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("adafactor-fsdp")
    got = run_ranks(_rank, out)
    for r, result in enumerate(got):
        assert "error" not in result, (r, result["error"])
        assert not result["session"]["errors"], (r, result["session"]["errors"])
    return got, out


def test_its_sharded_step_is_torchs_step_on_the_whole_tensors(ranks: Any) -> None:
    """Parameters and states equal torch's (foreach and for-loop) to 1e-6 on every rank; a
    rank keeps the row statistic of its rows and the whole column statistic of a matrix
    (its rows' sums reduced over both ranks), and of 3+ dimensions both of its own rows."""
    got, _ = ranks
    for result in got:
        for foreach in ("False", "True"):
            step = result["step"][foreach]
            assert step["worst"] < 1e-6, (foreach, step["worst"])
            placed = step["placed"]
            assert placed["(5, 3) row_var"] == "S(0)" and placed["(5, 3) col_var"] == "R"
            assert placed["(1, 4) col_var"] == "R"
            assert placed["(3, 2, 5) row_var"] == placed["(3, 2, 5) col_var"] == "S(0)"
            assert placed["(5,) variance"] == "S(0)"


def test_a_session_under_fsdp_trains_the_plain_loops_losses_and_states(ranks: Any) -> None:
    """Each rank trains half of the plain loop's batch (DistributedSampler's interleaved
    halves of one order) on gradients averaged over both: the ranks' mean loss is the
    plain loop's on the whole batch, and the statistics gathered from the shards are its."""
    got, out = ranks
    with Session(_config(micro_batch=16), model="tiny-gpt", model_options=GPT) as s:
        want = [r.loss for r in s.run(optimizer_steps=STEPS)]
        plain = s.backend.export_state()["optimizer"]["state"]
    assert want[-1] < want[0]
    for result in got:
        assert result["session"]["optimizer"] == "ShardedAdafactor"
    mean = [(a + b) / 2 for a, b in zip(*(r["session"]["losses"] for r in got), strict=True)]
    assert mean == pytest.approx(want, rel=1e-5, abs=1e-6)
    for r in (0, 1):
        gathered = torch.load(out / f"state-{r}.pt", weights_only=True)
        assert gathered.keys() == plain.keys()
        for name, states in plain.items():
            assert gathered[name].keys() == states.keys(), name
            for key, value in states.items():
                torch.testing.assert_close(gathered[name][key], value, rtol=1e-5, atol=1e-7)


def test_each_ranks_states_are_the_estimators_per_rank_figure_to_the_byte(ranks: Any) -> None:
    """The estimator counts a rank's share of every parameter's rows (rounded up, as FSDP2
    pads) and the whole column statistic: rank 0 (8 of the position embedding's 15 rows)
    holds exactly that, rank 1 (7) one row statistic less; `session.memory()` counts what
    each holds."""
    got, _ = ranks
    first, second = (r["session"] for r in got)
    assert first["held"] == first["measured"] == first["predicted"]
    assert second["held"] == second["measured"] == first["held"] - 4  # one fp32 row less
    assert second["predicted"] == first["predicted"]


@pytest.mark.gpu
def test_on_a_gpu_the_sharded_step_is_torchs_step() -> None:
    """On one CUDA rank (NCCL refuses two ranks on one GPU) FSDP2's parameters are still
    DTensors: the sharded step's reductions and norms run on the device and give torch's
    own step on an unsharded copy."""
    import copy

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from workbench.train.techniques.sharded_adafactor import ShardedAdafactor

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        whole = _model().cuda()
        sharded = fully_shard(copy.deepcopy(whole))
        theirs = torch.optim.Adafactor(whole.parameters(), lr=1e-2, weight_decay=0.1)
        ours = ShardedAdafactor(sharded.parameters(), lr=1e-2, weight_decay=0.1)
        for _ in range(3):
            x = torch.randn(4, 8, device="cuda")
            for module, opt in ((whole, theirs), (sharded, ours)):
                module(x).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        for p, q in zip(whole.parameters(), sharded.parameters(), strict=True):
            assert torch.allclose(q.full_tensor(), p, atol=1e-6)
    finally:
        dist.destroy_process_group()
