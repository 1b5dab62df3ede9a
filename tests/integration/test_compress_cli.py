"""`workbench compress CHECKPOINT`: a saved Session checkpoint compressed and measured from
the command line; bad flags end as one line and exit status 2."""

from __future__ import annotations

import json
import os

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.cli import COMMANDS, main
from workbench.compress import disk_bytes, load_trained, weights_bytes

MLP = {"in_features": 16, "hidden": 32, "depth": 2, "out_features": 4, "samples": 256}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("ckpt")
    with Session(TrainConfig(micro_batch=16), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=3)
        s.save_weights(folder / "weights.pt")
        return s.save_checkpoint(folder)


def test_the_command_is_registered() -> None:
    assert COMMANDS["compress"][0] == "workbench.cli.compress:add_parser"


def test_json_report_of_a_checkpoint(checkpoint, capsys, tmp_path) -> None:
    code, out, err = run(
        [
            "compress",
            os.path.dirname(checkpoint),  # a directory: its newest checkpoint
            "--methods",
            "int8,prune,channels+int8",
            "--sparsity",
            "0.25",
            "--repeats",
            "3",
            "--threads",
            "1",
            "--json",
            "--out",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert [r["method"] for r in data["rows"]] == ["before", "int8", "prune", "channels+int8"]
    trained = load_trained(checkpoint)
    before = data["rows"][0]["figures"]
    assert before["params_bytes"] == weights_bytes(trained.model)
    assert before["disk_bytes"] == disk_bytes(trained.model)
    assert before["held_out_samples"] == int(0.1 * MLP["samples"])
    assert "step 3" in data["title"] and "held-out split" in data["held_out"]
    assert data["rows"][2]["figures"]["zero_fraction"] == pytest.approx(0.25, abs=0.01)
    written = set(os.listdir(tmp_path / "out"))
    assert written == {"int8.pt", "prune.pt", "channels+int8.pt", "report.json", "report.png"}
    pruned = torch.load(tmp_path / "out" / "prune.pt", weights_only=True)
    assert set(pruned) == set(trained.model.state_dict())


def test_text_report_of_a_weights_file(checkpoint, capsys) -> None:
    weights = os.path.join(os.path.dirname(checkpoint), "weights.pt")
    code, out, err = run(
        [
            "compress",
            weights,
            "--model",
            "mlp",
            "--model-options",
            json.dumps(MLP),
            "--methods",
            "channels",
            "--repeats",
            "3",
            "--threads",
            "1",
        ],
        capsys,
    )
    assert code == 0, err
    assert "before" in out and "channels" in out and "latency/batch" in out
    assert "note: held-out split" in out


def test_bad_flags_are_reported_together(checkpoint, capsys) -> None:
    code, _, err = run(
        [
            "compress",
            checkpoint,
            "--methods",
            "int9",
            "--sparsity",
            "1.5",
            "--repeats",
            "x",
            "--engine",
            "onnx",
        ],
        capsys,
    )
    assert code == 2
    line = err.strip()
    assert "\n" not in line and line.startswith("workbench compress: error:")
    for part in ("--methods int9", "--sparsity 1.5", "--repeats x", "--engine onnx"):
        assert part in line


def test_what_cannot_be_compressed_says_so_in_flags(checkpoint, capsys) -> None:
    code, _, err = run(["compress", checkpoint, "--methods", "heads"], capsys)
    assert code == 2 and "--methods channels or --methods prune" in err
    weights = os.path.join(os.path.dirname(checkpoint), "weights.pt")
    code, _, err = run(["compress", weights], capsys)
    assert code == 2 and "pass --model" in err
    code, _, err = run(["compress", "/no/such/file.pt"], capsys)
    assert code == 2 and "no such file or directory" in err
