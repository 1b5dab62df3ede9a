"""Host adapter: CPU and memory through psutil, for every machine (and the only source
of numbers where there is no NVIDIA GPU or driver).

Each `HostReader` keeps its own CPU-time baselines instead of psutil's module-level
`cpu_percent()` state, so several samplers can run at once without resetting each
other's measurement window. Permission errors and vanished processes give `None`
fields; nothing here raises out of `read()`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import psutil  # type: ignore[import-untyped]

# psutil fields already counted in `user` / `nice` on Linux (see psutil._cpu_tot_time)
_GUEST_FIELDS = ("guest", "guest_nice")
_IDLE_FIELDS = ("idle", "iowait")


@dataclass(frozen=True)
class HostReading:
    cpu_util_percent: float | None
    process_cpu_percent: float | None
    process_rss_bytes: int | None
    system_memory_used_bytes: int | None
    system_memory_total_bytes: int | None


def _busy_total(times: Any) -> tuple[float, float]:
    fields = times._asdict()
    total = sum(fields.values()) - sum(fields.get(f, 0.0) for f in _GUEST_FIELDS)
    idle = sum(fields.get(f, 0.0) for f in _IDLE_FIELDS)
    return total - idle, total


class HostReader:
    """CPU utilization (system and this process), RSS and system memory."""

    def __init__(self, pid: int | None = None) -> None:
        self._process: psutil.Process | None
        try:
            self._process = psutil.Process(os.getpid() if pid is None else pid)
        except (psutil.Error, OSError):
            self._process = None
        # baselines so the first read() already covers a real interval
        self._last_system = self._system_times()
        self._last_process = self._process_times()

    def _system_times(self) -> tuple[float, float] | None:
        try:
            return _busy_total(psutil.cpu_times())
        except (psutil.Error, OSError):
            return None

    def _process_times(self) -> tuple[float, float] | None:
        """(cpu seconds of this process, monotonic wall seconds)."""
        if self._process is None:
            return None
        try:
            t = self._process.cpu_times()
            return t.user + t.system, time.monotonic()
        except (psutil.Error, OSError):
            return None

    def read(self) -> HostReading:
        cpu = self._cpu_util()
        proc_cpu = self._process_cpu()
        rss: int | None = None
        if self._process is not None:
            try:
                rss = int(self._process.memory_info().rss)
            except (psutil.Error, OSError):
                rss = None
        used: int | None = None
        total: int | None = None
        try:
            vm = psutil.virtual_memory()
            total = int(vm.total)
            used = int(vm.total - vm.available)
        except (psutil.Error, OSError):
            pass
        return HostReading(cpu, proc_cpu, rss, used, total)

    def _cpu_util(self) -> float | None:
        now = self._system_times()
        last, self._last_system = self._last_system, now
        if now is None or last is None:
            return None
        d_busy, d_total = now[0] - last[0], now[1] - last[1]
        if d_total <= 0:
            return None  # no clock tick elapsed between reads
        return min(100.0, max(0.0, 100.0 * d_busy / d_total))

    def _process_cpu(self) -> float | None:
        now = self._process_times()
        last, self._last_process = self._last_process, now
        if now is None or last is None:
            return None
        d_cpu, d_wall = now[0] - last[0], now[1] - last[1]
        if d_wall <= 0:
            return None
        return max(0.0, 100.0 * d_cpu / d_wall)
