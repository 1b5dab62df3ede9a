"""Activation offload: what the forward saves for backward is kept in host memory.

`ActivationOffload(device)` is built once per setting (`activation_offload=True`);
`offload.around(autocast, model)` is the context factory the forward runs in (the
Session's step, its memory probe, the dry run): the backend's autocast under a
`torch.autograd.graph.saved_tensors_hooks` pair that

* on CUDA copies each saved activation into a pinned host buffer on a side stream (the
  side stream waits for the compute stream, the device tensor is marked used by the side
  stream so the caching allocator does not hand its memory out before the copy ends) and
  records an event; in backward, unpack makes the compute stream wait for that event and
  copies the buffer back (non-blocking, pinned). This is `save_on_cpu(pin_memory=True)`
  made asynchronous, and it skips what is not an activation: parameters and buffers saved
  for backward (and their autocast copies: a chain of view/copy ops ending at a leaf
  parameter, `is_parameter_derived`), which `save_on_cpu` would copy to the host at every
  forward and back at every backward although they stay on the device anyway;
* on a CPU moves nothing (the tensors are already in host memory): it only counts what a
  GPU would not hold (`moved_bytes`), so `session.memory()` can show the saving; a CPU run
  frees no memory by it and its losses are the same because nothing moved. With
  `host_copy=True` (for tests) a CPU forward copies each activation it would move into a
  separate host tensor and backward reads that copy, the pack/unpack of the CUDA path
  made between two host buffers (`copies`, `unpacked` count them), so a CPU test shows
  that backward computes from what was offloaded;
* in a dry run (`simulated=True`, fake tensors, which hold no data) keeps each
  activation's shape instead of the tensor, so the memory tracker sees the device copy
  freed once nothing else holds it, and makes a tensor of that shape on the device again
  when backward needs it: the device side of offloading; `moved_bytes` is the host's.

Only what autograd saves inside the model's forward moves: the loss (the logits' fp32
log-probabilities) is computed outside it and stays on the device. With activation
checkpointing the checkpointed blocks' inputs are what the forward saves, and they move;
the recomputation in backward runs under checkpointing's own hooks, on the device.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn

from workbench.export import job_common

#: autograd nodes that only view or copy their input (an autocast cast of a weight): the
#: exported jobs' set, one object (`workbench.export.job_common` stands alone; the library
#: imports it)
VIEW_OR_COPY = job_common.VIEW_OR_COPY


def data_ptr(storage: Any) -> int:
    """A real storage's key: its address."""
    return int(storage.data_ptr())


def storage_identity(storage: Any) -> int:
    """A fake storage's key (every fake tensor's address is 0): its StorageImpl."""
    return int(storage._cdata)


def is_parameter_derived(
    t: torch.Tensor, param_storages: set[int], key: Callable[[Any], int] = data_ptr
) -> bool:
    """Whether a saved tensor is a parameter or buffer (shares one's storage, is a leaf
    that trains, or a chain of at most four view/copy ops ending at a trained leaf)."""
    if t.grad_fn is None and t.requires_grad:
        return True  # a leaf that trains: a parameter (FSDP's gathered copy of one too)
    if key(local_tensor(t).untyped_storage()) in param_storages:
        return True
    fn = t.grad_fn
    for _ in range(4):
        if fn is None or type(fn).__name__ not in VIEW_OR_COPY:
            return False
        nexts = [f for f, _ in fn.next_functions if f is not None]
        if len(nexts) != 1:
            return False
        fn = nexts[0]
        if type(fn).__name__ == "AccumulateGrad":
            return True
    return False


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding `t`'s memory: a DTensor's local shard (FSDP, tensor
    parallel), the tensor inside another wrapper subclass (the `AsyncCollectiveTensor` a
    tensor-parallel collective returns), or the tensor itself."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for _ in range(4):
        local = getattr(t, "_local_tensor", None)
        if isinstance(local, torch.Tensor):
            t = local
        elif is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            t = getattr(t, names[0])
        else:
            break
    return t


def parameter_storages(model: nn.Module, key: Callable[[Any], int] = data_ptr) -> set[int]:
    """The storage keys of `model`'s parameters and buffers (local shards)."""
    tensors = (*model.parameters(), *model.buffers())
    return {key(local_tensor(t).untyped_storage()) for t in tensors}


class _Shape:
    """A fake activation's host copy in a dry run: its shape alone (fake tensors hold no
    data), made again on the device when backward needs it."""

    __slots__ = ("device", "dtype", "size", "stride")

    def __init__(self, t: torch.Tensor) -> None:
        self.size, self.stride, self.dtype, self.device = t.size(), t.stride(), t.dtype, t.device


class _OnHost:
    """A saved activation's host copy, the event its copy ends at (None for a CPU
    `host_copy`), and its device."""

    __slots__ = ("device", "event", "host")

    def __init__(self, host: torch.Tensor, event: Any, device: torch.device) -> None:
        self.host, self.event, self.device = host, event, device


class ActivationOffload:
    """Saved activations kept in host memory (see the module docstring). After a forward
    under `around()`, `total_moved_bytes` is what it moved (on a CPU: would move), each
    storage once, and `moved_keys` those storages' keys (their addresses; a dry run's fake
    storages: their identity). A storage freed during the forward and its address reused
    by another counts as two (each is told apart while the first is alive)."""

    def __init__(
        self, device: torch.device, *, simulated: bool = False, host_copy: bool = False
    ) -> None:
        self.device = torch.device(device)
        self.moved_keys: set[int] = set()
        self.total_moved_bytes = 0
        #: with `host_copy` on a CPU: activations copied in the last forward, and copies
        #: that backward has read back
        self.copies = 0
        self.unpacked = 0
        self._host_copy = host_copy and self.device.type == "cpu" and not simulated
        #: called with every tensor autograd saves under the hooks (the memory probe's count)
        self.observer: Callable[[torch.Tensor], None] | None = None
        self._simulated = simulated
        self._key = storage_identity if simulated else data_ptr
        self._cuda = self.device.type == "cuda" and not simulated
        self._side: Any = torch.cuda.Stream(self.device) if self._cuda else None

    def around(
        self, autocast: Callable[[], AbstractContextManager[Any]], model: nn.Module
    ) -> Callable[[], AbstractContextManager[Any]]:
        """The forward's context factory: `autocast()` under the offload hooks."""

        @contextmanager
        def context() -> Iterator[None]:
            with self.hooks(model), autocast():
                yield

        return context

    @contextmanager
    def hooks(self, model: nn.Module) -> Iterator[None]:
        """The saved-tensor hooks alone, for a forward of `model`."""
        key = self._key
        params = parameter_storages(model, key)
        self.moved_keys, self.total_moved_bytes = set(), 0
        self.copies = self.unpacked = 0
        alive: dict[int, Any] = {}  # key -> a weak reference to the tensor first seen there

        def pack(t: torch.Tensor) -> Any:
            if self.observer is not None:
                self.observer(t)
            if t.device.type != self.device.type or is_parameter_derived(t, params, key):
                return t
            st = t.untyped_storage()
            if st.nbytes() == 0:
                return t
            k = key(st)
            first = alive.get(k)
            if first is None or first() is None:  # a storage not counted yet
                alive[k] = weakref.ref(t)
                self.moved_keys.add(k)
                self.total_moved_bytes += st.nbytes()
            if self._simulated:
                return _Shape(t)  # the device copy is dropped; backward makes it again
            if self._host_copy:  # a separate host buffer, as the CUDA path's pinned one
                host = torch.empty_like(t, device="cpu")
                host.copy_(t)
                self.copies += 1
                return _OnHost(host, None, t.device)
            if not self._cuda:
                return t  # already in host memory: nothing to move on a CPU
            compute = torch.cuda.current_stream(t.device)
            side = self._side
            side.wait_stream(compute)  # the activation is complete on the compute stream
            with torch.cuda.stream(side):
                host = torch.empty_like(t, device="cpu", pin_memory=True)
                host.copy_(t, non_blocking=True)
                event = torch.cuda.Event()
                event.record(side)
            t.record_stream(side)  # its memory is not reused before the copy ends
            return _OnHost(host, event, t.device)

        def unpack(packed: Any) -> torch.Tensor:
            if isinstance(packed, _Shape):
                return torch.empty_strided(
                    packed.size, packed.stride, dtype=packed.dtype, device=packed.device
                )
            if not isinstance(packed, _OnHost):
                return packed  # type: ignore[no-any-return]
            if packed.event is None:  # a CPU host copy: backward reads the copy
                self.unpacked += 1
                return packed.host
            compute = torch.cuda.current_stream(packed.device)
            compute.wait_event(packed.event)  # the device waits for the copy, not the host
            return packed.host.to(packed.device, non_blocking=True)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield


__all__ = [
    "VIEW_OR_COPY",
    "ActivationOffload",
    "is_parameter_derived",
    "local_tensor",
    "parameter_storages",
]
