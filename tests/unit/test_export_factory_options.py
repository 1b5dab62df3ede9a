"""An export checks a factory model's options against its function's parameters as the
source declares them, without importing or running the user's module (the job does that);
where the source does not say for certain, nothing is refused."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from workbench.config import TrainConfig
from workbench.export import ExportError, export_job
from workbench.models.factory_source import factory_parameters

#: a factory module whose import leaves a mark: an export must never run it
BODY = """
from pathlib import Path

Path(__file__).with_name("imported").write_text("ran")


{function}
"""

MAKE = """def make(width, depth=2, *, act="tanh"):
    raise AssertionError("an export never calls the factory")
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder the export runs in (on the import path, as `workbench export` puts it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the export puts the folder first
    return tmp_path


def _module(folder: Path, name: str, function: str = MAKE) -> Path:
    path = folder / f"{name}.py"
    path.write_text(BODY.format(function=function))
    importlib.invalidate_caches()
    return path


def _export(folder: Path, model: str, options: dict[str, object], out: str = "job") -> object:
    return export_job(
        TrainConfig(), gpus=1, out_dir=folder / out, model=model, model_options=options
    )


def _refused(folder: Path, model: str, options: dict[str, object]) -> str:
    job = folder / "job"
    before = sorted(p.name for p in job.iterdir()) if job.exists() else None
    with pytest.raises(ExportError) as caught:
        _export(folder, model, options)
    assert (sorted(p.name for p in job.iterdir()) if job.exists() else None) == before
    return str(caught.value)


def test_an_option_the_factory_does_not_take_is_refused_naming_what_it_takes(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.cli import main

    path = _module(here, "typo_models")
    text = _refused(here, "typo_models:make", {"width": 4, "widht": 5})
    assert (
        f"model_options widht: unknown for 'typo_models:make'; make() in {path}, line 7 takes "
        "width, depth, act" in text
    )
    with pytest.raises(SystemExit) as exited:
        main(["export", "--model", "typo_models:make", "--model-option", "widht=5"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--model-option widht: unknown for 'typo_models:make'; make() in " in err
    assert "--model-option width: needed by 'typo_models:make': make() in " in err
    assert "has no default for it; give it as a model option" in err
    assert not (here / "imported").exists() and "typo_models" not in sys.modules
    _export(here, "typo_models:make", {"width": 4, "act": "relu"})  # what it takes: exported
    assert not (here / "imported").exists()


def test_a_parameter_without_a_default_must_be_given(here: Path) -> None:
    path = _module(here, "needs_models")
    text = _refused(here, "needs_models:make", {"depth": 3})
    assert (
        f"model_options width: needed by 'needs_models:make': make() in {path}, line 7 has no "
        "default for it; give it as a model option" in text
    )
    _module(here, "positional_models", "def make(width, /, depth=2):\n    pass\n")
    text = _refused(here, "positional_models:make", {"width": 3})
    assert "model='positional_models:make': make() in " in text
    assert "has positional-only parameters without a default (width); the job calls it as " in text
    assert "model_options width: unknown for 'positional_models:make'" in text  # not by keyword
    assert not (here / "imported").exists()


def test_the_job_folders_copy_is_read_as_the_job_imports_it(here: Path) -> None:
    (here / "job").mkdir()  # the factory lies in the job folder only
    path = _module(here / "job", "folder_models", "def make(width=4):\n    pass\n")
    text = _refused(here, "folder_models:make", {"depth": 2}).replace(str(path), "PATH")
    assert "model_options depth: unknown for 'folder_models:make'; make() in PATH, line 7" in text
    package = here / "factory_pkg"  # a package's module: the package found, the module not run
    package.mkdir()
    (package / "__init__.py").write_text("")
    path = _module(package, "mod", "def make(**options):\n    pass\n")
    _export(here, "factory_pkg.mod:make", {"anything": 1}, out="pkg-job")  # **options: any name
    params = factory_parameters("factory_pkg.mod:make")
    assert params is not None and params.any_keyword and params.path == str(path)
    assert not (package / "imported").exists() and "factory_pkg.mod" not in sys.modules


@pytest.mark.parametrize(
    "function",
    [
        "import functools\n\n\n@functools.lru_cache\ndef make(width=4):\n    pass\n",
        "def make(width=4):\n    pass\n\n\nmake = lambda **kw: kw\n",
        "from os.path import join as make\n",
        "class make:\n    def __init__(self, width=4):\n        pass\n",
        "def make(width=4):\n    pass\n\n\nglobals()['make'] = print\n",
        "def make(width=4):\n    pass\n\n\nfrom os.path import *\n",
        "if True:\n    def make(width=4):\n        pass\n",
        "async def make(width=4):\n    pass\n",
        "def make(width=4):\n    pass\n\nthis is no python\n",
    ],
    ids=[
        "decorated", "rebound", "imported", "a-class", "globals", "star-import", "in-a-block",
        "async", "no-parse",
    ],
)  # fmt: skip
def test_what_the_source_does_not_say_for_certain_is_not_checked(function: str, here: Path) -> None:
    _module(here, "vague_models", function)
    assert factory_parameters("vague_models:make") is None
    _export(here, "vague_models:make", {"colour": "red"})  # the job says what it says
    assert not (here / "imported").exists()
