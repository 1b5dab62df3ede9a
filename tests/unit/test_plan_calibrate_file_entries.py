"""`workbench plan --calibrate FILE` / `plan(calibrate=...)`: a step file's entries are read
strictly (no traceback, no silent coercion): one line naming --calibrate, the file, the key,
the value and what is allowed; on the command line the places a measured step comes from are
files, in Python the objects plan() takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.planner import plan
from workbench.planner.efficiency import WHERE, WHERE_CLI, CalibrateError, measured_step

ARGS = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "2048",
        "--global-batch", "16"]  # fmt: skip
GOOD = {"tokens_per_s": 40_000.0, "world_size": 8, "activation_checkpointing": "none",
        "precision": "amp-bf16"}  # fmt: skip


def _cli(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    assert main([*ARGS, "--calibrate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('"world_size": 1e400', "world_size=1e400: must be an integer >= 1"),
        ('"world_size": NaN', "world_size=NaN: must be an integer >= 1"),
        ('"tokens_per_s": Infinity', "tokens_per_s=Infinity: must be a finite number"),
        ('"world_size": [8]', "world_size=[8]: must be an integer >= 1"),
        ('"world_size": {"a": 1}', "world_size={'a': 1}: must be an integer >= 1"),
        ('"world_size": "abc"', "world_size='abc': must be an integer >= 1"),
        ('"world_size": "8"', "world_size='8': must be an integer >= 1"),
        ('"world_size": 8.7', "world_size=8.7: must be an integer >= 1"),
        ('"world_size": true', "world_size=True: must be an integer >= 1"),
        ('"world_size": 0', "world_size=0: must be an integer >= 1"),
        ('"world_size": 1, "world_size": 8', "key 'world_size' appears twice in one object"),
        ('"precision": "fp64"', "precision='fp64': must be one of fp32, amp-fp16, amp-bf16"),
        ('"precision": 5', "precision=5: must be one of fp32"),
        ('"precision": ["bf16"]', "precision=['bf16']: must be one of fp32"),
        ('"activation_checkpointing": {"a": 1}',
         "activation_checkpointing={'a': 1}: must be one of none, selective, selective-op, full"),
        ('"warmup": "false"', "warmup='false': must be true or false"),
        ('"tokens_per_s": "40000"', "tokens_per_s='40000': must be a finite number of tokens a second"),
        ('"step_seconds": "0.5"', "step_seconds='0.5': must be a finite number of seconds >= 0"),
        ('"step_seconds": -1', "step_seconds=-1: must be a finite number of seconds >= 0"),
        ('"step_seconds": Infinity', "step_seconds=Infinity: must be a finite number of seconds"),
    ],
)  # fmt: skip
def test_a_step_files_bad_entry_is_one_line_naming_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    path = tmp_path / "c2.json"
    rate = "" if text.startswith('"tokens_per_s"') else '"tokens_per_s": 40000, '
    path.write_text("{" + rate + text + "}", encoding="utf-8")
    err = _cli(capsys, path)
    assert err.startswith(f"workbench plan: error: --calibrate {path}: {said}")
    assert "recompute=" not in err  # the file's key, not an internal field
    with pytest.raises(CalibrateError, match="calibrate="):  # plan() names it too
        plan(model="llama-3-8b", gpus=8, seq_len=2048, global_batch=16, calibrate=path)


def test_a_log_line_read_strictly_is_named_and_a_cut_line_passed_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    rows = [json.dumps(GOOD)] * 3
    log.write_text("\n".join(rows) + '\n{"tokens_per_s": 4', encoding="utf-8")  # a cut line
    step = measured_step(log)
    assert (step.steps, step.world_size, step.precision) == (3, 8, "amp-bf16")
    diverged = json.dumps({**GOOD, "loss": float("nan"), "grad_norm": float("inf")})
    log.write_text("\n".join([diverged] * 2), encoding="utf-8")  # as a Session writes it
    assert measured_step(log).steps == 2  # a diverged loss is not what calibration reads
    log.write_text(rows[0] + '\n{"world_size": 8, "world_size": 1}\n', encoding="utf-8")
    err = _cli(capsys, log)
    assert f"--calibrate {log}: line 2: key 'world_size' appears twice" in err


def test_the_cli_says_where_a_measured_step_comes_from_as_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _cli(capsys, tmp_path / "nothing.jsonl")
    assert f"--calibrate {tmp_path / 'nothing.jsonl'}: no such file; {WHERE_CLI}" in err
    assert "calibrate=session" not in err and "calibrate=observer" not in err
    assert main([*ARGS, "--calibrate"]) == 2
    err = capsys.readouterr().err
    assert WHERE_CLI in err and "calibrate=session" not in err
    with pytest.raises(ValueError, match="calibrate=session"):  # Python keeps its objects
        plan(model="llama-3-8b", gpus=8, seq_len=2048, global_batch=16, calibrate=[])
    assert "calibrate=session" in WHERE


def test_a_step_carries_only_to_plans_on_the_same_kind_of_peak(tmp_path: Path) -> None:
    """An fp32 step's share of the fp32 peak says nothing of the 16-bit plans' share of the
    bf16 peak (and the other way round): refused, saying which step to measure or what to
    pin; the same step calibrates the plans pinned to its precision."""
    fp32 = {**GOOD, "precision": "fp32", "tokens_per_s": 4_000.0}
    path = tmp_path / "fp32.json"
    path.write_text(json.dumps(fp32))
    kw = dict(model="llama-3-8b", gpus=8, seq_len=2048, global_batch=16)
    with pytest.raises(CalibrateError, match="the step ran fp32 and the plans run 16-bit"):
        plan(**kw, calibrate=str(path))
    pinned = plan(**kw, calibrate=str(path), precision="fp32")
    assert "measured from your step" in pinned.efficiency_source
    bf16 = tmp_path / "bf16.json"
    bf16.write_text(json.dumps(GOOD))
    with pytest.raises(CalibrateError, match=r"the step ran amp-bf16 and the plans run fp32"):
        plan(**kw, calibrate=str(bf16), precision="fp32")
    with pytest.raises(CalibrateError, match="calibrate='': is empty: give a path"):
        plan(**kw, calibrate="")


def test_a_price_needs_the_tokens_and_a_pin_each_key_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    kw = dict(model="llama-3-8b", gpus=8, seq_len=2048, global_batch=16)
    with pytest.raises(ValueError, match=r"price_per_gpu_hour=2.5: .* give tokens= too"):
        plan(**kw, price_per_gpu_hour=2.5)
    assert main([*ARGS, "--price", "2.5"]) == 2
    assert "--price 2.5: the cost is of training the tokens; give --tokens too" in (
        capsys.readouterr().err
    )
    with pytest.raises(ValueError, match=r"tp is pinned twice \(tp=2, tp=4\)"):
        plan(**kw, pin="tp=2,tp=4")
    with pytest.raises(ValueError, match="names nothing to pin"):
        plan(**kw, pin=" , ")
    twice = plan(**kw, engines=("zero3", "zero3"))  # each engine planned once
    assert twice.searched == plan(**kw, engines=("zero3",)).searched
