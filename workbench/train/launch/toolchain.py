"""The tools DeepSpeed builds its ops with, and which of its ops still need a build.

DeepSpeed compiles some C++ ops the first time they are used on a machine (on a CPU the
shared-memory communication op when a process group starts; the CPU Adam/Adagrad ops for
optimizer offload) with `ninja`, into `~/.cache/torch_extensions` (or
`$TORCH_EXTENSIONS_DIR`). Two different ninja versions reading one build directory each
throw away the other's build log and rebuild (a minute or two each time), which is what
happens when a notebook kernel or a script is started with the virtual environment's
python but without its `bin/` on PATH. So every process that may build an op puts this
interpreter's `bin/` first on PATH (`use_interpreter_tools`), and launched ranks inherit
it (`child_path`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def interpreter_bin() -> str:
    """The directory of this interpreter (a virtual environment's `bin/`), unresolved."""
    return os.path.dirname(sys.executable)


def child_path(path: str) -> str:
    """`path` (a PATH value) with this interpreter's `bin/` first."""
    bin_dir = interpreter_bin()
    parts = [p for p in path.split(os.pathsep) if p]
    if parts[:1] == [bin_dir]:
        return path
    return os.pathsep.join([bin_dir, *parts])


def use_interpreter_tools() -> None:
    """Put this interpreter's `bin/` first on this process's PATH (idempotent)."""
    os.environ["PATH"] = child_path(os.environ.get("PATH", ""))


#: DeepSpeed op builders a run may JIT-build, by what needs them.
_COMM_BUILDER = "ShareMemCommBuilder"  # CPU accelerator: process-group start
_OFFLOAD_BUILDERS = {  # Adam/AdamW run torch's Adam inside DeepSpeed (`torch_adam`): no build
    "adagrad": "CPUAdagradBuilder",
    "lion": "CPULionBuilder",
}


def _is_built(builder: Any) -> bool:
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder.builder import OpBuilder

    name = builder.name
    if installed_ops.get(name, False) or name in OpBuilder._loaded_ops:
        return True
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    try:
        from torch.utils.cpp_extension import _get_build_directory

        directory = Path(_get_build_directory(name, verbose=False))
    except Exception:
        base = Path(root) if root else Path.home() / ".cache" / "torch_extensions"
        directory = base / name
    return any(directory.glob(f"{name}*.so"))


def pending_op_builds(config: Any) -> list[str]:
    """Names of the DeepSpeed ops a DeepSpeed engine for `config` would compile now
    (empty when everything is cached or prebuilt)."""
    try:
        import torch.distributed as dist
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return []
    accelerator = get_accelerator()
    wanted = []
    if accelerator.device_name() == "cpu" and not dist.is_initialized():
        wanted.append(_COMM_BUILDER)
    if str(getattr(config, "offload_optimizer", "none")) != "none":
        builder = _OFFLOAD_BUILDERS.get(str(getattr(config, "optimizer", "")))
        if builder:
            wanted.append(builder)
    pending = []
    for class_name in wanted:
        try:
            builder = accelerator.create_op_builder(class_name)
            if builder is None or not builder.is_compatible(verbose=False):
                continue
            if not _is_built(builder):
                pending.append(str(builder.name))
        except Exception:
            continue
    return pending
