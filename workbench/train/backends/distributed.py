"""`DistributedBackend`: the lifecycle every engine over a process group shares.

DeepSpeed (`deepspeed.py`), FSDP2 (`fsdp.py`), tensor parallelism (`tensor_parallel.py`)
and pipelining (`pipeline.py`) subclass it. It holds, once for all of them:

* building: the config checked (`_refuse`, the engine's own refusals), the device (the
  session's, default this rank's GPU, else the CPU), the process group leased
  (`process_group.ProcessGroupLease`) and released again if `_build` fails;
* the learning rate: `lr` and the schedule's value set after every applied step
  (`_set_lr`, on the optimizer `_lr_optimizer` names);
* the model-state bytes counted from this rank's own tensors (shards' local storage);
* the backend-neutral state a switch or a checkpoint carries (`_neutral_state`);
* closing: idempotent, the optimizer's state dropped, the process group released.

A subclass builds its engine in `_build(model, state)` and sets `module`, `optimizer` and
`_named` (its trainable parameters by name); it adds what it owns to `_teardown` and
overrides the rest of the `Backend` contract (autocast, backward, step, export_state).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from workbench.config import OptimizerName, TrainConfig
from workbench.inputs import shown
from workbench.train.backends.base import Backend, ModelStateBytes, rank_device, storage_bytes
from workbench.train.backends.optimizer import OPTIMIZER_FAMILY, set_lr
from workbench.train.backends.process_group import ProcessGroupLease
from workbench.train.schedule import lr_at

#: the version of the backend-neutral state the distributed engines write
STATE_FORMAT = 1


class DistributedBackend(Backend):
    """The shared lifecycle of the engines over a process group (module docstring)."""

    #: whether the engine leases the process group as DeepSpeed's (its accelerator too)
    deepspeed_lease = False

    def __init__(
        self,
        config: TrainConfig,
        model: nn.Module,
        *,
        state: dict[str, Any] | None = None,
        device: torch.device | None = None,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise ValueError(f"config={shown(config)}: must be a TrainConfig")
        self._refuse(config)
        self.config = config
        self.device = torch.device(device) if device is not None else rank_device()
        self._closed = True  # until fully built
        self.module: Any = None
        self.optimizer: Any = None
        self._named: list[tuple[str, nn.Parameter]] = []
        self._frozen: list[tuple[str, nn.Parameter]] = []
        self.steps = 0
        self.overflow_steps = 0
        self._grads_bytes = 0
        # the state layout a switch between engines carries ("adam", "sgd", None)
        self._family = OPTIMIZER_FAMILY[OptimizerName(config.optimizer)]
        self._fresh()
        ProcessGroupLease.acquire(self.device, deepspeed=self.deepspeed_lease)
        try:
            with self._building():
                self._build(model, state)
        except BaseException:
            self._teardown()
            ProcessGroupLease.release()
            raise
        self._closed = False

    # ------------------------------------------------------------------ a subclass's parts
    def _refuse(self, config: TrainConfig) -> None:
        """Raise when this engine cannot train `config` (before any process group)."""

    def _fresh(self) -> None:
        """Set the engine's own fields before `_build` (what `_teardown` reads)."""

    def _building(self) -> AbstractContextManager[Any]:
        """The context `_build` runs in (FSDP2's and torch's parallel APIs: the session's
        CUDA device as the current one)."""
        return on_device(self.device)

    def _build(self, model: nn.Module, state: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the engine owns beyond the optimizer and module (its groups, hooks,
        DeepSpeed's engine). Called once, at close or when building fails."""

    def _lr_optimizer(self) -> Any:
        """The optimizer whose param_groups hold the learning rate."""
        return self.optimizer

    def _params_held(self) -> Iterable[torch.Tensor]:
        """Every parameter this rank holds (frozen ones too), for `model_state_bytes`."""
        return (p for _, p in self._named)

    @property
    def zero_stage(self) -> int:
        """No DeepSpeed ZeRO (DeepSpeed's backend reads its engine's): what records carry;
        FSDP2's sharding is in the records' `fsdp` as set."""
        return 0

    # ------------------------------------------------------------------ the learning rate
    @property
    def lr(self) -> float:
        """Learning rate of the next optimizer step."""
        return float(self._lr_optimizer().param_groups[0]["lr"])

    def _set_lr(self) -> None:
        set_lr(self._lr_optimizer(), lr_at(self.config, self.steps, float(self.config.lr)))

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ memory
    def model_state_bytes(self) -> ModelStateBytes:
        """This rank's bytes, counted from its own (shard) storage: the parameters it
        holds, the gradients (as they were just before the last optimizer step, or now
        between backward and step), every optimizer-state tensor."""
        params = storage_bytes(local_tensor(p) for p in self._params_held())
        grads = self._count_grads() or self._grads_bytes
        optim = storage_bytes(
            local_tensor(v) for st in self.optimizer.state.values() for v in st.values()
        )
        return ModelStateBytes(params_bytes=params, grads_bytes=grads, optimizer_bytes=optim)

    def _count_grads(self) -> int:
        return storage_bytes(local_tensor(p.grad) for _, p in self._named if p.grad is not None)

    # ------------------------------------------------------------------ state
    def _neutral_state(
        self,
        model: dict[str, torch.Tensor],
        optimizer_state: dict[str, dict[str, Any]],
        family: str | None,
        scaler: Any = None,
    ) -> dict[str, Any]:
        """The backend-neutral state every engine carries (see `plain.py`)."""
        return {
            "format": STATE_FORMAT,
            "model": model,
            "optimizer": {"family": family, "state": optimizer_state},
            "scaler": scaler,
            "scheduler": {"steps": self.steps},
            "steps": self.steps,
            "overflow_steps": self.overflow_steps,
        }

    def _saved_optimizer(self, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """A neutral state's optimizer states by parameter name, when they are of this
        engine's optimizer family (`_family`); else none (a new family starts fresh)."""
        optim = state.get("optimizer") or {}
        saved = optim.get("state") or {}
        family = optim.get("family")
        return saved if saved and family is not None and family == self._family else {}

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Free the engine, its copy of the model and the optimizer; drop the process
        group if this was the last engine using one this process created. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._teardown()
        ProcessGroupLease.release()

    def _teardown(self) -> None:
        if self.optimizer is not None:
            with contextlib.suppress(Exception):
                self.optimizer.state.clear()
                self.optimizer.param_groups.clear()
        self.optimizer = None
        self.module = None
        self._named = []
        self._frozen = []
        self._release()
        gc.collect()

    def __enter__(self) -> DistributedBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def on_device(device: torch.device) -> AbstractContextManager[Any]:
    """`torch.cuda.device(device)` for a CUDA device (the current device of this thread
    while the block runs, restored after), nothing otherwise."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return nullcontext()


def local_tensor(t: Any) -> Any:
    """A DTensor's local shard (its padded storage), or the tensor itself."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


__all__ = ["STATE_FORMAT", "DistributedBackend", "local_tensor", "on_device"]
