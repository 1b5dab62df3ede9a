"""The estimator panel's context-parallel field (declared in `workbench.estimate.schema`)."""

from __future__ import annotations

from workbench.ui.estimator import EstimatorPanel, _split_label


def test_the_panel_reads_context_parallel_and_shows_the_split() -> None:
    panel = EstimatorPanel(model="llama-3-8b", seq_len="32768", gpus="8", context_parallel="4")
    e = panel.estimate
    assert e is not None and e.context_parallel == 4 and e.seq_len == 32768
    assert _split_label(e) == "8 GPUs: tp 1 x pp 1 x cp 4 x dp 2"
    bad = EstimatorPanel(model="llama-3-8b", seq_len="32768", gpus="8", context_parallel="3")
    errors = bad.errors()
    assert "multiple of 6" in errors["context_parallel"]
    assert "x context parallel = 3" in errors["gpus"]
