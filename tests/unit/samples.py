"""A sample DeepSpeed config and TrainConfigs shared by test_dsconfig.py and test_export.py."""

from __future__ import annotations

from workbench.config import TrainConfig

SAMPLE = {
    "train_batch_size": 1024,
    "gradient_accumulation_steps": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-5, "weight_decay": 0.01}},
    "fp16": {"enabled": True, "loss_scale_window": 1000},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "nvme_path": "/mnt/nvme"},
        "offload_param": {"device": "cpu", "nvme_path": "/mnt/nvme"},
        "contiguous_gradients": True,
        "overlap_comm": True,
    },
    "steps_per_print": 50,
}

CONFIGS = [
    TrainConfig(),
    TrainConfig(
        precision="fp16",
        zero_stage=2,
        grad_accum=4,
        lr_schedule="cosine",
        warmup_steps=10,
        clip_grad_norm=1.0,
        loss_scale_init=2.0**12,
        loss_scale_interval=500,
    ),
    TrainConfig(
        optimizer="adam",
        precision="bf16",
        zero_stage=3,
        offload_params="cpu",
        offload_optimizer="cpu",
        lr_schedule="onecycle",
        micro_batch=2,
    ),
    TrainConfig(optimizer="sgd", momentum=0.8, precision="amp-bf16", zero_stage=1, warmup_steps=5),
    TrainConfig(optimizer="sgd-nomomentum", zero_stage=1, offload_optimizer="cpu"),
]
