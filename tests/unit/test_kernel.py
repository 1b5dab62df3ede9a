"""A notebook kernel from another environment than the project's .venv is told so, clearly."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from workbench import kernel
from workbench.kernel import KERNEL_DISPLAY_NAME, WrongKernelWarning, wrong_kernel_message

ROOT = Path(__file__).parents[2]


def _checkout(tmp_path: Path, *, venv: bool = True) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "workbench").mkdir()
    if venv:
        (tmp_path / ".venv" / "bin").mkdir(parents=True)
        (tmp_path / ".venv" / "bin" / "python").write_text("")
    return tmp_path


def test_another_environment_is_named_with_the_fix(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    message = wrong_kernel_message(
        prefix=Path("/usr"), executable="/usr/bin/python3", package_dir=root / "workbench"
    )
    assert message is not None
    assert message.startswith("this notebook's kernel runs /usr/bin/python3, not the project's ")
    assert str(root / ".venv" / "bin" / "python") in message
    assert f"`make lab` in {root}" in message
    assert f"`make kernel` there once and pick '{KERNEL_DISPLAY_NAME}'" in message
    assert "Kernel > Change Kernel" in message


def test_the_project_venv_itself_is_not_warned(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    assert (
        wrong_kernel_message(
            prefix=root / ".venv",
            executable=str(root / ".venv" / "bin" / "python"),
            package_dir=root / "workbench",
        )
        is None
    )


def test_an_installed_wheel_or_a_checkout_without_venv_is_not_warned(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "workbench").mkdir(parents=True)  # a wheel: no pyproject.toml beside the package
    assert (
        wrong_kernel_message(
            prefix=Path("/opt/env"), executable="python", package_dir=site / "workbench"
        )
        is None
    )
    conda = _checkout(tmp_path / "conda", venv=False)  # environment.yml's editable install
    assert (
        wrong_kernel_message(
            prefix=Path("/opt/env"), executable="python", package_dir=conda / "workbench"
        )
        is None
    )


def test_check_kernel_warns_only_inside_a_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = _checkout(tmp_path)
    monkeypatch.setattr(kernel, "__file__", str(root / "workbench" / "kernel.py"))
    monkeypatch.setattr(sys, "prefix", "/usr")
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel.check_kernel() is None  # a script or the CLI: never checked
    monkeypatch.setitem(sys.modules, "ipykernel", sys)
    with pytest.warns(WrongKernelWarning, match=r"^this notebook's kernel runs .*`make lab`"):
        assert kernel.check_kernel() is not None


def test_a_kernel_of_another_python_warns_on_import_workbench(tmp_path: Path) -> None:
    """The real mistake, in a real interpreter: a kernel whose Python is not the checkout's
    `.venv` imports the checkout's package (an editable install elsewhere, PYTHONPATH)."""
    checkout = _checkout(tmp_path / "checkout")
    shutil.copytree(ROOT / "workbench", checkout / "workbench", dirs_exist_ok=True)
    code = (
        "import sys, warnings; sys.modules['ipykernel'] = sys; warnings.simplefilter('always'); "
        "import workbench; print(workbench.__file__)"
    )
    env = {"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(checkout / "workbench" / "__init__.py")
    assert (
        f"WrongKernelWarning: this notebook's kernel runs {sys.executable}, not " in result.stderr
    )
    assert f"`make lab` in {checkout}" in result.stderr
    # the same import outside a kernel (a script, the CLI): nothing said
    script = subprocess.run(
        [sys.executable, "-c", code.replace("sys.modules['ipykernel'] = sys; ", "")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert "WrongKernelWarning" not in script.stderr


def test_make_kernel_registers_the_named_kernel() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert f'--user --name workbench --display-name "{KERNEL_DISPLAY_NAME}"' in makefile
