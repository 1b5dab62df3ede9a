"""A checkpoint's payload: the RNG states of a run, the payload of a Session at a step
boundary, and the checks of a loaded payload's layout (every entry of the table in
`workbench.train.checkpoints` has the type a resume relies on, found without touching a
generator or a module)."""

from __future__ import annotations

import random
from typing import Any, TypeGuard

import numpy as np
import torch

from workbench.inputs import is_int, shown
from workbench.train.checkpointing.files import CHECKPOINT_FORMAT, is_count

#: Plain settings (config values, model options) nest at most this deep and hold at most
#: this many items in all: a TrainConfig and a model's options are a flat dict of scalars.
_SETTINGS_DEPTH = 4
_SETTINGS_ITEMS = 10_000


def rng_state() -> dict[str, Any]:
    """Every RNG a run draws from, as tensors and plain values."""
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state_all()
    return rng_as_plain(
        {
            "torch": torch.get_rng_state(),
            "cuda": cuda,
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }
    )


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()` (this format's, or the previous format's tuples)."""
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):
        numpy_state = (
            numpy_state["bit_generator"],
            numpy_state["key"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    np.random.set_state(numpy_state)
    python_state = state["python"]
    if isinstance(python_state, dict):
        python_state = (
            python_state["version"],
            tuple(python_state["state"]),
            python_state["gauss_next"],
        )
    random.setstate(python_state)
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def training_payload(
    *,
    step: int,
    config: Any,
    runtime: Any,
    reference_batch: int,
    model_name: str | None,
    model_options: dict[str, Any],
) -> dict[str, Any]:
    """A checkpoint of a Session at a step boundary (the layout in the module docstring):
    `runtime` (`workbench.train.runtime.Runtime`) gives the backend-neutral state, the
    trained module's buffers and the data position."""
    from workbench.train.runtime import persistent_buffers

    return {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "config": config.to_dict(),
        "backend": runtime.backend.export_state(),
        "buffers": persistent_buffers(runtime.trained_module),
        "rng": rng_state(),
        "data": vars(runtime.data.position),
        "reference_batch": reference_batch,
        "model": {"name": model_name, "options": model_options},
    }


def check_plain(value: Any, where: str = "payload") -> None:
    """ValueError naming the first value that is not a tensor, number, string, None or
    a plain list/tuple/dict of them (what `torch.load(weights_only=True)` reads). Each
    container is walked once, however often it is referenced."""
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, at = stack.pop()
        if v is None or isinstance(v, (torch.Tensor, str, bool, int, float)):
            continue
        if type(v) in (list, tuple, dict):
            if id(v) in seen:
                continue
            seen.add(id(v))
            if type(v) is dict:
                for k in v:
                    if not isinstance(k, (str, int)):
                        raise ValueError(f"{at}: key {shown(k)} is not a string or integer")
                items = [(item, f"{at}[{shown(k)}]") for k, item in v.items()]
            else:
                items = [(item, f"{at}[{i}]") for i, item in enumerate(v)]
            stack.extend(reversed(items))  # the first bad value is the one named
            continue
        raise ValueError(
            f"{at}={shown(v)}: a {type(v).__name__} cannot go into a checkpoint, which "
            "holds only tensors, numbers, strings, None and plain lists/tuples/dicts of them "
            "(so torch.load(weights_only=True) reads it)"
        )


def rng_as_plain(state: dict[str, Any]) -> dict[str, Any]:
    """RNG states as NumPy and Python give them (tuples with an array) as tensors and
    plain values (this format's layout; the previous format stored the tuples)."""
    np_name, key, pos, has_gauss, cached = state["numpy"]
    version, internal, gauss_next = state["python"]
    return {
        "torch": state["torch"],
        "cuda": state.get("cuda"),
        "numpy": {
            "bit_generator": str(np_name),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(version), "state": list(internal), "gauss_next": gauss_next},
    }


def _tensors(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
    )


def _not_dense(value: Any) -> list[str]:
    """Names of the tensors in a name -> tensor dict that are not dense (strided): a
    sparse or otherwise laid out weight that loading into a module would fail on."""
    return [k for k, v in value.items() if v.layout != torch.strided]


def _tensors_problem(name: str, value: Any, what: str) -> str | None:
    if not _tensors(value):
        return f"{name}: must map {what} names to tensors"
    bad = _not_dense(value)
    if bad:
        return (
            f"{name}[{shown(bad[0])}]: must be a dense (strided) tensor, as a save writes "
            f"it{f' ({len(bad) - 1} more)' if len(bad) > 1 else ''}"
        )
    return None


def _first_not_dense(value: Any, where: str) -> str | None:
    """Where in `value` (nested dicts, lists and tuples, each walked once however often it
    is referenced) the first tensor that is not dense (strided) is; None when none is."""
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided:
                return at
            continue
        if type(v) not in (list, tuple, dict) or id(v) in seen:
            continue
        seen.add(id(v))
        items = v.items() if type(v) is dict else enumerate(v)
        stack.extend((x, f"{at}.{str(k)[:40]}") for k, x in items)
    return None


def settings_problem(value: Any) -> str | None:
    """Why `value` (a config or a model's options, as a checkpoint holds them) is not a
    plain settings dict: string keys, values that are None, booleans, numbers, strings or
    lists/dicts of them, nested at most a few levels and a bounded number of items in all
    (so no message or check downstream walks a structure of shared references); None
    when it is one."""
    if not isinstance(value, dict):
        return "must be a dict"
    items = 0
    stack: list[tuple[Any, int, str]] = [(v, 1, str(k)[:40]) for k, v in value.items()]
    if not all(isinstance(k, str) for k in value):
        return "its keys must be strings"
    while stack:
        v, depth, where = stack.pop()
        items += 1
        if items > _SETTINGS_ITEMS:
            return f"more than {_SETTINGS_ITEMS} values in all"
        if v is None or isinstance(v, (bool, int, float, str)):
            if isinstance(v, str) and len(v) > 1 << 16:
                return f"{where}: a string of {len(v)} characters"
            continue
        if type(v) not in (list, tuple, dict):
            return f"{where}: a {type(v).__name__}, not a plain value"
        if depth >= _SETTINGS_DEPTH:
            return f"{where}: nested more than {_SETTINGS_DEPTH} levels"
        if type(v) is dict:
            if not all(isinstance(k, str) for k in v):
                return f"{where}: keys must be strings"
            stack.extend((x, depth + 1, f"{where}.{str(k)[:40]}") for k, x in v.items())
        else:
            stack.extend((x, depth + 1, f"{where}[{i}]") for i, x in enumerate(v))
    return None


def _rng_problems(rng: Any) -> list[str]:
    """What keeps `set_rng_state(rng)` from restoring `rng` (this format's or the previous
    one's layout), found without touching any generator."""
    if not isinstance(rng, dict):
        return [f"rng={shown(rng)}: must be a dict of RNG states"]
    p = []
    state = rng.get("torch")
    if not (
        _dense(state) and state.dtype == torch.uint8 and state.shape == torch.get_rng_state().shape
    ):
        p.append("rng.torch: must be torch's RNG state (a uint8 tensor torch.get_rng_state gives)")
    cuda = rng.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, (list, tuple))
        and len(cuda) <= 1024
        and all(_dense(t) and t.dtype == torch.uint8 and t.dim() == 1 for t in cuda)
    ):
        p.append("rng.cuda: must be None or a list of uint8 tensors (one per GPU)")
    numpy_state = rng.get("numpy")
    if isinstance(numpy_state, dict):
        key = numpy_state.get("key")
        if not (
            numpy_state.get("bit_generator") == "MT19937"
            and _dense(key)
            and key.dtype == torch.int64
            and key.numel() == 624
            and all(is_int(numpy_state.get(k)) for k in ("pos", "has_gauss"))
            and 0 <= numpy_state["pos"] <= 624
            and numpy_state["has_gauss"] in (0, 1)
            and _real(numpy_state.get("cached_gaussian"))
        ):
            p.append("rng.numpy: must be NumPy's MT19937 state as a save writes it")
    elif isinstance(numpy_state, tuple):  # the previous format: NumPy's own tuple
        if not (
            len(numpy_state) == 5
            and numpy_state[0] == "MT19937"
            and isinstance(numpy_state[1], np.ndarray)
            and numpy_state[1].shape == (624,)
            and numpy_state[1].dtype == np.uint32
            and is_int(numpy_state[2])
            and 0 <= numpy_state[2] <= 624
            and is_int(numpy_state[3])
            and numpy_state[3] in (0, 1)
            and _real(numpy_state[4])
        ):
            p.append(
                "rng.numpy: must be NumPy's MT19937 state ('MT19937', 624 uint32 keys, "
                "pos, has_gauss, cached_gaussian)"
            )
    else:
        p.append("rng.numpy: must be NumPy's RNG state")
    python_state = rng.get("python")
    if isinstance(python_state, dict):
        version, internal = python_state.get("version"), python_state.get("state")
        gauss = python_state.get("gauss_next")
    elif isinstance(python_state, tuple) and len(python_state) == 3:  # the previous format
        version, internal, gauss = python_state
    else:
        version = internal = gauss = "missing"
    if not (
        is_int(version)
        and version == 3
        and isinstance(internal, (list, tuple))
        and len(internal) == 625
        and all(type(x) is int and 0 <= x < 2**32 for x in internal)  # random.setstate's
        and (gauss is None or _real(gauss))
    ):
        p.append(
            "rng.python: must be Python's random state (version 3, 625 integers, "
            "gauss_next) as a save writes it"
        )
    return p


def _dense(value: Any) -> TypeGuard[torch.Tensor]:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def _real(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
        isinstance(v, torch.Tensor) and v.numel() == 1
    )


def _backend_problems(backend: dict[str, Any]) -> list[str]:
    """What keeps a backend's `load_state` from reading `backend` beyond its weights: the
    step counters, the schedule position, the optimizer state by parameter name (each a
    dict of tensors and numbers) and the loss scaler, as `export_state` writes them."""
    p = []
    for key in ("steps", "overflow_steps"):
        if key in backend and not is_count(backend[key]):
            p.append(f"backend.{key}={shown(backend[key])}: must be an integer from 0 to 2**63 - 1")
    scheduler = backend.get("scheduler")
    if scheduler is not None and not (
        isinstance(scheduler, dict) and ("steps" not in scheduler or is_count(scheduler["steps"]))
    ):
        p.append(f"backend.scheduler={shown(scheduler)}: must be {{'steps': int >= 0}} or None")
    optim = backend.get("optimizer")
    if optim is not None:
        state = optim.get("state") if isinstance(optim, dict) else None
        family = optim.get("family") if isinstance(optim, dict) else None
        if not isinstance(optim, dict) or not (family is None or isinstance(family, str)):
            p.append(
                f"backend.optimizer={shown(optim)}: must be a dict with 'family' (a name or "
                "None) and 'state'"
            )
        elif state is not None and not (
            isinstance(state, dict)
            and all(
                isinstance(name, str)
                and isinstance(st, dict)
                and all(isinstance(k, str) and _real_or_tensor(v) for k, v in st.items())
                for name, st in state.items()
            )
        ):
            p.append(
                f"backend.optimizer.state={shown(state)}: must map parameter names to dicts "
                "of tensors and numbers"
            )
    scaler = backend.get("scaler")
    if scaler is not None and not (
        isinstance(scaler, dict)
        and all(isinstance(k, str) for k in scaler)
        and all(_real(scaler[k]) for k in ("scale", "init_scale", "growth_tracker") if k in scaler)
    ):
        p.append(f"backend.scaler={shown(scaler)}: must be the loss scaler's numbers or None")
    return p


def _real_or_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor) or _real(v)


def payload_problems(payload: dict[str, Any]) -> list[str]:
    """What is wrong with the layout of a loaded payload (empty when it is one `save`
    writes): each entry of the module docstring's table has the type a resume relies on."""
    p: list[str] = []
    step = payload.get("step")
    if not is_count(step):
        p.append(f"step={shown(step)}: must be an integer >= 0 (and below 2**63)")
    config = payload.get("config")
    bad = settings_problem(config)
    if bad:
        p.append(f"config={shown(config)}: must be a dict of settings ({bad})")
    backend = payload.get("backend")
    if not isinstance(backend, dict):
        p.append(f"backend={shown(backend)}: must be a dict (weights, optimizer, scaler)")
    else:
        bad = _tensors_problem("backend.model", backend.get("model"), "parameter")
        if bad:
            p.append(bad)
        else:
            where = _first_not_dense(backend, "backend")
            if where:
                p.append(f"{where}: must be a dense (strided) tensor, as a save writes it")
        p += _backend_problems(backend)
    buffers = payload.get("buffers")
    if buffers is not None:
        bad = _tensors_problem("buffers", buffers, "buffer")
        if bad:
            p.append(bad)
    p += _rng_problems(payload.get("rng"))
    data = payload.get("data")
    if data is not None and not (
        isinstance(data, dict)
        and set(data) <= {"epoch", "offset"}
        and all(is_count(v) for v in data.values())
    ):
        p.append(
            f"data={shown(data)}: must be {{'epoch': int, 'offset': int}}, each from 0 to 2**63 - 1"
        )
    ref = payload.get("reference_batch")
    if ref is not None and (not is_count(ref) or ref < 1):
        p.append(f"reference_batch={shown(ref)}: must be an integer >= 1 (and below 2**63)")
    model = payload.get("model")
    if model is not None:
        if not isinstance(model, dict):
            p.append(f"model={shown(model)}: must be a dict with 'name' and 'options' or None")
        else:
            name, options = model.get("name"), model.get("options")
            if name is not None and (not isinstance(name, str) or not name):
                p.append(f"model.name={shown(name)}: must be a model name or None")
            bad = None if options is None else settings_problem(options)
            if bad:
                p.append(
                    f"model.options={shown(options)}: must map option names to plain values ({bad})"
                )
    return p
