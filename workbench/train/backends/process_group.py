"""The default process group a distributed engine needs, shared by the engines alive in
this process and released by the last one.

In a notebook or script (one process, no launcher) an engine that needs a process group
(DeepSpeed, FSDP) gets rank 0 of 1 on a free loopback port: the lease sets MASTER_ADDR,
MASTER_PORT, RANK, LOCAL_RANK and WORLD_SIZE (only those a launcher has not set) and
creates the group with the backend the session's device needs (gloo on CPU; on CUDA,
NCCL for CUDA tensors plus gloo for CPU tensors, "cpu:gloo,cuda:nccl", since FSDP with
CPU offload reduces host tensors: its gradient norm, the loss scaler's found-inf flag and
the full-state gathers). Engines alive at the same time (the old and the new one during a live switch,
e.g. FSDP -> ZeRO-3) share it; the last one to close destroys it and restores the
environment, so a closed Session leaves nothing behind. Under a launcher the group is
the launcher's and is never destroyed here.

DeepSpeed keeps its own communication layer (`deepspeed.comm`) over torch's group: when a
DeepSpeed engine needs the group, the lease also starts that layer (on the existing group
if FSDP created it) and DeepSpeed's accelerator is switched to the session's device type.
A group DeepSpeed creates is NCCL only on CUDA, as DeepSpeed makes it; `device_types()`
tells an engine which device types a group can reduce (FSDP adds a group for host
tensors when it offloads over such a group).

DeepSpeed's CPU comm op, when all ranks share a host under its own launcher (LOCAL_SIZE =
the world size), gives each rank a 66 MB POSIX shared-memory segment it never unlinks:
on Linux /dev/shm would keep every run's segments in RAM until a reboot. Once every rank
has mapped its peers' (a barrier), each rank unlinks its own name here; the mappings stay
valid until the process exits (`workbench.export.job_common.release_shm_segment`,
which the exported DeepSpeed job calls too).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

import torch

from workbench.train.devices import communication_backend, use_deepspeed_accelerator
from workbench.train.launch.toolchain import use_interpreter_tools

_DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


class ProcessGroupLease:
    """Reference count on the default process group when this process created it.

    The one piece of process-wide state here, because torch.distributed's default group
    is process-wide itself (see the module docstring)."""

    users = 0
    created = False
    env_added: tuple[str, ...] = ()

    @classmethod
    def acquire(cls, device: torch.device, *, deepspeed: bool) -> None:
        import torch.distributed as dist

        if deepspeed:
            use_deepspeed_accelerator(device)  # gloo / NCCL and the engine's device type
        if dist.is_initialized():
            wanted, have = communication_backend(device), str(dist.get_backend())
            if wanted not in have.split(":")[-1].split(","):
                raise ValueError(
                    f"device={str(device)!r}: this process already has a {have} process group "
                    f"(another session or engine on another device); a session on {device.type} "
                    f"needs {wanted}: close the other one first"
                )
            if deepspeed:
                _start_deepspeed_comm(device)  # on the group FSDP (or a launcher) created
            cls.users += 1
            return
        # Not initialized: any earlier lease is stale (e.g. a test fixture destroyed it).
        cls._restore_env()
        cls.users = 0
        cls.created = False
        forget_stale_groups()
        added = []
        defaults = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
        }
        for key in _DIST_ENV:
            if key not in os.environ:
                os.environ[key] = defaults[key]
                added.append(key)
        # torch wraps sys.excepthook at every init_process_group ("[rank0]: " prefixes);
        # a notebook process re-creates the group at each engine switch, so keep the hook.
        excepthook = sys.excepthook
        try:
            if deepspeed:
                _start_deepspeed_comm(device)
            else:
                dist.init_process_group(backend=group_backend(device))
        except BaseException:
            for key in added:
                os.environ.pop(key, None)
            raise
        finally:
            if added:  # only our own single-process group; a launcher's ranks keep torch's hook
                sys.excepthook = excepthook
        cls.env_added = tuple(added)
        cls.created = True
        cls.users = 1

    @classmethod
    def release(cls) -> None:
        import torch.distributed as dist

        cls.users = max(0, cls.users - 1)
        if cls.users == 0 and cls.created:
            if dist.is_initialized():
                comm = sys.modules.get("deepspeed.comm")
                if comm is not None and comm.is_initialized():
                    comm.destroy_process_group()  # also drops DeepSpeed's cached sub-groups
                else:
                    dist.destroy_process_group()
            cls.created = False
            cls._restore_env()

    @classmethod
    def _restore_env(cls) -> None:
        for key in cls.env_added:
            os.environ.pop(key, None)
        cls.env_added = ()


def group_backend(device: torch.device) -> str:
    """The backend of a default group this lease creates for a non-DeepSpeed engine on
    `device`: gloo on CPU; on CUDA NCCL for CUDA tensors and gloo for host tensors."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else communication_backend(device)


def device_types(group: object = None) -> frozenset[str]:
    """The device types `group` (default: the default group) has a backend for, read from
    its backend config ("cuda:nccl" -> {"cuda"}; "cpu:gloo,cuda:nccl" -> {"cpu", "cuda"})."""
    import torch.distributed as dist

    config = str(dist.get_backend_config(group))  # type: ignore[arg-type]
    return frozenset(part.split(":")[0].strip() for part in config.split(",") if ":" in part)


def _start_deepspeed_comm(device: torch.device) -> None:
    """DeepSpeed's communication layer, on the existing torch group or a new one. It may
    JIT-build its CPU comm op here (with this interpreter's tools: workbench.train.launch.toolchain)."""
    use_interpreter_tools()
    import deepspeed

    deepspeed.init_distributed(
        dist_backend=communication_backend(device), auto_mpi_discovery=False, verbose=False
    )
    # the exported DeepSpeed job does the same: one implementation, in its job_common
    from workbench.export.job_common import release_shm_segment

    release_shm_segment()


def forget_stale_groups() -> None:
    """DeepSpeed caches sub-groups of the default group in module globals; after someone
    else destroyed the default group they point at dead groups and the next engine fails
    ("Group ... is not registered"). Drop them before creating a new default group."""
    if "deepspeed" not in sys.modules:
        return
    with contextlib.suppress(Exception):
        from deepspeed.utils import groups

        groups._release_process_group_references(group=None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
