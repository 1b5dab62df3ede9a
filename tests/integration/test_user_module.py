"""Your own module keeps what it learned: after close() and after every engine switch it
holds the trained weights (gathered from DeepSpeed's copies and shards), and
`state_dict()` / `save_weights()` give them to plain torch at any time."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench import Session, TrainConfig

STEPS = 4


def make_module() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 8, generator=g)
    return TensorDataset(x, x[:, :4] * 2.0 - 1.0)


def train(stage: int, **kw: object) -> tuple[nn.Module, Session]:
    module = make_module()
    config = TrainConfig(
        micro_batch=8, grad_accum=2, lr=0.05, optimizer="sgd", seed=1, zero_stage=stage, **kw
    )
    s = Session(config, model=module, data=data(), loss_fn=nn.functional.mse_loss)
    s.run(optimizer_steps=STEPS)
    return module, s


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    """Weights after STEPS steps of the plain loop (stage 0, no engine)."""
    module, s = train(0)
    s.close()
    return {k: v.clone() for k, v in module.state_dict().items()}


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_zero_stage_leaves_the_trained_weights_in_your_module(
    stage: int, reference: dict[str, torch.Tensor]
) -> None:
    initial = {k: v.clone() for k, v in make_module().state_dict().items()}
    module, s = train(stage)
    full = s.state_dict()  # while the engine still trains: gathered from its shards
    assert_same_weights(full, reference)
    assert all(v.numel() > 0 for v in full.values())  # ZeRO-3: not the empty (0,) shards
    s.close()
    assert s.model is module
    assert_same_weights(module.state_dict(), reference)
    assert any(not torch.equal(module.state_dict()[k], initial[k]) for k in initial)


def test_offload_and_deepspeed_bf16_return_fp32_trained_weights(
    reference: dict[str, torch.Tensor],
) -> None:
    module, s = train(2, offload_optimizer="cpu")
    s.close()
    assert_same_weights(module.state_dict(), reference)
    initial = make_module().state_dict()
    module, s = train(3, precision="bf16", offload_params="cpu", offload_optimizer="cpu")
    s.close()
    for k, v in module.state_dict().items():
        assert v.dtype == torch.float32, k  # your module's own dtype, not the engine's bf16
        assert not torch.equal(v, initial[k]), k  # it trained
        # bf16 arithmetic: close to the fp32 run, not equal
        torch.testing.assert_close(v, reference[k], rtol=0.05, atol=0.02, msg=k)


def test_every_engine_switch_brings_the_weights_home(reference: dict[str, torch.Tensor]) -> None:
    module = make_module()
    config = TrainConfig(
        micro_batch=8, grad_accum=2, lr=0.05, optimizer="sgd", seed=1, zero_stage=3
    )
    seen: list[dict[str, torch.Tensor]] = []
    with Session(config, model=module, data=data(), loss_fn=nn.functional.mse_loss) as s:
        s.run(optimizer_steps=2)
        s.update(zero_stage=2)  # ZeRO-3 engine -> ZeRO-2 engine: module gets step-2 weights
        seen.append({k: v.clone() for k, v in module.state_dict().items()})
        s.run(optimizer_steps=1)
        s.update(zero_stage=0)  # -> the plain loop trains the module itself
        assert s.model is module
        s.run(optimizer_steps=1)
    assert not torch.equal(seen[0]["0.weight"], make_module().state_dict()["0.weight"])
    assert_same_weights(module.state_dict(), reference)


def test_save_weights_loads_with_plain_torch(
    tmp_path: object, reference: dict[str, torch.Tensor]
) -> None:
    from pathlib import Path

    module, s = train(2)
    path = s.save_weights(Path(str(tmp_path)) / "weights.pt")
    s.close()
    loaded = torch.load(path, weights_only=True)
    assert_same_weights(loaded, reference)
    fresh = make_module()
    fresh.load_state_dict(loaded)  # strict: every key of the user's module
    assert_same_weights(fresh.state_dict(), reference)


def test_save_weights_rejects_a_bad_path() -> None:
    with (
        Session(TrainConfig(micro_batch=4), model="mlp") as s,
        pytest.raises(ValueError, match="path=None: must be a file path"),
    ):
        s.save_weights(None)  # type: ignore[arg-type]


def test_events_count_steps_like_the_records() -> None:
    with Session(TrainConfig(micro_batch=4, lr=1e-2), model="mlp") as s:
        s.run(optimizer_steps=2)
        s.update(grad_accum=2)
        s.run(optimizer_steps=1)
        change = [e for e in s.events if e.kind == "change"][-1]
        record = s.history[-1]
        assert record.changes == {"grad_accum": 2}
        assert change.step == record.step == 3


def test_a_nan_loss_in_fp32_advises_lr_and_clipping_not_16_bit() -> None:
    def nan_after_two(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        loss = nn.functional.mse_loss(out, y)
        return loss * float("nan") if len(calls) > 2 else loss

    calls: list[int] = []
    with Session(
        TrainConfig(micro_batch=8, lr=1e-2), model=make_module(), data=data(), loss_fn=nan_after_two
    ) as s:
        records = s.run(optimizer_steps=5)
        assert s.state == "paused" and len(records) == 3
        ev = [e for e in s.events if e.kind == "nan-loss"][-1]
        assert ev.step == records[-1].step == 3  # the step it happened at, as the record says
        assert "lower lr" in ev.message and "clip_grad_norm" in ev.message
        assert "bf16" not in ev.message and "loss_scale" not in ev.message
        assert s.failure == ev.message


def test_a_background_failure_is_logged_where_the_user_looks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("the loss broke")
        return nn.functional.mse_loss(out, y)

    calls: list[int] = []
    with (
        caplog.at_level("WARNING", logger="workbench"),
        Session(TrainConfig(micro_batch=8), model=make_module(), data=data(), loss_fn=broken) as s,
    ):
        s.start(optimizer_steps=10)
        assert s.wait(timeout=60) == "error"
        assert s.failure is not None and "the loss broke" in s.failure
    messages = [r.getMessage() for r in caplog.records if r.name == "workbench"]
    assert any("the loss broke" in m and "step 3 failed" in m for m in messages), messages


def test_zero3_leaves_torchs_linear_as_it_found_it() -> None:
    """ZeRO-3 patches torch.nn.functional.linear process-wide; after the last stage-3
    engine closes, later models in the notebook run torch's own function again."""
    original = torch.nn.functional.linear
    with Session(TrainConfig(micro_batch=4, zero_stage=3), model="mlp") as s:
        s.run(optimizer_steps=1)
        s.update(offload_optimizer="cpu")  # one stage-3 engine replaces another
        s.run(optimizer_steps=1)
    assert torch.nn.functional.linear is original


def test_run_shows_a_progress_bar_only_when_asked_or_in_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with Session(TrainConfig(micro_batch=4), model="mlp") as s:
        s.run(optimizer_steps=2)  # stderr is not a terminal here: silent
        assert "step" not in capsys.readouterr().err
        s.run(optimizer_steps=3, progress=True)
        err = capsys.readouterr().err
        assert "3/3" in err and "loss=" in err  # tqdm's bar, fed by the records
        with pytest.raises(ValueError, match="progress='yes': must be True, False or None"):
            s.run(optimizer_steps=1, progress="yes")  # type: ignore[arg-type]
