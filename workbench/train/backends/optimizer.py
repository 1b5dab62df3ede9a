"""The torch optimizer a config trains with, and the state layout each engine carries over.

`build_optimizer(config, params)` builds it for the plain and FSDP engines (DeepSpeed
builds its own from the same settings). `OPTIMIZER_FAMILY` names the state layout of each
optimizer a Session trains ("adam": two moments per parameter, "sgd": a momentum buffer,
None: no state) and `STATE_KEYS` its tensors, so a switch between engines carries the
optimizer state of any of them into any other.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.config import OptimizerName, TrainConfig

OPTIMIZER_FAMILY: dict[OptimizerName, str | None] = {
    OptimizerName.ADAMW: "adam",
    OptimizerName.ADAM: "adam",
    OptimizerName.SGD: "sgd",
    OptimizerName.SGD_NOMOMENTUM: None,
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
    raise ValueError(
        f"optimizer={opt.value!r}: a Session trains with adamw, adam, sgd or sgd-nomomentum"
    )


__all__ = ["OPTIMIZER_FAMILY", "STATE_KEYS", "build_optimizer"]
