"""A live session pointed at another run's folder (`update(checkpoint_dir=...)`) is refused
before its log moves there: nothing of the other run changes (docs/bad_input.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench import Session, TrainConfig

TINY = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}


def test_update_into_another_runs_folder_is_refused_before_the_log_moves(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    with Session(
        TrainConfig(micro_batch=2, checkpoint_dir=str(theirs)), model_options=TINY
    ) as first:
        first.run(2)
        first.save_checkpoint()
    before = {p.name: p.read_bytes() for p in theirs.iterdir() if p.is_file()}
    assert "log.jsonl" in before

    with Session(TrainConfig(micro_batch=2), model_options=TINY) as second:
        second.run(1)
        with pytest.raises(ValueError, match=r"checkpoint_dir=.*theirs.*another run"):
            second.update(checkpoint_dir=str(theirs))
        assert second.config.checkpoint_dir is None
        second.run(1)  # the session goes on, unchanged
        assert second.step == 2
        mine = tmp_path / "mine"
        second.update(checkpoint_dir=str(mine))
        second.run(1)
        assert Path(second.save_checkpoint()).parent == mine
    after = {p.name: p.read_bytes() for p in theirs.iterdir() if p.is_file()}
    assert after == before
