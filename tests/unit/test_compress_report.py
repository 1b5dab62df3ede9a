"""The before/after report's verdicts, table and chart from given figures: a method that
is neither smaller nor faster beyond the noise is said not to pay, with the reason."""

from __future__ import annotations

import json

import pytest

from workbench.compress.report import NOISE, CompressionReport, Figures, Row, verdict_of


def figures(
    params: int,
    latency_ms: float,
    loss: float = 1.0,
    accuracy: float | None = 0.5,
    fastest_ms: float | None = None,
):
    s = latency_ms / 1e3
    return Figures(
        params_bytes=params,
        disk_bytes=params + 900,
        latency_seconds=s,
        latency_p25_seconds=s * 0.95,
        latency_p75_seconds=s * 1.05,
        latency_min_seconds=(latency_ms * 0.9 if fastest_ms is None else fastest_ms) / 1e3,
        latency_samples=30,
        loss=loss,
        accuracy=accuracy,
        zero_fraction=0.0,
        held_out_samples=400,
    )


BEFORE = Row("before", figures(4000, 10.0))


def report(*rows: Row) -> CompressionReport:
    setup = {
        "batch_size": 64,
        "repeats": 30,
        "device": "cpu",
        "threads": 2,
        "held_out_samples": 400,
    }
    return CompressionReport("compression of m", (BEFORE, *rows), setup)


def test_smaller_and_faster_pays() -> None:
    v = verdict_of(BEFORE, Row("channels", figures(1000, 5.0, loss=1.2, accuracy=0.45)))
    assert (v.size, v.latency, v.pays) == ("smaller", "faster", True)
    assert v.size_ratio == 0.25 and v.latency_ratio == 0.5
    assert v.loss_change == pytest.approx(0.2) and v.accuracy_change == pytest.approx(-0.05)
    assert v.summary == ("4x smaller; 2x faster; held-out loss 1 -> 1.2, accuracy -5.0 points")


def test_the_same_size_and_speed_within_the_noise_does_not_pay_and_says_why() -> None:
    why = "zeros stay in dense tensors"
    just_inside = 10.0 * (1 + NOISE) * 0.999
    v = verdict_of(BEFORE, Row("prune", figures(4000, just_inside), why_no_gain=why))
    assert (v.size, v.latency, v.pays) == ("same", "same", False)
    assert v.summary.startswith("does not pay on this hardware: no size change (within 10%)")
    assert v.summary.endswith(f"({why})")


def test_smaller_but_slower_pays_in_size_and_says_it_is_slower() -> None:
    v = verdict_of(BEFORE, Row("int8", figures(1000, 30.0), why_no_gain="not fused"))
    assert (v.size, v.latency, v.pays) == ("smaller", "slower", True)
    assert "3x slower" in v.summary and "slower on this hardware (not fused)" in v.summary


def test_a_median_the_fastest_repeat_contradicts_is_no_clear_change() -> None:
    # a busy moment slowed most calls of the model before, not its fastest one
    v = verdict_of(BEFORE, Row("prune", figures(4000, 5.0, fastest_ms=9.0)))
    assert v.latency == "unclear" and not v.pays
    assert v.latency_ratio == 0.5 and v.fastest_ratio == 1.0
    assert "no clear speed change (median 0.50x, fastest repeat 1.00x" in v.summary


def test_the_reason_is_left_out_when_the_method_pays() -> None:
    v = verdict_of(BEFORE, Row("channels", figures(1000, 5.0), why_no_gain="too small a share"))
    assert "too small a share" not in v.summary


def test_table_json_and_chart() -> None:
    r = report(
        Row("int8", figures(1000, 30.0)),
        Row("prune", figures(4000, 10.0)),
        Row("regression", figures(4000, 10.0, accuracy=None)),
    )
    text = str(r)
    lines = text.splitlines()
    assert lines[0] == "compression of m"
    assert lines[1].split() == [
        "method",
        "weights",
        "on",
        "disk",
        "latency/batch",
        "fastest",
        "vs",
        "before",
        "held-out",
        "loss",
        "accuracy",
        "zeros",
    ]
    assert "3.00x" in text and "n/a" in text
    assert "note: prune: does not pay on this hardware" in text
    assert "<table" in r._repr_html_()
    data = json.loads(json.dumps(r.to_dict()))
    assert [v["method"] for v in data["verdicts"]] == ["int8", "prune", "regression"]
    assert data["verdicts"][1]["pays"] is False and data["noise"] == NOISE
    fig = r.chart()
    latency_axis = fig.axes[1]
    colours = [tuple(round(c, 3) for c in bar.get_facecolor()[:3]) for bar in latency_axis.patches]
    red, grey = (0.776, 0.157, 0.157), (0.62, 0.62, 0.62)
    assert colours[1] == red and colours[2] == grey  # int8 slower, prune within the noise
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[2] == "prune\n(does not pay here)" and labels[1] == "int8"
    assert r.chart_png().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="method='heads': not in this report"):
        r.verdict("heads")


def test_a_combination_leaves_out_the_reason_of_a_step_that_paid_alone() -> None:
    """channels alone 2x faster, channels+int8 slower: the slowdown is int8's, so the
    combination's row keeps int8's reason and drops the pruning's."""
    from torch import nn

    from workbench.compress.compare import _reasons_left
    from workbench.compress.layers import Compressed

    why = (("channels", "the layers it narrows are too small a share"), ("int8", "not fused"))
    combo = Compressed(nn.Linear(1, 1), "channels+int8", (), why_no_gain="x", why_by_step=why)
    channels = Row("channels", figures(2000, 5.0))
    slow_channels = Row("channels", figures(2000, 12.0))
    assert _reasons_left(combo, BEFORE, [BEFORE, channels]) == "not fused"
    both = "the layers it narrows are too small a share; not fused"
    assert _reasons_left(combo, BEFORE, [BEFORE, slow_channels]) == both
    assert _reasons_left(combo, BEFORE, [BEFORE]) == both  # no row of its own: kept
    plain = Compressed(nn.Linear(1, 1), "int8", (), why_no_gain="not fused")
    assert _reasons_left(plain, BEFORE, [BEFORE, channels]) == "not fused"
