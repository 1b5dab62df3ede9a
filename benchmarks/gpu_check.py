"""Exercise the real NVML path (and torch.cuda if present) and print what was read.

    .venv/bin/python benchmarks/gpu_check.py

For machines with an NVIDIA GPU. Without one (no driver, no GPU, or nvidia-ml-py
missing) it says so plainly and exits 0. With one it prints every field the NVML
adapter read, then, when torch has CUDA, allocates 256 MiB and runs matmuls on GPU 0
while the Sampler watches, and checks that NVML sees this process's memory rise and
the GPU get busy. Writes benchmarks/results/gpu_check.json. Exit status 1 when a check
fails.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

from _common import ROOT, write_results

from workbench.monitor import GpuSample, NvmlAdapter, NvmlUnavailable, Sampler


def _fmt(g: GpuSample) -> str:
    def mib(v: int | None) -> str:
        return "n/a" if v is None else f"{v / 2**20:,.0f} MiB"

    def num(v: float | None, unit: str, digits: int = 0) -> str:
        return "n/a" if v is None else f"{v:.{digits}f} {unit}"

    return (
        f"GPU {g.index} {g.name!r}{' LOST' if g.lost else ''}\n"
        f"  util {num(g.util_percent, '%')}, memory {mib(g.memory_used_bytes)} / "
        f"{mib(g.memory_total_bytes)}, this process {mib(g.process_memory_bytes)}\n"
        f"  power {num(g.power_watts, 'W', 1)} of {num(g.power_limit_watts, 'W', 0)}, "
        f"temperature {num(g.temperature_c, 'C')}, SM clock {num(g.sm_clock_mhz, 'MHz')}\n"
        f"  PCIe tx {num(None if g.pcie_tx_bytes_per_s is None else g.pcie_tx_bytes_per_s / 2**20, 'MiB/s', 1)}, "
        f"rx {num(None if g.pcie_rx_bytes_per_s is None else g.pcie_rx_bytes_per_s / 2**20, 'MiB/s', 1)}"
    )


def _torch_cuda_load(result: dict[str, Any], checks: dict[str, bool]) -> None:
    try:
        import torch
    except ImportError:
        print("torch is not installed: skipping the CUDA load check")
        return
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA here: skipping the CUDA load check")
        result["torch_cuda"] = False
        return
    print(
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"{torch.cuda.device_count()} device(s): {torch.cuda.get_device_name(0)}"
    )
    result["torch_cuda"] = True
    with Sampler(interval=0.1) as s:
        time.sleep(0.5)
        before = s.latest()
        block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
        a = torch.randn(4096, 4096, device="cuda:0")
        start = time.monotonic()
        while time.monotonic() - start < 3.0:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()  # host waits for the matmuls so the loop spans 3 s
        busy = [x.gpu_util_percent for x in s.history() if x.time > time.time() - 2.0]
        after = s.latest()
        del block, a
    assert before is not None and after is not None
    print("during the load:\n" + _fmt(after.gpus[0]))
    p0, p1 = before.gpus[0].process_memory_bytes, after.gpus[0].process_memory_bytes
    util = max((u for u in busy if u is not None), default=None)
    result["load"] = {
        "process_memory_before_bytes": p0,
        "process_memory_after_bytes": p1,
        "max_util_percent_during_load": util,
        "torch_allocated_bytes": torch.cuda.memory_allocated(0),
    }
    if p1 is None:
        print(
            "note: NVML does not list this process (another PID namespace?); "
            "process memory is not available here"
        )
    else:
        checks["nvml sees this process's memory grow by >= 256 MiB"] = p1 - (p0 or 0) >= 256 * 2**20
    checks["GPU utilization > 50% during matmuls"] = util is not None and util > 50


def main() -> int:
    result: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    nv = NvmlAdapter()
    try:
        count = nv.open()
    except NvmlUnavailable as exc:
        print(f"No NVIDIA GPU/driver available on this machine: {exc.reason}.")
        print("Nothing to check; the monitor uses the host (CPU/memory) fallback here.")
        result.update(nvml=False, reason=exc.reason)
        _write(result)
        return 0
    try:
        print(f"NVML initialized: {count} GPU(s), pid {os.getpid()}")
        first = nv.read()
        time.sleep(0.5)
        second = nv.read()
        for g in second:
            print(_fmt(g))
        result.update(nvml=True, gpus=[dataclasses.asdict(g) for g in second])
        checks["every GPU reports total memory"] = all(g.memory_total_bytes for g in second)
        checks["every GPU reports utilization"] = all(g.util_percent is not None for g in second)
        checks["reads are repeatable"] = len(first) == len(second) == count
    finally:
        nv.close()
    _torch_cuda_load(result, checks)
    for name, ok in checks.items():
        print(f"check {'ok    ' if ok else 'FAILED'} {name}")
    result["checks"] = checks
    _write(result)
    return 0 if all(checks.values()) else 1


def _write(result: dict[str, Any]) -> None:
    path = write_results("gpu_check", result)
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
