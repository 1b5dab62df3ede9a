"""Hostile input to the estimator, `--simulate`, the planner and their flags: each ends in
one clear error (a ValueError naming the argument in the API; exit status 2 and one line
in the CLI), never a traceback, a hang or output that is not what it claims to be."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main

#: A small llama config.json the plain estimate reads without transformers.
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors and --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error(argv: list[str], capsys) -> str:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


# ------------------------------------------------ 1. --simulate builds inside the guard
REFUSED_BY_TRANSFORMERS = [
    ("rope_scaling", {"rope_scaling": {"type": "bogus", "factor": "x"}}),
    ("rms_norm_eps", {"rms_norm_eps": "abc"}),
    ("head_dim", {"head_dim": 7}),
]


@pytest.mark.parametrize(("key", "extra"), REFUSED_BY_TRANSFORMERS)
def test_simulate_of_a_config_transformers_refuses_exits_2(key, extra, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **extra}))
    code, _, _ = run(["estimate", "--hf-config", str(path)], capsys)
    assert code == 0  # the plain estimate reads the family without transformers
    line = one_error(["estimate", "--hf-config", str(path), "--simulate"], capsys)
    assert "--hf-config" in line and (key in line or "bogus" in line), line


@pytest.mark.parametrize(("key", "extra"), REFUSED_BY_TRANSFORMERS)
def test_the_dry_runs_model_of_a_refused_config_is_a_problem(key, extra):
    from workbench.estimate.hf_build import meta_module

    module, problems = meta_module({**LLAMA, **extra})
    assert module is None and len(problems) == 1
    assert problems[0].field == "hf_config"
    assert key in problems[0].message or "bogus" in problems[0].message
