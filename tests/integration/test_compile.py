"""`compile=True`: the forward runs through torch.compile, live; the first step after a
(re)build compiles (its record is marked warm-up) and the arithmetic is the eager one's."""

from __future__ import annotations

import pytest

from workbench import Session, TrainConfig

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 256}


def test_compiled_forward_trains_on_the_eager_curve_and_switches_live() -> None:
    config = TrainConfig(micro_batch=8, lr=1e-2, seed=1)
    with Session(config, model="mlp", model_options=MLP) as eager:
        want = [r.loss for r in eager.run(optimizer_steps=4)]
    with Session(config.replace(compile=True), model="mlp", model_options=MLP) as s:
        assert type(s.backend.module).__name__ == "OptimizedModule"  # torch.compile's wrapper
        assert s.model is not s.backend.module  # your module, not the wrapper
        records = s.run(optimizer_steps=3)
        assert [r.warmup for r in records] == [True, False, False]  # the compile step
        s.update(compile=False)
        assert type(s.backend.module).__name__ != "OptimizedModule"
        records += s.run(optimizer_steps=1)
        assert records[-1].changes == {"compile": False}
    assert [r.loss for r in records] == pytest.approx(want, rel=1e-5, abs=1e-6)
