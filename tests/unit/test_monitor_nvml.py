"""NVML adapter against a fake backend that replays recorded NVML values and errors."""

from __future__ import annotations

import gc
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from workbench.monitor import NvmlAdapter, NvmlNotInstalled, NvmlUnavailable, Sampler
from workbench.monitor.nvml import INSTALL_HINT

# Values as NVML returned them on an A100-SXM4-40GB during a training run (raw units:
# power in mW, PCIe in KB/s, memory in bytes).
RECORDED: list[dict[str, Any]] = [
    {
        "name": "NVIDIA A100-SXM4-40GB",
        "uuid": "GPU-8d2c7a3e-5b41-4f0e-9a6c-1e2f3a4b5c6d",
        "util": [97, 98, 35],
        "memory": [
            (31_138_512_896, 42_949_672_960),
            (31_140_610_048, 42_949_672_960),
            (31_140_610_048, 42_949_672_960),
        ],
        "power_mw": [331_512, 338_004, 120_871],
        "limit_mw": [400_000],
        "temp": [61, 62, 58],
        "sm_clock": [1410, 1410, 1095],
        "pcie_tx_kb": [2_048, 1_024, 0],
        "pcie_rx_kb": [524_288, 262_144, 64],
        "procs": [[(4242, 1_234_567_168), (os.getpid(), 30_000_000_000)]],
    },
    {
        "name": b"NVIDIA A100-SXM4-40GB",  # older bindings return bytes
        "uuid": b"GPU-0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0",
        "util": [0],
        "memory": [(4_194_304, 42_949_672_960)],
        "power_mw": [52_000],
        "limit_mw": [400_000],
        "temp": [33],
        "sm_clock": [210],
        "pcie_tx_kb": [0],
        "pcie_rx_kb": [0],
        "procs": [[]],
    },
]


class FakeNvml:
    """Replays `RECORDED`: the n-th call of a getter on a GPU returns the n-th value
    (the last one repeats). `errors[(getter, gpu)]` maps a call number to an NVML
    error code raised on that call instead; `init_error` fails nvmlInit."""

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_GPU_NOT_FOUND = pynvml.NVML_ERROR_GPU_NOT_FOUND
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    def __init__(
        self,
        gpus: list[dict[str, Any]] | None = None,
        errors: dict[tuple[str, int], dict[int, int]] | None = None,
        init_error: int | None = None,
    ) -> None:
        self.gpus = RECORDED if gpus is None else gpus
        self.errors = errors or {}
        self.init_error = init_error
        self.calls: dict[tuple[str, int], int] = {}
        self.init_count = 0
        self.shutdown_count = 0

    # life
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_count += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    # replay
    def _next(self, getter: str, gpu: int, key: str) -> Any:
        n = self.calls.get((getter, gpu), 0)
        self.calls[(getter, gpu)] = n + 1
        code = self.errors.get((getter, gpu), {}).get(n)
        if code is None:
            code = self.errors.get((getter, gpu), {}).get(-1)  # -1: every call from now
        if code is not None:
            raise pynvml.NVMLError(code)
        values = self.gpus[gpu][key]
        return values[min(n, len(values) - 1)] if isinstance(values, list) else values

    def nvmlDeviceGetName(self, h: int) -> Any:
        return self._next("name", h, "name")

    def nvmlDeviceGetUUID(self, h: int) -> Any:
        return self._next("uuid", h, "uuid")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._next("util", h, "util"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        used, total = self._next("memory", h, "memory")
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._next("power", h, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._next("limit", h, "limit_mw")

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._next("temp", h, "temp")

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._next("clock", h, "sm_clock")

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return self._next("pcie_tx", h, "pcie_tx_kb")
        return self._next("pcie_rx", h, "pcie_rx_kb")

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._next("procs", h, "procs")]


def test_reads_recorded_values_with_units_converted() -> None:
    fake = FakeNvml()
    with NvmlAdapter(fake) as nv:
        first = nv.read()
    assert fake.init_count == 1 and fake.shutdown_count == 1
    assert len(first) == 2
    g0, g1 = first
    assert g0.index == 0 and g0.name == "NVIDIA A100-SXM4-40GB"
    assert g0.util_percent == 97.0
    assert g0.memory_used_bytes == 31_138_512_896
    assert g0.memory_total_bytes == 42_949_672_960
    assert g0.power_watts == pytest.approx(331.512)
    assert g0.power_limit_watts == pytest.approx(400.0)
    assert g0.temperature_c == 61.0
    assert g0.sm_clock_mhz == 1410.0
    assert g0.pcie_tx_bytes_per_s == 2_048 * 1024
    assert g0.pcie_rx_bytes_per_s == 524_288 * 1024
    assert g0.process_memory_bytes == 30_000_000_000  # this PID's entry, not PID 4242's
    assert g0.lost is False
    # bytes name decoded; this process has no context on GPU 1 -> not known
    assert g1.name == "NVIDIA A100-SXM4-40GB"
    assert g1.process_memory_bytes is None


def test_successive_reads_follow_the_recording() -> None:
    nv = NvmlAdapter(FakeNvml())
    try:
        utils = [nv.read()[0].util_percent for _ in range(3)]
    finally:
        nv.close()
    assert utils == [97.0, 98.0, 35.0]


def test_init_is_lazy() -> None:
    fake = FakeNvml()
    nv = NvmlAdapter(fake)
    assert fake.init_count == 0  # constructing does not touch NVML
    nv.read()
    assert fake.init_count == 1
    nv.read()
    assert fake.init_count == 1
    nv.close()
    nv.close()
    assert fake.shutdown_count == 1


def test_error_on_one_field_mid_run_makes_only_that_field_none() -> None:
    not_supported = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake = FakeNvml(errors={("power", 0): {1: not_supported}, ("pcie_tx", 0): {-1: 999}})
    with NvmlAdapter(fake) as nv:
        a, b, c = (nv.read()[0] for _ in range(3))
    assert a.power_watts == pytest.approx(331.512)
    assert b.power_watts is None  # the failing call
    assert b.util_percent == 98.0 and b.temperature_c == 62.0  # the rest still read
    assert c.power_watts == pytest.approx(120.871)  # recovers on the next call
    assert a.pcie_tx_bytes_per_s is None and c.pcie_tx_bytes_per_s is None
    assert c.pcie_rx_bytes_per_s == 64 * 1024


def test_per_process_memory_hidden_by_driver_is_none() -> None:
    gpus = [dict(RECORDED[0], procs=[[(os.getpid(), None)]])]  # WDDM / no permission
    with NvmlAdapter(FakeNvml(gpus=gpus)) as nv:
        assert nv.read()[0].process_memory_bytes is None


def test_gpu_that_disappears_is_reported_lost_not_raised() -> None:
    lost = pynvml.NVML_ERROR_GPU_IS_LOST
    fake = FakeNvml(errors={("memory", 1): {1: lost}})
    with NvmlAdapter(fake) as nv:
        before = nv.read()
        during = nv.read()
        calls_after_loss = dict(fake.calls)
        after = nv.read()
        assert nv.lost_indices == (1,)
    assert before[1].lost is False and before[1].util_percent == 0.0
    for g in (during[1], after[1]):
        assert g.lost is True
        assert g.index == 1 and g.name == "NVIDIA A100-SXM4-40GB"
        assert g.util_percent is None and g.memory_used_bytes is None
        assert g.power_watts is None and g.process_memory_bytes is None
    # the other GPU keeps reporting, and the lost one is not polled again
    assert after[0].util_percent == 35.0
    assert fake.calls[("util", 1)] == calls_after_loss[("util", 1)]


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "not loaded"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML failed to initialize"),
    ],
)
def test_driver_missing_at_init_gives_a_reason(code: int, words: str) -> None:
    nv = NvmlAdapter(FakeNvml(init_error=code))
    with pytest.raises(NvmlUnavailable, match=words):
        nv.open()
    assert nv.reason is not None and words in nv.reason


def test_no_gpus_is_unavailable_and_shuts_down() -> None:
    fake = FakeNvml(gpus=[])
    nv = NvmlAdapter(fake)
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        nv.open()
    assert fake.init_count == 1 and fake.shutdown_count == 1


def test_nvml_not_installed_names_the_right_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    nv = NvmlAdapter()
    with pytest.raises(ImportError) as info:
        nv.open()
    assert isinstance(info.value, NvmlNotInstalled)
    assert INSTALL_HINT == "pip install nvidia-ml-py"
    assert INSTALL_HINT in str(info.value)
    assert "pip install pynvml" not in str(info.value)


def test_sampler_falls_back_to_host_when_nvml_not_installed(
    monkeypatch: pytest.MonkeyPatch, no_leaked_threads: None
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with Sampler(interval=0.05) as s:
        assert s.source == "host"
        assert s.reason is not None and "pip install nvidia-ml-py" in s.reason
        sample = s.sample_now()
    assert sample.gpus == () and sample.source == "host" and sample.reason == s.reason
    assert sample.gpu_util_percent is None and sample.gpu_memory_used_bytes is None


def test_sampler_uses_injected_backend(no_leaked_threads: None) -> None:
    fake = FakeNvml()
    with Sampler(interval=0.05, backend=fake) as s:
        assert s.source == "nvml" and s.reason is None
        sample = s.sample_now()
    assert fake.shutdown_count == 1  # close() releases NVML
    assert sample.source == "nvml" and len(sample.gpus) == 2
    assert sample.gpu_util_percent == sample.gpus[0].util_percent
    assert sample.gpu_memory_used_bytes == sample.gpus[0].memory_used_bytes
    assert sample.process_rss_bytes is not None  # host fields are filled alongside


def test_dropped_sampler_releases_nvml(no_leaked_threads: None) -> None:
    fake = FakeNvml()
    s = Sampler(interval=0.01, backend=fake)
    s.sample_now()
    del s  # never closed: collecting it must still shut NVML down
    deadline = time.time() + 10  # the thread may be holding it for one sample
    while fake.shutdown_count == 0 and time.time() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert fake.init_count == 1 and fake.shutdown_count == 1


def test_sampler_survives_gpu_loss_in_its_thread(no_leaked_threads: None) -> None:
    lost = pynvml.NVML_ERROR_GPU_IS_LOST
    fake = FakeNvml(errors={("util", 0): {2: lost}})  # third sample finds GPU 0 gone

    with Sampler(interval=0.02, backend=fake) as s:
        deadline = time.time() + 10
        while s.samples_taken < 5 and time.time() < deadline:
            time.sleep(0.02)
        history = s.history()
        assert s.last_error is None
    assert len(history) >= 5
    assert history[0].gpus[0].lost is False
    assert history[-1].gpus[0].lost is True and history[-1].gpu_util_percent is None
    assert history[-1].gpus[1].lost is False


def test_two_samplers_on_one_driver_do_not_interfere(no_leaked_threads: None) -> None:
    fake = FakeNvml()
    a = Sampler(interval=0.02, backend=fake)
    b = Sampler(interval=0.02, backend=fake)
    try:
        assert fake.init_count == 2  # NVML counts nvmlInit/nvmlShutdown pairs itself
        a.close()
        assert fake.shutdown_count == 1
        taken = b.samples_taken
        deadline = time.time() + 10
        while b.samples_taken < taken + 2 and time.time() < deadline:
            time.sleep(0.01)
        assert b.samples_taken >= taken + 2, "b stopped sampling when a closed"
        latest = b.latest()
        assert latest is not None and latest.gpus[0].util_percent is not None
        assert b.last_error is None
    finally:
        a.close()
        b.close()
    assert fake.shutdown_count == 2


def test_the_training_gpu_is_found_by_uuid_not_by_index() -> None:
    """CUDA_VISIBLE_DEVICES=1 makes NVML's GPU 1 torch's cuda:0: the sample for the session
    is the GPU whose UUID torch reports (here in torch's bare, upper-case form)."""
    from workbench.monitor.types import Sample
    from workbench.train.devices import normalize_uuid

    with NvmlAdapter(backend=FakeNvml()) as nvml:
        gpus = nvml.read()
    assert [g.uuid for g in gpus] == [RECORDED[0]["uuid"], RECORDED[1]["uuid"].decode()]
    sample = Sample(0.0, "nvml", gpus, None, None, None, None, None)
    torch_uuid = "0F1E2D3C-4B5A-4968-8776-A5B4C3D2E1F0"  # str(props.uuid) of cuda:0
    training = sample.gpu(normalize_uuid(torch_uuid))
    assert training is not None and training.index == 1 and training.util_percent == 0.0
    assert sample.gpu(None) is gpus[0]  # no training GPU: the first
    assert sample.gpu("GPU-00000000-0000-0000-0000-000000000000") is None
