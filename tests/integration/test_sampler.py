"""Sampler with its real thread on this machine (host fallback, no NVIDIA driver)."""

from __future__ import annotations

import gc
import math
import threading
import time
import weakref

import pytest

import workbench
from workbench.monitor import HostReader, Sample, Sampler


def _wait_for(sampler: Sampler, n: int, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while sampler.samples_taken < n:
        assert time.time() < deadline, f"only {sampler.samples_taken} samples after {timeout} s"
        time.sleep(0.01)


@pytest.mark.parametrize("interval", [0, -0.5, 0.001, math.nan, math.inf, "0.5", None, True, [0.5]])
def test_bad_interval_names_field_value_and_allowed(interval: object) -> None:
    with pytest.raises(ValueError, match=r"interval=.*must be a finite number of seconds > 0"):
        Sampler(interval=interval)  # type: ignore[arg-type]


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, "10"])
def test_bad_capacity_names_field_value_and_allowed(capacity: object) -> None:
    with pytest.raises(ValueError, match=r"capacity=.*must be an integer >= 1"):
        Sampler(interval=0.5, capacity=capacity)  # type: ignore[arg-type]


def test_bad_input_starts_no_thread(no_leaked_threads: None) -> None:
    with pytest.raises(ValueError):
        Sampler(interval=-1)


def test_default_capacity_is_about_ten_minutes(no_leaked_threads: None) -> None:
    with Sampler(interval=0.5) as a, Sampler(interval=2) as b:
        assert a.capacity == 1200
        assert b.capacity == 300


def test_exported_from_package() -> None:
    assert workbench.Sampler is Sampler


@pytest.mark.cpu_only
def test_host_source_says_why_on_this_machine(no_leaked_threads: None) -> None:
    with Sampler(interval=0.05) as s:
        _wait_for(s, 2)
        latest = s.latest()
    assert s.source == "host"
    assert s.reason is not None and "NVIDIA" in s.reason
    assert isinstance(latest, Sample)
    assert latest.source == "host" and latest.gpus == ()
    assert latest.process_rss_bytes is not None and latest.process_rss_bytes > 0
    assert latest.system_memory_total_bytes is not None


def test_ring_buffer_keeps_only_the_newest(no_leaked_threads: None) -> None:
    with Sampler(interval=0.01, capacity=3) as s:
        _wait_for(s, 10)
        history = s.history()
        latest = s.latest()
        taken = s.samples_taken
    assert taken >= 10
    assert len(history) == 3
    times = [x.time for x in history]
    assert times == sorted(times) and len(set(times)) == 3
    assert latest is not None and latest.time >= history[-1].time


def test_history_since_returns_only_newer(no_leaked_threads: None) -> None:
    with Sampler(interval=0.01, capacity=100) as s:
        _wait_for(s, 5)
        s.close()  # freeze the buffer
        history = s.history()
        cut = history[1].time
        newer = s.history(since=cut)
    assert newer == history[2:]
    assert s.history(since=history[-1].time) == []
    assert s.history(since=None) == history
    with pytest.raises(ValueError, match=r"since='yesterday'"):
        s.history(since="yesterday")  # type: ignore[arg-type]


def test_close_joins_and_stops_sampling(no_leaked_threads: None) -> None:
    s = Sampler(interval=0.01)
    _wait_for(s, 2)
    names = {t.name for t in threading.enumerate()}
    sampler_threads = [n for n in names if n.startswith("workbench-sampler-")]
    assert sampler_threads
    s.close()
    assert s.closed
    alive = {t.name for t in threading.enumerate()}
    assert not set(sampler_threads) & alive
    taken = s.samples_taken
    time.sleep(0.05)
    assert s.samples_taken == taken
    s.close()  # idempotent


def test_twenty_create_close_cycles_leak_no_thread(no_leaked_threads: None) -> None:
    before = threading.active_count()
    for _ in range(20):
        with Sampler(interval=0.01) as s:
            s.latest()
    assert threading.active_count() == before


def test_several_samplers_run_independently(no_leaked_threads: None) -> None:
    a = Sampler(interval=0.01, capacity=50)
    b = Sampler(interval=0.02, capacity=50)
    try:
        _wait_for(a, 3)
        _wait_for(b, 3)
        a.close()
        taken = b.samples_taken
        _wait_for(b, taken + 2)  # b keeps going after a closed
        assert b.latest() is not None and not b.closed
    finally:
        a.close()
        b.close()


def test_thread_survives_a_failing_read(
    monkeypatch: pytest.MonkeyPatch, no_leaked_threads: None
) -> None:
    calls = {"n": 0}
    real_read = HostReader.read

    def flaky(self: HostReader):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("psutil broke")
        return real_read(self)

    monkeypatch.setattr(HostReader, "read", flaky)
    with Sampler(interval=0.01) as s:
        _wait_for(s, 4)
        assert s.last_error == "RuntimeError: psutil broke"


def test_dropped_sampler_is_collected_and_its_thread_ends(no_leaked_threads: None) -> None:
    # a notebook cell re-run rebinds the name without close(): nothing may keep running
    s = Sampler(interval=0.01)
    _wait_for(s, 2)
    thread = s._thread
    ref = weakref.ref(s)
    del s
    # the thread holds the sampler only while it takes a sample, then lets go
    deadline = time.time() + 10
    while ref() is not None:
        assert time.time() < deadline, "the dropped sampler is still referenced"
        gc.collect()
        time.sleep(0.01)
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_sampler_thread_is_daemon(no_leaked_threads: None) -> None:
    with Sampler(interval=0.05):
        threads = [t for t in threading.enumerate() if t.name.startswith("workbench-sampler-")]
        assert threads and all(t.daemon for t in threads)
