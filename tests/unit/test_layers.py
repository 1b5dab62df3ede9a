"""The layering of docs/architecture.md, read from the source: imports point down only, no
import circles, no underscored name imported from another module, and the shipped job
scripts stand alone (they import nothing of workbench but its built-in models)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "workbench"

#: Lowest first; a module may import its own layer and the layers below (the package root,
#: `workbench/__init__.py`, is the public facade over all of them and is left out).
LAYERS: list[tuple[str, ...]] = [
    # 1 leaves
    (
        "inputs",
        "outputs",
        "version",
        "kernel",
        "optimizers",
        "choices",
        "display",
        "problems",
        "spread",
        "rates",
        "rng",
    ),
    ("config", "settings_check", "setting_spec", "estimate", "models", "modelstats"),  # 2 core
    ("prediction", "engines", "deepspeed", "advisor", "monitor", "planner"),  # 3 services
    ("train", "export", "compress", "integrations"),  # 4 engines
    ("cli", "ui"),  # 5 shells
]
SHIPPED = (
    "export/job_checkpoints.py",
    "export/job_common.py",
    "export/job_files.py",
    "export/job_parallel.py",
    "export/train_deepspeed.py",
    "export/train_fsdp.py",
    "export/train_lightning.py",
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every workbench import, including
    those inside functions and `TYPE_CHECKING` blocks."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == "workbench":
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    found.append((full if full in MODULES else module, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found += [
                (a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "workbench"
            ]
    return found


def _layer(module: str) -> int | None:
    rest = module.split(".", 1)[1] if "." in module else ""
    top = rest.split(".")[0]
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    return None


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in MODULES if m != "workbench" and _layer(m) is None)
    assert missing == [], f"add these to LAYERS and docs/architecture.md: {missing}"


def test_imports_point_down_only() -> None:
    upward = []
    for name, path in MODULES.items():
        if name == "workbench":
            continue
        for target, _, line in _imports(name, path):
            if target == "workbench":
                upward.append(f"{path.relative_to(ROOT.parent)}:{line} imports the package root")
            elif (_layer(target) or 0) > (_layer(name) or 0):
                upward.append(
                    f"{path.relative_to(ROOT.parent)}:{line} imports {target} (a higher layer)"
                )
    assert upward == []


def test_no_import_circles() -> None:
    graph = {
        name: {
            t for t, _, _ in _imports(name, path) if t in MODULES and t != name and t != "workbench"
        }
        for name, path in MODULES.items()
        if name != "workbench"
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_no_private_name_is_imported_from_another_module() -> None:
    private = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {imported} from {target}"
        for name, path in MODULES.items()
        for target, imported, line in _imports(name, path)
        if imported.startswith("_") and not imported.startswith("__")
    ]
    assert private == []


@pytest.mark.parametrize("script", SHIPPED)
def test_the_shipped_job_scripts_stand_alone(script: str) -> None:
    path = ROOT / script
    name = "workbench." + script.removesuffix(".py").replace("/", ".")
    allowed = (
        "workbench.export.job_checkpoints",
        "workbench.export.job_common",
        "workbench.export.job_files",
        "workbench.export.job_parallel",
        "workbench.models",
    )
    used = sorted({t for t, _, _ in _imports(name, path) if not t.startswith(allowed)})
    assert used == [], f"{script} needs more of workbench than its built-in models: {used}"


MAX_LINES = 900


def test_no_module_is_past_900_lines() -> None:
    """docs/architecture.md: "none past 900" lines (one concept per file)."""
    long = {
        str(path.relative_to(ROOT.parent)): n
        for path in ROOT.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
