"""The panels' status lines show the rate the run sustains, not one step's: the samples of
the recent steps over their seconds (`workbench.rates.recent`: the last 20, or those since
the last settings change), said with how many steps it covers. With two loader workers the
steps alternate between a long wait and none, and the last step alone says twice the
rate."""

from __future__ import annotations

import pytest
import torch
from ui_fakes import FakeSession

from workbench.config import TrainConfig
from workbench.integrations import Observer
from workbench.rates import RECENT_STEPS, recent
from workbench.ui import TrainingPanel
from workbench.ui.fields import strip_tags
from workbench.ui.observer import ObserverPanel

# two workers: one step waits 0.14 s for a batch and computes 0.01 s, the next finds its
# batch ready and computes 0.05 s; 2 steps every 0.2 s
BURST = ((0.14, 0.01), (0.0, 0.05))


def test_the_training_panels_status_is_the_rate_over_the_recent_steps() -> None:
    session = FakeSession(TrainConfig(micro_batch=4))
    panel = TrainingPanel(session, autostart=False)
    try:
        for _ in range(12):
            for data_s, compute_s in BURST:
                session.step(data_seconds=data_s, compute_seconds=compute_s)
        panel.refresh(draw_now=True)
        last = session.history[-1]
        assert last.samples_per_s == pytest.approx(80)  # the fast step alone: 4 / 0.05 s
        # 20 steps of 4 samples in 10 x 0.2 s
        assert "40.0 samples/s over the last 20 steps" in panel.status_text
        assert "80.0 samples/s" not in panel.status_text
        session.update(micro_batch=8)  # from here each step trains 8 samples
        for data_s, compute_s in BURST:
            session.step(data_seconds=data_s, compute_seconds=compute_s)
        panel.refresh(draw_now=True)
        # only the 2 steps since the change: 16 samples in 0.2 s
        assert "80.0 samples/s over the last 2 steps" in panel.status_text
    finally:
        panel.close()


def test_the_observer_panels_status_is_the_rate_over_the_recent_steps() -> None:
    obs = Observer(None, trainer="transformers")
    obs.attach(torch.nn.Linear(2, 2))
    for _ in range(12):
        for data_s, compute_s in BURST:
            obs.step(1.0, samples=4)
            step_s = data_s + compute_s  # the times of the burst, not this machine's
            obs.replace_last(
                step_seconds=step_s,
                data_seconds=data_s,
                compute_seconds=compute_s,
                samples_per_s=4 / step_s,
            )
    panel = ObserverPanel(obs, autostart=False)
    try:
        text = strip_tags(panel.status.value)
        assert obs.records()[-1].samples_per_s == pytest.approx(80)
        assert "40.0 samples/s over the last 20 steps" in text and "80.0" not in text
    finally:
        panel.close()


def test_the_recent_steps_leave_out_the_warm_up_and_what_came_before_a_change() -> None:
    def step(n: int, **kw: object) -> dict[str, object]:
        return {"step": n, "step_seconds": 0.1, "samples_per_s": 80.0, **kw}

    steps = [step(n) for n in range(1, 31)]
    assert [r["step"] for r in recent(steps)] == list(range(11, 31))  # the last 20
    assert RECENT_STEPS == 20
    changed = [*steps[:25], step(26, changes={"precision": "amp-bf16"}, warmup=True)]
    changed += [step(n) for n in range(27, 31)]
    # from the change on, its first step left out: it built a new engine (a warm-up step)
    assert [r["step"] for r in recent(changed)] == [27, 28, 29, 30]
    only = [step(1, warmup=True)]
    assert recent(only) == only  # a warm-up step when it is all there is
    assert recent([]) == []
