"""The torch optimizer a config trains with, and the state layout each engine carries over.

`build_optimizer(config, params)` builds it for the plain and FSDP engines (DeepSpeed
builds its own from the same settings). `OPTIMIZER_FAMILY` names the state layout of each
optimizer a Session trains ("adam": two moments per parameter, "sgd": a momentum buffer,
None: no state) and `STATE_KEYS` its tensors, so a switch between engines carries the
optimizer state of any of them into any other. 8-bit AdamW (`adam8bit`, torchao's
`AdamW8bit`: block-wise 8-bit moments for tensors of 4096+ elements) is of the "adam"
family: its moments travel dequantized to fp32 (`neutral`) and are quantized again when an
8-bit optimizer takes them (`placed_state`), so switching adamw <-> adam8bit carries them
(within the 8-bit rounding).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from workbench.config import OptimizerName, TrainConfig

OPTIMIZER_FAMILY: dict[OptimizerName, str | None] = {
    OptimizerName.ADAMW: "adam",
    OptimizerName.ADAM: "adam",
    OptimizerName.SGD: "sgd",
    OptimizerName.SGD_NOMOMENTUM: None,
    OptimizerName.ADAM8BIT: "adam",  # carried as fp32 moments, re-quantized when loaded
}
STATE_KEYS: dict[str | None, tuple[str, ...]] = {
    "adam": ("exp_avg", "exp_avg_sq"),
    "sgd": ("momentum_buffer",),
    None: (),
}


def build_optimizer(config: TrainConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The torch optimizer of `config` over `params` (lr, weight decay, momentum)."""
    opt = OptimizerName(config.optimizer)
    lr, wd = float(config.lr), float(config.weight_decay)
    if opt is OptimizerName.ADAMW:
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    if opt is OptimizerName.ADAM:
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if opt is OptimizerName.SGD:
        return torch.optim.SGD(params, lr=lr, momentum=float(config.momentum), weight_decay=wd)
    if opt is OptimizerName.SGD_NOMOMENTUM:
        return torch.optim.SGD(params, lr=lr, momentum=0.0, weight_decay=wd)
    if opt is OptimizerName.ADAM8BIT:
        from torchao.optim import AdamW8bit

        return AdamW8bit(params, lr=lr, weight_decay=wd)  # type: ignore[no-any-return]
    raise ValueError(
        f"optimizer={opt.value!r}: a Session trains with adamw, adam, sgd, sgd-nomomentum "
        "or adam8bit"
    )


def neutral(value: Any) -> Any:
    """An optimizer-state value as the neutral state carries it: 8-bit states (torchao's
    `OptimState8bit`) dequantized to fp32 tensors, which a `weights_only` load reads;
    anything else as it is."""
    dequantize = getattr(value, "dequantize", None)
    if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value) and dequantize:
        return dequantize()
    return value


def placed_state(optimizer: torch.optim.Optimizer, p: torch.Tensor, key: str, value: Any) -> Any:
    """A neutral state value for parameter `p` as `optimizer` keeps it: for an 8-bit
    optimizer the moments in its own 8-bit buffers (quantized from the fp32 values; the
    small tensors it keeps in fp32 stay fp32); else the value on `p`'s device."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.to(p.device)
    new_buffer = getattr(optimizer, "_new_buffer", None)  # torchao's low-bit optimizers
    if key in STATE_KEYS["adam"] and callable(new_buffer):
        buffer = new_buffer(p, key == "exp_avg")  # signed for the first moment
        buffer.copy_(value)
        return buffer
    if value.is_floating_point() and key in STATE_KEYS["adam"] + STATE_KEYS["sgd"]:
        return value.to(p.dtype)
    return value


__all__ = ["OPTIMIZER_FAMILY", "STATE_KEYS", "build_optimizer", "neutral", "placed_state"]
