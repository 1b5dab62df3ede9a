"""Checkpoints: exact resume on CPU, atomic writes, pruning, autosave."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench import Session, TrainConfig
from workbench.train import checkpoints as ckpt


@pytest.mark.parametrize(
    "settings",
    [
        {"optimizer": "adamw", "precision": "fp32"},
        {"optimizer": "sgd", "precision": "amp-fp16", "lr": 1e-2, "loss_scale_interval": 2},
    ],
    ids=["adamw-fp32", "sgd-amp-fp16"],
)
def test_resumed_session_reproduces_the_uninterrupted_trajectory_exactly(tmp_path, tiny, settings):
    cfg = TrainConfig(
        micro_batch=4, grad_accum=2, seed=7, checkpoint_dir=str(tmp_path / "run"), **settings
    )
    with Session(cfg, model_options=tiny) as a:
        first = a.run(3)
        path = a.save_checkpoint(tmp_path / "mid.pt")
        rest = a.run(4)
        final = {k: v.clone() for k, v in a.model.state_dict().items()}
    torch.manual_seed(1234)  # whatever happens in between must not matter
    with Session.resume_from(path) as b:
        # the history up to the checkpoint comes back from the run's log
        assert b.step == 3 and [r.to_dict() for r in b.history] == [r.to_dict() for r in first]
        resumed = b.run(4)
        assert [r.step for r in resumed] == [4, 5, 6, 7]
        assert [r.loss for r in resumed] == [r.loss for r in rest]  # exact, not approx
        assert [r.lr for r in resumed] == [r.lr for r in rest]
        assert [r.scale for r in resumed] == [r.scale for r in rest]
        for k, v in b.model.state_dict().items():
            assert torch.equal(v, final[k]), k


def test_resume_mid_epoch_after_a_micro_batch_change(tmp_path, tiny):
    cfg = TrainConfig(micro_batch=4, seed=2)
    with Session(cfg, model_options=tiny) as a:
        a.run(2)
        a.update(micro_batch=2, grad_accum=2, precision="amp-bf16")
        a.run(1)
        path = a.save_checkpoint(tmp_path)
        rest = [r.loss for r in a.run(3)]
    with Session.resume_from(tmp_path) as b:  # the directory: newest checkpoint
        assert b.config.micro_batch == 2 and b.config.precision == "amp-bf16"
        assert [r.loss for r in b.run(3)] == rest
    assert path.endswith("step-00000003.pt")


def test_checkpoints_are_atomic_and_pruned(tmp_path, tiny):
    cfg = TrainConfig(
        micro_batch=2, checkpoint_dir=str(tmp_path), checkpoint_every_steps=2, keep_checkpoints=2
    )
    with Session(cfg, model_options=tiny) as s:
        s.run(9)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [  # no .tmp left behind; each tensor file with its manifest
        "log.jsonl",
        "step-00000006.json",
        "step-00000006.pt",
        "step-00000008.json",
        "step-00000008.pt",
    ]
    saved = [e for e in s.events if e.kind == "checkpoint"]
    assert len(saved) == 4
    payload = ckpt.load(tmp_path)
    assert payload["step"] == 8
    assert payload["config"]["checkpoint_every_steps"] == 2
    assert {"torch", "numpy", "python"} <= set(payload["rng"])
    assert payload["data"] == {"epoch": 0, "offset": 16}


def test_failed_write_leaves_the_previous_file(tmp_path, monkeypatch, tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.run(1)
        target = tmp_path / "run.pt"
        s.save_checkpoint(target)
        good = target.read_bytes()
        s.run(1)

        def broken_save(obj, f):
            f.write(b"partial")
            raise OSError("disk full")

        monkeypatch.setattr(ckpt.torch, "save", broken_save)
        with pytest.raises(OSError, match="disk full"):
            s.save_checkpoint(target)
        assert target.read_bytes() == good
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.pt"]
        assert ckpt.load(target)["step"] == 1


def test_time_based_autosave(tmp_path, tiny):
    cfg = TrainConfig(micro_batch=2, checkpoint_dir=str(tmp_path), checkpoint_every_seconds=1e-6)
    with Session(cfg, model_options=tiny) as s:
        s.run(2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [
        "step-00000001.pt",
        "step-00000002.pt",
    ]


def test_user_module_checkpoint_needs_the_module(tmp_path):
    x = torch.randn(32, 3)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    model = nn.Linear(3, 1)
    with Session(
        TrainConfig(micro_batch=4), model=model, data=data, loss_fn=nn.functional.mse_loss
    ) as s:
        s.run(2)
        path = s.save_checkpoint(tmp_path / "user.pt")
        rest = [r.loss for r in s.run(2)]
    with pytest.raises(ValueError, match="model=None: the checkpoint holds a user module"):
        Session.resume_from(path)
    with Session.resume_from(
        path, model=nn.Linear(3, 1), data=data, loss_fn=nn.functional.mse_loss
    ) as b:
        assert [r.loss for r in b.run(2)] == rest


def test_bad_checkpoint_paths(tmp_path, tiny):
    with pytest.raises(ValueError, match="no checkpoint"):
        Session.resume_from(tmp_path)
    with pytest.raises(ValueError, match="no such checkpoint"):
        Session.resume_from(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        Session.resume_from(tmp_path / "junk.pt")
    with (
        Session(TrainConfig(micro_batch=2), model_options=tiny) as s,
        pytest.raises(ValueError, match="path=None"),
    ):
        s.save_checkpoint()
