"""`workbench ladder`: a ladder from a rungs file, as JSON and as a chart; bad input ends as
one line and exit status 2 before anything trains."""

from __future__ import annotations

import json

import pytest

from workbench.cli import COMMANDS, main
from workbench.train import ladder as ladder_module

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
        (["--steps", "0"], "steps=0: must be an integer >= 1"),
        (["--steps", "x"], "--steps x: must be an integer"),
        (["--lr-scaling", "cubic"], "--lr-scaling cubic: must be one of none, linear, sqrt"),
        (["--rungs", "/no/such/rungs.json"], "--rungs /no/such/rungs.json: cannot read it"),
        (["--lr", "-1"], "--lr (lr=-1.0: must be a finite number > 0)"),
        (["--model-options", "[1]"], "--model-options [1]: must be a JSON object"),
    ],
)
def test_bad_input_ends_as_one_line(argv, message, capsys, monkeypatch) -> None:
    monkeypatch.setattr(ladder_module, "run_plan", lambda *a, **k: pytest.fail("it ran"))
    code, out, err = run(["ladder", "--model", "mlp", "--model-options", MLP, *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("workbench ladder: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_bad_rungs_are_named_with_every_problem(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(ladder_module, "run_plan", lambda *a, **k: pytest.fail("it ran"))
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
    assert code == 2 and f"--rungs {not_json}: not JSON" in err
    code, _, err = run(["ladder", "--rungs", str(rungs), "--compile"], capsys)
    assert code == 2 and "with --rungs, put those settings in the file's rungs" in err
