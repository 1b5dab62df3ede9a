"""Hardware monitor: NVML for NVIDIA GPUs, psutil for the host, a background sampler.

`Sampler` is the entry point; `NvmlAdapter` and `HostReader` are the two device adapters.
"""

from __future__ import annotations

from workbench.monitor.host import HostReader, HostReading
from workbench.monitor.nvml import NvmlAdapter, NvmlNotInstalled, NvmlUnavailable
from workbench.monitor.sampler import Sampler
from workbench.monitor.types import GpuSample, Sample

__all__ = [
    "GpuSample",
    "HostReader",
    "HostReading",
    "NvmlAdapter",
    "NvmlNotInstalled",
    "NvmlUnavailable",
    "Sample",
    "Sampler",
]
