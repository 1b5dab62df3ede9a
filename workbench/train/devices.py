"""Which device a Session trains on, and making DeepSpeed use that same device.

* `resolve_device`: "auto" takes CUDA when available; a bare "cuda" means the GPU of this
  rank: `cuda:LOCAL_RANK` under a launcher (torchrun, DeepSpeed's launcher), else the
  current CUDA device. A CUDA device always carries its index ("cuda:0", not "cuda"), so
  every lookup keyed by device name (the profiler's memory timeline, NVML) finds it.
* `use_deepspeed_accelerator`: DeepSpeed keeps one process-wide "accelerator" that picks
  the process-group backend (gloo on CPU, NCCL on CUDA) and where an engine puts its
  model. It is CUDA whenever a GPU exists, so a `device="cpu"` session on a GPU machine
  switches it to DeepSpeed's CPU accelerator first (and back for a CUDA session).
* `cuda_uuid`: the UUID NVML knows a CUDA device by, so the monitor reads the GPU the
  session trains on (CUDA_VISIBLE_DEVICES renumbers devices; UUIDs do not change).

A device that cannot be used raises a `ConfigError` whose `SettingProblem` names `device`,
the value and why, so each caller words it from the data.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from workbench.inputs import shown
from workbench.problems import ConfigError, SettingProblem


def _local_rank() -> int | None:
    raw = os.environ.get("LOCAL_RANK")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"environment LOCAL_RANK={shown(raw, 1000)}: must be an integer >= 0"
        ) from None
    if value < 0:
        raise ValueError(f"environment LOCAL_RANK={shown(raw, 1000)}: must be an integer >= 0")
    return value


def _refused(value: Any, message: str) -> ConfigError:
    return ConfigError([SettingProblem("device", value, message)])


def resolve_device(requested: str | torch.device | None, configured: str) -> torch.device:
    """The device to train on: `requested` (the Session's `device=`) or the config's
    `device` ("auto", "cpu", "cuda"); see the module docstring. ConfigError naming
    `device` for one that is no torch device, not a CPU or CUDA one, or not on this
    machine."""
    given = configured if requested is None else requested
    if requested is None and configured == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(given)
        except (RuntimeError, TypeError) as exc:
            raise _refused(given, f"not a torch device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise _refused(str(dev), "must be cpu, cuda or cuda:N")
    if dev.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise _refused(str(dev), "CUDA is not available on this machine")
    count = torch.cuda.device_count()
    index = dev.index
    if index is None:
        local = _local_rank()
        index = local if local is not None else torch.cuda.current_device()
    if not 0 <= index < count:
        raise _refused(
            f"cuda:{index}",
            f"this process sees {count} CUDA device(s) (cuda:0 to cuda:{count - 1}; "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
        )
    return torch.device("cuda", index)


def deepspeed_accelerator_name(device: torch.device) -> str:
    """The DeepSpeed accelerator a session on `device` needs: "cpu" or "cuda"."""
    return "cuda" if device.type == "cuda" else "cpu"


def use_deepspeed_accelerator(device: torch.device) -> Any:
    """Make DeepSpeed's process-wide accelerator match `device`; returns it."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    wanted = deepspeed_accelerator_name(device)
    current = get_accelerator()
    if current.device_name() == wanted:
        return current
    if wanted == "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        accelerator: Any = CPU_Accelerator()
    else:
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

        accelerator = CUDA_Accelerator()
    set_accelerator(accelerator)
    return accelerator


def communication_backend(device: torch.device) -> str:
    """The process-group backend for `device`: NCCL on CUDA, gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def cuda_uuid(device: torch.device) -> str | None:
    """The device's UUID in NVML's form ("GPU-xxxxxxxx-..."), None off CUDA."""
    if device.type != "cuda":
        return None
    try:
        props = torch.cuda.get_device_properties(device)
    except Exception:
        return None
    raw = getattr(props, "uuid", None)
    return None if raw is None else normalize_uuid(str(raw))


def normalize_uuid(text: str) -> str:
    """A GPU UUID as NVML writes it: "GPU-" + the lower-case hex groups (torch writes the
    bare groups)."""
    text = text.strip().lower()
    if text.startswith(("gpu-", "mig-")):
        return text[:3].upper() + text[3:]
    return "GPU-" + text
