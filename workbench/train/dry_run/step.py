"""The training steps of a dry run, under PyTorch's memory tracker, and what they measured.

`run_steps` runs `steps` optimizer steps of a fake module the way the Session's engines
do (`workbench.train.batches.forward_and_loss`: forward inside autocast, the loss in fp32
outside it, the output dropped before backward; the loss divided by the accumulation and,
under amp-fp16, multiplied by the loss scale; `grad_accum` micro-batches per step; the
gradient norm (clipped when `clip_grad_norm` is set); `optimizer.step()`;
`zero_grad(set_to_none=True)`). The GradScaler itself is not run (its step reads an
overflow flag back from the device, which fake tensors do not have): the gradients are
unscaled in place, as its `unscale_` does, which allocates nothing.

The tracker is `torch.distributed._tools.mem_tracker.MemTracker` (FSDP2:
`fsdp2_mem_tracker.FSDPMemTracker`), which follows every tensor storage the step creates
and files it by kind. `phase_tracker` adds one thing to it: the highest total of each part
of the step ("forward end": forward and loss; "backward": backward; "optimizer
step": the norm, the step and zero_grad), taken over the steps after the first, with the
kinds at that moment (the first step is left out: its forward and backward run before
the optimizer states exist, and under FSDP its first sharding propagations are fake
tensors the tracker counts once). `measure` reads the kinds into the dry run's
categories (`CATEGORIES`), the per-module peaks of the last micro-batch (the trackers
follow one forward and backward at a time) and the model states at rest, from the tensors
themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.estimate import PHASES
from workbench.estimate.allocator import (
    ALL_GATHER_STREAM,
    COMPUTE_STREAM,
    REDUCE_SCATTER_STREAM,
    AllocEvent,
    AllocTrace,
)
from workbench.train.batches import forward_and_loss
from workbench.train.dry_run.result import ModulePeak

#: The tracker's kinds (MemTracker's and FSDPMemTracker's names) -> the dry run's categories.
KINDS: dict[str, str] = {
    "Parameter": "parameters",
    "Sharded Param": "parameters",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Optstate": "optimizer states",
    "OptState": "optimizer states",
    "Activation": "activations",
    "Temp": "temporaries",
    "Buffer": "buffers",
    "Other": "other",
    "Inputs": "other",
    "Unsharded Param": "gathered parameters",
    "All Gather": "gathered parameters",
    "Unsharded Grad": "unsharded gradients",
    "Reduce Scatter": "unsharded gradients",
    # DeepSpeed's own buffers, told apart by `dry_run_deepspeed.DeepSpeedKinds`
    "DeepSpeed Buckets": "DeepSpeed reduce buckets",
    "DeepSpeed Flat Copy": "DeepSpeed flattened reduce copy",
    "DeepSpeed fp32 Grad": "DeepSpeed fp32 gradient partition",
    "ZeRO-3 Gathered": "ZeRO-3 gathered parameters",
    "DeepSpeed Other": "DeepSpeed other buffers",
}

#: The categories in the order they are shown ("optimizer step temporaries" is the part of
#: the tracker's optimizer kind beyond the states at rest: what the step allocates).
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer states",
    "optimizer step temporaries",
    "activations",
    "temporaries",
    "buffers",
    "other",
    "gathered parameters",
    "unsharded gradients",
    "DeepSpeed reduce buckets",
    "DeepSpeed flattened reduce copy",
    "DeepSpeed fp32 gradient partition",
    "ZeRO-3 gathered parameters",
    "DeepSpeed other buffers",
)

#: The tracker's kinds whose storages FSDP2 makes on its own streams.
_STREAMS = {
    "All Gather": ALL_GATHER_STREAM,
    "Unsharded Param": ALL_GATHER_STREAM,
    "Reduce Scatter": REDUCE_SCATTER_STREAM,
}

_PEAK_FORWARD = frozenset({"Peak-Forward", "Peak Forward"})
_PEAK_BACKWARD = frozenset({"Peak-Backward", "Peak Backward"})

Progress = Callable[[str, int, int], None]


class _NoHook:
    """A hook handle with nothing to remove (a frozen parameter's, see `phase_tracker`)."""

    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


class TraceRecorder:
    """The ordered allocations and frees the tracker sees on one device type, for
    `AllocTrace`: each storage's bytes when it is made, freed or resized (FSDP2 frees and
    refills its unsharded parameters by `resize_`: a free and an allocation), with the
    step and phase (`at`), the innermost module running and the operator. A storage's
    category is the last kind the tracker filed it under (gradients are made as backward
    temporaries and refiled by the gradient hooks); an optimizer storage freed within the
    steps is an "optimizer step temporaries" one."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.step = -1
        self.phase = "setup"
        self.op: str | None = None
        # kind, nbytes, block, step, phase, module, op
        self._rows: list[tuple[str, int, int, int, str, str | None, str | None]] = []
        self._kinds: dict[int, str] = {}  # block -> the tracker's last kind
        self._freed: set[int] = set()
        self._live: dict[int, int] = {}  # id(winfo) -> its block now
        self._next = 0
        self._sizes: dict[int, int] = {}  # block -> its bytes

    def at(self, step: int, phase: str) -> None:
        self.step, self.phase = step, phase

    def note(
        self,
        update: str,
        winfo: Any,
        old_bytes: int | None,
        module: str | None,
        tag: str | None = None,
    ) -> None:
        """One of the tracker's updates ("ADD", "DEL", "REF", "SIZE") of `winfo`; `tag`:
        the kind a new storage is filed under instead of the tracker's (`tagging`)."""
        if winfo.device.type != self.device_type:
            return
        kind = tag or str(getattr(winfo.reftype, "value", winfo.reftype))
        key = id(winfo)
        if update == "REF":
            block = self._live.get(key)
            if block is not None:
                self._kinds[block] = kind
            return
        if update in ("DEL", "SIZE"):
            block = self._live.pop(key, None)
            if block is not None:
                self._row("free", self._bytes_of(block), block, module)
                self._freed.add(block)
        if update in ("ADD", "SIZE"):
            nbytes = int(winfo.size) * int(winfo.element_size)
            if nbytes > 0:
                block = self._next
                self._next += 1
                self._live[key] = block
                self._kinds[block] = kind
                self._sizes[block] = nbytes
                self._row("alloc", nbytes, block, module)

    def _bytes_of(self, block: int) -> int:
        return self._sizes[block]

    def _row(self, kind: str, nbytes: int, block: int, module: str | None) -> None:
        self._rows.append((kind, nbytes, block, self.step, self.phase, module, self.op))

    def trace(self) -> AllocTrace:
        def category(block: int) -> str:
            kind = self._kinds.get(block, "Other")
            name = KINDS.get(kind, "other")
            if name == "optimizer states" and block in self._freed:
                return "optimizer step temporaries"
            return name

        events = tuple(
            AllocEvent(
                kind=kind,
                nbytes=nbytes,
                block=block,
                stream=_STREAMS.get(self._kinds.get(block, ""), COMPUTE_STREAM),
                step=step,
                phase=phase,
                module=module,
                category=category(block),
                op=op,
            )
            for kind, nbytes, block, step, phase, module, op in self._rows
        )
        return AllocTrace(events, self.device_type)


def phase_tracker(base: type, device_type: str) -> type:
    """`base` (MemTracker or FSDPMemTracker) that also keeps the highest total of each
    phase (`phase`, None while not measuring) with its kinds, on `device_type`."""

    class PhaseTracker(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._phase: str | None = None
            self.phase_peaks: dict[str, dict[str, int]] = {}
            #: refiles a new highest moment's kinds in place (DeepSpeed's buffers)
            self.reclassify: Callable[[dict[str, int]], None] | None = None
            #: the allocations and frees in order (`alloc_trace()`)
            self.recorder = TraceRecorder(device_type)
            self._tag: str | None = None
            #: the storages made inside a `tagging` block and still alive: id(winfo) ->
            #: (the block's kind, the tracker's record of the storage)
            self.tagged: dict[int, tuple[str, Any]] = {}

        def _update_snap(
            self,
            u_type: Any,
            winfo: Any,
            old_mem_consumed: int | None = None,
            old_reftype: Any = None,
        ) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            update = str(getattr(u_type, "name", u_type))
            module = _innermost(self._mod_tracker.parents) if update != "REF" else None
            tag = self._tag if update == "ADD" else None
            if tag is not None:
                self.tagged[id(winfo)] = (tag, winfo)
            elif update == "DEL":
                self.tagged.pop(id(winfo), None)
            self.recorder.note(update, winfo, old_mem_consumed, module, tag)

        @contextlib.contextmanager
        def tagging(self, kind: str) -> Iterator[None]:
            """File the storages the operators make inside the block under `kind` (one of
            `KINDS`): in the trace, and in `tagged` for the `reclassify` of the highest
            moments (the tracker's own snapshot keeps its kinds)."""
            outer, self._tag = self._tag, kind
            try:
                yield
            finally:
                self._tag = outer

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            self.recorder.op = str(func)
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                self.recorder.op = None

        def alloc_trace(self) -> AllocTrace:
            """The allocations and frees seen so far (`AllocTrace`)."""
            return self.recorder.trace()

        def _track_module_params_and_buffers(
            self, module: nn.Module, install_grad_hooks: bool = True
        ) -> tuple[int, int]:
            # torch's tracker hooks every parameter's gradient, and a frozen one (LoRA's
            # base) refuses a hook: it is given a handle that removes nothing instead
            if install_grad_hooks:
                for p in module.parameters():
                    if not p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                        self._param_to_grad_hook_handles[p] = (_NO_HOOK, _NO_HOOK)
            tracked: tuple[int, int] = super()._track_module_params_and_buffers(
                module, install_grad_hooks
            )
            return tracked

        def kind_of(self, storage: Any) -> tuple[str, int] | None:
            """The kind the tracker files `storage` under and its bytes (None: untracked)."""
            entry = self._WINFO.get(storage)
            if entry is None:
                return None
            winfo = entry[0]
            return str(getattr(winfo.reftype, "value", winfo.reftype)), int(winfo.mem_consumed)

        def label(self, tensors: Any, kind: str) -> None:
            """File the storages of `tensors` under the tracker's kind `kind`
            ("Parameter", "Optstate", ...), tracked from now on."""
            from torch.distributed._tools.mem_tracker import _MemRefType

            reftype = _MemRefType(kind)
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    self._update_and_maybe_create_winfos(t, reftype)

        @property
        def phase(self) -> str | None:
            return self._phase

        @phase.setter
        def phase(self, name: str | None) -> None:
            """A phase starts: what is alive now is its first moment (a phase that runs
            no operator, e.g. an optimizer step done in backward, holds just that)."""
            self._phase = name
            if name is not None:
                self._record()

        # the trackers call this after every operator: the one place a phase's peak shows
        def _update_peak_stats(self, peak_state: Any) -> None:
            super()._update_peak_stats(peak_state)
            if self._phase is not None:
                self._record()

        def _record(self) -> None:
            now: dict[str, int] = {}
            for dev, snap in self._curr_mem_snap.items():
                if dev.type != device_type:
                    continue
                for kind, value in snap.items():
                    key = getattr(kind, "value", kind)
                    now[key] = now.get(key, 0) + value
            phase = self._phase
            assert phase is not None
            best = self.phase_peaks.get(phase)
            if now and (best is None or now.get("Total", 0) > best.get("Total", 0)):
                if self.reclassify is not None:
                    self.reclassify(now)
                self.phase_peaks[phase] = now

    return PhaseTracker


def _innermost(parents: Any) -> str | None:
    """The innermost of the modules running (the memory tracker's qualified names; the
    most deeply nested one), None outside every module."""
    names = [p for p in parents if p != "Global"]
    if not names:
        return None
    return max(names, key=lambda n: (n.count("."), len(n)))


@dataclass(frozen=True)
class StepPlan:
    """How one step runs: the autocast context, the loss scale (1.0: none), the
    accumulation, the clipping threshold (None: the norm only) and how many steps."""

    autocast: Callable[[], Any]
    loss_scale: float
    grad_accum: int
    clip: float | None
    steps: int


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_bytes(tensors: Any, device_type: str) -> int:
    """Bytes of the distinct storages behind `tensors` on `device_type` (a DTensor's local
    shard; each storage once, told apart by the storage object, since fake storages have
    no address)."""
    kept: list[Any] = []
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        t = _local(t)
        if t.device.type != device_type:
            continue
        st = t.untyped_storage()
        kept.append(st)  # alive while counting, so ids are not reused
        if id(st) not in seen:
            seen.add(id(st))
            total += st.nbytes()
    return total


def run_steps(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    loss_fn: Any,
    plan: StepPlan,
    *,
    tracker: Any,
    on_phase: Callable[[str], None],
    progress: Progress | None,
    device_type: str,
    engine: Any = None,
    sums: Any = None,
) -> int:
    """Run the steps (see the module docstring); returns the gradient bytes held just
    before the last `zero_grad` (all of this rank's gradients). `on_phase(name)` is
    called as each part begins ("forward", "backward", "optimizer step"). `sums`: an
    entered `accumulation.InPlaceSums`, told of each backward's graph (a shared
    parameter's gradients summed in place where a real step sums them so).

    With a DeepSpeed `engine` (`dry_run_deepspeed`), the steps are the Session's DeepSpeed
    backend's: `engine(batch)`, `engine.backward(loss)` (DeepSpeed divides by the
    accumulation and scales fp16 losses itself), `engine.step()` after every micro-batch
    (only the boundary's steps), clipping in DeepSpeed's config; `module` is the engine and
    `optimizer` unused."""
    if engine is not None:
        backward, optimizer_step = _deepspeed_parts(engine, device_type)
    else:
        backward, optimizer_step = _torch_parts(module, optimizer, plan, device_type)
    grads_bytes = 0
    for step in range(plan.steps):
        measuring = step > 0
        for micro in range(plan.grad_accum):
            if step or micro:
                tracker.reset_mod_stats()  # the trackers follow one forward at a time
            on_phase("forward")
            _at(tracker, step, "forward")
            tracker.phase = PHASES[0] if measuring else None
            _report(progress, "forward", step, plan.steps)
            loss = forward_and_loss(module, batch, loss_fn, plan.autocast)
            on_phase("backward")
            _at(tracker, step, "backward")
            tracker.phase = PHASES[1] if measuring else None
            _report(progress, "backward", step, plan.steps)
            with sums.watch(loss) if sums is not None else contextlib.nullcontext():
                backward(loss, micro == plan.grad_accum - 1)
            del loss
        on_phase("optimizer step")
        _at(tracker, step, "optimizer step")
        tracker.phase = PHASES[2] if measuring else None
        _report(progress, "optimizer step", step, plan.steps)
        grads_bytes = optimizer_step()
        tracker.phase = None
    _report(progress, "done", plan.steps, plan.steps)
    return grads_bytes


def _at(tracker: Any, step: int, phase: str) -> None:
    recorder = getattr(tracker, "recorder", None)
    if recorder is not None:
        recorder.at(step, phase)


Backward = Callable[[torch.Tensor, bool], None]  # (loss, the accumulation's last micro-batch)
OptimizerStep = Callable[[], int]  # the step; returns the gradient bytes it found


def _torch_parts(
    module: nn.Module, optimizer: torch.optim.Optimizer, plan: StepPlan, device_type: str
) -> tuple[Backward, OptimizerStep]:
    """The plain and FSDP engines' backward and optimizer step."""
    params = [p for p in module.parameters() if p.requires_grad]
    factor = plan.loss_scale / plan.grad_accum

    def backward(loss: torch.Tensor, last: bool) -> None:
        (loss * factor).backward()  # type: ignore[no-untyped-call]

    def optimizer_step() -> int:
        grads = [p.grad for p in params if p.grad is not None]
        if plan.loss_scale != 1.0 and grads:
            # GradScaler.unscale_ in place (no allocation)
            torch._foreach_mul_([_local(g) for g in grads], 1.0 / plan.loss_scale)
        if plan.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, plan.clip)
        elif grads:
            torch.nn.utils.get_total_norm(grads)
        del grads  # zero_grad must free them
        optimizer.step()
        held = storage_bytes((p.grad for p in params), device_type)
        optimizer.zero_grad(set_to_none=True)
        return held

    return backward, optimizer_step


def _deepspeed_parts(engine: Any, device_type: str) -> tuple[Backward, OptimizerStep]:
    """DeepSpeed's engine's backward and step, as the Session's backend calls them."""
    from workbench.train.dry_run.deepspeed import gradient_tensors

    def backward(loss: torch.Tensor, last: bool) -> None:
        engine.set_gradient_accumulation_boundary(last)
        engine.backward(loss)
        if not last:
            engine.step()  # not a boundary: DeepSpeed only advances its micro counter

    def optimizer_step() -> int:
        held = storage_bytes(gradient_tensors(engine), device_type)
        engine.step()
        return held

    return backward, optimizer_step


def _report(progress: Progress | None, phase: str, step: int, total: int) -> None:
    if progress is not None:
        progress(phase, min(step + 1, total), total)


@dataclass(frozen=True)
class Measured:
    """What the steps measured on this rank: each phase's categories (`points`), the
    per-module peaks of the last step and the model states at rest."""

    points: dict[str, dict[str, int]]
    modules: tuple[ModulePeak, ...]
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    optimizer_step_counter_bytes: int
    trace: AllocTrace | None = None


def measure(
    tracker: Any,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    grads_bytes: int,
    shown: dict[int, str],
    device_type: str,
    *,
    param_tensors: list[torch.Tensor] | None = None,
    masters: list[torch.Tensor] | None = None,
) -> Measured:
    """The categories of each phase's peak, the module peaks of the modules in `shown`
    (id -> name) and the states at rest (see the module docstring). `param_tensors`: the
    parameters' storage where it is not the module's parameters (ZeRO-3's partitions);
    `masters`: fp32 master copies counted with the optimizer states (DeepSpeed's)."""
    states = [v for st in optimizer.state.values() for v in st.values()]
    optimizer_bytes = storage_bytes([*states, *(masters or [])], device_type)
    counters = storage_bytes(
        (v for v in states if isinstance(v, torch.Tensor) and v.dim() == 0), device_type
    )
    params_bytes = storage_bytes(
        module.parameters() if param_tensors is None else param_tensors, device_type
    )
    points = {
        phase: categories(tracker.phase_peaks.get(phase, {}), optimizer_bytes) for phase in PHASES
    }
    return Measured(
        points=points,
        modules=module_peaks(tracker, shown, device_type),
        params_bytes=params_bytes,
        grads_bytes=grads_bytes,
        optimizer_bytes=optimizer_bytes,
        optimizer_step_counter_bytes=counters,
        trace=tracker.alloc_trace() if hasattr(tracker, "alloc_trace") else None,
    )


def categories(kinds: dict[str, int], optimizer_bytes: int) -> dict[str, int]:
    """The tracker's kinds at one moment as the dry run's categories; the optimizer kind
    split into the states at rest (`optimizer_bytes`) and the step's temporaries."""
    out = dict.fromkeys(CATEGORIES, 0)
    for kind, value in kinds.items():
        if kind in KINDS:
            out[KINDS[kind]] += value
    held = out["optimizer states"]
    out["optimizer states"] = min(held, optimizer_bytes)
    out["optimizer step temporaries"] = held - out["optimizer states"]
    return out


def module_peaks(tracker: Any, shown: dict[int, str], device_type: str) -> tuple[ModulePeak, ...]:
    """The forward and backward peaks (the total while each module ran) of the modules in
    `shown`, in its order, from the tracker's per-module snapshots of the last step."""
    found: dict[str, ModulePeak] = {}
    for module, stats in tracker.memory_tracking.items():
        name = shown.get(id(module))
        if name is None:
            continue
        forward = backward = 0
        for state, snapshots in stats.snapshots.items():
            key = getattr(state, "value", state)
            if key in _PEAK_FORWARD or key in _PEAK_BACKWARD:
                top = max((_total(s, device_type) for s in snapshots), default=0)
                if key in _PEAK_FORWARD:
                    forward = max(forward, top)
                else:
                    backward = max(backward, top)
        found[name] = ModulePeak(name, forward, backward)
    order = list(shown.values())
    return tuple(found[n] for n in order if n in found)


def _total(snapshot: dict[Any, dict[Any, int]], device_type: str) -> int:
    return sum(s.get("Total", 0) for dev, s in snapshot.items() if dev.type == device_type)


__all__ = [
    "CATEGORIES",
    "KINDS",
    "Measured",
    "StepPlan",
    "TraceRecorder",
    "categories",
    "measure",
    "module_peaks",
    "phase_tracker",
    "run_steps",
    "storage_bytes",
]
