"""Autograd's sum of a parameter's gradients, in place where a real step sums in place.

A parameter used twice in one forward (a tied embedding: the token embedding's lookup and
the output projection's matmul share one vocab x hidden weight) gets one gradient from
each use. Autograd's engine adds them in the parameter's input buffer before
`AccumulateGrad` (torch/csrc/autograd/input_buffer.cpp, `accumulate`): in place into the
gradient that came first, `old.add_(new)`, when it holds that gradient's only reference,
the gradient is no view and is dense, grad mode is off and neither tensor is a tensor
subclass, and as `old + new`, a new tensor, otherwise. On fake tensors, or under any
`TorchDispatchMode` (the memory tracker is one), `isTensorSubclassLike` is true for every
tensor, so the engine always takes the second path: the dry run would hold one gradient
more at that instant than a real step does wherever the real step sums in place.

Under autocast the output projection's gradient reaches the weight as the fp32 copy of
its 16-bit matmul gradient (`ToCopyBackward0`, a new tensor): a real step sums in place
and holds two fp32 vocab x hidden tensors at the embedding's backward (the projection's
gradient and the lookup's); in fp32 or pure 16-bit it arrives as the transpose of the
matmul's output (`TBackward0`, a view), which a real step cannot sum in place: three
(the two and their sum). Measured with real tensors and no dispatch mode on a CPU (torch's
profiler's memory timeline, tests/integration/test_tied_embedding.py).

`InPlaceSums` puts the real step's choice back: `watch(loss)` hooks, for the backward of
`loss`, the nodes that hand a gradient to a parameter another node also hands one to;
right after such a node's second (or later) gradient for the parameter is made, the
engine's `aten.add.Tensor(old, new)` of those two is run as `old.add_(new)` when a real
step would (the conditions above, read from the fake tensors: not a view, dense, not the
same tensor, grad mode off). It is entered above the memory tracker, which then sees the
in-place add and no new storage. Sums of activation gradients (a residual stream's two
branches) are left as the engine makes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ADD = torch.ops.aten.add.Tensor
_ADD_ = torch.ops.aten.add_.Tensor


def shared_parameters(loss: torch.Tensor) -> dict[Any, list[tuple[Any, int]]]:
    """The backward graph of `loss`'s parameters with more than one incoming gradient:
    their `AccumulateGrad` node -> the (node, output index) pairs that hand it one."""
    feeders: dict[Any, list[tuple[Any, int]]] = {}
    root = loss.grad_fn
    if root is None:
        return {}
    seen = {root}
    stack = [root]
    while stack:
        node = stack.pop()
        for index, (nxt, _) in enumerate(node.next_functions):
            if nxt is None:
                continue
            if type(nxt).__name__ == "AccumulateGrad":
                feeders.setdefault(nxt, []).append((node, index))
            elif nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return {leaf: pairs for leaf, pairs in feeders.items() if len(pairs) > 1}


def sums_in_place(old: Any, new: Any) -> bool:
    """Whether autograd's engine adds `new` into `old` in place on real tensors
    (input_buffer.cpp's `can_accumulate_inplace(old)`, read from the fake tensors)."""
    return (
        isinstance(old, torch.Tensor)
        and isinstance(new, torch.Tensor)
        and old is not new
        and not torch.is_grad_enabled()
        and not old._is_view()
        and old.shape == new.shape
        and old.dtype == new.dtype
        and old.device == new.device
        and dense(old)
    )


def dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some order of its dimensions is contiguous (size-1
    dimensions aside), as ATen's `is_non_overlapping_and_dense`."""
    expected = 1
    for stride, size in sorted(
        (st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


class InPlaceSums(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Runs autograd's sum of a shared parameter's gradients in place where a real step
    does (module docstring); every other call passes unchanged."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._pending: list[torch.Tensor] = []

    @contextlib.contextmanager
    def watch(self, loss: torch.Tensor) -> Iterator[None]:
        """Hooks `loss`'s backward graph for the duration of the block (the backward)."""
        handles = []
        for pairs in shared_parameters(loss).values():
            arrived = [0]
            for node, index in pairs:
                handles.append(node.register_hook(self._arrival(index, arrived)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._pending.clear()

    def _arrival(self, index: int, arrived: list[int]) -> Any:
        def hook(grad_inputs: Any, _grad_outputs: Any) -> None:
            grad = grad_inputs[index] if index < len(grad_inputs) else None
            if grad is None:
                return
            arrived[0] += 1
            if arrived[0] > 1:  # the engine adds it to the one before, next
                self._pending.append(grad)

        return hook

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):  # let DTensor run its local operators
            return NotImplemented
        pending = self._pending
        if pending:
            if func is _ADD and not kwargs and len(args) == 2:
                new = args[1]
                if any(new is p for p in pending):
                    self._pending = [p for p in pending if p is not new]
                    old = args[0]
                    if sums_in_place(old, new):
                        return _ADD_(old, new)
            elif func.namespace != "prim":
                # the engine's sums follow the hook at once (after reading the gradient's
                # device, a `prim` query): any other operator ends them
                pending.clear()
        return func(*args, **(kwargs or {}))


__all__ = ["InPlaceSums", "dense", "shared_parameters", "sums_in_place"]
