"""What DeepSpeed itself accepts: a DeepSpeed config checked with DeepSpeed's own code.

DeepSpeed checks a config in two places when `deepspeed.initialize` builds an engine:

* `deepspeed.runtime.config.DeepSpeedConfig` parses it. Its pydantic models validate
  `zero_optimization` (with the offload blocks), `fp16`, `bf16`, the monitors, the comms
  logger, `compile`, ...: a key they do not define or a value of the wrong type is an
  error. It also refuses removed features (`amp`, `elasticity`, ...) and fp16 with bf16.
  Top-level keys it does not read are ignored silently.
* The engine builds the optimizer and the LR scheduler by passing `optimizer.params` /
  `scheduler.params` as keyword arguments to the class it picks (a parameter that class
  does not take is a TypeError), refuses an optimizer ZeRO is not tested with unless
  `zero_allow_untested_optimizer` is true, and refuses `max_grad_norm` as an optimizer
  parameter.

`config_problems` runs the first with DeepSpeed's classes: `DeepSpeedConfig` needs no
process group (it falls back to world size 1), so the batch-size keys are left to the
caller. `optimizer_problems` and `scheduler_problems` check the second from the
signatures of the classes DeepSpeed would build, without building them: no kernel is
compiled and no process group is created. `top_level_keys` is the set of top-level keys
`DeepSpeedConfig` reads, recorded from the lookups it makes, not a hand-kept list.

Each problem is one line naming the key path; messages quote DeepSpeed's own reason.
Imports deepspeed (and torch) on first use, not at import.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Iterator
from typing import Any

from workbench.deepspeed.problems import KeyProblem, keyed, unique
from workbench.inputs import shown

#: pydantic model (as named in its ValidationError) -> the config key it validates.
_MODEL_KEYS = {
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedFP16Config": "fp16",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedMonitorConfig": "",
    "CommsLoggerConfig": "comms_logger",
    "CompileConfig": "compile",
    "HybridEngineConfig": "hybrid_engine",
    "DeepSpeedThroughputTimerConfig": "timers.throughput",
    "TPTrainingConfig": "tensor_parallel",
}

#: DeepSpeed <= 0.18's 1-bit optimizers (config type, lowercased -> module:class).
ONEBIT_OPTIMIZERS = {
    "onebitadam": "deepspeed.runtime.fp16.onebit.adam:OnebitAdam",
    "zerooneadam": "deepspeed.runtime.fp16.onebit.zoadam:ZeroOneAdam",
    "onebitlamb": "deepspeed.runtime.fp16.onebit.lamb:OnebitLamb",
}


#: The longest key or type name worth a "did you mean" search; longer ones name nothing.
MAX_NAME = 200


def _ds(module: str) -> Any:
    """A DeepSpeed module, imported on first use (DeepSpeed ships no type information).
    The first import is quiet: DeepSpeed logs while it picks an accelerator ("Setting
    accelerator to CPU ...", a warning on stdout on a machine without a GPU), which is no
    news to someone checking a config and would come before its one-line error."""
    if "deepspeed" in sys.modules:
        return importlib.import_module(module)
    logger = logging.getLogger("DeepSpeed")  # the one DeepSpeed's import configures
    quiet = _BelowError()
    logger.addFilter(quiet)
    try:
        return importlib.import_module(module)
    finally:
        logger.removeFilter(quiet)


class _BelowError(logging.Filter):
    """Drops the records below ERROR (DeepSpeed's import-time notices); errors pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def deepspeed_version() -> str:
    """The installed DeepSpeed's version ("not installed" without one)."""
    try:
        return str(_ds("deepspeed").__version__)
    except ImportError:
        return "not installed"


def deepspeed_name() -> str:
    return f"DeepSpeed {deepspeed_version()}"


@contextlib.contextmanager
def _quiet_deepspeed() -> Iterator[None]:
    """DeepSpeed logs at INFO while it parses a config; keep those lines out of the way."""
    logger = _ds("deepspeed.utils").logger
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _RecordingDict(dict):  # type: ignore[type-arg]
    """A dict that notes every key looked up in it (by [], get, in, keys() in)."""

    seen: set[Any]

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self.seen.add(key)
        return super().__contains__(key)

    def keys(self) -> Any:
        outer = self

        class _Keys:
            def __contains__(self, key: Any) -> bool:
                return key in outer

            def __iter__(self) -> Iterator[Any]:
                return iter(dict.keys(outer))

        return _Keys()


@functools.cache
def top_level_keys() -> frozenset[str]:
    """Every top-level key `DeepSpeedConfig` looks up (its own and removed features')."""
    DeepSpeedConfig = _ds("deepspeed.runtime.config").DeepSpeedConfig
    probe = _RecordingDict({"train_micro_batch_size_per_gpu": 1})
    probe.seen = set()
    with _quiet_deepspeed():
        DeepSpeedConfig(probe)
    return frozenset(k for k in probe.seen if isinstance(k, str))


def close_key(key: str, choices: frozenset[str] | set[str] | list[str]) -> str:
    """ " (did you mean 'x'?)" for the choice closest to `key` (ignoring case), or ""."""
    if len(key) > MAX_NAME:  # no setting is named like that (and difflib is quadratic)
        return ""
    by_lower = {c.lower(): c for c in sorted(choices)}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.75)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


# --------------------------------------------------------------------------- DeepSpeedConfig
def check_config(
    ds: dict[str, Any], *, batch_keys: tuple[str, ...] = ()
) -> tuple[list[KeyProblem], Any]:
    """Why `DeepSpeedConfig` refuses `ds`, one line per problem, and DeepSpeed's parsed
    config (a `DeepSpeedConfig`, None when refused).

    Each top-level block is parsed on its own (so every block's problems are reported,
    not only the first), then the whole config (for rules across blocks). `batch_keys`
    are replaced by micro-batch 1, accumulation 1: the caller resolves batch sizes with
    the world size, which DeepSpeedConfig would take from a process group.
    """
    DeepSpeedConfig = _ds("deepspeed.runtime.config").DeepSpeedConfig
    batch = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    rest = {k: v for k, v in ds.items() if k not in batch_keys}
    problems: list[KeyProblem] = []
    parsed = None
    with _quiet_deepspeed():
        for key, value in rest.items():
            problems.extend(_parse(DeepSpeedConfig, {**batch, key: copy.deepcopy(value)}, ds)[0])
        if not problems:
            more, parsed = _parse(DeepSpeedConfig, {**batch, **copy.deepcopy(rest)}, ds)
            problems.extend(more)
    return unique(problems), parsed


def config_problems(ds: dict[str, Any], *, batch_keys: tuple[str, ...] = ()) -> list[KeyProblem]:
    """`check_config(...)`'s problems only."""
    return check_config(ds, batch_keys=batch_keys)[0]


def _parse(cls: Any, ds: dict[str, Any], original: dict[str, Any]) -> tuple[list[KeyProblem], Any]:
    try:
        parsed = cls(ds)
    except Exception as exc:  # DeepSpeed raises ValidationError, AssertionError, ValueError...
        return _explain(exc, original), None
    return [], parsed


def _explain(exc: BaseException, ds: dict[str, Any]) -> list[KeyProblem]:
    from pydantic import ValidationError

    name = deepspeed_name()
    if not isinstance(exc, ValidationError):
        text = " ".join(str(exc).split()) or type(exc).__name__
        if len(text) > 500:
            text = text[:497] + "..."
        return [KeyProblem("", None, f"{name} rejects the config: {text}", value_text="")]
    prefix = _MODEL_KEYS.get(exc.title, exc.title)
    if exc.title == "DeepSpeedBF16Config" and "bf16" not in ds and "bfloat16" in ds:
        prefix = "bfloat16"
    root = _model_class(exc.title)
    lines: list[KeyProblem] = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        path = ".".join([prefix, *loc] if prefix else loc)
        if err["type"] == "extra_forbidden":
            fields = _model_fields(root, loc[:-1])
            hint = close_key(loc[-1], fields) if fields else ""
            lines.append(keyed(path, f"{name} rejects it: not one of its settings here{hint}"))
        else:
            value = err.get("input")
            lines.append(KeyProblem(path, value, f"{name} rejects it: {err['msg']}"))
    return lines


def _model_class(title: str) -> Any:
    """The pydantic model class DeepSpeed names `title` (None when not one of ours)."""
    for module in (
        "deepspeed.runtime.zero.config",
        "deepspeed.runtime.precision_config",
        "deepspeed.comm.config",
    ):
        cls = getattr(_ds(module), title, None)
        if cls is not None:
            return cls
    return None


def _model_fields(model: Any, loc: list[str]) -> set[str]:
    """Field names (and aliases) of the model nested at `loc` under `model`."""
    import typing

    from pydantic import BaseModel

    for part in loc:
        if model is None or part not in getattr(model, "model_fields", {}):
            return set()
        annotation = model.model_fields[part].annotation
        candidates = [annotation, *typing.get_args(annotation)]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
    if model is None:
        return set()
    names = set(model.model_fields)
    names |= {f.alias for f in model.model_fields.values() if f.alias}
    return names


#: top-level key -> (module, class) of the pydantic model DeepSpeed validates it with
_BLOCK_MODELS = {
    "zero_optimization": ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
    "fp16": ("deepspeed.runtime.precision_config", "DeepSpeedFP16Config"),
    "bf16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "bfloat16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
}


def _kinds(annotation: Any) -> tuple[set[str], Any]:
    """What a pydantic field takes: {"bool", "number"} (an int, float or int Enum) and its
    nested model class, if any."""
    import enum
    import typing

    from pydantic import BaseModel

    kinds: set[str] = set()
    nested = None
    for c in [annotation, *typing.get_args(annotation)]:
        if c is bool:
            kinds.add("bool")
        elif c in (int, float) or (
            isinstance(c, type) and issubclass(c, enum.Enum) and issubclass(c, int)
        ):
            kinds.add("number")
        elif isinstance(c, type) and issubclass(c, BaseModel):
            nested = c
    return kinds, nested


def coercion_problems(ds: dict[str, Any]) -> list[KeyProblem]:
    """true/false where DeepSpeed's models take a number, and a number where they take
    true/false (pydantic would turn `"stage": true` into stage 1 and `"enabled": 1` into
    true without a word), one line per key path."""
    problems: list[KeyProblem] = []

    def walk(block: Any, model: Any, path: str) -> None:
        if not isinstance(block, dict) or model is None:
            return
        fields = getattr(model, "model_fields", {})
        by_name = {**{f.alias: f for f in fields.values() if f.alias}, **fields}
        for key, value in block.items():
            field = by_name.get(key)
            if field is None:
                continue
            kinds, nested = _kinds(field.annotation)
            where = f"{path}.{key}"
            if isinstance(value, bool) and "number" in kinds and "bool" not in kinds:
                problems.append(
                    KeyProblem(
                        where,
                        value,
                        f"{deepspeed_name()} takes a number here, not true/false",
                        value_text=str(value).lower(),
                    )
                )
            elif (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and kinds == {"bool"}
            ):
                problems.append(
                    KeyProblem(
                        where, value, f"{deepspeed_name()} takes true or false here, not a number"
                    )
                )
            elif isinstance(value, dict):
                walk(value, nested, where)

    for key, (module, name) in _BLOCK_MODELS.items():
        if isinstance(ds.get(key), dict):
            walk(ds[key], getattr(_ds(module), name, None), key)
    return problems


# --------------------------------------------------------------------------- optimizer
def onebit_available() -> bool:
    """Whether the installed DeepSpeed still ships the 1-bit optimizers."""
    return importlib.util.find_spec("deepspeed.runtime.fp16.onebit") is not None


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def optimizer_class(kind: str, *, offload: bool, torch_adam: bool = False) -> tuple[Any, set[str]]:
    """The class `deepspeed.initialize` builds for optimizer type `kind` (None when it
    knows none) and the parameters it removes or supplies itself (not the user's to give),
    following `DeepSpeedEngine._configure_basic_optimizer`."""
    import torch

    ds_config = _ds("deepspeed.runtime.config")
    lowered = kind.lower()
    if lowered in (ds_config.ADAM_OPTIMIZER, ds_config.ADAMW_OPTIMIZER):
        popped = {"adam_w_mode", "torch_adam", "fp32_optimizer_states"}
        if torch_adam:
            return (torch.optim.AdamW if lowered == "adamw" else torch.optim.Adam), popped
        if offload:
            return _ds("deepspeed.ops.adam").DeepSpeedCPUAdam, popped | {"adamw_mode"}
        return _ds("deepspeed.ops.adam").FusedAdam, popped
    if lowered == ds_config.ADAGRAD_OPTIMIZER:
        if offload:
            return _ds("deepspeed.ops.adagrad").DeepSpeedCPUAdagrad, set()
        return torch.optim.Adagrad, set()
    if lowered == ds_config.LAMB_OPTIMIZER:
        return _ds("deepspeed.ops.lamb").FusedLamb, set()
    if lowered == ds_config.LION_OPTIMIZER:
        if offload:
            return _ds("deepspeed.ops.lion").DeepSpeedCPULion, set()
        return _ds("deepspeed.ops.lion").FusedLion, set()
    if lowered in ONEBIT_OPTIMIZERS and onebit_available():
        return _load(ONEBIT_OPTIMIZERS[lowered]), {"deepspeed"}
    if lowered in ds_config.DEEPSPEED_OPTIMIZERS:
        return None, set()  # mup's MuAdam/MuAdamW/MuSGD, Muon: known, not modelled here
    cls = getattr(torch.optim, kind, None) if _public_name(kind) else None
    ok = isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
    return (cls if ok else None), set()


def deepspeed_optimizer_types() -> list[str]:
    """The optimizer types DeepSpeed resolves by name (besides torch.optim classes)."""
    ds_config = _ds("deepspeed.runtime.config")
    names = list(ds_config.DEEPSPEED_OPTIMIZERS)
    if onebit_available():
        names += list(ONEBIT_OPTIMIZERS)
    return names


def _parameters(cls: Any) -> list[inspect.Parameter]:
    """`cls.__init__`'s parameters after self and the first (the parameters / optimizer);
    a class without a signature takes anything."""
    try:
        return list(inspect.signature(cls.__init__).parameters.values())[2:]
    except (TypeError, ValueError):
        return [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]


def _public_name(kind: str) -> bool:
    """Whether `kind` can name a class of a module (no '_' start, an identifier)."""
    return kind.isidentifier() and not kind.startswith("_")


def accepted_parameters(cls: Any, reserved: set[str]) -> set[str] | None:
    """Keyword parameters `cls(...)` takes after its first (the parameters), minus the
    ones DeepSpeed reserves; None when it takes any (**kwargs)."""
    params = _parameters(cls)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL} - reserved


def _required(cls: Any) -> list[str]:
    return [
        p.name
        for p in _parameters(cls)
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def optimizer_defaults(kind: str, *, offload: bool) -> dict[str, Any]:
    """The default of each parameter of the class DeepSpeed builds for `kind` ({} when it
    builds none here), JSON-like (tuples as lists)."""
    cls, _ = optimizer_class(kind, offload=offload)
    if cls is None:
        return {}
    return {
        p.name: list(p.default) if isinstance(p.default, tuple) else p.default
        for p in _parameters(cls)
        if p.default is not inspect.Parameter.empty
    }


def optimizer_problems(
    kind: str,
    params: dict[str, Any],
    *,
    zero_stage: int,
    offload: bool,
    allow_untested: bool,
) -> list[KeyProblem]:
    """Why `deepspeed.initialize` would refuse optimizer `kind` with `params`."""
    supported = _ds("deepspeed.runtime.zero.utils").ZERO_SUPPORTED_OPTIMIZERS
    name = deepspeed_name()
    problems: list[KeyProblem] = []
    if "max_grad_norm" in params:
        problems.append(
            keyed(
                "optimizer.params.max_grad_norm",
                f"{name} rejects it: 'max_grad_norm' is not supported as an optimizer "
                "parameter, use 'gradient_clipping'",
            )
        )
    cls, reserved = optimizer_class(
        kind, offload=offload, torch_adam=bool(params.get("torch_adam"))
    )
    if cls is None:
        lowered = kind.lower()
        if lowered in deepspeed_optimizer_types() or lowered in ONEBIT_OPTIMIZERS:
            return problems  # DeepSpeed knows it (or once shipped it): the caller decides
        import torch

        torch_names = [
            n
            for n in dir(torch.optim)
            if isinstance(getattr(torch.optim, n), type)
            and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
            and n != "Optimizer"
        ]
        known = [*deepspeed_optimizer_types(), *torch_names]
        problems.append(
            KeyProblem(
                "optimizer.type",
                kind,
                f"{name} rejects it: not one of its optimizers "
                f"({', '.join(deepspeed_optimizer_types())}) and torch.optim has no "
                f"{shown(kind)}{close_key(kind, known)}",
            )
        )
        return problems
    allowed = accepted_parameters(cls, reserved)
    if allowed is not None:
        popped = {"adam_w_mode", "torch_adam", "fp32_optimizer_states", "foreach"} & reserved
        for key in params:
            if key in allowed or key in popped or key == "max_grad_norm":
                continue
            problems.append(
                keyed(
                    f"optimizer.params.{key}",
                    f"{name} rejects it: {cls.__name__} takes no parameter {shown(key)}"
                    f"{close_key(key, allowed)}; it takes {', '.join(sorted(allowed))}",
                )
            )
    if zero_stage >= 1 and cls not in supported and not allow_untested:
        problems.append(
            KeyProblem(
                "optimizer.type",
                kind,
                f"{name} rejects it: {cls.__name__} is an untested ZeRO optimizer; add "
                '"zero_allow_untested_optimizer": true to use it',
                value_text=f"{shown(kind)} with zero_optimization.stage={zero_stage}",
            )
        )
    return problems


def zero_tested(kind: str, *, offload: bool) -> bool:
    """Whether ZeRO accepts optimizer `kind` without `zero_allow_untested_optimizer`."""
    cls, _ = optimizer_class(kind, offload=offload)
    return cls in _ds("deepspeed.runtime.zero.utils").ZERO_SUPPORTED_OPTIMIZERS


# --------------------------------------------------------------------------- scheduler
def scheduler_problems(kind: str, params: dict[str, Any]) -> list[KeyProblem]:
    """Why the engine would refuse LR scheduler `kind` with `params`
    (`DeepSpeedEngine._scheduler_from_config`: DeepSpeed's lr_schedules, then torch's)."""
    import torch

    lr_schedules = _ds("deepspeed.runtime.lr_schedules")

    name = deepspeed_name()
    cls = None
    if _public_name(kind):
        cls = getattr(lr_schedules, kind, None) or getattr(torch.optim.lr_scheduler, kind, None)
    if not isinstance(cls, type):
        known = [
            n
            for n in ("LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
            if hasattr(lr_schedules, n)
        ]
        return [
            KeyProblem(
                "scheduler.type",
                kind,
                f"{name} rejects it: it does not recognize this LR scheduler"
                f"{close_key(kind, known)}; DeepSpeed's: {', '.join(known)} (or a "
                "torch.optim.lr_scheduler class)",
            )
        ]
    problems = [
        keyed(f"scheduler.params.{key}", f"{name} rejects it: {kind} needs this parameter")
        for key in _required(cls)
        if key not in params
    ]
    allowed = accepted_parameters(cls, set())
    if allowed is None:
        return problems
    return problems + [
        keyed(
            f"scheduler.params.{key}",
            f"{name} rejects it: {kind} takes no parameter {shown(key)}"
            f"{close_key(key, allowed)}; it takes {', '.join(sorted(allowed))}",
        )
        for key in params
        if key not in allowed
    ]
