"""torch's Adafactor in the estimator: its factored second moment counted from the
parameters' shapes, equal to torch's own state bytes; accepted by TrainConfig, the
command line and the DeepSpeed/export refusals by its row."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from workbench import TrainConfig
from workbench.config import ConfigError
from workbench.estimate import Architecture, estimate_memory
from workbench.estimate.architecture import parameter_shapes
from workbench.export import ExportError, export_job
from workbench.optimizers import factored_state_elements, row


def _torch_state_bytes(module: nn.Module) -> int:
    """torch's Adafactor after one step: every state tensor but the 0-dim step counters."""
    opt = torch.optim.Adafactor(module.parameters(), lr=1e-2)
    module(torch.randn(2, 8)).sum().backward()
    opt.step()
    return sum(
        v.numel() * v.element_size()
        for st in opt.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )


def test_a_modules_factored_states_are_torchs_to_the_byte() -> None:
    module = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 5))
    est = estimate_memory(model=module, optimizer="adafactor")
    assert est.optimizer_bytes == _torch_state_bytes(module)
    # row 32 + col 8, 32, 32 + 32, row 5 + col 32, 5
    assert est.optimizer_bytes == 4 * (40 + 32 + 64 + 37 + 5)


def test_a_shapes_parameters_count_the_shape_and_fold_into_rows_and_columns() -> None:
    arch = Architecture.create(layers=2, hidden=64, heads=4, seq_len=64, vocab=65)
    shapes = parameter_shapes(arch)
    assert sum(int(torch.Size(s).numel()) for s in shapes) == arch.n_params
    est = estimate_memory(model=arch, optimizer="adafactor")
    assert est.optimizer_bytes == 4 * factored_state_elements(shapes)
    assert est.optimizer_bytes < estimate_memory(model=arch, optimizer="sgd").optimizer_bytes / 2


def test_sharded_each_rank_keeps_its_rows_and_the_whole_columns() -> None:
    assert factored_state_elements([(10, 6)], shards=2) == 5 + 6
    assert factored_state_elements([(10,)], shards=4) == 3
    assert factored_state_elements([(3, 10, 6)]) == 30 + 18
    module = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 6))
    full = estimate_memory(model=module, optimizer="adafactor")
    fsdp = estimate_memory(model=module, optimizer="adafactor", fsdp="full_shard", gpus=2)
    assert fsdp.optimizer_bytes == 4 * (16 + 8 + 16 + 3 + 32 + 3)
    assert full.optimizer_bytes > fsdp.optimizer_bytes


def test_without_shapes_the_bound_is_counted() -> None:
    est = estimate_memory(n_params=1000, optimizer="adafactor")
    assert est.optimizer_bytes == 4 * 1000 == row("adafactor").state_bytes_per_param * 1000


def test_trainconfig_takes_it_and_deepspeed_and_the_exports_refuse_it(tmp_path) -> None:
    assert TrainConfig(optimizer="adafactor").optimizer == "adafactor"
    assert row("adafactor").deepspeed_name is None
    with pytest.raises(ConfigError, match=r"optimizer='adafactor': .*DeepSpeed has no Adafactor"):
        TrainConfig(optimizer="adafactor", zero_stage=2).validate()
    for fmt in ("lightning", "deepspeed"):
        with pytest.raises(ExportError, match=r"optimizer='adafactor': the exported jobs"):
            export_job(
                TrainConfig(optimizer="adafactor"), format=fmt, gpus=1, out_dir=tmp_path / fmt
            )


def test_the_command_line_estimates_it_for_a_preset() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "estimate",
            "--optimizer",
            "adafactor",
            "--model",
            "gpt2",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "adafactor" in out and "optimizer states" in out
