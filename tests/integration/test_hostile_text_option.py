"""A checkpoint never chooses which other file the workbench reads: tiny-gpt's `text` option
saved in a checkpoint is read again only when the user names it (docs/bad_input.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench import Session, TrainConfig
from workbench.compress import load_trained

TINY = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}


@pytest.fixture(scope="module")
def checkpoint_with_text(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny-gpt checkpoint trained on a text of the user's; the checkpoint's manifest and
    payload name that text."""
    root = tmp_path_factory.mktemp("text")
    text = root / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    config = TrainConfig(micro_batch=2, checkpoint_dir=str(root / "run"))
    with Session(config, model="tiny-gpt", model_options={**TINY, "text": str(text)}) as s:
        s.run(1)
        path = Path(s.save_checkpoint())
    return path, text


def test_resume_refuses_a_text_the_checkpoint_names(checkpoint_with_text) -> None:  # type: ignore[no-untyped-def]
    path, text = checkpoint_with_text
    with pytest.raises(ValueError, match=r"model_options.*text.*named by checkpoint") as exc:
        Session.resume_from(path)
    assert "pass the text yourself" in str(exc.value)


def test_resume_reads_the_text_the_user_names(checkpoint_with_text) -> None:  # type: ignore[no-untyped-def]
    path, text = checkpoint_with_text
    with Session.resume_from(
        path,
        model_options={**TINY, "text": str(text)},
        checkpoint_dir=str(path.parent.parent / "again"),
    ) as s:
        assert s.step == 1 and s.model_options["text"] == str(text)
        (record,) = s.run(1)
        assert record.step == 2


def test_compress_refuses_a_text_the_checkpoint_names(checkpoint_with_text) -> None:  # type: ignore[no-untyped-def]
    path, text = checkpoint_with_text
    with pytest.raises(ValueError, match=r"model_options.*named by checkpoint"):
        load_trained(path)
    trained = load_trained(path, model_options={"text": str(text)})
    assert trained.options["text"] == str(text)
