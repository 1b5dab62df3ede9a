"""TrainConfig <-> DeepSpeed JSON (pure; no torch, no deepspeed)."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
from samples import CONFIGS, SAMPLE

from workbench.config import TrainConfig
from workbench.dsconfig import from_deepspeed, import_deepspeed, to_deepspeed


def test_module_is_pure() -> None:
    import workbench.dsconfig  # noqa: F401

    code = "import sys, workbench.dsconfig; print('torch' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_round_trip_is_identical(config: TrainConfig, world: int) -> None:
    exported = to_deepspeed(config, world_size=world)
    assert exported["train_batch_size"] == config.micro_batch * config.grad_accum * world
    result = import_deepspeed(json.loads(json.dumps(exported)))
    assert result.world_size == world
    assert result.warnings == ()
    again = to_deepspeed(result.config, world_size=result.world_size)
    assert again == exported


def test_fields_map_back() -> None:
    config = CONFIGS[1]
    back = import_deepspeed(to_deepspeed(config, 2)).config
    for name in (
        "precision",
        "zero_stage",
        "grad_accum",
        "micro_batch",
        "lr",
        "lr_schedule",
        "warmup_steps",
        "total_steps",
        "clip_grad_norm",
        "loss_scale_init",
        "loss_scale_interval",
        "optimizer",
        "weight_decay",
    ):
        assert getattr(back, name) == getattr(config, name), name


def test_exported_blocks() -> None:
    ds = to_deepspeed(CONFIGS[1], world_size=2)
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 12,
        "loss_scale_window": 500,
        "hysteresis": 1,
        "min_loss_scale": 1,
    }
    assert ds["gradient_clipping"] == 1.0
    assert ds["scheduler"]["type"] == "WarmupCosineLR"
    adam = to_deepspeed(CONFIGS[2])["optimizer"]
    assert adam["type"] == "Adam" and adam["params"]["adam_w_mode"] is False
    zero = to_deepspeed(CONFIGS[2])["zero_optimization"]
    assert zero == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    }


def test_sample_config_imports_with_warnings() -> None:
    result = import_deepspeed(SAMPLE)
    c = result.config
    assert (c.micro_batch, c.grad_accum, result.world_size) == (128, 8, 1)
    assert (c.precision.value, c.zero_stage, c.lr, c.weight_decay) == ("fp16", 3, 6e-5, 0.01)
    assert (c.offload_optimizer.value, c.offload_params.value, c.nvme_path) == ("cpu", "cpu", None)
    assert c.loss_scale_interval == 1000
    text = "\n".join(result.warnings)
    assert (
        "zero_optimization.offload_optimizer.nvme_path='/mnt/nvme': ignored while device is 'cpu'"
        in text
    )
    assert "zero_optimization.offload_param.nvme_path" in text
    assert "steps_per_print" in text and "overlap_comm" in text
    # world size given: micro is solved for it
    assert import_deepspeed(SAMPLE, world_size=4).config.micro_batch == 32
    with pytest.warns(UserWarning, match="nvme_path='/mnt/nvme': ignored while device is 'cpu'"):
        config = TrainConfig.from_deepspeed(SAMPLE)
    assert config == c


def test_sample_config_is_estimated() -> None:
    from workbench.estimate import estimate_memory

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = from_deepspeed(SAMPLE)
    e = estimate_memory(
        n_params=1e9,
        precision=c.precision.value,
        optimizer=c.optimizer.value,
        zero_stage=c.zero_stage,
        gpus=8,
        offload_optimizer=c.offload_optimizer.value != "none",
        offload_params=c.offload_params.value != "none",
    )
    # everything offloaded: nothing on the GPU, fp16 weights + grads + 12 B/param optimizer
    # states (ZeRO paper, 8 ranks) in host memory
    assert e.params_bytes == e.grads_bytes == e.optimizer_bytes == 0
    assert e.cpu_offload_bytes == pytest.approx(16e9 / 8, rel=1e-6)


def test_reads_json_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(to_deepspeed(CONFIGS[1], 2)))
    assert (
        import_deepspeed(str(path)).config == import_deepspeed(to_deepspeed(CONFIGS[1], 2)).config
    )
    with pytest.raises(ValueError, match="file not found"):
        import_deepspeed(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        import_deepspeed(str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {
                "train_batch_size": 10,
                "train_micro_batch_size_per_gpu": 3,
                "gradient_accumulation_steps": 2,
            },
            r"train_batch_size=10: must equal train_micro_batch_size_per_gpu \(3\) x gradient_accumulation_steps \(2\)",
        ),
        (
            {"train_batch_size": 1000, "gradient_accumulation_steps": 3},
            r"train_batch_size=1000: must equal .* not a multiple of 12",
        ),
        ({"foo": 1}, r"foo: unknown key; known keys here: .*train_batch_size"),
        ({"zero_optimization": {"stage": "3"}}, r"zero_optimization.stage='3': must be an integer"),
        ({"zero_optimization": {"stage": 5}}, r"zero_optimization.stage=5: must be 0, 1, 2 or 3"),
        (
            {"zero_optimization": {"stage": 3, "bucket": 1}},
            r"zero_optimization.bucket: unknown key",
        ),
        (
            {"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}},
            r"optimizer.type='Lamb': must be one of",
        ),
        ({"optimizer": {"type": "AdamW", "params": {"lr": "x"}}}, r"optimizer.params.lr='x'"),
        (
            {"fp16": {"enabled": True, "loss_scale": 128}},
            r"fp16.loss_scale=128: static loss scaling",
        ),
        (
            {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
            r"fp16 and bf16: enabled together",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
            r"offload_params='cpu': parameter offload needs zero_stage=3",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            r"zero_optimization.offload_param.nvme_path: missing",
        ),
        (
            {
                "zero_optimization": {
                    "stage": 3,
                    "offload_param": {"device": "nvme", "nvme_path": "/no/such/dir"},
                }
            },
            r"nvme_path='/no/such/dir': must be an existing writable directory",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}},
            r"offload_param.device='disk': must be one of none, cpu, nvme",
        ),
        ({"scheduler": {"type": "LRRangeTest"}}, r"scheduler.type='LRRangeTest'"),
    ],
)
def test_bad_configs_name_the_key(patch: dict, message: str) -> None:
    base = {"train_micro_batch_size_per_gpu": 4}
    with pytest.raises(ValueError, match=message):
        import_deepspeed({**base, **patch})


@pytest.mark.parametrize(
    ("zero", "keys"),
    [
        (
            {"stage": 2, "offload_param": {"device": "cpu"}},
            "(DeepSpeed keys: zero_optimization.offload_param.device, zero_optimization.stage)",
        ),
        (
            {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/no/such/dir"}},
            "(DeepSpeed keys: zero_optimization.offload_optimizer/offload_param.nvme_path)",
        ),
    ],
)
def test_setting_errors_name_the_deepspeed_keys(zero: dict, keys: str) -> None:
    with pytest.raises(ValueError) as info:
        import_deepspeed({"train_micro_batch_size_per_gpu": 4, "zero_optimization": zero})
    assert str(info.value).endswith(keys)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ValueError) as info:
        import_deepspeed({"train_batch_size": 0, "foo": 1, "zero_optimization": {"stage": 9}})
    text = str(info.value)
    assert "3 problems" in text and "foo" in text and "stage=9" in text


def test_world_size_conflict() -> None:
    ds = to_deepspeed(TrainConfig(), world_size=2)
    with pytest.raises(ValueError, match="implies world size 2, but world_size=4"):
        import_deepspeed(ds, world_size=4)
    with pytest.raises(ValueError, match="world_size=0"):
        import_deepspeed(ds, world_size=0)


def test_export_rejects_what_deepspeed_cannot_express() -> None:
    with pytest.raises(ValueError, match="loss_scale_growth=3.0"):
        to_deepspeed(TrainConfig(precision="fp16", loss_scale_growth=3.0))
    with pytest.raises(ValueError, match="loss_scale_init=1000.0: .*power of two"):
        to_deepspeed(TrainConfig(precision="fp16", loss_scale_init=1000.0))
    with pytest.raises(ValueError, match="world_size=0"):
        to_deepspeed(TrainConfig(), world_size=0)
