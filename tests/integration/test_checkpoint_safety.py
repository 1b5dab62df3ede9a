"""Checkpoints that are safe to load and share: weights_only, the manifest and its hash,
refused pickles, the previous format."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from workbench import Session, TrainConfig
from workbench.train import checkpoints as ckpt
from workbench.train import runlog


def _trained(tmp_path: Path, tiny: dict[str, int], steps: int = 2) -> tuple[str, list[float]]:
    """A checkpoint after `steps` steps, and the losses of the 2 steps after it."""
    cfg = TrainConfig(micro_batch=2, seed=5, checkpoint_dir=str(tmp_path / "run"))
    with Session(cfg, model_options=tiny) as s:
        s.run(steps)
        path = s.save_checkpoint()
        rest = [r.loss for r in s.run(2)]
    return path, rest


def test_a_checkpoint_loads_with_weights_only_and_its_manifest_without_torch(tmp_path, tiny):
    path, _ = _trained(tmp_path, tiny)
    payload = torch.load(path, weights_only=True)  # torch's safe loader, nothing allow-listed
    assert payload["format"] == ckpt.CHECKPOINT_FORMAT and payload["step"] == 2
    assert "history" not in payload
    assert isinstance(payload["rng"]["numpy"]["key"], torch.Tensor)
    assert isinstance(payload["rng"]["python"]["state"], list)

    manifest = json.loads(Path(path).with_suffix(".json").read_text())
    data = Path(path).read_bytes()
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["bytes"] == len(data)
    assert manifest["file"] == Path(path).name and manifest["step"] == 2
    assert manifest["config"] == payload["config"]
    assert manifest["model"]["name"] == "tiny-gpt" and manifest["model"]["n_params"] > 0
    assert manifest["log"] == "log.jsonl" and manifest["world_size"] == 1
    assert manifest["format"] == 2


def test_checkpoint_size_does_not_grow_with_the_steps(tmp_path, tiny):
    cfg = TrainConfig(micro_batch=2, seed=5, checkpoint_dir=str(tmp_path))
    with Session(cfg, model_options=tiny) as s:
        s.run(2)
        early = Path(s.save_checkpoint()).stat().st_size
        s.run(30)
        late = Path(s.save_checkpoint()).stat().st_size
    # the same tensors at step 2 and step 32; only the pickled numbers' widths may differ
    assert abs(late - early) <= 64, (early, late)
    assert len(runlog.read_records(tmp_path / runlog.LOG_NAME)) == 32


class _Payload:
    """Runs code when unpickled (what an attacker would put into a shared file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("with_manifest", [True, False], ids=["hash-matches", "no-manifest"])
def test_a_crafted_checkpoint_is_refused_and_nothing_runs(tmp_path, tiny, with_manifest):
    path, _ = _trained(tmp_path, tiny)
    marker = tmp_path / "code-ran"
    payload = torch.load(path, weights_only=True)
    payload["model"]["options"] = {"evil": _Payload(marker)}
    evil = tmp_path / "evil.pt"
    torch.save(payload, evil)
    if with_manifest:  # a correct hash: the unpickler itself must refuse
        manifest = json.loads(Path(path).with_suffix(".json").read_text())
        data = evil.read_bytes()
        manifest.update(file=evil.name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        evil.with_suffix(".json").write_text(json.dumps(manifest))
    with pytest.raises(ckpt.CheckpointError, match=r"refused: .*pathlib.*nothing in it was loaded"):
        Session.resume_from(evil)
    assert not marker.exists()
    # the same file through plain torch.load(weights_only=False) would have run it
    torch.load(evil, weights_only=False)
    assert marker.exists()


def test_truncated_altered_and_incomplete_files_are_named(tmp_path, tiny):
    path, _ = _trained(tmp_path, tiny)
    good = Path(path).read_bytes()
    manifest = Path(path).with_suffix(".json")

    Path(path).write_bytes(good[: len(good) // 2])
    with pytest.raises(ckpt.CheckpointError, match=r"truncated: \d+ bytes, its manifest says"):
        Session.resume_from(path)

    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0xFF
    Path(path).write_bytes(bytes(flipped))
    with pytest.raises(ckpt.CheckpointError, match="altered: its SHA-256 differs"):
        Session.resume_from(path)

    Path(path).write_bytes(good)
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(ckpt.CheckpointError, match="manifest is not readable JSON"):
        Session.resume_from(path)

    manifest.unlink()
    with pytest.raises(ckpt.CheckpointError, match="incomplete: its manifest .* is missing"):
        Session.resume_from(path)
    with pytest.raises(ckpt.CheckpointError, match="incomplete"):
        Session.resume_from(Path(path).parent)  # the directory: the same file, the same answer


#: A checkpoint the previous format's code wrote (tests/integration/data/format1/make.py
#: says how), with the losses of its history and of the 3 steps that run trained after it.
FORMAT1 = Path(__file__).parent / "data" / "format1"


def _previous_format(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of the previous format's checkpoint (convert() rewrites it) and its losses."""
    folder = tmp_path / "old"
    folder.mkdir()
    facts = json.loads((FORMAT1 / "continued.json").read_text())
    old = folder / facts["file"]
    old.write_bytes((FORMAT1 / facts["file"]).read_bytes())
    return old, facts


def test_previous_format_checkpoints_still_resume_exactly_and_convert(tmp_path):
    old, facts = _previous_format(tmp_path)
    raw = torch.load(old, weights_only=False)  # the file as the previous code wrote it
    assert raw["format"] == ckpt.PREVIOUS_FORMAT and isinstance(raw["rng"]["numpy"], tuple)
    assert [r["loss"] for r in raw["history"]] == facts["history_losses"]
    assert not old.with_suffix(".json").exists()  # no manifest then
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(old, weights_only=True)  # NumPy's array is outside torch's default list
    random.seed(99)
    np.random.seed(99)
    with Session.resume_from(old.parent) as s:  # the directory: its newest step-N.pt
        assert s.step == 3 and [r.loss for r in s.history] == facts["history_losses"]
        continued = [r.loss for r in s.run(3)]
    # the losses the previous code went on to train, on the machine that wrote the file:
    # equal to the last bit on that CPU, to float rounding on another (its matmul kernels
    # sum in another order: measured 1e-7 relative); bit for bit on one machine below
    assert continued == pytest.approx(facts["continued_losses"], rel=1e-6)
    assert ckpt.convert(old.parent) == [old]
    assert ckpt.verify(old)["format"] == 2
    assert "history" not in torch.load(old, weights_only=True)
    with Session.resume_from(old) as s:
        assert [r.loss for r in s.run(3)] == continued  # converted: the same, bit for bit


def test_a_previous_format_file_with_other_objects_says_how_to_convert(tmp_path):
    old, _ = _previous_format(tmp_path)
    payload = torch.load(old, weights_only=False)
    payload["model"]["options"] = {"when": __import__("datetime").date(2026, 1, 1)}
    torch.save(payload, old)
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"datetime.date.*convert it once: workbench.train.checkpoints.convert\(.*trusted=True\)",
    ) as info:
        Session.resume_from(old)
    assert "\n" not in str(info.value)


def test_values_a_safe_load_could_not_read_are_refused_at_save(tmp_path):
    with pytest.raises(ValueError, match=r"payload\['model'\]\['options'\]\['path'\]=.*PosixPath"):
        ckpt.save(
            {"format": 2, "step": 1, "config": {}, "model": {"options": {"path": tmp_path}}},
            tmp_path / "x.pt",
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "engine", [{"zero_stage": 3}, {"fsdp": "full_shard"}], ids=["deepspeed-zero3", "fsdp"]
)
def test_every_engines_checkpoint_is_the_same_safe_file(tmp_path, tiny, engine):
    """DeepSpeed and FSDP sessions write the backend-neutral checkpoint too (full fp32
    weights and optimizer state gathered from the shards): weights_only, hash-checked,
    exact resume."""
    cfg = TrainConfig(micro_batch=2, seed=4, device="cpu", checkpoint_dir=str(tmp_path), **engine)
    with Session(cfg, model_options=tiny) as s:
        s.run(2)
        path = s.save_checkpoint()
        rest = [r.loss for r in s.run(2)]
    payload = torch.load(path, weights_only=True)
    assert payload["backend"]["model"] and payload["backend"]["optimizer"]["state"]
    ckpt.verify(path)
    with Session.resume_from(path) as b:
        assert [r.loss for r in b.run(2)] == rest


def test_a_manifest_that_disagrees_with_its_file_is_named(tmp_path, tiny):
    path, _ = _trained(tmp_path, tiny)
    manifest = Path(path).with_suffix(".json")
    data = json.loads(manifest.read_text())
    data["step"] = 3  # hash and size still right: the file itself says step 2
    manifest.write_text(json.dumps(data))
    with pytest.raises(ckpt.CheckpointError, match="altered: step 2, format 2 in the file; step 3"):
        Session.resume_from(path)
