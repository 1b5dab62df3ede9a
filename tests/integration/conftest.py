"""Fixtures for the Session integration tests: one torch thread, tiny model sizes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


#: A model factory module that leaves a marker file when it is imported and when it is
#: called: a test that a crafted file runs nothing asserts that neither file appears.
MARKER_FACTORY = """
import pathlib
MARK = pathlib.Path({mark!r})
(MARK.parent / (MARK.name + ".imported")).write_text("imported")

def make(**options):
    MARK.write_text("called")
    from workbench.models import build_model
    module, data, loss, _ = build_model("mlp", **(options or {{"samples": 64, "hidden": 16, "depth": 1}}))
    return module, data, loss
"""


@dataclass(frozen=True)
class Marker:
    """A factory `spec` ("marker_<n>:make") importable from the test's folder, and the file
    it writes when called (`path`; `path` + ".imported" when imported)."""

    spec: str
    path: Path

    @property
    def imported(self) -> bool:
        return self.path.with_name(self.path.name + ".imported").exists()

    @property
    def called(self) -> bool:
        return self.path.exists()

    @property
    def ran(self) -> bool:
        """Whether anything of the factory module ran (imported or called)."""
        return self.imported or self.called


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Marker]:
    """A marker factory importable from tmp_path (the current folder too)."""
    name = f"marker_{abs(hash(str(tmp_path))) % 10**8}"
    mark = tmp_path / "called"
    (tmp_path / f"{name}.py").write_text(MARKER_FACTORY.format(mark=str(mark)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield Marker(f"{name}:make", mark)
    sys.modules.pop(name, None)
