"""The before/after report's verdicts, table and chart from given figures: a method that
is neither smaller nor faster beyond the noise is said not to pay, with the reason; one
that is, but loses held-out quality beyond the tolerance, does not pay either, and says
what it lost and that retraining recovers it."""

from __future__ import annotations

import json
import re

import pytest

from workbench.compress.report import (
    MAX_ACCURACY_DROP,
    MAX_LOSS_RATIO,
    NOISE,
    RETRAIN,
    CompressionReport,
    Figures,
    QualityTolerance,
    Row,
    verdict_of,
)


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


def test_smaller_and_faster_within_the_quality_tolerance_pays() -> None:
    v = verdict_of(BEFORE, Row("channels", figures(1000, 5.0, loss=1.04, accuracy=0.495)))
    assert (v.size, v.latency, v.quality, v.pays) == ("smaller", "faster", "kept", True)
    assert v.size_ratio == 0.25 and v.latency_ratio == 0.5 and v.outcome == "pays"
    assert v.loss_change == pytest.approx(0.04) and v.accuracy_change == pytest.approx(-0.005)
    assert v.loss_ratio == pytest.approx(1.04) and v.lost == ""
    assert v.summary == ("4x smaller; 2x faster; held-out loss 1 -> 1.04, accuracy -0.5 points")


def test_smaller_and_faster_but_a_much_worse_loss_does_not_pay_and_says_what_recovers_it() -> None:
    """The notebook's mlp: channels pruning 3.5x smaller, 1.8x faster, held-out loss 5.8x."""
    before = Row("before", figures(4000, 10.0, loss=0.04839, accuracy=None))
    v = verdict_of(before, Row("channels", figures(1000, 5.0, loss=0.282, accuracy=None)))
    assert (v.size, v.latency, v.quality, v.pays) == ("smaller", "faster", "lost", False)
    assert v.outcome == "smaller and faster, but loses quality"
    assert v.loss_ratio == pytest.approx(5.828, abs=1e-3)
    assert v.lost == "held-out loss 5.83x the model before's (allowed: 1.05x)"
    assert v.summary.startswith("does not pay as it is (it loses quality): 4x smaller; 2x faster")
    assert v.summary.endswith(RETRAIN) and "training the smaller model further" in v.summary


def test_an_accuracy_drop_beyond_the_tolerance_is_a_quality_loss() -> None:
    """The notebook's cnn: channels+int8 5.2x smaller, 1.471 -> 1.655, -5.1 points."""
    before = Row("before", figures(4000, 10.0, loss=1.471, accuracy=0.467))
    after = Row("channels+int8", figures(770, 10.5, loss=1.655, accuracy=0.416))
    v = verdict_of(before, after)
    assert (v.size, v.latency, v.pays) == ("smaller", "same", False)
    assert v.outcome == "smaller, but loses quality"
    assert v.lost == (
        "held-out loss 1.13x the model before's (allowed: 1.05x), "
        "accuracy 5.1 points lower (allowed: 1)"
    )
    # a loss just above the tolerance shows the digits that put it above
    v = verdict_of(before, Row("heads", figures(3000, 9.0, loss=1.471 * 1.053, accuracy=0.467)))
    assert v.lost == "held-out loss 1.053x the model before's (allowed: 1.05x)"
    # the accuracy alone: a loss within the tolerance, 1.5 points lower
    v = verdict_of(before, Row("int8", figures(1000, 10.0, loss=1.48, accuracy=0.452)))
    assert v.quality == "lost" and v.lost == "accuracy 1.5 points lower (allowed: 1)"


def test_the_tolerance_is_a_parameter_and_the_report_carries_it() -> None:
    after = Row("channels", figures(1000, 5.0, loss=1.5, accuracy=0.47))
    assert not verdict_of(BEFORE, after).pays  # 1.5x the loss, 3 points: beyond the default
    loose = QualityTolerance(max_loss_ratio=2.0, max_accuracy_drop=5)
    v = verdict_of(BEFORE, after, loose)
    assert v.pays and v.quality == "kept" and v.outcome == "pays"
    r = CompressionReport("m", (BEFORE, after), {}, tolerance=loose)
    assert r.verdict("channels").pays
    assert r.to_dict()["tolerance"] == {"max_loss_ratio": 2.0, "max_accuracy_drop": 5}
    assert (
        "keeps its held-out quality: loss at most 2x the model before's, accuracy at most "
        "5 points lower" in " ".join(str(r).split())
    )
    strict = CompressionReport("m", (BEFORE, after), {})
    assert strict.tolerance == QualityTolerance(MAX_LOSS_RATIO, MAX_ACCURACY_DROP)
    assert str(strict.tolerance).endswith("accuracy at most 1 point lower")
    labels = [t.get_text() for t in strict.chart().axes[0].get_yticklabels()]
    assert labels[1] == "channels\n(loses quality)"


def test_quality_on_data_the_model_may_have_seen_is_called_eval_not_held_out() -> None:
    after = Row("channels", figures(1000, 5.0, loss=3.0))
    r = CompressionReport("m", (BEFORE, after), {}, quality_data="eval")
    text = " ".join(str(r).split())
    assert "eval loss" in text and "held-out" not in text
    assert r.verdict("channels").lost == "eval loss 3x the model before's (allowed: 1.05x)"
    assert r.to_dict()["quality_data"] == "eval"
    assert [ax.get_title() for ax in r.chart().axes][2:] == ["eval loss", "eval accuracy (%)"]
    held = CompressionReport("m", (BEFORE, after), {})
    assert "held-out loss" in str(held) and held.quality_data == "held-out"
    with pytest.raises(ValueError, match="quality_data='test': must be one of 'held-out', 'eval'"):
        CompressionReport("m", (BEFORE,), {}, quality_data="test")


def test_a_loss_that_is_not_a_number_is_lost_and_one_before_is_not_judged() -> None:
    v = verdict_of(BEFORE, Row("channels", figures(1000, 5.0, loss=float("nan"))))
    assert v.quality == "lost" and not v.pays and v.lost.startswith("held-out loss nan")
    nan_before = Row("before", figures(4000, 10.0, loss=float("nan")))
    v = verdict_of(nan_before, Row("channels", figures(1000, 5.0)))
    assert v.quality == "not judged" and v.pays and "quality not judged" in v.summary


def test_a_loss_at_or_below_zero_may_rise_by_the_same_share_of_its_size() -> None:
    before = Row("before", figures(4000, 10.0, loss=-2.0, accuracy=None))
    assert verdict_of(before, Row("a", figures(1000, 5.0, loss=-1.95, accuracy=None))).pays
    v = verdict_of(before, Row("b", figures(1000, 5.0, loss=-1.8, accuracy=None)))
    assert v.quality == "lost" and v.loss_ratio is None and "up from -2" in v.lost
    zero = Row("before", figures(4000, 10.0, loss=0.0, accuracy=None))
    assert verdict_of(zero, Row("c", figures(1000, 5.0, loss=0.0, accuracy=None))).pays
    assert not verdict_of(zero, Row("d", figures(1000, 5.0, loss=1e-3, accuracy=None))).pays


@pytest.mark.parametrize(
    ("ratio", "drop", "message"),
    [
        (0.9, 1.0, "max_loss_ratio=0.9: must be a finite number >= 1"),
        (float("inf"), 1.0, "max_loss_ratio=inf: must be a finite number >= 1"),
        ("1.1", 1.0, "max_loss_ratio='1.1': must be a finite number >= 1"),
        (True, 1.0, "max_loss_ratio=True: must be a finite number >= 1"),
        (1.05, -1, "max_accuracy_drop=-1: must be a number of accuracy points in [0, 100]"),
        (1.05, 101, "max_accuracy_drop=101: must be a number of accuracy points in [0, 100]"),
        (1.05, float("nan"), "max_accuracy_drop=nan: must be a number of accuracy points"),
    ],
)
def test_a_bad_tolerance_is_refused_naming_the_field_and_what_is_allowed(
    ratio, drop, message
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        QualityTolerance(ratio, drop)


def test_compare_and_compress_refuse_a_bad_tolerance_before_any_work() -> None:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from workbench.compress.compare import compare, compress

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    loss = nn.functional.mse_loss
    with pytest.raises(ValueError) as caught:
        compare(model, {"same": model}, data, loss, max_loss_ratio=0.5, max_accuracy_drop=-2)
    text = str(caught.value)
    assert "max_loss_ratio=0.5: must be a finite number >= 1" in text
    assert "max_accuracy_drop=-2: must be a number of accuracy points in [0, 100]" in text
    with pytest.raises(ValueError, match="held_out_unseen='no': must be True or False"):
        compare(model, {"same": model}, data, loss, held_out_unseen="no")
    with pytest.raises(ValueError, match="max_loss_ratio=0: must be a finite number >= 1"):
        compress(model, data, loss, methods=["prune"], max_loss_ratio=0)


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
