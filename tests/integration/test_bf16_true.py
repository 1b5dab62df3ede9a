"""Pure bf16 ("bf16-true", Lightning's name): bf16 weights, gradients and optimizer states,
no fp32 master copy, no autocast, no loss scaler, on the plain loop and on FSDP2 (one rank
in this process, two gloo ranks); refused wherever DeepSpeed would train it. Your own
module keeps its dtype and gets the trained weights back."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig
from workbench.models import build_model
from workbench.train.backends.fsdp import FSDPBackend
from workbench.train.backends.plain import PlainBackend
from workbench.train.techniques.precision import build_precision

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 512}
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16}


def config(**kw: object) -> TrainConfig:
    base: dict[str, object] = {"precision": "bf16-true", "micro_batch": 8, "lr": 1e-2, "seed": 1}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def state_dtypes(backend: object) -> set[torch.dtype]:
    """The dtypes of the optimizer's per-parameter state tensors (not Adam's step)."""
    optimizer = backend.optimizer  # type: ignore[attr-defined]
    return {v.dtype for st in optimizer.state.values() for v in st.values() if v.dim() > 0}


def moments(session: Session) -> dict[str, torch.Tensor]:
    """Adam's first moment of each parameter, by name, as fp32 full tensors."""
    optimizer = session.backend.optimizer  # type: ignore[attr-defined]
    out = {}
    for name, p in session.model.named_parameters():
        value = optimizer.state[p]["exp_avg"]
        full = getattr(value, "full_tensor", None)
        out[name] = (full() if callable(full) else value).detach().float().clone()
    return out


def test_the_policy_has_no_autocast_and_no_scaler() -> None:
    policy = build_precision(config(), "cpu")
    assert policy.dtype is None and policy.scaler is None  # no autocast, no GradScaler
    assert policy.param_dtype is torch.bfloat16 and policy.activation_dtype is torch.bfloat16
    assert build_precision(config(precision="amp-bf16"), "cpu").param_dtype is None


def test_tiny_gpt_trains_in_pure_bf16_and_holds_two_two_four_bytes_per_parameter() -> None:
    autocast: list[bool] = []
    outputs: list[torch.dtype] = []
    ids: list[torch.dtype] = []
    with Session(config(lr=3e-3), model="tiny-gpt", model_options=TINY) as s:
        assert isinstance(s.backend, PlainBackend)
        s.model.register_forward_pre_hook(lambda m, args: ids.append(args[0].dtype))
        block = s.model.blocks[0]  # type: ignore[index]
        block.register_forward_hook(lambda m, i, o: outputs.append(o.dtype))
        block.register_forward_hook(
            lambda m, i, o: autocast.append(torch.is_autocast_enabled("cpu"))
        )
        records = s.run(optimizer_steps=12)
        assert {p.dtype for p in s.model.parameters()} == {torch.bfloat16}
        assert state_dtypes(s.backend) == {torch.bfloat16}  # AdamW's moments, no fp32 copy
        report = s.memory()
    losses = [r.loss for r in records]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2
    assert all(r.precision == "bf16-true" and r.scale is None and not r.skipped for r in records)
    assert set(ids) == {torch.int64}  # token ids are not cast
    assert set(outputs) == {torch.bfloat16} and not any(autocast)
    n = report.n_params
    assert (report.params_bytes, report.grads_bytes) == (2 * n, 2 * n)
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == 4 * n
    first = records[0]
    assert (first.params_bytes, first.grads_bytes) == (2 * n, 2 * n)
    pred = report.predicted
    assert pred is not None
    assert (pred.params_bytes, pred.grads_bytes, pred.optimizer_bytes) == (2 * n, 2 * n, 4 * n)


def test_floating_inputs_are_cast_to_bf16() -> None:
    seen: list[torch.dtype] = []
    with Session(config(), model="mlp", model_options=MLP) as s:
        first = next(m for m in s.model.modules() if isinstance(m, torch.nn.Linear))
        first.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
        records = s.run(optimizer_steps=3)
    assert seen and set(seen) == {torch.bfloat16}
    assert all(math.isfinite(r.loss) for r in records)


def test_switching_fp32_bf16_true_fp32_keeps_weights_and_optimizer_state() -> None:
    """Into bf16-true the weights and Adam's moments are rounded to bf16; back to fp32
    they are those bf16 values exactly. Your module stays fp32 throughout and holds the
    trained weights after close."""
    module, data, loss_fn, _ = build_model("mlp", seed=1, **MLP)
    with Session(config(precision="fp32"), model=module, data=data, loss_fn=loss_fn) as s:
        s.run(optimizer_steps=2)
        weights = s.state_dict()
        exp_avg = moments(s)
        s.update(precision="bf16-true")
        assert s.model is not module  # the engine's private bf16 copy
        for name, p in s.model.named_parameters():
            assert p.dtype == torch.bfloat16
            torch.testing.assert_close(p.float(), weights[name].bfloat16().float(), msg=name)
        for name, value in moments(s).items():
            torch.testing.assert_close(value, exp_avg[name].bfloat16().float(), msg=name)
        assert state_dtypes(s.backend) == {torch.bfloat16}
        assert all(p.dtype == torch.float32 for p in module.parameters())  # yours: fp32
        middle = s.run(optimizer_steps=2)
        trained = {n: p.detach().float().clone() for n, p in s.model.named_parameters()}
        exp_avg = moments(s)
        s.update(precision="fp32")
        assert s.model is module and all(p.dtype == torch.float32 for p in module.parameters())
        for name, p in module.named_parameters():
            assert torch.equal(p.detach(), trained[name]), name  # bf16 values, as fp32
        for name, value in moments(s).items():
            assert torch.equal(value, exp_avg[name]), name
        assert state_dtypes(s.backend) == {torch.float32}
        last = s.run(optimizer_steps=2)
        final = s.state_dict()
        kinds = [r.changes for r in s.history if r.changes]
    assert kinds == [{"precision": "bf16-true"}, {"precision": "fp32"}]
    assert all(math.isfinite(r.loss) for r in middle + last)
    assert [r.precision for r in middle + last] == ["bf16-true"] * 2 + ["fp32"] * 2
    for name, value in module.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, final[name]), name


def test_closing_in_bf16_true_gives_your_module_the_trained_weights_in_fp32() -> None:
    module, data, loss_fn, _ = build_model("mlp", seed=1, **MLP)
    before = {n: v.clone() for n, v in module.state_dict().items()}
    with Session(config(), model=module, data=data, loss_fn=loss_fn) as s:
        s.run(optimizer_steps=3)
        trained = {n: p.detach().float().clone() for n, p in s.model.named_parameters()}
        backend = s.backend
    assert backend.trained_module is module  # the bf16 copy was released at close
    for name, value in module.state_dict().items():
        assert value.dtype == torch.float32, name
        assert torch.equal(value, trained[name]), name
        assert not torch.equal(value, before[name]), name  # it trained


def test_checkpoint_and_resume_in_bf16_true(tmp_path: Path) -> None:
    with Session(config(), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=2)
        path = s.save_checkpoint(tmp_path)
        after = [r.loss for r in s.run(optimizer_steps=2)]
    with Session.resume_from(path) as r:
        assert r.config.precision == "bf16-true" and r.step == 2
        assert state_dtypes(r.backend) == {torch.bfloat16}
        assert [x.loss for x in r.run(optimizer_steps=2)] == after  # bit for bit


# --------------------------------------------------------------------------- FSDP
@pytest.fixture(scope="module")
def plain_bf16() -> list[float]:
    """The plain loop's losses in pure bf16: on one rank FSDP only changes where they live."""
    with Session(config(), model="mlp", model_options=MLP) as s:
        return [r.loss for r in s.run(optimizer_steps=4)]


@pytest.mark.parametrize("mode", ["full_shard", "shard_grad_op", "no_shard"])
def test_fsdp_on_one_rank_trains_bf16_shards_on_the_plain_curve(
    mode: str, plain_bf16: list[float]
) -> None:
    with Session(config(fsdp=mode), model="mlp", model_options=MLP) as s:
        assert isinstance(s.backend, FSDPBackend)
        params = list(s.model.parameters())
        assert all(type(p).__name__ == "DTensor" and p.dtype == torch.bfloat16 for p in params)
        assert {p.to_local().dtype for p in params} == {torch.bfloat16}  # type: ignore[attr-defined]
        records = s.run(optimizer_steps=4)
        assert state_dtypes(s.backend) == {torch.bfloat16}
        report = s.memory()
    assert [r.loss for r in records] == pytest.approx(plain_bf16, rel=1e-5)
    n = report.n_params
    assert (report.params_bytes, report.grads_bytes) == (2 * n, 2 * n)
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == 4 * n
    pred = report.predicted
    assert pred is not None and pred.accounting == "fsdp"
    assert (pred.params_bytes, pred.grads_bytes, pred.optimizer_bytes) == (2 * n, 2 * n, 4 * n)


def test_fsdp_bf16_true_switches_live_with_the_plain_loop_and_reduces_in_bf16() -> None:
    module, data, loss_fn, _ = build_model("mlp", seed=1, **MLP)
    with Session(config(fsdp="full_shard"), model=module, data=data, loss_fn=loss_fn) as s:
        s.run(optimizer_steps=2)
        s.update(fsdp="off", precision="fp32")
        assert isinstance(s.backend, PlainBackend) and s.model is module
        assert state_dtypes(s.backend) == {torch.float32}  # carried over, cast
        s.update(fsdp="no_shard", precision="bf16-true", fsdp_reduce_fp32=False)
        records = s.run(optimizer_steps=2)
        assert state_dtypes(s.backend) == {torch.bfloat16}
        final = s.state_dict()
    assert all(math.isfinite(r.loss) for r in records)
    for name, value in module.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, final[name]), name


def _two_ranks(rank: int, out_dir: str) -> dict[str, Any]:
    """One of 2 gloo ranks training pure bf16 under FSDP full_shard (the Session makes the
    process group from the environment)."""
    with Session(
        config(fsdp="full_shard", clip_grad_norm=1.0), model="mlp", model_options=MLP
    ) as s:
        records = s.run(optimizer_steps=3)
        state = s.backend.export_state()  # the full-state gathers
        result = {
            "losses": [r.loss for r in records],
            "grad_norms": [r.grad_norm for r in records],
            "shard_dtypes": sorted({str(p.to_local().dtype) for p in s.model.parameters()}),
            "state_dtypes": sorted(str(d) for d in state_dtypes(s.backend)),
            "exported": sorted({str(v.dtype) for v in state["model"].values()}),
        }
    return result


def test_fsdp_trains_bf16_true_on_two_gloo_ranks(tmp_path: Path) -> None:
    ranks = run_ranks(_two_ranks, tmp_path, backend=None)
    for got in ranks:
        assert "error" not in got, got
        assert len(got["losses"]) == 3 and all(math.isfinite(v) for v in got["losses"])
        assert got["shard_dtypes"] == got["state_dtypes"] == ["torch.bfloat16"]
        assert got["exported"] == ["torch.float32"]  # the neutral state: full fp32 weights
    assert ranks[0]["grad_norms"] == ranks[1]["grad_norms"]  # one norm over both shards


# --------------------------------------------------------------------------- refused
def test_deepspeed_refuses_bf16_true_naming_the_field_and_what_to_use() -> None:
    from workbench.train.changes import session_problems
    from workbench.train.launch.checks import launch_problems

    with pytest.raises(ValueError, match=r"precision='bf16-true': pure bf16 .*\(zero_stage=2\)"):
        TrainConfig(precision="bf16-true", zero_stage=2)
    with Session(config(), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=1)
        with pytest.raises(ValueError, match=r"use 'bf16' \(DeepSpeed's bf16 with an fp32 master"):
            s.update(zero_stage=2)
        assert s.config.zero_stage == 0 and isinstance(s.backend, PlainBackend)  # untouched
        assert math.isfinite(s.run(optimizer_steps=1)[0].loss)
        model = s.model
    # several ranks without FSDP train through DeepSpeed
    lines = [
        str(line)  # a SettingProblem or its line
        for line in session_problems(
            config(), set(), model=model, device=torch.device("cpu"), world_size=2, data=None
        )
    ]
    assert any(
        line.startswith("precision='bf16-true': ")
        and "DeepSpeed (2 ranks without fsdp train through it)" in line
        for line in lines
    ), lines
    assert not session_problems(
        config(fsdp="full_shard"),
        set(),
        model=model,
        device=torch.device("cpu"),
        world_size=2,
        data=None,
    )
    found = launch_problems(config(), 2, "mlp", 1, "torchrun", 60.0, None, None)
    assert any(str(line).startswith("precision='bf16-true': pure bf16") for line in found), found


def test_the_deepspeed_backend_and_mapping_refuse_bf16_true() -> None:
    from workbench.config import ConfigError
    from workbench.deepspeed import to_deepspeed
    from workbench.train.backends.deepspeed import DeepSpeedBackend

    module = build_model("mlp", seed=1, **MLP)[0]
    for attempt in (lambda: to_deepspeed(config()), lambda: DeepSpeedBackend(config(), module)):
        with pytest.raises(ConfigError) as info:
            attempt()
        (problem,) = info.value.problems
        assert (problem.field, problem.value) == ("precision", "bf16-true")
        assert "use 'bf16'" in problem.message and "`fsdp`" in problem.message
