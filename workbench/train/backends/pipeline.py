"""`PipelineBackend`: pipeline parallelism (`pp` > 1) through `torch.distributed.pipelining`
behind the Backend contract, data parallel over the other ranks, with the backend-neutral
state of the other engines (see `plain.py`).

How it works
------------
* Ranks: a 3-D mesh (dp, pp, tp), rank = (d * pp + s) * tp + t holds stage s of
  pipeline d (`workbench.train.techniques.pipeline_plan.pipeline_stage`: `layers / pp` consecutive
  blocks, the embeddings on the first stage, the final norm and head on the last), split
  over its `tp` ranks when `tp` > 1 (the tensor-parallel engine's plan, `parallelize`,
  restricted to the stage's layers; the last stage's copy of the tied head split by
  vocabulary rows like the embedding, so the two copies' gradients are summed shard by
  shard; the loss vocabulary-parallel inside the schedule). Every rank of a
  pipeline reads the same samples (the Session shards data over the pipelines); the
  first stage uses the inputs, the last the targets.
* A step: the `grad_accum` micro-batches of the step, concatenated, go through one
  `schedule.step` (`Schedule1F1B` or `ScheduleGPipe`, `pp_schedule`), which splits them
  back into `grad_accum` micro-batches, runs forward and backward stage by stage
  (activations sent forward, their gradients back, point to point) and divides the
  gradients by the micro-batch count (`scale_grads`), so a step is the mean over its
  micro-batches, as the plain loop's accumulation. The loop calls `train_step(batches,
  loss_fn)` instead of forward and backward per micro-batch; the last stage's summed
  loss is broadcast to its pipeline, so every rank records the same loss.
* The tied head: the last stage's own copy of the embedding matrix; after the schedule,
  the first and last stages of each pipeline sum their copies' gradients (one
  all-reduce between the two), so both step identically and stay equal.
* Data parallel over the pipelines: each gradient is all-reduced (averaged) over the
  ranks holding the same stage. The gradient norm: every stage's squared sum (the tied
  copy counted once), summed over the pipeline.
* Measured (CUDA events on a GPU, `SpanClock`): the schedule's wall time and the time
  this stage computed in it (its forward and backward chunks), so `pipeline_report()`
  gives the bubble this rank sat idle next to the schedule's ideal, (pp - 1) / (micro-batches + pp - 1); `probe()`
  counts the peak of the activations this stage holds in flight during one step (bytes
  saved for backward, packed minus unpacked), which 1F1B bounds by `pp` micro-batches
  on the first stage and GPipe does not.
* State out: every stage's full weights and optimizer states gathered to every rank
  (`all_gather_object` over the pipeline: collective), the tied copy under the
  embedding's name.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from workbench.config import PipelineSchedule, Precision, TrainConfig
from workbench.train.backends.base import (
    ModelStateBytes,
    StepOutcome,
    load_full_weights,
)
from workbench.train.backends.distributed import DistributedBackend, on_device
from workbench.train.backends.optimizer import build_optimizer
from workbench.train.backends.tensor_parallel import (
    parallelize,
    permute_rows,
    shard_count,
    split_state,
    whole_tensor,
)
from workbench.train.batches import to_fp32
from workbench.train.techniques.offload import (
    is_parameter_derived,
    local_tensor,
    parameter_storages,
)
from workbench.train.techniques.pipeline_plan import TIED_COPY, pipeline_stage
from workbench.train.techniques.precision import PURE_DTYPES, cast_floating_inputs
from workbench.train.techniques.tensor_plan import TensorPlan, tensor_plan

_shards = shard_count


class SpanClock:
    """Seconds of a stage's work, as the device did it. On CUDA the schedule's chunks and
    its NCCL sends and receives are asynchronous: host time around a chunk measures its
    launches, not its kernels. So each mark is a CUDA event recorded on the current stream
    (the schedule makes that stream wait for its receives), and the spans between marks are
    read once the step's last mark completed (`seconds`, `busy`: the one wait). Elsewhere
    the work is done when the call returns: the host clock. `event`: the CUDA event type
    (a stand-in in tests)."""

    def __init__(self, device: torch.device, event: Any = None) -> None:
        self.on_device = device.type == "cuda" or event is not None
        self._event = event or (torch.cuda.Event if self.on_device else None)
        self.spans: list[tuple[Any, Any]] = []

    def mark(self) -> Any:
        if not self.on_device:
            return time.perf_counter()
        event = self._event(enable_timing=True)
        event.record()
        return event

    def span(self, start: Any, end: Any) -> None:
        self.spans.append((start, end))

    def seconds(self, start: Any, end: Any) -> float:
        if not self.on_device:
            return float(end - start)
        end.synchronize()  # the host waits for the device here
        return float(start.elapsed_time(end)) / 1000.0

    def busy(self) -> float:
        """The spans' seconds added up (after the step: its last mark has completed)."""
        return sum(self.seconds(a, b) for a, b in self.spans)


class PipelineBackend(DistributedBackend):
    """Pipeline parallelism behind the `Backend` contract (see the module docstring)."""

    runs_whole_step = True  # the schedule runs a step's forwards and backwards

    def _refuse(self, config: TrainConfig) -> None:
        if int(config.pp) < 2:
            raise ValueError(f"pp={config.pp}: PipelineBackend needs pp >= 2")

    def _fresh(self) -> None:
        self._groups: list[Any] = []

    # ------------------------------------------------------------------ building
    def _build(self, model: nn.Module, state: dict[str, Any] | None) -> None:
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        config = self.config
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.pp, self.tp = int(config.pp), int(config.tp)
        if self.world_size % (self.pp * self.tp):
            raise ValueError(
                f"pp={self.pp}, tp={self.tp}: pp x tp must divide the {self.world_size} ranks"
            )
        self.dp = self.world_size // (self.pp * self.tp)
        self.stage_index = (self.rank // self.tp) % self.pp
        self.first, self.last = self.stage_index == 0, self.stage_index == self.pp - 1
        self.micro_batches = int(config.grad_accum)
        self.schedule_name = PipelineSchedule(config.pp_schedule)
        self.precision = Precision(config.precision)
        self._clip = config.clip_grad_norm
        self._clock = SpanClock(self.device)
        self.last_wall_seconds = 0.0
        self.last_busy_seconds = 0.0
        self._pp_group, self._dp_group, self._tied_group = self._make_groups(dist)

        full = copy.deepcopy(model)
        pure = PURE_DTYPES.get(self.precision)
        if pure is not None:
            full.to(pure)
        if state is not None:
            load_full_weights(full, state)
        self._has_tied = full.head.weight is full.wte.weight  # type: ignore[union-attr]
        self.plan: TensorPlan | None = None
        if self.tp > 1:  # each stage split over its tensor-parallel group: rows reordered first
            self.plan = tensor_plan(full, self.tp, sequence_parallel=bool(config.sequence_parallel))
            permute_rows(full, self.plan)
        stage = pipeline_stage(full, self.pp, self.stage_index)
        del full
        if pure is not None and self.first:
            stage.register_forward_pre_hook(cast_floating_inputs(pure), with_kwargs=True)
        stage.to(self.device)
        if self.plan is not None:
            names = {n for n, _ in stage.named_modules()}
            own = {n: kind for n, kind in self.plan.layers.items() if n in names}
            # the last stage's head is its own copy of the tied matrix: split, not tied
            split = dataclasses.replace(self.plan, layers=own, tied=None)
            parallelize(stage, self._mesh["tp"], split)
        self.module = stage
        self._named = [(n, p) for n, p in stage.named_parameters() if p.requires_grad]
        if not self._named:
            raise ValueError("model: has no trainable parameters (requires_grad=True)")
        self._tied = dict(self._named).get(TIED_COPY[0]) if self.last and not self.first else None
        self.optimizer = build_optimizer(config, [p for _, p in self._named])
        if state is not None:
            self._load_optimizer(state)
        self._set_lr()
        self.stage = PipelineStage(
            stage, self.stage_index, self.pp, self.device, group=self._pp_group
        )
        self._time_chunks(self.stage)
        schedule = (
            Schedule1F1B if self.schedule_name is PipelineSchedule.ONE_F_ONE_B else ScheduleGPipe
        )
        self._loss_fn: Any = None
        self.schedule = schedule(
            self.stage,
            n_microbatches=self.micro_batches,
            loss_fn=self._micro_loss,
            scale_grads=True,
        )

    def _make_groups(self, dist: Any) -> tuple[Any, Any, Any]:
        """This rank's pipeline, its data-parallel peers (the same stage and tensor-parallel
        rank in every pipeline) and the pair of first and last stages that share the tied
        head: from the 3-D mesh (dp, pp, tp), rank = (d * pp + s) * tp + t, and one group
        per pair. Every rank creates every group (collective)."""
        from torch.distributed.device_mesh import init_device_mesh

        pp, tp, dp = self.pp, self.tp, self.dp
        self._mesh = init_device_mesh(
            self.device.type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp")
        )
        tied_mine = None
        for d in range(dp):
            for t in range(tp):
                pair = [(d * pp) * tp + t, (d * pp + pp - 1) * tp + t]
                tied = dist.new_group(pair)
                self._groups.append(tied)
                if self.rank in pair:
                    tied_mine = tied
        return self._mesh.get_group("pp"), self._mesh.get_group("dp"), tied_mine

    def _time_chunks(self, stage: Any) -> None:
        """Time this stage's compute (its forward and backward chunks) on `_clock`."""
        for name in ("forward_one_chunk", "backward_one_chunk"):
            inner = getattr(stage, name)

            def timed(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
                start = self._clock.mark()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    self._clock.span(start, self._clock.mark())

            setattr(stage, name, timed)

    def _micro_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._loss_fn(to_fp32(output), target)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the loop
    @property
    def trained_module(self) -> nn.Module:
        assert self.module is not None
        return self.module

    def autocast(self) -> AbstractContextManager[Any]:
        if self.precision is Precision.AMP_BF16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return on_device(self.device)

    def train_step(self, batches: list[Any], loss_fn: Any) -> torch.Tensor:
        """Forward and backward of a step's micro-batches through the pipeline; the sum of
        their losses (the same on every rank of the pipeline)."""
        import torch.distributed as dist

        if loss_fn is None:
            raise ValueError(
                "loss_fn=None: a pipeline's last stage computes the loss from its output "
                "and the targets; give the Session a loss_fn"
            )
        inputs = torch.cat([b[0] for b in batches]).to(self.device)
        targets = torch.cat([b[1] for b in batches]).to(self.device)
        self._loss_fn = loss_fn
        losses: list[torch.Tensor] = []
        clock = self._clock
        clock.spans.clear()
        start = clock.mark()
        with on_device(self.device), self.autocast(), self._vocabulary_parallel():
            if self.first:
                self.schedule.step(inputs)
            elif self.last:
                self.schedule.step(target=targets, losses=losses)
            else:
                self.schedule.step()
        end = clock.mark()
        self.last_wall_seconds = clock.seconds(start, end)  # the host waits for the device
        self.last_busy_seconds = clock.busy()
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.last:
            total = torch.stack([_local(loss).detach().float() for loss in losses]).sum()
        src = dist.get_global_rank(self._pp_group, self.pp - 1)
        dist.broadcast(total, src=src, group=self._pp_group)
        return total

    def _vocabulary_parallel(self) -> AbstractContextManager[Any]:
        """The last stage's split logits' cross-entropy under tensor parallelism (the
        schedule computes the loss and its backward inside `step`)."""
        if self.tp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def backward(self, loss: torch.Tensor) -> None:
        raise RuntimeError("a pipeline runs forward and backward in train_step()")

    def step(self) -> StepOutcome:
        with on_device(self.device):
            return self._step()

    def _step(self) -> StepOutcome:
        import torch.distributed as dist

        lr = float(self.optimizer.param_groups[0]["lr"])
        self._sum_tied_gradients()
        if self.dp > 1:
            for _, p in self._named:  # every rank the same calls: an unused one reduces zeros
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                local = _local(p.grad)
                dist.all_reduce(local, group=self._dp_group)
                local.div_(self.dp)
        self._grads_bytes = self._count_grads()
        norm = self._grad_norm()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self._set_lr()
        return StepOutcome(grad_norm=norm, skipped=False, scale=None, lr=lr)

    def _sum_tied_gradients(self) -> None:
        """The embedding's and the last stage's copy's gradients summed on both."""
        import torch.distributed as dist

        if not self._has_tied or not (self.first or self.last):
            return
        tied = dict(self._named)[TIED_COPY[1]] if self.first else self._tied
        assert tied is not None
        if tied.grad is None:
            tied.grad = torch.zeros_like(tied)
        dist.all_reduce(_local(tied.grad), group=self._tied_group)  # the same rows on both

    def _grad_norm(self) -> float:
        import torch.distributed as dist

        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for _, p in self._named:
            if p.grad is not None and p is not self._tied:  # the tied copy counted once
                # a whole tensor is on tp x dp ranks, a tensor-parallel shard on dp
                weight = _shards(p.grad) / (self.tp * self.dp)
                total += _local(p.grad).float().pow(2).sum() * weight
        dist.all_reduce(total)  # every stage of every pipeline
        norm = float(total.sqrt())
        if self._clip is not None:
            coef = float(self._clip) / (norm + 1e-6)
            if coef < 1.0:
                for _, p in self._named:
                    if p.grad is not None:
                        _local(p.grad).mul_(coef)
        return norm

    # ------------------------------------------------------------------ measuring
    def pipeline_report(self) -> dict[str, Any]:
        """This rank's place in the pipeline and the last step's bubble: the share of the
        schedule's wall time this stage did not compute, next to the schedule's ideal."""
        m, p = self.micro_batches, self.pp
        wall, busy = self.last_wall_seconds, self.last_busy_seconds
        return {
            "pp": p,
            "tp": self.tp,
            "dp": self.dp,
            "stage": self.stage_index,
            "tp_rank": self.rank % self.tp,
            "dp_rank": self.rank // (p * self.tp),
            "schedule": self.schedule_name.value,
            "micro_batches": m,
            "layers": sorted(int(k) for k in self.module.blocks),  # type: ignore[union-attr]
            "step_seconds": wall,
            "compute_seconds": busy,
            "bubble_measured": max(0.0, 1.0 - busy / wall) if wall > 0 else None,
            "bubble_ideal": (p - 1) / (m + p - 1),
        }

    def probe(self, loss_fn: Any, batch: Any) -> tuple[Any, ModelStateBytes]:
        """One pipeline step of `grad_accum` copies of `batch`, the peak of what this stage
        holds saved for backward measured (packed minus unpacked storage bytes); the
        model states counted while the gradients exist; the gradients then dropped."""
        from workbench.train.measure.memory import ActivationMeasure

        assert self.module is not None
        params = parameter_storages(self.module)
        live: dict[int, list[int]] = {}
        held = {"now": 0, "peak": 0}

        def pack(t: torch.Tensor) -> Any:
            inner = local_tensor(t)
            st = inner.untyped_storage()
            if st.nbytes() == 0 or is_parameter_derived(t, params):
                return (t, None)
            key = st.data_ptr()
            entry = live.setdefault(key, [0, st.nbytes()])
            if entry[0] == 0:
                held["now"] += entry[1]
                held["peak"] = max(held["peak"], held["now"])
            entry[0] += 1
            return (t, key)

        def unpack(packed: Any) -> torch.Tensor:
            t, key = packed
            if key is not None and key in live:
                entry = live[key]
                entry[0] -= 1
                if entry[0] == 0:
                    held["now"] -= entry[1]
                    del live[key]
            return t  # type: ignore[no-any-return]

        timed = self.last_wall_seconds, self.last_busy_seconds  # a training step's, kept
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            self.train_step([batch] * self.micro_batches, loss_fn)
        self.last_wall_seconds, self.last_busy_seconds = timed
        states = self.model_state_bytes()
        self.zero_grad()
        measure = ActivationMeasure(
            activation_bytes=held["peak"], parameter_saved_bytes=0, by_dtype={}
        )
        return measure, states

    # ------------------------------------------------------------------ state
    def export_state(self) -> dict[str, Any]:
        """Full fp32 weights and optimizer state by parameter name, gathered from every
        stage, on the CPU (collective: every rank calls it)."""
        import torch.distributed as dist

        mine_model: dict[str, torch.Tensor] = {}
        mine_optim: dict[str, dict[str, Any]] = {}
        for name, p in self._named:
            whole = {
                k: self._whole(name, v, p) for k, v in (self.optimizer.state.get(p) or {}).items()
            }
            weight = self._whole(name, p, p).float()  # collective over the tp group
            if p is self._tied:
                continue  # the embedding's copy: the first stage has the original
            mine_model[name] = weight
            if whole:
                mine_optim[name] = whole
        gathered: list[Any] = [None] * self.pp
        dist.all_gather_object(gathered, (mine_model, mine_optim), group=self._pp_group)
        model: dict[str, torch.Tensor] = {}
        opt_state: dict[str, dict[str, Any]] = {}
        for weights, states in gathered:
            model.update(weights)
            opt_state.update(states)
        return self._neutral_state(model, opt_state, self._family)

    def _whole(self, name: str, value: Any, param: Any) -> Any:
        """A parameter or state of `param` whole, on the CPU, in your module's row order
        (`full_tensor()` of a tensor-parallel shard: collective over the group)."""
        return whole_tensor(value, param, self._order(name))

    def _order(self, name: str) -> torch.Tensor | None:
        """The tensor-parallel plan's permutation of a parameter's rows, if any."""
        return self.plan.permutations.get(name) if self.plan is not None else None

    def _load_optimizer(self, state: dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))
        saved = self._saved_optimizer(state)
        for name, p in self._named:
            key = TIED_COPY[1] if p is self._tied else name
            if key in saved:
                self.optimizer.state[p] = split_state(saved[key], p, self._order(key), self.device)

    # ------------------------------------------------------------------ teardown
    def _release(self) -> None:
        groups, self._groups = self._groups, []
        if groups:
            import torch.distributed as dist

            for group in groups:
                with contextlib.suppress(Exception):
                    dist.destroy_process_group(group)


def _local(t: Any) -> Any:
    """A DTensor's local tensor, or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


__all__ = ["PipelineBackend"]
