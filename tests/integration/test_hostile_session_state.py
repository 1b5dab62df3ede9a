"""State one Session must not take from another, or lose at a switch: each Session draws
its random numbers (dropout) from its own stream, so two Sessions in one process train
what each trains alone, a resumed one continues its checkpoint's stream, and the notebook's
own torch RNG is left as it was; a ZeRO switch after DeepSpeed bf16 with LoRA applies and
keeps training the adapters over the frozen base."""

from __future__ import annotations

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.train import checkpoints as ckpt
from workbench.train.records import StepRecord

#: tiny-gpt with dropout, so the RNG a step draws from decides its loss
DROPPY = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "dropout": 0.3}


def _config(seed: int, **kw: object) -> TrainConfig:
    return TrainConfig(micro_batch=4, lr=1e-2, seed=seed, **kw)  # type: ignore[arg-type]


def _session(seed: int, **kw: object) -> Session:
    return Session(_config(seed, **kw), model_options=dict(DROPPY))


def _losses(records: list[StepRecord]) -> list[float]:
    return [r.loss for r in records]


def _alone(seed: int, steps: int) -> list[float]:
    with _session(seed) as s:
        return _losses(s.run(steps, progress=False))


@pytest.mark.parametrize("other_seed", [1, 2], ids=["same-seed", "other-seed"])
def test_a_second_session_does_not_change_the_first_ones_losses(other_seed: int) -> None:
    alone = _alone(1, 3)
    a = _session(1)
    try:
        first = _losses(a.run(1, progress=False))
        with _session(other_seed) as b:  # a new session in the same process
            b.run(2, progress=False)
            rest = _losses(a.run(2, progress=False))
    finally:
        a.close()
    assert first + rest == alone  # bit for bit


def test_two_sessions_training_at_once_each_train_what_they_train_alone() -> None:
    alone_a, alone_b = _alone(1, 4), _alone(2, 4)
    a, b = _session(1), _session(2)
    try:
        a.start(4)  # a background thread
        got_b = _losses(b.run(4, progress=False))  # this thread, at the same time
        assert a.wait(timeout=120) == "idle"
        got_a = _losses(a.records_since(0))
    finally:
        a.close()
        b.close()
    assert got_a == alone_a
    assert got_b == alone_b


def test_a_session_leaves_the_notebooks_torch_rng_as_it_was() -> None:
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    with _session(5) as s:
        s.run(2, progress=False)
        between = torch.rand(2)  # the notebook draws between runs
        s.run(1, progress=False)
    got = torch.cat((between, torch.rand(2)))
    assert torch.equal(got, expected)


def test_a_resumed_session_continues_its_checkpoints_stream_beside_another(tmp_path) -> None:
    a = _session(1)
    try:
        a.run(2, progress=False)
        with _session(9) as b:
            b.run(1, progress=False)
            path = a.save_checkpoint(tmp_path / "mid.pt")  # a's stream, not the process's
            rest = _losses(a.run(2, progress=False))
            resumed = Session.resume_from(path)
            try:
                b.run(1, progress=False)  # another session draws before the resumed one runs
                continued = _losses(resumed.run(2, progress=False))
            finally:
                resumed.close()
    finally:
        a.close()
    assert continued == rest
    assert "torch" in ckpt.load(path)["rng"]


def test_zero_switch_after_deepspeed_bf16_with_lora_applies_and_keeps_training() -> None:
    """DeepSpeed's bf16 engine with LoRA, then `update(zero_stage=1)`: the engine is
    rebuilt over the same frozen base (not in the engine's state, which holds what trains),
    the adapters carried, and the losses go on as a run that never switched."""
    settings = {"precision": "bf16", "lora_rank": 4}
    opts = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "dropout": 0.0}
    with Session(_config(3, **settings), model_options=dict(opts)) as ref:
        expected = _losses(ref.run(4, progress=False))
    with Session(_config(3, **settings), model_options=dict(opts)) as s:
        got = _losses(s.run(2, progress=False))
        adapters = s.lora()
        base = {
            n: p.detach().float().clone()
            for n, p in s.model.named_parameters()
            if not p.requires_grad
        }
        s.update(zero_stage=1)
        assert s.config.zero_stage == 1 and s.backend.zero_stage == 1
        got += _losses(s.run(2, progress=False))
        assert s.state == "idle"
        assert s.lora() == adapters  # the same adapters train
        trained = dict(s.model.named_parameters())
        assert base and all(not trained[n].requires_grad for n in base)
        for n, v in base.items():  # the frozen base unchanged by the switch
            torch.testing.assert_close(trained[n].detach().float(), v, atol=0, rtol=0)
    assert got == pytest.approx(expected, rel=1e-2)


@pytest.mark.parametrize("engine", [{}, {"zero_stage": 1}], ids=["plain", "zero1"])
def test_a_lora_rank_change_on_a_live_session_applies_and_trains(engine: dict) -> None:
    """The adapters of the new rank have the old ones' names: they start fresh (their
    optimizer state is not carried into other shapes), the old ones merged into the base."""
    opts = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "dropout": 0.0}
    with Session(_config(3, lora_rank=4, **engine), model_options=dict(opts)) as s:
        before = _losses(s.run(2, progress=False))
        s.update(lora_rank=8)
        after = _losses(s.run(2, progress=False))
        assert s.state == "idle" and s.lora()["rank"] == 8  # type: ignore[index]
    # the merged adapters' update is kept: the loss goes on from where it was
    assert after[0] == pytest.approx(before[-1], rel=5e-2)


@pytest.mark.parametrize(
    "engine",
    [{"zero_stage": 1}, {"fsdp": "full_shard"}, {"precision": "bf16-true"}],
    ids=["zero1", "fsdp", "bf16-true"],
)
def test_an_engines_lora_checkpoint_keeps_the_adapters_merged_at_a_switch(
    engine: dict, tmp_path
) -> None:
    """A LoRA switch merges the adapters trained so far into the frozen base; an engine's
    checkpoint after it holds that base too, so the resumed run goes on exactly."""
    opts = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "dropout": 0.0}
    with Session(_config(3, lora_rank=4, **engine), model_options=dict(opts)) as a:
        a.run(2, progress=False)
        a.update(lora_rank=8)  # the rank-4 adapters' training now lives in the base
        a.run(1, progress=False)
        path = a.save_checkpoint(tmp_path / "mid.pt")
        rest = _losses(a.run(2, progress=False))
    weights = ckpt.load(path)["backend"]["model"]
    assert any(name.endswith("base_layer.weight") for name in weights)
    with Session.resume_from(path) as b:
        assert _losses(b.run(2, progress=False)) == rest


def test_a_callback_on_a_skipped_step_can_wait_for_another_session() -> None:
    """A non-finite loss's record reaches the callbacks after the step released what it
    held: a callback that waits for another session's background run does not hang."""
    calls = {"n": 0}

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        loss = torch.nn.functional.mse_loss(outputs, targets)
        return loss * float("nan") if calls["n"] == 2 else loss

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    a = Session(_config(1), model=torch.nn.Linear(4, 1), data=data, loss_fn=loss_fn)
    b = _session(2)
    seen: list[str] = []

    def on_record(record: StepRecord) -> None:
        if record.skipped:
            b.start(2)
            seen.append(b.wait(timeout=60))

    a.on_record(on_record)
    try:
        a.run(3, progress=False)
    finally:
        a.close()
        b.close()
    assert seen == ["idle"]


def test_pure_bf16_with_lora_leaves_your_modules_frozen_weights_exact() -> None:
    """Under "bf16-true" the loop trains a bf16 copy; the base LoRA freezes is never
    trained, so your module gets it back as it gave it, not rounded to bf16."""
    from workbench.models import build_model

    opts = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}
    model, data, loss, _ = build_model("tiny-gpt", **opts)  # type: ignore[arg-type]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = _config(3, precision="bf16-true", lora_rank=4)
    with Session(config, model=model, data=data, loss_fn=loss) as s:
        s.run(2, progress=False)
        frozen = [n for n, p in s.model.named_parameters() if not p.requires_grad]
        s.state_dict()  # the trained weights brought into your module mid-run too
        assert torch.equal(model.wte.weight, before["wte.weight"])
    assert "wte.weight" in frozen
    assert torch.equal(model.wte.weight, before["wte.weight"])  # frozen, not a target
