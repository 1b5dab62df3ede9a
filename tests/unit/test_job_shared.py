"""The library imports the shipped job modules' pieces instead of keeping copies of them
(docs/architecture.md, "Layers"): one object each, so the two cannot drift apart."""

from __future__ import annotations

import pytest


def test_the_library_reads_the_jobs_own_tables() -> None:
    from workbench.export import job_common
    from workbench.train import schedule
    from workbench.train.techniques import lora, offload, recompute

    assert offload.VIEW_OR_COPY is job_common.VIEW_OR_COPY
    assert lora.HEAD_NAMES is job_common.LORA_HEADS
    assert recompute._FLAG is job_common.CHECKPOINTABLE
    assert schedule.ONECYCLE_PCT_START is job_common.ONECYCLE_PCT_START
    assert schedule.ONECYCLE_FINAL_DIV is job_common.ONECYCLE_FINAL_DIV


def test_the_sessions_schedule_still_refuses_an_unknown_name() -> None:
    from workbench.train.schedule import lr_multiplier

    with pytest.raises(ValueError, match="'linear'"):
        lr_multiplier("linear", 0, 0, 10)


def test_job_common_gives_the_names_of_its_shipped_modules() -> None:
    """The scripts import job.json's reading and tensor parallelism from job_common, as
    before the modules were split: the same objects."""
    from workbench.export import job_common, job_files, job_parallel

    for name in ("fail", "read_job", "approve_model", "approve_text", "JOB_NAME", "SCRIPT"):
        assert getattr(job_common, name) is getattr(job_files, name)
    assert job_common.tensor_parallelize is job_parallel.tensor_parallelize
    assert job_common.sharded_grad_norm is job_parallel.sharded_grad_norm
