"""`TensorParallelBackend`: PyTorch's tensor parallelism (`tp` > 1) behind the Backend
contract, with data parallel or FSDP2 over the other ranks through a 2-D device mesh, and
the backend-neutral state of the other engines (see `plain.py`), so a Session starts from
and gives back full weights and optimizer state by parameter name.

How it works
------------
* Mesh: `init_device_mesh(device, (world / tp, tp), mesh_dim_names=("dp", "tp"))` over the
  default process group (`process_group.ProcessGroupLease`, gloo on CPU, NCCL on GPUs).
  Ranks r*tp .. r*tp + tp - 1 form one tensor-parallel group; the ranks of a group read
  the same samples (the Session shards data over the `dp` dimension).
* The plan: `workbench.train.techniques.tensor_plan.tensor_plan(model, tp)` names each layer's style;
  the engine trains a private deep copy of your module, the fused qkv rows permuted
  (`TensorPlan.permutations`), then `parallelize_module` over the `tp` mesh
  (`ColwiseParallel`, `RowwiseParallel`, the vocabulary-parallel embedding, the head's
  logits `Shard(-1)`), a tied head re-tied to the embedding's now split matrix.
* The loss runs under `loss_parallel()` (`loss_context`, and `backward`): cross-entropy
  over logits split along the vocabulary, never gathering them.
* Data parallel over `dp` ranks: with `fsdp` off, each gradient (its local shard) is
  all-reduced (averaged) over the `dp` group before the step; with `fsdp` full_shard or
  shard_grad_op, FSDP2's `fully_shard` over the `dp` mesh wraps each checkpointable block
  and the root after the tensor-parallel plan (2-D: parameters sharded over `dp` and split
  over `tp`), and its reduce-scatter averages.
* Gradient norm: each local gradient's squared sum, weighted by how many ranks hold the
  same elements (the replicas of a whole tensor, of a shard split over `tp` only, ...),
  summed over every rank: the norm of the full gradient, as the plain loop computes it.
* Precision: fp32, amp-bf16 (autocast around the forward; parameters fp32) and bf16-true
  (the copy cast to bf16 before splitting). `workbench.engines.tp_problems` refuses the rest.
* State out: every parameter and optimizer state gathered (`full_tensor()`), the
  permutation undone, on the CPU (collective: every rank calls it).
"""

from __future__ import annotations

import contextlib
import copy
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from workbench.config import FsdpMode, Precision, TrainConfig
from workbench.train.backends.base import StepOutcome, load_full_weights
from workbench.train.backends.distributed import DistributedBackend, on_device
from workbench.train.backends.optimizer import build_optimizer
from workbench.train.techniques.precision import PURE_DTYPES, cast_floating_inputs
from workbench.train.techniques.tensor_plan import TensorPlan, tensor_plan


class TensorParallelBackend(DistributedBackend):
    """Tensor parallelism behind the `Backend` contract (see the module docstring)."""

    def _refuse(self, config: TrainConfig) -> None:
        if int(config.tp) < 2:
            raise ValueError(f"tp={config.tp}: TensorParallelBackend needs tp >= 2")

    def _fresh(self) -> None:
        self._model: nn.Module | None = None

    # ------------------------------------------------------------------ building
    def _build(self, model: nn.Module, state: dict[str, Any] | None) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        config = self.config
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.tp = int(config.tp)
        if self.world_size % self.tp:
            raise ValueError(f"tp={self.tp}: must divide the {self.world_size} ranks")
        self.dp = self.world_size // self.tp
        self.precision = Precision(config.precision)
        self.fsdp = FsdpMode(config.fsdp)
        self._inv_accum = 1.0 / int(config.grad_accum)
        self._clip = config.clip_grad_norm
        self.mesh = init_device_mesh(
            self.device.type, (self.dp, self.tp), mesh_dim_names=("dp", "tp")
        )
        self._dp_group = self.mesh.get_group("dp")

        module = copy.deepcopy(model)
        self.plan: TensorPlan = tensor_plan(
            module, self.tp, sequence_parallel=bool(config.sequence_parallel)
        )
        pure = PURE_DTYPES.get(self.precision)
        if pure is not None:
            module.to(pure)
            module.register_forward_pre_hook(cast_floating_inputs(pure), with_kwargs=True)
        if state is not None:
            load_full_weights(module, state)
        self._permute(module)
        module.to(self.device)
        parallelize(module, self.mesh["tp"], self.plan)
        if self.fsdp is not FsdpMode.OFF:
            from torch.distributed.fsdp import fully_shard

            from workbench.train.backends.fsdp import sharding_units

            reshard = self.fsdp is FsdpMode.FULL_SHARD
            for unit, after_forward in sharding_units(module, self.config):  # `fsdp_units`
                fully_shard(unit, mesh=self.mesh["dp"], reshard_after_forward=after_forward)
            fully_shard(module, mesh=self.mesh["dp"], reshard_after_forward=reshard)
        self._model = module
        self.module = module
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not self._named:
            raise ValueError("model: has no trainable parameters (requires_grad=True)")
        self.optimizer = build_optimizer(config, [p for _, p in self._named])
        if state is not None:
            self._load_optimizer(state)
        self._set_lr()

    def _permute(self, module: nn.Module) -> None:
        permute_rows(module, self.plan)

    # ------------------------------------------------------------------ the loop
    @property
    def trained_module(self) -> nn.Module:
        assert self._model is not None
        return self._model

    def autocast(self) -> AbstractContextManager[Any]:
        """The forward's context: autocast under amp-bf16, and the vocabulary-parallel
        loss (a model that computes its own loss, a `transformers` one given labels, does
        it in its forward)."""
        from torch.distributed.tensor.parallel import loss_parallel

        stack = contextlib.ExitStack()
        stack.enter_context(on_device(self.device))
        if self.precision is Precision.AMP_BF16:
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        stack.enter_context(loss_parallel())
        return stack

    def loss_context(self) -> AbstractContextManager[Any]:
        """Where the loss is computed: vocabulary-parallel cross-entropy over the split
        logits."""
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def backward(self, loss: torch.Tensor) -> None:
        from torch.distributed.tensor.parallel import loss_parallel

        with on_device(self.device), loss_parallel():
            (loss * self._inv_accum).backward()

    def step(self) -> StepOutcome:
        with on_device(self.device):
            return self._step()

    def _step(self) -> StepOutcome:
        lr = float(self.optimizer.param_groups[0]["lr"])
        if self.dp > 1 and self.fsdp is FsdpMode.OFF:
            self._average_over_dp()
        self._grads_bytes = self._count_grads()
        norm = self._grad_norm()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self._set_lr()
        return StepOutcome(grad_norm=norm, skipped=False, scale=None, lr=lr)

    def _average_over_dp(self) -> None:
        import torch.distributed as dist

        for _, p in self._named:  # every rank the same calls: an unused one reduces zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            local = _local(p.grad)
            dist.all_reduce(local, group=self._dp_group)
            local.div_(self.dp)

    def _grad_norm(self) -> float:
        """The full gradient's norm (see the module docstring), clipped when asked."""
        import torch.distributed as dist

        grads = [p.grad for _, p in self._named if p.grad is not None]
        total = torch.zeros((), dtype=torch.float32, device=self.device)  # reduced on every rank
        for g in grads:
            total += _local(g).float().pow(2).sum() * (shard_count(g) / self.world_size)
        dist.all_reduce(total)
        norm = float(total.sqrt())
        if self._clip is not None:
            coef = float(self._clip) / (norm + 1e-6)
            if coef < 1.0:
                for g in grads:
                    _local(g).mul_(coef)
        return norm

    # ------------------------------------------------------------------ state
    def export_state(self) -> dict[str, Any]:
        """Full fp32 weights and optimizer state by parameter name, on the CPU, in your
        module's own row order (collective: every rank calls it)."""
        with on_device(self.device):
            model = {n: self._full(n, p, p).float() for n, p in self._named}
            opt_state: dict[str, dict[str, Any]] = {}
            for name, p in self._named:
                st = self.optimizer.state.get(p) or {}
                if st:
                    opt_state[name] = {k: self._full(name, v, p) for k, v in st.items()}
        return self._neutral_state(model, opt_state, self._family)

    def _full(self, name: str, value: Any, param: Any) -> Any:
        """`value` (a parameter, or a state of `param`) whole, on the CPU, unpermuted."""
        return whole_tensor(value, param, self.plan.permutations.get(name))

    def _load_optimizer(self, state: dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))
        saved = self._saved_optimizer(state)
        for name, p in self._named:
            if name in saved:
                order = self.plan.permutations.get(name)
                self.optimizer.state[p] = split_state(saved[name], p, order, self.device)

    # ------------------------------------------------------------------ memory
    def _params_held(self) -> Any:
        model = self._model
        return model.parameters() if model is not None else (p for _, p in self._named)

    # ------------------------------------------------------------------ teardown
    def _release(self) -> None:
        self._model = None


def parallelize(module: nn.Module, mesh: Any, plan: TensorPlan) -> None:
    """`parallelize_module` with the plan's styles; a tied head re-tied after."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    # the residual stream: whole, or split along the sequence (dim 1) under sequence parallel
    stream = Shard(1) if plan.sequence_parallel else Replicate()
    styles: dict[str, Any] = {}
    for name, kind in plan.layers.items():
        if kind == "colwise":
            styles[name] = ColwiseParallel(input_layouts=stream)
        elif kind == "rowwise":
            styles[name] = RowwiseParallel(output_layouts=stream)
        elif kind == "embedding":
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        elif kind == "embedding-whole":  # a decoder that reads positions from its output
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif kind == "colwise-gathered":  # its input gathered by its module already
            styles[name] = ColwiseParallel()
        elif kind == "gather-sequence":  # a module's one positional input, gathered once
            styles[name] = PrepareModuleInput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_output=True,
            )
        elif kind == "gather-sequence-kw":  # the same for a module given hidden_states=
            styles[name] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=True,
            )
        elif kind == "split-sequence":  # the first layer's input: this rank's positions
            styles[name] = PrepareModuleInput(
                input_layouts=(Replicate(),),
                desired_input_layouts=(Shard(1),),
                use_local_output=True,
            )
        elif kind == "norm":
            styles[name] = SequenceParallel()
        elif kind == "positions":  # (s, h) rows of the position table, split as the sequence
            styles[name] = PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(0)
            )
        else:  # the head: logits split over the vocabulary for the parallel loss
            styles[name] = ColwiseParallel(
                input_layouts=stream, output_layouts=Shard(-1), use_local_output=False
            )
    parallelize_module(module, mesh, styles)
    if plan.tied is not None:
        head, embedding = (module.get_submodule(n) for n in plan.tied)
        head.weight = embedding.weight
    for p in module.parameters():
        if p.requires_grad and getattr(p, "placements", None) is not None:
            p.register_hook(_as_placed(p.placements))


def permute_rows(module: nn.Module, plan: TensorPlan) -> None:
    """The fused qkv rows of `module` (whole, not yet split) into the order the
    tensor-parallel slices need (`TensorPlan.permutations`)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            order = plan.permutations.get(name)
            if order is not None:
                p.copy_(p[order])


def _as_placed(placements: Any) -> Any:
    """A gradient hook that gives a gradient its parameter's placements: the embedding's
    backward returns a replicated (whole-vocabulary) gradient for a row-split table, which
    would be accumulated and kept whole; as a shard it is this rank's rows (a local slice,
    no communication)."""

    def hook(grad: Any) -> Any:
        if tuple(grad.placements) == tuple(placements):
            return None
        return grad.redistribute(placements=placements)

    return hook


def _local(t: Any) -> Any:
    """A DTensor's local tensor, or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def whole_tensor(value: Any, param: Any, order: torch.Tensor | None) -> Any:
    """A parameter or a state of `param` whole (`full_tensor()` of a shard: collective over
    its group), on the CPU, in your module's row order (`order`: the plan's permutation of
    its rows, undone here); anything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    full = value.full_tensor() if hasattr(value, "full_tensor") else value
    full = full.detach().cpu()
    if order is not None and full.dim() > 0 and tuple(full.shape) == tuple(param.shape):
        full = full[torch.argsort(order)]
    return full


def split_state(
    saved: dict[str, Any], param: Any, order: torch.Tensor | None, device: torch.device
) -> dict[str, Any]:
    """One parameter's saved optimizer state placed as `param` is: each tensor on `device`
    in its dtype, its rows permuted (`order`), split as its DTensor; scalars as they are."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    st: dict[str, Any] = {}
    for key, v in saved.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            v = v.to(device, param.dtype if v.is_floating_point() else v.dtype)
            if order is not None:
                v = v[order]
            if isinstance(param, DTensor):
                v = distribute_tensor(v, param.device_mesh, param.placements)
        st[key] = v
    return st


def shard_count(t: Any) -> int:
    """Into how many disjoint pieces the ranks split `t` (1 for a whole tensor): the
    product of the mesh sizes it is sharded over (`Shard`, and FSDP2's `_StridedShard` of
    a tensor-parallel shard, whose `is_shard()` is False)."""
    placements = getattr(t, "placements", None)
    if placements is None:
        return 1
    n = 1
    for size, placement in zip(t.device_mesh.shape, placements, strict=True):
        if not (placement.is_replicate() or placement.is_partial()):
            n *= int(size)
    return n


__all__ = ["TensorParallelBackend", "parallelize", "permute_rows", "shard_count"]
