"""NVML adapter: the only module in workbench that talks to NVML.

NVML is reached through `nvidia-ml-py` (it provides `import pynvml`). The adapter
initializes lazily (on the first `open()` / `read()`, never at import), and every
NVML failure becomes "not available": a field that cannot be read is `None`, a GPU
that falls off the bus is reported with `lost=True` and `None` metrics from then on,
and an NVML that cannot start at all raises `NvmlUnavailable` with a plain reason,
which the `Sampler` turns into its host fallback.

The backend is injectable: `NvmlAdapter(backend=obj)` uses `obj.nvmlInit`,
`obj.nvmlDeviceGetCount`, ... instead of the real module, so tests replay recorded
values and errors. NVML reference-counts `nvmlInit`/`nvmlShutdown` itself, so several
adapters (one per `Sampler`) may be open at once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from workbench.monitor.types import GpuSample

T = TypeVar("T")

INSTALL_HINT = "pip install nvidia-ml-py"

# NVML return codes (stable across driver versions; read from the backend when it has them)
_GPU_IS_LOST = 15
_GPU_NOT_FOUND = 28
_LIBRARY_NOT_FOUND = 12
_DRIVER_NOT_LOADED = 9
_NO_PERMISSION = 4
_FUNCTION_NOT_FOUND = 13
_LOST_CODE_NAMES = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_NOT_FOUND")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; `reason` says why in plain words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NvmlNotInstalled(NvmlUnavailable, ImportError):
    """The `nvidia-ml-py` package (module `pynvml`) is not importable."""


def load_backend() -> Any:
    """Import the real NVML bindings or raise `NvmlNotInstalled` naming the package."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:
        raise NvmlNotInstalled(
            f"NVML bindings are not installed ({exc}); install them with `{INSTALL_HINT}`"
        ) from exc
    return pynvml


def _code(backend: Any, name: str, default: int) -> int:
    value = getattr(backend, name, default)
    return value if isinstance(value, int) else default


def _error_value(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _init_reason(backend: Any, exc: BaseException) -> str:
    """A plain sentence for an nvmlInit failure."""
    value = _error_value(exc)
    if value == _code(backend, "NVML_ERROR_LIBRARY_NOT_FOUND", _LIBRARY_NOT_FOUND):
        return "no NVIDIA driver found (the NVML library libnvidia-ml is not installed)"
    if value == _code(backend, "NVML_ERROR_DRIVER_NOT_LOADED", _DRIVER_NOT_LOADED):
        return "the NVIDIA driver is installed but not loaded"
    if value == _code(backend, "NVML_ERROR_NO_PERMISSION", _NO_PERMISSION):
        return "no permission to use NVML on this machine"
    return f"NVML failed to initialize: {exc}"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Lost(Exception):
    """Internal: the GPU being read is gone."""


class NvmlAdapter:
    """Reads every GPU NVML sees. Use `open()` (or just `read()`), then `close()`."""

    def __init__(self, backend: Any | None = None, *, pid: int | None = None) -> None:
        self._backend: Any = backend  # None until open() loads the real module
        self._pid = os.getpid() if pid is None else pid
        self._lock = threading.Lock()
        self._initialized = False
        self._closed = False
        self._handles: list[Any] = []
        self._names: list[str | None] = []
        self._uuids: list[str | None] = []
        self._lost: set[int] = set()
        self.reason: str | None = None  # set when open() failed

    # ------------------------------------------------------------------ life
    def open(self) -> int:
        """Initialize NVML and enumerate GPUs; returns their number.

        Raises `NvmlUnavailable` (or `NvmlNotInstalled`, an ImportError) with a reason.
        """
        with self._lock:
            if self._closed:
                raise NvmlUnavailable("this NVML adapter is closed")
            if self._initialized:
                return len(self._handles)
            try:
                if self._backend is None:
                    self._backend = load_backend()
                b = self._backend
                try:
                    b.nvmlInit()
                except Exception as exc:
                    raise NvmlUnavailable(_init_reason(b, exc)) from exc
                self._initialized = True
                try:
                    count = int(b.nvmlDeviceGetCount())
                    handles = [b.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
                except Exception as exc:
                    self._shutdown()
                    raise NvmlUnavailable(f"NVML could not list the GPUs: {exc}") from exc
                if count == 0:
                    self._shutdown()
                    raise NvmlUnavailable("the NVIDIA driver reports no GPU")
                self._handles = handles
                self._names = [self._name(h) for h in handles]
                self._uuids = [self._uuid(h) for h in handles]
                return count
            except NvmlUnavailable as exc:
                self.reason = exc.reason
                raise

    def close(self) -> None:
        """Shut NVML down for this adapter (idempotent)."""
        with self._lock:
            self._closed = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._initialized:
            self._initialized = False
            # the driver may already be gone; then there is nothing left to release
            with contextlib.suppress(Exception):
                self._backend.nvmlShutdown()

    @property
    def device_count(self) -> int:
        return len(self._handles)

    @property
    def lost_indices(self) -> tuple[int, ...]:
        """GPUs that disappeared during the run."""
        return tuple(sorted(self._lost))

    # ------------------------------------------------------------------ read
    def read(self) -> tuple[GpuSample, ...]:
        """One `GpuSample` per GPU. Never raises once `open()` succeeded."""
        if not self._initialized:
            self.open()
        with self._lock:
            if not self._initialized:  # closed concurrently
                return ()
            return tuple(self._read_one(i) for i in range(len(self._handles)))

    def _field(self, fn: Callable[[], T]) -> T | None:
        """Call one NVML getter; any failure -> None, a lost GPU -> `_Lost`."""
        try:
            return fn()
        except Exception as exc:
            value = _error_value(exc)
            if value is not None and value in self._lost_codes():
                raise _Lost() from exc
            return None

    def _name(self, handle: Any) -> str | None:
        try:
            return self._field(lambda: _text(self._backend.nvmlDeviceGetName(handle)))
        except _Lost:
            return None  # read() will find it lost and report it so

    def _uuid(self, handle: Any) -> str | None:
        try:
            return self._field(lambda: _text(self._backend.nvmlDeviceGetUUID(handle)))
        except _Lost:
            return None

    def _lost_codes(self) -> tuple[int, int]:
        b = self._backend
        return (
            _code(b, _LOST_CODE_NAMES[0], _GPU_IS_LOST),
            _code(b, _LOST_CODE_NAMES[1], _GPU_NOT_FOUND),
        )

    def _lost_sample(self, index: int) -> GpuSample:
        return GpuSample(
            index=index,
            name=self._names[index],
            util_percent=None,
            memory_used_bytes=None,
            memory_total_bytes=None,
            power_watts=None,
            power_limit_watts=None,
            temperature_c=None,
            sm_clock_mhz=None,
            pcie_tx_bytes_per_s=None,
            pcie_rx_bytes_per_s=None,
            process_memory_bytes=None,
            lost=True,
            uuid=self._uuids[index] if index < len(self._uuids) else None,
        )

    def _read_one(self, index: int) -> GpuSample:
        if index in self._lost:
            return self._lost_sample(index)
        b = self._backend
        h = self._handles[index]
        try:
            util = self._field(lambda: float(b.nvmlDeviceGetUtilizationRates(h).gpu))
            mem = self._field(lambda: b.nvmlDeviceGetMemoryInfo(h))
            power = self._field(lambda: b.nvmlDeviceGetPowerUsage(h) / 1000.0)
            limit = self._field(lambda: b.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
            temp = self._field(
                lambda: float(b.nvmlDeviceGetTemperature(h, _code(b, "NVML_TEMPERATURE_GPU", 0)))
            )
            clock = self._field(
                lambda: float(b.nvmlDeviceGetClockInfo(h, _code(b, "NVML_CLOCK_SM", 1)))
            )
            # NVML reports PCIe throughput in KB/s over a 20 ms window
            tx = self._field(
                lambda: (
                    1024.0
                    * b.nvmlDeviceGetPcieThroughput(h, _code(b, "NVML_PCIE_UTIL_TX_BYTES", 0))
                )
            )
            rx = self._field(
                lambda: (
                    1024.0
                    * b.nvmlDeviceGetPcieThroughput(h, _code(b, "NVML_PCIE_UTIL_RX_BYTES", 1))
                )
            )
            procs = self._field(lambda: list(b.nvmlDeviceGetComputeRunningProcesses(h)))
        except _Lost:
            self._lost.add(index)
            return self._lost_sample(index)
        used = _int_attr(mem, "used")
        total = _int_attr(mem, "total")
        return GpuSample(
            index=index,
            name=self._names[index],
            util_percent=util,
            memory_used_bytes=used,
            memory_total_bytes=total,
            power_watts=power,
            power_limit_watts=limit,
            temperature_c=temp,
            sm_clock_mhz=clock,
            pcie_tx_bytes_per_s=tx,
            pcie_rx_bytes_per_s=rx,
            process_memory_bytes=self._process_memory(procs),
            uuid=self._uuids[index] if index < len(self._uuids) else None,
        )

    def _process_memory(self, procs: list[Any] | None) -> int | None:
        """This process's GPU memory; None when NVML does not list it (e.g. another PID
        namespace in a container) or the driver hides per-process memory."""
        if procs is None:
            return None
        for p in procs:
            if getattr(p, "pid", None) == self._pid:
                return _int_attr(p, "usedGpuMemory")
        return None

    def __enter__(self) -> NvmlAdapter:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _int_attr(obj: Any, name: str) -> int | None:
    value = getattr(obj, name, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)
