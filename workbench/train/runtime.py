"""What a TrainConfig is built into around your module: the data stream and the backend.

A `Runtime` owns the pieces one setting of a Session runs on: the `DataStream` over your
data, the backend (a torch optimizer and precision policy, or a DeepSpeed engine) around
your module, and the device bookkeeping of a step (synchronizing, memory readings).
`rebuild()` applies a settings change by building what the change needs and swapping it in
only when everything built, carrying weights and optimizer state; on any failure nothing
is swapped.

Your module's weights: the plain backend trains your module itself (under pure bf16,
"bf16-true", a private bf16 copy of it); a DeepSpeed or FSDP engine trains its own copy
(16-bit, flattened, partitioned under ZeRO-3; sharded under FSDP). The runtime copies the
trained weights back into your module, in your module's own dtypes, at every engine switch
(`rebuild`) and at `close()`, and on request (`sync_weights`). While an engine trains its
copy on a GPU, your module is kept in host memory, so the GPU does not hold a second fp32
copy of the model.

Random numbers: each Session draws from its own stream (`RngStream`, the runtime's `rng`):
torch's CPU generator state and, on a GPU, its device's, which dropout draws from. The
stream is put into torch's global generators only around what draws for the session (a
step, a rebuild, a checkpoint's RNG states), under one process-wide lock, and taken back
after, leaving the global generators as they were: two Sessions in one process train what
each trains alone, and the notebook's own draws neither move a session's stream nor are
moved by it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.rng import GLOBAL_RNG_LOCK
from workbench.train import batches
from workbench.train.backends import Backend, ModelStateBytes, build_backend
from workbench.train.changes import (
    BACKEND_FIELDS,
    DATA_FIELDS,
    engine_copies_model,
    needs_deepspeed,
)
from workbench.train.data import DataPosition, DataStream
from workbench.train.measure.step_clock import step_clock
from workbench.train.schedule import scaled_lr
from workbench.train.techniques.attention import set_attention
from workbench.train.techniques.lora import LoraAdapters, is_adapter_parameter, lora_rebuild
from workbench.train.techniques.offload import ActivationOffload
from workbench.train.techniques.recompute import set_activation_checkpointing

log = logging.getLogger("workbench")

#: (kind, message, severity, details) -> None: how the runtime tells its Session
EventSink = Callable[..., Any]
MemoryReading = tuple[int | None, int | None, int | None, int | None]


class Runtime:
    """The data stream and backend of one setting (see the module docstring)."""

    def __init__(
        self,
        config: TrainConfig,
        model: nn.Module,
        data: Any,
        loss_fn: batches.LossFn | None,
        *,
        device: torch.device,
        world_size: int,
        rank: int,
        reference_batch: int,
        on_event: EventSink,
        state: dict[str, Any] | None = None,
        position: DataPosition | None = None,
        buffers: dict[str, torch.Tensor] | None = None,
        claim: Callable[[], None] | None = None,
    ) -> None:
        """`claim()` is called once the data's first batch is checked, before anything of
        `model` changes (the Session closes the old Session training it there)."""
        self.config = config
        self.model = model  # your module
        self.source = data
        self.user_loader = isinstance(data, torch.utils.data.DataLoader)
        self.loss_fn = loss_fn
        self.device = device
        self.world_size, self.rank = world_size, rank
        self.reference_batch = reference_batch
        self._on_event = on_event
        self.fresh = True  # the next step is the first on this backend (a warm-up step)
        self.state_bytes: ModelStateBytes | None = None  # measured at the first step
        self.read_memory = memory_reader(device)
        # times a step without a host-device sync of its own (workbench.train.measure.step_clock)
        self.clock = step_clock(device)
        self.data = DataStream(
            data,
            micro_batch=int(config.micro_batch),
            num_workers=int(config.num_workers),
            pin_memory=bool(config.pin_memory),
            seed=int(config.seed),
            device=device,
            # the ranks of a tensor-parallel group or a pipeline read the same samples
            rank=rank // (int(config.tp) * int(config.pp)),
            world_size=config.data_parallel(world_size),
            position=position,
        )
        self.lora: LoraAdapters | None = None
        try:
            # what the build draws (a loader's order, LoRA's seeded A, an engine's set-up)
            # never lands in another session's stream while that one steps in its thread
            with GLOBAL_RNG_LOCK:
                batches.check_batch(self.data.peek(), loss_fn)  # a wrong data shape fails here
            if claim is not None:
                claim()  # outside the RNG lock: the old session's last step takes it
            # A DeepSpeed engine trains its own copy on the device: keep yours in host
            # memory then, so the GPU never holds a second fp32 copy (see park_model).
            model.to("cpu" if engine_copies_model(config, world_size) else device)
            model.train()
            if buffers:
                load_buffers(model, buffers)
            set_activation_checkpointing(model, str(config.activation_checkpointing))
            set_attention(model, config.attention)
            self.offload = _offload_for(config, device)
            with GLOBAL_RNG_LOCK:
                self.lora = LoraAdapters.attach(model, config, device)
                if state is not None:
                    _resume_weights(model, state.get("model") or {})
                self.backend: Backend = self._build_backend(config, state)
        except BaseException:
            self.data.close()
            if self.lora is not None:
                self.lora.merge()  # your module as it came
            raise
        self.park_model()
        #: the session's random numbers (dropout's): seeded here, a resumed session puts
        #: its checkpoint's stream in its place
        self.rng = RngStream.seeded(int(config.seed), device)

    def begin_step(self) -> None:
        """Open a step's memory window: on CUDA the peak statistic is reset, so the peak
        `read_memory()` reports after the step is that step's own (not an earlier step's,
        an out-of-memory probe's or another session's on the same device)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    # ------------------------------------------------------------------ the engine
    @property
    def forward_context(self) -> Callable[[], AbstractContextManager[Any]]:
        """The context factory the forward runs in: the backend's autocast, under the
        activation offload's saved-tensor hooks when `activation_offload` is set."""
        if self.offload is None:
            return self.backend.autocast
        return self.offload.around(self.backend.autocast, self.trained_module)

    @property
    def trained_module(self) -> nn.Module:
        """The module the backend trains: your module, or a DeepSpeed engine's copy."""
        return inner_module(self.backend, self.model)

    def backend_config(self, config: TrainConfig) -> TrainConfig:
        """`config` with the learning rate after `lr_scaling` (what the backend uses)."""
        lr = scaled_lr(config, self.reference_batch, self.world_size)
        return config if lr == config.lr else config.replace(lr=lr)

    def rebuild(self, target: TrainConfig, changed: set[str], *, release_first: bool) -> None:
        """Build what `changed` needs for `target`, then swap; on any failure nothing is
        swapped and the exception propagates. `release_first` (out-of-memory recovery): a
        DeepSpeed engine is released before its successor is built, since both would not
        fit on the device at once. What the build draws comes from the session's stream."""
        with self.rng.installed():
            self._rebuild(target, changed, release_first=release_first)

    def _rebuild(self, target: TrainConfig, changed: set[str], *, release_first: bool) -> None:
        old = self.config
        new_data: DataStream | None = None
        new_backend: Backend | None = None
        try:
            if changed & DATA_FIELDS and not self.user_loader:
                new_data = self.data.rebuilt(
                    micro_batch=int(target.micro_batch),
                    num_workers=int(target.num_workers),
                    pin_memory=bool(target.pin_memory),
                    seed=int(target.seed),
                )
            if lora_rebuild(changed, target):  # (QLoRA's 4-bit base follows `fsdp`)
                new_backend = self._next_adapters(target)
            elif changed & BACKEND_FIELDS:
                new_backend = self._next_backend(target, release_first=release_first)
            if "activation_checkpointing" in changed:
                self._set_checkpointing(str(target.activation_checkpointing), new_backend)
            if "attention" in changed or new_backend is not None:
                self._set_attention(target.attention, new_backend)
        except BaseException:
            if new_data is not None:
                new_data.close()
            if new_backend is not None:
                new_backend.close()
            self._set_checkpointing(str(old.activation_checkpointing), None)
            self._set_attention(old.attention, None)
            raise
        if new_data is not None:
            self.data, old_data = new_data, self.data
            old_data.close()
        if "activation_offload" in changed:
            self.offload = _offload_for(target, self.device)
        if new_backend is not None:
            self.backend, old_backend = new_backend, self.backend
            old_backend.close()  # idempotent: released already under release_first
            self.state_bytes = None
            self.fresh = True
            self.clock.reset()
            self.park_model()
        self.config = target

    def _next_backend(self, target: TrainConfig, *, release_first: bool) -> Backend:
        """A backend for `target` carrying the current one's weights and optimizer state."""
        state = self.backend.export_state()
        # An engine trains a copy: bring its weights home first, so the new engine starts
        # from (and a failed build leaves) your module up to date.
        self._write_back(state, self.backend)
        self._say_optimizer_state(target, state)
        if not (release_first and self.trained_module is not self.model):
            return self._build_backend(target, state)
        state = _state_to_cpu(state)
        self.backend.close()
        _release_device_memory(self.device)
        try:
            return self._build_backend(target, state)
        except BaseException:
            # the previous settings again, from the same state, so the session stays usable
            self.backend = self._build_backend(self.config, state)
            self.fresh = True
            self.clock.reset()
            raise

    def _say_optimizer_state(self, target: TrainConfig, state: dict[str, Any]) -> None:
        """An optimizer switch says what its state becomes: carried when both keep the
        same layout (Adam's two moments, across adamw, adam and the 8-bit ones: dequantized
        and quantized again), else reset, naming what is dropped."""
        from workbench.config import OptimizerName
        from workbench.train.backends.optimizer import OPTIMIZER_FAMILY, STATE_KEYS

        old, new = OptimizerName(self.config.optimizer), OptimizerName(target.optimizer)
        if old is new:
            return
        was, now = OPTIMIZER_FAMILY.get(old), OPTIMIZER_FAMILY.get(new)
        held = (state.get("optimizer") or {}).get("state") or {}
        keys = ", ".join(STATE_KEYS.get(was, ()))
        if was is not None and was == now:
            how = " (quantized to 8 bits)" if new.is_8bit and not old.is_8bit else ""
            how = " (dequantized from 8 bits)" if old.is_8bit and not new.is_8bit else how
            message = f"optimizer {old.value} -> {new.value}: its state ({keys}) carried{how}"
        elif held and keys and now is None:
            message = (
                f"optimizer {old.value} -> {new.value}: its state ({keys}) is dropped "
                f"({new.value} keeps none)"
            )
        elif held and keys:
            message = (
                f"optimizer {old.value} -> {new.value}: its state ({keys}) is reset, the "
                f"{new.value} state starts at zero (another layout)"
            )
        else:
            message = f"optimizer {old.value} -> {new.value}: no state to carry"
        self._on_event("optimizer", message, "info", optimizer=new.value)

    def _next_adapters(self, target: TrainConfig) -> Backend:
        """LoRA switched, or its settings changed: the adapters trained so far merged into
        your module's weights, `target`'s fresh adapters put on (the outputs do not change:
        B starts at zero), and a backend for them. The optimizer state of parameters that
        train on both sides is carried; the adapters' and the base's start fresh. On a
        failure the previous settings' adapters are put on again (fresh, over the merged
        weights) with a backend for them, and the exception propagates."""
        state = self.backend.export_state()
        self._write_back(state, self.backend)
        if self.lora is not None:
            self.lora.merge()
        self.lora = None
        try:
            self.lora = LoraAdapters.attach(self.model, target, self.device)
            return self._build_backend(target, _weights_now(state, self.model))
        except BaseException:
            if self.lora is not None:
                self.lora.merge()
            self.lora = LoraAdapters.attach(self.model, self.config, self.device)
            old = self.backend
            self.backend = self._build_backend(self.config, _weights_now(state, self.model))
            old.close()
            self.fresh = True
            raise

    def save_adapters(self, path: Any) -> Any:
        """The LoRA adapters alone, in peft's format, in directory `path`."""
        if self.lora is None:
            raise ValueError("save_adapters: this session trains no LoRA adapters (lora_rank=0)")
        self.sync_weights()
        return self.lora.save(path)

    def _build_backend(self, config: TrainConfig, state: dict[str, Any] | None) -> Backend:
        if needs_deepspeed(config, self.world_size):
            self._announce_op_builds(config)
        if not engine_copies_model(config, self.world_size):
            self.model.to(self.device)  # the plain loop trains your module itself
        backend = build_backend(
            self.backend_config(config),
            self.model,
            state=state,
            world_size=self.world_size,
            device=self.device,
        )
        from workbench.train.backends.optimizer import optimizer_note

        note = optimizer_note(backend.optimizer, self.device)
        if note is not None and note != getattr(self, "_optimizer_note", None):
            # which 8-bit implementation, and where its states live: said when it changes
            self._on_event("optimizer", note, "info", optimizer=str(config.optimizer))
        self._optimizer_note = note
        return backend

    def _set_checkpointing(self, mode: str, new_backend: Backend | None) -> None:
        """On your module and on the module an engine trains (DeepSpeed's copy)."""
        set_activation_checkpointing(self.model, mode)
        for backend in (getattr(self, "backend", None), new_backend):
            if backend is not None and inner_module(backend, self.model) is not self.model:
                set_activation_checkpointing(inner_module(backend, self.model), mode)

    def _set_attention(self, kernel: Any, new_backend: Backend | None) -> None:
        """On your module and on the module the engine trains (its copy): the new
        backend's when one was built (the old one may be released already), else the
        current one's."""
        set_attention(self.model, kernel)
        backend = new_backend if new_backend is not None else getattr(self, "backend", None)
        if backend is not None and inner_module(backend, self.model) is not self.model:
            set_attention(inner_module(backend, self.model), kernel)

    def _announce_op_builds(self, config: TrainConfig) -> None:
        """DeepSpeed compiles some ops the first time they are used on a machine (a
        minute or two); say so before the wait, as an event and on the console."""
        from workbench.train.launch.toolchain import pending_op_builds, use_interpreter_tools

        use_interpreter_tools()
        pending = pending_op_builds(config)
        if pending:
            message = (
                f"DeepSpeed builds its {', '.join(pending)} op(s) on first use on this machine: "
                "expect 1-3 minutes once; later engines load the cached build "
                "(~/.cache/torch_extensions)"
            )
            self._on_event("op-build", message, "info", ops=pending)
            log.warning("workbench: %s", message)

    # ------------------------------------------------------------------ your module's weights
    def sync_weights(self) -> None:
        """Bring the current engine's trained weights and buffers into your module."""
        if self.trained_module is not self.model:
            self._write_back(self.backend.export_state(), self.backend)

    def _write_back(self, state: dict[str, Any], backend: Backend) -> None:
        """Copy an engine's trained weights (`state["model"]`, fp32 by parameter name) and
        its buffers into your module, in your module's own dtypes and devices. A no-op
        when the backend trains your module itself."""
        inner = inner_module(backend, self.model)
        if inner is self.model:
            return
        load_weights(self.model, state["model"])
        load_buffers(self.model, persistent_buffers(inner))

    def park_model(self) -> None:
        """While a DeepSpeed engine trains its own copy, keep your module in host memory
        so the GPU does not hold a second fp32 copy of the model."""
        if self.device.type == "cuda" and self.trained_module is not self.model:
            self.model.to("cpu")

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Bring the trained weights home (to your module, on the session's device), then
        release the loader workers and the backend. Raises what the weight copy raised,
        after releasing everything. Your module's forward is put back as it was given
        (no recomputation: no checkpoint around its blocks, its attention function its
        own)."""
        try:
            self.sync_weights()
            if self.lora is not None:
                self.lora.merge()  # your module's own layers, the adapters' update in them
            self.model.to(self.device)
            set_activation_checkpointing(self.model, "none")
        finally:
            self.data.close()
            self.backend.close()


def _offload_for(config: TrainConfig, device: torch.device) -> ActivationOffload | None:
    return ActivationOffload(device) if config.activation_offload else None


def _weights_now(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """`state` with the weights your module holds now, by their current names (after
    LoRA layers went on or came off) and without the adapters' optimizer state: the new
    adapters start fresh, and they carry the old ones' names (in another shape when the
    rank changed). The optimizer state of names that no longer exist or no longer train
    is left for the backend to skip."""
    optimizer = state.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict):
        kept = {n: v for n, v in optimizer["state"].items() if not is_adapter_parameter(n)}
        optimizer = {**optimizer, "state": kept}
    weights = {n: p.detach() for n, p in model.named_parameters()}
    return {**state, "model": weights, "optimizer": optimizer}


def inner_module(backend: Backend, model: nn.Module) -> nn.Module:
    """The module the backend trains: `model` itself, or an engine's copy of it."""
    return backend.trained_module


def persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """The module's buffers that its state_dict keeps (running statistics and the like)."""
    names = {name for name, _ in model.named_buffers()}
    return {k: v.detach() for k, v in model.state_dict().items() if k in names}


def load_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy `weights` (by name) into the module's parameters, in their dtypes and devices;
    names the module lacks are skipped, and so are the module's own tensors (an engine's
    state holds your module's frozen weights themselves). A shape that differs is a
    ValueError naming the parameter, raised before anything is copied."""
    pairs = [(n, p, weights[n]) for n, p in model.named_parameters() if n in weights]
    for name, p, w in pairs:
        if tuple(w.shape) != tuple(p.shape):
            raise ValueError(
                f"state: parameter {name} has shape {tuple(w.shape)}, the model has "
                f"{tuple(p.shape)}"
            )
    with torch.no_grad():
        for _, p, w in pairs:
            if not _same_storage(w, p):
                p.copy_(w.to(device=p.device, dtype=p.dtype))


def _resume_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """A resumed state's weights into your module before a backend is built: a frozen
    base is exported from your module when a copy of it trains (an engine, pure bf16).
    A state that lacks a weight your module trains is left to the backend, which names
    what is missing, with your module untouched."""
    if all(n in weights for n, p in model.named_parameters() if p.requires_grad):
        load_weights(model, weights)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.data_ptr() == b.data_ptr() and a.dtype == b.dtype


def load_buffers(model: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    """Copy `buffers` (by name) into the module's own, in their dtypes and devices."""
    own = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in buffers.items():
            if name in own:
                own[name].copy_(value.to(device=own[name].device, dtype=own[name].dtype))


def memory_reader(device: torch.device) -> Callable[[], MemoryReading]:
    """(CUDA allocated, CUDA peak allocated, CUDA reserved, host RSS) bytes, None where
    not measured on this device. The peak is since `Runtime.begin_step()`: the step's."""
    if device.type == "cuda":
        from torch.cuda import memory as cuda_memory

        def cuda() -> MemoryReading:
            # one build of the allocator's statistics a step (memory_allocated,
            # max_memory_allocated and memory_reserved each build and flatten all of them)
            stats = cuda_memory.memory_stats_as_nested_dict(device)
            if not stats:  # CUDA not initialized yet: nothing allocated
                return 0, 0, 0, None
            allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
            return int(allocated["current"]), int(allocated["peak"]), int(reserved["current"]), None

        return cuda
    rss = _rss_reader()

    def cpu() -> MemoryReading:
        return None, None, None, rss()

    return cpu


def _rss_reader() -> Callable[[], int]:
    """This process's resident set size in bytes, read every step: on Linux from
    /proc/self/statm through a descriptor kept open (3 us; psutil opens the file each time,
    20-50 us), elsewhere from psutil."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        fd = -1
    if fd >= 0:
        page = os.sysconf("SC_PAGE_SIZE")
        reader = _StatmReader(fd, page)
        weakref.finalize(reader, os.close, fd)
        return reader
    import psutil

    proc = psutil.Process()
    return lambda: int(proc.memory_info().rss)


class _StatmReader:
    """The resident pages of /proc/self/statm (its second field) times the page size."""

    def __init__(self, fd: int, page_bytes: int) -> None:
        self.fd, self.page_bytes = fd, page_bytes

    def __call__(self) -> int:
        return int(os.pread(self.fd, 256, 0).split()[1]) * self.page_bytes


def _state_to_cpu(state: Any) -> Any:
    """A backend state with every tensor copied to host memory."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _state_to_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_state_to_cpu(v) for v in state)
    return state


def _release_device_memory(device: torch.device) -> None:
    """Free what a closed engine left in the CUDA caching allocator."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- random numbers
# torch's global generators hold one Session's stream at a time: a stream is put into them
# only while `workbench.rng.GLOBAL_RNG_LOCK` is held, and so is anything else that moves
# them for a while (`torch.random.fork_rng` around a probe, a build that seeds them).
TorchRngStates = tuple[torch.Tensor, torch.Tensor | None]


class RngStream:
    """A Session's own random numbers (see the module docstring): the states of torch's CPU
    generator and, on a GPU, of its device's generator, kept apart from the global
    generators. `installed()` puts them into the global generators for a block, under
    `GLOBAL_RNG_LOCK`, and takes the advanced states back after, the global generators then
    as they were (the idea of `torch.random.fork_rng`). Reading and writing the states costs
    about 3 us a step (torch's CPU state is a 5 KB tensor). NumPy's and Python's generators
    stay process-wide: a session's steps draw nothing from them (a checkpoint saves them and
    a resume sets them, for your own code)."""

    def __init__(self, device: torch.device, states: TorchRngStates) -> None:
        self._cuda = _cuda_device(device)
        self._cpu_state, self._cuda_state = states
        self._installed = False

    @classmethod
    def seeded(cls, seed: int, device: torch.device) -> RngStream:
        """The stream `torch.manual_seed(seed)` starts (on `device`'s generator too)."""

        def seed_generators() -> None:
            torch.default_generator.manual_seed(seed)
            cuda = _cuda_device(device)
            if cuda is not None:
                torch.cuda.default_generators[cuda.index].manual_seed(seed)

        return cls.made_by(seed_generators, device)

    @classmethod
    def made_by(cls, start: Callable[[], Any], device: torch.device) -> RngStream:
        """The stream `start()` leaves in torch's global generators (a seeding, a
        checkpoint's states set), taken without leaving them changed: torch's states are put
        back after (NumPy's and Python's stay as `start` set them)."""
        if _cuda_device(device) is not None:
            torch.cuda.init()  # the device's generator exists from here
        with GLOBAL_RNG_LOCK:
            cpu = torch.get_rng_state()
            live = torch.cuda.is_available() and torch.cuda.is_initialized()
            cuda = torch.cuda.get_rng_state_all() if live else None
            try:
                start()
                stream = cls(device, (torch.get_rng_state(), None))
                stream._cuda_state = stream._read()[1]
            finally:
                torch.set_rng_state(cpu)
                if cuda is not None:
                    torch.cuda.set_rng_state_all(cuda)
        return stream

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """This stream in torch's global generators for the block (once: a block inside
        one of this stream's own, such as a rebuild in a step, draws on from it)."""
        with GLOBAL_RNG_LOCK:
            if self._installed:
                yield
                return
            outside = self._read()
            self._write((self._cpu_state, self._cuda_state))
            self._installed = True
            try:
                yield
            finally:
                self._installed = False
                self._cpu_state, self._cuda_state = self._read()
                self._write(outside)

    def _read(self) -> TorchRngStates:
        cuda = torch.cuda.get_rng_state(self._cuda) if self._cuda is not None else None
        return torch.get_rng_state(), cuda

    def _write(self, states: TorchRngStates) -> None:
        torch.set_rng_state(states[0])
        if self._cuda is not None and states[1] is not None:
            torch.cuda.set_rng_state(states[1], self._cuda)


def _cuda_device(device: torch.device) -> torch.device | None:
    """`device` with its index (the current one when it names none), or None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.device("cuda", index)
