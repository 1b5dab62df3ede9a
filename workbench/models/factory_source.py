"""A factory's parameters as its module's source declares them: read with `ast`, never
imported or run.

An export checks a factory `"pkg.module:function"` without running it (the job runs it), so
what it can know is what the source says: `factory_parameters` finds the module's file (the
job folder's copy first, as the job imports it, else where `importlib.util.find_spec` finds
it: for `pkg.module` that imports `pkg`, which `models.spec.spec_problems` has already done)
and reads the function's parameters. It answers only when the source says for certain: one
binding of the name in the whole module, a plain `def` at its top level, undecorated, and no
`globals()`, `exec` or `eval` that could rebind it; anything else (a re-export, a class, a
decorated or dynamically made function, a file that does not parse here, a compiled module)
is None, and nothing is checked.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from workbench.inputs import InputFileError, read_text

#: The largest module source read (a factory's module is a few KiB).
MAX_SOURCE_BYTES = 4 * 1024 * 1024
#: Names whose use could rebind the function where `ast` does not see it.
_DYNAMIC = frozenset({"globals", "exec", "eval"})


@dataclass(frozen=True)
class FactoryParameters:
    """The parameters of a factory's function (the job calls it as `function(**options)`).

    `keywords`: the names an option may take (positional-or-keyword and keyword-only);
    `required`: those of them without a default; `positional_only`: positional-only
    parameters without a default (no call by keywords gives them); `any_keyword`: it takes
    `**kwargs`; `path` and `line`: where the function is defined."""

    function: str
    path: str
    line: int
    keywords: tuple[str, ...]
    required: tuple[str, ...]
    positional_only: tuple[str, ...]
    any_keyword: bool


def module_source(spec: str, folder: str | os.PathLike[str] | None = None) -> Path | None:
    """The `.py` file of the factory's module: in `folder` when its top-level package or
    module lies there (the job's folder, which the job imports from first), else where
    `find_spec` finds it; None when there is none or it is not Python source."""
    module = spec.partition(":")[0]
    parts = module.split(".")
    if folder is not None:
        base = Path(folder).expanduser()
        if (base / f"{parts[0]}.py").is_file() or (base / parts[0]).is_dir():
            for candidate in (
                base.joinpath(*parts[:-1], f"{parts[-1]}.py"),
                base.joinpath(*parts, "__init__.py"),
            ):
                if candidate.is_file():
                    return candidate
            return None
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = None if found is None else found.origin
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        return None
    return Path(origin)


def factory_parameters(
    spec: str, folder: str | os.PathLike[str] | None = None
) -> FactoryParameters | None:
    """The parameters of the factory `spec` ("pkg.module:function") read from its source
    (see the module docstring); None when the source does not say for certain."""
    function = spec.partition(":")[2]
    path = module_source(spec, folder)
    if path is None:
        return None
    try:
        tree = ast.parse(read_text(path, what="model", max_bytes=MAX_SOURCE_BYTES), str(path))
    except (InputFileError, SyntaxError, ValueError, RecursionError, MemoryError, OSError):
        return None
    bindings = _bindings(tree, function)
    if len(bindings) != 1:
        return None
    node = bindings[0]
    if not isinstance(node, ast.FunctionDef) or node not in tree.body or node.decorator_list:
        return None
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    without_default = {a.arg for a in positional[: len(positional) - len(args.defaults)]}
    without_default |= {
        a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None
    }
    keywords = tuple(a.arg for a in (*args.args, *args.kwonlyargs))
    return FactoryParameters(
        function=function,
        path=str(path),
        line=node.lineno,
        keywords=keywords,
        required=tuple(k for k in keywords if k in without_default),
        positional_only=tuple(a.arg for a in args.posonlyargs if a.arg in without_default),
        any_keyword=args.kwarg is not None,
    )


def _bindings(tree: ast.Module, name: str) -> list[ast.AST]:
    """Every node of `tree` that binds `name` anywhere (or could, where `ast` cannot tell:
    a star import, `globals()`, `exec`, `eval`)."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = node.name == name
        elif isinstance(node, ast.Name):
            bound = (node.id == name and not isinstance(node.ctx, ast.Load)) or node.id in _DYNAMIC
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = any(
                a.name == "*" or (a.asname or a.name.split(".")[0]) == name for a in node.names
            )
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound = name in node.names
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            bound = node.name == name
        elif isinstance(node, ast.MatchMapping):
            bound = node.rest == name
        else:
            bound = False
        if bound:
            found.append(node)
    return found


__all__ = ["FactoryParameters", "factory_parameters", "module_source"]
