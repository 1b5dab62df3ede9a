"""A paged optimizer's states (bitsandbytes' `PagedAdamW8bit`) are beside the device peak:
CUDA unified memory, outside the caching allocator, paged to the host by the driver when
the GPU is full. The estimate leaves them out of `peak_bytes` and `fits`, names them as a
host term equal to the optimizer states, and every place that shows an estimate names
them: the CLI, the estimator panel and a Session's memory() report."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.estimate import GIB, estimate_memory
from workbench.estimate.peak import PAGED_TERM

# torchtune's Llama 3.1 8B full fine-tune on one RTX 4090 (benchmarks/published_finetune.py)
RECIPE: dict[str, Any] = {
    "model": "llama-3-8b",
    "seq_len": 2048,
    "micro_batch": 2,
    "precision": "bf16-true",
    "optimizer_in_backward": True,
    "checkpointing": "full",
    "loss_chunks": 8,
    "gpu": "rtx-4090",
}


def test_the_peak_leaves_the_paged_states_out_and_fits_without_them() -> None:
    paged = estimate_memory(**RECIPE, optimizer="paged-adam8bit")
    unpaged = estimate_memory(**RECIPE, optimizer="adam8bit")
    states = paged.peak.host_terms[PAGED_TERM]
    # the host term is the optimizer states, byte for byte, and the same bytes as 8-bit AdamW's
    assert states == paged.optimizer_bytes == unpaged.optimizer_bytes > 0
    assert paged.peak_terms["optimizer states"] == 0
    assert all(total <= paged.peak_bytes for total in paged.peak.phases.values())
    assert paged.peak_bytes == unpaged.peak_bytes - states
    # on 24 GB the states would not fit beside the peak, yet the step fits: they are paged
    gpu = paged.gpu_memory_bytes
    assert gpu is not None and paged.required_bytes + states > gpu
    assert paged.fits and not unpaged.fits
    assert PAGED_TERM not in unpaged.peak.host_terms


def test_offloaded_states_are_not_counted_as_paged() -> None:
    kw = {**RECIPE, "optimizer_in_backward": False, "precision": "bf16"}
    e = estimate_memory(**kw, optimizer="paged-adam8bit", zero_stage=2, offload_optimizer=True)
    assert PAGED_TERM not in e.peak.host_terms


def test_the_cli_prints_the_paged_states_on_their_own_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from workbench.cli import main

    e = estimate_memory(**RECIPE, optimizer="paged-adam8bit")
    argv = ["estimate", "--optimizer", "paged-adam8bit", "--optimizer-in-backward"]
    for key in ("model", "seq_len", "micro_batch", "precision", "checkpointing", "loss_chunks"):
        argv += [f"--{key.replace('_', '-')}", str(RECIPE[key])]
    assert main([*argv, "--gpu", "rtx-4090"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if PAGED_TERM in ln)
    assert f"{e.optimizer_bytes / GIB:.2f}" in line
    assert "fits" in out and "NOT fit" not in out


def test_the_estimator_panel_names_the_paged_states() -> None:
    from workbench.ui import EstimatorPanel

    panel = EstimatorPanel()
    try:
        panel.fields["optimizer"].widget.value = "paged-adam8bit"
        e = panel.estimate
        assert e is not None and PAGED_TERM in e.peak.host_terms
        assert PAGED_TERM in panel.summary.value
    finally:
        panel.close()


def test_a_sessions_memory_report_names_the_paged_states_beside_the_prediction() -> None:
    import workbench
    from workbench import Session, TrainConfig

    model, data, loss_fn, _ = workbench.models.build_model(
        "tiny-gpt", layers=1, hidden=32, heads=2, seq_len=16, dropout=0.0
    )
    session = Session(
        TrainConfig(micro_batch=2, optimizer="paged-adam8bit", seed=0),
        model=model,
        data=data,
        loss_fn=loss_fn,
    )
    try:
        session.run(1, progress=False)
        report = session.memory()
    finally:
        session.close()
    note = next(n for n in report.notes if PAGED_TERM in n)
    assert "cudaMallocManaged" in note and "pages them to host memory" in note
