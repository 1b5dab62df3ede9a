"""workbench: make PyTorch training faster and leaner, interactively.

    import workbench
    workbench.estimate_memory(model="llama-3-8b", zero_stage=3, gpus=8)   # will it fit?
    workbench.plan(model="llama-3-8b", gpu="h100", global_batch=256)      # what to run?
    s = workbench.Session(workbench.TrainConfig(micro_batch=8))          # a live loop
    workbench.dashboard(s)                                               # in a notebook

Imports are lazy so `workbench estimate` and `import workbench` stay fast and do not pull
in torch, deepspeed or ipywidgets until a name that needs them is used. Tab completion
lists every public name (`__dir__`), and type checkers see them all (`TYPE_CHECKING`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from workbench.kernel import check_kernel as _check_kernel
from workbench.version import __version__

_check_kernel()  # a notebook kernel from another environment than .venv is told so

# bitsandbytes' CPU backend logs one warning, its only message, when it is first imported
# (by QLoRA, peft or transformers) on a CPU with AVX512-bf16 and finds no optional faster
# 4-bit kernel from the Hugging Face hub (the `kernels` package): its own kernel runs then.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

#: public name -> the module it lives in (imported on first use)
_LAZY = {
    # will it fit?
    "estimate_memory": "workbench.estimate",
    "MemoryEstimate": "workbench.estimate",
    "predict_memory": "workbench.prediction",
    "count_parameters": "workbench.modelstats",
    # which setup should I run?
    "plan": "workbench.planner",
    "PlanResult": "workbench.planner",
    # settings
    "TrainConfig": "workbench.config",
    # DeepSpeed JSON <-> TrainConfig
    "to_deepspeed": "workbench.deepspeed",
    "from_deepspeed": "workbench.deepspeed",
    # the live training loop and what it returns
    "Session": "workbench.train.session",
    "SessionError": "workbench.train.session",
    "SessionStateError": "workbench.train.session",
    "StepRecord": "workbench.train.records",
    "Event": "workbench.train.records",
    "MemoryReport": "workbench.train.measure.memory",
    "ProfileResult": "workbench.train.measure.profiler",
    "find_max_micro_batch": "workbench.train.measure.batch_finder",
    "simulate_memory": "workbench.train.dry_run",
    # what each optimization buys, measured
    "ladder": "workbench.train.ladder",
    "LadderResult": "workbench.train.ladder",
    # a run the workbench does not own: your Trainer, Lightning or loop
    "observe": "workbench.integrations",
    # hardware and advice
    "Sampler": "workbench.monitor",
    "advise": "workbench.advisor",
    "Advice": "workbench.advisor",
    "throughput": "workbench.rates",
    # panels
    "dashboard": "workbench.ui",
    "EstimatorPanel": "workbench.ui",
    "TrainingPanel": "workbench.ui",
    "MonitorPanel": "workbench.ui",
}

__all__ = [
    "Advice",
    "EstimatorPanel",
    "Event",
    "LadderResult",
    "MemoryEstimate",
    "MemoryReport",
    "MonitorPanel",
    "PlanResult",
    "ProfileResult",
    "Sampler",
    "Session",
    "SessionError",
    "SessionStateError",
    "StepRecord",
    "TrainConfig",
    "TrainingPanel",
    "advise",
    "count_parameters",
    "dashboard",
    "estimate_memory",
    "find_max_micro_batch",
    "from_deepspeed",
    "ladder",
    "observe",
    "plan",
    "predict_memory",
    "simulate_memory",
    "throughput",
    "to_deepspeed",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover - what the lazy names are, for type checkers
    from workbench.advisor import Advice, advise
    from workbench.config import TrainConfig
    from workbench.deepspeed import from_deepspeed, to_deepspeed
    from workbench.estimate import MemoryEstimate, estimate_memory
    from workbench.integrations import observe
    from workbench.modelstats import count_parameters
    from workbench.monitor import Sampler
    from workbench.planner import PlanResult, plan
    from workbench.prediction import predict_memory
    from workbench.rates import throughput
    from workbench.train.dry_run import simulate_memory
    from workbench.train.ladder import LadderResult, ladder
    from workbench.train.measure.batch_finder import find_max_micro_batch
    from workbench.train.measure.memory import MemoryReport
    from workbench.train.measure.profiler import ProfileResult
    from workbench.train.records import Event, StepRecord
    from workbench.train.session import Session, SessionError, SessionStateError
    from workbench.ui.dashboard import dashboard
    from workbench.ui.estimator import EstimatorPanel
    from workbench.ui.monitor import MonitorPanel
    from workbench.ui.training import TrainingPanel


#: subpackages a user reaches as attributes (`workbench.compress.quantize(...)`)
_SUBPACKAGES = (
    "compress",
    "estimate",
    "export",
    "integrations",
    "monitor",
    "planner",
    "train",
    "ui",
)


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBPACKAGES:
        package = importlib.import_module(f"workbench.{name}")
        globals()[name] = package
        return package
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Every public name, imported or not yet (tab completion in a notebook)."""
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))
