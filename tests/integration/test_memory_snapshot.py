"""`Session.memory(snapshot=True)`: the real step recorded on CUDA, drawn beside the dry
run's picture; elsewhere a plain refusal naming the argument."""

from __future__ import annotations

import pickle

import pytest
from torch.cuda import _memory_viz

from workbench import Session, TrainConfig
from workbench.train.dry_run.timeline import Timeline

TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16}


def test_on_a_cpu_snapshot_says_it_needs_cuda_and_memory_still_measures() -> None:
    with Session(TrainConfig(micro_batch=2), model_options=TINY, device="cpu") as s:
        with pytest.raises(ValueError, match=r"snapshot=True: .*needs CUDA.*'cpu'"):
            s.memory(snapshot=True)
        report = s.memory()
    assert report.snapshot is None and report.picture() is None and report.timeline() is None
    assert report.to_dict()["snapshot"] is False


@pytest.mark.gpu
def test_on_a_gpu_the_recorded_step_is_drawn_beside_the_dry_run() -> None:
    cfg = TrainConfig(micro_batch=2, precision="amp-bf16")
    with Session(cfg, model_options=TINY, device="cuda") as s:
        s.run(2)
        report = s.memory(snapshot=True)
    snap = report.snapshot
    assert snap is not None and report.dry_run is not None
    actions = [e["action"] for e in snap["device_traces"][report.snapshot_device]]
    assert actions.count("alloc") > 10
    assert "Active Memory Timeline" in _memory_viz.trace_plot(pickle.loads(pickle.dumps(snap)))
    real = report.timeline()
    assert isinstance(real, Timeline) and real.peak_bytes > 0
    names = [band for band, _ in real.bands]
    assert "parameters" in names and "optimizer states" in names
    figure = report.picture()
    assert len(figure.axes) == 4  # the real step's picture and its table, the dry run's
