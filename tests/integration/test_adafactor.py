"""torch's Adafactor (`optimizer="adafactor"`) trained in a Session: the same losses as a
hand-written torch loop, its factored states counted to the byte by the estimator, and
refused by name where an engine does not train it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

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


@pytest.mark.parametrize("settings", [{"fsdp": "full_shard"}, {"zero_stage": 2}])
def test_an_engine_that_cannot_train_it_refuses_it_by_name(settings: dict[str, object]) -> None:
    refused = pytest.raises(ConfigError, match=r"optimizer='adafactor': .*trains in the plain loop")
    with refused, Session(_config(**settings), model="mlp") as s:
        s.run(optimizer_steps=1)


def test_fsdp2_fails_its_step_which_is_why_the_row_leaves_fsdp_out() -> None:
    """The reason the row gives, as torch 2.13 says it: on FSDP2's sharded parameters (one
    gloo rank here) Adafactor's in-place statistics need a placement change. When torch
    steps it, this fails, and the row can take "fsdp" with a test of its losses."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    assert row("adafactor").engines == ("plain",)
    assert "FSDP2" in (row("adafactor").engines_reason or "")
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


def test_a_dry_run_refuses_it_by_name() -> None:
    from workbench import simulate_memory
    from workbench.train.dry_run.problems import DryRunError

    with pytest.raises(DryRunError, match=r"optimizer='adafactor': .*fake tensors cannot"):
        simulate_memory("tiny-gpt", _config())
