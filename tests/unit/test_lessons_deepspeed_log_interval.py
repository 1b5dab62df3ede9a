"""A DeepSpeed config's log interval is not bounded like a size or a count.

LMFlow's configs/ds_config_chatbot.json writes `"steps_per_print": 20000000000000000` so
DeepSpeed never prints; DeepSpeed accepts it. The importer takes it (the workbench
allocates and loops over nothing by it) and keeps the 2**53 bound where a number sizes
or counts something.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.deepspeed import import_deepspeed

# LMFlow's configs/ds_config_chatbot.json, as published (text, so the integer stays one)
LMFLOW_CHATBOT = """{
    "fp16": {
        "enabled": false
    },
    "bf16": {
        "enabled": true
    },
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": true,
        "contiguous_gradients": true,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": true
    },
    "comms_logger": {
        "enabled": false,
        "verbose": false,
        "prof_all": false,
        "debug": false
    },
    "steps_per_print": 20000000000000000,
    "train_micro_batch_size_per_gpu": 1,
    "wall_clock_breakdown": false
}
"""


def test_lmflows_chatbot_config_imports_with_its_never_print_interval(tmp_path: Path) -> None:
    path = tmp_path / "ds_config_chatbot.json"
    path.write_text(LMFLOW_CHATBOT)
    result = import_deepspeed(path, world_size=2)
    assert result.config.zero_stage == 3 and result.config.micro_batch == 1
    assert result.config.precision == "bf16"
    (ignored,) = [w for w in result.warnings if w.startswith("not modelled by the workbench")]
    assert "steps_per_print" in ignored


@pytest.mark.parametrize(
    "interval", [2**53 + 1, 2 * 10**16, 2**63, 10**400], ids=["2**53+1", "2e16", "2**63", "10**400"]
)
def test_any_positive_log_interval_is_taken(interval: int) -> None:
    result = import_deepspeed(
        {"steps_per_print": interval, "train_micro_batch_size_per_gpu": 2}, world_size=1
    )
    assert result.config.micro_batch == 2


@pytest.mark.parametrize(
    ("ds", "field"),
    [
        ({"train_micro_batch_size_per_gpu": 2 * 10**16}, "train_micro_batch_size_per_gpu"),
        (
            {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2**60},
            "gradient_accumulation_steps",
        ),
        (
            {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"steps_per_print": 2**60}},
            "zero_optimization.steps_per_print",
        ),
        ({"train_micro_batch_size_per_gpu": 1, "steps_per_print": -(2**60)}, "steps_per_print"),
    ],
)
def test_sizes_and_counts_past_2_53_stay_refused_naming_the_key(
    ds: dict[str, object], field: str
) -> None:
    with pytest.raises(ValueError, match=rf"{field}=-?\d+: larger than 9,007,199,254,740,992"):
        import_deepspeed(ds, world_size=1)
