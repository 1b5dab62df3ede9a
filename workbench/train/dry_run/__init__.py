"""A dry run: real training steps of your own module on fake tensors, nothing allocated.

    import workbench
    run = workbench.simulate_memory("tiny-gpt", workbench.TrainConfig(micro_batch=8))
    run.peak_bytes, run.by_category, run.by_module     # the peak of a step, measured
    run                                                # beside the formula's estimate
    run.compare()                                      # every point and category, explained

`simulate_memory` rebuilds the model on `FakeTensor`s (shapes, dtypes and devices without
storage: `dry_run_fake`), runs `steps` optimizer steps of the config as the Session's
engines do (autocast, pure bf16, accumulation, activation checkpointing of the blocks,
the optimizer in the implementation named; `dry_run_step`) under PyTorch's own memory
tracker (`torch.distributed._tools.mem_tracker.MemTracker`; FSDP2 through its
`fsdp2_mem_tracker.FSDPMemTracker`, `fully_shard` on each block and the root over a fake
process group standing in for `world_size` ranks: `dry_run_fsdp`), and reports the peak
of the steady-state step per category, per module and per point of the step, beside the
formula's estimate of the same setup (`workbench.estimate.estimate_memory` with the same
settings the engines use: `formula`, `DryRun.compare()`).

DeepSpeed's setups (ZeRO 1-3, its fp16/bf16, and several ranks without FSDP, which a
Session trains through DeepSpeed's ZeRO-0 data parallelism: `workbench.engines.engine_for`)
run DeepSpeed's own engine on the fake tensors (`dry_run_deepspeed`): its flat buffers,
partitions, reduce buckets and ZeRO-3 gathering are measured, not assumed. What it cannot
represent is said: the CUDA context (within the formula's `overhead_bytes`, on its own
line, in neither peak). The caching allocator is modelled: the steps' allocations and
frees (`DryRun.trace`) are replayed through `workbench.estimate.allocator` under
`PYTORCH_CUDA_ALLOC_CONF` for the reserved peak (`reserved_peak_bytes`), its
fragmentation and the setting that would lower it (`allocator_advice`). Offload and
DeepSpeed-only optimizers are refused (their kernels are DeepSpeed's C++/CUDA code, which
fake tensors cannot run; the formula counts them). `compile=True` runs the graphs
`torch.compile` would run, as its partitioner splits them (`dry_run_compiled`: what the
backward keeps is the compiled step's, the transients op by op); where that cannot be
simulated the steps run eagerly and a note names the formula's compile term.

The device: CUDA where torch has it (the GPU's kernels, cuBLAS's and the allocator's
512-byte rounding); on a CPU-only torch the steps run on fake CPU tensors (faking CUDA
tensors through autograd aborts a CPU-only torch), with dropout and attention dropout
routed to the kernels a GPU runs, and the notes say what still differs.

Bad input raises `DryRunError` (a ValueError) naming the argument (`dry_run_checks` checks
the arguments, all at once, before anything is built): a model whose forward
fails on fake tensors (its innermost module and the operator; `formula` still carries the
estimate), a batch the model does not take (what was given and what it takes), a world
size the fake process group cannot form, settings that cannot be simulated. Nothing is
left behind: the fake mode, the process group, the hooks and the tracker are gone when it
returns or raises, and your module is never changed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from workbench.config import (
    Documents,
    FsdpMode,
    OptimizerName,
    Precision,
    TrainConfig,
)
from workbench.display import fmt_bytes
from workbench.engines import engine_for
from workbench.estimate.allocator import (
    AllocatorConfigError,
    AllocatorSettings,
    AllocTrace,
    best_setting,
    parse_alloc_conf,
    replay,
)
from workbench.estimate.peak import OFFLOADED_TERM
from workbench.inputs import plain_number
from workbench.problems import SettingProblem
from workbench.train.backends.optimizer import build_optimizers
from workbench.train.dry_run.accumulation import InPlaceSums
from workbench.train.dry_run.checks import OPTIMIZER_IMPLS, check_arguments
from workbench.train.dry_run.compiled import compile_note, compile_problem, partitioned
from workbench.train.dry_run.deepspeed import (
    DeepSpeedKinds,
    base_optimizer,
    build_engine,
    deepspeed_dry_run,
    engine_tensors,
    master_tensors,
    parameter_tensors,
)
from workbench.train.dry_run.fake import (
    FakeBatch,
    FakeModel,
    GpuKernels,
    GroupedMatmuls,
    ModuleStack,
    OpRecorder,
    cast_copy,
    failure_problem,
    fake_batch,
    fake_model,
    unpacked_positions,
)
from workbench.train.dry_run.formula import formula_attention, formula_of
from workbench.train.dry_run.fsdp import (
    fake_process_group,
    make_mesh,
    mixed_precision,
    shard,
    units_refusal,
)
from workbench.train.dry_run.problems import DryRunError
from workbench.train.dry_run.result import POINTS, DryRun
from workbench.train.dry_run.step import StepPlan, measure, phase_tracker, run_steps
from workbench.train.techniques.attention import attention_problem, set_attention
from workbench.train.techniques.lora import (
    FOUR_BIT_MODULE,
    fake_adapters,
    fake_four_bit,
    holds_four_bit,
    holds_lora,
    targets_problem,
)
from workbench.train.techniques.offload import ActivationOffload
from workbench.train.techniques.precision import PURE_DTYPES, build_precision, cast_floating_inputs
from workbench.train.techniques.recompute import (
    checkpointable_modules,
    core_modules,
    mark_checkpointable,
    selective_supported,
    set_activation_checkpointing,
)

Progress = Callable[[str, int, int], None]

#: DeepSpeed's 16-bit modes: the engine trains a copy of the module in this dtype.
DEEPSPEED_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


def _with_documents(
    model: Any, config: TrainConfig, options: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """The model options with `config.documents` as tiny-gpt's `documents` option, as a
    Session builds it; DryRunError naming `documents` for any other model."""
    from workbench.models.spec import documents_problem

    documents = Documents(config.documents).value
    problem = documents_problem(documents, model, None, None, dict(options or {}))
    if problem is not None:
        raise DryRunError([problem])
    return {**(options or {}), "documents": documents} if documents != "stream" else options


def simulate_memory(
    model: Any,
    config: TrainConfig | None = None,
    *,
    batch: Any = None,
    world_size: int = 1,
    steps: int = 2,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    progress: Progress | bool | None = None,
    seq_len: int | None = None,
    model_options: Mapping[str, Any] | None = None,
    optimizer_impl: str = "foreach",
    device: str = "auto",
    alloc_conf: str | None = None,
) -> DryRun:
    """The measured peak of training `model` with `config` on `world_size` ranks, per rank,
    from `steps` real steps on fake tensors (see the module docstring).

    `model`: a built-in model name ("tiny-gpt", with `model_options`), an `nn.Module`
    (real or on the meta device; never changed) or a zero-argument function that builds
    one (called on fake tensors). `config`: a `TrainConfig` (default `TrainConfig()`).
    `batch`: one example micro-batch (a tensor of token ids, a dict of the model's keyword
    arguments such as {"input_ids": ..., "labels": ...}, or an (inputs, targets) pair with
    `loss_fn`); only its shapes and dtypes are read. Without one, a built-in model's
    dataset gives `config.micro_batch` samples, and a `transformers` model takes
    `config.micro_batch` x `seq_len` token ids (default: its context length), its own
    loss. `loss_fn(outputs, targets)` as in a Session (a built-in model brings its own).
    `steps` (2 to 100): the first step creates the optimizer states; the peak is the
    highest of the later ones. `optimizer_impl`: "foreach" (torch's default on CUDA),
    "for-loop" or "fused". `device`: "auto" (CUDA where torch has it, else the CPU; a
    DeepSpeed setup always the CPU, with DeepSpeed's CPU accelerator: the path verified),
    "cuda" or "cpu". `progress(phase, step, steps)` is called as each part of each step
    begins; None shows a line on a terminal's stderr, False nothing. `alloc_conf`: the
    `PYTORCH_CUDA_ALLOC_CONF` the steps' allocations are replayed under
    (`workbench.estimate.allocator`; None: the environment's PYTORCH_CUDA_ALLOC_CONF, else
    PYTORCH_ALLOC_CONF, as torch reads them).

    Raises `DryRunError` (a ValueError) naming every bad argument, or the model's or
    the batch's failure (see the module docstring).
    """
    started = time.perf_counter()
    # a NumPy or torch integer (a sweep's value) as the Python int it holds
    world_size, steps = plain_number(world_size), plain_number(steps)
    seq_len = plain_number(seq_len)
    config, sim_device, problems = check_arguments(
        config, world_size, steps, optimizer_impl, seq_len, device, progress, loss_fn
    )
    settings = _allocator_settings(alloc_conf)
    if isinstance(settings, SettingProblem):
        problems = [*problems, settings]
    if problems:
        raise DryRunError(problems)
    assert isinstance(settings, AllocatorSettings)
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    model_options = _with_documents(model, config, model_options)
    if isinstance(model, nn.Module) and holds_four_bit(model):
        raise DryRunError([SettingProblem("qlora", True, FOUR_BIT_MODULE)])
    built = fake_model(model, model_options, fake_mode, sim_device)
    if isinstance(built, list):
        raise DryRunError(built)
    fm, dtype_note = _weights_as_named(built, config, fake_mode, given=model)
    made = fake_batch(
        fm,
        batch,
        micro_batch=int(config.micro_batch),
        seq_len=seq_len,
        fake_mode=fake_mode,
        device=sim_device,
    )
    if isinstance(made, list):
        raise DryRunError(made)
    fb = made
    kernel = attention_problem(fm.module, config.attention)
    if kernel is not None:
        raise DryRunError([kernel])
    set_attention(fm.module, config.attention)  # the fake copy's
    blocks, blocks_note = _blocks(fm.module)
    recompute = str(config.activation_checkpointing)
    if recompute == "selective" and not selective_supported(fm.module):
        raise DryRunError(
            [
                SettingProblem(
                    "activation_checkpointing",
                    recompute,
                    "selective recomputation needs an attention core to recompute (the "
                    "built-in GPT's, or a transformers model's attention function); for "
                    "your own module use 'full'",
                )
            ]
        )
    if recompute == "full" and not blocks:
        raise DryRunError(
            [
                SettingProblem(
                    "activation_checkpointing",
                    recompute,
                    "the model has no blocks to checkpoint; mark them with "
                    "workbench.train.techniques.recompute.mark_checkpointable(model, [names])",
                )
            ]
        )
    if int(config.lora_rank) > 0:
        why = targets_problem(fm.module, str(config.lora_targets))
        if why is not None:  # targets that pick none of the layers
            raise DryRunError([SettingProblem("lora_targets", config.lora_targets, why)])
    if str(config.fsdp) != "off":  # unit names that match no module: refused by name
        units_error = units_refusal(fm.module, config)
        if units_error is not None:
            raise DryRunError([units_error])
    attention, attention_note = formula_attention(fm)
    formula, formula_note = formula_of(config, fm, fb, world_size, optimizer_impl, attention)
    loss = loss_fn if loss_fn is not None else fm.loss_fn
    if isinstance(fb.value, tuple) and loss is None:
        raise DryRunError(
            [
                SettingProblem(
                    "loss_fn",
                    None,
                    "the batch is an (inputs, targets) pair, so a loss_fn(outputs, targets) is "
                    "required (only a model given a dict with labels returns its own loss)",
                )
            ],
            formula=formula,
        )
    if int(config.lora_rank) > 0 and not holds_lora(fm.module):  # after the formula
        if config.qlora:  # the 4-bit base first: the adapters wrap its layers
            fake_four_bit(fm.module, config, fake_mode)
        fake_adapters(fm.module, config, fake_mode)  # (a LoRA Session's copy has its own)
    show = _progress(progress)
    offload = ActivationOffload(sim_device, simulated=True) if config.activation_offload else None
    compile_said: list[str] = []  # how a compiled step ran (`dry_run_compiled`)
    measured, dry, dtypes = _simulate(
        fm,
        fb,
        config,
        blocks,
        loss,
        world_size,
        steps,
        optimizer_impl,
        sim_device,
        show,
        formula,
        fake_mode,
        offload,
        compile_said,
    )
    notes = _notes(
        config, fm, fb, sim_device, world_size, blocks_note, attention_note, formula_note, formula
    )
    notes += compile_said
    if offload is not None:
        notes.append(offload_note(offload, formula))
    notes.insert(0, dtypes_note(config, dtypes, dtype_note))
    points = {p: dict(measured.points[p]) for p in POINTS}
    phases = {p: sum(points[p].values()) for p in POINTS}
    phase = max(POINTS, key=lambda p: phases[p])
    allocator, advice = _allocator(measured.trace, settings)
    return DryRun(
        peak_bytes=phases[phase],
        phase=phase,
        by_category={k: v for k, v in points[phase].items() if v},
        points=points,
        phases=phases,
        by_module=measured.modules,
        params_bytes=measured.params_bytes,
        grads_bytes=measured.grads_bytes,
        optimizer_bytes=measured.optimizer_bytes,
        optimizer_step_counter_bytes=measured.optimizer_step_counter_bytes,
        overhead_bytes=formula.overhead_bytes if formula is not None else 0,
        formula=formula,
        model=fm.name,
        n_params=fm.n_params,
        engine=dry,
        world_size=world_size,
        device=sim_device.type,
        precision=Precision(config.precision).value,
        optimizer=OptimizerName(config.optimizer).value,
        optimizer_impl=optimizer_impl,
        attention=attention,
        activation_checkpointing=str(config.activation_checkpointing),
        fsdp=FsdpMode(config.fsdp).value,
        zero_stage=int(config.zero_stage),
        micro_batch=fb.micro_batch,
        seq_len=fb.seq_len,
        grad_accum=int(config.grad_accum),
        techniques=_techniques(config),
        steps=steps,
        batch=fb.text,
        wall_seconds=time.perf_counter() - started,
        notes=tuple(notes),
        trace=measured.trace,
        reserved_peak_bytes=allocator.reserved_peak_bytes if allocator is not None else None,
        fragmentation_bytes=allocator.fragmentation_bytes if allocator is not None else None,
        allocator=allocator,
        allocator_advice=advice,
        dtypes=dtypes,
    )


def _allocator_settings(alloc_conf: str | None) -> AllocatorSettings | SettingProblem:
    """The allocator settings of `alloc_conf` (None: the environment's, as torch reads
    them), or the problem naming the key torch's allocator or the model does not take."""
    if alloc_conf is None:
        alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get(
            "PYTORCH_ALLOC_CONF"
        )
    try:
        return parse_alloc_conf(alloc_conf)
    except AllocatorConfigError as exc:
        return SettingProblem("alloc_conf", alloc_conf, str(exc))


def _allocator(trace: AllocTrace | None, settings: AllocatorSettings) -> tuple[Any, Any]:
    """The trace replayed through the caching allocator model under `settings`, and the
    setting that would lower its reserved peak most (None: none does)."""
    if trace is None:
        return None, None
    replayed = replay(trace, settings)
    return replayed, best_setting(trace, settings.text, baseline=replayed)


# ---------------------------------------------------------------------- the model's parts
def weights_dtype(precision: Precision) -> torch.dtype:
    """The dtype the precision trains weights in: bf16-true's and DeepSpeed's 16-bit copy,
    else fp32 (fp32, and amp-*: autocast computes in 16 bits from fp32 weights)."""
    return PURE_DTYPES.get(precision) or DEEPSPEED_DTYPES.get(precision) or torch.float32


def _weights_as_named(
    fm: FakeModel, config: TrainConfig, fake_mode: Any, *, given: Any = None
) -> tuple[FakeModel, str | None]:
    """`fm` with its floating weights in fp32 where the precision trains fp32 weights
    (fp32, amp-*) and the model came in another dtype (a config.json's `torch_dtype`, a
    meta module or a function building it in bf16): the precision names the weights',
    gradients' and optimizer states' dtype, not the config's. The 16-bit precisions cast
    their own copy in the run (`cast_copy`). A module with real weights (`given`, a
    Session's) is trained in its own dtype, as a Session trains it; the note says which."""
    precision = Precision(config.precision)
    if weights_dtype(precision) is not torch.float32:
        return fm, None
    found = {p.dtype for p in fm.module.parameters() if p.is_floating_point()}
    other = sorted(_dtype_name(d) for d in found if d is not torch.float32)
    if not other:
        return fm, None
    if isinstance(given, nn.Module) and any(p.device.type != "meta" for p in given.parameters()):
        note = (
            f"the module's weights are {', '.join(other)}, and a Session trains them as "
            f"they are; {precision.value} names fp32 weights (load the model in fp32, "
            "e.g. torch_dtype=torch.float32, for that)"
        )
        return fm, note
    module = cast_copy(fm.module, torch.float32, fake_mode)
    note = (
        f"the model came with {', '.join(other)} weights; {precision.value} trains fp32 "
        "weights, so the dry run cast them to fp32 (load it in fp32 for a Session, e.g. "
        "torch_dtype=torch.float32)"
    )
    return replace(fm, module=module), note


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        dtype, str(dtype).removeprefix("torch.")
    )


def state_dtypes(
    params: nn.Module | list[torch.Tensor], optimizer: Any, masters: list[torch.Tensor] | None
) -> dict[str, str]:
    """The dtype(s) of each model-state category as trained: "parameters", "gradients"
    (what backward writes: the parameters' dtype, or the gradients held when there are
    any), "optimizer states" (the states' tensors, Adam's step counters left out) and,
    under DeepSpeed's 16-bit modes, "master weights"."""
    tensors = list(params.parameters()) if isinstance(params, nn.Module) else list(params)

    def names(ts: Any) -> str:
        found = sorted({_dtype_name(t.dtype) for t in ts if t.is_floating_point()})
        return ", ".join(found) if found else "-"

    held = [t.grad for t in tensors if getattr(t, "grad", None) is not None]
    states = [
        v
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    ]
    out = {
        "parameters": names(tensors),
        "gradients": names(held or tensors),
        "optimizer states": names(states),
    }
    if masters:
        out["master weights"] = names(masters)
    return out


def dtypes_note(config: TrainConfig, dtypes: Mapping[str, str], cast: str | None) -> str:
    """The note naming each category's dtype (and the cast, when there was one)."""
    listed = "; ".join(f"{k} {v}" for k, v in dtypes.items())
    text = f"dtypes ({Precision(config.precision).value}): {listed}"
    return f"{text}; {cast}" if cast else text


def _blocks(module: nn.Module) -> tuple[list[nn.Module], str | None]:
    """The transformer blocks FSDP shards and checkpointing recomputes: the marked ones (as
    the Session's engines take them), else a transformers model's `_no_split_modules` (those
    in a ModuleList where some are: a one-off such as BertEmbeddings, which holds a weight
    tied to the head, stays with the embedding's unit), else the children of its largest
    ModuleList (marked on the fake copy, and said)."""
    marked = checkpointable_modules(module)
    if marked:
        return marked, None
    names = getattr(module, "_no_split_modules", None) or ()
    found: list[nn.Module] = []
    source = ""
    if names:  # the repeated ones (BertLayer), not a one-off also listed (BertEmbeddings)
        found = [m for m in module.modules() if type(m).__name__ in set(names)]
        listed = {
            id(m) for part in module.modules() if isinstance(part, nn.ModuleList) for m in part
        }
        found = [m for m in found if id(m) in listed] or found
        source = "its _no_split_modules"
    if not found:
        lists = [m for m in module.modules() if isinstance(m, nn.ModuleList) and len(m)]
        if lists:
            largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
            found = list(largest)
            source = "its largest ModuleList"
    if not found:
        return [], None
    for block in found:
        mark_checkpointable(block)
    found = checkpointable_modules(module)
    kinds = sorted({type(b).__name__ for b in found})
    note = (
        f"blocks (FSDP units, checkpointed blocks): {len(found)} x {', '.join(kinds)}, from "
        f"{source} (no block was marked; mark yours with "
        "workbench.train.techniques.recompute.mark_checkpointable)"
    )
    return found, note


def _checkpoint(module: nn.Module, mode: str, *, gpu_kernels: bool) -> None:
    """The Session's rule (`workbench.train.techniques.recompute`): "full": each marked block,
    outermost first, runs under `torch.utils.checkpoint.checkpoint(...,
    use_reentrant=False)`; "selective": each attention that offers it recomputes its core.
    On a CPU simulation the recomputation also runs the GPU's kernels (a function mode is
    not active inside autograd's recomputation unless the checkpoint enters it)."""
    set_activation_checkpointing(module, "selective" if mode == "selective" else "none")
    if not gpu_kernels and mode == "full":
        set_activation_checkpointing(module, "full")
        return

    def contexts() -> tuple[Any, Any]:
        return contextlib.nullcontext(), GpuKernels()

    if mode == "selective":
        for core in core_modules(module):
            core.core_context_fn = contexts if gpu_kernels else None
        return

    def checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(
            forward, *args, use_reentrant=False, context_fn=contexts, **kwargs
        )

    for block in checkpointable_modules(module):
        block.forward = functools.partial(checkpointed, block.forward)


def _optimizer(config: TrainConfig, params: list[nn.Parameter], impl: str) -> Any:
    """The engines' optimizer (`build_optimizer`) in implementation `impl`."""
    optimizer = build_optimizers(config, params)  # one per parameter in backward
    for group in optimizer.param_groups:
        group["foreach"] = impl == "foreach"
        if "fused" in group:
            group["fused"] = impl == "fused"
    return optimizer


def _engine(config: TrainConfig, world_size: int) -> str:
    """The engine a Session trains `config` with on `world_size` ranks
    (`workbench.engines.engine_for`): "plain", "fsdp" or "deepspeed"."""
    return engine_for(config, world_size).value


# ---------------------------------------------------------------------- the run
def _simulate(
    fm: FakeModel,
    fb: FakeBatch,
    config: TrainConfig,
    blocks: list[nn.Module],
    loss_fn: Any,
    world_size: int,
    steps: int,
    impl: str,
    device: torch.device,
    progress: Progress | None,
    formula: Any,
    fake: Any,
    offload: ActivationOffload | None = None,
    notes_out: list[str] | None = None,
) -> tuple[Any, str, dict[str, str]]:
    """Run the steps (see the module docstring); every context is closed before a
    failure becomes a `DryRunError`. With `offload` the forward runs under its hooks.
    Also returns the dtype of each model-state category as trained (`state_dtypes`).
    Under `compile` the steps run the compiled step's graphs where they can
    (`dry_run_compiled`); `notes_out` receives the note saying how they ran."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    engine = _engine(config, world_size)
    precision = Precision(config.precision)
    module = fm.module
    stack: ModuleStack | None = None
    recorder = OpRecorder()
    phase = ["building"]
    try:
        with contextlib.ExitStack() as ctx:
            ctx.enter_context(_quiet_fake_tensor_log())
            mesh = None
            if engine == "fsdp":
                _report(progress, "sharding", 0, steps)
                ctx.enter_context(fake_process_group(world_size))
                mesh = make_mesh(FsdpMode(config.fsdp), world_size, device.type)
            elif engine == "deepspeed":
                _report(progress, "building DeepSpeed", 0, steps)
                ctx.enter_context(deepspeed_dry_run(world_size, device))
            pure = PURE_DTYPES.get(precision) or DEEPSPEED_DTYPES.get(precision)
            if pure is not None:  # bf16-true, DeepSpeed's fp16/bf16: the 16-bit copy
                module = cast_copy(module, pure, fake)
                module.register_forward_pre_hook(cast_floating_inputs(pure), with_kwargs=True)
                blocks = checkpointable_modules(module)
            if config.activation_checkpointing:
                _checkpoint(
                    module, str(config.activation_checkpointing), gpu_kernels=device.type == "cpu"
                )
            ds_engine: Any = None
            with fake:
                if mesh is not None:
                    policy = mixed_precision(precision, bool(config.fsdp_reduce_fp32))
                    shard(module, config, policy, mesh)
                params = [p for p in module.parameters() if p.requires_grad]
                if not params:
                    raise DryRunError(
                        [SettingProblem("model", fm.name, "has no trainable parameters")],
                        formula=formula,
                    )
                if engine == "deepspeed":
                    ds_engine, _ = build_engine(module, config, world_size, impl)
                    optimizer = base_optimizer(ds_engine)
                else:
                    optimizer = _optimizer(config, params, impl)
            stack = ModuleStack(module)
            ctx.callback(stack.remove)
            ctx.enter_context(fake)
            if engine == "fsdp":
                tracker = phase_tracker(FSDPMemTracker, device.type)(module, optimizer)
                tracker.track_inputs(_flat(fb.value))
            else:
                tracker = phase_tracker(MemTracker, device.type)()
                tracker.track_external(module, *_flat(fb.value))
            if ds_engine is not None:
                tracker.track_external(optimizer, *engine_tensors(ds_engine))
                tracker.label(parameter_tensors(ds_engine), "Parameter")
                tracker.label(master_tensors(ds_engine), "Optstate")
                tracker.reclassify = DeepSpeedKinds(ds_engine, tracker, device.type)
            autocast = (
                contextlib.nullcontext
                if engine == "fsdp" or pure is not None
                else build_precision(config, device.type).autocast
            )
            stepped: nn.Module = module
            if config.compile:
                compiled = compile_problem(config, engine)
                if compiled is None:  # the compiled step's graphs, traced before the tracker
                    gpu = GpuKernels() if device.type == "cpu" else contextlib.nullcontext()
                    stepped, compiled = partitioned(module, fb.value, loss_fn, autocast, gpu)
                if notes_out is not None:
                    notes_out.append(compile_note(compiled, formula))
            if device.type == "cpu":
                ctx.enter_context(GpuKernels())
            ctx.enter_context(GroupedMatmuls())  # under the tracker: it counts their outputs
            ctx.enter_context(unpacked_positions(fm, fb))
            ctx.enter_context(tracker)
            ctx.enter_context(recorder)
            sums = ctx.enter_context(InPlaceSums())  # above the tracker: it sees the add_
            if offload is not None:  # the saved activations' device copies dropped
                trained = ds_engine.module if ds_engine is not None else module
                autocast = offload.around(autocast, trained)
            scale = float(config.loss_scale_init) if precision is Precision.AMP_FP16 else 1.0
            plan = StepPlan(autocast, scale, int(config.grad_accum), config.clip_grad_norm, steps)
            grads = run_steps(
                ds_engine if ds_engine is not None else stepped,
                optimizer,
                fb.value,
                loss_fn,
                plan,
                tracker=tracker,
                on_phase=lambda name: phase.__setitem__(0, name),
                progress=progress,
                device_type=device.type,
                engine=ds_engine,
                sums=sums,
            )
            shown = _shown(module, blocks)
            measured = measure(
                tracker,
                module,
                optimizer,
                grads,
                shown,
                device.type,
                param_tensors=None if ds_engine is None else parameter_tensors(ds_engine),
                masters=None if ds_engine is None else master_tensors(ds_engine),
            )
            dtypes = state_dtypes(
                module if ds_engine is None else parameter_tensors(ds_engine),
                optimizer,
                None if ds_engine is None else master_tensors(ds_engine),
            )
    except DryRunError:
        raise
    except Exception as exc:
        if stack is None:
            problem = SettingProblem("model", fm.name, f"preparing it failed: {exc}")
            raise DryRunError([problem], formula=formula) from exc
        problem, where, operator = failure_problem(
            exc, phase=phase[0], fm=fm, batch=fb, stack=stack, recorder=recorder
        )
        raise DryRunError([problem], module=where, operator=operator, formula=formula) from exc
    return measured, engine, dtypes


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return []


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Any:
    """The fake mode logs every failing meta kernel at ERROR level; a dry run reports the
    failure itself, once."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _shown(module: nn.Module, blocks: list[nn.Module]) -> dict[int, str]:
    """id -> name of the modules `by_module` reports: the root's children and the blocks,
    in the model's order."""
    block_ids = {id(b) for b in blocks}
    children = {id(m) for m in module.children()}
    return {
        id(m): name
        for name, m in module.named_modules()
        if name and (id(m) in block_ids or id(m) in children)
    }


def _report(progress: Progress | None, phase: str, step: int, total: int) -> None:
    if progress is not None:
        progress(phase, step, total)


def _progress(progress: Progress | bool | None) -> Progress | None:
    """The progress callback: the caller's, a line on stderr (True; None on a terminal),
    or none."""
    if callable(progress) and not isinstance(progress, bool):
        return progress
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None

    def line(phase: str, step: int, total: int) -> None:
        end = "\n" if phase == "done" else ""
        sys.stderr.write(f"\rdry run: step {step}/{total} {phase:<16}{end}")
        sys.stderr.flush()

    return line


# ---------------------------------------------------------------------- what it adds and says
def offload_note(offload: ActivationOffload, formula: Any) -> str:
    """What the dry run's last forward kept on the host, next to the formula's host term."""
    peak = getattr(formula, "peak", None)
    predicted = peak.host_terms.get(OFFLOADED_TERM) if peak is not None else None
    return (
        f"activation offload: {fmt_bytes(offload.total_moved_bytes)} of saved activations "
        "held on the host per micro-batch, outside the device peak (the formula's "
        f"{fmt_bytes(predicted) if predicted is not None else 'n/a'})"
    )


def _notes(
    config: TrainConfig,
    fm: FakeModel,
    fb: FakeBatch,
    device: torch.device,
    world_size: int,
    blocks_note: str | None,
    attention_note: str | None,
    formula_note: str | None,
    formula: Any,
) -> list[str]:
    notes: list[str] = []
    if device.type == "cpu":
        why = "this torch has no CUDA" if not torch.cuda.is_available() else "DeepSpeed"
        notes.append(
            f"simulated on fake CPU tensors ({why}): dropout and attention "
            "dropout run as the GPU's kernels; CPU autocast's operator lists differ from "
            "CUDA's in a few operators, and each storage counts its exact bytes where CUDA's "
            "allocator rounds up to 512"
        )
    overhead = fmt_bytes(formula.overhead_bytes) if formula is not None else "about 1 GiB"
    notes.append(
        "reserved peak: the steps' allocations and frees replayed through a model of "
        "PyTorch's CUDA caching allocator (workbench.estimate.allocator); not simulated: "
        f"the CUDA context (within the formula's {overhead} of context and reserve, on "
        "its own line)"
    )
    if _engine(config, world_size) == "deepspeed":
        stage = int(config.zero_stage)
        why = (
            f"several ranks without FSDP train through DeepSpeed ZeRO-0 in a Session, as "
            f"here ({world_size} ranks)"
            if stage == 0 and world_size > 1
            else f"DeepSpeed ZeRO-{stage}"
        )
        notes.append(
            f"{why}: DeepSpeed's own engine ran on fake tensors over a fake group of "
            f"{world_size} rank(s), with the engine config a Session hands it; its checks "
            "that read values back (fp16 overflow, the gradient norm's finiteness, ZeRO-3's "
            "parameter order on every rank) answered without reading, so no step is skipped"
        )
    if Precision(config.precision) is Precision.AMP_FP16:
        notes.append(
            "amp-fp16: the loss is scaled and the gradients unscaled in place, as the "
            "GradScaler does; its overflow check (a value read back) is not run"
        )
    if fb.given and fb.micro_batch != int(config.micro_batch):
        notes.append(
            f"micro-batch {fb.micro_batch} from the batch given (the config says "
            f"{int(config.micro_batch)})"
        )
    notes += [n for n in (blocks_note, attention_note, formula_note) if n]
    return notes


def _techniques(config: TrainConfig) -> tuple[str, ...]:
    """What the dry run put on the model or its step beyond the engine, for its header."""
    out = []
    if int(config.lora_rank) > 0:
        out.append(("QLoRA" if config.qlora else "LoRA") + f" rank {int(config.lora_rank)}")
    if config.optimizer_in_backward:
        out.append("optimizer in backward")
    if config.activation_offload:
        out.append("activation offload")
    if config.compile:
        out.append("compile")
    return tuple(out)


__all__ = ["OPTIMIZER_IMPLS", "DryRun", "DryRunError", "simulate_memory"]
