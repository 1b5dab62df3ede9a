"""`DeepSpeedBackend`: ZeRO stages 0-3 and DeepSpeed 16-bit through a real DeepSpeed engine.

Implements the `Backend` contract of `workbench/train/backends/base.py` and carries the same
backend-neutral state as `PlainBackend` (see `workbench/train/backends/plain.py`):

    {"format": 1, "model": {name: fp32 tensor},
     "optimizer": {"family": "adam" | "sgd" | None, "state": {name: {"exp_avg": ..., ...}}},
     "scaler": {"scale", "growth_tracker", "init_scale"} | None,
     "scheduler": {"steps": int}, "steps": int, "overflow_steps": int}

so a Session can switch ZeRO stage or precision at a step boundary in either direction.

How it works
------------
* Process group: `process_group.ProcessGroupLease` (rank 0 of 1 in a notebook, gloo on
  CPU, NCCL on CUDA), shared with the other engines alive in the process and released by
  the last; DeepSpeed's accelerator is switched to the session's device type.
* The engine trains a private deep copy of the model: DeepSpeed casts weights to 16 bit,
  flattens them into buffers and (stage 3) partitions them and hooks the module; the
  caller's model stays as it was, so a PlainBackend built later from `export_state()` gets
  a clean fp32 model.
* The engine's config is `to_deepspeed(config, world_size)` (what `workbench export`
  writes) with three runtime adjustments, all documented in docs/deepspeed.md: the LR
  schedule is applied by the backend with `workbench.train.schedule.lr_at` (identical to
  PlainBackend; the exported JSON carries DeepSpeed's equivalent scheduler block),
  gradient buckets are capped at the model's size and stage-3 persistence thresholds are
  0 (so tiny models are really partitioned), and amp-bf16 uses torch autocast around the
  engine's forward instead of DeepSpeed's `torch_autocast` block (same effect).
* Gradient accumulation: `backward` marks the accumulation boundary itself
  (`engine.set_gradient_accumulation_boundary`) so `step()` is called once per optimizer
  step as the contract says; DeepSpeed divides each micro-batch loss by
  gradient_accumulation_steps (the contract's 1/grad_accum).
* Weights and optimizer state move in and out by parameter name with DeepSpeed's
  `safe_get/safe_set_full_fp32_param` and `..._optimizer_state` (ZeRO 1-3; collective
  under ZeRO-3, so every rank calls them), or by flat-buffer offsets for the stage-0
  16-bit optimizer and by parameter for the stage-0 fp32 optimizer.

Past 600 lines because DeepSpeed keeps its state in a different layout per stage and per
16-bit optimizer (fused, unfused, bf16); each is translated to and from the neutral state here.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError, OptimizerName, Precision, TrainConfig
from workbench.engines import bf16_true_problem
from workbench.modelstats import count_parameters
from workbench.train.backends.base import (
    ModelStateBytes,
    StepOutcome,
    frozen_parameters,
    frozen_weights,
)
from workbench.train.backends.distributed import DistributedBackend
from workbench.train.backends.optimizer import STATE_KEYS
from workbench.train.techniques.precision import cast_floating_inputs

DS_DEFAULT_BUCKET = 500_000_000  # DeepSpeed's default reduce/allgather bucket (elements)


class Zero3LinearPatch:
    """ZeRO-3 replaces `torch.nn.functional.linear` process-wide with its memory-efficient
    version and never puts it back ("This will persist unless manually reset"): every
    later model in the notebook, trained by DeepSpeed or not, would run through it (and
    save different tensors for backward). Count the live stage-3 engines and restore
    torch's own function when the last one closes."""

    engines = 0

    @classmethod
    def acquire(cls) -> None:
        cls.engines += 1

    @classmethod
    def release(cls) -> None:
        cls.engines = max(0, cls.engines - 1)
        if cls.engines:
            return
        with contextlib.suppress(ImportError):
            from deepspeed.runtime.zero.linear import zero3_linear_wrap
            from deepspeed.runtime.zero.partition_parameters import (
                InsertPostInitMethodToModuleSubClasses as Patched,
            )

            original = getattr(Patched, "linear_bk", None)
            if original is not None and torch.nn.functional.linear is zero3_linear_wrap:
                torch.nn.functional.linear = original


# --------------------------------------------------------------------------- config
def engine_config(config: TrainConfig, world_size: int, n_params: int) -> dict[str, Any]:
    """The dict handed to `deepspeed.initialize`: `to_deepspeed` plus the runtime
    adjustments listed in the module docstring."""
    from workbench.deepspeed import to_deepspeed

    ds = to_deepspeed(config, world_size=world_size)
    ds.pop("scheduler", None)  # the backend applies lr_at() itself
    ds.pop("torch_autocast", None)  # amp-bf16: torch autocast around forward
    # Capped at the model's size, rounded up to DeepSpeed's alignment (a multiple of 64).
    bucket = -(-max(1, min(DS_DEFAULT_BUCKET, int(n_params))) // 64) * 64
    zero = ds["zero_optimization"]
    if zero["stage"] >= 1:
        zero["reduce_bucket_size"] = bucket
        zero["allgather_bucket_size"] = bucket
    if zero["stage"] == 3:
        zero["stage3_prefetch_bucket_size"] = bucket
        zero["stage3_param_persistence_threshold"] = 0
        zero["stage3_model_persistence_threshold"] = 0
    ds["steps_per_print"] = 2**62
    ds["wall_clock_breakdown"] = False
    return ds


def _check_supported(config: TrainConfig) -> None:
    precision = Precision(config.precision)
    if precision is Precision.BF16_TRUE:
        raise ConfigError([bf16_true_problem()])
    if precision is Precision.AMP_FP16:
        raise ValueError(
            "precision='amp-fp16': with the DeepSpeed backend (zero_stage >= 1 or several "
            "ranks) use precision='fp16' (DeepSpeed's loss-scaled fp16) or 'amp-bf16'"
        )
    optimizer = OptimizerName(config.optimizer)
    if optimizer.row.in_session and "deepspeed" not in optimizer.row.engines:
        raise ValueError(f"optimizer={optimizer.value!r}: {optimizer.row.engines_reason}")


# --------------------------------------------------------------------------- backend
class DeepSpeedBackend(DistributedBackend):
    """A DeepSpeed engine behind the `Backend` contract (see the module docstring). Its
    optimizer is the engine's own (`optimizer` stays None)."""

    deepspeed_lease = True

    def _refuse(self, config: TrainConfig) -> None:
        _check_supported(config)

    def _fresh(self) -> None:
        self.engine: Any = None
        self._hooks: list[Any] = []
        self._zero3 = False

    def _building(self) -> AbstractContextManager[Any]:
        return nullcontext()  # DeepSpeed places the module on the device index it is given

    # ------------------------------------------------------------------ building
    def _build(self, model: nn.Module, state: dict[str, Any] | None) -> None:
        import deepspeed
        import torch.distributed as dist

        config = self.config
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.precision = Precision(config.precision)
        self._accum = int(config.grad_accum)
        self._micro = 0

        if state is not None:
            _check_state_matches(model, state)
        self._frozen = frozen_parameters(model)  # exported from your module
        module = copy.deepcopy(model)
        if state is not None:
            # what trains comes from the state (checked above); a frozen weight (LoRA's
            # base) from the state when it holds one, else it is your module's as it is:
            # an engine's state holds only what trains
            weights = state["model"]
            with torch.no_grad():
                for name, p in module.named_parameters():
                    if name in weights:
                        p.copy_(weights[name].to(p.device, p.dtype))
        self._half = {Precision.FP16: torch.float16, Precision.BF16: torch.bfloat16}.get(
            self.precision
        )
        if self._half is not None:
            self._hooks.append(
                module.register_forward_pre_hook(cast_floating_inputs(self._half), with_kwargs=True)
            )
        if self.precision is Precision.AMP_BF16:
            self._autocast: Any = _autocast_factory(self.device.type, torch.bfloat16)
        else:
            self._autocast = nullcontext
        n_params = count_parameters(module, trainable_only=True)
        if n_params == 0:
            raise ValueError("model: has no trainable parameters (requires_grad=True)")
        self.ds_config = engine_config(config, self.world_size, n_params)
        if self.ds_config["zero_optimization"]["stage"] == 3:
            Zero3LinearPatch.acquire()  # before initialize, which patches
            self._zero3 = True
        trainable = [p for p in module.parameters() if p.requires_grad]
        engine, _, _, _ = deepspeed.initialize(
            # the engine puts the model on this device index (not on cuda:LOCAL_RANK)
            args=argparse.Namespace(device_rank=self.device.index or 0),
            model=module,
            model_parameters=trainable,
            config=self.ds_config,
            dist_init_required=False,
        )
        self.engine = engine
        if config.compile:
            engine.compile()  # DeepSpeed's own: torch.compile of the module it wraps
        self.module = engine
        self._layout = _layout_of(engine)
        self._named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
        if state is not None:
            self._load(state)
        self._set_lr()

    @property
    def zero_stage(self) -> int:
        """The stage DeepSpeed's engine runs (read from the engine, not the config)."""
        return int(self.engine.zero_optimization_stage())

    @property
    def trained_module(self) -> nn.Module:
        """The engine's copy of your module (16-bit, flattened, partitioned at stage 3)."""
        return self.engine.module  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the loop
    def autocast(self) -> AbstractContextManager[Any]:
        return self._autocast()  # type: ignore[no-any-return]

    def backward(self, loss: torch.Tensor) -> None:
        self._micro += 1
        boundary = self._micro >= self._accum
        self.engine.set_gradient_accumulation_boundary(boundary)
        self.engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps
        if not boundary:
            self.engine.step()  # not a boundary: DeepSpeed only advances its micro counter

    def step(self) -> StepOutcome:
        engine = self.engine
        if self._micro < self._accum:
            # Fewer backward calls than grad_accum: finish the accumulation anyway.
            engine.set_gradient_accumulation_boundary(True)
        lr = float(engine.optimizer.param_groups[0]["lr"])
        own_norm = None
        if self._layout == "basic":
            own_norm = self._basic_grad_norm()  # host waits for the device here
        self._grads_bytes = self._count_grads()
        skipped_before = engine.skipped_steps
        engine.step()
        self._micro = 0
        skipped = engine.skipped_steps > skipped_before
        norm = engine.get_global_grad_norm()
        if norm is None:
            norm = own_norm
        grad_norm = None if norm is None else float(norm)  # host waits for the device here
        if skipped:
            self.overflow_steps += 1
        else:
            self.steps += 1
            self._set_lr()
        return StepOutcome(grad_norm=grad_norm, skipped=skipped, scale=self._scale(), lr=lr)

    def zero_grad(self) -> None:
        self._micro = 0
        opt = self.engine.optimizer
        with contextlib.suppress(TypeError):
            opt.zero_grad(set_to_none=True)
            return
        opt.zero_grad()

    def _lr_optimizer(self) -> Any:
        return self.engine.optimizer

    def _basic_grad_norm(self) -> float | None:
        grads = [p.grad for _, p in self._named if p.grad is not None]
        if not grads:
            return None
        return float(torch.nn.utils.get_total_norm(grads))

    def _scale(self) -> float | None:
        if self.precision is not Precision.FP16:
            return None
        # Every DeepSpeed fp16 optimizer (fused, unfused, ZeRO 1-3) exposes the current
        # dynamic loss scale as the `loss_scale` property (get and set).
        value = getattr(self.engine.optimizer, "loss_scale", None)
        return float(value) if isinstance(value, (int, float, torch.Tensor)) else None

    # ------------------------------------------------------------------ state
    def export_state(self) -> dict[str, Any]:
        """Full fp32 weights and optimizer state by parameter name (collective under
        ZeRO-3: every rank must call it)."""
        model: dict[str, torch.Tensor] = {}
        opt_state: dict[str, dict[str, Any]] = {}
        base = _base_optimizer(self.engine)
        has_state = any(bool(s) for s in base.state.values())
        keys = [k for k in STATE_KEYS[self._family] if has_state]
        step = self._optimizer_step()
        for name, _p, master, states in self._slots(keys):
            model[name] = master
            if keys:
                entry: dict[str, Any] = dict(states)
                entry["step"] = torch.tensor(float(step)) if self._family == "adam" else None
                opt_state[name] = {k: v for k, v in entry.items() if v is not None}
        model.update(frozen_weights(self._frozen))
        scaler_state = None
        if self.precision is Precision.FP16:
            scale = self._scale()
            scaler_state = {
                "scale": float(scale) if scale is not None else float(self.config.loss_scale_init),
                "growth_tracker": 0,
                "init_scale": float(self.config.loss_scale_init),
            }
        return self._neutral_state(model, opt_state, self._family, scaler_state)

    def _optimizer_step(self) -> int:
        base = _base_optimizer(self.engine)
        # FusedAdam advances only the last tensor's counter of a group: take the largest.
        steps = [
            int(st["step"].item() if isinstance(st["step"], torch.Tensor) else st["step"])
            for st in base.state.values()
            if "step" in st
        ]
        return max(steps) if steps else self.steps

    def _slots(
        self, keys: list[str]
    ) -> Iterator[tuple[str, Any, torch.Tensor, dict[str, torch.Tensor]]]:
        """(name, param, full fp32 weight, {state key: full fp32 tensor}) per parameter."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        engine = self.engine
        if self._layout == "basic":
            base = engine.optimizer
            for name, p in self._named:
                st = base.state.get(p, {})
                yield (
                    name,
                    p,
                    p.detach().float().clone(),
                    {k: st[k].detach().float().clone() for k in keys if k in st},
                )
        elif self._layout == "unfused16":
            base = engine.optimizer.optimizer
            for name, p, master in self._unfused_pairs():
                st = base.state.get(master, {})
                yield (
                    name,
                    p,
                    master.detach().clone(),
                    {k: st[k].detach().float().clone() for k in keys if k in st},
                )
        elif self._layout == "flat16":
            opt = engine.optimizer
            base = opt.optimizer
            index = {id(p): name for name, p in self._named}
            for group, flat in zip(opt.fp16_groups, opt.fp32_groups_flat, strict=False):
                st = base.state.get(flat, {})
                offset = 0
                for p in group:
                    n = p.numel()
                    name = index[id(p)]
                    yield (
                        name,
                        p,
                        flat[offset : offset + n].detach().view_as(p).clone(),
                        {
                            k: st[k][offset : offset + n].detach().view_as(p).clone()
                            for k in keys
                            if k in st
                        },
                    )
                    offset += n
        else:
            for name, p in self._named:
                w = safe_get_full_fp32_param(p)
                states = {}
                for k in keys:
                    v = safe_get_full_optimizer_state(p, k)
                    if v is not None:
                        states[k] = v.detach().float().cpu().clone()
                yield name, p, w.detach().float().cpu().clone().view(_shape(p)), states

    def _unfused_pairs(self) -> Iterator[tuple[str, Any, torch.Tensor]]:
        """(name, 16-bit parameter, its fp32 master) of DeepSpeed's unfused 16-bit
        optimizer, whose base optimizer steps (and keys its state by) the masters."""
        opt = self.engine.optimizer
        index = {id(p): name for name, p in self._named}
        for g16, g32 in zip(opt.fp16_groups, opt.fp32_groups, strict=True):
            for p, master in zip(g16, g32, strict=True):
                yield index[id(p)], p, master

    def _load(self, state: dict[str, Any]) -> None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        engine = self.engine
        weights = state["model"]
        optim = state.get("optimizer") or {}
        saved = optim.get("state") or {}
        keys = list(STATE_KEYS[self._family])
        carry = bool(saved) and optim.get("family") == self._family and bool(keys)
        if carry and any(any(k not in saved.get(n, {}) for k in keys) for n, _ in self._named):
            carry = False
        step = int(state.get("steps", 0))
        if carry:
            first = saved[self._named[0][0]]
            if "step" in first:
                v = first["step"]
                step = int(v.item() if isinstance(v, torch.Tensor) else v)
            self._materialize_state(keys, step)
        if self._layout == "basic":
            base = engine.optimizer
            if carry:
                for name, p in self._named:
                    st = base.state[p]
                    for k in keys:
                        st[k].copy_(saved[name][k].to(st[k].device, st[k].dtype))
        elif self._layout == "unfused16":
            base = engine.optimizer.optimizer
            with torch.no_grad():
                for name, p, master in self._unfused_pairs():
                    # the masters were cloned from the 16-bit weights: give them full precision
                    master.copy_(weights[name].reshape(master.shape).to(master.dtype))
                    p.copy_(master.to(p.dtype))
                    if carry:
                        st = base.state[master]
                        for k in keys:
                            st[k].copy_(saved[name][k].reshape(st[k].shape).to(st[k].dtype))
        elif self._layout == "flat16":
            opt = engine.optimizer
            base = opt.optimizer
            index = {id(p): name for name, p in self._named}
            with torch.no_grad():
                for group, flat in zip(opt.fp16_groups, opt.fp32_groups_flat, strict=False):
                    offset = 0
                    for p in group:
                        n = p.numel()
                        name = index[id(p)]
                        flat[offset : offset + n].copy_(weights[name].reshape(-1).to(flat.dtype))
                        if carry:
                            for k in keys:
                                base.state[flat][k][offset : offset + n].copy_(
                                    saved[name][k].reshape(-1).to(flat.dtype)
                                )
                        offset += n
        else:
            for name, p in self._named:
                safe_set_full_fp32_param(p, weights[name].float().to(_device_of(p)))
                if carry:
                    for k in keys:
                        safe_set_full_optimizer_state(
                            p, saved[name][k].float().to(_device_of(p)), k
                        )
        self.steps = int(state.get("steps", 0))
        self.overflow_steps = int(state.get("overflow_steps", 0))
        scaler = state.get("scaler")
        if (
            self.precision is Precision.FP16
            and scaler
            and float(scaler.get("init_scale", -1)) == float(self.config.loss_scale_init)
        ):
            engine.optimizer.loss_scale = float(scaler["scale"])  # the property, see _scale()
        engine.global_steps = self.steps + self.overflow_steps
        engine.skipped_steps = self.overflow_steps

    def _materialize_state(self, keys: list[str], step: int) -> None:
        """Create the optimizer's (lazily built) state tensors so they can be written."""
        engine = self.engine
        base = _base_optimizer(engine)
        torch_adam = isinstance(base, (torch.optim.Adam, torch.optim.AdamW))
        opt = engine.optimizer
        if self._layout == "basic":
            flats: Any = [p for _, p in self._named]
        elif self._layout == "unfused16":
            flats = [master for _, _, master in self._unfused_pairs()]
        else:
            flats = getattr(
                opt,
                {
                    "flat16": "fp32_groups_flat",
                    "zero12": "single_partition_of_fp32_groups",
                    "zero3": "fp32_partitioned_groups_flat",
                }[self._layout],
                None,
            )
        for flat in flats or []:
            st = base.state[flat]
            for k in keys:
                if k not in st:
                    st[k] = torch.zeros_like(flat, memory_format=torch.preserve_format)
            if self._family == "adam":
                st["step"] = torch.tensor(float(step)) if torch_adam else step
        for group in base.param_groups:
            if self._family == "adam" and "step" in group:
                group["step"] = step
        if self._layout == "zero12":
            engine.optimizer._lazy_init_hp_params_optimizer_state()

    # ------------------------------------------------------------------ memory
    def model_state_bytes(self) -> ModelStateBytes:
        """This rank's bytes, counted from its own tensors.

        params: the module's parameters as this rank holds them (ZeRO-3: its partition,
        `param.ds_tensor`). grads: gradient tensors this rank held at the last step
        boundary (counted now when called between backward and step, else as they were
        just before the last optimizer step): p.grad, or the ZeRO gradient partitions and
        the stage-3 reduce bucket. optimizer: every optimizer-state tensor plus the fp32
        master weights (ZeRO's partition, or the stage-0 16-bit flat copy).
        """
        grads = self._count_grads() if self._micro > 0 else self._grads_bytes
        return ModelStateBytes(
            params_bytes=self._count_params(),
            grads_bytes=grads,
            optimizer_bytes=self._count_optimizer(),
        )

    def _count_params(self) -> int:
        """Every parameter of the engine's module as this rank holds it, frozen ones too
        (LoRA's base)."""
        total = 0
        for p in self.engine.module.parameters():
            t = p.ds_tensor if hasattr(p, "ds_tensor") else p.data
            total += _nbytes(t)
        return total

    def _count_grads(self) -> int:
        opt = self.engine.optimizer
        if self._layout in ("basic", "flat16", "unfused16"):
            return sum(_nbytes(p.grad) for _, p in self._named if p.grad is not None)
        if self._layout == "zero12":
            total = 0
            for group in getattr(opt, "averaged_gradients", {}).values():
                if group is not None:  # None between steps, and always under CPU offload
                    total += sum(_nbytes(g) for g in group if g is not None)
            if getattr(opt, "cpu_offload", False):
                # ZeRO-Offload: the gradient partition is the fp32 master partition's .grad
                # (host memory), filled during backward.
                for t in getattr(opt, "single_partition_of_fp32_groups", None) or []:
                    total += _nbytes(getattr(t, "grad", None))
            if total == 0 and self._micro > 0:
                # Between micro-batches of an accumulation DeepSpeed keeps each parameter's
                # full gradient (stage 1: p.grad, stage 2: its all_grad_tensors) until the boundary
                # backward reduces them into the partition.
                held: list[Any] = []
                for _, p in self._named:
                    held += [p.grad, getattr(p, "grad_accum", None)]
                for group in (getattr(opt, "all_grad_tensors", None) or {}).values():
                    held += list(group or [])
                seen: set[int] = set()
                for t in held:
                    if isinstance(t, torch.Tensor) and t.numel() and t.data_ptr() not in seen:
                        seen.add(t.data_ptr())
                        total += _nbytes(t)
            return total
        total = _nbytes(getattr(opt, "grad_partitions_flat_buffer", None))
        for bucket in getattr(opt, "ipg_buckets", {}).values():
            total += _nbytes(getattr(bucket, "buffer", None))
        return total

    def _count_optimizer(self) -> int:
        opt = self.engine.optimizer
        base = _base_optimizer(self.engine)
        total = sum(
            _nbytes(v)
            for st in base.state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        )
        for attr in (
            "single_partition_of_fp32_groups",
            "fp32_partitioned_groups_flat",
            "fp32_groups_flat",
        ):
            for t in getattr(opt, attr, None) or []:
                total += _nbytes(t)
        if self._layout == "unfused16":  # one fp32 master tensor per parameter
            total += sum(_nbytes(master) for _, _, master in self._unfused_pairs())
        return total

    # ------------------------------------------------------------------ teardown
    def _release(self) -> None:
        if self._zero3:
            self._zero3 = False
            Zero3LinearPatch.release()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        engine = self.engine
        self.engine = None
        if engine is not None:
            opt = engine.optimizer
            with contextlib.suppress(Exception):
                engine.destroy()
            base = getattr(opt, "optimizer", opt)
            if base is not None and hasattr(base, "state"):
                with contextlib.suppress(Exception):
                    base.state.clear()
                    base.param_groups.clear()
            if opt is not None:
                _free_flat_buffers(opt)
            del engine, opt, base


# --------------------------------------------------------------------------- helpers


def _layout_of(engine: Any) -> str:
    opt = engine.optimizer
    name = type(opt).__name__
    if name == "DeepSpeedZeroOptimizer_Stage3":
        return "zero3"
    if name in ("DeepSpeedZeroOptimizer", "BF16_Optimizer"):
        return "zero12"
    if hasattr(opt, "fp32_groups_flat") and hasattr(opt, "fp16_groups"):
        return "flat16"
    if hasattr(opt, "fp32_groups") and hasattr(opt, "fp16_groups"):
        return "unfused16"  # FP16_UnfusedOptimizer: one fp32 master tensor per parameter
    return "basic"


def _base_optimizer(engine: Any) -> Any:
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None)
    return inner if inner is not None and hasattr(inner, "state") else opt


def _nbytes(t: Any) -> int:
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return 0
    return int(t.numel() * t.element_size())


def _shape(p: Any) -> torch.Size:
    return p.ds_shape if hasattr(p, "ds_shape") else p.shape


def _device_of(p: Any) -> torch.device:
    t = p.ds_tensor if hasattr(p, "ds_tensor") else p
    return t.device


def _free_flat_buffers(opt: Any) -> None:
    """Drop the optimizer's references to its flat buffers and partitions (the big
    allocations DeepSpeed keeps alive when something else still references the
    optimizer object; see DeepSpeed issues #4527 and #5102)."""
    for attr in list(vars(opt)):
        value = getattr(opt, attr, None)
        if isinstance(value, torch.Tensor) or (
            isinstance(value, (list, dict)) and _holds_tensor(value)
        ):
            with contextlib.suppress(Exception):
                setattr(opt, attr, None)


def _holds_tensor(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value
    for x in items:
        if isinstance(x, torch.Tensor):
            return True
        if isinstance(x, (list, tuple)) and any(isinstance(y, torch.Tensor) for y in x):
            return True
    return False


def _check_state_matches(model: nn.Module, state: dict[str, Any]) -> None:
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise ValueError("state: must be a dict with a 'model' entry of fp32 weights by name")
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name not in weights:
            raise ValueError(
                f"state: no weights for parameter {name}; the state belongs to a different model"
            )
        if tuple(weights[name].shape) != tuple(p.shape):
            raise ValueError(
                f"state: parameter {name} has shape {tuple(weights[name].shape)}, the model "
                f"has {tuple(p.shape)}"
            )


def _autocast_factory(device_type: str, dtype: torch.dtype) -> Any:
    def autocast() -> AbstractContextManager[Any]:
        return torch.autocast(device_type=device_type, dtype=dtype)

    return autocast
