"""The dry run of a multimodal config.json (Gemma 3's: a `text_config` beside a vision
tower's) trains a text-only step of the built model: its activations are the language
model's, as the estimate counts them, and the vision tower's parameters get no gradients
(nor AdamW states), which the count treats as trained (docs/estimator.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from workbench.cli import main

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_estimate_multimodal_config import _gemma3  # noqa: E402


def test_a_multimodal_config_dry_runs_its_language_model(tmp_path, capsys) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_gemma3()))
    args = ["estimate", "--hf-config", str(path), "--seq-len", "64", "--simulate", "--json"]
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    dry, formula = data["dry_run"], data["estimate"]
    measured, counted = dry["points"], formula["peak"]["points"]
    # the formula's forward-end activations (its stored activations, logits and loss) are
    # the dry run's within 2% (what the formula leaves out: the rotary tables, the norms'
    # statistics and fp32 `1 + weight`, at this tiny width 1.4%)
    end = counted["forward end"]
    kept = end["activations"] + end["logits and loss"]
    assert measured["forward end"]["activations"] == pytest.approx(kept, rel=0.02)
    # the vision tower trains nothing in a text-only step: fewer gradients and AdamW states
    # than counted, the same parameters
    step = measured["optimizer step"]
    assert step["parameters"] == counted["optimizer step"]["parameters"]
    assert 0 < step["gradients"] < counted["optimizer step"]["gradients"]
    assert 0 < step["optimizer states"] < counted["optimizer step"]["optimizer states"]
    assert formula["shape_note"].startswith("the activations are gemma3_text's")
