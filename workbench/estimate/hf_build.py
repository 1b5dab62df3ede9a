"""A Hugging Face config.json of any family -> its exact parameter count and its shape.

`config_facts(source)` answers `estimate_memory(hf_config=...)`:

* a config of one of `hf_config.FAMILIES` is read without torch or transformers
  (`hf_config.read_family`): the count is the shape's, identical to the built model's;
* any other `model_type` the installed `transformers` knows (and a config of those
  families whose layers the pure reader does not describe) is built: its config class
  reads the dict (`from_dict`, never from the Hub), the model class is transformers' own
  for that `model_type` (`AutoModelForCausalLM`; `AutoModelForSeq2SeqLM` for an
  encoder-decoder such as t5, `AutoModelForSpeechSeq2Seq` for whisper,
  `AutoModelForMaskedLM` for an encoder such as bert; `AutoModel` where none of those
  exists) and it is built under `torch.device("meta")`,
  so its parameters have shapes but no storage, then counted by
  `workbench.modelstats.count_parameters` (shared weights once). The shape comes from
  `hf_shape.family_shape`; a family it does not map gets the count and a `note` saying why
  activations are not estimated. A mixture of experts also gives `active_params`: the
  count less the experts a token is not routed to (`active_from_experts`).

Nothing in a config chooses code to run: a config with an `auto_map` (custom code to
import, at any depth) is refused naming the key, `trust_remote_code` is never set, and
the keys that only pick kernels or load-time quantization (`attn_implementation`,
`quantization_config`) are left out, since they change no parameter. torch and
transformers are imported only when a model is built, and each built config is kept
(`functools.lru_cache`, per content) so that asking again costs nothing; building takes
about a second the first time transformers builds anything in a process and tens of
milliseconds after (Mixtral-8x7B, DeepSeek-V3).

Bad input is a `Problem` naming `field` and the key or model_type: a `model_type`
transformers does not know, values of the wrong type or out of range, a config its
class refuses, a build that raises (the exception's text is quoted, never a traceback),
more than `MAX_BUILD_LAYERS` layers, more than 10^16 parameters.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from workbench.estimate.activation_functions import TRANSFORMERS_NAMES, activation_key
from workbench.estimate.architecture import Architecture, build_architecture
from workbench.estimate.hf_config import (
    FAMILIES,
    HEAD_DIM,
    config_dtype,
    config_flag,
    config_integer,
    family_key,
    load_config,
    read_family,
)
from workbench.estimate.hf_shape import (
    MAPPED_FAMILIES,
    STANDARD_KEYS,
    experts_and_top_k,
    family_shape,
    language_model,
    no_activations,
)
from workbench.estimate.limits import LIMITS, as_bool, check_number
from workbench.estimate.problems import Problem
from workbench.inputs import shown

#: The deepest model built: each layer takes about a millisecond to build on the meta
#: device, and the deepest models trained have about 10^2 layers.
MAX_BUILD_LAYERS = 4096

#: Config keys that choose kernels or load-time quantization, not parameters.
_LEFT_OUT = (
    "attn_implementation",
    "_attn_implementation",
    "_attn_implementation_internal",
    "quantization_config",
)
#: Keys that count layers (the depth limit), under the names families give them.
_LAYER_KEYS = (
    "num_hidden_layers",
    "num_layers",
    "num_decoder_layers",
    "encoder_layers",
    "decoder_layers",
    "n_layer",
    "n_layers",
)
#: The standard integer keys checked before a config is built, with their estimator ranges.
_CHECKED = (
    ("num_hidden_layers", "layers"),
    ("hidden_size", "hidden"),
    ("num_attention_heads", "heads"),
    ("num_key_value_heads", "kv_heads"),
    ("intermediate_size", "ffn_hidden"),
    ("vocab_size", "vocab"),
    ("max_position_embeddings", "seq_len"),
    ("head_dim", "head_dim"),
)


class ModelFacts(NamedTuple):
    """What a config (or a module) says about the model.

    `counted` is the parameter count of the built module (None: the shape's count is
    exact), `name` the class built, `fields` the `Architecture` fields ({} without a
    shape), `active_params` the parameters one token uses (a mixture of experts; the
    count for a dense model; None where not known), `activation_note` why there is no
    shape (`no_shape_reason` its reason alone), `problems` what is wrong (then the rest is
    empty), `parameter_shapes` a module's trainable parameters' shapes (None where not
    read)."""

    counted: int | None
    name: str | None
    fields: dict[str, Any]
    active_params: int | None
    activation_note: str | None
    problems: list[Problem]
    parameter_shapes: tuple[tuple[int, ...], ...] | None = None
    no_shape_reason: str | None = None  # `activation_note`'s reason alone
    #: what a built module's own config says of its training (`hf_shape.training_facts`:
    #: dropout, attention kernel); None where not read
    training: dict[str, Any] | None = None
    #: the shape's assumption where the config names an MLP activation function the
    #: estimator does not know (`activation_functions.unknown_note`)
    activation_function_note: str | None = None
    #: where the shape comes from when it is not the config's own top level (a multimodal
    #: model's language model, `text_config`)
    shape_note: str | None = None

    def architecture(self) -> Architecture | None:
        """The shape as an `Architecture` (None without one, or when its fields do not
        make one): `estimate_memory(model=facts.architecture(), n_params=facts.counted)`
        estimates the model the facts describe."""
        arch, _ = build_architecture(self.fields) if self.fields else (None, [])
        return arch


def _failed(*problems: Problem) -> ModelFacts:
    return ModelFacts(None, None, {}, None, None, list(problems))


def config_facts(
    source: Any, field: str = "hf_config", overrides: Mapping[str, Any] | None = None
) -> ModelFacts:
    """The facts of the config.json at `source` (a path, its folder or a loaded dict);
    see the module docstring. `source` is never changed. `overrides` are the estimator's
    shape keywords given with it (`layers=8`): a config counted by building its model is
    built with them set at the family's keys (`override_config`); one of the five families
    read without building takes them in its shape, which counts itself."""
    config, where, problem = load_config(source, field)
    if problem is not None:
        return _failed(problem)
    assert config is not None
    code = _custom_code(config)
    if code is not None:
        message = (
            f"{code} names custom code to import; a config is read as data and nothing in "
            "it chooses code to run: remove the key (the model is then built by transformers' "
            "own class for its model_type)"
        )
        return _failed(Problem(field, where, message))
    _, dtype_problem = config_dtype(config)
    if dtype_problem is not None:
        return _failed(Problem(field, where, dtype_problem))
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.strip():
        message = (
            f"model_type {shown(model_type)} is not supported; supported: "
            f"{', '.join(FAMILIES)} and any model type of the installed transformers"
        )
        return _failed(Problem(field, where, message))
    unsupported: list[str] = []
    if model_type in FAMILIES:
        read = read_family(config, model_type, "seq_len" in (overrides or {}))
        if read.problems:
            return _failed(*(Problem(field, where, m) for m in read.problems))
        if not read.unsupported:
            return ModelFacts(
                None, None, read.fields, None, None, [], activation_function_note=read.note
            )
        unsupported = read.unsupported  # counted by building the model
    try:
        return build_facts(config, field, where, overrides)
    except ImportError as exc:
        if unsupported:
            message = (
                f"{unsupported[0]}; to count it install transformers (pip install transformers)"
            )
        else:
            message = (
                f"model_type {shown(model_type)} is counted by building the model with transformers, "
                f"which is not installed ({exc.name or exc}; pip install transformers); "
                f"without it the supported families are {', '.join(FAMILIES)}"
            )
        return _failed(Problem(field, where, message))


def build_facts(
    config: Mapping[str, Any],
    field: str = "hf_config",
    where: str = "{...}",
    overrides: Mapping[str, Any] | None = None,
) -> ModelFacts:
    """The facts of `config` (a dict with a `model_type`, without `auto_map`) from the
    model built on the meta device, whatever its family (`config_facts` reads the five
    families of `hf_config.FAMILIES` without building them; for those this gives the same
    count and shape), with the shape keywords `overrides` set (`override_config`).
    Problems name `field` and `where` (an override's, its keyword). Raises ImportError
    without torch or transformers."""
    keys: dict[str, str] = {}
    overrides = overrides or {}
    if overrides:
        config, keys, refused = override_config(config, overrides)
        if refused:
            return _failed(*refused)
    built = _built(config)
    if built.problems:
        return _failed(*(Problem(field, where, m) for m in built.problems))
    shape = family_shape(built.resolved, built.layer_params)
    if shape.problems:
        return _failed(*(Problem(field, where, m) for m in shape.problems))
    unmet = [
        _not_taken(name, overrides[name], key, str(config["model_type"]))
        for name, key in keys.items()
        if _built_value(name, key, shape.fields, built.resolved) != overrides[name]
    ]
    if unmet:
        return _failed(*unmet)
    active = active_from_experts(built.n_params, built.routed, built.resolved)
    return ModelFacts(
        built.n_params,
        built.name,
        shape.fields,
        active,
        shape.note,
        [],
        None,
        shape.reason,
        activation_function_note=shape.activation_function_note,
        shape_note=built.shape_note if shape.fields else None,
    )


# ---------------------------------------------------------------- shape overrides
#: The estimator's shape keywords a built config takes, at the standard config names
#: (`attribute_map` gives each family's own: GPT-2's `n_layer`, T5's `num_layers`).
OVERRIDE_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "ffn_hidden": "intermediate_size",
    "vocab": "vocab_size",
    "tied_embeddings": "tie_word_embeddings",
}
#: Families whose MLP inner size has a name of its own (`hf_shape` reads the same keys).
FFN_KEYS = {
    "falcon": "ffn_hidden_size",
    "gptj": "n_inner",
    "gpt_bigcode": "n_inner",
    "gpt2": "n_inner",
    "opt": "ffn_dim",
    "t5": "d_ff",
    "mt5": "d_ff",
    "umt5": "d_ff",
}
#: Shape keywords a built model's family decides: no config key sets them.
LAYOUT_FIELDS = ("mlp", "norm", "bias", "positions", "parallel_residual", "qk_norm", "post_norms")
#: An encoder-decoder's keys for its encoder's and decoder's sizes, per shape keyword.
_SPLIT_KEYS = {
    "layers": _LAYER_KEYS,
    "heads": (
        "num_attention_heads",
        "num_heads",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "num_decoder_heads",
    ),
    "ffn_hidden": ("intermediate_size", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim"),
}


def override_config(
    config: Mapping[str, Any], overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str], list[Problem]]:
    """(`config` with the shape keywords `overrides` set at its family's keys, {keyword:
    the key set}, the refusals, each naming its keyword and the key to edit instead).

    Each of `OVERRIDE_KEYS` is set at the family's name for it (the config class's
    `attribute_map`; `FFN_KEYS` for the MLP size) when the family has that key. Refused:
    the keywords a family's layout decides (`LAYOUT_FIELDS`), an encoder-decoder's layers,
    heads and MLP size (its encoder and decoder have keys of their own), a key the family
    does not have. `seq_len` is the training sequence, not a key: the shape takes it.
    Raises ImportError without transformers."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = str(config["model_type"])
    config_class = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None  # noqa: SIM401 (a lazy mapping)
    names: Mapping[str, str] = getattr(config_class, "attribute_map", None) or {}
    known = set(config) | _default_keys(config_class)
    encoder_decoder = config.get("is_encoder_decoder", False) is True or bool(
        {"num_decoder_layers", "decoder_layers"} & known
    )
    edited = dict(config)
    keys: dict[str, str] = {}
    problems: list[Problem] = []
    for name, value in overrides.items():
        if name in LAYOUT_FIELDS:
            message = (
                f"the {model_type} config.json is counted by building transformers' model, "
                f"whose layout its model_type decides (no key sets `{name}`): leave it out, "
                "or give a config.json of the layout wanted"
            )
            problems.append(Problem(name, value, message))
            continue
        if name == "activation_function":
            refused = _activation_override(edited, keys, model_type, known, value)
            if refused:
                problems.append(Problem(name, value, refused))
            continue
        if name not in OVERRIDE_KEYS:
            continue  # seq_len: the shape's
        if encoder_decoder and name in _SPLIT_KEYS:
            split = [k for k in _SPLIT_KEYS[name] if k in known] or [OVERRIDE_KEYS[name]]
            message = (
                f"{model_type} is an encoder-decoder, whose encoder and decoder sizes are "
                f"keys of their own: edit {', '.join(split)} in the config.json"
            )
            problems.append(Problem(name, value, message))
            continue
        standard = OVERRIDE_KEYS[name]
        key = FFN_KEYS.get(model_type, standard) if name == "ffn_hidden" else standard
        key = names.get(key, key)
        if key not in known:
            message = (
                f"a {model_type} config.json has no {key} key to set it: the family decides "
                "it; leave it out, or edit the config.json's own keys"
            )
            problems.append(Problem(name, value, message))
            continue
        checked = _override_value(name, value)
        if isinstance(checked, str):
            problems.append(Problem(name, value, checked))
            continue
        edited[key] = checked
        keys[name] = key
    return edited, keys, problems


def _activation_override(
    edited: dict[str, Any], keys: dict[str, str], model_type: str, known: set[str], value: Any
) -> str | None:
    """`activation_function` set at the family's key of `edited` (recorded in `keys`), or
    why not: a family without such a key (BLOOM's is fixed), a name transformers does not
    run."""
    key = activation_key(model_type)
    if key is None or key not in known:
        return (
            f"a {model_type} config.json has no key that names its MLP activation (its "
            "code runs its own): leave it out"
        )
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in TRANSFORMERS_NAMES:
        return f"must be one of {', '.join(TRANSFORMERS_NAMES)} (transformers' names)"
    edited[key] = name
    keys["activation_function"] = key
    return None


def config_key(config: Mapping[str, Any], name: str) -> str:
    """The key that holds `Architecture` field `name` in `config` (its family's name for
    it: GPT-2's `n_embd` for `hidden`; the standard name where the family has none)."""
    model_type = str(config.get("model_type"))
    if model_type in FAMILIES:
        return family_key(model_type, name) or name
    standard = OVERRIDE_KEYS.get(name, {"seq_len": "max_position_embeddings"}.get(name, name))
    key = FFN_KEYS.get(model_type, standard) if name == "ffn_hidden" else standard
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if model_type in CONFIG_MAPPING:
            key = (getattr(CONFIG_MAPPING[model_type], "attribute_map", None) or {}).get(key, key)
    except ImportError:
        pass
    return key


def _override_value(name: str, value: Any) -> Any:
    """`value` read as shape keyword `name` (an integer in its range, or a bool), or the
    message saying what is allowed."""
    if name == "tied_embeddings":
        flag = as_bool(value)
        return flag if isinstance(flag, bool) else "must be True or False"
    number, message = check_number(name, value)
    return message if message is not None else number


def _default_keys(config_class: Any) -> set[str]:
    """The keys a config class writes (its defaults'), or none where it cannot say."""
    if config_class is None:
        return set()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return set(config_class().to_dict())
    except Exception:  # a class without defaults for every argument
        return set()


def _built_value(
    name: str, key: str, fields: Mapping[str, Any], resolved: Mapping[str, Any]
) -> Any:
    """Keyword `name` as the built model has it: its shape's, else its config's `key`."""
    if fields:
        return fields.get(name)
    return resolved.get(key, resolved.get(OVERRIDE_KEYS.get(name, key)))


def _not_taken(name: str, value: Any, key: str, model_type: str) -> Problem:
    message = (
        f"setting {key} in the {model_type} config.json does not build a model of "
        f"`{name}` {shown(value)}: edit the config.json's own keys"
    )
    return Problem(name, value, message)


def active_from_experts(
    n_params: int, routed: tuple[int, ...], config: Mapping[str, Any]
) -> int | None:
    """The parameters one token uses: `n_params` less, in each routed-experts container
    of `routed` sizes (modules named `experts`), the share of the experts it is not routed
    to; `n_params` without experts, None where the config does not say how many experts a
    token uses (or the containers do not split into that many equal experts)."""
    if not routed:
        return n_params
    experts, top_k = experts_and_top_k(config)
    if not experts or not top_k or not 0 < top_k <= experts:
        return None
    if any(size % experts for size in routed):
        return None
    return n_params - sum(size // experts * (experts - top_k) for size in routed)


def _custom_code(config: Mapping[str, Any], path: str = "") -> str | None:
    """The key path of an `auto_map` anywhere in `config` (custom code), or None."""
    for key, value in config.items():
        where = f"{path}.{key}" if path else str(key)
        if key == "auto_map":
            named = ", ".join(map(str, value)) if isinstance(value, Mapping) else shown(value)
            return f"{where} ({named})"
        if isinstance(value, Mapping):
            found = _custom_code(value, where)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------- building (torch)
class _Built(NamedTuple):
    """A config built on the meta device: its count, class, resolved config, the
    parameters of its stack of layers and of each routed-experts container."""

    n_params: int
    name: str
    resolved: dict[str, Any]
    layer_params: int | None
    routed: tuple[int, ...]
    problems: tuple[str, ...]
    shape_note: str | None = None


def _built(config: Mapping[str, Any]) -> _Built:
    """`config` built (cached per content when it is JSON); raises ImportError without
    torch or transformers."""
    try:
        text = json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # a dict holding other Python objects: not cached
        return _build(dict(config))
    return _built_from_text(text)


@functools.lru_cache(maxsize=32)
def _built_from_text(text: str) -> _Built:
    return _build(json.loads(text))


def clear_cache() -> None:
    """Forget every built config (tests; a process that changed its transformers)."""
    _built_from_text.cache_clear()


def _nothing(*problems: str) -> _Built:
    return _Built(0, "", {}, None, (), problems)


def _meta_model(config: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """(transformers' model for `config` (a dict with a `model_type`), built on the meta
    device, or None; the problems): the one guarded path from a config to a module, for
    the count and the dry run alike. The config class's own checks and the model's
    constructor may raise anything; each becomes a problem quoting it. Raises ImportError
    without torch or transformers."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    version = f"transformers {transformers.__version__}"
    model_type = config["model_type"]
    if model_type not in CONFIG_MAPPING:
        return None, [
            f"model_type {shown(model_type)} is not a model type {version} knows (nor one "
            f"of {', '.join(FAMILIES)}, counted without it)"
        ]
    config_class = CONFIG_MAPPING[model_type]
    problems = _checked_keys(config, getattr(config_class, "attribute_map", {}) or {})
    if problems:
        return None, problems
    data = {k: v for k, v in config.items() if k not in _LEFT_OUT}
    with _quiet(transformers):
        try:
            hf_config = config_class.from_dict(data)
        except Exception as exc:  # the library's own checks of the config: report them
            return None, [f"{version} cannot read this {model_type} config: {_text(exc)}"]
        deep = _too_deep(hf_config)
        if deep:
            return None, [deep]
        auto = _auto_class(hf_config, model_type)
        if auto is None:
            return None, [f"{version} has no model class for model_type {shown(model_type)}"]
        try:
            with torch.device("meta"):
                module = auto.from_config(hf_config, trust_remote_code=False)
        except Exception as exc:  # the model's constructor: report, do not crash
            return None, [f"building the {model_type} model ({auto.__name__}) failed: {_text(exc)}"]
    return module, []


def _build(config: dict[str, Any]) -> _Built:
    module, problems = _meta_model(config)
    if module is None:
        return _nothing(*problems)
    from workbench.modelstats import count_parameters

    n = count_parameters(module)
    if n > LIMITS["n_params"].high:
        return _nothing(
            f"the {type(module).__name__} built from it has {n:,} parameters, "
            f"{LIMITS['n_params'].too_large()}"
        )
    resolved, note = language_model_config(module.config)
    layers = resolved.get("num_hidden_layers")
    return _Built(
        n,
        type(module).__name__,
        resolved,
        layer_stack_params(module, layers) if type(layers) is int else None,
        routed_expert_params(module),
        (),
        note,
    )


def language_model_config(hf_config: Any) -> tuple[dict[str, Any], str | None]:
    """(The resolved config the shape is read from, a note where that is not the config's
    own top level.) A multimodal model (Gemma 3's, LLaVA's, Mistral 3's: a `text_config`
    beside a vision tower's, and no layer count of its own) is read as its language model:
    what a text-only step runs; its vision tower's parameters are in the count (from the
    module), the activations of images through it are not."""
    resolved = resolved_config(hf_config)
    text = getattr(hf_config, "text_config", None)
    if text is None or language_model(resolved) is resolved:
        return resolved, None
    try:
        language = resolved_config(text)
    except Exception:  # a sub-config that cannot be read: the top level as it is
        return resolved, None
    if type(language.get("num_hidden_layers")) is not int:
        return resolved, None
    kind = language.get("model_type") or "its language model"
    note = (
        f"the activations are {kind}'s, its language model (`text_config`): a text-only "
        "step, where images through its vision tower would keep more; its vision tower's and "
        "projector's parameters are counted as trained, though a text-only step gives them "
        "no gradients (nor AdamW states): the model states are over by their share"
    )
    return language, note


def _checked_keys(config: Mapping[str, Any], attribute_map: Mapping[str, str]) -> list[str]:
    """The standard shape keys of `config`, under their own names or the family's
    (`attribute_map`: GPT-2's `n_layer` is `num_hidden_layers`), checked to be integers in
    the estimator's ranges before anything is built; lists and objects are the family's
    own business."""
    problems: list[str] = []
    for standard, name in _CHECKED:
        for key in dict.fromkeys((standard, attribute_map.get(standard))):
            if key is None:
                continue
            value = config.get(key)
            if isinstance(value, (list, tuple, Mapping)):
                continue
            if name == "head_dim" and type(value) is int and value == 0:
                continue  # "derived from hidden / heads" in some families' configs
            bound = HEAD_DIM if name == "head_dim" else None
            config_integer(config, key, name, problems, bound)
    config_flag(config, "tie_word_embeddings", False, problems)
    return problems


def _too_deep(hf_config: Any) -> str | None:
    for key in _LAYER_KEYS:
        value = getattr(hf_config, key, None)
        if type(value) is int and value > MAX_BUILD_LAYERS:
            return (
                f"{key} {shown(value)}: more than {MAX_BUILD_LAYERS:,} layers (a model is built "
                "layer by layer to be counted; the deepest models trained have about 10^2)"
            )
    return None


def _auto_class(hf_config: Any, model_type: str) -> Any:
    """transformers' model class to build for `model_type`: a causal LM, a
    sequence-to-sequence LM (text or speech) for an encoder-decoder, a masked LM for an
    encoder, else the bare model (None: transformers builds no model from this config)."""
    from transformers.models.auto import modeling_auto as auto

    if getattr(hf_config, "is_encoder_decoder", False) is True:  # never its decoder alone
        for names, cls in (
            ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
            ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "AutoModelForSpeechSeq2Seq"),
            ("MODEL_MAPPING_NAMES", "AutoModel"),
        ):
            if model_type in getattr(auto, names, {}):
                return getattr(auto, cls)
        return None
    decoder = getattr(hf_config, "is_decoder", False) is True
    if not decoder and model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return auto.AutoModelForMaskedLM
    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return auto.AutoModelForCausalLM
    if model_type in auto.MODEL_MAPPING_NAMES:
        return auto.AutoModel
    return None


#: Loggers that warn while a model is first built: torchao (imported by transformers when
#: installed) about kernels it cannot load, torch about its pytree registrations.
_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' warnings about the config (token ids outside a tiny vocabulary, a
    head class used standalone), torch's about empty tensors and the libraries' import
    warnings, silenced while building (and restored after): the count is the answer, and
    the problems that matter are errors."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _text(exc: BaseException) -> str:
    """An exception as one bounded line: its type and message."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 400 else text[:397] + "..."


# ---------------------------------------------------------------- reading a module
def resolved_config(hf_config: Any) -> dict[str, Any]:
    """A transformers config as a dict (`to_dict`: every default filled in) with the
    standard names of `hf_shape.STANDARD_KEYS` resolved through the class's
    `attribute_map` (GPT-2's `n_layer` is also `num_hidden_layers`)."""
    data = hf_config.to_dict()
    resolved: dict[str, Any] = dict(data) if isinstance(data, Mapping) else {}
    for key in STANDARD_KEYS:
        if resolved.get(key) is not None:
            continue
        try:
            value = getattr(hf_config, key, None)
        except Exception:  # a property that cannot answer for this config
            continue
        if isinstance(value, (bool, int, str)):
            resolved[key] = value
    return resolved


def layer_stack_params(module: Any, layers: int) -> int | None:
    """The parameters of the module's stack of layers: the largest `nn.ModuleList` of
    `layers` entries (None without one)."""
    import torch

    from workbench.modelstats import count_parameters

    best: int | None = None
    for child in module.modules():
        if isinstance(child, torch.nn.ModuleList) and len(child) == layers:
            n = count_parameters(child)
            best = n if best is None else max(best, n)
    return best


def routed_expert_params(module: Any) -> tuple[int, ...]:
    """The parameters of each routed-experts container (a submodule named `experts`, the
    outermost where they nest; `shared_experts` is not one)."""
    from workbench.modelstats import count_parameters

    names = [name for name, _ in module.named_modules() if name.rsplit(".", 1)[-1] == "experts"]
    outer = [n for n in names if not any(n.startswith(o + ".") for o in names)]
    return tuple(count_parameters(module.get_submodule(n)) for n in outer)


def module_config_facts(
    module: Any, n_params: int
) -> tuple[dict[str, Any], int | None, str | None, str | None, str | None]:
    """(`Architecture` fields, active parameters, the note when there is no shape, the
    note when its MLP activation function is not one the estimator knows, where the shape
    was read when not at the config's top level: `language_model_config`) of a
    transformers module with `n_params` parameters, from its `config`. A family mapped
    by name is trusted as it is (a module's layers may hold adapters, e.g. LoRA); any other
    is mapped only where its layers count exactly (`hf_shape`)."""
    resolved, read = language_model_config(module.config)
    layers = resolved.get("num_hidden_layers")
    stack = None
    if resolved.get("model_type") not in MAPPED_FAMILIES and isinstance(layers, int):
        stack = layer_stack_params(module, layers)
    shape = family_shape(resolved, stack)
    active = active_from_experts(n_params, routed_expert_params(module), resolved)
    note = shape.note
    if shape.problems:
        note = no_activations(f"its config does not give a shape ({shape.problems[0]})")
    read = read if shape.fields else None
    return shape.fields, active, note, shape.activation_function_note, read


__all__ = [
    "FFN_KEYS",
    "LAYOUT_FIELDS",
    "MAX_BUILD_LAYERS",
    "OVERRIDE_KEYS",
    "ModelFacts",
    "active_from_experts",
    "build_facts",
    "clear_cache",
    "config_facts",
    "config_key",
    "layer_stack_params",
    "language_model_config",
    "module_config_facts",
    "override_config",
    "resolved_config",
    "routed_expert_params",
]


def meta_module(source: Any, field: str = "hf_config") -> tuple[Any, list[Problem]]:
    """(the `transformers` model a config.json describes, built on the meta device: shapes
    and no storage, or None; the problems, naming `field`): the dry run's model for a
    config. The checks are `config_facts`': a file read as data, no `auto_map` (nothing in
    it chooses code to run), a model type the installed transformers knows."""
    facts = config_facts(source, field)
    if facts.problems:
        return None, facts.problems
    config, where, problem = load_config(source, field)
    if problem is not None or config is None:
        return None, [problem] if problem is not None else []
    try:
        module, problems = _meta_model(config)
    except ImportError as exc:
        message = (
            f"the dry run builds the model with transformers, which is not installed "
            f"({exc.name or exc}; pip install transformers)"
        )
        return None, [Problem(field, where, message)]
    return module, [Problem(field, where, m) for m in problems]
