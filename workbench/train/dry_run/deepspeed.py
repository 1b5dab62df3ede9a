"""DeepSpeed in a dry run: its own engine (ZeRO 0-3, its 16-bit modes) on fake tensors, N
ranks stood in for by a fake process group.

The Session trains through DeepSpeed whenever `workbench.engines.engine_for` says so (ZeRO >=
1, DeepSpeed's fp16/bf16, or several ranks without FSDP: its data parallelism is ZeRO-0), so
a dry run of those setups runs `deepspeed.initialize` itself, with the dict the Session's
backend hands it (`workbench.train.backends.deepspeed.engine_config`), on the fake module:
DeepSpeed's flat 16-bit buffers, fp32 master partitions, gradient partitions, reduce and
all-gather buckets, ZeRO-3's partitioned parameters and their gathering are its own code
allocating fake tensors, tracked by PyTorch's memory tracker like any other tensor.

What a dry run changes in DeepSpeed, only while it runs (`deepspeed_dry_run`):

* the default process group is the fake backend's (`fake_process_group`), started through
  `deepspeed.init_distributed` with the launcher variables (RANK, LOCAL_RANK, WORLD_SIZE)
  set for rank 0 of N and put back after; DeepSpeed's communication layer is destroyed
  with it (`deepspeed.comm.destroy_process_group`, which drops its cached sub-groups);
* the checks that read a value back from the device (the fp16 overflow flag, the
  gradient norm's finiteness, ZeRO-0's 16-bit optimizers' gradient norm, ZeRO-3's "same
  parameter order on every rank" broadcast) answer "no overflow, finite, same" without
  reading: fake tensors hold no values. The steps therefore never skip, as a healthy
  run's steps do not;
* the module's own `to`/`half`/`bfloat16`/`float` return it unchanged: `nn.Module._apply`
  cannot swap fake parameters, so the module comes already cast (`cast_copy`) and on its
  device, which is what those calls would make of it;
* ZeRO-3's process-wide `torch.nn.functional.linear` patch is put back after, as the
  backend does (`Zero3LinearPatch`);
* DeepSpeed's CPU accelerator (what `device="auto"` simulates with) answers that fp16 is
  supported: the simulation stands for a GPU's run, and DeepSpeed's fp16 is torch
  operators on fake tensors.

`categories` files what the tracker saw: the module's parameters (the flat 16-bit buffer
under ZeRO 1/2, each rank's partition under ZeRO-3, counted as "parameters"), the fp32
master partitions and the base optimizer's states ("optimizer states"), DeepSpeed's
gradient partitions and buckets (relabelled as "gradients" at the start of each
optimizer step from the engine's own containers; during the backward they are what the
tracker calls temporaries, which is where they live). Each reduce's flattened copy, which
no container holds, is told apart by where it is made (`DeepSpeedKinds`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.estimate import PHASES
from workbench.train.dry_run.fsdp import fake_process_group

#: The launcher variables DeepSpeed reads, as rank 0 of a fake group sets them.
_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Module methods DeepSpeed's engine calls on the model that `_apply` cannot run on fake
#: parameters; the dry run's module is already what they would make.
_MODULE_CASTS = ("to", "half", "bfloat16", "float", "cuda", "cpu")


def _no_overflow(*_: Any, **__: Any) -> bool:
    return False


def _supported(*_: Any, **__: Any) -> bool:
    return True


def _same_on_every_rank(*_: Any, **__: Any) -> None:
    return None


def _weight_norm_unread(parameters: Any, norm_type: float = 2.0, mpu: Any = None) -> float:
    """DeepSpeed's `get_weight_norm` (what its ZeRO-0 16-bit optimizers clip and check by)
    without the read back: each gradient's norm is computed as DeepSpeed computes it (an
    fp32 copy of it at a time, a transient the step holds), and the total answered finite,
    as the overflow checks are. `mpu`: model parallelism, never simulated."""
    del mpu
    tensors = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    for p in tensors:
        p.data.float().norm(norm_type)
    return 1.0


@contextlib.contextmanager
def deepspeed_dry_run(world_size: int, device: torch.device) -> Iterator[None]:
    """DeepSpeed's communication over a fake group of `world_size` ranks and its
    read-back checks answered without reading (see the module docstring); everything is
    put back when the block ends, even when it raises. DeepSpeed's own lines (its
    accelerator, its comm op build) go to stderr, so stdout stays the caller's (a
    `--json` answer)."""
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor")
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*deprecated")
        warnings.filterwarnings("ignore", message=".*reduce_scatter_tensor.*deprecated")
        with _deepspeed_dry_run(world_size, device):
            yield


@contextlib.contextmanager
def _deepspeed_dry_run(world_size: int, device: torch.device) -> Iterator[None]:
    import deepspeed
    import deepspeed.accelerator.real_accelerator as ds_accelerator
    import deepspeed.comm as ds_comm
    import deepspeed.runtime.fp16.fused_optimizer as ds_fp16_fused
    import deepspeed.runtime.fp16.unfused_optimizer as ds_fp16_unfused
    import deepspeed.runtime.utils as ds_utils
    import deepspeed.runtime.zero.partition_parameters as ds_partition
    import deepspeed.runtime.zero.partitioned_param_coordinator as ds_coordinator
    import deepspeed.runtime.zero.stage3 as ds_stage3
    import deepspeed.runtime.zero.stage_1_and_2 as ds_stage12

    from workbench.train.backends.deepspeed import Zero3LinearPatch
    from workbench.train.backends.process_group import forget_stale_groups
    from workbench.train.devices import use_deepspeed_accelerator

    saved_env = {k: os.environ.get(k) for k in _ENV}
    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    with contextlib.ExitStack() as ctx:
        patch = ctx.enter_context(_Patches())
        patch(ds_stage12, "is_invalid_grad_norm", _no_overflow)
        patch(ds_stage3, "is_invalid_grad_norm", _no_overflow)
        patch(ds_stage12.DeepSpeedZeroOptimizer, "has_overflow", _no_overflow)
        patch(ds_stage3.DeepSpeedZeroOptimizer_Stage3, "has_overflow", _no_overflow)
        patch(ds_utils.CheckOverflow, "has_overflow", _no_overflow)
        patch(ds_utils.CheckOverflow, "check", _no_overflow)
        for mod in (ds_fp16_fused, ds_fp16_unfused):  # ZeRO-0's fp16 and bf16 optimizers
            patch(mod, "get_weight_norm", _weight_norm_unread)
        for mod in (ds_partition, ds_coordinator, ds_stage3):
            if hasattr(mod, "assert_ints_same_as_other_ranks"):
                patch(mod, "assert_ints_same_as_other_ranks", _same_on_every_rank)
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="0",
        )
        logger.setLevel(logging.ERROR)
        forget_stale_groups()
        # DeepSpeed's accelerator is process-wide: the one in place (or none chosen yet)
        # is put back after the block, so a dry run on the CPU leaves a GPU run's own
        ctx.callback(setattr, ds_accelerator, "ds_accelerator", ds_accelerator.ds_accelerator)
        accelerator = use_deepspeed_accelerator(device)
        if not accelerator.is_fp16_supported():  # a CPU simulating a GPU's fp16 run
            patch(type(accelerator), "is_fp16_supported", _supported)
        excepthook = sys.excepthook  # each new group wraps it ("[rank0]: " prefixes)
        ctx.callback(setattr, sys, "excepthook", excepthook)
        Zero3LinearPatch.acquire()
        try:
            with fake_process_group(world_size, destroy=_destroy(ds_comm)):
                deepspeed.init_distributed(
                    dist_backend="fake", auto_mpi_discovery=False, verbose=False
                )
                yield
        finally:
            Zero3LinearPatch.release()
            logger.setLevel(level)
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _destroy(ds_comm: Any) -> Any:
    def destroy() -> None:
        if ds_comm.is_initialized():
            ds_comm.destroy_process_group()  # also drops DeepSpeed's cached sub-groups
        else:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    return destroy


class _Patches:
    """Attributes replaced while the block runs, put back in reverse order after."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Any:
        return self

    def __call__(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            owner, name, value = self._undo.pop()
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_ABSENT = object()


def build_engine(
    module: nn.Module, config: TrainConfig, world_size: int, impl: str
) -> tuple[Any, dict[str, Any]]:
    """`deepspeed.initialize` on the fake `module` (cast already) with the Session's
    engine config; the base optimizer in implementation `impl`. Returns the engine and the
    config dict."""
    import deepspeed

    from workbench.train.backends.deepspeed import engine_config

    params = [p for p in module.parameters() if p.requires_grad]
    ds_config = engine_config(config, world_size, sum(p.numel() for p in params))
    for name in _MODULE_CASTS:
        setattr(module, name, _unchanged(module))
    engine, _, _, _ = deepspeed.initialize(  # inside the fake mode (the caller's)
        args=argparse.Namespace(device_rank=0),
        model=module,
        model_parameters=params,
        config=ds_config,
        dist_init_required=False,
    )
    for group in base_optimizer(engine).param_groups:
        group["foreach"] = impl == "foreach"
        if "fused" in group:
            group["fused"] = impl == "fused"
    return engine, ds_config


def _unchanged(module: nn.Module) -> Any:
    def same(*_: Any, **__: Any) -> nn.Module:
        return module

    return same


def base_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The torch optimizer that steps the fp32 masters (DeepSpeed's wrappers hold it as
    `.optimizer`; stage 0 in fp32 or AMP steps it directly)."""
    opt = engine.optimizer
    while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt  # type: ignore[no-any-return]


def master_tensors(engine: Any) -> list[torch.Tensor]:
    """The fp32 masters: DeepSpeed's own (ZeRO 1/2's `single_partition_of_fp32_groups`,
    ZeRO-3's `fp32_partitioned_groups_flat`, which its base optimizer holds only while it
    steps, stage 0's 16-bit optimizers' `fp32_groups(_flat)`), and the base optimizer's
    parameters where they are not the module's (stage 0 in fp32 or AMP steps the
    module's own)."""
    own = {id(p) for p in engine.module.parameters()}
    held = vars(engine.optimizer)
    found = [t for name in _MASTER_CONTAINERS for t in _tensors(held.get(name))]
    found += [
        p
        for group in base_optimizer(engine).param_groups
        for p in group["params"]
        if id(p) not in own
    ]
    return found


#: DeepSpeed's names for its fp32 master copies.
_MASTER_CONTAINERS = (
    "single_partition_of_fp32_groups",
    "fp32_partitioned_groups_flat",
    "fp32_groups_flat",
    "fp32_groups",
)


def gradient_tensors(engine: Any) -> list[torch.Tensor]:
    """DeepSpeed's gradients after the backward: the module's `.grad`s (stage 0 and 1
    keep them) and its gradient partitions (ZeRO 1/2's averaged gradients, ZeRO-3's
    contiguous partitions); the masters' fp32 gradients where they exist."""
    found: list[torch.Tensor] = [p.grad for p in engine.module.parameters() if p.grad is not None]
    for name, value in vars(engine.optimizer).items():
        if name in _GRADIENT_CONTAINERS:
            found += _tensors(value)
    found += [m.grad for m in master_tensors(engine) if m.grad is not None]
    return found


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors in `value`: containers and DeepSpeed's own objects (its gradient
    buckets, ...), walked `_DEPTH` deep."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > _DEPTH:
        return []
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, depth + 1)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, depth + 1)]
    if type(value).__module__.startswith("deepspeed.") and hasattr(value, "__dict__"):
        return [t for v in vars(value).values() for t in _tensors(v, depth + 1)]
    return []


_DEPTH = 3


def parameter_tensors(engine: Any) -> list[torch.Tensor]:
    """The module's parameter storage: the parameters (views of ZeRO 1/2's flat 16-bit
    buffer), or under ZeRO-3 each one's partition (`ds_tensor`)."""
    found: list[torch.Tensor] = []
    for p in engine.module.parameters():
        part = getattr(p, "ds_tensor", None)
        found.append(part if isinstance(part, torch.Tensor) else p)
    return found


def engine_tensors(engine: Any) -> list[torch.Tensor]:
    """Every tensor DeepSpeed's optimizer wrapper holds (its flat buffers, partitions,
    gradient containers, bookkeeping)."""
    return _tensors(list(vars(engine.optimizer).values()))


#: The tracker's kind of what DeepSpeed's `allreduce_bucket` makes (`DeepSpeedKinds`).
FLAT_COPY = "DeepSpeed Flat Copy"
#: The tracker's kinds a DeepSpeed buffer may be filed under before it is told apart
#: (made during a forward, a backward, or built with the engine).
_MOVABLE = frozenset({"Other", "Activation", "Temp", "Gradient"})


class DeepSpeedKinds:
    """The tracker's `reclassify`: at each new highest moment, DeepSpeed's buffers alive
    then are moved from the kind the tracker filed them under (a tensor made in backward
    is a "Temp" to it, a gathered ZeRO-3 parameter a "Parameter") to what they are, each
    storage once, in this order: the flattened copies of ZeRO 0-2's reduces, the fp32
    masters (optimizer states), the reduce buckets (under ZeRO-3 counted with the
    gradients, as DeepSpeed's layout does), ZeRO-3's gathered parameters, the gradients
    (the module's `.grad`s, the gradient partitions), the masters' fp32 gradients,
    DeepSpeed's other buffers; during the optimizer step, what DeepSpeed's step makes
    outside the base optimizer (the flattened and upcast gradient partition before it
    becomes the masters' gradient) is a step temporary.

    The flattened copy of a reduce is what DeepSpeed's `allreduce_bucket` makes while it
    runs (the engine's for stage 0, the ZeRO 1/2 optimizer's): the bucket's gradients
    catted into one tensor (and cast to `communication_data_type` where that differs),
    all-reduced, copied back and dropped; nothing of DeepSpeed's holds it. Each of the two
    methods is wrapped on this engine's own objects, so the tracker files what it makes as
    "DeepSpeed Flat Copy" (`tagging`)."""

    def __init__(self, engine: Any, tracker: Any, device_type: str) -> None:
        self.engine = engine
        self.tracker = tracker
        self.device_type = device_type
        self.zero3 = int(engine.zero_optimization_stage()) == 3
        if not self.zero3:
            for owner in (engine, engine.optimizer):
                reduce = getattr(owner, "allreduce_bucket", None)
                if callable(reduce):
                    owner.allreduce_bucket = self._tagged(reduce)

    def _tagged(self, reduce: Any) -> Any:
        tracker = self.tracker

        @functools.wraps(reduce)
        def allreduce_bucket(*args: Any, **kwargs: Any) -> Any:
            with tracker.tagging(FLAT_COPY):
                return reduce(*args, **kwargs)

        return allreduce_bucket

    def _groups(self) -> list[tuple[str, frozenset[str], list[torch.Tensor]]]:
        held = vars(self.engine.optimizer)
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        buckets: list[torch.Tensor] = []
        for name, value in held.items():
            if name in _GRADIENT_CONTAINERS:
                grads += _tensors(value)
            elif "ipg" in name:
                buckets += _tensors(value)
        params = [p for p in self.engine.module.parameters() if hasattr(p, "ds_tensor")]
        gathered = [p.data for p in params if p.data.numel() > 0]
        fp32 = [m.grad for m in master_tensors(self.engine) if m.grad is not None]
        with_params = _MOVABLE | {"Parameter"}
        return [
            ("Optstate", _MOVABLE, master_tensors(self.engine)),
            ("Gradient" if self.zero3 else "DeepSpeed Buckets", _MOVABLE, buckets),
            ("ZeRO-3 Gathered", with_params, gathered),
            ("Gradient", _MOVABLE, grads),
            # made inside DeepSpeed's step, which the tracker files as optimizer states
            ("DeepSpeed fp32 Grad", _MOVABLE | {"Optstate"}, fp32),
            ("DeepSpeed Other", _MOVABLE, engine_tensors(self.engine)),
        ]

    def __call__(self, now: dict[str, int]) -> None:
        for kind, winfo in list(self.tracker.tagged.values()):
            if winfo.device.type != self.device_type:
                continue
            old = str(getattr(winfo.reftype, "value", winfo.reftype))
            if old != kind and old in _MOVABLE and winfo.mem_consumed:
                _move(now, old, kind, int(winfo.mem_consumed))
        kept: list[Any] = []
        seen: set[int] = set()
        for kind, movable, tensors in self._groups():
            for t in tensors:
                if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                    continue
                st = t.untyped_storage()
                kept.append(st)  # alive while counting, so ids are not reused
                if id(st) in seen:
                    continue
                seen.add(id(st))
                found = self.tracker.kind_of(st)
                if found is None:
                    continue
                old, nbytes = found
                if old != kind and old in movable and nbytes:
                    _move(now, old, kind, nbytes)
        if self.tracker.phase == PHASES[2]:
            _move(now, "Activation", "Optstate", now.get("Activation", 0))


def _move(now: dict[str, int], old: str, new: str, nbytes: int) -> None:
    now[old] = now.get(old, 0) - nbytes
    now[new] = now.get(new, 0) + nbytes


#: DeepSpeed's names for its gradient containers (ZeRO 1/2 and 3).
_GRADIENT_CONTAINERS = frozenset(
    {
        "averaged_gradients",
        "grads_in_partition",
        "grad_partitions_flat_buffer",
        "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
    }
)


__all__ = [
    "DeepSpeedKinds",
    "base_optimizer",
    "build_engine",
    "deepspeed_dry_run",
    "gradient_tensors",
    "engine_tensors",
    "master_tensors",
    "parameter_tensors",
]
