"""The estimator panel's summary names the rate its time assumes as the CLI does: the
default setup recomputes (selective), so the rate is the HFU and the MFU is lower."""

from __future__ import annotations

import pytest

from workbench.ui import EstimatorPanel


@pytest.fixture
def panel():
    p = EstimatorPanel()
    yield p
    p.close()


def test_the_time_row_says_hfu_with_the_mfu_beside_it(panel: EstimatorPanel) -> None:
    e = panel.estimate
    assert e is not None and e.checkpointing == "selective" and e.train_seconds is not None
    mfu = e.model_flops_utilisation
    assert mfu is not None and mfu < e.mfu
    assert f"on 8 GPUs at HFU {e.mfu:.2f} (MFU {mfu:.2f})" in panel.summary.value
    assert "at MFU" not in panel.summary.value
