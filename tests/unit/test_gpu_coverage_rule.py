"""The rule of the GPU run: every CUDA path of the package has a section of
`benchmarks/gpu_check.py` or a `gpu`-marked test that runs it on a GPU. The paths are
read from the package's own rows (every engine of workbench/engines.py, every optimizer
of workbench/optimizers.py a Session trains, every technique module of
workbench/train/techniques/); gpu_check's `COVERAGE` names what runs each, and this test
fails when one has neither, when a name is not a real section or gpu test, or when one is
left out for anything but the one reason a lent machine cannot run it (one GPU)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_check


def _is_gpu_mark(node: ast.expr) -> bool:
    return ast.unparse(node).replace(" ", "") in ("pytest.mark.gpu", "mark.gpu")


def gpu_tests() -> set[str]:
    """Every `gpu`-marked test under tests/, as "tests/...py::name" (a mark on the
    function, or a module's `pytestmark`)."""
    found: set[str] = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)
            and "pytest.mark.gpu" in ast.unparse(n.value)
            for n in tree.body
        )
        rel = path.relative_to(ROOT).as_posix()
        for node in tree.body:
            is_test = isinstance(node, ast.FunctionDef) and node.name.startswith("test")
            if is_test and (module_marked or any(_is_gpu_mark(d) for d in node.decorator_list)):
                found.add(f"{rel}::{node.name}")
    return found


def cuda_paths() -> set[str]:
    """The package's CUDA paths, from its own rows."""
    from workbench.engines import ENGINES
    from workbench.optimizers import OPTIMIZERS

    paths = {f"engine:{getattr(e, 'value', e)}" for e in ENGINES}
    paths |= {f"optimizer:{row.name}" for row in OPTIMIZERS if row.engines}
    techniques = ROOT / "workbench" / "train" / "techniques"
    paths |= {f"technique:{p.stem}" for p in techniques.glob("*.py") if p.stem != "__init__"}
    return paths


def rule_problems(
    paths: set[str],
    coverage: Mapping[str, tuple[str, ...]],
    left_out: Mapping[str, str],
    sections: set[str],
    tests: set[str],
    one_gpu_reason: str,
) -> list[str]:
    """What breaks the rule, each said in one line (empty: it holds)."""
    problems = [
        f"{p}: no gpu_check section and no gpu-marked test (add one, name it in COVERAGE)"
        for p in sorted(paths - set(coverage) - set(left_out))
    ]
    for key, names in coverage.items():
        if key not in paths:
            problems.append(f"COVERAGE[{key!r}]: no such engine, optimizer or technique")
        if not names:
            problems.append(f"COVERAGE[{key!r}]: names nothing")
        for name in names:
            if name not in sections and name not in tests:
                problems.append(f"COVERAGE[{key!r}]: {name!r} is no section nor gpu test")
    for key, why in left_out.items():
        if key not in paths:
            problems.append(f"LEFT_OUT[{key!r}]: no such engine, optimizer or technique")
        if why != one_gpu_reason:
            problems.append(f"LEFT_OUT[{key!r}]: {why!r} (only the one-GPU limit leaves out)")
    return problems


def test_every_cuda_path_has_a_section_or_a_gpu_test() -> None:
    check = _gpu_check()
    tests = gpu_tests()
    assert len(tests) >= 10  # the marked tests are found
    problems = rule_problems(
        cuda_paths(), check.COVERAGE, check.LEFT_OUT, set(check.SECTIONS), tests,
        check.NCCL_ONE_GPU,
    )  # fmt: skip
    assert problems == []


def test_the_rule_fails_for_a_path_with_neither() -> None:
    """A new engine, optimizer or technique with no section and no gpu test, a name that
    is no section, and a left-out path for another reason are each refused."""
    check = _gpu_check()
    sections, tests = set(check.SECTIONS), gpu_tests()
    paths = cuda_paths() | {"optimizer:newopt", "technique:newtech"}
    coverage = {**check.COVERAGE, "engine:plain": ("no-such-section",)}
    left_out = {**check.LEFT_OUT, "engine:fsdp": "too slow"}
    problems = rule_problems(paths, coverage, left_out, sections, tests, check.NCCL_ONE_GPU)
    assert problems == [
        "optimizer:newopt: no gpu_check section and no gpu-marked test (add one, name it in "
        "COVERAGE)",
        "technique:newtech: no gpu_check section and no gpu-marked test (add one, name it in "
        "COVERAGE)",
        "COVERAGE['engine:plain']: 'no-such-section' is no section nor gpu test",
        "LEFT_OUT['engine:fsdp']: 'too slow' (only the one-GPU limit leaves out)",
    ]


def test_the_docs_state_the_rule() -> None:
    doc = " ".join((_gpu_check().__doc__ or "").split())
    assert "adds its section here or a `gpu`-marked test in the same change" in doc
    gpu_md = " ".join((ROOT / "docs" / "gpu.md").read_text().split())
    assert "adds its section to gpu_check or a `gpu`-marked test in the same change" in gpu_md
    assert "NCCL refuses two ranks on one GPU" in gpu_md
