"""What every exported training script shares: the model and its data (a workbench
built-in or a factory "pkg.module:function" found from the current folder, once
`approve_model` approved it), the data contract, a single-process fallback without a
launcher, LoRA, activation recomputation and offload, the learning-rate schedule and the
optimizers, tensor parallelism. Reading `job.json` and the command line's approvals live in
`job_files.py` beside it (see its docstring); this module re-exports their names.

The workbench ships it as `workbench/export/job_common.py` and copies it as is beside the
script of every export (`train_deepspeed.py`, `train_fsdp.py`, `train_lightning.py`),
which import it from their own folder. The library imports some of its pieces instead of
keeping copies (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import socket
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

# Beside this file in an exported folder, modules of the package here: job.json and the
# command line (job_files.py), tensor parallelism (job_parallel.py). Their names are this
# module's too, for the scripts that import them from here.
if __package__:  # a module of the package
    import workbench.export.job_files as job_files
    import workbench.export.job_parallel as job_parallel
else:  # the exported folder's own copies, imported by its script
    import job_files  # type: ignore[no-redef, import-not-found]
    import job_parallel  # type: ignore[no-redef, import-not-found]

FACTORY = job_files.FACTORY
JOB_KEYS = job_files.JOB_KEYS
JOB_NAME = job_files.JOB_NAME
MAX_FILE_BYTES = job_files.MAX_FILE_BYTES
MAX_STEPS = job_files.MAX_STEPS
RECOMPUTE = job_files.RECOMPUTE
SCRIPT = job_files.SCRIPT
add_model_arguments = job_files.add_model_arguments
approve_model = job_files.approve_model
approve_text = job_files.approve_text
check_world_size = job_files.check_world_size
fail = job_files.fail
int_in = job_files.int_in
number_in = job_files.number_in
read_job = job_files.read_job
read_json_file = job_files.read_json_file
writable_folder = job_files.writable_folder
tensor_parallelize = job_parallel.tensor_parallelize
sharded_grad_norm = job_parallel.sharded_grad_norm
fsdp_units = job_parallel.fsdp_units
units_problem = job_parallel.units_problem
resolve_units = job_parallel.resolve_units


def single_process_env() -> None:
    """Without a launcher: rank 0 of 1 on a free loopback port."""
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
    )


#: The name DeepSpeed's shm comm op gives a rank's segment (ops/csrc/cpu/comm/shm.cpp).
SHM_SEGMENT = "deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"


def release_shm_segment() -> str | None:
    """After `deepspeed.init_distributed` on every rank: DeepSpeed's CPU comm op gives each
    rank of a one-host run under its launcher (LOCAL_SIZE = the world size) a 66 MB
    shared-memory segment it never unlinks, which /dev/shm would keep in RAM after the job.
    Once every rank has mapped its peers' (a barrier), this rank unlinks its own; the
    mapping lasts until the process exits. The path unlinked, or None where none was made.
    (The workbench's own engines call it too: workbench/train/backends/process_group.py.)"""
    import torch.distributed as dist
    from deepspeed.comm import comm  # its module global `cdb`: the backend in use

    op = getattr(comm.cdb, "shm_comm_op", None)
    world = dist.get_world_size()
    if op is None or os.environ.get("LOCAL_SIZE") != str(world) or not os.path.isdir("/dev/shm"):
        return None
    if world > 1:
        dist.barrier()  # each peer has mapped this rank's segment: its name can go
    path = "/dev/shm/" + SHM_SEGMENT.format(
        uid=os.getuid(),
        addr=os.environ.get("MASTER_ADDR", ""),
        port=os.environ.get("MASTER_PORT", ""),
        rank=dist.get_rank(),
    )
    with contextlib.suppress(FileNotFoundError):  # made once a process
        os.unlink(path)
    return path


def build(job: dict[str, Any], *, approved: bool = False) -> tuple[torch.nn.Module, Any, Any]:
    """(module, dataset, loss_fn) of the job's model: a workbench built-in or a factory
    (only when `approve_model` approved it: `approved`)."""
    model, options, seed = str(job["model"]), dict(job["model_options"]), int(job["seed"])
    torch.manual_seed(seed)
    if ":" in model:
        if not approved:
            fail(f"model {model!r}: a factory is imported only after approve_model()")
        module_name, _, function = model.partition(":")
        sys.path.insert(0, os.getcwd())  # as `python -m` finds modules in the current folder
        try:
            factory = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as exc:
            fail(f"model {model!r}: cannot import the factory ({exc})")
        if not callable(factory):
            fail(f"model {model!r}: {function} in {module_name} is not callable")
        built = factory(**options)
    else:
        # a built-in takes its name and seed from job.json's own keys, never as options
        for key, where in (("name", "model"), ("seed", "seed")):
            if key in options:
                fail(
                    f"model {model!r}: model_options key {key!r}: the model's {key} is "
                    f"job.json's {where!r}; remove it from model_options"
                )
        try:
            from workbench.models import build_model
        except ImportError as exc:
            fail(f"model {model!r} is a workbench built-in: pip install workbench ({exc})")
        try:
            built = build_model(model, seed=seed, **options)
        except ValueError as exc:
            fail(f"model {model!r}: {exc}")
    if not (
        isinstance(built, (tuple, list))
        and len(built) in (3, 4)
        and isinstance(built[0], torch.nn.Module)
        and (built[2] is None or callable(built[2]))
    ):
        fail(f"model {model!r}: the factory must return (module, dataset, loss_fn[, info])")
    module, dataset, loss_fn = built[0], built[1], built[2]
    recompute = job["activation_checkpointing"]
    recompute = "full" if recompute is True else "none" if recompute is False else recompute
    if recompute not in RECOMPUTE:
        fail(f"activation_checkpointing={recompute!r}: must be one of {', '.join(RECOMPUTE)}")
    if recompute == "full" and not checkpoint_marked_blocks(module):
        fail("activation checkpointing is on but the model has no checkpointable blocks")
    if recompute == "selective" and not recompute_attention_cores(module):
        fail(
            "activation_checkpointing='selective': the model has no attention that "
            "recomputes its core (the workbench GPT's); use 'full'"
        )
    config = job.get("config")
    kernel = config.get("attention", "model") if isinstance(config, dict) else "model"
    if kernel not in ATTENTION_KERNELS:
        fail(f"attention={kernel!r}: must be one of {', '.join(ATTENTION_KERNELS)}")
    if kernel != "model" and not set_attention(module, kernel):
        fail(
            f"attention={kernel!r}: the model is neither the workbench GPT nor a "
            "transformers model, so there is no attention kernel to switch"
        )
    if isinstance(config, dict) and config.get("lora_rank", 0) not in (0, None):  # checked there
        add_lora(module, config)
    return module, dataset, loss_fn


#: Names of output heads "all-linear" leaves out (the Session's rule, `workbench.train.techniques.lora`).
LORA_HEADS = frozenset({"lm_head", "head", "output", "embed_out", "classifier", "score"})

#: The prefix of the names in a saved adapter, as peft's `save_pretrained` writes them (a
#: `PeftModel`'s around the base model), which `PeftModel.from_pretrained` expects.
PEFT_PREFIX = "base_model.model."


def linear_kinds() -> tuple[type, ...]:
    """The layers LoRA wraps: torch's nn.Linear, and transformers' Conv1D (GPT-2's
    projections, weight stored as (in, out)) once transformers has loaded it."""
    conv1d = getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)
    return (torch.nn.Linear,) if not isinstance(conv1d, type) else (torch.nn.Linear, conv1d)


def lora_targets(module: torch.nn.Module, targets: str) -> list[str]:
    """The job's own copy of the Session's target rule: "all-linear" is every linear layer
    (nn.Linear or Conv1D) but the output head, else comma-separated module names or name
    endings."""
    kinds = linear_kinds()
    linears = [n for n, m in module.named_modules() if isinstance(m, kinds)]
    wanted = [t.strip() for t in targets.split(",") if t.strip()]
    if wanted == ["all-linear"]:
        get = getattr(module, "get_output_embeddings", None)
        out = get() if callable(get) else None
        heads = {
            n
            for n, m in module.named_modules()
            if (out is not None and m is out) or n.split(".")[-1] in LORA_HEADS
        }
        return [n for n in linears if n not in heads]
    return [n for n in linears if any(n == w or n.endswith("." + w) for w in wanted)]


def add_lora(module: torch.nn.Module, config: dict[str, Any]) -> None:
    """peft's LoRA adapters on the job's module in place, the base frozen (the Session's
    `lora_*` settings); the trainable share said on stderr."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as exc:
        fail(f"lora_rank: LoRA trains through peft: pip install peft ({exc})")
    rank, alpha_in = config["lora_rank"], config.get("lora_alpha", 16.0)
    dropout = config.get("lora_dropout", 0.0)
    targets = config.get("lora_targets", "all-linear")
    for name, value, ok, allowed in (
        ("lora_rank", rank, int_in(rank, 1, 4096), "an integer from 1 to 4096"),
        ("lora_alpha", alpha_in, number_in(alpha_in, 0.0, 1e6) and alpha_in > 0,
         "a number > 0 and <= 10^6"),
        ("lora_dropout", dropout, number_in(dropout, 0.0, 1.0) and dropout < 1,
         "a number >= 0 and < 1"),
        ("lora_targets", targets, isinstance(targets, str) and 0 < len(targets) <= 1000,
         "module names or 'all-linear', at most 1000 characters"),
    ):  # fmt: skip
        if not ok:
            fail(f"job.json config.{name}={value!r}: must be {allowed}")
    names = lora_targets(module, str(targets))
    if not names:
        fail(
            f"lora_targets={config.get('lora_targets')!r}: picks none of the model's linear layers"
        )
    alpha: Any = float(alpha_in)  # peft scales by alpha / r (a float)
    conv1d = linear_kinds()[1:]
    lora = LoraConfig(
        r=int(rank),
        lora_alpha=alpha,
        lora_dropout=float(dropout),
        target_modules="|".join(re.escape(n) for n in names),
        bias="none",
        # GPT-2's Conv1D layers: the update transposed into their (in, out) weights
        fan_in_fan_out=any(isinstance(module.get_submodule(n), conv1d) for n in names),
    )
    # the adapters' initial A from the run's seed alone, as a Session draws it; peft sets
    # fan_in_fan_out per layer (its warning where a model mixes both kinds is left out)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="fan_in_fan_out is set to")
        torch.manual_seed(int(config.get("seed", 0)))
        inject_adapter_in_model(lora, module)
    adapters = sum(p.numel() for p in module.parameters() if p.requires_grad)
    total = sum(p.numel() for p in module.parameters())
    print(
        f"LoRA rank {lora.r} on {len(names)} layers: {adapters:,} adapter parameters train "
        f"({adapters / total:.2%} of {total:,}); the base is frozen",
        file=sys.stderr,
    )


def add_save_argument(parser: argparse.ArgumentParser) -> None:
    """`--save-dir DIR`: where the job writes what it trained once it ends (`save_trained`)."""
    parser.add_argument(
        "--save-dir",
        metavar="DIR",
        default=None,
        help="write the trained weights here at the end (model.safetensors; with LoRA the "
        "adapters alone, in peft's format: adapter_model.safetensors, adapter_config.json)",
    )


def check_save_dir(path: str | None, flag: str = "--save-dir") -> str | None:
    """`--save-dir`'s folder, checked before training (`job_files.writable_folder`: a folder
    or a path to make one at, in a writable parent; nothing made)."""
    if path is not None:
        writable_folder(path, flag)
    return path


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's whole weights on the host: every rank calls it (FSDP2's and tensor
    parallel's DTensor shards are gathered, a collective); rank 0 gets them, the other
    ranks of a sharded module an empty dict."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in module.parameters()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        gathered: dict[str, torch.Tensor] = get_model_state_dict(module, options=options)  # type: ignore[assignment]
        return gathered
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def save_trained(
    module: torch.nn.Module, state: dict[str, torch.Tensor], folder: str
) -> dict[str, Any]:
    """Rank 0 writes `state` (`full_state(module)`) into `folder` as safetensors: with LoRA
    the adapters alone under peft's names with their `adapter_config.json` (what
    `peft.PeftModel.from_pretrained` loads onto the base, as a Session's `save` writes
    them), else the whole model (`model.safetensors`). Returns the "saved" event."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    lora_layers = [
        n for n, m in module.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")
    ]
    if lora_layers:
        from peft import get_peft_model_state_dict

        tensors = get_peft_model_state_dict(module, state_dict=state, adapter_name="default")
        tensors = {PEFT_PREFIX + k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        peft_config: Any = module.peft_config  # inject_adapter_in_model's record
        config = peft_config["default"].to_dict()
        config["target_modules"] = lora_layers
        # the layout of the layers (on for GPT-2's Conv1D), read by peft when it loads them
        config["fan_in_fan_out"] = any(
            bool(getattr(module.get_submodule(n), "fan_in_fan_out", False)) for n in lora_layers
        )
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True, default=list)
        files = ["adapter_model.safetensors", "adapter_config.json"]
    else:
        seen: set[int] = set()
        tensors = {}
        for k, v in state.items():  # tied weights: safetensors keeps no shared storage
            v = v.detach().cpu().contiguous()
            tensors[k] = v.clone() if v.data_ptr() in seen else v
            seen.add(v.data_ptr())
        save_file(tensors, os.path.join(folder, "model.safetensors"))
        files = ["model.safetensors"]
    count = sum(t.numel() for t in tensors.values())
    return {"event": "saved", "path": os.path.abspath(folder), "files": files, "parameters": count}


#: The attention kernels a job trains with (the Session's `attention` setting).
ATTENTION_KERNELS = ("model", "eager", "sdpa")


def set_attention(module: torch.nn.Module, kernel: str) -> bool:
    """The job's own copy of the Session's rule (`workbench.train.techniques.attention`): the
    workbench GPT's attention modules take `kernel` as their `kernel` attribute, a
    transformers model as its attn_implementation. False when the model has neither."""
    layers = [m for m in module.modules() if type(m).__name__ == "CausalSelfAttention"]
    for layer in layers:
        setattr(layer, "kernel", kernel)  # noqa: B010 (a plain attribute, not a submodule)
    if layers:
        return True
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return False
    switch = getattr(module, "set_attn_implementation", None)
    if callable(switch):
        switch(kernel)
    else:
        config._attn_implementation = kernel
    return True


#: The attribute that marks a block for activation checkpointing (what
#: `workbench.train.techniques.recompute.mark_checkpointable` sets; tiny-gpt's blocks carry it).
CHECKPOINTABLE = "_workbench_checkpointable"


def checkpoint_marked_blocks(module: torch.nn.Module) -> int:
    """Run each marked block (outermost first) under `torch.utils.checkpoint` (its forward
    keeps only its inputs and recomputes the rest in backward); returns how many. The
    job's own copy of the rule, so the script needs nothing of workbench for it."""
    import functools

    import torch.utils.checkpoint

    def checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    inside: set[int] = set()
    count = 0
    for block in module.modules():
        if id(block) in inside or not getattr(block, CHECKPOINTABLE, False):
            continue
        inside.update(id(m) for m in block.modules())
        block.forward = functools.partial(checkpointed, block.forward)
        count += 1
    return count


def recompute_attention_cores(module: torch.nn.Module) -> int:
    """Selective recomputation: each attention module with a boolean `recompute_core`
    attribute (the workbench GPT's) recomputes its core (scores, softmax, dropout, the
    product with V) in backward; returns how many."""
    cores: list[Any] = [
        m for m in module.modules() if isinstance(getattr(m, "recompute_core", None), bool)
    ]
    for m in cores:
        m.recompute_core = True
    return len(cores)


#: autograd nodes that only view or copy a tensor (an autocast cast of a weight)
VIEW_OR_COPY = frozenset(
    {"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0",
     "PermuteBackward0", "ExpandBackward0", "UnsafeViewBackward0", "AliasBackward0",
     "SliceBackward0", "SelectBackward0", "CloneBackward0", "ReshapeAliasBackward0"}
)  # fmt: skip


def from_parameter(t: torch.Tensor, storages: set[int]) -> bool:
    """Whether a saved tensor is a parameter or buffer (`storages`), a trained leaf, or a
    view/copy chain of one (`workbench.train.techniques.offload.is_parameter_derived`'s rule)."""
    if (t.grad_fn is None and t.requires_grad) or t.untyped_storage().data_ptr() in storages:
        return True
    fn = t.grad_fn
    for _ in range(4):
        if fn is None or type(fn).__name__ not in VIEW_OR_COPY:
            return False
        nexts = [f for f, _ in fn.next_functions if f is not None]
        if len(nexts) != 1:
            return False
        fn = nexts[0]
        if type(fn).__name__ == "AccumulateGrad":
            return True
    return False


class _OnHost:
    __slots__ = ("device", "event", "host")

    def __init__(self, host: torch.Tensor, event: Any, device: torch.device) -> None:
        self.host, self.event, self.device = host, event, device


def offloaded_activations(module: torch.nn.Module, side: Any) -> Any:
    """The job's own copy of the Session's activation offload
    (`workbench.train.techniques.offload`): saved-tensor hooks under which each CUDA activation the
    forward saves (not a parameter or buffer, nor a cast of one) is copied into pinned host
    memory on the side stream `side` (a `torch.cuda.Stream`), and brought back for the
    backward once that copy's event is reached. On a CPU (`side` None) nothing moves."""

    def local(t: torch.Tensor) -> torch.Tensor:
        inner = getattr(t, "_local_tensor", None)
        return inner if isinstance(inner, torch.Tensor) else t

    storages = {
        local(t).untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())
    }

    def pack(t: torch.Tensor) -> Any:
        if side is None or t.device.type != "cuda" or from_parameter(t, storages):
            return t
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            host = torch.empty_like(t, device="cpu", pin_memory=True)
            host.copy_(t, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(side)
        t.record_stream(side)  # its memory is not reused before the copy ends
        return _OnHost(host, event, t.device)

    def unpack(packed: Any) -> torch.Tensor:
        if not isinstance(packed, _OnHost):
            return packed  # type: ignore[no-any-return]
        torch.cuda.current_stream(packed.device).wait_event(packed.event)
        return packed.host.to(packed.device, non_blocking=True)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def offload_stream(enabled: bool, device: torch.device) -> Any:
    """The side stream of `activation_offload` (`enabled`) on a GPU, else None."""
    if enabled and device.type == "cuda":
        return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    return None


def count_parameters(module: torch.nn.Module) -> int:
    """Unique parameters (a tied weight once), each at its full size: a ZeRO-3 shard by
    its `ds_numel`, an FSDP2 DTensor by its global numel (the job's copy of
    `workbench.modelstats.count_parameters`)."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += int(getattr(p, "ds_numel", 0) or p.numel())
    return total


def data_loader(
    job: dict[str, Any], dataset: Any, micro_batch: int, world: int, rank: int
) -> DataLoader[Any]:
    """This rank's loader of `world` data-parallel ranks: a DistributedSampler seeded with the
    job's seed (its share of each epoch's shuffle, the tail dropped; a caller sets its epoch)
    and a generator of its own. Every job's ranks read through it (the Session's order)."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=int(job["seed"]), drop_last=True
    )
    return DataLoader(
        dataset,
        batch_size=micro_batch,
        sampler=sampler,
        drop_last=True,
        num_workers=int(job["num_workers"]),
        pin_memory=bool(job["pin_memory"]),
        # its own generator, as a Session's loader has: an iterator then draws its worker
        # seed from it, not from the global RNG dropout draws from
        generator=torch.Generator().manual_seed(int(job["seed"])),
    )


def batches(
    job: dict[str, Any], dataset: Any, micro_batch: int, world: int, rank: int, skip: int = 0
) -> Iterator[Any]:
    """This rank's micro-batches (`data_loader`), epoch after epoch (each reshuffled), from
    its `skip`-th on (a resumed run's: the ones its checkpoint's steps trained, passed over
    without loading them: the first epoch left reads the rest of that epoch's order)."""
    loader = data_loader(job, dataset, micro_batch, world, rank)
    sampler: Any = loader.sampler
    epoch, offset = divmod(skip, len(loader)) if skip and len(loader) else (0, 0)
    if offset:
        yield from rest_of_epoch(loader, epoch, offset)
        epoch += 1
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def rest_of_epoch(loader: DataLoader[Any], epoch: int, offset: int) -> DataLoader[Any]:
    """`data_loader`'s epoch `epoch` from its `offset`-th micro-batch on: the same samples in
    the same order, the ones before passed over without loading them (a resumed run's)."""
    sampler: Any = loader.sampler
    sampler.set_epoch(epoch)
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=list(sampler)[offset * int(loader.batch_size or 1) :],
        drop_last=True,
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        generator=loader.generator,
    )


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def to_fp32(out: Any) -> Any:
    """16-bit floating tensors of an output (a tensor, mapping or tuple) cast to fp32."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, Mapping):
        converted = {k: to_fp32(v) for k, v in out.items()}
        try:
            return type(out)(**converted)
        except TypeError:
            return converted
    if isinstance(out, tuple):
        return tuple(to_fp32(v) for v in out)
    return out


def _takes_use_cache(engine: Any) -> bool:
    """Whether the model under `engine` (DeepSpeed's engine, DDP, or the module itself)
    takes `use_cache`: a transformers model, given `use_cache=False` in training as the
    Session gives it (`workbench.train.batches`: a block that fills a KV cache cannot be
    recomputed under activation checkpointing)."""
    module = engine
    while type(module).__name__ in ("DeepSpeedEngine", "DistributedDataParallel") and (
        isinstance(getattr(module, "module", None), torch.nn.Module)
    ):
        module = module.module
    try:
        return "use_cache" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False


def loss_of(engine: Any, batch: Any, loss_fn: Any, offload: Any = None) -> torch.Tensor:
    """The fp32 loss of one batch (the data contract in the module docstring); with
    `offload` (`offload_stream`'s side stream) the forward keeps its saved activations in
    host memory (`offloaded_activations`)."""
    hooks: Any = contextlib.nullcontext()
    if offload is not None:  # the forward's saved activations, not the loss's
        hooks = offloaded_activations(getattr(engine, "module", engine), offload)
    if isinstance(batch, Mapping):
        kwargs = dict(batch)
        if "use_cache" not in kwargs and _takes_use_cache(engine):
            kwargs["use_cache"] = False  # no KV cache in training (the Session's rule)
        with hooks:
            out = engine(**kwargs)
        if loss_fn is not None:
            return loss_fn(to_fp32(out), batch)  # type: ignore[no-any-return]
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, Mapping):
            loss = out.get("loss")
        if not isinstance(loss, torch.Tensor):
            fail("the model's output has no .loss: include 'labels' or give a loss_fn")
        return loss.float()
    inputs, targets = batch
    with hooks:
        out = engine(inputs)
    return loss_fn(to_fp32(out), targets)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- settings (job["config"])
#: The learning-rate schedule, the same formulas as `workbench.train.schedule`.
ONECYCLE_PCT_START = 0.3
ONECYCLE_FINAL_DIV = 1e4


def lr_multiplier(schedule: str, step: int, warmup_steps: int, total_steps: int) -> float:
    """Factor applied to the base learning rate for the step after `step` applied steps:
    linear warm-up, then constant, a half-cosine to 0 ("cosine") or to 1e-4 ("onecycle",
    whose warm-up defaults to 30% of the steps)."""
    warmup = warmup_steps
    if schedule == "onecycle" and warmup == 0:
        warmup = max(1, int(ONECYCLE_PCT_START * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "cosine":
        return cosine
    floor = 1.0 / ONECYCLE_FINAL_DIV
    return floor + (1.0 - floor) * cosine


#: The optimizers these jobs build: name -> (its class "module:Class", the keywords it
#: takes from the config (source a config key, or "=<float>" a constant), the library to
#: install where it does not import). A copy of the workbench's optimizer rows (this
#: script imports nothing of the workbench); tests/unit/test_optimizers.py holds them equal.
OPTIMIZER_CLASSES: dict[str, tuple[str, tuple[tuple[str, str], ...], str | None]] = {
    "adamw": ("torch.optim:AdamW", (("lr", "lr"), ("weight_decay", "weight_decay")), None),
    "adam": ("torch.optim:Adam", (("lr", "lr"), ("weight_decay", "weight_decay")), None),
    "sgd": (
        "torch.optim:SGD",
        (("lr", "lr"), ("momentum", "momentum"), ("weight_decay", "weight_decay")),
        None,
    ),
    "sgd-nomomentum": (
        "torch.optim:SGD",
        (("lr", "lr"), ("momentum", "=0.0"), ("weight_decay", "weight_decay")),
        None,
    ),
    "adam8bit": (
        "torchao.optim:AdamW8bit",
        (("lr", "lr"), ("weight_decay", "weight_decay")),
        "torchao",
    ),
}


def make_optimizer(config: dict[str, Any], params: Any) -> torch.optim.Optimizer:
    """The optimizer of a TrainConfig dict, as `OPTIMIZER_CLASSES` builds it: torch's adamw,
    adam, sgd, sgd-nomomentum, or torchao's 8-bit AdamW (adam8bit; its learning rate a
    tensor: `set_lr`)."""
    name = config["optimizer"]
    if name not in OPTIMIZER_CLASSES:
        fail(f"optimizer {name!r}: this script trains {', '.join(OPTIMIZER_CLASSES)}")
    path, keywords, library = OPTIMIZER_CLASSES[name]
    module, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        fail(f"optimizer {name!r}: {library}'s {attr}: pip install {library} ({exc})")
    kwargs = {
        key: float(source[1:]) if source.startswith("=") else float(config[source])
        for key, source in keywords
    }
    optimizer: torch.optim.Optimizer = cls(params, **kwargs)
    return optimizer


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate (in place where the optimizer keeps it as a tensor, as
    torchao's 8-bit AdamW does: it refuses a float put there)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def marked_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks the workbench marked as the model's repeated units (checkpointable):
    the built-in GPT's transformer blocks; FSDP wraps each of them."""
    return [m for m in module.modules() if getattr(m, CHECKPOINTABLE, False)]
