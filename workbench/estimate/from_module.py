"""`estimate_memory(model=module)`: the parameter count of a torch module, without
allocating it.

The only part of `workbench.estimate` that touches torch, and only when called: the
import is inside `module_facts`, so `import workbench.estimate` stays torch-free.

Its trainable parameters' shapes come with the count (`ModelFacts.parameter_shapes`: a
factored optimizer's states follow them).

* an `nn.Module` instance is counted as it is (`workbench.count_parameters`: shared
  weights once; a module already on the `meta` device costs no memory);
* a class or zero-argument factory (`lambda: MyModel(cfg)`,
  `functools.partial(AutoModelForCausalLM.from_config, config)`) is built under
  `torch.device("meta")`, so its parameters have shapes but no storage, then counted.

A module with a Hugging Face `config` (a `transformers` model of any family) also gives
its transformer shape where its family maps onto the activation formula's terms
(`hf_build.module_config_facts`, by way of `hf_shape`), so activations are estimated too;
where it does not (an encoder-decoder, multi-head latent attention, ...) the facts say why
(`activation_note`). A mixture of experts gives its active parameters (the count less the
experts a token is not routed to).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from workbench.estimate.hf_build import (
    ModelFacts,
    active_from_experts,
    module_config_facts,
    routed_expert_params,
)
from workbench.estimate.problems import Problem


def module_facts(model: Any) -> ModelFacts:
    """The parameter count, the model's type name, the architecture fields from its
    config, its active parameters, why activations are not estimated (when they are not)
    and the problems, for an `nn.Module` or a callable that builds one."""
    try:
        import torch
    except ImportError:
        problem = Problem("model", model, "a module needs torch installed (pip install torch)")
        return ModelFacts(None, type(model).__name__, {}, None, None, [problem])
    from workbench.modelstats import count_parameters, parameter_shapes

    module: Any = model
    if not isinstance(model, torch.nn.Module):
        if not callable(model):
            return ModelFacts(None, type(model).__name__, {}, None, None, [_not_a_model(model)])
        builder: Callable[[], Any] = model
        try:
            with torch.device("meta"):
                module = builder()
        except Exception as exc:  # the user's constructor: report, do not crash
            msg = " ".join(f"{type(exc).__name__}: {exc}".split())
            problem = Problem("model", _name(model), f"building failed: {msg}")
            return ModelFacts(None, _name(model), {}, None, None, [problem])
        if not isinstance(module, torch.nn.Module):
            return ModelFacts(None, _name(model), {}, None, None, [_not_a_model(model)])
    n = count_parameters(module)
    shapes = parameter_shapes(module)
    fields: dict[str, Any] = {}
    # without a config, a module with experts does not say how many a token uses: None
    active = active_from_experts(n, routed_expert_params(module), {})
    note: str | None = None
    act_note: str | None = None  # an MLP activation function the estimator does not know
    read: str | None = None  # a multimodal model's language model
    config = getattr(module, "config", None)
    if callable(getattr(config, "to_dict", None)) and isinstance(
        getattr(config, "model_type", None), str
    ):
        try:
            fields, active, note, act_note, read = module_config_facts(module, n)
        except Exception as exc:  # a config that cannot describe itself: count only
            msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            note = f"activations not estimated: its config could not be read ({msg})"
    return ModelFacts(
        n,
        type(module).__name__,
        fields,
        active,
        note,
        [],
        shapes,
        training=_training_of(module),
        activation_function_note=act_note,
        shape_note=read,
    )


def _training_of(module: Any) -> dict[str, Any] | None:
    """The dropout and attention kernel the built module's Hugging Face config says it
    trains with (a module given or built by a function alike); None without one."""
    from workbench.estimate.hf_shape import language_model, training_facts

    config = getattr(module, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    try:
        data = to_dict()
    except Exception:  # a config that cannot describe itself says nothing
        return None
    kernel = getattr(config, "_attn_implementation", None)
    return training_facts(language_model(data), kernel) if isinstance(data, Mapping) else None


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _not_a_model(model: Any) -> Problem:
    return Problem(
        "model",
        model if isinstance(model, (str, int, float)) else _name(model),
        "must be a model name, an Architecture, a torch nn.Module or a function that builds one",
    )
