"""8-bit AdamW (`optimizer="adam8bit"`, torchao's `AdamW8bit`) trained in a Session: its
states counted to the byte, next to the estimator's 2 bytes per parameter; carried both
ways across a live switch with adamw; saved in a safe checkpoint; refused by name where
its engine does not train it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.config import ConfigError

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "dropout": 0.0}
QUANTIZED_MIN = 4096  # torchao (as bitsandbytes) quantizes tensors of 4096+ elements
BLOCK = 256  # AdamW8bit's block size: one fp32 scale per block


def torchao_state_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Both moments of every tensor (a parameter, or a rank's shard of one) as AdamW8bit
    keeps them: 1-byte codes, an fp32 scale per block and a 256-entry fp32 quantization map
    for the quantized tensors, fp32 moments for the small ones, and a 4-byte step counter
    per tensor."""
    total = 0
    for p in tensors:
        n = p.numel()
        if n >= QUANTIZED_MIN and n % BLOCK == 0:
            total += 2 * (n + 4 * (n // BLOCK) + 4 * 256)
        else:
            total += 2 * 4 * n
        total += 4
    return total


def test_adam8bit_trains_and_its_states_are_counted_to_the_byte(tmp_path) -> None:
    config = TrainConfig(micro_batch=8, optimizer="adam8bit", seed=0, checkpoint_dir=str(tmp_path))
    with Session(config, model_options=TINY) as s:
        records = s.run(optimizer_steps=3)
        report = s.memory()
        assert records[-1].loss < records[0].loss
        assert report.optimizer_bytes == torchao_state_bytes(s.model.parameters())
        n = sum(p.numel() for p in s.model.parameters())
        assert report.predicted.optimizer_bytes == 2 * n  # the estimator's 8-bit Adam
        # the small tensors kept in fp32 make tiny-gpt 27% over the 2 bytes per parameter;
        # a 7B model's are a few millionths of it
        assert 1.0 < report.optimizer_bytes / report.predicted.optimizer_bytes < 1.3
        path = s.save_checkpoint()
    payload = torch.load(path, weights_only=True)  # the moments as plain fp32 tensors
    moments = payload["backend"]["optimizer"]["state"]
    assert all(v.dtype == torch.float32 for st in moments.values() for v in st.values())


def test_the_moments_survive_the_trip_into_8_bits_and_back() -> None:
    """What a switch does to a moment: quantized into AdamW8bit's block-wise buffers and
    read back in fp32, each element is within 1% of its block's largest (measured: 0.70%
    for the signed first moment, 0.35% for the second)."""
    from torchao.optim import AdamW8bit

    from workbench.train.backends.optimizer import neutral, placed_state

    p = torch.nn.Parameter(torch.randn(512, 256))
    optimizer = AdamW8bit([p])
    g = torch.Generator().manual_seed(0)
    for key, x in (
        ("exp_avg", torch.randn(512, 256, generator=g) * 1e-3),
        ("exp_avg_sq", torch.rand(512, 256, generator=g) * 1e-6),
    ):
        back = neutral(placed_state(optimizer, p, key, x))
        assert back.dtype == torch.float32 and back.shape == x.shape
        blocks = x.reshape(-1, BLOCK).abs().amax(dim=1)
        error = (back - x).reshape(-1, BLOCK).abs().amax(dim=1) / blocks
        assert error.max() < 0.01, (key, float(error.max()))
    small = torch.nn.Parameter(torch.randn(64))  # under 4096 elements: kept in fp32
    value = torch.randn(64)
    assert torch.equal(neutral(placed_state(AdamW8bit([small]), small, "exp_avg", value)), value)


def test_a_live_switch_carries_the_moments_both_ways() -> None:
    """adamw -> adam8bit -> adamw at step boundaries: the moments travel (quantized, within
    8-bit's blockwise error, then dequantized exactly) and the run trains on from where it
    was."""

    def state() -> dict[str, Any]:  # fp32 moments, the 8-bit ones dequantized
        return s.backend.export_state()["optimizer"]["state"]

    name = "blocks.0.mlp.fc.weight"  # 16,384 elements: quantized in blocks of 256
    with Session(TrainConfig(micro_batch=4, seed=0), model_options=TINY) as s:
        s.run(optimizer_steps=2)
        before = state()
        s.update(optimizer="adam8bit")
        carried = state()
        for key in ("exp_avg", "exp_avg_sq"):
            a, b = before[name][key], carried[name][key]
            assert a.shape == b.shape and a.abs().amax() > 0
            blocks = a.reshape(-1, BLOCK).abs().amax(dim=1)
            error = (b - a).reshape(-1, BLOCK).abs().amax(dim=1) / blocks
            assert error.max() < 0.01, (key, float(error.max()))  # a reset state: 1.0
        s.run(optimizer_steps=1)
        steps = {float(st["step"]) for st in s.backend.optimizer.state.values()}
        assert steps == {3.0}  # carried: a reset optimizer would count 1
        eight = state()
        s.update(optimizer="adamw")
        back = state()
        assert back.keys() == eight.keys()
        for param, moments in eight.items():
            for key, value in moments.items():
                assert torch.equal(back[param][key], value), (param, key)
        records = s.run(optimizer_steps=1)
        assert records[-1].step == 4


def test_a_switch_says_what_the_optimizer_state_becomes() -> None:
    """Each optimizer switch is an "optimizer" event: carried within Adam's layout (8-bit
    quantized or dequantized), reset across layouts, dropped for a stateless optimizer;
    and the 8-bit implementation in use is named."""
    with Session(TrainConfig(micro_batch=4, seed=0), model_options=TINY) as s:
        s.run(optimizer_steps=1)
        for name in ("adam8bit", "adamw", "sgd", "sgd-nomomentum", "adam"):
            s.update(optimizer=name)
            s.run(optimizer_steps=1)
            if name == "adam8bit":  # another engine build with the same optimizer
                s.update(precision="amp-bf16")
                s.run(optimizer_steps=1)
                s.update(precision="fp32")
        said = [e.message for e in s.events if e.kind == "optimizer"]
    switches = [m for m in said if m.startswith("optimizer ")]
    assert switches == [
        "optimizer adamw -> adam8bit: its state (exp_avg, exp_avg_sq) carried (quantized to 8 bits)",
        "optimizer adam8bit -> adamw: its state (exp_avg, exp_avg_sq) carried (dequantized from 8 bits)",
        "optimizer adamw -> sgd: its state (exp_avg, exp_avg_sq) is reset, the sgd state starts at zero (another layout)",
        "optimizer sgd -> sgd-nomomentum: its state (momentum_buffer) is dropped (sgd-nomomentum keeps none)",
        "optimizer sgd-nomomentum -> adam: no state to carry",
    ]
    # the implementation said once, not at every engine build
    assert sum(m.startswith("8-bit AdamW: torchao's AdamW8bit") for m in said) == 1


def test_without_torchao_bitsandbytes_steps_it_and_the_session_says_so(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where torchao does not import, adam8bit is bitsandbytes' AdamW8bit (the "optimizer"
    event names it): it trains, and a switch from adamw carries the moments into its
    blocks."""
    import sys

    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # `import` raises ImportError
    with Session(TrainConfig(micro_batch=4, seed=0), model_options=TINY) as s:
        s.run(optimizer_steps=2)
        s.update(optimizer="adam8bit")
        records = s.run(optimizer_steps=2)
        assert type(s.backend.optimizer).__module__.startswith("bitsandbytes")
        said = [e.message for e in s.events if e.kind == "optimizer"]
        assert any(
            "bitsandbytes' AdamW8bit, unpaged (torchao does not import here" in m for m in said
        )
        assert {st["step"] for st in s.backend.optimizer.state.values()} == {4}  # carried
        assert all(r.loss == r.loss and r.grad_norm for r in records)  # finite, stepped


def test_fsdp_trains_it_with_the_plain_loops_losses_and_8_bit_shards() -> None:
    """FSDP2 (one rank here; two in test_adam8bit_fsdp.py) steps torchao's AdamW8bit on
    its DTensor shards: the plain loop's losses, the moments 8-bit in the shards, counted
    to the byte as the plain loop's, exported as fp32."""
    from torch.distributed.tensor import DTensor

    config = TrainConfig(micro_batch=4, optimizer="adam8bit", seed=0)
    with Session(config, model_options=TINY) as plain:
        want = [r.loss for r in plain.run(optimizer_steps=3)]
        plain_bytes = plain.memory().optimizer_bytes
    with Session(config.replace(fsdp="full_shard"), model_options=TINY) as s:
        got = [r.loss for r in s.run(optimizer_steps=3)]
        assert type(s.backend).__name__ == "FSDPBackend"
        states = [st["exp_avg"] for st in s.backend.optimizer.state.values()]
        assert all(isinstance(v, DTensor) for v in states)
        assert any(type(v.to_local()).__name__ == "OptimState8bit" for v in states)
        assert s.memory().optimizer_bytes == plain_bytes
        exported = s.backend.export_state()["optimizer"]["state"]
    assert got == pytest.approx(want, rel=1e-5)
    assert all(
        type(v) is torch.Tensor and v.dtype == torch.float32
        for st in exported.values()
        for k, v in st.items()
        if k != "step"
    )


def test_fsdp_switches_into_8_bit_and_back_carrying_the_moments() -> None:
    """adamw -> adam8bit -> adamw on FSDP2: the loaded fp32 moments are quantized into the
    8-bit optimizer's own DTensor buffers (not stepped as fp32: 4 bytes a moment), each
    within 1% of its block's largest, and the step count goes on."""
    with Session(TrainConfig(micro_batch=4, seed=0, fsdp="full_shard"), model_options=TINY) as s:
        s.run(optimizer_steps=2)
        fp32_bytes = s.memory().optimizer_bytes
        before = s.backend.export_state()["optimizer"]["state"]
        s.update(optimizer="adam8bit")
        name = "blocks.0.mlp.fc.weight"
        carried = s.backend.export_state()["optimizer"]["state"][name]["exp_avg"]
        x = before[name]["exp_avg"]
        blocks = x.reshape(-1, BLOCK).abs().amax(dim=1)
        error = (carried - x).reshape(-1, BLOCK).abs().amax(dim=1) / blocks
        assert error.max() < 0.01
        assert s.memory().optimizer_bytes < fp32_bytes / 2  # quantized, not fp32 DTensors
        s.run(optimizer_steps=1)
        steps = {float(st["step"]) for st in s.backend.optimizer.state.values()}
        assert steps == {3.0}
        s.update(optimizer="adamw")
        records = s.run(optimizer_steps=1)
        assert records[-1].step == 4 and s.memory().optimizer_bytes == fp32_bytes


@pytest.mark.parametrize(
    ("fmt", "script", "ranks"),
    [
        ("fsdp", "train_fsdp.py", 1),
        ("fsdp", "train_fsdp.py", 2),
        ("lightning", "train_lightning.py", 1),
    ],
)
def test_the_exported_jobs_train_it(fmt, script, ranks, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The FSDP and Lightning jobs step torchao's AdamW8bit (its tensor learning rate set
    in place by the schedule): one FSDP rank's losses are the Session's (the Lightning
    job's loader shuffles its own way: its losses, on other batches, stay within 2% of
    them); every job's losses are finite and fall; a tensor-parallel job is refused with
    the reason."""
    from pathlib import Path

    from tests.integration.job_runs import run_script
    from workbench.export import ExportError, export_job

    settings = {"fsdp": "full_shard"} if fmt == "fsdp" else {}
    config = TrainConfig(micro_batch=4, optimizer="adam8bit", seed=0, warmup_steps=2, **settings)
    out = export_job(config, format=fmt, gpus=ranks, out_dir=tmp_path / "job", model_options=TINY)
    lines, _ = run_script(script, Path(out.out_dir), steps=3, ranks=ranks)
    assert [ln["step"] for ln in lines] == [1, 2, 3]
    losses = [ln["loss"] for ln in lines]
    assert torch.isfinite(torch.tensor(losses)).all() and losses[-1] < losses[0], losses
    if fmt == "fsdp":
        lr = config.lr  # the warmup's half, then the whole
        assert [ln["lr"] for ln in lines] == pytest.approx([lr / 2, lr, lr])
    if ranks == 1:
        with Session(config, model_options=TINY) as s:
            want = [r.loss for r in s.run(optimizer_steps=3)]
        assert losses == pytest.approx(want, rel=1e-5)
    with pytest.raises(ExportError, match="optimizer"):
        export_job(config.replace(tp=2, fsdp="full_shard"), format="fsdp", gpus=2,
                   out_dir=tmp_path / "tp", model_options=TINY)  # fmt: skip


def test_adamw8bit_is_the_same_optimizer() -> None:
    assert TrainConfig(optimizer="adamw8bit") == TrainConfig(optimizer="adam8bit")


@pytest.mark.parametrize("settings", [{"zero_stage": 2}, {"precision": "bf16"}])
def test_engines_that_do_not_train_it_refuse_it_by_name(settings) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(optimizer="adam8bit", **settings)
    assert "optimizer" in str(info.value) and "plain loop and under FSDP" in str(info.value)


def test_the_dry_run_says_why_it_cannot_step_it() -> None:
    from workbench.train.dry_run import DryRunError, simulate_memory

    with pytest.raises(DryRunError, match="torch.compile") as info:
        simulate_memory("tiny-gpt", TrainConfig(optimizer="adam8bit"), model_options=TINY)
    assert [p.field for p in info.value.problems] == ["optimizer"]


def test_each_record_carries_the_learning_rate_its_step_used() -> None:
    """torchao keeps the learning rate as a tensor, set in place for the next step: a
    record holds the value its own step used, the schedule's, as under adamw."""
    from workbench.train.schedule import lr_at

    config = TrainConfig(
        micro_batch=8,
        optimizer="adam8bit",
        lr=1e-2,
        lr_schedule="cosine",
        warmup_steps=2,
        total_steps=6,
        seed=0,
    )
    with Session(config, model="mlp", model_options={"hidden": 32, "depth": 1}) as s:
        records = s.run(6, progress=False)
    assert [r.lr for r in records] == pytest.approx([lr_at(config, i, 1e-2) for i in range(6)])
    assert len({r.lr for r in records}) > 2  # the schedule moves
