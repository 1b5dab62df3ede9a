"""FSDP2 in a dry run: N ranks stood in for by a fake process group, your blocks sharded as
the FSDP backend shards them.

* `fake_process_group(world_size)`: the default process group over the "fake" backend
  (`torch.testing._internal.distributed.fake_pg`), which completes every collective at
  once without moving data, as rank 0 of `world_size`; destroyed when the block ends,
  even when it raises. A process that already has a default group (a live Session's
  engine, a launcher's) is refused before anything changes (`group_problem`): the dry run
  would otherwise replace or share it.
* `shard(module, config, policy, mesh)`: `fully_shard` on every unit of `fsdp_units` (the
  FSDP backend's `sharding_units`), then on the root,
  with the FSDP backend's options (`workbench.train.backends.fsdp`): reshard after forward
  under "full_shard", not under "shard_grad_op" and "no_shard" (a 2-D mesh of N replicas x
  1 shard); the mixed-precision policy of the precision (`mixed_precision`). The mesh is
  made outside the fake mode (it reads rank numbers), the sharding inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from workbench.config import FsdpMode, Precision, TrainConfig
from workbench.problems import SettingProblem

_HALF = {Precision.AMP_BF16: torch.bfloat16, Precision.AMP_FP16: torch.float16}


def group_problem(world_size: int) -> SettingProblem | None:
    """Why a fake group of `world_size` ranks cannot be formed here (None when it can)."""
    import torch.distributed as dist

    if not dist.is_available():
        return SettingProblem(
            "world_size",
            world_size,
            "this torch has no torch.distributed: FSDP cannot be simulated",
        )
    if dist.is_initialized():
        return SettingProblem(
            "world_size",
            world_size,
            f"a process group is already initialised in this process (backend "
            f"{dist.get_backend()!r}, {dist.get_world_size()} rank(s)); the dry run forms its "
            "own fake group of ranks: close what holds it (session.close()) or run the dry "
            "run in another process",
        )
    return None


@contextlib.contextmanager
def fake_process_group(
    world_size: int, destroy: Callable[[], None] | None = None
) -> Iterator[None]:
    """The default group over the fake backend, this process rank 0 of `world_size`;
    `destroy` ends it (default: `torch.distributed.destroy_process_group`)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        (destroy or dist.destroy_process_group)()


def make_mesh(mode: FsdpMode, world_size: int, device_type: str) -> Any:
    """The device mesh the FSDP backend builds for `mode` (outside the fake mode)."""
    from torch.distributed.device_mesh import init_device_mesh

    if mode is FsdpMode.NO_SHARD:
        return init_device_mesh(device_type, (world_size, 1), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world_size,))


def mixed_precision(precision: Precision, reduce_fp32: bool) -> Any:
    """FSDP2's `MixedPrecisionPolicy` as the FSDP backend builds it: AMP gathers 16-bit
    copies for compute; pure bf16 casts nothing (its shards are bf16); gradients reduced in
    fp32 when `reduce_fp32` (under 16-bit compute), else in the 16-bit dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    half = _HALF.get(precision)
    if half is not None:
        return MixedPrecisionPolicy(
            param_dtype=half, reduce_dtype=torch.float32 if reduce_fp32 else half
        )
    if precision is Precision.BF16_TRUE and reduce_fp32:
        return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)


def shard(module: nn.Module, config: TrainConfig, policy: Any, mesh: Any) -> None:
    """`fully_shard` each unit of `config.fsdp_units` as the FSDP backend does
    (`sharding_units`), then the root (inside the fake mode)."""
    from torch.distributed.fsdp import fully_shard

    from workbench.train.backends.fsdp import sharding_units

    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": policy,
        "reshard_after_forward": FsdpMode(config.fsdp) is FsdpMode.FULL_SHARD,
    }
    for unit, after_forward in sharding_units(module, config):
        fully_shard(unit, **{**options, "reshard_after_forward": after_forward})
    fully_shard(module, **options)


def units_refusal(module: nn.Module, config: TrainConfig) -> SettingProblem | None:
    """The problem of `config.fsdp_units` on `module` (names matching no module, a tied
    weight split over two units), or None."""
    from workbench.export.job_parallel import resolve_units
    from workbench.train.techniques.recompute import checkpointable_modules

    spec = str(config.fsdp_units)
    _, problem = resolve_units(module, spec, checkpointable_modules(module))
    if problem is None:
        return None
    return SettingProblem("fsdp_units", spec, problem)


__all__ = [
    "units_refusal",
    "fake_process_group",
    "group_problem",
    "make_mesh",
    "mixed_precision",
    "shard",
]
