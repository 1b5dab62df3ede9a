"""A Session's own steps give its measured MFU and HFU (the one FLOP count over the
catalog peak of the GPU named); `plan(calibrate=session)` reads the same steps and refuses
a rate that is no share of the planned GPU's peak (a CPU run of a toy)."""

from __future__ import annotations

import pytest

from workbench import Session, TrainConfig
from workbench.estimate import estimate_memory, get_gpu
from workbench.models import build_model
from workbench.planner import plan
from workbench.train.measure.utilisation import measured_utilisation

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "dropout": 0.0}


def test_a_sessions_steps_give_its_mfu_and_hfu() -> None:
    info = build_model("tiny-gpt", **TINY)[3]
    shape = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": info.vocab,
             "n_params": info.n_params}  # fmt: skip
    config = TrainConfig(micro_batch=4, seed=0, activation_checkpointing=True)
    with Session(config, model_options=TINY) as s:
        records = s.run(optimizer_steps=4)
        u = measured_utilisation(s, gpu="h100", **shape)
        steady = [r for r in records if not r.warmup and r.tokens_per_s]
        tokens = sum((r.tokens_per_s or 0.0) * r.step_seconds for r in steady)
        assert u.tokens_per_s == pytest.approx(tokens / sum(r.step_seconds for r in steady))
        assert u.steps == len(steady) and "after warm-up over their seconds" in u.text()
        count = estimate_memory(**shape).flop_count
        assert count is not None
        peak = get_gpu("h100").peak_fp32_flops  # the Session trained in fp32
        assert u.mfu == pytest.approx(count.model_per_token() * u.tokens_per_s / peak)
        assert u.hfu == pytest.approx(count.hardware_per_token("full") * u.tokens_per_s / peak)
        assert u.hfu > u.mfu and "MFU" in u.text() and "HFU" in u.text()
        with pytest.raises(ValueError, match="gpu='b300x': "):
            measured_utilisation(s, gpu="b300x", **shape)
        with pytest.raises(ValueError, match="the step ran fp32 and the plans run 16-bit"):
            plan(**shape, gpu="h100", gpus=1, global_batch=4, calibrate=s)
        with pytest.raises(ValueError, match="was the step the planned model's"):
            plan(**shape, gpu="h100", gpus=1, global_batch=4, calibrate=s, precision="fp32")


def test_the_session_and_an_observer_say_their_own_mfu() -> None:
    """`Session.utilisation` and `Observer.utilisation` read their own steps with their
    model's FLOP count: the same figures as `measured_utilisation` given the shape."""
    import torch

    from workbench.integrations.observer import Observer

    info = build_model("tiny-gpt", **TINY)[3]
    shape = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": info.vocab,
             "n_params": info.n_params}  # fmt: skip
    with Session(TrainConfig(micro_batch=4, seed=0), model_options=TINY) as s:
        s.run(optimizer_steps=4)
        u = s.utilisation(gpu="h100")
        assert u == measured_utilisation(s, gpu="h100", **shape)
        assert u.mfu == u.hfu > 0  # no recomputation
        with pytest.raises(ValueError, match="gpu=None: no CUDA device"):
            s.utilisation()
    observer = Observer(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="steps="):
        observer.utilisation(gpu="h100")  # nothing observed yet: where steps come from
