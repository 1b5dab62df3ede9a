"""`workbench ladder`: a ladder from a rungs file, as JSON and as a chart; bad input ends as
one line and exit status 2 before anything trains."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbench.cli import COMMANDS, main
from workbench.train.ladder import run as ladder_run

MLP = '{"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 256}'


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_is_registered() -> None:
    assert COMMANDS["ladder"][0] == "workbench.cli.ladder:add_parser"


def test_a_rungs_file_as_json_and_a_chart(tmp_path, capsys) -> None:
    rungs = tmp_path / "rungs.json"
    rungs.write_text(
        json.dumps(
            [
                {"name": "baseline", "precision": "fp32"},
                {"name": "+ AMP", "precision": "amp-bf16"},
                {"name": "+ accumulation", "grad_accum": 2, "lr_scaling": "sqrt"},
            ]
        )
    )
    chart = tmp_path / "out" / "ladder.png"
    code, out, err = run(
        [
            "ladder",
            "--rungs",
            str(rungs),
            "--steps",
            "4",
            "--repeats",
            "1",
            "--model",
            "mlp",
            "--model-options",
            MLP,
            "--device",
            "cpu",
            "--lr",
            "0.01",
            "--target-loss",
            "0.000001",
            "--json",
            "--out",
            str(chart),
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    names = [r["name"] for r in data["rungs"]]
    assert names == ["baseline", "+ AMP", "+ accumulation"]
    assert [r["steps"] for r in data["rungs"]] == [4, 4, 2]
    assert data["rungs"][2]["settings"]["lr"] == pytest.approx(0.01 * 2**0.5)
    assert all(r["steps_to_target"] is None for r in data["rungs"])  # reported, exit 0
    assert data["setup"]["model"] == "mlp" and data["setup"]["samples"] == 32
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_table_is_the_default_output(tmp_path, capsys) -> None:
    rungs = tmp_path / "rungs.json"
    rungs.write_text(json.dumps({"rungs": [{"name": "b"}, {"name": "w", "num_workers": 1}]}))
    code, out, _ = run(
        ["ladder", "--rungs", str(rungs), "--steps", "3", "--repeats", "1", "--model", "mlp"]
        + ["--model-options", MLP, "--device", "cpu", "--no-memory"],
        capsys,
    )
    assert code == 0
    assert out.startswith("optimization ladder: mlp on cpu, 24 samples per rung, 1 repeat(s)")
    assert "w: " in out and "speed-up" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps 0: must be an integer >= 1"),
        (["--steps", "x"], "--steps x: must be an integer"),
        (["--lr-scaling", "cubic"], "--lr-scaling cubic: must be one of none, linear, sqrt"),
        (["--rungs", "/no/such/rungs.json"], "--rungs /no/such/rungs.json: no such file"),
        (["--lr", "-1"], "--lr (lr=-1.0: must be a finite number > 0"),
        (["--model-options", "[1]"], "--model-options [1]: must be a JSON object"),
    ],
)
def test_bad_input_ends_as_one_line(argv, message, capsys, monkeypatch) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", lambda *a, **k: pytest.fail("it ran"))
    code, out, err = run(["ladder", "--model", "mlp", "--model-options", MLP, *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("workbench ladder: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_bad_rungs_are_named_with_every_problem(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", lambda *a, **k: pytest.fail("it ran"))
    rungs = tmp_path / "rungs.json"
    rungs.write_text(
        json.dumps([{"name": "b"}, {"name": "x", "precison": "amp-bf16"}, {"name": "y", "zero": 9}])
    )
    code, _, err = run(["ladder", "--rungs", str(rungs), "--model", "mlp"], capsys)
    assert code == 2
    assert "rung 2 'x': precison='amp-bf16': unknown setting; did you mean 'precision'?" in err
    assert "rung 3 'y': zero=9: unknown setting; did you mean 'zero_stage'?" in err
    not_json = tmp_path / "bad.json"
    not_json.write_text("[{")
    code, _, err = run(["ladder", "--rungs", str(not_json)], capsys)
    assert code == 2 and f"--rungs {not_json}: not valid JSON" in err
    code, _, err = run(["ladder", "--rungs", str(rungs), "--compile"], capsys)
    assert code == 2 and "with --rungs, put those settings in the file's rungs" in err


# --------------------------------------------------------------------------- hostile input
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            lambda spec: [{"name": "b"}, {"name": "x", "model": spec}],
            "rung 2 'x': model='{spec}': a rung holds training settings only; the model is "
            "the ladder's own (model=, --model), never a rung's",
        ),
        (
            lambda spec: {"rungs": [{"name": "b"}, {"name": "w", "num_workers": 1}], "model": spec},
            "--rungs {path}: 'model': not allowed; an object holds only \"rungs\"",
        ),
    ],
)
def test_a_rungs_file_naming_a_model_runs_nothing(
    content, message, tmp_path, capsys, monkeypatch, marker
) -> None:
    spec = marker.spec
    monkeypatch.setattr(ladder_run, "run_plan", lambda *a, **k: pytest.fail("it ran"))
    rungs = tmp_path / "rungs.json"
    rungs.write_text(json.dumps(content(spec)))
    code, out, err = run(
        ["ladder", "--rungs", str(rungs), "--model", "mlp", "--model-options", MLP]
        + ["--device", "cpu"],
        capsys,
    )
    assert code == 2 and out == "" and not marker.ran
    assert message.format(spec=spec, path=rungs) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _bad_files(tmp_path: Path) -> dict[str, str]:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (tmp_path / "dup.json").write_text('[{"name": "b", "seed": 1, "seed": 2}]')
    (tmp_path / "big.json").write_text("[" + " " * (2 << 20) + "]")
    return {p.name: str(p) for p in tmp_path.iterdir()}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("fifo", "a FIFO (named pipe), not a regular file"),
        ("folder", "a directory, not a regular file"),
        ("binary.json", "not UTF-8 text (byte 0x80 at offset 0)"),
        ("deep.json", "nested deeper than 8 levels"),
        ("dup.json", "key 'seed' appears twice in one object"),
        ("big.json", "larger than the 1,048,576-byte limit"),
        ("/dev/zero", "--rungs /dev/zero: a device, not a regular file"),
        ("x" * 300, "cannot be read (File name too long)"),
    ],
)
def test_a_rungs_file_that_is_no_ladder_is_named(name, message, tmp_path, capsys) -> None:
    path = _bad_files(tmp_path).get(name, name)
    code, out, err = run(["ladder", "--rungs", path, "--model", "mlp"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("workbench ladder: error: --rungs ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "1" + "0" * 60], "--ranks 1" + "0" * 60 + ": must be at most 1,024"),
        (["--steps", "1e300"], "--steps 1e300: must be an integer"),
        (["--steps", "10000000"], "--steps 10000000: must be at most 1,000,000"),
        (["--repeats", "5000"], "--repeats 5000: must be at most 1,000"),
        (["--timeout", "inf"], "--timeout inf: must be a finite number"),
        (["--timeout", "1e300"], "--timeout 1e300: must be at most 2,592,000 seconds"),
        (["--target-loss", "inf"], "--target-loss inf: must be a finite number"),
        (["--model-options", '{"a": 1, "a": 2}'], "key 'a' appears twice in one object"),
        (["--model-options", '{"a": NaN}'], "JSON numbers must be finite"),
        (["--device", "tpu"], "--device tpu: must be 'auto', 'cpu' or 'cuda'"),
    ],
)
def test_bad_numbers_end_as_one_line(argv, message, capsys, monkeypatch) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", lambda *a, **k: pytest.fail("it ran"))
    code, out, err = run(["ladder", "--model", "mlp", *argv], capsys)
    assert code == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_every_problem_of_a_command_line_at_once(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", lambda *a, **k: pytest.fail("it ran"))
    code, _, err = run(
        ["ladder", "--steps", "0", "--repeats", "x", "--timeout", "nan", "--target-loss", "inf"]
        + ["--micro-batch", "0", "--lr", "x", "--lr-scaling", "cubic", "--model", "mlp"]
        + ["--model-options", "[1]", "--out", str(tmp_path)],
        capsys,
    )
    assert code == 2
    for part in (
        "--steps 0: must be an integer >= 1",
        "--repeats x: must be an integer",
        "--timeout nan: must be a finite number",
        "--target-loss inf: must be a finite number",
        "--micro-batch (micro_batch=0: must be an integer >= 1",
        "--lr x: must be a finite number",
        "--lr-scaling cubic: must be one of",
        "--model-options [1]: must be a JSON object",
        f"--out {tmp_path}: is a folder; name the chart's file",
    ):
        assert part in err
    assert len(err.strip().splitlines()) == 1


def test_a_chart_that_cannot_be_written_leaves_the_old_one(tmp_path, capsys, monkeypatch) -> None:
    import workbench.outputs

    chart = tmp_path / "ladder.png"
    chart.write_bytes(b"the old chart")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workbench.outputs.os, "fsync", disk_full)
    rungs = tmp_path / "rungs.json"
    rungs.write_text(json.dumps([{"name": "b"}, {"name": "w", "num_workers": 1}]))
    code, out, err = run(
        ["ladder", "--rungs", str(rungs), "--steps", "2", "--repeats", "1", "--model", "mlp"]
        + ["--model-options", MLP, "--device", "cpu", "--no-memory", "--out", str(chart)],
        capsys,
    )
    assert code == 2
    assert out.startswith("optimization ladder: mlp on cpu")  # the measurements are kept
    assert f"workbench ladder: error: --out {chart}: cannot write" in err
    assert "No space left on device; nothing was changed there" in err
    assert chart.read_bytes() == b"the old chart"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ladder.png", "rungs.json"]
