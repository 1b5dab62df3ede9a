"""torch's Adafactor on sharded (DTensor) parameters: the optimizer FSDP2's shards step with.

torch 2.13's `torch.optim.Adafactor` cannot step a parameter that FSDP2 split along its
first dimension (a `Shard(0)` DTensor): the column statistic of its gradient,
`torch.norm(grad, dim=-2)`, is a partial norm over the ranks, and the in-place `square_()`
torch applies to it raises ("placement changes are not supported"), with foreach and
without. Past that, its `param.norm(2).item()` and `update.norm(2).item()` would read this
rank's shard only (`.item()` of a partial norm is the local value).

`ShardedAdafactor` is torch's class with a step that gives every reduction the whole
parameter: each partial result is reduced over the mesh before it is used (`_whole`), and
each scalar is read from the reduced value (`_scalar`). The arithmetic is torch's for-loop
(`_single_tensor_adafactor` in torch/optim/_adafactor.py), line for line, so a sharded run
steps the same parameters and states as torch's Adafactor on the whole tensors (held equal
by tests/integration/test_adafactor.py). What each rank keeps: for a parameter of 2+
dimensions split along dim 0, the row statistic of its own rows and the whole column
statistic (replicated: every rank's rows add to it); for a 1-dim one its shard of the
second moment. The states take the placements of the statistics they average, so a split
along another dimension (tensor parallelism's `Shard(1)`) is reduced the same way.

Without a DTensor parameter the step is torch's own (`Adafactor.step`, foreach as asked);
with one, every parameter steps in the for-loop, torch's default for Adafactor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate


class ShardedAdafactor(torch.optim.Adafactor):
    """`torch.optim.Adafactor` whose step also handles DTensor parameters (see the module
    docstring); the same keywords, states ("step", "row_var", "col_var", "variance") and
    global state shapes as torch's."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if not any(isinstance(p, DTensor) for g in self.param_groups for p in g["params"]):
            return super().step(closure)  # type: ignore[no-untyped-call]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _step_one(p, p.grad, self.state[p], group)
        return loss


def _step_one(param: Any, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
    """One parameter's step: torch's `_single_tensor_adafactor` body, each partial
    reduction made whole before it is used."""
    if torch.is_complex(param):
        raise RuntimeError("Adafactor does not support complex parameters")
    lr = group["lr"].item() if isinstance(group["lr"], torch.Tensor) else group["lr"]
    eps1, eps2 = group["eps"]
    if eps1 is None:
        eps1 = torch.finfo(param.dtype).eps
    if group["maximize"]:
        grad = -grad
    if not state:  # where torch's `_init_group` puts the step (the statistics below)
        double = torch.get_default_dtype() is torch.float64  # torch's `_get_scalar_dtype`
        state["step"] = torch.tensor(0.0, dtype=torch.float64 if double else torch.float32)
    step_t = state["step"]
    step_t += 1
    step_float = step_t.item()
    one_minus_beta2_t = step_float ** group["beta2_decay"]
    rho_t = min(lr, 1 / (step_float**0.5))
    alpha = max(eps2, _scalar(param.norm(2)) / (param.numel() ** 0.5)) * rho_t
    if group["weight_decay"] != 0:
        param.mul_(1 - lr * group["weight_decay"])
    if grad.dim() > 1:
        row_mean = _whole(torch.norm(grad, dim=-1, keepdim=True)).square_().div_(grad.size(-1))
        col_mean = _whole(torch.norm(grad, dim=-2, keepdim=True)).square_().div_(grad.size(-2))
        if "row_var" not in state:  # placed as the statistics are: rows sharded, columns whole
            state["row_var"] = torch.zeros_like(row_mean)
            state["col_var"] = torch.zeros_like(col_mean)
        row_var, col_var = state["row_var"], state["col_var"]
        row_var.lerp_(row_mean, one_minus_beta2_t)
        col_var.lerp_(col_mean, one_minus_beta2_t)
        var_estimate = row_var * col_var  # torch's `row_var @ col_var`: an outer product
        var_estimate.div_(_whole(row_var.mean(dim=-2, keepdim=True)).clamp_(min=eps1))
    else:
        if "variance" not in state:
            state["variance"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        state["variance"].lerp_(grad * grad, one_minus_beta2_t)
        var_estimate = state["variance"].clone()
    # square the eps1 as we sqrt after to keep eps1's magnitude (torch's comment)
    update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
    update.mul_(grad)
    denom = max(1.0, _scalar(update.norm(2)) / ((update.numel() ** 0.5) * group["d"]))
    param.add_(_placed_as(update, param), alpha=-alpha / denom)


def _whole(t: Any) -> Any:
    """`t` with every partial placement reduced over its mesh dimension (Replicate there);
    a tensor without partial placements as it is."""
    if isinstance(t, DTensor) and any(p.is_partial() for p in t.placements):
        placements = [Replicate() if p.is_partial() else p for p in t.placements]
        return t.redistribute(t.device_mesh, placements)
    return t


def _placed_as(update: Any, param: Any) -> Any:
    """`update` split as `param` is (DTensor keeps a matrix product with a shard of one
    row, `row_var @ col_var`, replicated; each rank takes its rows, no communication)."""
    if isinstance(param, DTensor) and tuple(update.placements) != tuple(param.placements):
        return update.redistribute(param.device_mesh, param.placements)
    return update


def _scalar(t: Any) -> float:
    """A 0-dim result's value over the whole tensor (a DTensor's reduced over its mesh)."""
    return float(t.full_tensor().item() if isinstance(t, DTensor) else t.item())


__all__ = ["ShardedAdafactor"]
