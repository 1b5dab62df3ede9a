"""A corpus of DeepSpeed configs in the styles people train with, each imported with the
expected warnings, estimated, and exported back to a config DeepSpeed accepts.

The configs are written here in the shapes the Hugging Face Trainer, Megatron-DeepSpeed,
DeepSpeed's 1-bit Adam and BERT/Lamb recipes and ZeRO-Infinity (NVMe) use. The estimates
are pinned to hand-computed figures (ZeRO paper accounting; docs/estimator.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench.cli import main
from workbench.config import TrainConfig, runtime_problems
from workbench.deepspeed import DeepSpeedImport, import_deepspeed, to_deepspeed
from workbench.deepspeed import check as ds_check
from workbench.estimate import estimate_memory

DS = ds_check.deepspeed_name()

HF_ZERO2_AUTO: dict[str, Any] = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "total_num_steps": "auto",
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
        },
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

HF_ZERO3_AUTO: dict[str, Any] = {
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

# Megatron-DeepSpeed: the optimizer comes from Megatron (no optimizer block), ZeRO-Offload.
MEGATRON_OFFLOAD: dict[str, Any] = {
    "train_batch_size": 512,
    "train_micro_batch_size_per_gpu": 4,
    "steps_per_print": 10,
    "gradient_clipping": 1.0,
    "prescale_gradients": False,
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "reduce_scatter": True,
        "allgather_bucket_size": 50000000,
        "reduce_bucket_size": 50000000,
        "overlap_comm": True,
        "contiguous_gradients": True,
    },
    "fp16": {
        "enabled": True,
        "loss_scale": 0,
        "loss_scale_window": 500,
        "hysteresis": 2,
        "min_loss_scale": 1,
        "initial_scale_power": 12,
    },
    "wall_clock_breakdown": False,
    "activation_checkpointing": {
        "partition_activations": True,
        "contiguous_memory_optimization": True,
        "cpu_checkpointing": False,
        "number_checkpoints": 48,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    },
}

# BERT pre-training with 1-bit Adam (the tutorial's shape).
ONEBIT_ADAM: dict[str, Any] = {
    "train_batch_size": 4096,
    "train_micro_batch_size_per_gpu": 16,
    "steps_per_print": 100,
    "optimizer": {
        "type": "OneBitAdam",
        "params": {
            "lr": 4e-4,
            "weight_decay": 0.01,
            "bias_correction": False,
            "freeze_step": 23000,
            "cuda_aware": False,
            "comm_backend_name": "nccl",
        },
    },
    "gradient_clipping": 1.0,
    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
}

# BERT pre-training with Lamb at a large batch.
LAMB: dict[str, Any] = {
    "train_batch_size": 65536,
    "train_micro_batch_size_per_gpu": 64,
    "steps_per_print": 1000,
    "prescale_gradients": False,
    "optimizer": {
        "type": "Lamb",
        "params": {
            "lr": 11e-3,
            "weight_decay": 0.01,
            "bias_correction": False,
            "max_coeff": 0.3,
            "min_coeff": 0.01,
        },
    },
    "gradient_clipping": 1.0,
    "wall_clock_breakdown": False,
    "fp16": {"enabled": True, "loss_scale": 0},
}

# ZeRO-Infinity: parameters and optimizer states on NVMe.
NVME_OFFLOAD: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {
            "device": "nvme",
            "nvme_path": "/local_nvme",
            "pin_memory": True,
            "buffer_count": 4,
            "fast_init": False,
        },
        "offload_param": {
            "device": "nvme",
            "nvme_path": "/local_nvme",
            "pin_memory": True,
            "buffer_count": 5,
            "buffer_size": 1e8,
            "max_in_cpu": 1e9,
        },
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_prefetch_bucket_size": 5e8,
        "stage3_param_persistence_threshold": 1e6,
    },
    "aio": {
        "block_size": 1048576,
        "queue_depth": 8,
        "thread_count": 1,
        "single_submit": False,
        "overlap_events": True,
    },
    "steps_per_print": 100,
    "wall_clock_breakdown": False,
}


def ignored_entries(result: DeepSpeedImport) -> list[str]:
    """The entries of the one "not modelled" warning (checked to be one and only one)."""
    (warning,) = [w for w in result.warnings if w.startswith("not modelled by the workbench")]
    head, _, rest = warning.partition("): ")
    count = int(head.rsplit("(", 1)[1])
    entries = rest.split("; ")
    assert len(entries) == count
    return entries


def estimate_only_entries(result: DeepSpeedImport) -> list[str]:
    """The entries of the one warning naming the keys only an estimate reads (the DeepSpeed
    buffer sizes of `workbench.estimate.deepspeed_buffers`)."""
    (warning,) = [w for w in result.warnings if w.startswith("read by `workbench estimate")]
    head, _, rest = warning.partition("): ")
    assert head.endswith(f"sizes its own ({len(rest.split('; '))}")
    return rest.split("; ")


def estimate(config: TrainConfig, n_params: float, gpus: int) -> Any:
    return estimate_memory(
        n_params=n_params,
        precision=config.precision.value,
        optimizer=config.optimizer.value,
        zero_stage=config.zero_stage,
        gpus=gpus,
        offload_optimizer=config.offload_optimizer.value != "none",
        offload_params=config.offload_params.value != "none",
    )


def assert_round_trip(result: DeepSpeedImport) -> None:
    """import -> export: a config DeepSpeed's checks accept, which imports to the same
    settings (stage, precision, offload, optimizer, batch sizes, schedule) without
    anything left to warn about but a 1-bit optimizer this DeepSpeed lacks."""
    ds = to_deepspeed(result.config, world_size=result.world_size)
    assert ds_check.config_problems(ds, batch_keys=("train_batch_size",)) == []
    again = import_deepspeed(ds)
    assert again.config == result.config and again.world_size == result.world_size
    assert not any(w.startswith(("not modelled", '"auto"')) for w in again.warnings)


def test_hugging_face_zero2_with_auto() -> None:
    session = TrainConfig(
        micro_batch=4,
        grad_accum=4,
        lr=3e-5,
        weight_decay=0.0,
        precision="fp16",
        clip_grad_norm=1.0,
        warmup_steps=100,
        total_steps=2000,
    )
    result = import_deepspeed(HF_ZERO2_AUTO, base=session, world_size=8)
    c = result.config
    assert (c.micro_batch, c.grad_accum, result.world_size) == (4, 4, 8)
    assert (c.precision, c.optimizer, c.lr, c.weight_decay, c.clip_grad_norm) == (
        "fp16",
        "adamw",
        3e-5,
        0.0,
        1.0,
    )
    assert (c.zero_stage, c.offload_optimizer, c.loss_scale_interval) == (2, "cpu", 1000)
    assert (c.lr_schedule, c.warmup_steps, c.total_steps) == ("cosine", 100, 2000)
    auto = result.warnings[0]
    assert auto.startswith('"auto" values filled from the session\'s settings: ')
    for entry in (
        "fp16.enabled=True (precision)",
        "bf16.enabled=False (precision)",
        "optimizer.params.lr=3e-05 (lr)",
        "scheduler.params.total_num_steps=2000 (total_steps)",
        "train_micro_batch_size_per_gpu=4 (micro_batch)",
        "gradient_clipping=1.0 (clip_grad_norm)",
    ):
        assert entry in auto
    assert ignored_entries(result) == [
        "steps_per_print",
        "wall_clock_breakdown",
        "zero_optimization.allgather_partitions",
        "zero_optimization.reduce_scatter",
        "zero_optimization.contiguous_gradients",
        "zero_optimization.offload_optimizer.pin_memory",
        "fp16.hysteresis=2 (the workbench backs off on every overflow, hysteresis 1)",
        "scheduler.type='WarmupDecayLR' (a linear decay to 0, imported as lr_schedule='cosine' "
        "over the same steps: the workbench has no linear decay)",
        "scheduler.params.warmup_type='log' (DeepSpeed's default, the workbench warms up linearly)",
    ]
    # the buffer sizes an estimate reads (`--deepspeed-config`); the session's engine sizes
    # its own
    assert estimate_only_entries(result) == [
        "zero_optimization.allgather_bucket_size",
        "zero_optimization.overlap_comm",
        "zero_optimization.reduce_bucket_size",
    ]
    # 1.5e9 parameters, fp16 AdamW on 8 GPUs, ZeRO-2 + optimizer offload: the GPU keeps the
    # 2-byte weights (3.0 GB); the host holds 2-byte gradients and 12-byte optimizer states
    # of 1/8 of the parameters: 14 x 1.5e9 / 8 = 2.625 GB per GPU.
    e = estimate(c, 1.5e9, 8)
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == (3_000_000_000, 0, 0)
    assert e.cpu_offload_bytes == 2_625_000_000
    assert_round_trip(result)


def test_hugging_face_zero3_with_auto_and_parameter_offload() -> None:
    session = TrainConfig(micro_batch=2, grad_accum=8, precision="bf16", lr=1e-5)
    result = import_deepspeed(HF_ZERO3_AUTO, base=session, world_size=16)
    c = result.config
    assert (c.micro_batch, c.grad_accum, c.precision, c.zero_stage) == (2, 8, "bf16", 3)
    assert (c.offload_optimizer, c.offload_params, c.clip_grad_norm) == ("cpu", "cpu", None)
    assert (c.lr_schedule, c.warmup_steps) == ("constant", 0)  # the session has no warmup
    auto = result.warnings[0]
    assert auto.endswith(
        "left to DeepSpeed's defaults: zero_optimization.reduce_bucket_size; "
        "zero_optimization.stage3_prefetch_bucket_size; "
        "zero_optimization.stage3_param_persistence_threshold"
    )
    assert "gradient_clipping=0.0 (clip_grad_norm)" in auto
    assert "scheduler.params.warmup_num_steps=0 (warmup_steps)" in auto
    entries = ignored_entries(result)
    assert "zero_optimization.stage3_gather_16bit_weights_on_model_save" in entries
    assert "zero_optimization.offload_param.pin_memory" in entries
    assert len(entries) == 8
    assert estimate_only_entries(result) == [
        "zero_optimization.overlap_comm",
        "zero_optimization.sub_group_size",
        "zero_optimization.stage3_max_live_parameters",
    ]
    # 7e9 parameters, bf16 on 16 GPUs, everything offloaded: nothing on the GPU; the host
    # holds (2 + 2 + 12) x 7e9 / 16 = 7.0 GB per GPU.
    e = estimate(c, 7e9, 16)
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == (0, 0, 0)
    assert e.cpu_offload_bytes == 7_000_000_000
    assert_round_trip(result)


def test_megatron_style_zero_offload_with_gradient_clipping() -> None:
    result = import_deepspeed(MEGATRON_OFFLOAD, world_size=16)
    c = result.config
    # 512 = 4 x accumulation x 16: DeepSpeed solves accumulation 8
    assert (c.micro_batch, c.grad_accum, result.world_size) == (4, 8, 16)
    assert (c.precision, c.loss_scale_init, c.loss_scale_interval) == ("fp16", 4096.0, 500)
    assert (c.zero_stage, c.offload_optimizer, c.clip_grad_norm) == (2, "cpu", 1.0)
    assert c.optimizer == "adamw"  # no optimizer block: Megatron's own, the session's here
    assert len(result.warnings) == 2
    assert estimate_only_entries(result) == [
        "zero_optimization.allgather_bucket_size",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.overlap_comm",
    ]
    entries = ignored_entries(result)
    assert entries[:4] == [
        "steps_per_print",
        "prescale_gradients",
        "wall_clock_breakdown",
        "activation_checkpointing",
    ]
    assert "fp16.hysteresis=2 (the workbench backs off on every overflow, hysteresis 1)" in entries
    # 10e9 parameters: 2-byte weights on the GPU (20 GB); host: (2 + 12) x 10e9 / 16
    e = estimate(c, 10e9, 16)
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == (20_000_000_000, 0, 0)
    assert e.cpu_offload_bytes == 8_750_000_000
    assert_round_trip(result)


def test_onebit_adam() -> None:
    result = import_deepspeed(ONEBIT_ADAM, world_size=64)
    c = result.config
    assert (c.optimizer, c.lr, c.weight_decay, c.precision) == ("onebitadam", 4e-4, 0.01, "fp16")
    assert (c.micro_batch, c.grad_accum, c.zero_stage) == (16, 4, 0)
    entries = ignored_entries(result)
    assert entries[0] == "steps_per_print"
    for param in ("bias_correction=False", "freeze_step=23000", "comm_backend_name='nccl'"):
        assert f"optimizer.params.{param}" in entries
    if not ds_check.onebit_available():
        assert result.warnings[-1].startswith(
            f"optimizer.type='OneBitAdam': {DS} (installed) has no 1-bit optimizers"
        )
    assert "cannot train here" in str(runtime_problems(c)[0])
    # BERT-large, 340e6 parameters, fp16 on 64 GPUs (1-bit Adam runs without ZeRO):
    # weights 2Ψ, gradients 2Ψ, optimizer 4Ψ fp32 master + 8Ψ moments + error feedback
    # 4Ψ (worker) + 4·Ψ/64 (server) = 12 x 340e6 + 1.36e9 + 21.25e6.
    e = estimate(c, 340e6, 64)
    assert (e.params_bytes, e.grads_bytes) == (680_000_000, 680_000_000)
    assert e.optimizer_bytes == 4_080_000_000 + 1_360_000_000 + 21_250_000
    assert_round_trip(result)


def test_lamb() -> None:
    result = import_deepspeed(LAMB, world_size=256)
    c = result.config
    assert (c.optimizer, c.lr, c.micro_batch, c.grad_accum) == ("lamb", 11e-3, 64, 4)
    assert ignored_entries(result) == [
        "steps_per_print",
        "prescale_gradients",
        "wall_clock_breakdown",
        "fp16.hysteresis=2 (DeepSpeed's default, the workbench backs off on every overflow, "
        "hysteresis 1)",
        "optimizer.params.bias_correction=False",
        "optimizer.params.max_coeff=0.3",  # min_coeff=0.01 is FusedLamb's default
    ]
    (lamb,) = runtime_problems(c)
    assert (lamb.field, lamb.value) == ("optimizer", "lamb")
    assert "FusedLamb, a CUDA kernel" in str(lamb) and "optimizer='adamw'" in str(lamb)
    # 340e6 parameters, fp16 Lamb without ZeRO: 2 + 2 + (4 master + 8 moments) bytes each
    e = estimate(c, 340e6, 256)
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == (
        680_000_000,
        680_000_000,
        4_080_000_000,
    )
    assert_round_trip(result)
    # with ZeRO, DeepSpeed wants its flag for Lamb; the export writes it
    zero1 = dict(LAMB, zero_optimization={"stage": 1})
    with pytest.raises(ValueError, match=r"FusedLamb is an untested ZeRO optimizer"):
        import_deepspeed(zero1)
    flagged = import_deepspeed(dict(zero1, zero_allow_untested_optimizer=True), world_size=256)
    assert to_deepspeed(flagged.config, 256)["zero_allow_untested_optimizer"] is True


def test_nvme_offload() -> None:
    result = import_deepspeed(NVME_OFFLOAD, world_size=8)
    c = result.config
    assert (c.zero_stage, c.offload_optimizer, c.offload_params, c.nvme_path) == (
        3,
        "nvme",
        "nvme",
        "/local_nvme",
    )
    assert (c.precision, c.micro_batch, c.grad_accum, c.weight_decay) == ("bf16", 1, 1, 0.1)
    entries = ignored_entries(result)
    for entry in (
        "aio",
        "zero_optimization.offload_optimizer.buffer_count",
        "zero_optimization.offload_param.max_in_cpu",
        "optimizer.params.betas=[0.9, 0.95] (the workbench uses [0.9, 0.999])",
    ):
        assert entry in entries
    # the job is valid; this machine has no /local_nvme, which only a local run minds
    (nvme,) = runtime_problems(c)
    assert (nvme.field, nvme.value) == ("nvme_path", "/local_nvme")
    assert (
        str(nvme)
        == "nvme_path='/local_nvme': must be an existing writable directory on this machine"
    )
    # 70e9 parameters, bf16 on 8 GPUs, everything offloaded: 16 x 70e9 / 8 off the GPU
    e = estimate(c, 70e9, 8)
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == (0, 0, 0)
    assert e.cpu_offload_bytes == 140_000_000_000
    assert_round_trip(result)


def test_a_removed_deepspeed_feature_is_rejected_with_deepspeeds_reason() -> None:
    with pytest.raises(ValueError) as info:
        import_deepspeed(dict(LAMB, sparse_attention={"mode": "fixed", "block": 16}))
    assert str(info.value).startswith(
        f"invalid DeepSpeed config: {DS} rejects the config: DeepSpeed Sparse Attention has "
        "been removed"
    )


def test_export_of_an_auto_config_fills_the_batch_for_the_world_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(HF_ZERO2_AUTO))
    code = main(["export", "--config", str(path), "--gpus", "8", "--out", str(tmp_path / "job")])
    _, err = capsys.readouterr()
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    # nothing about the batch
    assert [w.split(" ")[1] for w in warnings] == ['"auto"', "not", "read"]
    ds = json.loads((tmp_path / "job" / "ds_config.json").read_text())
    # the session defaults (micro-batch 8, accumulation 1) on 8 GPUs
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"]) == (64, 8)
    assert ds["scheduler"]["type"] == "WarmupCosineLR"
