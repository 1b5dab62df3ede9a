"""A dry run in a child process, for a process that already holds a process group.

The dry run forms its own fake process group of N ranks; a process where a distributed
Session (DeepSpeed, FSDP) or a launcher already holds the default group cannot form one
beside it. `simulate_in_child` runs `workbench.simulate_memory` in a fresh interpreter
(multiprocessing's "spawn": nothing of this process's group, threads or CUDA state is
inherited) and returns its `DryRun`. What crosses to the child is pickled: a built-in
model's name and options, or the module's meta copy (shapes, dtypes and ties, no values),
the example batch, the config and the loss function. A module or loss function defined in
a notebook or script (`__main__`) cannot be imported by the child: that is refused with
what to do instead (run the dry run before starting the distributed session, or define
them in an importable module). The child's first dry run imports torch (and DeepSpeed):
tens of seconds on a small CPU.
"""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

from torch import nn

from workbench.problems import SettingProblem
from workbench.train.dry_run.problems import DryRunError


def _run(payload: bytes) -> bytes:
    """The child: unpickle the arguments, run the dry run, pickle its result (or the
    DryRunError's problems)."""
    from workbench.train.dry_run import simulate_memory

    args, kwargs = pickle.loads(payload)
    try:
        return pickle.dumps(("ok", simulate_memory(*args, **kwargs)))
    except DryRunError as exc:
        return pickle.dumps(("problems", list(exc.problems)))


def simulate_in_child(model: Any, config: Any, **kwargs: Any) -> Any:
    """`simulate_memory(model, config, **kwargs)` in a spawned child (module docstring);
    raises `DryRunError` naming what cannot cross, or the child's problems."""
    from workbench.train.dry_run.fake import meta_twin

    if isinstance(model, nn.Module):
        model = meta_twin(model)
    kwargs["progress"] = False  # the child's stderr is not the caller's terminal
    problems = [
        SettingProblem(name, _shown(value), _WHY)
        for name, value in (("model", model), ("loss_fn", kwargs.get("loss_fn")))
        if value is not None and _defined_in_main(value)
    ]
    if problems:
        raise DryRunError(problems)
    payload = pickle.dumps(((model, config), kwargs))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        kind, value = pickle.loads(pool.apply(_run, (payload,)))
    if kind == "problems":
        raise DryRunError(value)
    return value


_WHY = (
    "this process holds a process group (a distributed session), so the dry run runs in a "
    "child process, which cannot import what a notebook or script defines: run "
    "simulate_memory before starting the distributed session, or define it in an "
    "importable module"
)


def _defined_in_main(value: Any) -> bool:
    kind = value if isinstance(value, type) else type(value)
    if callable(value) and not isinstance(value, nn.Module):
        return getattr(value, "__module__", None) == "__main__"
    return any(getattr(k, "__module__", None) == "__main__" for k in _classes(value, kind))


def _classes(value: Any, kind: type) -> list[type]:
    if isinstance(value, nn.Module):
        return [type(m) for m in value.modules()]
    return [kind]


def _shown(value: Any) -> str:
    return getattr(value, "__qualname__", None) or type(value).__name__


__all__ = ["simulate_in_child"]
