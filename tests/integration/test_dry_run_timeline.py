"""`workbench estimate --simulate --timeline FILE --snapshot FILE`: the picture of the dry
run's step, and its snapshot for torch's memory viewer."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from torch.cuda import _memory_viz

from workbench.cli import main

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_simulate_writes_the_picture_and_the_viewers_snapshot(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    page, snap = tmp_path / "step.html", tmp_path / "step.pickle"
    args = ["estimate", "--hf-config", str(config), "--seq-len", "64", "--micro-batch", "2"]
    code, out, err = _run(
        [*args, "--simulate", "--json", "--timeline", str(page), "--snapshot", str(snap)], capsys
    )
    assert code == 0, err
    data = json.loads(out)  # stdout stays one JSON object; the files are named on stderr
    assert f"timeline: {page}" in err
    html = page.read_text()
    assert "data:image/png;base64," in html and "largest tensors alive at the peak" in html
    assert html.count("<tr>") == 11  # the header and the ten largest tensors
    snapshot = pickle.loads(snap.read_bytes())
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    # every allocation and free of the dry run's trace, once
    assert (
        actions.count("alloc") + actions.count("free_completed")
        == (data["dry_run"]["trace_events"])
    )
    assert "Active Memory Timeline" in _memory_viz.trace_plot(snapshot)
    png = tmp_path / "step.png"
    code, out, _ = _run([*args, "--simulate", "--timeline", str(png)], capsys)
    assert code == 0 and png.read_bytes().startswith(b"\x89PNG") and f"timeline: {png}" in out


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--simulate", "--timeline", "t.svg"], "--timeline t.svg: the suffix '.svg' is not"),
        (["--timeline", "t.png"], "--timeline t.png: needs --simulate"),
        (["--snapshot", "s.pickle"], "--snapshot s.pickle: needs --simulate"),
    ],
)
def test_a_picture_flag_is_refused_before_the_dry_run(tmp_path, capsys, extra, expected) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    code, _, err = _run(["estimate", "--hf-config", str(config), *extra], capsys)
    assert code == 2 and expected in err
    assert ".svg" not in expected or "allowed: .png, .html" in err
