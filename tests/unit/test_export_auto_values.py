"""A DeepSpeed config's "auto" values are filled with the settings the job is written with
(the flags over the config), and the warning names those values, not the defaults the
flags replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.cli.launch import main as launch_main
from workbench.deepspeed import import_deepspeed

AUTO = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2},
    "bf16": {"enabled": "auto"},
}


def _auto_config(tmp_path: Path) -> Path:
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(AUTO))
    return path


def test_the_warning_names_the_values_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job"
    argv = ["export", "--config", str(_auto_config(tmp_path)), "--gpus", "4"]
    argv += ["--micro-batch", "2", "--grad-accum", "3", "--precision", "bf16", "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    written = json.loads((out / "ds_config.json").read_text())
    assert written["train_micro_batch_size_per_gpu"] == 2
    assert written["gradient_accumulation_steps"] == 3
    assert written["train_batch_size"] == 24 and written["bf16"]["enabled"] is True
    assert "train_micro_batch_size_per_gpu=2 (micro_batch)" in err
    assert "gradient_accumulation_steps=3 (grad_accum)" in err
    assert "bf16.enabled=True (precision)" in err
    assert "=8 (micro_batch)" not in err and "=1 (grad_accum)" not in err


def test_launch_names_the_values_its_ranks_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(_auto_config(tmp_path)), "--ranks", "1", "--device", "cpu"]
    assert launch_main([*argv, "--micro-batch", "2", "--grad-accum", "3", "--print-command"]) == 0
    captured = capsys.readouterr()
    assert "train_micro_batch_size_per_gpu=2 (micro_batch)" in captured.err
    assert "gradient_accumulation_steps=3 (grad_accum)" in captured.err
    assert '"micro_batch": 2, "grad_accum": 3' in captured.out


def test_the_import_lists_its_auto_keys() -> None:
    imported = import_deepspeed(AUTO)
    assert imported.auto_keys == (
        "bf16.enabled",
        "gradient_accumulation_steps",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
    )
    assert import_deepspeed({"train_batch_size": 8}).auto_keys == ()
