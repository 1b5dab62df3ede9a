"""Hostile and careless values for TrainConfig: a valid config or one ValueError naming
every bad field, never another exception (hypothesis)."""

from __future__ import annotations

import math
import os
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import LIMITS, TrainConfig

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "200"))
NAMES = [f.name for f in fields(TrainConfig)]

hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**80), max_value=10**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["fp32", "amp-bf16", "cpu", "full_shard", "adamw", "1,000", "1e400", "nan"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(np.int64, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.bool_, st.booleans()),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(NAMES), hostile, max_size=6))
def test_any_values_give_a_valid_config_or_one_value_error_naming_them(
    changes: dict[str, Any],
) -> None:
    try:
        config = TrainConfig(**changes)
    except ValueError as exc:
        text = str(exc)
        assert text.startswith(("invalid setting: ", f"{text.split(' ')[0]} invalid settings:"))
        # every line names a field that was given (or a combination of given fields)
        for line in text.splitlines()[1:] or [text]:
            assert any(name in line for name in changes), line
        return
    assert config.problems() == []
    plain = config.to_dict()
    for value in plain.values():  # NumPy scalars are stored as Python's own numbers
        assert value is None or type(value) in (bool, int, float, str)
    assert TrainConfig.from_dict(plain) == config


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(hostile, st.dictionaries(st.integers(), st.integers(), min_size=1)))
def test_from_dict_of_anything_is_a_config_or_value_error(data: Any) -> None:
    try:
        TrainConfig.from_dict(data)
    except ValueError as exc:
        assert "invalid setting" in str(exc) or "invalid settings" in str(exc)


def test_every_problem_of_one_config_is_reported_at_once() -> None:
    with pytest.raises(ValueError) as info:
        TrainConfig(micro_batch=0, offload_optimizer="cpu", fsdp="full_shard", precision="bf16")
    text = str(info.value)
    assert text.startswith("3 invalid settings:")
    assert "micro_batch=0: must be an integer >= 1" in text
    assert "fsdp='full_shard': precision='bf16' is DeepSpeed's 16-bit mode" in text
    assert "offload_optimizer='cpu': a DeepSpeed (ZeRO-Offload) setting" in text


def test_a_bad_field_still_lets_the_combinations_of_the_others_be_checked() -> None:
    with pytest.raises(ValueError) as info:
        TrainConfig(lr=-1, zero_stage=0, offload_optimizer="cpu", warmup_steps=20, total_steps=10)
    text = str(info.value)
    assert "lr=-1" in text and "offload_optimizer='cpu': needs zero_stage 1, 2 or 3" in text
    assert "warmup_steps=20: must not exceed total_steps=10" in text


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"micro_batch": 10**70}, r"micro_batch=<an integer of about 71 digits>: .* at most"),
        ({"micro_batch": 10**6 + 1}, r"at most 10\^6 \(more samples in one forward pass"),
        ({"seed": 2**64}, r"seed=18446744073709551616: .*at most 2\^63 - 1 \(torch and NumPy"),
        ({"lr": 1e300}, r"lr=1e\+300: must be a finite number > 0, at most 1000"),
        ({"lr": math.inf}, r"lr=inf: must be a finite number"),
        ({"total_steps": 10**13}, r"total_steps=10000000000000: .*at most 10\^12"),
        ({"momentum": 1.0}, r"momentum=1.0: must be a finite number >= 0 and < 1"),
        ({"pin_memory": "false"}, r"pin_memory='false': must be True or False"),
        ({"micro_batch": "8"}, r"micro_batch='8': must be an integer"),
        ({"checkpoint_dir": "x" * 5000}, r"checkpoint_dir='xxx.*\.\.\.: must be a directory path"),
        ({"nvme_path": "a\0b"}, r"nvme_path=.*no NUL"),
        ({"precision": ["fp32"]}, r"precision=\['fp32'\]: must be one of fp32"),
    ],
)
def test_out_of_range_and_wrongly_typed_values_are_named(
    changes: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        TrainConfig(**changes)


def test_every_bound_is_accepted_and_one_past_it_refused() -> None:
    for name, (top, _, _) in LIMITS.items():
        integral = (
            isinstance(getattr(TrainConfig(), name) or 1, int)
            and name != "checkpoint_every_seconds"
        )
        value = int(top) if integral else float(top)
        # the settings a bound needs beside it: a schedule that long, a pipeline's micro-batches
        needs = {"warmup_steps": {"total_steps": max(value, 1)}, "pp": {"grad_accum": value}}
        extra = needs.get(name, {})
        assert getattr(TrainConfig(**{name: value}, **extra), name) == value
        with pytest.raises(ValueError, match=rf"{name}=.*at most"):
            TrainConfig(**{name: value + 1 if integral else value * 2}, **extra)


def test_numpy_scalars_are_numbers_and_stored_as_python_numbers() -> None:
    config = TrainConfig(
        micro_batch=np.int64(4),
        lr=np.float32(0.5),
        pin_memory=np.bool_(True),
        zero_stage=np.int8(1),
    )
    assert (config.micro_batch, config.lr, config.pin_memory, config.zero_stage) == (
        4,
        0.5,
        True,
        1,
    )
    assert type(config.micro_batch) is int and type(config.lr) is float
    assert type(config.pin_memory) is bool and type(config.zero_stage) is int
    with pytest.raises(ValueError, match="micro_batch=.*must be an integer"):
        TrainConfig(micro_batch=np.bool_(True))


@pytest.mark.parametrize("data", [None, [1, 2], "micro_batch=2", 7])
def test_from_dict_of_no_mapping_is_named(data: Any) -> None:
    with pytest.raises(ValueError, match=r"data=.*: must be a mapping of setting names"):
        TrainConfig.from_dict(data)


def test_from_dict_with_a_non_string_key_is_named() -> None:
    with pytest.raises(ValueError, match=r"1=2: setting names are strings"):
        TrainConfig.from_dict({1: 2})
