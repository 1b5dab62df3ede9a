"""Measured memory of a training setup, next to the estimator's prediction.

What is measured, and how:

* `params_bytes`, `grads_bytes`, `optimizer_bytes`: counted from the tensors themselves
  (`Backend.model_state_bytes()`), each distinct storage once (tied weights share one).
  Gradients are counted right after a probe backward pass, before they are dropped.
  `optimizer_bytes` includes per-tensor bookkeeping the estimator leaves out: Adam keeps
  a 4-byte fp32 `step` counter per parameter tensor. That part is reported on its own
  as `optimizer_step_counter_bytes` (every 0-dim tensor of the optimizer state), so
  `optimizer_bytes - optimizer_step_counter_bytes` is what the ZeRO-paper accounting
  predicts. Optimizer states exist only after the first optimizer step.
* `activation_bytes`: every tensor autograd saves for the backward pass of one probe
  micro-batch (forward + loss), caught with `torch.autograd.graph.saved_tensors_hooks`
  and counted once per storage. Parameters and buffers saved for backward (and their
  autocast copies: a chain of view/copy ops ending at a leaf parameter) are not
  activations; they are reported as `parameter_saved_bytes`. Of those,
  `parameter_copy_bytes` are new memory: saved tensors derived from a parameter that are
  not its own storage (autocast's 16-bit copies of the weights). The rest are the
  parameters themselves, which exist anyway (in fp32 every saved weight is). With activation
  checkpointing the inputs of checkpointed blocks are what the forward keeps, and they
  are counted (forward pre-hooks on those blocks); the recomputation during backward is
  a transient, not counted.
* `offloaded_activation_bytes` (with `activation_offload`): the saved activations the
  offload's hooks move to host memory (`workbench.train.techniques.offload`: every one the model's
  forward saves, not parameters); `activation_bytes` is then what stays on the device (the
  loss's saved tensors). On a CPU the device is the host: nothing moves and nothing is
  freed, and the figure is what a GPU would not hold (a note says so). Next to the
  prediction's host term (`predicted_offloaded_activation_bytes`).
* `cuda_max_allocated_bytes` (CUDA): `torch.cuda.max_memory_allocated()` over the probe
  step (the peak statistics are reset before it), a forward and backward without an
  optimizer step: it is shown next to `predicted_forward_backward_bytes`, and the
  prediction's whole peak of a step (`predicted.peak_bytes`, with the optimizer step's
  temporaries) on its own row. `peak_rss_bytes` (CPU): the process's
  peak resident set size (`resource.getrusage`), a whole-process high-water mark.
* `cpu_peak_bytes` (CPU, with `memory(cpu_peak=True)`): the CPU twin of the CUDA peak,
  the most tensor memory held at once during the same probe step: what exists before it
  (`held_bytes`: the model states, buffers and the batch, counted from the tensors) plus
  the peak of what its operations allocate (`workbench.train.measure.cpu_peak`). Unlike
  `total_bytes` it counts what exists at the same moment, transients included (under
  activation checkpointing the recomputed block's activations; in the backward the
  logits' gradients), and it does not add the first activations to the last gradients,
  which never coexist.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, astuple, dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from workbench.display import Display, Readable, fmt_bytes, fmt_count
from workbench.estimate.peak import OFFLOADED_TERM, PAGED_TERM
from workbench.train import batches
from workbench.train.backends.base import Backend, ModelStateBytes, storage_bytes
from workbench.train.batches import LossFn
from workbench.train.measure.cpu_peak import StoragePeak
from workbench.train.techniques.lora import parameter_bytes_by_dtype
from workbench.train.techniques.offload import (
    ActivationOffload,
    is_parameter_derived,
    local_tensor,
    parameter_storages,
)
from workbench.train.techniques.recompute import (
    checkpointable_modules,
    core_modules,
    is_checkpointing,
)


@dataclass(frozen=True)
class ActivationMeasure:
    activation_bytes: int
    parameter_saved_bytes: int
    by_dtype: dict[str, int] = field(default_factory=dict)  # activation bytes per dtype
    offloaded_bytes: int = 0  # saved activations the activation offload keeps on the host
    #: saved parameter-derived tensors with storage of their own (autocast's weight copies)
    parameter_copy_bytes: int = 0


@dataclass(frozen=True)
class MemoryReport(Readable):
    """Measured bytes of one setup (see the module docstring) and the prediction.
    `str(report)` and a notebook show measured next to predicted, in binary units."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    optimizer_step_counter_bytes: int
    activation_bytes: int
    parameter_saved_bytes: int
    activation_bytes_by_dtype: dict[str, int]
    micro_batch: int
    precision: str
    optimizer: str
    activation_checkpointing: str  # none, selective, full
    world_size: int
    n_params: int
    cuda_max_allocated_bytes: int | None
    peak_rss_bytes: int | None
    predicted: Any | None  # workbench.estimate.MemoryEstimate, None when it could not run
    notes: tuple[str, ...] = ()
    dry_run: Any | None = None  # workbench.train.dry_run.result.DryRun (Session.simulate())
    activation_offload: bool = False
    optimizer_in_backward: bool = False  # each gradient freed once its parameter stepped
    #: saved activations moved to host memory (on a CPU: what a GPU would not hold)
    offloaded_activation_bytes: int = 0
    #: `memory(snapshot=True)` on CUDA: the probe step as `torch.cuda.memory._snapshot()`
    #: recorded it (the pickle torch's memory viewer opens), and the addresses of the
    #: parameters and optimizer states in it (their categories)
    snapshot: dict[str, Any] | None = None
    snapshot_categories: dict[int, str] = field(default_factory=dict)
    snapshot_device: int = 0
    #: `memory(cpu_peak=True)` on a CPU: the probe step's peak of tensor memory
    cpu_peak_bytes: int | None = None
    #: the part of `parameter_saved_bytes` that is new memory: copies of the weights
    #: (autocast's 16-bit ones), not the parameters' own storage
    parameter_copy_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activation_bytes

    @property
    def predicted_activation_bytes(self) -> int | None:
        """The prediction comparable with `activation_bytes`: the estimator's activations
        without its recomputation working set (a backward-pass transient), and under
        `compile` without what the compiled step does not keep (`workbench.estimate.compiled`)."""
        pred = self.predicted
        if pred is None or pred.activation_bytes is None:
            return None
        extra = pred.activations.recompute_bytes if pred.activations is not None else 0
        peak = getattr(pred, "peak", None)
        adapters = peak.points["forward end"].get("LoRA adapter activations", 0) if peak else 0
        not_kept = peak.compile_not_kept_bytes if peak else 0
        return int(
            pred.activation_bytes
            - extra
            + adapters
            - not_kept
            - (self.predicted_offloaded_activation_bytes or 0)
        )

    @property
    def predicted_offloaded_activation_bytes(self) -> int | None:
        """The prediction comparable with `offloaded_activation_bytes`: the peak's host
        term of offloaded activations (0 without `activation_offload`)."""
        peak = getattr(self.predicted, "peak", None)
        if peak is None:
            return None
        return int(peak.host_terms.get(OFFLOADED_TERM, 0))

    @property
    def predicted_grads_bytes(self) -> int | None:
        """The prediction comparable with `grads_bytes`: every gradient, or under
        `optimizer_in_backward` the most the step holds at once (its largest parameter's,
        from the peak's points; the at-rest figure counts them all)."""
        pred = self.predicted
        if pred is None:
            return None
        peak = getattr(pred, "peak", None)
        if self.optimizer_in_backward and peak is not None:
            return int(peak.held_gradients_bytes)
        return int(pred.grads_bytes)

    @property
    def predicted_forward_backward_bytes(self) -> int | None:
        """The predicted peak comparable with `cuda_max_allocated_bytes` (a forward and
        backward without an optimizer step): the highest of the peak's forward end, its
        backward, and the model states with every gradient."""
        pred = self.predicted
        peak = getattr(pred, "peak", None)
        if pred is None or peak is None:
            return None
        return int(
            max(peak.phases["forward end"], peak.phases["backward"], pred.model_states_bytes)
        )

    def timeline(self) -> Any:
        """The picture of the recorded real step (`memory(snapshot=True)` on CUDA: a
        `workbench.train.dry_run.timeline.Timeline`), None without a snapshot."""
        if self.snapshot is None:
            return None
        from workbench.train.dry_run.timeline import timeline, trace_of_snapshot

        trace = trace_of_snapshot(self.snapshot, self.snapshot_device, self.snapshot_categories)
        return timeline(trace, title="the real step on CUDA (the probe's forward and backward)")

    def picture(self) -> Any:
        """The recorded real step's picture beside the dry run's (a matplotlib `Figure`;
        the real step alone without a dry run), None without a snapshot."""
        real = self.timeline()
        if real is None:
            return None
        dry = self.dry_run.timeline() if self.dry_run is not None else None
        if dry is None:
            return real.figure()
        from workbench.train.dry_run.timeline import side_by_side

        return side_by_side(real, dry)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, snapshot=None, snapshot_categories={}))
        d["snapshot"] = self.snapshot is not None
        d["predicted"] = self.predicted.to_dict() if self.predicted is not None else None
        d["dry_run"] = self.dry_run.to_dict() if self.dry_run is not None else None
        return d

    def _display(self) -> Display:
        pred = self.predicted

        def predicted(name: str) -> str:
            value = getattr(pred, name, None) if pred is not None else None
            return fmt_bytes(value) if value is not None else "n/a"

        counters = self.optimizer_step_counter_bytes
        rows = [
            ("parameters", fmt_bytes(self.params_bytes), predicted("params_bytes")),
            (
                "gradients"
                + (" (one at a time, stepped in backward)" if self.optimizer_in_backward else ""),
                fmt_bytes(self.grads_bytes),
                fmt_bytes(self.predicted_grads_bytes)
                if self.predicted_grads_bytes is not None
                else "n/a",
            ),
            (
                "optimizer states" + (" (+ step counters)" if counters else ""),
                fmt_bytes(self.optimizer_bytes - counters)
                + (f" + {fmt_bytes(counters)}" if counters else ""),
                predicted("optimizer_bytes"),
            ),
            (
                "activations (one micro-batch)"
                + (", on the device" if self.activation_offload else ""),
                fmt_bytes(self.activation_bytes),
                fmt_bytes(self.predicted_activation_bytes),
            ),
        ]
        if self.activation_offload:
            rows.append(
                (
                    OFFLOADED_TERM,
                    fmt_bytes(self.offloaded_activation_bytes),
                    fmt_bytes(self.predicted_offloaded_activation_bytes),
                )
            )
        peak = getattr(pred, "peak", None)
        if peak is not None:
            rows.append(
                (
                    f"peak of a step (predicted at the {peak.phase})",
                    "",
                    fmt_bytes(pred.peak_bytes),
                )
            )
        if self.dry_run is not None:
            rows.append(
                (
                    f"peak of a step (dry run, at the {self.dry_run.phase})",
                    fmt_bytes(self.dry_run.peak_bytes),
                    fmt_bytes(pred.peak_bytes) if peak is not None else "n/a",
                )
            )
        if self.cuda_max_allocated_bytes is not None:
            rows.append(
                (
                    "CUDA peak of forward + backward (probe)",
                    fmt_bytes(self.cuda_max_allocated_bytes),
                    fmt_bytes(self.predicted_forward_backward_bytes),
                )
            )
        if self.cpu_peak_bytes is not None:
            rows.append(
                (
                    "CPU peak of forward + backward (probe)",
                    fmt_bytes(self.cpu_peak_bytes),
                    fmt_bytes(self.predicted_forward_backward_bytes),
                )
            )
        if self.peak_rss_bytes is not None:
            rows.append(("process peak RSS", fmt_bytes(self.peak_rss_bytes), ""))
        setup = (
            f"memory: {fmt_count(self.n_params)} parameters, {self.precision}, {self.optimizer}, "
            f"micro-batch {self.micro_batch}"
            + (
                f", {self.activation_checkpointing} activation checkpointing"
                if self.activation_checkpointing not in ("none", False)
                else ""
            )
            + (", activation offload" if self.activation_offload else "")
            + (f", {self.world_size} ranks" if self.world_size > 1 else "")
        )
        return Display(setup, rows, header=("", "measured", "predicted"), notes=self.notes)


def measure_activations(
    model: nn.Module,
    forward_and_loss: Callable[[], torch.Tensor],
    *,
    offload: ActivationOffload | None = None,
) -> tuple[torch.Tensor, ActivationMeasure]:
    """Run `forward_and_loss()` with hooks that record what autograd saves; returns the
    loss (its graph alive, ready for backward) and the measure. With `offload` (whose
    hooks `forward_and_loss` runs the model's forward under) what it moved to the host is
    `offloaded_bytes`, the rest `activation_bytes`."""
    param_storages = parameter_storages(model)
    acts: dict[int, tuple[int, str]] = {}
    params: dict[int, int] = {}
    copies: dict[int, int] = {}

    def record(t: torch.Tensor) -> None:
        st = local_tensor(t).untyped_storage()  # a DTensor's: its local tensor's
        if st.nbytes() == 0 or t.device.type == "meta":
            return
        if is_parameter_derived(t, param_storages):
            params[st.data_ptr()] = st.nbytes()
            if st.data_ptr() not in param_storages:
                copies[st.data_ptr()] = st.nbytes()
        else:
            acts[st.data_ptr()] = (st.nbytes(), str(t.dtype).replace("torch.", ""))

    def pack(t: torch.Tensor) -> torch.Tensor:
        record(t)
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def pre_hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        for a in args:
            if isinstance(a, torch.Tensor):
                record(a)

    handles = [
        m.register_forward_pre_hook(pre_hook)
        for m in checkpointable_modules(model)
        if is_checkpointing(m)
    ]
    # selective recomputation: the attention core's checkpoint keeps its inputs (q, k, v)
    cores = core_modules(model)
    own = [m for m in cores if "core_inputs_observer" not in vars(m)]  # a transformers layer
    for m in cores:
        m.core_inputs_observer = record
    if offload is not None:
        offload.observer = record  # its hooks are innermost in the model's forward
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = forward_and_loss()
    finally:
        for h in handles:
            h.remove()
        for m in cores:
            m.core_inputs_observer = None
        for m in own:  # your module without the attribute it did not have
            del m.core_inputs_observer
        if offload is not None:
            offload.observer = None
    moved = offload.moved_keys if offload is not None else set()
    by_dtype: dict[str, int] = {}
    for ptr, (nbytes, dtype) in acts.items():
        if ptr not in moved:
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    measure = ActivationMeasure(
        activation_bytes=sum(by_dtype.values()),
        parameter_saved_bytes=sum(params.values()),
        by_dtype=by_dtype,
        offloaded_bytes=offload.total_moved_bytes if offload is not None else 0,
        parameter_copy_bytes=sum(copies.values()),
    )
    return loss, measure


def step_counter_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    if optimizer is None:
        return 0
    return storage_bytes(
        v
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() == 0
    )


def probe(
    backend: Backend,
    loss_fn: LossFn | None,
    batch: Any,
    *,
    model: nn.Module,
    offload: ActivationOffload | None = None,
) -> tuple[ActivationMeasure, ModelStateBytes]:
    """One forward+backward on a micro-batch: activations measured in the forward,
    model states counted while the gradients exist; the gradients are then dropped.
    `model` is the module inside `backend.module` (the same object for PlainBackend);
    with `offload` the forward runs under its hooks, as the step runs it."""
    own = backend.probe(loss_fn, batch)  # a pipeline measures a whole step of its stage
    if own is not None:
        return own
    module = backend.module
    context = backend.autocast if offload is None else offload.around(backend.autocast, model)

    loss_context = backend.loss_context  # the tensor-parallel loss

    def forward_and_loss() -> torch.Tensor:
        return batches.forward_and_loss(module, batch, loss_fn, context, loss_context)

    loss, measure = measure_activations(model, forward_and_loss, offload=offload)
    backend.backward(loss)
    del loss
    states = backend.model_state_bytes()
    backend.zero_grad()
    return measure, states


def held_bytes(backend: Backend, model: nn.Module, batch: Any = None) -> int:
    """What a step starts from, counted from the tensors: the model states now held
    (`Backend.model_state_bytes()`), `model`'s buffers and `batch`'s tensors. Added to a
    `StoragePeak` (which sees only what a block allocates) it gives the absolute peak,
    as `torch.cuda.max_memory_allocated()` does on CUDA."""
    states = sum(astuple(backend.model_state_bytes()))
    return states + storage_bytes(model.buffers()) + storage_bytes(tree_leaves(batch))


def peak_rss_bytes() -> int | None:
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):  # pragma: no cover - non-POSIX
        return None


#: What the prediction's attention kernel (`MemoryEstimate.attention`, which
#: `workbench.prediction.sdpa_kernel` picks for the device) counted, where it is not the
#: kernel a GPU runs.
_KERNEL_NOTES = {
    "math": "sdpa with dropout on a CPU: PyTorch runs its math kernel, which keeps the "
    "attention weights, their dropout mask and the dropped weights in fp32, and the "
    "prediction counts that kernel (attention 'math'); a GPU's fused kernels keep a random "
    "seed and a log-sum-exp instead",
}


def paged_state_note(optimizer: Any, device: torch.device) -> str | None:
    """What CUDA's peak misses under a paged optimizer (bitsandbytes' `PagedAdamW8bit`):
    its large states live in CUDA managed memory (`cudaMallocManaged`, CPU-typed tensors
    flagged `is_paged`), which the caching allocator never sees, so
    `torch.cuda.max_memory_allocated()` leaves them out; `optimizer_bytes` counts them from
    the tensors. None when no state is paged or the device is not CUDA."""
    if device.type != "cuda" or not getattr(optimizer, "is_paged", False):
        return None
    paged = [
        v
        for st in getattr(optimizer, "state", {}).values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and getattr(v, "is_paged", False)
    ]
    if not paged:
        return None
    return (
        f"{fmt_bytes(storage_bytes(paged))} of optimizer states in {len(paged)} paged "
        "tensors live in CUDA managed memory: counted in the optimizer row, not in the CUDA "
        "peak (max_memory_allocated does not see managed memory)"
    )


def measure(
    runtime: Any,
    *,
    predict: Callable[[], Any],
    no_activation_note: str,
    snapshot: bool = False,
    cpu_peak: bool = False,
) -> MemoryReport:
    """A `MemoryReport` of `runtime`'s settings (a `workbench.train.runtime.Runtime`) on one
    probe micro-batch, next to `predict()` (the Session's prediction). The caller holds the
    step boundary and keeps the RNG untouched. `snapshot` (CUDA only: a ValueError
    elsewhere): record the probe with `torch.cuda.memory._record_memory_history` and keep
    its `torch.cuda.memory._snapshot()` (`MemoryReport.snapshot`, `.picture()`).
    `cpu_peak` (on a CPU; ignored on CUDA, whose peak is always measured): measure the
    probe's peak of tensor memory (`MemoryReport.cpu_peak_bytes`)."""
    from workbench.modelstats import count_parameters

    cfg = runtime.config
    device = runtime.device
    backend = runtime.backend
    batch = runtime.data.peek()
    if snapshot and device.type != "cuda":
        raise ValueError(snapshot_refusal(device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    allocator: StoragePeak | None = None
    held_before = 0
    if cpu_peak and device.type == "cpu":
        allocator = StoragePeak()
        held_before = held_bytes(backend, runtime.trained_module, batch)
    try:
        with allocator if allocator is not None else nullcontext():
            activations, states = probe(
                backend,
                runtime.loss_fn,
                batch,
                model=runtime.trained_module,
                offload=runtime.offload,
            )
        recorded = torch.cuda.memory._snapshot() if snapshot else None
    finally:
        if snapshot:
            torch.cuda.memory._record_memory_history(enabled=None)
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    counters = step_counter_bytes(backend.optimizer)
    notes: list[str] = []
    if states.optimizer_bytes == 0 and cfg.optimizer != "sgd-nomomentum":
        notes.append("optimizer states are created at the first optimizer step; run one")
    predicted = None
    try:
        predicted = predict()
    except Exception as exc:  # the estimator rejects the inputs or is missing
        notes.append(f"no prediction: {type(exc).__name__}: {exc}")
    if predicted is not None and predicted.activation_bytes is None:
        notes.append(no_activation_note)
    kernel = getattr(predicted, "attention", None)
    if predicted is not None and predicted.activation_bytes is not None and kernel is not None:
        notes.extend(n for k, n in _KERNEL_NOTES.items() if k == kernel)
    lora = getattr(runtime, "lora", None)
    if lora is not None:
        adapters, base = lora.adapter_parameters(), lora.base_parameters()
        notes.append(
            f"LoRA rank {lora.rank} on {len(lora.targets)} layers: {fmt_count(adapters)} "
            f"adapter parameters train ({adapters / max(1, adapters + base):.2%} of "
            f"{fmt_count(adapters + base)}); the base is frozen"
            + (
                f", {len(lora.originals)} linear layers of it in 4-bit NF4"
                if lora.originals
                else ""
            )
        )
        by_dtype = parameter_bytes_by_dtype(runtime.trained_module)
        notes.append(
            "parameters by dtype: "
            + ", ".join(f"{dtype} {fmt_bytes(n)}" for dtype, n in by_dtype.items())
        )
    paged = paged_state_note(backend.optimizer, device)
    if paged is not None:
        notes.append(paged)
    predicted_peak = getattr(predicted, "peak", None)
    beside = predicted_peak.host_terms.get(PAGED_TERM) if predicted_peak is not None else None
    if beside:
        notes.append(
            f"the predicted peak leaves out the {fmt_bytes(beside)} of {PAGED_TERM}: on a "
            "GPU bitsandbytes allocates them with cudaMallocManaged, outside the allocator, "
            "and the driver pages them to host memory when the GPU is full (slower steps, "
            "not out of memory)"
            + ("; on a CPU they are host tensors" if device.type != "cuda" else "")
        )
    if runtime.offload is not None and device.type == "cpu":
        notes.append(
            "activation offload on a CPU: the device is the host, so nothing moves and "
            "nothing is freed here; the offloaded row is what a GPU would not hold"
        )
    return MemoryReport(
        params_bytes=states.params_bytes,
        grads_bytes=states.grads_bytes,
        optimizer_bytes=states.optimizer_bytes,
        optimizer_step_counter_bytes=counters,
        activation_bytes=activations.activation_bytes,
        parameter_saved_bytes=activations.parameter_saved_bytes,
        parameter_copy_bytes=activations.parameter_copy_bytes,
        activation_bytes_by_dtype=activations.by_dtype,
        micro_batch=int(cfg.micro_batch),
        precision=str(cfg.precision),
        optimizer=str(cfg.optimizer),
        activation_checkpointing=str(cfg.activation_checkpointing),
        world_size=runtime.world_size,
        n_params=count_parameters(runtime.trained_module),  # ZeRO-3 shards at full size
        cuda_max_allocated_bytes=cuda_peak,
        peak_rss_bytes=peak_rss_bytes() if device.type == "cpu" else None,
        predicted=predicted,
        notes=tuple(notes),
        activation_offload=runtime.offload is not None,
        optimizer_in_backward=bool(cfg.optimizer_in_backward),
        offloaded_activation_bytes=activations.offloaded_bytes,
        snapshot=recorded,
        snapshot_categories=_state_addresses(runtime.trained_module, backend.optimizer)
        if snapshot
        else {},
        snapshot_device=(device.index or 0) if device.type == "cuda" else 0,
        cpu_peak_bytes=held_before + allocator.peak_bytes if allocator is not None else None,
    )


def snapshot_refusal(device: Any) -> str:
    """Why `memory(snapshot=True)` cannot record on `device` (anything but CUDA)."""
    from workbench.inputs import shown

    return (
        f"snapshot=True: recording the real step needs CUDA "
        f"(torch.cuda.memory._record_memory_history); this session runs on "
        f"{shown(str(device))}. The dry run's picture needs no GPU: "
        f"session.simulate().timeline()"
    )


def _state_addresses(model: nn.Module, optimizer: Any) -> dict[int, str]:
    """The addresses of the parameters and optimizer states now held (their categories
    in a recorded snapshot)."""
    out: dict[int, str] = {}
    for p in model.parameters():
        out[p.data_ptr()] = "parameters"
    for state in getattr(optimizer, "state", {}).values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out[v.data_ptr()] = "optimizer states"
    return out
