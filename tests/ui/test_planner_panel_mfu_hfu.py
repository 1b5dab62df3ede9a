"""The Planner tab prints both utilisations, each named (MFU: the model's FLOPs; HFU: the
recomputed forward too), and says where the efficiency comes from."""

from __future__ import annotations

from workbench.ui.planner import PlannerPanel


def test_the_panel_shows_mfu_and_hfu_and_the_efficiency_source() -> None:
    panel = PlannerPanel(seq_len=4096, global_batch=64)
    try:
        result = panel.plan()
        assert "<th>MFU</th><th>HFU</th>" in panel.table.value
        assert f"<td>{result.best.hfu:.0%}</td>" in panel.table.value
        assert "published runs on h100-80gb" in panel.status.value
    finally:
        panel.close()
