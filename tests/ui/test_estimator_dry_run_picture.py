"""The estimator panel's dry run shows the picture of the step's memory below its table."""

from __future__ import annotations

from workbench.ui import EstimatorPanel


def test_the_dry_run_shows_the_steps_memory_over_time_in_the_panel() -> None:
    p = EstimatorPanel(
        layers="2",
        hidden="64",
        heads="4",
        seq_len="64",
        vocab="256",
        micro_batch="2",
        gpus="1",
        zero_stage=0,
        checkpointing="none",
    )
    try:
        picture = p.dry.picture
        # below the summary and the dry-run button, hidden before a run
        column = p.widget.children[0].children[1].children
        assert column.index(picture) == len(column) - 1 and p.dry.button in column[-2].children
        assert picture.layout.display == "none"
        assert p.start_dry_run()
        p.wait_for_dry_run()
        (run,) = p.dry_runs.values()
        assert not isinstance(run, Exception), run
        assert picture.layout.display is None
        assert bytes(picture.value).startswith(b"\x89PNG") and len(picture.value) > 10_000
        # the picture is the run's own: the same bytes its timeline draws
        assert bytes(picture.value) == run.timeline().png()
        p.dry.show(ValueError("a failed run"))
        assert picture.layout.display == "none"
    finally:
        p.close()
