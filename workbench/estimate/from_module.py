"""`estimate_memory(model=module)`: the parameter count of a torch module, without
allocating it.

The only part of `workbench.estimate` that touches torch, and only when called: the
import is inside `module_facts`, so `import workbench.estimate` stays torch-free.

* an `nn.Module` instance is counted as it is (`workbench.count_parameters`: shared
  weights once; a module already on the `meta` device costs no memory);
* a class or zero-argument factory (`lambda: MyModel(cfg)`,
  `functools.partial(AutoModelForCausalLM.from_config, config)`) is built under
  `torch.device("meta")`, so its parameters have shapes but no storage, then counted.

A module with a Hugging Face `config` whose `model_type` is a supported family also gives
its transformer shape (`hf_config.read_hf_config`), so activations are estimated too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.estimate.hf_config import FAMILIES, read_hf_config
from workbench.estimate.problems import Problem


def module_facts(model: Any) -> tuple[int | None, str, dict[str, Any], list[Problem]]:
    """(parameter count, the model's type name, architecture fields from its config,
    problems) for an `nn.Module` or a callable that builds one."""
    try:
        import torch
    except ImportError:
        return (
            None,
            type(model).__name__,
            {},
            [Problem("model", model, "a module needs torch installed (pip install torch)")],
        )
    from workbench.modelstats import count_parameters

    module: Any = model
    if not isinstance(model, torch.nn.Module):
        if not callable(model):
            return None, type(model).__name__, {}, [_not_a_model(model)]
        builder: Callable[[], Any] = model
        try:
            with torch.device("meta"):
                module = builder()
        except Exception as exc:  # the user's constructor: report, do not crash
            msg = " ".join(f"{type(exc).__name__}: {exc}".split())
            return (
                None,
                _name(model),
                {},
                [Problem("model", _name(model), f"building failed: {msg}")],
            )
        if not isinstance(module, torch.nn.Module):
            return None, _name(model), {}, [_not_a_model(model)]
    n = count_parameters(module)
    fields: dict[str, Any] = {}
    config = getattr(module, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if isinstance(data, dict) and data.get("model_type") in FAMILIES:
            fields, problems = read_hf_config(data, field="model")
            if problems:
                fields = {}
    return n, type(module).__name__, fields, []


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _not_a_model(model: Any) -> Problem:
    return Problem(
        "model",
        model if isinstance(model, (str, int, float)) else _name(model),
        "must be a model name, an Architecture, a torch nn.Module or a function that builds one",
    )
