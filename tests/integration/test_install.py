"""The package as a user installs it: `python -m build`, then the wheel in a fresh venv.

The wheel and sdist are built from a copy of the working tree (the build never writes into
the repository). The wheel with its `test` extra is installed from the package registry into
a new virtual environment that sees neither this venv's packages nor the source tree, with
the same torch release as this venv (a CPU build on a machine without a GPU, as `make
install` picks). Every command then runs from a folder outside the source tree: the
installed `workbench estimate` and `workbench export`, a 2-step Session (which reads the
sonnets shipped as package data), `import workbench.ui`, and the extras' packages. One
install for the module (about 2 GB, a minute or two with a warm pip cache); the venv is
deleted afterwards. environment.yml's environment is built the same way, as conda builds
it, and a share of the tests runs in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NAME = PYPROJECT["project"]["name"]
VERSION = PYPROJECT["project"]["version"]
#: the file names setuptools gives the distribution (PEP 427/625: `-` becomes `_`)
STEM = f"{NAME.replace('-', '_')}-{VERSION}"

#: what a build copy of the working tree leaves out (local state, not sources)
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", ".whl", "__pycache__", "*.pyc", ".*_cache", ".hypothesis",
    "*.egg-info", "build", "dist", "artifacts", ".ipynb_checkpoints", "checkpoints",
)  # fmt: skip

pytestmark = pytest.mark.timeout(1800)  # one registry install of torch and the extras


@dataclass(frozen=True)
class Installed:
    wheel: Path
    sdist: Path
    venv: Path
    outside: Path  # a folder outside the source tree, the cwd of every command
    source: Path  # the copy the distributions were built from

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            args, capture_output=True, text=True, cwd=self.outside, env=_clean_env(),
            timeout=timeout,
        )  # fmt: skip
        assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
        return result

    def python(self, code: str, timeout: float = 300) -> str:
        return self.run(str(self.venv / "bin" / "python"), "-c", code, timeout=timeout).stdout


def _clean_env() -> dict[str, str]:
    """This process's environment without anything that points at this venv or the tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return env


#: pip's byte-compiling of every installed module (about a minute for these 2 GB) left to
#: Python, which compiles what it imports: what is installed, and how it runs, is the same
NO_COMPILE = ("--no-compile",)


def _torch_requirement() -> str:
    from importlib.metadata import version

    return "torch==" + version("torch").split("+")[0]  # this venv's release, any local build


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    dist = base / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    venv = base / "venv"
    outside = base / "elsewhere"
    outside.mkdir()
    # the base interpreter, not this venv's: the new one must not see its packages
    subprocess.run(
        [str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv", str(venv)],
        check=True, timeout=300,
    )  # fmt: skip
    wheel = dist / f"{STEM}-py3-none-any.whl"
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *NO_COMPILE,
         f"{wheel}[test]", _torch_requirement()],
        capture_output=True, text=True, cwd=outside, env=_clean_env(), timeout=1500,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    yield Installed(wheel, dist / f"{STEM}.tar.gz", venv, outside, source)
    shutil.rmtree(venv, ignore_errors=True)  # about 2 GB


def test_build_makes_a_wheel_and_an_sdist_under_the_free_name(installed: Installed) -> None:
    assert NAME == "torch-workbench"  # `workbench` on the registry is an unrelated project
    with zipfile.ZipFile(installed.wheel) as wheel:
        metadata = wheel.read(f"{STEM}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"{STEM}.dist-info/entry_points.txt").decode()
        top_level = wheel.read(f"{STEM}.dist-info/top_level.txt").decode().split()
    assert f"Name: {NAME}\n" in metadata
    assert "Provides-Extra: test\n" in metadata
    assert f'Requires-Dist: {NAME}[tensorboard]; extra == "test"' in metadata
    assert "workbench = workbench.cli:main" in entry_points
    assert top_level == ["workbench"]  # the import name stays `workbench`
    with tarfile.open(installed.sdist) as sdist:
        names = set(sdist.getnames())
    for path in ("pyproject.toml", "README.md", "workbench/models/data/sonnets.txt"):
        assert f"{STEM}/{path}" in names


def test_the_wheel_ships_every_file_of_the_package(installed: Installed) -> None:
    """Package data included: every file under workbench/ (modules, the sonnets, the job
    scripts copied by `workbench export`, py.typed) is in the wheel, nothing else is."""
    package = installed.source / "workbench"
    on_disk = {
        path.relative_to(installed.source).as_posix()
        for path in package.rglob("*")
        if path.is_file()
    }
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {name for name in wheel.namelist() if not name.startswith(f"{STEM}.dist-info/")}
    assert shipped == on_disk
    assert {"workbench/models/data/sonnets.txt", "workbench/py.typed"} <= shipped
    assert "workbench/export/train_deepspeed.py" in shipped


def test_the_installed_package_is_the_wheel_not_the_source_tree(installed: Installed) -> None:
    out = installed.python(
        "import importlib.metadata as m, workbench; "
        f"print(workbench.__file__); print(m.version({NAME!r})); print(workbench.__version__)"
    ).split()
    site = installed.venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert Path(out[0]).is_relative_to(site / "site-packages")
    assert out[1] == out[2] == VERSION


def test_installed_estimate_command(installed: Installed) -> None:
    out = installed.run(
        str(installed.venv / "bin" / "workbench"), "estimate", "--model", "llama-2-7b"
    ).stdout
    assert out.startswith("llama-2-7b (6.738B parameters), fp32, adamw, ZeRO stage 0, 1 GPU")
    assert "peak of a step" in out


def test_installed_two_step_session_reads_the_shipped_sonnets(installed: Installed) -> None:
    out = installed.python(
        "import math\n"
        "from workbench import Session, TrainConfig\n"
        "s = Session(TrainConfig(micro_batch=2))\n"
        "s.run(2, progress=False)\n"
        "print(len(s.history), math.isfinite(s.history[-1].loss))\n"
        "s.close()\n",
        timeout=600,
    )
    assert out.split() == ["2", "True"]


def test_installed_ui_imports_and_builds_an_estimator_panel(installed: Installed) -> None:
    out = installed.python(
        "import workbench.ui\n"
        "from workbench import EstimatorPanel\n"
        "print(type(EstimatorPanel()).__name__)\n"
    )
    assert out.split()[-1] == "EstimatorPanel"


def test_installed_export_copies_the_shipped_job_scripts(installed: Installed) -> None:
    job = installed.outside / "job"
    installed.run(
        str(installed.venv / "bin" / "workbench"), "export", "--out", str(job), "--zero", "2"
    )
    assert {"train_deepspeed.py", "job_common.py", "ds_config.json", "launch.sh"} <= {
        p.name for p in job.iterdir()
    }


def test_the_test_extra_installs_its_packages(installed: Installed) -> None:
    out = installed.python(
        "import importlib.metadata as m\n"
        "for name in ('tensorboard', 'pytest', 'pytest-xdist', 'hypothesis', 'nbclient',\n"
        "             'ipykernel', 'playwright', 'transformers', 'lightning', 'build'):\n"
        "    print(name, m.version(name))\n"
        "import tensorboard, pytest, xdist, transformers, lightning\n"
    )
    assert len(out.splitlines()) == 10


def test_environment_yml_makes_the_environment_make_install_makes() -> None:
    """environment.yml (for conda users) pins what CI tests: the Python that the type check
    targets, inside requires-python, and this checkout with the same `test` extra that
    `make install` installs. (No conda here: CI checks the file against the same pins.)"""
    import yaml
    from packaging.specifiers import SpecifierSet

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "workbench"
    assert env["channels"] == ["conda-forge"]
    deps = env["dependencies"]
    pythons = [d for d in deps if isinstance(d, str) and d.startswith("python=")]
    assert len(pythons) == 1
    python = pythons[0].removeprefix("python=")
    assert python == PYPROJECT["tool"]["mypy"]["python_version"]
    assert f"{python}.0" in SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert "pip" in deps
    (pip,) = [d["pip"] for d in deps if isinstance(d, dict)]
    assert pip == ["-e .[test]"]
    assert '$(PIP) install --quiet -e ".[test]"' in (ROOT / "Makefile").read_text()


#: what environment.yml's environment runs: the workbench's command, the unit tests of the
#: settings, the estimator and the kernel check, and a Session trained for real
ENV_TESTS = (
    "tests/unit/test_kernel.py",
    "tests/unit/test_config.py",
    "tests/unit/test_estimate.py",
    "tests/integration/test_session.py::test_loss_goes_down_on_tiny_gpt",
)


def test_environment_yml_builds_an_environment_where_the_tests_pass(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """environment.yml built as `conda env create -f environment.yml` builds it, without
    conda (no conda channel is reachable from this machine, only PyPI): its conda part is
    the Python release and pip alone, so the environment is a venv of that release (this
    interpreter's); its `pip:` section is installed as conda installs it, written to a
    requirements file beside environment.yml (a copy of the source tree) and run there with
    `python -m pip install -U -r FILE --exists-action=b` (`NO_COMPILE` beside). torch is this venv's release,
    installed first, as `make install` does on a machine without a GPU (with none, pip
    would take PyPI's default build: CUDA on Linux, which also runs on a CPU). In that
    environment the dependencies are consistent (`pip check`), the workbench's command
    runs, and so do a share of the tests (`ENV_TESTS`); `make test` there builds its own
    .venv from the environment's python3, as CI's does from the machine's."""
    import yaml

    base = tmp_path_factory.mktemp("conda-env")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    spec = yaml.safe_load((source / "environment.yml").read_text())
    deps = spec["dependencies"]
    (python,) = [d.removeprefix("python=") for d in deps if isinstance(d, str) and "=" in d]
    assert python == f"{sys.version_info[0]}.{sys.version_info[1]}", "another Python release"
    assert [d for d in deps if isinstance(d, str)] == [f"python={python}", "pip"]
    (pip_specs,) = [d["pip"] for d in deps if isinstance(d, dict)]
    env_dir = base / "env"
    subprocess.run(
        [str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv", str(env_dir)],
        check=True, timeout=300,
    )  # fmt: skip
    env = _clean_env()
    env["PATH"] = os.pathsep.join([str(env_dir / "bin"), env["PATH"]])  # as `conda activate`
    env["VIRTUAL_ENV"] = str(env_dir)
    py = str(env_dir / "bin" / "python")

    def run(*args: str, cwd: Path = source, timeout: float = 600) -> str:
        result = subprocess.run(
            args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
        )
        assert result.returncode == 0, f"{args}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result.stdout

    try:
        run(py, "-m", "pip", "install", "--quiet", *NO_COMPILE, _torch_requirement(),
            timeout=900)  # fmt: skip
        requirements = source / "condaenv.workbench.requirements.txt"
        requirements.write_text("\n".join(pip_specs))
        run(py, "-m", "pip", "install", "--quiet", *NO_COMPILE, "-U", "-r", requirements.name,
            "--exists-action=b", timeout=1500)  # fmt: skip
        run(py, "-m", "pip", "check")
        out = run(str(env_dir / "bin" / "workbench"), "estimate", "--model", "llama-2-7b")
        assert "peak of a step" in out
        where = run(py, "-c", "import workbench; print(workbench.__file__)")
        assert Path(where.strip()).is_relative_to(source)  # `-e .`: the checkout itself
        out = run(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ENV_TESTS, timeout=900)
        assert re.search(r"\b\d+ passed\b", out) and " failed" not in out, out
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)  # about 2 GB


#: the URL `make lab` prints: the start notebook, with the server's token
LAB_URL = re.compile(
    r"http://127\.0\.0\.1:(\d+)/lab/tree/00_start_here\.ipynb\?token=([0-9a-f]{32,})"
)


def test_make_lab_prints_the_url_with_its_token_and_opens_the_start_notebook(
    tmp_path: Path,
) -> None:
    """`make lab` as this user (root or not): the URL it prints and the one it gives the
    browser ($BROWSER, a recorder here) open notebooks/00_start_here.ipynb with the token."""
    opened = tmp_path / "opened"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" >> {opened}\n')
    browser.chmod(0o755)
    env = {**_clean_env(), "BROWSER": str(browser), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        lab = subprocess.Popen(
            ["make", "--no-print-directory", "lab"], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (match := LAB_URL.search(log.read_text())) or not opened.exists():
            assert lab.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        port, token = match.groups()
        # the browser gets a local redirect page to the same URL
        page = Path(opened.read_text().split()[0].removeprefix("file://")).read_text()
        assert match.group(0) in page
        base = f"http://127.0.0.1:{port}/api/contents/00_start_here.ipynb"
        with urllib.request.urlopen(f"{base}?token={token}", timeout=30) as reply:
            notebook = json.load(reply)
        assert notebook["type"] == "notebook" and notebook["path"] == "00_start_here.ipynb"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base, timeout=30)  # no token: refused
        assert refused.value.code == 403
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)
