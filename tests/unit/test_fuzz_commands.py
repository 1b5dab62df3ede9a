"""Fuzzing the argument handling of `workbench launch`, `workbench ladder` and `workbench
compress` (hypothesis): whatever the flags hold, each command line ends in a result (exit
0) or one clear error (exit 2), never another exception, never a hang.

Nothing trains here: `launch` always runs with `--print-command`; the ladder's runs
(`run_plan`) and the compression (`workbench.compress.compress`) are replaced by stubs
that return at once, so a command line that passes every check returns right away. The
files handed to `--rungs`, `--config` and the checkpoint argument are hostile ones made
here (a FIFO, a folder, binary bytes, JSON nested 200,000 deep, duplicate keys, a model
named in a file) next to good ones. `WORKBENCH_FUZZ_EXAMPLES` raises the number of
examples per test (default 25) for a longer run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from workbench.cli import main

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MLP = {"in_features": 4, "hidden": 8, "depth": 1, "out_features": 2, "samples": 64}

#: Values a careless or hostile user types: out of range, not finite, not numbers at all.
HOSTILE = [
    "0",
    "1",
    "2",
    "-1",
    "3.5",
    "1e300",
    "-1e300",
    "1e20",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "1" + "0" * 60,
    "9" * 5000,
    "2**64",
    "1,000",
    "1_000",
    "0x10",
    " 3 ",
    "",
    "true",
    "None",
    "\x00",
    "é",
    "x" * 300,
    "[]",
    "{}",
]
#: --model-options texts: strict JSON problems, and small valid options.
OPTIONS = [
    '{"a": 1, "a": 2}',
    '{"hidden": NaN}',
    '{"hidden": Infinity}',
    '{"hidden": 1e400}',
    "[1, 2]",
    "7",
    '"text"',
    "{",
    "[" * 100 + "]" * 100,
    '{"bogus": 1}',
    '{"hidden": "8"}',
    '{"hidden": -3}',
    '{"hidden": 1e300}',
    json.dumps(MLP),
    "{}",
]
#: Model specs; none that could run anything (no importable factory).
MODELS = ["mlp", "tiny-gpt", "cnn", "resnet", "no_such_pkg.mod:fn", "not a spec", ":", ""]


def values(extra: list[str] | None = None) -> st.SearchStrategy[str]:
    """A flag's value: a hostile one, a generated integer or float as text, or any text."""
    return st.one_of(
        st.sampled_from(HOSTILE + (extra or [])),
        st.integers(min_value=-(10**70), max_value=10**70).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.text(max_size=12),
    )


def flags(spec: dict[str, st.SearchStrategy[str]]) -> st.SearchStrategy[list[str]]:
    """Some of the flags in `spec` with drawn values, as '--flag=value' arguments (so a
    value such as '-inf' is never taken for a flag)."""
    return st.lists(st.sampled_from(sorted(spec)), unique=True, max_size=len(spec)).flatmap(
        lambda names: st.tuples(*(spec[n].map(lambda v, n=n: f"{n}={v}") for n in names)).map(list)
    )


def outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    """The exit status of `workbench ARGV` run in this process; an error (2) must be one
    line on stderr ending with what the command says, never a traceback."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, err)
    if currently_in_test_context():
        event(f"exit {code}")  # --hypothesis-show-statistics: how many got through
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        last = err.strip().splitlines()[-1]
        assert ": error: " in last, (argv, err)
    return code


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Hostile and good input files, by name."""
    root = tmp_path_factory.mktemp("fuzz-files")
    os.mkfifo(root / "fifo")
    (root / "folder").mkdir()
    (root / "binary.json").write_bytes(bytes(range(256)) * 4)
    (root / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (root / "dup.json").write_text('[{"name": "b", "seed": 1, "seed": 2}]')
    (root / "model.json").write_text(json.dumps([{}, {"name": "x", "model": "os:system"}]))
    (root / "object.json").write_text(json.dumps({"rungs": [{}], "model": "os:system"}))
    (root / "rungs.json").write_text(json.dumps([{"name": "b"}, {"name": "w", "num_workers": 1}]))
    (root / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    (root / "ds-model.json").write_text(json.dumps({"model": "os:system"}))
    paths = {p.name: str(p) for p in root.iterdir()}
    paths["/dev/zero"] = "/dev/zero"
    paths["long"] = "x" * 300
    paths["missing"] = str(root / "missing.json")
    return paths


def file_values(files: dict[str, str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(sorted(files.values())), values())


# --------------------------------------------------------------------------- launch
LAUNCH_NUMBERS = ["--ranks", "--steps", "--timeout", "--threads", "--micro-batch", "--lr"]


@FUZZ
@given(data=st.data())
def test_launch_flags(data: st.DataObject, files: dict[str, str], capsys) -> None:
    spec: dict[str, st.SearchStrategy[str]] = {flag: values() for flag in LAUNCH_NUMBERS}
    spec |= {
        "--model": st.sampled_from(MODELS),
        "--model-options": st.sampled_from(OPTIONS),
        "--launcher": st.sampled_from(["torchrun", "deepspeed", "mpirun", ""]),
        "--config": file_values(files),
        "--resume": file_values(files),
        "--checkpoint-dir": st.sampled_from([files["folder"], files["fifo"], "x" * 300]),
        "--zero": values(["3"]),
        "--precision": st.sampled_from(["fp32", "bf16", "amp-fp16", "fp8", ""]),
        "--device": st.sampled_from(["cpu", "auto", "cuda", "tpu"]),
    }
    argv = ["launch", *data.draw(flags(spec)), "--print-command"]
    outcome(argv, capsys)


def test_launch_valid_flags_print_the_command(capsys) -> None:
    argv = ["launch", "--ranks=1", "--model=mlp", "--device=cpu", "--print-command"]
    assert outcome(argv, capsys) == 0


# --------------------------------------------------------------------------- ladder
class _Result:
    """What a ladder run returns, without running it."""

    rungs: tuple[Any, ...] = ()

    def chart_png(self) -> bytes:
        return b"\x89PNG\r\n\x1a\n"

    def to_json(self) -> str:
        return "{}"

    def __str__(self) -> str:
        return "optimization ladder (not run)"


@pytest.fixture
def no_ladder_runs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from workbench.train.ladder import run as ladder_run

    ran: list[Any] = []

    def run_plan(plan: Any, **kwargs: Any) -> _Result:
        ran.append(plan)
        return _Result()

    monkeypatch.setattr(ladder_run, "run_plan", run_plan)
    return ran


@FUZZ
@given(data=st.data())
def test_ladder_flags(data: st.DataObject, files: dict[str, str], no_ladder_runs, capsys) -> None:
    spec: dict[str, st.SearchStrategy[str]] = {
        flag: values()
        for flag in ("--steps", "--repeats", "--target-loss", "--timeout", "--micro-batch")
    }
    spec |= {
        "--ranks": values(),
        "--rungs": file_values(files),
        "--model-options": st.sampled_from(OPTIONS),
        "--lr-scaling": st.sampled_from(["linear", "sqrt", "none", "cubic"]),
        "--launcher": st.sampled_from(["torchrun", "deepspeed", "mpirun"]),
        "--device": st.sampled_from(["cpu", "auto", "cuda", "tpu", ""]),
        "--lr": values(),
        "--seed": values(),
    }
    argv = ["ladder", "--model=mlp", "--device=cpu", *data.draw(flags(spec))]
    outcome(argv, capsys)


def test_ladder_valid_flags_reach_the_run(files: dict[str, str], no_ladder_runs, capsys) -> None:
    argv = ["ladder", "--model=mlp", f"--model-options={json.dumps(MLP)}", "--device=cpu"]
    assert outcome([*argv, f"--rungs={files['rungs.json']}", "--steps=2"], capsys) == 0
    assert len(no_ladder_runs) == 1  # checked, and handed to the (stubbed) run


# --------------------------------------------------------------------------- compress
class _Report:
    """What a compression returns, without compressing anything."""

    models: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        return {}

    def chart_png(self) -> bytes:
        return b"\x89PNG\r\n\x1a\n"

    def __str__(self) -> str:
        return "compression (not run)"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny mlp's checkpoint and weights file."""
    from workbench import Session, TrainConfig

    folder = tmp_path_factory.mktemp("fuzz-ckpt")
    with Session(TrainConfig(micro_batch=8), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=1)
        s.save_weights(folder / "weights.pt")
        path = s.save_checkpoint(folder)
    return {"checkpoint": str(path), "folder": str(folder), "weights": str(folder / "weights.pt")}


@pytest.fixture
def no_compression(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import workbench.compress

    ran: list[Any] = []

    def compress(model: Any, *args: Any, **kwargs: Any) -> _Report:
        ran.append(kwargs)
        return _Report()

    monkeypatch.setattr(workbench.compress, "compress", compress)
    return ran


@FUZZ
@given(data=st.data())
def test_compress_flags(
    data: st.DataObject, files: dict[str, str], checkpoint: dict[str, str], no_compression, capsys
) -> None:
    import torch

    threads = torch.get_num_threads()
    spec: dict[str, st.SearchStrategy[str]] = {
        flag: values()
        for flag in (
            "--sparsity",
            "--held-out",
            "--batch-size",
            "--repeats",
            "--eval-samples",
            "--threads",
            "--max-loss-ratio",
            "--max-accuracy-drop",
        )
    }
    spec |= {
        "--methods": st.sampled_from(["int8", "prune", "channels+int8", "int9", ",", "heads"]),
        "--engine": st.sampled_from(["torchao", "torch.ao", "onnx"]),
        "--model": st.sampled_from(MODELS),
        "--model-options": st.sampled_from(OPTIONS),
    }
    target = data.draw(st.sampled_from(sorted({**files, **checkpoint}.values())), label="path")
    try:
        outcome(["compress", target, *data.draw(flags(spec))], capsys)
    finally:
        torch.set_num_threads(threads)


def test_compress_valid_flags_reach_the_compression(checkpoint, no_compression, capsys) -> None:
    assert outcome(["compress", checkpoint["folder"], "--repeats=3"], capsys) == 0
    assert len(no_compression) == 1


def test_compress_writes_what_it_reports(checkpoint, no_compression, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert outcome(["compress", checkpoint["checkpoint"], f"--out={out}"], capsys) == 0
    assert sorted(p.name for p in Path(out).iterdir()) == ["report.json", "report.png"]
