"""Model specs: a built-in name ("tiny-gpt", "mlp", "cnn") or a factory "pkg.module:function".

A factory is imported the way `python -m` would find it: the current folder comes first on
`sys.path`, so `workbench launch --model mymodels:cnn` works in the folder that holds
`mymodels.py`. It is called with the model options as keyword arguments and returns what
`workbench.models.build_model` returns, `(module, dataset, loss_fn[, info])`; `loss_fn` may
be None when the dataset yields mappings and the model returns its own `.loss`.

A factory is code, so only the user chooses one: a spec given in this call (an argument, a
flag) is honoured, but a spec *read from a file* (a checkpoint, a job.json, a rung file, a
config) is refused by `factory_from_file` unless the caller marks that file trusted
(`trusted=True`, `--trust-model-spec`); then a warning says exactly what is imported and
called. Built-in names read from a file are data and always allowed.

A spec that names no model is a `SettingProblem` naming `model` (`spec_problems`), raised in
a `ConfigError`: each caller words it from that data.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.inputs import shown
from workbench.problems import ConfigError, SettingProblem

FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_factory(model: str) -> bool:
    return ":" in model


def _with_cwd_on_path() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def spec_problems(model: Any, *, importable: bool = True) -> list[SettingProblem]:
    """What is wrong with a model spec (empty when it is usable), as problems of `model`.
    `importable`: also check that a factory's module can be found (from the current folder
    too)."""
    from workbench.models import MODEL_NAMES

    if not isinstance(model, str) or not model:
        return [
            SettingProblem(
                "model",
                model,
                f"must be a built-in model name ({', '.join(MODEL_NAMES)}) or an importable "
                "factory 'pkg.module:function'",
            )
        ]
    if is_factory(model):
        if not FACTORY.match(model):
            return [
                SettingProblem(
                    "model",
                    model,
                    "a factory must be written 'pkg.module:function' (dotted module path, a "
                    "colon, a function name)",
                )
            ]
        if importable:
            module = model.partition(":")[0]
            _with_cwd_on_path()
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return [
                    SettingProblem(
                        "model",
                        model,
                        f"module {shown(module, 1000)} is not importable from {os.getcwd()} or sys.path",
                    )
                ]
        return []
    if model not in MODEL_NAMES:
        return [
            SettingProblem(
                "model",
                model,
                f"must be one of {', '.join(MODEL_NAMES)} or a factory 'pkg.module:function'",
            )
        ]
    return []


def load_factory(spec: str) -> Callable[..., Any]:
    """The factory function named by 'pkg.module:function' (the current folder on the
    path); ConfigError naming `model` when there is none."""
    problems = spec_problems(spec)
    if problems:
        raise ConfigError(problems)
    module, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ConfigError([SettingProblem("model", spec, f"{module} has no callable {attr}")])
    return fn  # type: ignore[no-any-return]


class UntrustedSpecError(ValueError):
    """A file names a factory (code to import and run) and the caller did not trust it.
    `spec` is the factory, `source` the file."""

    def __init__(self, spec: str, source: str, trust_hint: str) -> None:
        self.spec = spec
        self.source = source
        module, _, function = spec.partition(":")
        super().__init__(
            f"model={shown(spec, 1000)} in {source}: names Python code to import and run (module "
            f"{shown(module, 1000)}, function {shown(function)}); a file cannot choose code to run, so it is "
            f"not imported. Name the model yourself, or, if you trust this file, "
            f"{trust_hint}"
        )


def importable_origin(spec: str) -> str:
    """Where the module of a factory spec would be imported from (a path, or a note)."""
    module = spec.partition(":")[0]
    _with_cwd_on_path()
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        return "not importable here"
    return str(found.origin or "a namespace package")


def factory_from_file(
    spec: Any,
    *,
    source: str,
    trusted: bool = False,
    trust_hint: str = "pass trusted=True",
) -> Callable[..., Any] | None:
    """The factory a file names, when the user trusts the file; None for a built-in name.

    `spec` was read from `source` (a path, named in the messages). A factory spec is
    refused with `UntrustedSpecError` unless `trusted`; a trusted one is imported after a
    warning on the "workbench" logger naming the module, where it is imported from, and
    the function that will be called. ValueError for a spec that is no model at all.
    """
    problems = spec_problems(spec, importable=False)
    if problems:
        raise ValueError(f"{source}: {problems[0]}")  # the file's content, named with it
    if not is_factory(spec):
        return None
    if not trusted:
        raise UntrustedSpecError(spec, source, trust_hint)
    module, _, function = spec.partition(":")
    logging.getLogger("workbench").warning(
        "trusting %s: importing module %r (%s) and calling %s(**options)",
        source,
        module,
        importable_origin(spec),
        function,
    )
    return load_factory(spec)


def build_from_spec(model: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Session keyword arguments (`model`, and `data`/`loss_fn` for a factory) for a spec."""
    options = dict(options or {})
    if not is_factory(model):
        problems = spec_problems(model)
        if problems:
            raise ConfigError(problems)
        return {"model": model, "model_options": options or None}
    made = load_factory(model)(**options)
    if not isinstance(made, (tuple, list)) or len(made) not in (3, 4):
        raise ConfigError(
            [
                SettingProblem(
                    "model",
                    model,
                    "the factory must return (module, dataset, loss_fn[, info]), got "
                    f"{type(made).__name__}",
                )
            ]
        )
    return {"model": made[0], "data": made[1], "loss_fn": made[2]}


@dataclass
class ResolvedModel:
    """What a Session trains: the module, its data and loss, and for a built-in model its
    name, options and shape facts (`workbench.models.ModelInfo`)."""

    module: Any
    data: Any
    loss_fn: Any
    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    info: Any | None = None


def documents_problem(
    documents: str, model: Any, data: Any, loss_fn: Any, model_options: dict[str, Any] | None
) -> SettingProblem | None:
    """Why `documents` (`TrainConfig.documents`) cannot apply to this model and data (None
    when it can): a layout other than "stream" is the built-in tiny-gpt's own text data
    (its documents, its end-of-document token, its mask-aware attention), so it needs
    model "tiny-gpt" with its own data and loss; and tiny-gpt's `documents` option, when
    given, must say the same."""
    options = model_options or {}
    given = options["documents"] if model == "tiny-gpt" and "documents" in options else None
    if given is not None and given != documents:
        return SettingProblem(
            "documents",
            documents,
            f"tiny-gpt's model option documents={shown(given)} says otherwise; set the layout in "
            "`documents` only",
        )
    if documents == "stream":
        return None
    if model != "tiny-gpt":
        what = f"model {shown(model)}" if isinstance(model, str) else "your own module"
        return SettingProblem(
            "documents",
            documents,
            f"lays out the built-in tiny-gpt's text data; {what} has its own data (pack or pad "
            "it in your Dataset); use 'stream'",
        )
    if data is not None or loss_fn is not None:
        return SettingProblem(
            "documents",
            documents,
            "lays out tiny-gpt's own text data, and this session is given its own `data` / "
            "`loss_fn`; leave them out or use 'stream'",
        )
    return None


def builtin_options(
    model_options: dict[str, Any] | None, *, seed: int, documents: str
) -> dict[str, Any]:
    """The options a built-in model is built with: `model_options`, seeded from `seed`
    unless they say otherwise, and tiny-gpt's `documents` from `TrainConfig.documents`."""
    opts = dict(model_options or {})
    opts.setdefault("seed", int(seed))
    if documents != "stream":
        opts["documents"] = documents
    return opts


def resolve_model(
    model: Any,
    *,
    data: Any = None,
    loss_fn: Any = None,
    model_options: dict[str, Any] | None = None,
    seed: int = 0,
    documents: str = "stream",
) -> ResolvedModel:
    """A Session's `model=` argument resolved: a built-in name (built with `model_options`,
    seeded from `seed` unless the options say otherwise; `data` and `loss_fn` default to
    the built-in's) or your `nn.Module` (then `data` is required). ValueError naming the
    argument for anything else. `documents` (`TrainConfig.documents`) other than "stream"
    becomes tiny-gpt's `documents` option; a ConfigError naming `documents` for any other
    model or data (`documents_problem`)."""
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    if model_options is not None and (
        not isinstance(model_options, dict) or not all(isinstance(k, str) for k in model_options)
    ):
        raise ConfigError(
            [
                SettingProblem(
                    "model_options",
                    model_options,
                    "must be a dict of option names to values (or None for the defaults)",
                )
            ]
        )
    problem = documents_problem(documents, model, data, loss_fn, model_options)
    if problem is not None:
        raise ConfigError([problem])
    if isinstance(model, str):
        from workbench.models import build_model

        opts = builtin_options(model_options, seed=seed, documents=documents)
        module, dataset, builtin_loss, info = build_model(model, **opts)
        resolved = ResolvedModel(
            module,
            dataset if data is None else data,
            builtin_loss if loss_fn is None else loss_fn,
            name=model,
            options=opts,
            info=info,
        )
    elif isinstance(model, nn.Module):
        if model_options:
            raise ValueError("model_options: apply only to a built-in model name")
        if data is None:
            raise ValueError(
                "data=None: required with your own nn.Module (a Dataset or DataLoader of "
                "(inputs, targets) pairs with loss_fn(outputs, targets), or of mappings of "
                "the model's keyword arguments such as {'input_ids', 'labels'})"
            )
        resolved = ResolvedModel(model, data, loss_fn)
    else:
        raise ValueError(
            f"model={shown(model)}: must be a built-in model name (tiny-gpt, mlp, cnn) or a "
            "torch.nn.Module"
        )
    if not isinstance(resolved.data, (Dataset, DataLoader)):
        raise ValueError(f"data={shown(resolved.data)}: must be a torch Dataset or DataLoader")
    if resolved.loss_fn is not None and not callable(resolved.loss_fn):
        raise ValueError(
            f"loss_fn={shown(resolved.loss_fn)}: must be callable(outputs, targets), or None when "
            "the model returns its own .loss"
        )
    return resolved
