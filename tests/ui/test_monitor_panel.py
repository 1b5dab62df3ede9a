"""MonitorPanel over replayed samples (NVML and host fallback) and over a real Sampler."""

from __future__ import annotations

import time

import pytest
from ui_fakes import FakeSampler, gpu_sample, host_sample

from workbench.ui import MonitorPanel


def test_nvml_gauges_and_history() -> None:
    t = time.time()
    samples = [gpu_sample(t - 3, util=20.0), gpu_sample(t - 2, util=40.0), gpu_sample(t - 1)]
    p = MonitorPanel(FakeSampler(samples, "nvml"), autostart=False)
    try:
        assert "NVML: GPU 0: Fake H100" in p.header.value
        assert set(p.gauges) == {"gpu0.util", "gpu0.memory", "gpu0.power", "gpu0.temperature"}
        assert p.gauges["gpu0.util"].bar.value == pytest.approx(50.0)
        assert p.gauges["gpu0.memory"].bar.value == pytest.approx(12.5)  # 10 of 80 GiB
        assert "10.00 GiB / 80.00 GiB" in p.gauges["gpu0.memory"].text.value
        assert p.gauges["gpu0.power"].bar.value == pytest.approx(300 / 700 * 100)
        assert "55" in p.gauges["gpu0.temperature"].text.value
        xs, util, mem = p.history_series()
        assert util == [20.0, 40.0, 50.0] and mem == pytest.approx([12.5] * 3)
        assert [round(x) for x in xs] == [-3, -2, -1]
        assert list(p._line_util.get_ydata()) == [20.0, 40.0, 50.0]
        assert p._repr_mimebundle_()["image/png"]
    finally:
        p.close()


def test_host_fallback_is_labelled_plainly() -> None:
    t = time.time()
    sampler = FakeSampler(
        [host_sample(t - 1), host_sample(t, cpu=75.0)], "host", reason="no NVIDIA driver found"
    )
    p = MonitorPanel(sampler, autostart=False)
    try:
        assert "No NVIDIA GPU: showing host CPU and memory (no NVIDIA driver found)" in (
            p.header.value
        )
        assert set(p.gauges) == {"cpu", "rss", "memory"}
        assert p.gauges["cpu"].bar.value == pytest.approx(75.0)
        assert p.gauges["memory"].bar.value == pytest.approx(50.0)  # 8 of 16 GiB
        assert p.history_series()[1] == [25.0, 75.0]
        sampler.samples.append(host_sample(time.time(), cpu=10.0))
        renders = p.chart.renders
        p.refresh()
        assert p.gauges["cpu"].bar.value == pytest.approx(10.0)
        assert p.chart.renders == renders + 1
        p.refresh()  # no new sample: no redraw
        assert p.chart.renders == renders + 1
    finally:
        p.close()
    assert not sampler.closed  # a sampler passed in belongs to the caller


def test_waiting_for_first_sample_and_none_fields() -> None:
    sampler = FakeSampler([], "host", reason="x")
    p = MonitorPanel(sampler, autostart=False)
    try:
        assert "waiting for the first sample" in p.header.value
        s = host_sample(time.time())
        sampler.samples.append(s.__class__(**{**s.__dict__, "cpu_util_percent": None}))
        p.refresh()
        assert p.gauges["cpu"].text.value == "n/a" and p.gauges["cpu"].bar.value == 0
    finally:
        p.close()


def test_own_sampler_runs_and_close_stops_everything(no_leaked_threads) -> None:
    p = MonitorPanel(refresh_s=0.25)
    try:
        deadline = time.monotonic() + 15
        while p.sampler.latest() is None or p.timer.ticks < 2:
            assert time.monotonic() < deadline, "no sample or refresh within 15 s"
            time.sleep(0.05)
        assert p.gauges  # drawn from a real sample
        assert p.timer.last_error is None
    finally:
        p.close()
    assert p.sampler.closed and not p.timer.running


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="must be a workbench.monitor.Sampler"):
        MonitorPanel(object())
    with pytest.raises(ValueError, match="interval_s=0.05"):
        MonitorPanel(FakeSampler([], "host"), refresh_s=0.05)
