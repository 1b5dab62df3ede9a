"""`workbench estimate --deepspeed-config` with Hugging Face "auto" values says what it
filled them with, on stderr, as `workbench export` does: the estimate is not made from
silently chosen settings (a micro-batch of 8, fp32), and --json's stdout stays JSON."""

from __future__ import annotations

import json

from workbench.cli import main

AUTO = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3},
}


def test_auto_values_are_said_on_stderr_once(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(AUTO))
    assert main(["estimate", "--params", "1e9", "--deepspeed-config", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)  # stdout is the JSON alone
    assert got["micro_batch"] == 8 and got["zero_stage"] == 3
    lines = [line for line in err.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("workbench estimate: warning: ")]
    assert said and said == lines
    auto = [line for line in said if '"auto"' in line]
    assert len(auto) == 1, said
    assert f"--deepspeed-config {path}" in auto[0]
    assert "train_micro_batch_size_per_gpu=8" in auto[0] and "bf16.enabled=False" in auto[0]


def test_a_config_without_auto_values_says_nothing(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}))
    assert main(["estimate", "--params", "1e9", "--deepspeed-config", str(path)]) == 0
    _, err = capsys.readouterr()
    assert "warning" not in err
