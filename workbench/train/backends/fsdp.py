"""`FSDPBackend`: PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`) behind the Backend
contract, with the same backend-neutral state as the others (see `plain.py`), so a
Session switches between the plain loop, FSDP and DeepSpeed ZeRO at a step boundary.

How it works
------------
* Process group: `process_group.ProcessGroupLease` (rank 0 of 1 in a notebook; gloo on
  CPU, "cpu:gloo,cuda:nccl" on CUDA), shared with the other engines alive in the process.
  FSDP's mesh must reduce on every device type its tensors live on: with CPU offload the
  gradient norm, the GradScaler's found-inf flag and the full-state gathers are host
  tensors. Over a group without a host backend (NCCL only: one DeepSpeed or a launcher
  created) the backend makes its own group with gloo added for host tensors, and
  destroys it at close.
* Device: FSDP2 places parameters, its streams and its buffers on the *current* CUDA
  device, not on a device you name, and the current device is per thread. So building,
  forward (where FSDP creates its streams), backward, the optimizer step and the state
  gathers all run under `torch.cuda.device(<the session's device>)`: a session on
  "cuda:1" trains on cuda:1 whatever the calling thread's current device is.
* The engine trains a private deep copy of your module on the session's device: FSDP2
  turns parameters into sharded DTensors in place. Your module gets the trained weights
  back from `export_state()` at every switch and at close (`workbench.train.runtime`).
* Wrapping rule (`fsdp_units`, `sharding_units`): "blocks" (the default) applies
  `fully_shard` to every block marked checkpointable (the built-in GPT's transformer
  blocks; mark yours with
  `workbench.train.techniques.recompute.mark_checkpointable(model, [names])`), to the
  embedding and to the output head (with the final norm) as units of their own, as
  torchtitan's `apply_fsdp` and torchtune's `custom_sharded_layers: ['tok_embeddings',
  'output']` shard them (a head tied to the embedding stays in the root with it), then to
  the root; "blocks-only" leaves the embedding and head in the root; a list of class
  names or qualified-name patterns makes each module it matches a unit (one that splits a
  tied weight over two units, a tied head of its own, is refused: FSDP2 shards a weight in
  one unit). So each unit's parameters are gathered just before it runs and freed after.
* Modes: "full_shard" reshards parameters after forward (`reshard_after_forward=True`,
  ZeRO-3-like peak), "shard_grad_op" keeps them gathered from forward to backward
  (`reshard_after_forward=False`, ZeRO-2-like peak), "no_shard" replicates (a 2-D mesh
  of N replicas x 1 shard: DDP-like). At rest (the optimizer step) full_shard and
  shard_grad_op keep parameters, gradients and optimizer states sharded; under no_shard
  every rank holds them whole (tests/integration/test_fsdp_ranks.py).
* Mixed precision: "amp-bf16" / "amp-fp16" become a `MixedPrecisionPolicy` (parameters
  gathered in 16 bit for compute; gradients reduced in fp32 unless
  `fsdp_reduce_fp32=False`); the sharded parameters and optimizer states stay fp32.
  "amp-fp16" adds torch's GradScaler (dynamic loss scaling over the sharded gradients).
* Pure bf16 ("bf16-true"): the private copy is cast to bf16 before `fully_shard`, so the
  sharded parameters, gradients and optimizer states are bf16 (no fp32 master copy) and
  the policy casts nothing (`param_dtype=None`); gradients are reduced in fp32 and
  stored back in bf16 unless `fsdp_reduce_fp32=False` (then reduced in bf16); floating
  inputs are cast to bf16 by a forward pre-hook.
* QLoRA: your module's 4-bit base is torchao's NF4 tensor under FSDP
  (`workbench.train.techniques.lora.NF4Linear`, torchtune's way), which FSDP2 shards like
  any parameter and gathers through the tensor's own `fsdp_pre_all_gather` /
  `fsdp_post_all_gather` (packed codes, block scales and second-level factors gathered,
  the NF4 code and scale mean kept whole); each 4-bit weight must split evenly
  (`nf4_shard_problem`). torch 2.13's FSDP2 skips those hooks on a one-rank mesh, so
  QLoRA under FSDP needs 2+ ranks (`workbench.engines`).
* `offload_params="cpu"` (with "full_shard"): `CPUOffloadPolicy`, sharded parameters,
  gradients and the optimizer step live in host memory.
* State in and out: full (unsharded) fp32 weights and optimizer state (in the dtype it
  is held in, cast to the parameters' own when loaded) by parameter name through
  PyTorch's distributed state-dict API
  (`torch.distributed.checkpoint.state_dict`); collective, so every rank calls it.
"""

from __future__ import annotations

import contextlib
import copy
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from workbench.config import FsdpMode, OffloadDevice, Precision, TrainConfig
from workbench.export.job_parallel import resolve_units, unit_tokens
from workbench.inputs import shown
from workbench.train.backends.base import (
    StepOutcome,
    frozen_parameters,
    frozen_weights,
    load_full_weights,
)
from workbench.train.backends.distributed import (  # on_device: re-exported
    DistributedBackend,
    local_tensor,
    on_device,
)
from workbench.train.backends.optimizer import (
    STATE_KEYS,
    build_optimizer,
    neutral,
    placed_state,
)
from workbench.train.backends.process_group import device_types
from workbench.train.techniques.lora import adapters_in_dtype, nf4_shard_problem
from workbench.train.techniques.precision import (
    PURE_DTYPES,
    cast_floating_inputs,
    restore_scaler,
    scaler_state,
)
from workbench.train.techniques.recompute import checkpointable_modules

_HALF = {Precision.AMP_BF16: torch.bfloat16, Precision.AMP_FP16: torch.float16}
_BACKEND_FOR = {"cpu": "gloo", "cuda": "nccl"}  # a group's backend per device type


class FSDPBackend(DistributedBackend):
    """FSDP2 behind the `Backend` contract (see the module docstring)."""

    def _refuse(self, config: TrainConfig) -> None:
        if FsdpMode(config.fsdp) is FsdpMode.OFF:
            raise ValueError(
                "fsdp='off': FSDPBackend needs fsdp full_shard, shard_grad_op or no_shard"
            )

    def _fresh(self) -> None:
        self.mode = FsdpMode(self.config.fsdp)
        self._sharded: nn.Module | None = None
        self._group: Any = None  # a group this backend created for host tensors, if any

    def _building(self) -> AbstractContextManager[Any]:
        return on_device(self.device)  # the mesh and fully_shard on the session's device

    # ------------------------------------------------------------------ building
    def _build(self, model: nn.Module, state: dict[str, Any] | None) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        config = self.config
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.precision = Precision(config.precision)
        self._inv_accum = 1.0 / int(config.grad_accum)
        self._clip = config.clip_grad_norm

        self._frozen = frozen_parameters(model)  # exported from your module
        module = copy.deepcopy(model)
        pure = PURE_DTYPES.get(self.precision)
        if pure is not None:  # bf16-true: shards, gradients and states in bf16
            module.to(pure)  # (QLoRA's NF4 weights are bf16 already: left as they are)
            module.register_forward_pre_hook(cast_floating_inputs(pure), with_kwargs=True)
        adapters_in_dtype(module, config)  # LoRA's adapters in `lora_dtype`'s dtype
        problem = nf4_shard_problem(module, self.world_size)
        if problem is not None:
            raise ValueError(f"qlora=True: {problem}")
        if state is not None:
            load_full_weights(module, state)
        offload = OffloadDevice(config.offload_params) is OffloadDevice.CPU
        module.to(self.device)
        self.offload = offload
        mp = _mixed_precision(MixedPrecisionPolicy, self.precision, config.fsdp_reduce_fp32)
        if self.mode is FsdpMode.NO_SHARD:
            mesh = init_device_mesh(
                self.device.type, (self.world_size, 1), mesh_dim_names=("replicate", "shard")
            )
        else:
            mesh = self._mesh_1d(init_device_mesh, offload)
        options: dict[str, Any] = {
            "mesh": mesh,
            "mp_policy": mp,
            # pinned host memory needs a GPU; on a CPU the "offload" is where they are anyway
            "offload_policy": (
                CPUOffloadPolicy(pin_memory=self.device.type == "cuda")
                if offload
                else OffloadPolicy()
            ),
            "reshard_after_forward": self.mode is FsdpMode.FULL_SHARD,
        }
        for unit, after_forward in sharding_units(module, config):
            fully_shard(unit, **{**options, "reshard_after_forward": after_forward})
        fully_shard(module, **options)
        self._sharded = module
        # forward runs through torch.compile when asked (compiled on the first step)
        self.module = torch.compile(module) if config.compile else module
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not self._named:
            raise ValueError("model: has no trainable parameters (requires_grad=True)")
        self.optimizer = build_optimizer(config, [p for _, p in self._named])
        self.scaler = (
            torch.amp.GradScaler(
                self.device.type,
                init_scale=float(config.loss_scale_init),
                growth_factor=float(config.loss_scale_growth),
                backoff_factor=float(config.loss_scale_backoff),
                growth_interval=int(config.loss_scale_interval),
            )
            if self.precision is Precision.AMP_FP16
            else None
        )
        if state is not None:
            self._load_state(state)
        self._set_lr()

    def _mesh_1d(self, init_device_mesh: Any, offload: bool) -> Any:
        """The 1-D mesh over every rank: over the default group when it reduces on every
        device type this engine's tensors live on, else over a group of its own with the
        missing backends added (gloo for host tensors, NCCL for CUDA ones)."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        needed = {self.device.type} | ({"cpu"} if offload else set())
        have = device_types()
        if needed <= have:
            return init_device_mesh(self.device.type, (self.world_size,))
        config = str(dist.get_backend_config())
        extra = [f"{kind}:{_BACKEND_FOR[kind]}" for kind in sorted(needed - have)]
        self._group = dist.new_group(backend=",".join([*extra, config]))
        return DeviceMesh.from_group(self._group, self.device.type)

    # ------------------------------------------------------------------ the loop
    @property
    def trained_module(self) -> nn.Module:
        """The module FSDP trains (the sharded copy of yours)."""
        assert self._sharded is not None
        return self._sharded

    def autocast(self) -> AbstractContextManager[Any]:
        # FSDP's MixedPrecisionPolicy casts for compute itself; the forward runs on the
        # session's device (FSDP creates its streams on the current one at the first)
        return on_device(self.device)

    def backward(self, loss: torch.Tensor) -> None:
        with on_device(self.device):
            scaled = loss * self._inv_accum
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            scaled.backward()

    def step(self) -> StepOutcome:
        with on_device(self.device):
            return self._step()

    def _step(self) -> StepOutcome:
        lr = float(self.optimizer.param_groups[0]["lr"])
        scaler = self.scaler
        if scaler is not None:
            scaler.unscale_(self.optimizer)  # before clipping: clip the true gradients
        self._grads_bytes = self._count_grads()
        norm = self._grad_norm()  # host waits for the device here
        skipped = False
        scale = None
        if scaler is not None:
            before = scaler.get_scale()
            scaler.step(self.optimizer)
            scaler.update()
            scale = scaler.get_scale()
            skipped = scale < before
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if skipped:
            self.overflow_steps += 1
        else:
            self.steps += 1
            self._set_lr()
        return StepOutcome(grad_norm=norm, skipped=skipped, scale=scale, lr=lr)

    def _grad_norm(self) -> float:
        params = [p for _, p in self._named]
        if self._clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, self._clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        full = getattr(norm, "full_tensor", None)  # a DTensor over the shards
        return float(full() if callable(full) else norm)

    # ------------------------------------------------------------------ state
    def export_state(self) -> dict[str, Any]:
        """Full fp32 weights and optimizer state by parameter name, on the CPU
        (collective: every rank calls it and gets the full state)."""
        with on_device(self.device):
            return self._export_state()

    def _export_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        # full_state_dict + cpu_offload would leave ranks other than 0 empty: gather on
        # every rank, then copy to host memory
        options = StateDictOptions(full_state_dict=True)
        assert self._sharded is not None
        weights = get_model_state_dict(self._sharded, options=options)
        model = {n: weights[n].detach().float().cpu() for n, _ in self._named}
        model.update(frozen_weights(self._frozen))
        opt_state: dict[str, dict[str, Any]] = {}
        if any(bool(s) for s in self.optimizer.state.values()):
            # the shards by name (no collective), each gathered here once it is a plain
            # fp32 shard: see `_gathered`
            shards = get_optimizer_state_dict(self._sharded, self.optimizer)
            for name, st in shards["state"].items():
                opt_state[name] = {k: _gathered(v) for k, v in st.items()}
        return self._neutral_state(
            model, opt_state, self._family, scaler_state(self.scaler, self.config)
        )

    def _load_state(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        self.steps = int(state.get("steps", 0))
        self.overflow_steps = int(state.get("overflow_steps", 0))
        saved = self._saved_optimizer(state)
        if saved:
            options = StateDictOptions(full_state_dict=True)
            assert self._sharded is not None
            # the groups by name; the state is replaced whole below, so it is not gathered
            fresh = get_optimizer_state_dict(self._sharded, self.optimizer)
            # the full tensors where the shards live (host memory under CPU offload), in the
            # parameters' dtype (bf16 moments into fp32 shards and back)
            home = torch.device("cpu") if self.offload else self.device
            fresh["state"] = {
                name: {k: _state_tensor(v, home, p.dtype) for k, v in saved[name].items()}
                for name, p in self._named
                if name in saved
            }
            set_optimizer_state_dict(
                self._sharded, self.optimizer, optim_state_dict=fresh, options=options
            )
            if self.offload:
                self._states_beside_shards()
            self._requantize()
        restore_scaler(self.scaler, state.get("scaler"), self.config)

    def _requantize(self) -> None:
        """The loaded moments back in an 8-bit optimizer's own buffers: the state-dict
        loader leaves the fp32 shards it distributed, which torchao's AdamW8bit would step
        as they are (4 bytes a moment); each becomes the 8-bit DTensor the optimizer makes
        for its shard (quantized from the fp32 values). Other optimizers: nothing."""
        if not callable(getattr(self.optimizer, "_new_buffer", None)):
            return
        for param, st in self.optimizer.state.items():
            for key in STATE_KEYS["adam"]:
                value = st.get(key)
                if isinstance(value, torch.Tensor) and not _is_8bit(value):
                    st[key] = placed_state(self.optimizer, param, key, value)

    def _states_beside_shards(self) -> None:
        """torch's state-dict loader distributes full tensors onto the mesh's device type
        (CUDA), while CPU-offloaded shards live in host memory: move each optimizer state
        to its parameter's shard device, or the first step mixes devices."""
        for param, st in self.optimizer.state.items():
            home = _local(param).device
            for key, value in list(st.items()):
                moved = isinstance(value, torch.Tensor) and value.dim() > 0
                if moved and _local(value).device != home:
                    st[key] = value.to(home)

    # ------------------------------------------------------------------ memory
    def _params_held(self) -> Any:
        """Every parameter's shard, frozen ones too (LoRA's base)."""
        sharded = self._sharded
        return sharded.parameters() if sharded is not None else (p for _, p in self._named)

    # ------------------------------------------------------------------ teardown
    def _release(self) -> None:
        self._sharded = None
        group, self._group = self._group, None
        if group is not None:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)


def sharding_units(module: nn.Module, config: TrainConfig) -> list[tuple[Any, bool]]:
    """The units `fully_shard` is applied to before the root (`config.fsdp_units`, see
    `workbench.export.job_parallel.fsdp_units`), each with its `reshard_after_forward`:
    the mode's, except the output head's under "blocks", which stays gathered after
    forward as torchtitan keeps it (its backward needs it at once). A name matching no
    module is a ValueError naming what the model's modules are called, a tied weight split
    over two units one naming them (`job_parallel.resolve_units`)."""
    blocks = checkpointable_modules(module)
    spec = str(config.fsdp_units)
    units, problem = resolve_units(module, spec, blocks)
    if problem is not None:
        raise ValueError(f"fsdp_units={shown(spec)}: {problem}")
    after = FsdpMode(config.fsdp) is FsdpMode.FULL_SHARD
    last = units[-1] if units else None
    head = unit_tokens(spec) == ["blocks"] and len(units) > len(blocks)
    return [(u, after and not (head and u is last)) for u in units]


def _mixed_precision(policy: Any, precision: Precision, reduce_fp32: bool) -> Any:
    """FSDP2's `MixedPrecisionPolicy` for `precision`: AMP gathers 16-bit copies for
    compute; pure bf16 casts nothing (the shards are bf16 already); both reduce gradients
    in fp32 when `reduce_fp32`, else in the 16-bit dtype; fp32 casts nothing."""
    half = _HALF.get(precision)
    if half is not None:
        return policy(param_dtype=half, reduce_dtype=torch.float32 if reduce_fp32 else half)
    if precision in PURE_DTYPES and reduce_fp32:
        return policy(param_dtype=None, reduce_dtype=torch.float32)
    return policy(param_dtype=None, reduce_dtype=None)


def _state_tensor(value: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """A saved optimizer-state value on `device`, a floating state tensor in `dtype`;
    scalars (Adam's step) as they are."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    return value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)


def _gathered(value: Any) -> Any:
    """An optimizer-state value whole on the CPU, 8-bit moments dequantized to fp32
    (collective for a DTensor: every rank calls it, in the same order). Each rank
    dequantizes its own shard and the plain fp32 shards are gathered: gathering torchao's
    `OptimState8bit` itself (its codes and scales through functional collectives, what
    `get_optimizer_state_dict(full_state_dict=True)` does) aborted a rank now and then on
    torch 2.13 / torchao 0.18 (malloc's heap check failing inside that gather: 2 runs in 17
    of tests/integration/test_adam8bit_fsdp.py, none in 24 since)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, torch.Tensor):
        return value
    if not isinstance(value, DTensor):
        return neutral(value.detach()).cpu()
    local = neutral(value.to_local().detach())
    plain = DTensor.from_local(
        local, value.device_mesh, value.placements, run_check=False,
        shape=value.shape, stride=value.stride(),
    )  # fmt: skip
    return plain.full_tensor().cpu()


def _is_8bit(t: torch.Tensor) -> bool:
    """A torchao low-bit state (a tensor subclass), as a DTensor's local shard or alone."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    local = _local(t)
    return is_traceable_wrapper_subclass(local) and hasattr(local, "dequantize")


_local = local_tensor
