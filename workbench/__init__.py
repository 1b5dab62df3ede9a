"""workbench: make PyTorch training faster and leaner, interactively.

Imports are lazy so `workbench estimate` and `import workbench` stay fast and
do not pull in torch, deepspeed or ipywidgets until they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "estimate_memory": "workbench.estimate",
    "MemoryEstimate": "workbench.estimate",
    "TrainConfig": "workbench.config",
    "Session": "workbench.train.session",
    "find_max_micro_batch": "workbench.train.batch_finder",
    "Sampler": "workbench.monitor",
    "advise": "workbench.advisor",
    "dashboard": "workbench.ui",
    "EstimatorPanel": "workbench.ui",
    "TrainingPanel": "workbench.ui",
    "MonitorPanel": "workbench.ui",
    "count_parameters": "workbench.modelstats",
}

__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from workbench.config import TrainConfig  # noqa: F401
    from workbench.estimate import MemoryEstimate, estimate_memory  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
