"""Hostile inputs to `workbench launch`, exported jobs and the built-in models' options:
each ends in one clear error before anything starts (no rank, no traceback), and no file
read (a job.json) chooses which other file the workbench reads.

Nothing trains here: a launch that passes its checks would call `subprocess.Popen`, which
these tests replace by a function that fails the test."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from workbench.config import TrainConfig
from workbench.train.launch import launch_ranks

CPU = TrainConfig(device="cpu", micro_batch=2)
TINY = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}


@pytest.fixture
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything starts a process (torchrun, a rank)."""

    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", started)


def _launch_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    from workbench.cli import main

    with pytest.raises(SystemExit) as info:
        main(["launch", "--device", "cpu", "--steps", "1", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("workbench launch: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------- 1. launch checks what a rank checks
@pytest.mark.usefixtures("no_process")
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--model-options", '{"bogus": 1}'], ["--model-options", "bogus", "allowed: layers="]),
        (
            ["--tp", "2", "--model-options", json.dumps({**TINY, "hidden": 6, "heads": 3})],
            ["--tp 2:", "heads=3"],
        ),
        (
            ["--pp", "2", "--grad-accum", "2", "--model-options", json.dumps(TINY)],
            ["--pp 2:", "1 layers"],
        ),
        (
            ["--model", "mlp", "--model-options", '{"hidden": 0}'],
            ["--model-options", "hidden=0", "integer >= 1"],
        ),
    ],
)
def test_launch_checks_the_model_before_torchrun(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = _launch_error(capsys, argv)
    for word in words:
        assert word in line, line


@pytest.mark.usefixtures("no_process")
@pytest.mark.parametrize(
    ("config", "options", "words"),
    [
        (CPU, {"bogus": 1}, ["model_options", "bogus"]),
        (CPU.replace(tp=2), {**TINY, "hidden": 6, "heads": 3}, ["tp=2", "heads=3"]),
        (CPU.replace(pp=2, grad_accum=2), TINY, ["pp=2", "1 layers"]),
    ],
)
def test_launch_ranks_checks_the_model_before_any_process(
    config: TrainConfig, options: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        launch_ranks(config, ranks=2, model="tiny-gpt", steps=1, model_options=options)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_the_cli_says_one_line_when_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C (SIGINT) during a launch: the ranks are ended by `launch_ranks`; the command
    says so in one line, exit status 130, no traceback."""
    import workbench.cli.launch as cli_launch
    from workbench.cli import main

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_launch, "launch_ranks", interrupted)
    code = main(["launch", "--device", "cpu", "--steps", "1", "--model", "mlp", "--ranks", "1"])
    err = capsys.readouterr().err
    assert code == 130
    assert "Traceback" not in err and err.count("\n") == 1
    assert "interrupted" in err


def test_torchrun_keeps_its_logs_in_the_launchs_folder() -> None:
    from workbench.train.launch.commands import launcher_command

    command = launcher_command("torchrun", 2, ["--steps", "1"], log_dir="/run/x/torchelastic")
    assert command[command.index("--log-dir") + 1] == "/run/x/torchelastic"
    assert command.index("--log-dir") < command.index("-m", 3)


# ------------------------------------------------------------ 3. seed or name in the options
def _job(model: str, options: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": "",
        "model": model,
        "model_options": options,
        "seed": 0,
        "steps": 1,
        "num_workers": 0,
        "pin_memory": False,
        "activation_checkpointing": "none",
        "activation_offload": False,
        "exported_world_size": 1,
    }


@pytest.mark.parametrize("key", ["seed", "name"])
def test_a_job_with_seed_or_name_in_its_model_options_is_refused(
    key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.export import job_common

    with pytest.raises(SystemExit) as info:
        job_common.build(_job("mlp", {"hidden": 8, key: 3}))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"model_options key '{key}'" in err


@pytest.mark.parametrize("key", ["seed", "name"])
def test_the_export_refuses_seed_or_name_in_model_options(key: str, tmp_path: Path) -> None:
    from workbench.export import export_job

    with pytest.raises(ValueError, match=f"model_options.*{key}"):
        export_job(TrainConfig(), gpus=1, out_dir=tmp_path, model="mlp", model_options={key: 1})


def test_build_model_takes_name_as_an_unknown_option() -> None:
    from workbench.models import build_model

    with pytest.raises(ValueError, match="unknown option.*name"):
        build_model("mlp", name="cnn")


# ------------------------------------------------- 4. the size guard with the real vocabulary
def test_tiny_gpts_size_guard_counts_the_texts_vocabulary(tmp_path: Path) -> None:
    """200,000 distinct characters at hidden=8192: 0.8B parameters in the blocks, 1.6B in the
    embedding. A 256-character guess saw 0.8B and let it through."""
    chars = [chr(c) for c in range(0x4E00, 0x110000) if not 0xD800 <= c < 0xE000][:200_000]
    text = tmp_path / "many.txt"
    text.write_text("".join(chars), encoding="utf-8")
    from workbench.models import option_problems

    options = {"layers": 1, "hidden": 8192, "heads": 2, "seq_len": 8, "text": str(text)}
    problems = option_problems("tiny-gpt", options)
    assert any("B parameters" in p and "2B" in p for p in problems), problems
    assert any("200,000" in p for p in problems), problems  # the vocabulary it counted
    # the sonnets' own vocabulary at the same size is within the guard
    assert not option_problems("tiny-gpt", {**options, "text": None})


def test_a_text_that_cannot_be_read_is_an_option_problem(tmp_path: Path) -> None:
    from workbench.models import option_problems

    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 " * 10)
    problems = option_problems("tiny-gpt", {**TINY, "text": str(bad)})
    assert len(problems) == 1 and problems[0].option == "text", problems
    assert "UTF-8" in problems[0], problems


# ------------------------------------------------------ 5. a file never chooses the text read
def test_a_job_json_text_is_read_only_when_the_command_line_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.export import job_common

    secret = tmp_path / "secret.txt"
    secret.write_text("not for training " * 10, encoding="utf-8")
    job = _job("tiny-gpt", {**TINY, "text": str(secret)})
    with pytest.raises(SystemExit) as info:
        job_common.approve_model(job, None, False, "job.json")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "job.json: model option text=" in err and "--text" in err
    with pytest.raises(SystemExit):
        job_common.approve_model(job, None, False, "job.json", text=str(tmp_path / "other.txt"))
    assert "--text" in capsys.readouterr().err
    assert job_common.approve_model(job, None, False, "job.json", text=str(secret))
    # a job without a text reads only the built-in sonnets
    assert job_common.approve_model(_job("tiny-gpt", TINY), None, False, "job.json")


def test_an_exported_job_with_a_text_passes_it_on_its_command_line(tmp_path: Path) -> None:
    from workbench.export import export_job

    text = tmp_path / "my text.txt"
    text.write_text("a small text to train on\n" * 20, encoding="utf-8")
    result = export_job(
        TrainConfig(),
        gpus=1,
        out_dir=tmp_path / "job",
        model_options={**TINY, "text": str(text)},
    )
    assert f"--text '{text}'" in result.command
    assert f"--text '{text}'" in Path(result.launch_path).read_text()


def test_options_from_a_file_name_the_text_they_would_read() -> None:
    from workbench.models import options_from_file

    problems = options_from_file("tiny-gpt", {**TINY, "text": "/etc/passwd"}, "ckpt.pt")
    assert len(problems) == 1 and problems[0].option == "text"
    assert "ckpt.pt" in problems[0] and "/etc/passwd" in problems[0]
    assert options_from_file("tiny-gpt", TINY, "ckpt.pt") == []
    assert options_from_file("tiny-gpt", {**TINY, "text": None}, "ckpt.pt") == []
    assert options_from_file("mlp", {"hidden": 8}, "ckpt.pt") == []


# ----------------------------------------------------------- 6. model_options of the wrong type
@pytest.mark.parametrize("options", [[1], "layers=1", 3, {1: 2}])
def test_session_model_options_must_be_a_dict(options: Any) -> None:
    from workbench.train.session import Session

    with pytest.raises(ValueError, match="model_options.*a dict of option names to values"):
        Session(CPU, model="mlp", model_options=options)
