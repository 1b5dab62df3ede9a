"""What every exported training script shares: reading `job.json`, the model and its data
(a workbench built-in or a factory "pkg.module:function" found from the current folder),
the data contract, a single-process fallback without a launcher.

A factory is code, and a `job.json` is a file anyone may have edited: the factory it names
is imported only when the script's command line names it too (`--model SPEC`, equal to
job.json's; `launch.sh` passes it) or says `--trust-model-spec`; then the script prints
what it imports (module, where from, function). Otherwise it refuses, naming the spec and
the file. A built-in model name is data and always allowed. Nor does a job.json choose which
other file is read: the text file a built-in's `text` option names is read only when the
command line names the same path (`--text PATH`; `launch.sh` passes it). Files are read bounded: a
regular file only (no FIFO or device), at most 16 MiB, strict JSON (a key given twice,
NaN or Infinity refused).

The workbench ships it as `workbench/export/job_common.py` and copies it as is beside the
script of every export (`train_deepspeed.py`, `train_fsdp.py`, `train_lightning.py`),
which import it from their own folder.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import socket
import stat
import sys
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import torch
from torch.utils.data import DataLoader, DistributedSampler

JOB_NAME = "job.json"
JOB_KEYS = (
    "description",
    "model",
    "model_options",
    "seed",
    "steps",
    "num_workers",
    "pin_memory",
    "activation_checkpointing",
    "activation_offload",
    "exported_world_size",
)
SCRIPT = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "train"
#: a job's activation recomputation (True and False, older jobs' words, mean full and none)
RECOMPUTE = ("none", "selective", "full")


def fail(message: str) -> NoReturn:
    print(f"{SCRIPT}: error: {message}", file=sys.stderr)
    sys.exit(2)


#: a factory spec: a dotted module path, a colon, a function name
FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_STEPS = 10**12


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def _not_finite(text: str) -> Any:
    raise ValueError(f"{text}: JSON numbers must be finite")


def read_json_file(path: str, what: str) -> Any:
    """The strict JSON of the regular file `path` (at most MAX_FILE_BYTES); exits with a
    message naming `what` and the path for anything else."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            fail(f"{what} {path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            fail(f"{what} {path}: {info.st_size:,} bytes, more than {MAX_FILE_BYTES:,}")
        with open(path, "rb") as f:
            text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_not_finite,
            parse_float=lambda t: float(t) if math.isfinite(float(t)) else _not_finite(t),
        )
    except (OSError, ValueError, RecursionError) as exc:
        fail(f"{what} {path}: cannot be read ({' '.join(str(exc).split())[:300]})")


def _is_number(value: Any, low: float, high: float) -> bool:
    """A finite int or float (not a bool) within [low, high]."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def read_job(path: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The job description (`job.json`), every key present (JOB_KEYS and `extra`) and of
    its type; every problem named at once."""
    job = read_json_file(path, "the job description")
    if not isinstance(job, dict):
        fail(f"{path}: must hold a JSON object")
    missing = [k for k in (*JOB_KEYS, *extra) if k not in job]
    if missing:
        fail(f"{path}: missing {', '.join(missing)}")
    checks = {
        "model": isinstance(job["model"], str) and 0 < len(job["model"]) <= 300,
        "model_options": isinstance(job["model_options"], dict),
        "seed": _is_int(job["seed"], 0, 2**64 - 1),
        "steps": _is_int(job["steps"], 1, MAX_STEPS),
        "num_workers": _is_int(job["num_workers"], 0, 1024),
        "pin_memory": isinstance(job["pin_memory"], bool),
        "activation_checkpointing": isinstance(job["activation_checkpointing"], bool)
        or job["activation_checkpointing"] in RECOMPUTE,
        "activation_offload": isinstance(job["activation_offload"], bool),
        "exported_world_size": _is_int(job["exported_world_size"], 1, 2**26),
    }
    for key in extra:
        checks[key] = isinstance(job[key], dict if key == "config" else str)
    bad = [f"{k}={repr(job[k])[:80]}" for k, ok in checks.items() if not ok]
    if bad:
        fail(f"{path}: not a job this script writes: {', '.join(bad)}")
    return dict(job)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """`--model SPEC` and `--trust-model-spec` (see the module docstring)."""
    parser.add_argument(
        "--model",
        metavar="SPEC",
        default=None,
        help="the model job.json names; a factory 'pkg.module:function' is imported only "
        "when named here too (launch.sh does)",
    )
    parser.add_argument(
        "--trust-model-spec",
        action="store_true",
        help="import the factory job.json names without naming it with --model",
    )
    parser.add_argument(
        "--text",
        metavar="PATH",
        default=None,
        help="the text file job.json's model options name (tiny-gpt's `text`); it is read "
        "only when named here too (launch.sh does)",
    )


def approve_model(
    job: dict[str, Any],
    model: str | None,
    trusted: bool,
    source: str,
    text: str | None = None,
) -> bool:
    """Whether the job's model may be built: a built-in name always; a factory when the
    command line named it too (`model`, which must equal job.json's) or `trusted`, after
    printing what will be imported. A built-in's `text` option (the file tiny-gpt trains
    on) is read only when the command line names the same path (`text`, `--text`): a job
    file never chooses which other file is read. Exits with a refusal naming the spec (or
    the text) and `source`."""
    spec = job["model"]
    if model is not None and model != spec:
        fail(
            f"--model {model!r}: {source} names the model {spec!r}; give the same model "
            "(or re-export the job for another)"
        )
    if ":" not in spec:
        approve_text(job, text, source)
        return True
    if not FACTORY.match(spec):
        fail(f"{source}: model {spec!r}: a factory must be written 'pkg.module:function'")
    module_name, _, function = spec.partition(":")
    if model is None and not trusted:
        fail(
            f"{source}: model {spec!r} names Python code to import and run (module "
            f"{module_name!r}, function {function!r}); a job file cannot choose code to run, "
            f"so it is not imported. Name it yourself: {SCRIPT} --model {spec} (launch.sh "
            "does), or pass --trust-model-spec if you trust this file"
        )
    sys.path.insert(0, os.getcwd())  # as `python -m` finds modules in the current folder
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    origin = "not importable here" if found is None else (found.origin or "a namespace package")
    why = "named by --model" if model is not None else "trusted with --trust-model-spec"
    if os.environ.get("RANK", "0") == "0":
        print(
            f"{SCRIPT}: model {spec!r} ({why}): importing module {module_name!r} from "
            f"{origin} and calling {function}(**model_options)",
            file=sys.stderr,
        )
    return True


def approve_text(job: dict[str, Any], text: str | None, source: str) -> None:
    """Exit with a refusal unless the file a built-in model's `text` option names is the
    one the command line names (`--text`), or neither names one (the built-in sonnets)."""
    options = job["model_options"]
    given = options.get("text") if isinstance(options, dict) else None
    if given is None and text is None:
        return
    if given is None:
        fail(
            f"--text {repr(text)[:200]}: {source} trains on the built-in sonnets (no text option); "
            "re-export the job with the text"
        )
    if text is None:
        fail(
            f"{source}: model option text={repr(given)[:200]} names a file to train on; a job "
            "file cannot choose which file is read, so it is not read. Name it yourself: "
            f"{SCRIPT} --text {shlex.quote(str(given))} (launch.sh does)"
        )
    if text != given:
        fail(
            f"--text {repr(text)[:200]}: {source} names the text {repr(given)[:200]}; give the same "
            "path (or re-export the job for another text)"
        )


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


#: Names of output heads "all-linear" leaves out (the Session's rule, `workbench.train.lora`).
LORA_HEADS = frozenset({"lm_head", "head", "output", "embed_out", "classifier", "score"})


def lora_targets(module: torch.nn.Module, targets: str) -> list[str]:
    """The job's own copy of the Session's target rule: "all-linear" is every nn.Linear
    but the output head, else comma-separated module names or name endings."""
    linears = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
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
        ("lora_rank", rank, _is_int(rank, 1, 4096), "an integer from 1 to 4096"),
        ("lora_alpha", alpha_in, _is_number(alpha_in, 0.0, 1e6) and alpha_in > 0,
         "a number > 0 and <= 10^6"),
        ("lora_dropout", dropout, _is_number(dropout, 0.0, 1.0) and dropout < 1,
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
    lora = LoraConfig(
        r=int(rank),
        lora_alpha=alpha,
        lora_dropout=float(dropout),
        target_modules="|".join(re.escape(n) for n in names),
        bias="none",
    )
    # the adapters' initial A from the run's seed alone, as a Session draws it
    with torch.random.fork_rng(devices=[]):
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


def check_save_dir(path: str | None) -> str | None:
    """`--save-dir`'s folder, checked before training: a folder or a path to make one at;
    exits naming it when it is a file (nothing trained yet, nothing lost)."""
    if path is None:
        return None
    if not path or os.path.exists(path) and not os.path.isdir(path):
        fail(f"--save-dir {path!r}: must be a folder (or a path to make one at), not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        fail(f"--save-dir {path!r}: its parent {parent!r} is not a writable folder")
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
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        peft_config: Any = module.peft_config  # inject_adapter_in_model's record
        config = peft_config["default"].to_dict()
        config["target_modules"] = lora_layers
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
    """The job's own copy of the Session's rule (`workbench.train.attention`): the
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
#: `workbench.train.recompute.mark_checkpointable` sets; tiny-gpt's blocks carry it).
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
_VIEW_OR_COPY = frozenset(
    {"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0",
     "PermuteBackward0", "ExpandBackward0", "UnsafeViewBackward0", "AliasBackward0",
     "SliceBackward0", "SelectBackward0", "CloneBackward0", "ReshapeAliasBackward0"}
)  # fmt: skip


def from_parameter(t: torch.Tensor, storages: set[int]) -> bool:
    """Whether a saved tensor is a parameter or buffer (`storages`), a trained leaf, or a
    view/copy chain of one (`workbench.train.offload.is_parameter_derived`'s rule)."""
    if (t.grad_fn is None and t.requires_grad) or t.untyped_storage().data_ptr() in storages:
        return True
    fn = t.grad_fn
    for _ in range(4):
        if fn is None or type(fn).__name__ not in _VIEW_OR_COPY:
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
    (`workbench.train.offload`): saved-tensor hooks under which each CUDA activation the
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


def batches(
    job: dict[str, Any], dataset: Any, micro_batch: int, world: int, rank: int
) -> Iterator[Any]:
    """This rank's micro-batches, epoch after epoch (each epoch reshuffled with the job's seed)."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=int(job["seed"]), drop_last=True
    )
    loader = DataLoader(
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
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


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


def loss_of(engine: Any, batch: Any, loss_fn: Any, offload: Any = None) -> torch.Tensor:
    """The fp32 loss of one batch (the data contract in the module docstring); with
    `offload` (`offload_stream`'s side stream) the forward keeps its saved activations in
    host memory (`offloaded_activations`)."""
    hooks: Any = contextlib.nullcontext()
    if offload is not None:  # the forward's saved activations, not the loss's
        hooks = offloaded_activations(getattr(engine, "module", engine), offload)
    if isinstance(batch, Mapping):
        with hooks:
            out = engine(**batch)
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


# ---------------------------------------------------------------------- tensor parallelism
def tensor_parallelize(module: torch.nn.Module, mesh: Any, tp: int, sequence: bool) -> None:
    """Split `module` over the `tp` ranks of `mesh` in place: the job's copy of
    `workbench.train.tensor_plan` and the tensor-parallel engine's plan. The built-in GPT
    (fused qkv rows reordered so each rank's slice holds its heads' q, k and v) and
    `transformers` Llama-style decoders (with `sequence`, the norms and the residual
    stream of either split along the sequence); column-wise q/k/v (qkv) and first MLP layers,
    row-wise projections, a vocabulary-parallel embedding and head (logits left split for
    `loss_parallel`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    layers, sizes, tied = _tp_layers(module, tp, sequence)
    bad = [f"{name}={size}" for name, size in sizes.items() if size % tp]
    if bad:
        fail(f"tp={tp}: must divide {', '.join(bad)} evenly")
    stream = Shard(1) if sequence else Replicate()
    styles: dict[str, Any] = {}
    for name, kind in layers.items():
        if kind == "colwise":
            styles[name] = ColwiseParallel(input_layouts=stream)
        elif kind == "rowwise":
            styles[name] = RowwiseParallel(output_layouts=stream)
        elif kind == "embedding":
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        elif kind == "embedding-whole":
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif kind == "colwise-gathered":
            styles[name] = ColwiseParallel()
        elif kind == "gather-sequence":
            styles[name] = PrepareModuleInput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_output=True,
            )
        elif kind == "gather-sequence-kw":
            styles[name] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=True,
            )
        elif kind == "split-sequence":
            styles[name] = PrepareModuleInput(
                input_layouts=(Replicate(),),
                desired_input_layouts=(Shard(1),),
                use_local_output=True,
            )
        elif kind == "norm":
            styles[name] = SequenceParallel()
        elif kind == "positions":
            styles[name] = PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(0)
            )
        else:
            styles[name] = ColwiseParallel(
                input_layouts=stream, output_layouts=Shard(-1), use_local_output=False
            )
    parallelize_module(module, mesh, styles)
    if tied is not None:
        head, embedding = (module.get_submodule(n) for n in tied)
        head.weight = embedding.weight
    every: list[Any] = list(module.parameters())
    for p in every:
        placements = getattr(p, "placements", None)
        if p.requires_grad and placements is not None:
            p.register_hook(_placed_as(placements))


def _placed_as(placements: Any) -> Any:
    def hook(grad: Any) -> Any:  # the embedding's whole-vocabulary gradient -> its rows
        if tuple(grad.placements) == tuple(placements):
            return None
        return grad.redistribute(placements=placements)

    return hook


def _tp_layers(
    model: torch.nn.Module, tp: int, sequence: bool
) -> tuple[dict[str, str], dict[str, int], tuple[str, str] | None]:
    """(module name -> style, the sizes tp must divide, the tied (head, embedding))."""
    module: Any = model  # its submodules are read by name
    names = {n for n, _ in module.named_modules()}
    blocks: Any = getattr(module, "blocks", None)
    if type(module).__name__ == "TinyGPT" and isinstance(blocks, torch.nn.ModuleList):
        hidden = int(module.wte.weight.shape[1])
        layers: dict[str, str] = {"wte": "embedding", "head": "head"}
        gpt_blocks: list[Any] = list(blocks)
        sizes = {"heads": int(gpt_blocks[0].attn.heads), "hidden": hidden, "ffn_hidden": 4 * hidden}
        if sequence:
            layers.update({"wpe": "positions", "ln_f": "norm"})
            sizes["seq_len"] = int(module.seq_len)
        for i, block in enumerate(gpt_blocks):
            if sequence:
                layers[f"blocks.{i}.ln_1"] = layers[f"blocks.{i}.ln_2"] = "norm"
            layers[f"blocks.{i}.attn.qkv"] = layers[f"blocks.{i}.mlp.fc"] = "colwise"
            layers[f"blocks.{i}.attn.proj"] = layers[f"blocks.{i}.mlp.fc_proj"] = "rowwise"
            if hidden % tp == 0:
                c = hidden // tp
                order = torch.cat(
                    [
                        torch.arange(j * hidden + r * c, j * hidden + (r + 1) * c)
                        for r in range(tp)
                        for j in range(3)
                    ]
                )
                with torch.no_grad():
                    for p in (block.attn.qkv.weight, block.attn.qkv.bias):
                        p.copy_(p[order])
        tied = ("head", "wte") if module.head.weight is module.wte.weight else None
        return layers, sizes, tied
    n = len(getattr(getattr(module, "model", None), "layers", None) or [])
    want = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
    llama = n > 0 and all(f"model.layers.{i}.{w}" in names for i in range(n) for w in want)
    if not llama or "model.embed_tokens" not in names or "lm_head" not in names:
        fail(
            f"tp={tp}: {type(module).__name__} has no tensor-parallel plan; tp > 1 splits the "
            "workbench GPT and transformers Llama-style decoders"
        )
    layers = {"model.embed_tokens": "embedding", "lm_head": "head"}
    if sequence:  # positions and the mask read the embedding's output: whole there
        layers.update({"model.embed_tokens": "embedding-whole", "model.layers.0": "split-sequence"})
        layers["model.norm"] = "norm"
    for i in range(n):
        if sequence:  # the attention and the MLP gather their input once each
            layers[f"model.layers.{i}.input_layernorm"] = "norm"
            layers[f"model.layers.{i}.post_attention_layernorm"] = "norm"
            layers[f"model.layers.{i}.self_attn"] = "gather-sequence-kw"
            layers[f"model.layers.{i}.mlp"] = "gather-sequence"
        for w in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            layers[f"model.layers.{i}.{w}"] = "colwise-gathered" if sequence else "colwise"
        layers[f"model.layers.{i}.self_attn.o_proj"] = "rowwise"
        layers[f"model.layers.{i}.mlp.down_proj"] = "rowwise"
    config = module.config
    heads = int(config.num_attention_heads)
    sizes = {
        "heads": heads,
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
        "hidden": int(config.hidden_size),
        "ffn_hidden": int(config.intermediate_size),
    }
    tied_llama = module.lm_head.weight is module.model.embed_tokens.weight
    return layers, sizes, ("lm_head", "model.embed_tokens") if tied_llama else None


def sharded_grad_norm(params: list[Any], world: int, clip: float | None) -> float:
    """The full gradient's norm over DTensor shards and whole tensors alike (each local
    squared sum weighted by how many ranks hold the same elements), clipped to `clip`."""
    import torch.distributed as dist

    grads: list[Any] = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        local = g.to_local() if hasattr(g, "to_local") else g
        pieces = 1
        placements = getattr(g, "placements", None)
        if placements is not None:
            for size, placement in zip(g.device_mesh.shape, placements, strict=True):
                if not (placement.is_replicate() or placement.is_partial()):
                    pieces *= int(size)
        total += local.float().pow(2).sum() * (pieces / world)
    dist.all_reduce(total)
    norm = float(total.sqrt())
    if clip is not None and clip / (norm + 1e-6) < 1.0:
        for g in grads:
            (g.to_local() if hasattr(g, "to_local") else g).mul_(clip / (norm + 1e-6))
    return norm
