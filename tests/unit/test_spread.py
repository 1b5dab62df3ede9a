"""workbench.spread: one quartile method for every report (the spread of the ladder's
window rates, the compression report's latency), and the bars that draw a spread."""

from __future__ import annotations

import math

from workbench.spread import Spread, figure_png, spread, spread_bars


def test_quartiles_are_the_inclusive_method() -> None:
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == Spread(3.0, 2.0, 4.0)
    # inclusive: the 25th percentile of 1..4 is 1.75 (the exclusive method says 1.25)
    assert spread([4.0, 1.0, 3.0, 2.0]) == Spread(2.5, 1.75, 3.25)
    assert spread([7.0]) == Spread(7.0, 7.0, 7.0)
    assert spread([math.nan, 2.0, math.inf, 4.0]) == Spread(3.0, 2.5, 3.5)  # finite values only
    assert spread([]) is None and spread([math.nan]) is None


def test_the_ladder_and_the_compression_report_use_the_same_spread(monkeypatch) -> None:
    import importlib

    import torch

    from workbench.compress import compare
    from workbench.train.ladder import report

    assert report.spread is spread
    times = [0.004, 0.001, 0.003, 0.002]
    measured = importlib.import_module("workbench.compress.compare")
    monkeypatch.setattr(
        measured,
        "latencies",
        lambda models, batch, repeats, cancel=None: {n: times for n in models},
    )
    model = torch.nn.Linear(2, 2)
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 2))
    rows = compare(model, {"same": model}, data, torch.nn.functional.mse_loss, batch_size=4).rows
    for row in rows:
        f = row.figures
        assert (f.latency_seconds, f.latency_p25_seconds, f.latency_p75_seconds) == spread(times)


def test_bars_with_whiskers_are_labelled_past_the_whisker() -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    bars = spread_bars(
        ax, [1.0, 2.0], colours=["red", "blue"], texts=["1x", "2x"], ranges=[(0.5, 1.5), (2, 3)]
    )
    assert len(bars) == 2
    ends = sorted(t.xy[0] for t in ax.texts)
    assert ends == [1.5, 3.0] and sorted(t.get_text() for t in ax.texts) == ["1x", "2x"]
    assert figure_png(fig).startswith(b"\x89PNG")
