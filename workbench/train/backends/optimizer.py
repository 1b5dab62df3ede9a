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

import importlib
import warnings
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from workbench.config import SESSION_OPTIMIZERS, OptimizerName, TrainConfig
from workbench.optimizers import FAMILY_STATE_KEYS, OPTIMIZERS

#: each optimizer a Session trains -> its state layout (its row's `family`)
OPTIMIZER_FAMILY: dict[OptimizerName, str | None] = {
    OptimizerName(r.name): r.family for r in OPTIMIZERS if r.in_session
}
STATE_KEYS: dict[str | None, tuple[str, ...]] = dict(FAMILY_STATE_KEYS)


def _load(path: str) -> Any:
    """The class at "module:Class"."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def build_optimizer(config: TrainConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The torch optimizer of `config` over `params`, as its row says: its class (the
    row's `sharded_factory` where the parameters are sharded DTensors and the row names
    one; the fallback's where the class does not import), with the keywords the row takes
    from the config (lr, weight decay, momentum)."""
    opt = OptimizerName(config.optimizer)
    r = opt.row
    if r.factory is None:
        raise ValueError(
            f"optimizer={opt.value!r}: a Session trains with "
            + ", ".join(o.value for o in SESSION_OPTIMIZERS)
        )
    kwargs = {
        key: float(source[1:]) if source.startswith("=") else float(getattr(config, source))
        for key, source in r.factory_kwargs
    }
    sharded = any(hasattr(p, "device_mesh") for p in params)
    try:
        cls = _load(r.sharded_factory if sharded and r.sharded_factory else r.factory)
    except ImportError:  # its library missing or broken here: the fallback's, if any
        if r.fallback_factory is None:
            raise
        if sharded:
            name = r.factory.partition(":")[2]
            raise ValueError(
                f"optimizer={opt.value!r} under FSDP: {r.library}'s {name} steps the shards, "
                f"and {r.library} does not import here (pip install {r.library})"
            ) from None
        cls = _load(r.fallback_factory)
    built: torch.optim.Optimizer = cls(params, **kwargs)
    if r.quiet_warning:
        warnings.filterwarnings("ignore", message=r.quiet_warning)
    return built


def set_lr(optimizer: Any, lr: float) -> None:
    """Every group's learning rate, in place where the optimizer keeps it as a tensor
    (torchao's 8-bit AdamW: it refuses a float put there)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


#: bitsandbytes' 8-bit blockwise states: (its state, quantization map, scales) per moment
BNB_MOMENTS = {
    "exp_avg": ("state1", "qmap1", "absmax1"),
    "exp_avg_sq": ("state2", "qmap2", "absmax2"),
}
BNB_BLOCK = 256  # bitsandbytes' block size for 8-bit optimizer states


def optimizer_note(optimizer: Any, device: torch.device) -> str | None:
    """Which implementation an 8-bit optimizer is, and where its states live: said once
    where the Session reports its settings (None for torch's own optimizers)."""
    name = type(optimizer).__name__
    if callable(getattr(optimizer, "_new_buffer", None)):
        return f"8-bit AdamW: torchao's {name} (block-wise 8-bit moments, torch.compile'd step)"
    if is_bnb_8bit(optimizer):
        where = (
            "paged: its states in CUDA unified memory, moved to host memory when the GPU runs short"
            if device.type == "cuda"
            else "unpaged on this CPU (paging is CUDA's unified memory; bitsandbytes keeps "
            "the states in host memory here, as adam8bit would)"
        )
        if not getattr(optimizer, "is_paged", False):
            where = "unpaged (torchao does not import here, so bitsandbytes' steps adam8bit)"
        return f"8-bit AdamW: bitsandbytes' {name}, {where}"
    return None


def is_bnb_8bit(optimizer: Any) -> bool:
    return hasattr(optimizer, "name2qmap") and callable(getattr(optimizer, "init_state", None))


def neutral_state(st: MutableMapping[str, Any]) -> dict[str, Any]:
    """One parameter's optimizer state as the neutral state carries it: bitsandbytes'
    8-bit blockwise moments (`state1`/`state2` with their maps and scales) dequantized to
    fp32 `exp_avg`/`exp_avg_sq` and its integer step a tensor, as torch's AdamW keeps
    them; any other optimizer's values through `neutral`."""
    if "state1" not in st or "step" not in st:
        return {k: neutral(v) for k, v in st.items() if v is not None}
    import bitsandbytes.functional as F

    out: dict[str, Any] = {"step": torch.tensor(float(st["step"]))}
    for key, (state, qmap, absmax) in BNB_MOMENTS.items():
        t = st[state]
        if t.dtype == torch.uint8:
            # a paged optimizer's states live in managed memory that bitsandbytes hands out
            # as CPU-typed tensors while their absmax is on the GPU: dequantized where the
            # absmax is (a CPU kernel would read the GPU's absmax, a CUDA one refuses a CPU
            # tensor), the 8-bit codes copied there first
            where = st[absmax].device
            t = F.dequantize_blockwise(
                t.to(where), absmax=st[absmax], code=st[qmap].to(where), blocksize=BNB_BLOCK
            )
        out[key] = t.detach().float().clone()
    return out


def place_bnb_state(optimizer: Any, p: torch.Tensor, st: Mapping[str, Any]) -> None:
    """Neutral moments into bitsandbytes' own buffers for `p`: its state made as its first
    step makes it (`init_state`), the fp32 moments quantized block-wise with its maps
    (small tensors keep fp32 moments), the step count carried."""
    import bitsandbytes.functional as F

    for gindex, group in enumerate(optimizer.param_groups):
        for pindex, q in enumerate(group["params"]):
            if q is p:
                optimizer.state[p] = {}
                optimizer.init_state(group, p, gindex, pindex)
    state = optimizer.state[p]
    state["step"] = int(float(st.get("step", 0)))
    for key, (buffer, qmap, absmax) in BNB_MOMENTS.items():
        if key not in st:
            continue
        x = st[key].to(device=p.device, dtype=torch.float32)
        if state[buffer].dtype == torch.uint8:
            codes, quant = F.quantize_blockwise(x, code=state[qmap], blocksize=BNB_BLOCK)
            state[buffer].copy_(codes.reshape(state[buffer].shape))
            state[absmax].copy_(quant.absmax)
        else:
            state[buffer].copy_(x.reshape(state[buffer].shape))


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


class InBackwardOptimizers:
    """`optimizer_in_backward`: one optimizer per parameter, stepped by the parameter's
    post-accumulate-grad hook as soon as its gradient is ready, the gradient freed at once
    (torchtune's pattern), so a step never holds every gradient. It stands where an
    optimizer stands: `step()` and `zero_grad()` do nothing (the hooks did it),
    `param_groups` are every optimizer's, `state` reads and writes each parameter's own
    optimizer's state. `remove()` takes the hooks off."""

    def __init__(self, make: Callable[[list[nn.Parameter]], Any], params: list[nn.Parameter]):
        self.by_param: dict[nn.Parameter, torch.optim.Optimizer] = {p: make([p]) for p in params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._step_one) for p in params]
        self.state = _RoutedState(self.by_param)

    def _step_one(self, p: torch.Tensor) -> None:
        optimizer = self.by_param[p]  # type: ignore[index]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.by_param.values() for g in o.param_groups]

    def step(self) -> None:
        """Nothing: each parameter was stepped in backward."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: each gradient was freed when its parameter stepped."""

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class _RoutedState(MutableMapping[Any, Any]):
    """Each parameter's state in its own optimizer."""

    def __init__(self, by_param: dict[nn.Parameter, torch.optim.Optimizer]) -> None:
        self._by_param = by_param

    def __getitem__(self, p: Any) -> Any:
        return self._by_param[p].state[p]

    def __setitem__(self, p: Any, value: Any) -> None:
        self._by_param[p].state[p] = value

    def __delitem__(self, p: Any) -> None:
        del self._by_param[p].state[p]

    def __iter__(self) -> Iterator[Any]:
        return (p for p, o in self._by_param.items() if p in o.state)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def build_optimizers(config: TrainConfig, params: list[nn.Parameter]) -> Any:
    """`build_optimizer`, or with `optimizer_in_backward` one per parameter
    (`InBackwardOptimizers`)."""
    if config.optimizer_in_backward:
        return InBackwardOptimizers(lambda ps: build_optimizer(config, ps), params)
    return build_optimizer(config, params)


__all__ = [
    "OPTIMIZER_FAMILY",
    "STATE_KEYS",
    "InBackwardOptimizers",
    "build_optimizer",
    "build_optimizers",
    "neutral",
    "placed_state",
]
