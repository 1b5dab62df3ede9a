"""The names a Jupyter user meets on `workbench.`: listed before they are imported (tab
completion), each resolving to the real object, and `import workbench` staying light."""

from __future__ import annotations

import subprocess
import sys

import workbench


def test_dir_lists_every_lazy_name_before_it_is_imported() -> None:
    code = (
        "import sys, workbench; names = dir(workbench); "
        "print('Session' in names, 'StepRecord' in names, 'MemoryReport' in names, "
        "'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "False"]


def test_every_public_name_resolves_to_its_object() -> None:
    from workbench.advisor import Advice
    from workbench.train.measure.memory import MemoryReport
    from workbench.train.measure.profiler import ProfileResult
    from workbench.train.records import StepRecord
    from workbench.train.session import Session, SessionError

    for name in workbench.__all__:
        assert getattr(workbench, name) is not None, name
    assert workbench.StepRecord is StepRecord and workbench.MemoryReport is MemoryReport
    assert workbench.ProfileResult is ProfileResult and workbench.Advice is Advice
    assert workbench.Session is Session and workbench.SessionError is SessionError
    assert set(workbench.__all__) <= set(dir(workbench))
    assert set(workbench.__all__) == set(workbench._LAZY) | {"__version__"}


def test_subpackages_are_attributes() -> None:
    assert "compress" in dir(workbench)
    assert workbench.compress.__name__ == "workbench.compress"
    assert workbench.estimate.estimate_memory is workbench.estimate_memory


def test_an_unknown_name_says_so() -> None:
    import pytest

    with pytest.raises(AttributeError, match="has no attribute 'Sesion'"):
        workbench.Sesion  # noqa: B018


def test_the_version_is_pyproject_s() -> None:
    import re
    from pathlib import Path

    from workbench.version import __version__

    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    declared = re.search(r'(?m)^version = "([^"]+)"$', text)
    assert declared is not None
    assert __version__ == declared.group(1) == workbench.__version__
