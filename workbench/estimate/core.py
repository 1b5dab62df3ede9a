"""`estimate_memory`: per-GPU training memory, compute time and cost (pure Python).

Accounting and formulas are described in `model_states` (parameters, gradients,
optimizer states, ZeRO, offload), `architecture` (parameter counts, tensor/pipeline
layout), `activations` (Korthikanti et al. 2022, extended) and `catalog` (GPU data sheets); docs/estimator.md collects them and compares them with DeepSpeed's
and accelerate's estimators.

Past 600 lines because the one public entry point checks every argument and its result type
renders itself (text, HTML); the formulas live in the modules named above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from workbench.config import OptimizerName, Precision
from workbench.display import Display, Readable, fmt_bytes, fmt_count
from workbench.estimate.activations import ActivationBreakdown, Checkpointing, activation_breakdown
from workbench.estimate.architecture import Architecture, build_architecture
from workbench.estimate.catalog import GpuSpec, find_gpu
from workbench.estimate.counts import COUNT_EXAMPLES, read_count
from workbench.estimate.hf_config import read_hf_config
from workbench.estimate.limits import (
    LIMITS,
    MAX_BYTES_PER_GPU,
    as_bool,
    as_int,
    check_number,
)
from workbench.estimate.model_states import (
    ACCOUNTINGS,
    FSDP_MODES,
    ModelStateQuery,
    model_state_bytes,
)
from workbench.estimate.presets import find_model
from workbench.estimate.problems import EstimateInputError, Problem, keywords_checked

GIB = 1 << 30

#: Per-GPU memory the estimator reserves for the framework, in GiB. The CUDA context
#: alone takes about 0.3-0.6 GiB on recent GPUs (more without lazy module loading),
#: cuBLAS/cuDNN workspaces and NCCL buffers add a few hundred MiB, and the caching
#: allocator loses some memory to fragmentation; 1 GiB covers the sum on the parts in
#: the catalog for a plain data-parallel job. Raise it for NCCL-heavy or fragmented runs.
DEFAULT_OVERHEAD_GIB = 1.0

#: Model FLOPs utilisation assumed for time estimates: well-tuned large-model training
#: reports 0.35-0.55 on A100/H100 (e.g. PaLM 46%, Megatron-LM ~50%); 0.4 is a middle value.
DEFAULT_MFU = 0.4

SHAPE_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab")

_PRECISIONS = {p.value: p for p in Precision}
_OPTIMIZERS = {o.value: o for o in OptimizerName}
_CHECKPOINTING = {c.value: c for c in Checkpointing}
_BF16 = (Precision.AMP_BF16, Precision.BF16)


@dataclass(frozen=True)
class MemoryEstimate(Readable):
    """Per-GPU bytes of one training setup, plus compute figures and the inputs echoed.
    `str(estimate)` and a notebook show it as a table in binary units (GiB).

    `total_bytes = params_bytes + grads_bytes + optimizer_bytes + activation_bytes`, with
    `activation_bytes` None (counted as 0 in the total) when no transformer shape was
    given. `overhead_bytes` (framework overhead) is kept out of `total_bytes`; `fits` is
    `total_bytes + overhead_bytes <= gpu_memory_bytes`. `cpu_offload_bytes` is host
    memory per GPU. GPU fields are None when no GPU was named; `max_micro_batch` is also
    None without a shape or when not even a micro-batch of 1 fits. Compute fields are
    None when not asked for (`tokens`), `train_seconds` also without a GPU, `cost` also
    without a price.

    `gpus = tensor_parallel x pipeline_parallel x data_parallel`. `shard_params` is the
    parameter count one GPU holds before ZeRO shards it over the `data_parallel` group:
    its tensor-parallel share of the largest pipeline stage (`n_params` without tensor or
    pipeline parallelism). `model` is the preset's name or the module's class name;
    the architecture fields (`layers` ... `tied_embeddings`) are None without a shape.
    """

    # results, per GPU
    n_params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int | None
    total_bytes: int
    overhead_bytes: int
    cpu_offload_bytes: int
    gpu: str | None
    gpu_memory_bytes: int | None
    fits: bool | None
    max_micro_batch: int | None
    train_flops: float | None
    train_seconds: float | None
    cost: float | None
    activations: ActivationBreakdown | None
    # inputs
    precision: str
    optimizer: str
    zero_stage: int
    gpus: int
    offload_optimizer: bool
    offload_params: bool
    checkpointing: str
    micro_batch: int
    layers: int | None
    hidden: int | None
    heads: int | None
    seq_len: int | None
    vocab: int | None
    overhead_gib: float
    tokens: float | None
    mfu: float
    price_per_gpu_hour: float | None
    accounting: str
    # model and parallelism (inputs; the architecture fields resolved from a model)
    model: str | None = None
    hf_config: str | None = None
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    mlp: str | None = None
    norm: str | None = None
    bias: str | None = None
    positions: str | None = None
    tied_embeddings: bool | None = None
    parallel_residual: bool | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    data_parallel: int = 1
    shard_params: int = 0
    fsdp: str = "off"
    dropout: bool = True  # the activations count dropout masks (training with dropout)

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def required_bytes(self) -> int:
        """What the GPU must hold: `total_bytes + overhead_bytes`."""
        return self.total_bytes + self.overhead_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (the activation breakdown nested)."""
        return asdict(self)

    def _display(self) -> Display:
        acts = (
            fmt_bytes(self.activation_bytes)
            + f" (micro-batch {self.micro_batch}, recomputation {self.checkpointing})"
            if self.activation_bytes is not None
            else "not estimated (give a transformer shape or a model)"
        )
        rows = [
            ("parameters", fmt_bytes(self.params_bytes)),
            ("gradients", fmt_bytes(self.grads_bytes)),
            ("optimizer states", fmt_bytes(self.optimizer_bytes)),
            ("activations", acts),
            ("total", fmt_bytes(self.total_bytes)),
            ("framework overhead", fmt_bytes(self.overhead_bytes)),
        ]
        if self.cpu_offload_bytes:
            rows.append(("offloaded to CPU", fmt_bytes(self.cpu_offload_bytes)))
        if self.gpu is not None:
            verdict = "fits" if self.fits else "does not fit"
            rows.append((f"on {self.gpu}", f"{verdict} ({fmt_bytes(self.gpu_memory_bytes)})"))
            if self.max_micro_batch is not None:
                rows.append(("largest micro-batch that fits", str(self.max_micro_batch)))
        if self.train_seconds is not None:
            rows.append(("training time", f"{self.train_seconds / 3600:,.1f} h"))
        if self.cost is not None:
            rows.append(("cost", f"{self.cost:,.0f}"))
        split = f"{self.gpus} GPU" + ("s" if self.gpus > 1 else "")
        engine = f"FSDP {self.fsdp}" if self.fsdp != "off" else f"ZeRO {self.zero_stage}"
        if self.tensor_parallel > 1 or self.pipeline_parallel > 1:
            split += (
                f" (tp {self.tensor_parallel} x pp {self.pipeline_parallel} x "
                f"dp {self.data_parallel})"
            )
        name = self.model or f"{fmt_count(self.n_params)} parameters"
        title = f"memory per GPU: {name}, {self.precision}, {self.optimizer}, {engine}, {split}"
        return Display(title, rows)


# ---------------------------------------------------------------- validation helpers
def _checked(p: list[Problem], name: str, value: Any) -> Any:
    """`value` read and range-checked as input `name` (see `limits`), or None with the
    problem appended to `p`."""
    number, message = check_number(name, value)
    if message is not None:
        p.append(Problem(name, value, message))
    return number


def _count(p: list[Problem], name: str, value: Any) -> int | None:
    """A count (`n_params`, `tokens`: a number or text such as "7B") in its range, or None
    with the problem appended to `p`."""
    bound = LIMITS[name]
    got = read_count(value)
    allowed = f"must be a whole number from 1 to {bound.high_text}"
    if (isinstance(got, int) and got > bound.high) or got == "more than 10^30":
        p.append(Problem(name, value, bound.too_large()))
        return None
    if isinstance(got, str) or got < 1:
        hint = f"; {got}" if isinstance(got, str) and "separators" in got else ""
        p.append(Problem(name, value, f"{allowed} ({COUNT_EXAMPLES}){hint}"))
        return None
    return got


def _choice(v: Any, table: dict[str, Any]) -> Any:
    if isinstance(v, str):
        return table.get(v.strip().lower())
    return None


# ---------------------------------------------------------------- the estimator
@keywords_checked
def estimate_memory(
    *,
    model: Any = None,
    hf_config: Any = None,
    n_params: int | float | str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    mlp: str | None = None,
    norm: str | None = None,
    bias: str | None = None,
    positions: str | None = None,
    tied_embeddings: bool | None = None,
    parallel_residual: bool | None = None,
    micro_batch: int = 1,
    precision: Precision | str = "fp32",
    optimizer: OptimizerName | str = "adamw",
    zero_stage: int = 0,
    gpus: int = 1,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    sequence_parallel: bool = False,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    fsdp: str = "off",
    checkpointing: Checkpointing | str = "none",
    dropout: bool = True,
    gpu: str | None = None,
    overhead_gib: float = DEFAULT_OVERHEAD_GIB,
    tokens: float | str | None = None,
    mfu: float = DEFAULT_MFU,
    price_per_gpu_hour: float | None = None,
    accounting: str = "paper",
) -> MemoryEstimate:
    """Per-GPU memory of training a model, and optionally its compute time and cost.

    The model comes from one of:

    * `model`: a preset name (`workbench.estimate.model_names()`, e.g. "llama-3-8b"),
      an `Architecture`, or a torch `nn.Module` (or a function that builds one, which is
      built on the meta device, so nothing is allocated) whose parameters are counted;
    * `hf_config`: a Hugging Face config.json path (or its dict) of a gpt2, llama,
      mistral, qwen2 or gpt_neox model;
    * `n_params` (a number or text such as "7B", "1.5e9", "350M", "1.3T"), and/or a
      transformer shape (`layers`, `hidden`, `heads`, `seq_len`, `vocab`), with optional
      `kv_heads`, `ffn_hidden`, `mlp` ("gelu"/"swiglu"), `norm` ("layernorm"/"rmsnorm"),
      `bias` ("all"/"qkv"/"none"), `positions` ("learned"/"rotary"),
      `tied_embeddings` and `parallel_residual` (defaults: GPT's).

    Shape fields given with `model` or `hf_config` override theirs (e.g. `seq_len`).
    With both a shape and `n_params`, `n_params` counts the model states and the shape
    the activations. `gpus` = `tensor_parallel` x `pipeline_parallel` x the data-parallel
    size over which ZeRO shards; `sequence_parallel` needs `tensor_parallel` > 1.
    `accounting` picks how model-state bytes are counted (a key of
    `workbench.estimate.model_states.ACCOUNTINGS`; "paper" is the ZeRO paper's model).
    `fsdp` ("off", "full_shard", "shard_grad_op", "no_shard"): PyTorch FSDP instead of
    ZeRO (`zero_stage` 0), counted with FSDP2's layout (the "fsdp" accounting, implied).
    `dropout=False`: a model trained without dropout keeps no dropout masks (and no
    dropout outputs), so its activations are smaller.

    Every number is range-checked (`workbench.estimate.limits` lists the ranges and why);
    numpy scalars are numbers, bools and text are not (except the counts `n_params` and
    `tokens`, which may be text such as "7B").

    Raises `EstimateInputError` (a `ValueError`) listing every invalid input at once.
    """
    p: list[Problem] = []
    dropout, sequence_parallel = as_bool(dropout), as_bool(sequence_parallel)
    offload_optimizer, offload_params = as_bool(offload_optimizer), as_bool(offload_params)

    n = None
    if n_params is not None:
        n = _count(p, "n_params", n_params)

    # ------------------------------------------------------------ the model's shape
    model_name: str | None = None
    config_name: str | None = None
    base: Architecture | None = None
    base_fields: dict[str, Any] = {}
    counted: int | None = None
    if model is not None and hf_config is not None:
        p.append(Problem("hf_config", str(hf_config), "give `model` or `hf_config`, not both"))
    elif isinstance(model, str):
        found = find_model(model)
        if isinstance(found, str):
            p.append(Problem("model", model, found))
        else:
            base, model_name = found.architecture, found.name
    elif isinstance(model, Architecture):
        base = model
    elif model is not None and not (callable(model) or hasattr(model, "parameters")):
        p.append(
            Problem(
                "model",
                model,
                "must be a model name, an Architecture, a torch nn.Module or a function "
                "that builds one",
            )
        )
    elif model is not None:
        from workbench.estimate.from_module import module_facts  # imports torch

        counted, model_name, base_fields, module_problems = module_facts(model)
        p.extend(module_problems)
    if hf_config is not None and model is None:
        config_name = str(hf_config) if not isinstance(hf_config, Mapping) else "dict"
        base_fields, config_problems = read_hf_config(hf_config)
        p.extend(config_problems)

    overrides = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "seq_len": seq_len,
        "vocab": vocab,
        "kv_heads": kv_heads,
        "ffn_hidden": ffn_hidden,
        "mlp": mlp,
        "norm": norm,
        "bias": bias,
        "positions": positions,
        "tied_embeddings": tied_embeddings,
        "parallel_residual": parallel_residual,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    arch: Architecture | None = None
    if base is not None:
        try:
            arch = base.replace(**given)
        except EstimateInputError as exc:
            p.extend(exc.problems)
    elif base_fields or given:
        merged = {**base_fields, **given}
        if base_fields and "seq_len" in given and merged.get("positions") == "learned":
            merged.setdefault("max_positions", base_fields["seq_len"])
        arch, shape_problems = build_architecture(merged)
        p.extend(shape_problems)
    elif n_params is None and model is None and hf_config is None:
        p.append(
            Problem(
                "n_params",
                None,
                "give `n_params`, a `model` or a transformer shape (`layers`, `hidden`, "
                "`heads`, `seq_len`, `vocab`)",
                missing=True,
            )
        )
    if n is None and n_params is None:
        n = counted if counted is not None else (arch.n_params if arch is not None else None)

    # ------------------------------------------------------------ training setup
    mb = _checked(p, "micro_batch", micro_batch)

    prec = _choice(precision, _PRECISIONS)
    if prec is None:
        p.append(Problem("precision", precision, f"must be one of {', '.join(_PRECISIONS)}"))
    opt = _choice(optimizer, _OPTIMIZERS)
    if opt is None:
        p.append(Problem("optimizer", optimizer, f"must be one of {', '.join(_OPTIMIZERS)}"))
    ckpt = _choice(checkpointing, _CHECKPOINTING)
    if ckpt is None:
        p.append(
            Problem("checkpointing", checkpointing, f"must be one of {', '.join(_CHECKPOINTING)}")
        )

    stage = as_int(zero_stage)
    if stage is None or not 0 <= stage <= 3:
        p.append(Problem("zero_stage", zero_stage, "must be 0, 1, 2 or 3"))
        stage = None
    n_gpus = _checked(p, "gpus", gpus)
    tp = _checked(p, "tensor_parallel", tensor_parallel)
    pp = _checked(p, "pipeline_parallel", pipeline_parallel)

    for name, flag in (
        ("dropout", dropout),
        ("sequence_parallel", sequence_parallel),
        ("offload_optimizer", offload_optimizer),
        ("offload_params", offload_params),
    ):
        if not isinstance(flag, bool):
            p.append(Problem(name, flag, "must be True or False"))
    if sequence_parallel is True and tp == 1:
        p.append(Problem("sequence_parallel", True, "needs `tensor_parallel` > 1 (got 1)"))
    sharding = _choice(fsdp, {m: m for m in FSDP_MODES})
    if sharding is None:
        p.append(Problem("fsdp", fsdp, f"must be one of {', '.join(FSDP_MODES)}"))
    elif sharding != "off":
        if stage not in (None, 0):
            p.append(
                Problem("fsdp", sharding, f"is PyTorch FSDP: needs `zero_stage` 0 (got {stage})")
            )
        if prec is not None and prec.is_deepspeed:
            p.append(
                Problem(
                    "fsdp",
                    sharding,
                    f"needs precision fp32, amp-bf16 or amp-fp16 (got {prec.value})",
                )
            )
        if offload_optimizer is True:
            p.append(
                Problem(
                    "offload_optimizer", True, "is DeepSpeed's; FSDP offloads with `offload_params`"
                )
            )
        if offload_params is True and sharding != "full_shard":
            p.append(Problem("offload_params", True, f"needs fsdp 'full_shard' (got {sharding!r})"))
        if accounting not in ("paper", "fsdp"):
            p.append(Problem("accounting", accounting, "an FSDP setup is counted by 'fsdp'"))
        accounting = "fsdp"
    elif stage is not None:
        if offload_optimizer is True and stage == 0:
            p.append(Problem("offload_optimizer", True, "needs `zero_stage` 1, 2 or 3 (got 0)"))
        if offload_params is True and stage != 3:
            p.append(Problem("offload_params", True, f"needs `zero_stage` 3 (got {stage})"))

    dp: int | None = None
    if tp is not None and pp is not None:
        if arch is None and (tp > 1 or pp > 1):
            for which, size in (("tensor_parallel", tp), ("pipeline_parallel", pp)):
                if size > 1:
                    p.append(
                        Problem(
                            which,
                            size,
                            "needs a transformer shape (a `model` or `layers`, `hidden`, "
                            "`heads`, `seq_len`, `vocab`) to split the model",
                        )
                    )
        elif arch is not None:
            p.extend(arch.parallel_problems(tp, pp))
        if n_gpus is not None:
            if n_gpus % (tp * pp):
                p.append(
                    Problem(
                        "gpus",
                        gpus,
                        "must be a multiple of `tensor_parallel` x `pipeline_parallel` "
                        f"= {tp * pp}",
                    )
                )
            else:
                dp = n_gpus // (tp * pp)

    spec: GpuSpec | None = None
    if gpu is not None:
        found_gpu = find_gpu(gpu)
        if isinstance(found_gpu, str):
            p.append(Problem("gpu", gpu, found_gpu))
        else:
            spec = found_gpu

    overhead = _checked(p, "overhead_gib", overhead_gib)
    n_tokens = None
    if isinstance(tokens, str):
        counted_tokens = _count(p, "tokens", tokens)
        n_tokens = float(counted_tokens) if counted_tokens is not None else None
    elif tokens is not None:
        number, message = check_number("tokens", tokens)
        if message is not None:
            p.append(Problem("tokens", tokens, f"{message} ({COUNT_EXAMPLES})"))
        n_tokens = number
    util = _checked(p, "mfu", mfu)
    price = None
    if price_per_gpu_hour is not None:
        price = _checked(p, "price_per_gpu_hour", price_per_gpu_hour)
    if not isinstance(accounting, str) or accounting not in ACCOUNTINGS:
        p.append(Problem("accounting", accounting, f"must be one of {', '.join(ACCOUNTINGS)}"))

    # parameters on one GPU before ZeRO: the tensor-parallel share of the largest stage
    shard: int | None = None
    if n is not None and tp is not None and pp is not None:
        if tp == 1 and pp == 1:
            shard = n
        elif arch is not None and not p:
            stage_n = arch.stage_params(tp, pp)
            total_n = arch.n_params
            shard = stage_n if n == total_n else -(-n * stage_n // total_n)
    if shard is not None and dp is not None and dp > shard:
        if tp == 1 and pp == 1:
            p.append(Problem("gpus", gpus, f"must not exceed the parameter count ({n})"))
        else:
            p.append(
                Problem(
                    "gpus",
                    gpus,
                    f"gives a data-parallel size of {dp}, more than the parameters of one "
                    f"model-parallel shard ({shard})",
                )
            )

    if p:
        raise EstimateInputError(p)
    assert n is not None and prec is not None and opt is not None and ckpt is not None
    assert stage is not None and n_gpus is not None and mb is not None
    assert overhead is not None and util is not None
    assert tp is not None and pp is not None and dp is not None and shard is not None

    states = model_state_bytes(
        ModelStateQuery(
            shard, prec, opt, stage, dp, offload_optimizer, offload_params, fsdp=sharding or "off"
        ),
        accounting,
    )
    model_bytes = states.params_bytes + states.grads_bytes + states.optimizer_bytes

    breakdown: ActivationBreakdown | None = None
    act_bytes: int | None = None
    per_sample: int | None = None
    if arch is not None:
        breakdown = activation_breakdown(  # inputs checked above
            arch.layers,
            arch.hidden,
            arch.heads,
            arch.seq_len,
            mb,
            arch.vocab,
            ckpt,
            4 if prec is Precision.FP32 else 2,
            dropout,
            arch.ffn_hidden,
            arch.mlp,
            tp,
            sequence_parallel,
            pp,
            arch.parallel_residual,
        )
        act_bytes = breakdown.total_bytes
        per_sample = act_bytes // mb  # every term is linear in the micro-batch
        if act_bytes > MAX_BYTES_PER_GPU:
            field, value = ("micro_batch", mb) if mb > 1 else ("seq_len", arch.seq_len)
            raise EstimateInputError(
                [
                    Problem(
                        field,
                        value,
                        f"gives {act_bytes / GIB:.3g} GiB of activations per GPU, more than "
                        "2^30 GiB (a million GPUs' memory): lower `micro_batch` or `seq_len`",
                    )
                ]
            )
    total = model_bytes + (act_bytes or 0)
    overhead_bytes = math.ceil(overhead * GIB)

    gpu_mem = fits = max_mb = None
    if spec is not None:
        gpu_mem = spec.memory_bytes
        fits = total + overhead_bytes <= gpu_mem
        if per_sample:
            room = (gpu_mem - overhead_bytes - model_bytes) // per_sample
            max_mb = room if room >= 1 else None

    flops = seconds = cost = None
    if n_tokens is not None:
        flops = (8.0 if ckpt is Checkpointing.FULL else 6.0) * n * n_tokens
        if spec is not None:
            peak = spec.peak_flops(prec is not Precision.FP32, bf16=prec in _BF16)
            if peak is not None:
                seconds = flops / (n_gpus * peak * util)
                if price is not None:
                    cost = seconds / 3600.0 * n_gpus * price

    return MemoryEstimate(
        n_params=n,
        params_bytes=states.params_bytes,
        grads_bytes=states.grads_bytes,
        optimizer_bytes=states.optimizer_bytes,
        activation_bytes=act_bytes,
        total_bytes=total,
        overhead_bytes=overhead_bytes,
        cpu_offload_bytes=states.cpu_offload_bytes,
        gpu=spec.name if spec is not None else None,
        gpu_memory_bytes=gpu_mem,
        fits=fits,
        max_micro_batch=max_mb,
        train_flops=flops,
        train_seconds=seconds,
        cost=cost,
        activations=breakdown,
        precision=prec.value,
        optimizer=opt.value,
        zero_stage=stage,
        gpus=n_gpus,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        fsdp=sharding or "off",
        dropout=dropout,
        checkpointing=ckpt.value,
        micro_batch=mb,
        layers=arch.layers if arch else None,
        hidden=arch.hidden if arch else None,
        heads=arch.heads if arch else None,
        seq_len=arch.seq_len if arch else None,
        vocab=arch.vocab if arch else None,
        overhead_gib=overhead,
        tokens=n_tokens,
        mfu=util,
        price_per_gpu_hour=price,
        accounting=accounting,
        model=model_name,
        hf_config=config_name,
        kv_heads=arch.kv_heads if arch else None,
        ffn_hidden=arch.ffn_hidden if arch else None,
        mlp=arch.mlp if arch else None,
        norm=arch.norm if arch else None,
        bias=arch.bias if arch else None,
        positions=arch.positions if arch else None,
        tied_embeddings=arch.tied_embeddings if arch else None,
        parallel_residual=arch.parallel_residual if arch else None,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        sequence_parallel=sequence_parallel,
        data_parallel=dp,
        shard_params=shard,
    )


def compare_stages(**options: Any) -> tuple[MemoryEstimate, ...]:
    """Estimates for ZeRO stages 0, 1, 2 and 3 with the same other options.

    Offload options apply to the stages that support them: optimizer offload to stages
    1-3, parameter offload to stage 3; the other stages are estimated without them.
    """
    if "zero_stage" in options:
        raise EstimateInputError(
            [Problem("zero_stage", options["zero_stage"], "is set by compare_stages; leave it out")]
        )
    out = []
    for stage in range(4):
        opts = dict(options)
        if stage == 0 and as_bool(opts.get("offload_optimizer")) is True:
            opts["offload_optimizer"] = False
        if stage != 3 and as_bool(opts.get("offload_params")) is True:
            opts["offload_params"] = False
        out.append(estimate_memory(zero_stage=stage, **opts))
    return tuple(out)


#: DeepSpeed's 16-bit precisions -> the FSDP mixed-precision setting that computes alike.
_FSDP_PRECISION = {"fp16": "amp-fp16", "bf16": "amp-bf16"}


def compare_engines(**options: Any) -> tuple[MemoryEstimate, ...]:
    """ZeRO stages 0-3 (`compare_stages`) and PyTorch FSDP full_shard with the same other
    options: five estimates, side by side. FSDP keeps no 16-bit weight copy at rest, so
    DeepSpeed's "fp16"/"bf16" are compared with FSDP's "amp-fp16"/"amp-bf16"; ZeRO's
    optimizer offload has no FSDP counterpart and is left out of the FSDP estimate."""
    for name in ("zero_stage", "fsdp"):
        if name in options:
            raise EstimateInputError(
                [Problem(name, options[name], "is set by compare_engines; leave it out")]
            )
    fsdp = dict(options)
    precision = fsdp.get("precision", "fp32")
    if isinstance(precision, str):
        fsdp["precision"] = _FSDP_PRECISION.get(precision.strip().lower(), precision)
    fsdp["offload_optimizer"] = False
    if fsdp.get("accounting", "paper") != "paper":
        fsdp["accounting"] = "fsdp"
    return (*compare_stages(**options), estimate_memory(fsdp="full_shard", **fsdp))
