"""Paged 8-bit AdamW (`optimizer="paged-adam8bit"`, bitsandbytes' `PagedAdamW8bit`) in a
Session's plain loop: its states counted to the byte next to the estimator's 2 bytes per
parameter, the implementation and where its states live said as an event (paged in CUDA
unified memory on a GPU; bitsandbytes keeps them unpaged on a CPU), the moments carried
across a live switch with adamw (dequantized, quantized again) and in a safe checkpoint;
refused by name where it does not train."""

from __future__ import annotations

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.config import ConfigError

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "dropout": 0.0}
QUANTIZED_MIN, BLOCK = 4096, 256  # bitsandbytes' min_8bit_size and its block size


def _by_hand(model: torch.nn.Module) -> int:
    """PagedAdamW8bit's states: for a tensor of 4096+ elements two 1-byte moments and an
    fp32 scale per 256-element block each, for a smaller one two fp32 moments; the two
    256-entry fp32 quantization maps once (every state shares them); the step a Python int."""
    total = 2 * 4 * 256
    for p in model.parameters():
        n = p.numel()
        blocks = -(-n // BLOCK)
        total += 2 * (n + 4 * blocks) if n >= QUANTIZED_MIN else 2 * 4 * n
    return total


def test_it_trains_and_its_states_are_counted_to_the_byte(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = TrainConfig(
        micro_batch=8, optimizer="paged-adam8bit", seed=0, checkpoint_dir=str(tmp_path)
    )
    with Session(config, model_options=TINY) as s:
        records = s.run(optimizer_steps=3, progress=False)
        report = s.memory()
        assert type(s.backend.optimizer).__name__ == "PagedAdamW8bit"
        (note,) = [e.message for e in s.events if e.kind == "optimizer"]
        assert "bitsandbytes' PagedAdamW8bit" in note and "unpaged on this CPU" in note
        assert records[-1].loss < records[0].loss
        assert report.optimizer_bytes == _by_hand(s.model)
        n = sum(p.numel() for p in s.model.parameters())
        assert report.predicted.optimizer_bytes == 2 * n  # the estimator's 8-bit Adam
        # the fp32 moments of the small tensors and the block scales: 7.4% over here
        assert 1.0 < report.optimizer_bytes / report.predicted.optimizer_bytes < 1.10
        path = s.save_checkpoint()
    payload = torch.load(path, weights_only=True)  # the moments as plain fp32 tensors
    moments = payload["backend"]["optimizer"]["state"]
    assert all(
        v.dtype == torch.float32 for st in moments.values() for k, v in st.items() if k != "step"
    )
    with Session.resume_from(path) as again:
        resumed = again.run(optimizer_steps=1, progress=False)
        assert resumed[-1].step == 4
        assert {st["step"] for st in again.backend.optimizer.state.values()} == {4}


def test_a_live_switch_carries_the_moments_both_ways() -> None:
    """adamw -> paged-adam8bit -> adamw: AdamW's fp32 moments quantized into bitsandbytes'
    blocks and read back, each element within 1% of its block's largest (0.7% measured),
    and the step count goes on."""
    with Session(TrainConfig(micro_batch=4, seed=0), model_options=TINY) as s:
        s.run(optimizer_steps=2, progress=False)
        before = s.backend.export_state()["optimizer"]["state"]
        s.update(optimizer="paged-adam8bit")
        carried = s.backend.export_state()["optimizer"]["state"]
        name = "blocks.0.mlp.fc.weight"  # 16384 elements: quantized
        for key in ("exp_avg", "exp_avg_sq"):
            x, back = before[name][key], carried[name][key]
            blocks = x.reshape(-1, BLOCK).abs().amax(dim=1)
            error = (back - x).reshape(-1, BLOCK).abs().amax(dim=1) / blocks
            assert error.max() < 0.01, (key, float(error.max()))
        small = "blocks.0.ln_1.weight"  # under 4096 elements: fp32 moments, carried exactly
        assert torch.equal(carried[small]["exp_avg"], before[small]["exp_avg"])
        s.run(optimizer_steps=1, progress=False)
        assert {st["step"] for st in s.backend.optimizer.state.values()} == {3}
        s.update(optimizer="adamw")
        records = s.run(optimizer_steps=1, progress=False)
        assert records[-1].step == 4
        assert {float(st["step"]) for st in s.backend.optimizer.state.values()} == {4.0}


@pytest.mark.parametrize(
    "settings",
    [{"zero_stage": 2}, {"fsdp": "full_shard"}, {"optimizer_in_backward": True}],
)
def test_where_it_does_not_train_it_is_refused_by_name(settings) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        TrainConfig(optimizer="paged-adam8bit", **settings)
    assert "optimizer='paged-adam8bit'" in str(info.value)


def test_the_dry_run_and_the_exports_say_why_not() -> None:
    from workbench.export import ExportError, export_job
    from workbench.train.dry_run import DryRunError, simulate_memory

    config = TrainConfig(optimizer="paged-adam8bit")
    with pytest.raises(DryRunError, match="bitsandbytes") as info:
        simulate_memory("tiny-gpt", config, model_options=TINY, progress=False)
    assert [p.field for p in info.value.problems] == ["optimizer"]
    with pytest.raises(ExportError, match="a Session trains bitsandbytes' paged one"):
        export_job(config, format="lightning", gpus=1, out_dir="/nonexistent/never-written")


def test_the_names_it_goes_by() -> None:
    assert TrainConfig(optimizer="paged_adamw8bit").optimizer == "paged-adam8bit"
    with pytest.raises(ConfigError, match="did you mean 'paged-adam8bit'"):
        TrainConfig(optimizer="paged_adamw_8bit")


@pytest.mark.gpu
def test_on_a_gpu_its_large_states_are_paged() -> None:
    """On CUDA bitsandbytes puts a state of 100,000+ elements in unified memory (paged to
    host memory when the GPU runs short); the Session's event says it is paged."""
    config = TrainConfig(micro_batch=4, optimizer="paged-adam8bit", seed=0, device="cuda")
    big = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 64, "dropout": 0.0}
    with Session(config, model_options=big) as s:
        s.run(optimizer_steps=2, progress=False)
        (note,) = [e.message for e in s.events if e.kind == "optimizer"]
        assert "paged: its states in CUDA unified memory" in note
        paged = [
            st["state1"] for p, st in s.backend.optimizer.state.items() if p.numel() >= 100_000
        ]
        assert paged and all(getattr(t, "is_paged", False) for t in paged)
