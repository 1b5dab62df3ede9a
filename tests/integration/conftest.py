"""Fixtures for the Session integration tests: one torch thread, tiny model sizes."""

from __future__ import annotations

import pytest
import torch

#: A tiny-gpt small enough for a step in a few milliseconds on one CPU thread.
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16}


@pytest.fixture(autouse=True)
def _one_thread():
    """The machine is shared and has 2 cores: several torch threads per test process
    slow everything down (and timing does not matter in these tests)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny() -> dict[str, int]:
    return dict(TINY)
