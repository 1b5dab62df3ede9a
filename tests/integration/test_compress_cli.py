"""`workbench compress CHECKPOINT`: a saved Session checkpoint compressed and measured from
the command line; bad flags end as one line and exit status 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.cli import COMMANDS, main
from workbench.compress import disk_bytes, load_trained, weights_bytes
from workbench.train import checkpoints as ckpt

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
            "--max-loss-ratio",
            "1.5",
            "--max-accuracy-drop",
            "2",
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
    assert "step 3" in data["title"] and "eval split" in data["held_out"]
    assert data["quality_data"] == "eval"  # the checkpoint's own data: it may have seen it
    assert data["rows"][2]["figures"]["zero_fraction"] == pytest.approx(0.25, abs=0.01)
    # the quality tolerance given is the one the verdicts judged by
    assert data["tolerance"] == {"max_loss_ratio": 1.5, "max_accuracy_drop": 2.0}
    for v in data["verdicts"]:
        assert v["quality"] == ("lost" if v["loss_ratio"] > 1.5 else "kept"), v
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
    assert "note: eval split" in out and "eval loss" in out and "held-out loss" not in out


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


# --------------------------------------------------------------------------- hostile input
def _crafted(checkpoint: str, folder: Path, model: dict) -> Path:
    payload = ckpt.load(checkpoint)
    payload.pop("path")
    payload.pop("manifest")
    payload["model"] = model
    return ckpt.save(payload, folder / "step-00000003.pt")


def test_a_checkpoint_naming_os_system_runs_nothing(checkpoint, capsys, tmp_path) -> None:
    target = tmp_path / "pwned"
    _crafted(
        checkpoint,
        tmp_path / "ck",
        {"name": "os:system", "options": {"command": f"touch {target}"}},
    )
    code, out, err = run(["compress", str(tmp_path / "ck"), "--repeats", "3"], capsys)
    assert code == 2 and out == "" and not target.exists()
    assert err.startswith("workbench compress: error: checkpoint ") and str(tmp_path / "ck") in err
    assert "names the model factory 'os:system'" in err
    assert "nothing was imported" in err and "--trust-model-spec" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_crafted_factory_runs_only_with_trust(checkpoint, capsys, tmp_path, marker) -> None:
    spec, mark = marker.spec, marker.path
    _crafted(checkpoint, tmp_path / "ck", {"name": spec, "options": MLP})
    argv = ["compress", str(tmp_path / "ck"), "--methods", "int8", "--repeats", "3"]
    code, _, err = run([*argv, "--threads", "1"], capsys)
    assert code == 2 and not marker.ran
    assert f"names the model factory {spec!r}" in err and "--trust-model-spec" in err
    code, out, err = run([*argv, "--threads", "1", "--trust-model-spec"], capsys)
    assert code == 0, err
    assert mark.read_text() == "called" and "int8" in out
    module, _, function = spec.partition(":")
    assert "workbench compress: warning: trusting checkpoint " in err
    assert f"importing module {module!r}" in err and f"calling {function}(**options)" in err


def test_a_factory_given_with_model_is_the_users_choice(checkpoint, capsys, marker) -> None:
    spec, mark = marker.spec, marker.path
    weights = os.path.join(os.path.dirname(checkpoint), "weights.pt")
    code, out, err = run(
        ["compress", weights, "--model", spec, "--model-options", json.dumps(MLP)]
        + ["--methods", "int8", "--repeats", "3", "--threads", "1"],
        capsys,
    )
    assert code == 0, err
    assert mark.read_text() == "called" and "int8" in out


def test_the_trust_flag_says_what_it_allows(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compress", "-h"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--trust-model-spec" in text and "runs code the file chose" in text


LONG = "x" * 300


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threads", "-1"], "--threads -1: must be an integer >= 1"),
        (["--threads", "1" + "0" * 60], "--threads 1" + "0" * 60 + ": must be at most 1,024"),
        (["--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
        (["--batch-size", "1e20"], "--batch-size 1e20: must be an integer"),
        (["--repeats", "2"], "--repeats 2: must be an integer >= 3"),
        (["--repeats", "99999999"], "--repeats 99999999: must be at most 10,000"),
        (["--eval-samples", "1" + "0" * 40], "must be at most 1,000,000,000"),
        (["--held-out", "nan"], "--held-out nan: must be a finite number"),
        (["--held-out", "1"], "--held-out 1: must be a fraction in (0, 1)"),
        (["--sparsity", "inf"], "--sparsity inf: must be a finite number"),
        (["--max-loss-ratio", "0.9"], "--max-loss-ratio 0.9: must be a finite number >= 1"),
        (["--max-loss-ratio", "nan"], "--max-loss-ratio nan: must be a finite number"),
        (
            ["--max-accuracy-drop", "-1"],
            "--max-accuracy-drop -1: must be a number of accuracy points in [0, 100]",
        ),
        (
            ["--max-accuracy-drop", "1e3", "--max-loss-ratio", "x"],
            "--max-loss-ratio x: must be a finite number; --max-accuracy-drop 1e3: must be a "
            "number of accuracy points in [0, 100]",
        ),
        (["--model-options", '{"a": 1, "a": 2}'], "key 'a' appears twice in one object"),
        (["--model-options", '{"a": NaN}'], "JSON numbers must be finite"),
        (["--model-options", "[1]"], "--model-options [1]: must be a JSON object"),
        (["--model-options", "[" * 100 + "]" * 100], "nested deeper than 8 levels"),
    ],
)
def test_bad_numbers_and_options_end_as_one_line(checkpoint, argv, message, capsys) -> None:
    code, out, err = run(["compress", checkpoint, *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("workbench compress: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_every_problem_of_a_command_line_at_once(tmp_path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = run(
        ["compress", str(fifo), "--threads", "0", "--held-out", "nan", "--repeats", "1e300"]
        + ["--model-options", '{"a": 1, "a": 2}', "--out", str(fifo)],
        capsys,
    )
    assert code == 2
    for part in (
        f"checkpoint {fifo}: a FIFO (named pipe)",
        "--threads 0: must be an integer >= 1",
        "--held-out nan: must be a finite number",
        "--repeats 1e300: must be an integer",
        "--model-options",
        f"--out {fifo}: exists and is a FIFO (named pipe), where a folder is needed",
    ):
        assert part in err


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/dev/zero", "checkpoint /dev/zero: a device"),
        (LONG, "cannot be read (File name too long)"),
    ],
)
def test_a_checkpoint_that_is_no_file_is_named(path, message, capsys) -> None:
    code, _, err = run(["compress", path], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_binary_file_is_named_without_torchs_advice(tmp_path, capsys) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(bytes(range(256)) * 8)
    code, _, err = run(["compress", str(junk), "--model", "mlp"], capsys)
    assert code == 2 and str(junk) in err and len(err.strip().splitlines()) == 1
    assert "weights_only` set to `False`" not in err and "Traceback" not in err


def test_a_failed_write_leaves_the_old_output_whole(checkpoint, capsys, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    old = {"int8.pt": b"old weights", "report.json": b'{"old": true}'}
    for name, data in old.items():
        (out / name).write_bytes(data)
    (out / "report.png").mkdir()  # a target name taken by a folder
    code, stdout, err = run(
        ["compress", checkpoint, "--methods", "int8", "--repeats", "3", "--threads", "1"]
        + ["--out", str(out)],
        capsys,
    )
    assert code == 2 and stdout == ""
    assert err.startswith("workbench compress: error: --out ") and "report.png" in err
    assert "nothing was changed there" in err
    for name, data in old.items():
        assert (out / name).read_bytes() == data
    assert sorted(os.listdir(out)) == ["int8.pt", "report.json", "report.png"]  # no temporaries
