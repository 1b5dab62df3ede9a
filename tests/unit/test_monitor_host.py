"""Host fallback (psutil), run for real on this machine, plus permission failures."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from workbench.monitor import HostReader, Sample


def _burn(cpu_seconds: float) -> None:
    end = time.thread_time() + cpu_seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def test_reads_real_numbers_on_this_machine() -> None:
    reader = HostReader()
    time.sleep(0.05)
    r = reader.read()
    assert r.process_rss_bytes is not None
    assert r.process_rss_bytes == pytest.approx(psutil.Process().memory_info().rss, rel=0.5)
    assert r.system_memory_total_bytes == psutil.virtual_memory().total
    assert r.system_memory_used_bytes is not None
    assert 0 < r.system_memory_used_bytes <= r.system_memory_total_bytes
    assert r.cpu_util_percent is None or 0.0 <= r.cpu_util_percent <= 100.0
    assert r.process_cpu_percent is not None and r.process_cpu_percent >= 0.0


def test_process_cpu_follows_this_process_load() -> None:
    reader = HostReader()
    time.sleep(0.1)
    idle = reader.read().process_cpu_percent
    _burn(0.15)
    busy = reader.read().process_cpu_percent
    assert idle is not None and busy is not None
    assert busy > idle
    assert busy > 1.0  # 0.15 s of CPU inside the window (under 15 s even on a busy host)


def test_rss_grows_when_this_process_allocates() -> None:
    reader = HostReader()
    before = reader.read().process_rss_bytes
    block = bytearray(64 * 1024 * 1024)  # touched pages count towards RSS
    for i in range(0, len(block), 4096):
        block[i] = 1
    after = reader.read().process_rss_bytes
    assert before is not None and after is not None
    assert after - before > 32 * 1024 * 1024
    del block


def test_permission_errors_give_none_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = HostReader()

    def denied(*args: object, **kwargs: object) -> None:
        raise psutil.AccessDenied(pid=os.getpid())

    monkeypatch.setattr(psutil.Process, "memory_info", denied)
    monkeypatch.setattr(psutil.Process, "cpu_times", denied)
    monkeypatch.setattr(psutil, "virtual_memory", denied)
    monkeypatch.setattr(psutil, "cpu_times", denied)
    r = reader.read()
    assert r.process_rss_bytes is None
    assert r.process_cpu_percent is None
    assert r.cpu_util_percent is None
    assert r.system_memory_used_bytes is None and r.system_memory_total_bytes is None


def test_vanished_process_gives_none_process_fields() -> None:
    gone = psutil.Popen(["true"])
    gone.wait()
    reader = HostReader(pid=gone.pid)
    r = reader.read()
    assert r.process_rss_bytes is None and r.process_cpu_percent is None
    assert r.system_memory_total_bytes is not None  # system fields still read


def test_sample_first_gpu_properties_without_gpus() -> None:
    s = Sample(time.time(), "host", (), 12.0, 3.0, 1, 2, 3, reason="no NVIDIA driver found")
    assert s.gpu_util_percent is None and s.gpu_memory_used_bytes is None
