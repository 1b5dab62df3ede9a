"""`workbench ladder --memory` / `ladder(kind="memory")`: the memory techniques climbed
cumulatively on the same samples, each rung's measured memory next to the prediction,
with what it frees and what it costs in step time."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.train.ladder import LadderError, ladder

#: no dropout: PyTorch's CPU sdpa with dropout keeps its attention weights (the GPU's
#: fused kernels keep a seed), so without it the CPU shows the saving a GPU does
TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "dropout": 0.0}


def test_every_technique_frees_memory_and_the_notes_say_what_it_costs() -> None:
    result = ladder(kind="memory", steps=4, repeats=1, model_options=TINY, progress=False)
    names = [r.name for r in result.rungs]
    assert names == [
        "baseline: fp32, AdamW, eager attention",
        "+ sdpa attention",
        "+ activation checkpointing",
        "+ activation offload",
        "+ 8-bit AdamW",
        "+ optimizer step in backward",
    ]
    assert all(r.error is None for r in result.rungs)
    measured = [r.memory_measured_bytes for r in result.rungs]
    assert all(b < a for a, b in zip(measured, measured[1:], strict=False)), measured
    # every rung trained the same samples to the same losses (the techniques change memory
    # and time, not the arithmetic: 8-bit AdamW within its rounding)
    losses = [r.final_loss for r in result.rungs]
    assert max(losses) - min(losses) < 1e-2, losses
    text = str(result)
    assert text.startswith("memory ladder")
    for name in names[1:]:
        assert f"{name}: memory frees" in text and "step time x" in text
    assert "no data-parallel rung" not in text


def test_the_memory_ladder_refuses_the_speed_ladder_s_options() -> None:
    with pytest.raises(LadderError) as info:
        ladder(kind="memory", compile=True, steps=2, repeats=1)
    assert [p.field for p in info.value.problems] == ["compile"]
    with pytest.raises(LadderError, match="kind='size'"):
        ladder(kind="size", steps=2, repeats=1)


def test_the_command_climbs_it(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["ladder", "--memory", "--steps", "2", "--repeats", "1", "--json",
         "--model-options", json.dumps(TINY)]
    )  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["setup"]["kind"] == "memory" and len(out["rungs"]) == 6
