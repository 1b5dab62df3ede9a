"""The peak of a block of code on the CPU: the most tensor memory its operations held at once.

torch keeps no running statistics for its CPU allocator (`torch.cuda.max_memory_allocated`
has no CPU twin, and `tracemalloc` sees Python's own allocations, not tensor storage).
`StoragePeak` counts the way `torch.distributed._tools.MemTracker` does, without its
per-module bookkeeping: a `TorchDispatchMode` sees every operation the block runs (the
backward pass's too, and the forward recomputed under activation checkpointing), and an
output whose storage is none of the operation's inputs' (not a view, not in place) is
new memory, held until that storage is freed (a weak reference's callback). The running
sum of what is held is the block's memory above what existed before it; its maximum is
the block's peak, transients included: the saved activations, the recomputed block's
activations, the gradients, the logits' gradients, the optimizer step's temporaries.

What it does not see: a kernel's private scratch buffers, which never become tensors; a
tensor made outside the dispatcher (`torch.tensor(...)` from Python numbers, a storage
resized in place); work on other threads. A free of a tensor made before the block does
not lower the sum, so the figure can err high there. For a tiny-gpt forward and backward
it equals the peak the CPU allocator reports to the profiler (`torch.profiler.profile(
profile_memory=True)`, which this module does not use because it runs one per thread and
logs each free of memory allocated before it started).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class StoragePeak(TorchDispatchMode):
    """`with StoragePeak() as peak: ...`; then `peak.peak_bytes`: the most bytes of tensor
    storage the block's operations held at once above what existed before it, and
    `peak.held_bytes`: what they still held when it ended (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.peak_bytes = 0
        self.held_bytes = 0
        self._live: dict[int, tuple[int, weakref.ref[Any]]] = {}

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        self._live.clear()  # no callbacks after the block: its figures stay as measured

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if any(hasattr(t, "__tensor_flatten__") for t in types):
            return NotImplemented  # a wrapper subclass (DTensor): counted in its plain ops
        out = func(*args, **(kwargs or {}))
        inputs = {_key(x) for x in tree_leaves((args, kwargs)) if _is_storage_like(x)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._hold(t.untyped_storage(), inputs)
        return out

    def _hold(self, storage: torch.UntypedStorage, inputs: set[int]) -> None:
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in inputs or key in self._live:
            return
        self._live[key] = (nbytes, weakref.ref(storage, self._release(key)))
        self.held_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def _release(self, key: int) -> Callable[[Any], None]:
        def freed(_: Any) -> None:
            entry = self._live.pop(key, None)
            if entry is not None:
                self.held_bytes -= entry[0]

        return freed


def _is_storage_like(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, torch.UntypedStorage))


def _key(x: torch.Tensor | torch.UntypedStorage) -> int:
    storage = x.untyped_storage() if isinstance(x, torch.Tensor) else x
    return int(storage.data_ptr())
