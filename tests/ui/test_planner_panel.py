"""The Planner tab (`workbench.ui.planner.PlannerPanel`): the planner's ranking for the
inputs shown, and a bad input refused in the status line with the last ranking kept."""

from __future__ import annotations

from workbench.planner import plan
from workbench.ui.planner import PlannerPanel


def test_the_panel_shows_the_planners_ranking() -> None:
    panel = PlannerPanel(seq_len=4096, global_batch=64)
    try:
        result = panel.plan()
        expected = plan(model="llama-3-8b", gpu="h100-80gb", seq_len=4096, global_batch=64)
        assert [p.label() for p in result.plans] == [p.label() for p in expected.plans]
        assert result.best.label() in panel.table.value
        assert panel.table.value.count("<tr>") == 1 + 10  # the header and the top 10
        assert "Why #1" in panel.why.value and "Fastest plan per memory budget" in panel.why.value
        assert "setups fit 1 x 8 h100-80gb at 64 x 4096" in panel.status.value
        # another GPU and size, through the widgets as a user sets them
        panel.gpu.value, panel.gpus_per_node.value, panel.nodes.value = "a100-80gb", 8, 2
        panel.button.click()
        assert panel.result.cluster.gpus == 16 and panel.result.cluster.gpu.name == "a100-80gb"
    finally:
        panel.close()
    assert panel.closed


def test_a_bad_input_is_refused_in_the_status_line_and_the_ranking_stays() -> None:
    panel = PlannerPanel(seq_len=4096, global_batch=64)
    try:
        first = panel.plan()
        table = panel.table.value
        panel.global_batch.value = 0
        assert panel.plan() is None
        assert "global_batch=0: must be an integer from 1 to" in panel.status.value
        assert panel.result is first and panel.table.value == table
        panel.global_batch.value, panel.gpu.value = 64, "l4"
        panel.nodes.value = 2
        assert panel.plan() is None
        assert "no inter-node bandwidth for l4" in panel.status.value
    finally:
        panel.close()


def test_the_pins_reach_the_planner() -> None:
    """Engines, precision, attention, optimizer, offload, LoRA and headroom, set in the widgets, rank
    what `plan()` ranks with the same pins; a bad pin is refused naming it."""
    panel = PlannerPanel(seq_len=4096, global_batch=64)
    try:
        panel.engines.value = ("zero3", "full_shard")
        panel.precision.value = "bf16-true"
        panel.attention.value = "eager"
        panel.offload.value = False
        panel.lora_rank.value = 16
        panel.headroom.value = 0.1
        result = panel.plan()
        expected = plan(
            model="llama-3-8b", gpu="h100-80gb", seq_len=4096, global_batch=64,
            engines=("zero3", "full_shard"), precision="bf16-true", attention="eager",
            offload=False, lora_rank=16, headroom=0.1,
        )  # fmt: skip
        assert [p.label() for p in result.plans] == [p.label() for p in expected.plans]
        assert {p.engine for p in result.plans} <= {"zero3", "full_shard"}
        assert all(
            p.settings["precision"] == "bf16-true" and p.settings["attention"] == "eager"
            and p.settings["lora_rank"] == 16 and "offload_optimizer" not in p.settings
            for p in result.plans
        )  # fmt: skip
        panel.lora_rank.value = -1
        assert panel.plan() is None
        assert "lora_rank=-1: must be an integer from 0 to 4096" in panel.status.value
        assert panel.result is result
    finally:
        panel.close()


def test_the_optimizer_pin_reaches_the_planner() -> None:
    """8-bit AdamW pinned in the panel: Llama 3 8B on one H200 trains without offload
    (AdamW's 16 bytes a parameter fit it without offload only under ZeRO-3, whose step
    upcasts one sub-group of the gradients at a time; every other plan offloads)."""
    panel = PlannerPanel(gpu="h200-141gb", gpus_per_node=1, seq_len=1024, global_batch=8)
    try:
        adamw = panel.plan()
        assert {p.settings["optimizer"] for p in adamw.plans} == {"adamw"}
        kept = [p for p in adamw.plans if "offload_optimizer" not in p.settings]
        assert {p.settings.get("zero_stage") for p in kept} == {3}
        assert any("offload_optimizer" in p.settings for p in adamw.plans)
        panel.optimizer.value = "adam8bit"
        eight = panel.plan()
        assert eight.plans and {p.settings["optimizer"] for p in eight.plans} == {"adam8bit"}
        assert "offload_optimizer" not in eight.best.settings
    finally:
        panel.close()


def test_plans_tied_on_step_time_are_marked_as_tied_not_ranked() -> None:
    """Plans whose predicted step times are equal to the 0.1 ms shown share a place ("1=")
    and the table says why they tie, so a tie-break does not read as a speed-up."""
    from workbench.ui.planner import tie_note, tied_ranks

    assert tied_ranks([0.1, 0.1, 0.2, 0.3, 0.3, 0.3]) == ["1=", "1=", "3", "4=", "4=", "4="]
    assert tied_ranks([0.1, 0.2]) == ["1", "2"]
    assert tie_note([0.1, 0.2]) == ""
    assert tie_note([0.1, 0.1, 0.2]).startswith("Tied (2 plans at #1)")
    panel = PlannerPanel(seq_len=4096, global_batch=64)
    try:
        result = panel.plan()
        times = [round(p.step_seconds * 1e3, 1) for p in result.plans[:10]]
        tied = len(times) != len(set(times))
        assert ("Tied (" in panel.table.value) is tied
        assert ("<td>1=</td>" in panel.table.value) is (times.count(times[0]) > 1)
    finally:
        panel.close()


def test_the_mfu_and_your_nccl_tests_reach_the_planner(tmp_path) -> None:
    """The MFU typed plans the compute at it; an nccl-tests file plans the network at the
    share it measured, said in the status line; a bad value of either is refused naming
    it and the last ranking stays."""
    import html

    from nccl_output import nccl_tests_output

    run = tmp_path / "rs.txt"
    run.write_text(nccl_tests_output("reduce_scatter", 2, 8, {8 * 2**30: 300.0}))
    panel = PlannerPanel(seq_len=4096, global_batch=64, nodes=2)
    try:
        panel.mfu.value, panel.nccl_tests.value = "0.35", str(run)
        result = panel.plan()
        expected = plan(model="llama-3-8b", gpu="h100-80gb", nodes=2, seq_len=4096,
                        global_batch=64, mfu=0.35, nccl_tests=str(run))  # fmt: skip
        assert [p.label() for p in result.plans] == [p.label() for p in expected.plans]
        assert result.efficiency == 0.35 and result.cluster.network_factor < 1
        assert "from your nccl-tests: rs.txt: reduce_scatter over 2 x 8" in panel.status.value
        head = f"network at x{result.cluster.network_factor:.2f} of NCCL's channel rates"
        assert head in html.unescape(panel.status.value)  # the share planned, not a run's
        table = panel.table.value
        panel.mfu.value = "fast"
        assert panel.plan() is None
        assert "mfu='fast': must be a number" in html.unescape(panel.status.value)
        panel.mfu.value, panel.nccl_tests.value = "", str(tmp_path / "missing.txt")
        assert panel.plan() is None and "missing.txt" in panel.status.value
        assert "no such file" in panel.status.value
        assert panel.result is result and panel.table.value == table
        panel.nccl_tests.value, panel.nccl_ib_defaults.value = "", True
        untuned = panel.plan()
        assert untuned.cluster.network_factor == 0.8
        assert "NCCL's default InfiniBand settings" in html.unescape(panel.status.value)
        panel.nccl_tests.value = str(run)  # both: refused, the last ranking stays
        assert panel.plan() is None and panel.result is untuned
        assert "nccl_ib_defaults=True: give it or nccl_tests=" in html.unescape(panel.status.value)
    finally:
        panel.close()
