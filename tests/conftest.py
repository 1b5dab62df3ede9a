"""Shared fixtures: restore global torch state, tear down process groups, GPU marker."""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import pytest
from hypothesis import settings

os.environ.setdefault("MPLBACKEND", "Agg")
# `make test` runs the property tests on the same examples every time (a run that passed
# passes again; a failure it finds is found again); `make fuzz` draws new ones, many more.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("WORKBENCH_HYPOTHESIS_PROFILE", "repeatable"))
# Subprocesses (ranks, kernels, DeepSpeed's op builds) use this interpreter's tools, so one
# ninja builds DeepSpeed's ops; two ninjas on PATH would invalidate each other's cached builds.
_bin = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Segments an older DeepSpeed run left behind (mapped by no live process) are removed:
    each holds 66 MB of RAM, and a machine that ran many suites with them could run out.
    The workbench unlinks its own (tests/integration/test_launch.py checks it does)."""
    from pathlib import Path

    from tests.integration.job_runs import shm_segments

    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        mapped.update(ln.rsplit("/", 1)[-1] for ln in text.splitlines() if "/dev/shm/" in ln)
    for name in shm_segments() - mapped:
        with contextlib.suppress(OSError):
            os.unlink(f"/dev/shm/{name}")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests skip without CUDA, `cpu_only` tests (what a machine without CUDA does)
    skip with it; each says why."""
    if _has_cuda():
        marker, skip = "cpu_only", pytest.mark.skip(reason="asserts a machine without CUDA")
    else:
        marker = "gpu"
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA; this machine has none")
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_torch_state():
    """Each test starts and ends with torch's global state as it found it."""

    if "torch" not in sys.modules:
        yield
        return
    import torch

    rng = torch.get_rng_state()
    dtype = torch.get_default_dtype()
    threads = torch.get_num_threads()
    grad = torch.is_grad_enabled()
    yield
    torch.set_rng_state(rng)
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def no_leaked_threads():
    """Fails the test if it leaves non-daemon or workbench threads running."""
    before = set(threading.enumerate())
    yield
    import time

    deadline = time.time() + 5
    while time.time() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra:
            return
        time.sleep(0.05)
    raise AssertionError(f"threads left running: {[t.name for t in extra]}")
