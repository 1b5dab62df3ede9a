"""Hardware samples: frozen dataclasses with units in the field names.

`None` means "not available on this machine / driver / permission level", never 0.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE_NVML = "nvml"
SOURCE_HOST = "host"


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant, as read through NVML."""

    index: int
    name: str | None
    util_percent: float | None  # SM busy share over NVML's last sample period, 0..100
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    power_limit_watts: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    process_memory_bytes: int | None  # GPU memory of this process (None: not listed/known)
    lost: bool = False  # the GPU fell off the bus during the run; every metric is None
    uuid: str | None = None  # NVML's "GPU-..." UUID: the same GPU whatever the device order


@dataclass(frozen=True)
class Sample:
    """One reading of the machine.

    `source` is "nvml" when `gpus` come from NVML, "host" when only CPU/memory are
    measured (no NVIDIA driver or GPU); `reason` says why NVML is not used.
    `cpu_util_percent` is system-wide (0..100 over all cores); `process_cpu_percent`
    is this process in percent of one core (can exceed 100 with several threads busy).
    """

    time: float  # time.time() when the sample was taken
    source: str
    gpus: tuple[GpuSample, ...]
    cpu_util_percent: float | None
    process_cpu_percent: float | None
    process_rss_bytes: int | None
    system_memory_used_bytes: int | None  # total - available
    system_memory_total_bytes: int | None
    reason: str | None = None

    @property
    def gpu_util_percent(self) -> float | None:
        """Utilization of the first GPU, or None without one."""
        return self.gpus[0].util_percent if self.gpus else None

    @property
    def gpu_memory_used_bytes(self) -> int | None:
        """Memory used on the first GPU (all processes), or None without one."""
        return self.gpus[0].memory_used_bytes if self.gpus else None

    def gpu(self, uuid: str | None) -> GpuSample | None:
        """The GPU with NVML UUID `uuid` (compare `workbench.train.devices.cuda_uuid`);
        None when it is not in this sample. `uuid=None`: the first GPU, if any.
        CUDA and NVML may number GPUs differently (CUDA_VISIBLE_DEVICES,
        CUDA_DEVICE_ORDER), so a training device is matched by UUID, never by index."""
        if uuid is None:
            return self.gpus[0] if self.gpus else None
        wanted = uuid.lower()
        for g in self.gpus:
            if g.uuid is not None and g.uuid.lower() == wanted:
                return g
        return None
