"""`workbench compress PATH` with a file that is no checkpoint: the refusal names the file
the user gave (not the tensor file a manifest would sit beside), says what a checkpoint
is, and shows none of the unpickler's internals; nothing in the file is run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.cli import main
from workbench.compress import load_trained
from workbench.train import checkpoints as ckpt

WHAT_IS_ALLOWED = "give a Session checkpoint (step-N.pt with its step-N.json manifest"


def _refusal(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(["compress", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_a_json_file_is_named_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "llama" / "config.json"
    config.parent.mkdir()
    config.write_text('{"hidden_size": 64}')
    err = _refusal(config, capsys)
    assert f"checkpoint {config}: a JSON file, not a checkpoint" in err
    assert "config.pt:" not in err and WHAT_IS_ALLOWED in err


def test_a_text_file_is_refused_without_unpickler_details(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")  # torch's loader fails with KeyError(101): 'e'
    err = _refusal(notes, capsys)
    assert f"checkpoint {notes}: neither a Session checkpoint" in err
    assert "not a file torch.save wrote, or a damaged one" in err and WHAT_IS_ALLOWED in err
    assert not err.rstrip().endswith("101") and ": 101" not in err


def test_the_safe_loader_names_no_loader_internals(tmp_path: Path) -> None:
    for name, data in (("notes.txt", b"hello\n"), ("empty.pt", b"")):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ckpt.CheckpointError) as info:
            ckpt.safe_load(path)
        assert (
            info.value.reason
            == "not a readable checkpoint: not a file torch.save wrote, or a damaged one"
        )


def test_a_list_is_no_state_dict(tmp_path: Path) -> None:
    path = tmp_path / "list.pt"
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match="not a state dict of tensors; give a Session checkpoint"):
        load_trained(path, model="mlp")
