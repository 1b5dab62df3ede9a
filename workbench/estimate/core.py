"""`estimate_memory`: per-GPU training memory, compute time and cost (pure Python).

Accounting and formulas are described in `model_states` (parameters, gradients,
optimizer states, ZeRO, offload), `activations` (Korthikanti et al. 2022) and `catalog`
(GPU data sheets); docs/estimator.md collects them and compares them with DeepSpeed's
and accelerate's estimators.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from workbench.config import OptimizerName, Precision
from workbench.estimate.activations import (
    ActivationBreakdown,
    Checkpointing,
    params_from_shape,
    transformer_activation_bytes,
)
from workbench.estimate.catalog import GpuSpec, find_gpu
from workbench.estimate.model_states import ACCOUNTINGS, ModelStateQuery, model_state_bytes

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
_BACKTICK = re.compile(r"`(\w+)`")


@dataclass(frozen=True)
class Problem:
    """One invalid input: the field, the value given and what is allowed.

    Other fields are named in `message` between backticks, so a front end can show its
    own names for them (the CLI shows flags); `str()` shows the Python names.
    """

    field: str
    value: Any
    message: str
    missing: bool = False

    def render(
        self, name: Callable[[str], str] = str, value_text: str | None = None, sep: str = "="
    ) -> str:
        """`field=value: message`, with `name` mapping field names (the CLI passes one that
        gives flags), `value_text` replacing `repr(value)` and `sep` the `=`."""
        msg = _BACKTICK.sub(lambda m: name(m.group(1)), self.message)
        if self.missing:
            return f"{name(self.field)} is missing: {msg}"
        shown = repr(self.value) if value_text is None else value_text
        return f"{name(self.field)}{sep}{shown}: {msg}"

    def __str__(self) -> str:
        return self.render()


class EstimateInputError(ValueError):
    """`ValueError` listing every invalid input at once; `.problems` holds them."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        if len(problems) == 1:
            text = f"invalid estimate input: {problems[0]}"
        else:
            text = f"{len(problems)} invalid estimate inputs:\n" + "\n".join(
                f"  - {p}" for p in problems
            )
        super().__init__(text)


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes of one training setup, plus compute figures and the inputs echoed.

    `total_bytes = params_bytes + grads_bytes + optimizer_bytes + activation_bytes`, with
    `activation_bytes` None (counted as 0 in the total) when no transformer shape was
    given. `overhead_bytes` (framework overhead) is kept out of `total_bytes`; `fits` is
    `total_bytes + overhead_bytes <= gpu_memory_bytes`. `cpu_offload_bytes` is host
    memory per GPU. GPU fields are None when no GPU was named; `max_micro_batch` is also
    None without a shape or when not even a micro-batch of 1 fits. Compute fields are
    None when not asked for (`tokens`), `train_seconds` also without a GPU, `cost` also
    without a price.
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


# ---------------------------------------------------------------- validation helpers
def _int_like(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _whole_number(v: Any) -> int | None:
    """An int, or a float/str-free number with an integral finite value (7.5e9)."""
    i = _int_like(v)
    if i is not None:
        return i
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        i = _int_like(v)
        return float(i) if i is not None else None
    f = float(v)
    return f if math.isfinite(f) else None


def _choice(v: Any, table: dict[str, Any]) -> Any:
    if isinstance(v, str):
        return table.get(v.strip().lower())
    return None


# ---------------------------------------------------------------- the estimator
def estimate_memory(
    *,
    n_params: int | float | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    micro_batch: int = 1,
    precision: Precision | str = "fp32",
    optimizer: OptimizerName | str = "adamw",
    zero_stage: int = 0,
    gpus: int = 1,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    checkpointing: Checkpointing | str = "none",
    gpu: str | None = None,
    overhead_gib: float = DEFAULT_OVERHEAD_GIB,
    tokens: float | None = None,
    mfu: float = DEFAULT_MFU,
    price_per_gpu_hour: float | None = None,
    accounting: str = "paper",
) -> MemoryEstimate:
    """Per-GPU memory of training a model, and optionally its compute time and cost.

    Give `n_params`, or a full decoder-only transformer shape (`layers`, `hidden`,
    `heads`, `seq_len`, `vocab`) from which the parameter count is derived (tied
    embeddings) and activations are estimated; with both, `n_params` counts the model
    states and the shape the activations. `gpus` is the data-parallel size N.
    `accounting` picks how model-state bytes are counted (a key of
    `workbench.estimate.model_states.ACCOUNTINGS`; "paper" is the ZeRO paper's model).

    Raises `EstimateInputError` (a `ValueError`) listing every invalid input at once.
    """
    p: list[Problem] = []

    n = None
    if n_params is not None:
        n = _whole_number(n_params)
        if n is None or n < 1:
            p.append(Problem("n_params", n_params, "must be a whole number >= 1 (e.g. 7.5e9)"))
            n = None

    raw = {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq_len, "vocab": vocab}
    shape: dict[str, int | None] = {}
    for name, value in raw.items():
        if value is None:
            shape[name] = None
            continue
        iv = _int_like(value)
        if iv is None or iv < 1:
            p.append(Problem(name, value, "must be an integer >= 1"))
            iv = None
        shape[name] = iv
    given = [k for k, v in raw.items() if v is not None]
    has_shape = len(given) == len(SHAPE_FIELDS)
    if given and not has_shape:
        missing = [k for k in SHAPE_FIELDS if k not in given]
        need = ", ".join(f"`{k}`" for k in SHAPE_FIELDS)
        also = f" (also missing: {', '.join(f'`{k}`' for k in missing[1:])})" if missing[1:] else ""
        p.append(
            Problem(
                missing[0], None, f"a transformer shape needs all of {need}{also}", missing=True
            )
        )
    if not given and n_params is None:
        p.append(
            Problem(
                "n_params",
                None,
                "give `n_params` or a transformer shape (`layers`, `hidden`, `heads`, "
                "`seq_len`, `vocab`)",
                missing=True,
            )
        )
    h, a = shape.get("hidden"), shape.get("heads")
    if h is not None and a is not None and h % a != 0:
        p.append(Problem("heads", heads, f"must divide `hidden`={h} evenly"))

    mb = _int_like(micro_batch)
    if mb is None or mb < 1:
        p.append(Problem("micro_batch", micro_batch, "must be an integer >= 1"))
        mb = None

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

    stage = _int_like(zero_stage)
    if stage is None or not 0 <= stage <= 3:
        p.append(Problem("zero_stage", zero_stage, "must be 0, 1, 2 or 3"))
        stage = None
    n_gpus = _int_like(gpus)
    if n_gpus is None or n_gpus < 1:
        p.append(Problem("gpus", gpus, "must be an integer >= 1"))
        n_gpus = None

    for name, flag in (
        ("offload_optimizer", offload_optimizer),
        ("offload_params", offload_params),
    ):
        if not isinstance(flag, bool):
            p.append(Problem(name, flag, "must be True or False"))
    if stage is not None:
        if offload_optimizer is True and stage == 0:
            p.append(Problem("offload_optimizer", True, "needs `zero_stage` 1, 2 or 3 (got 0)"))
        if offload_params is True and stage != 3:
            p.append(Problem("offload_params", True, f"needs `zero_stage` 3 (got {stage})"))

    spec: GpuSpec | None = None
    if gpu is not None:
        found = find_gpu(gpu)
        if isinstance(found, str):
            p.append(Problem("gpu", gpu, found))
        else:
            spec = found

    overhead = _finite(overhead_gib)
    if overhead is None or overhead < 0:
        p.append(Problem("overhead_gib", overhead_gib, "must be a finite number >= 0"))
    n_tokens = None
    if tokens is not None:
        n_tokens = _finite(tokens)
        if n_tokens is None or n_tokens <= 0:
            p.append(Problem("tokens", tokens, "must be a finite number > 0"))
    util = _finite(mfu)
    if util is None or not 0 < util <= 1:
        p.append(Problem("mfu", mfu, "must be a finite number > 0 and <= 1"))
    price = None
    if price_per_gpu_hour is not None:
        price = _finite(price_per_gpu_hour)
        if price is None or price < 0:
            p.append(
                Problem("price_per_gpu_hour", price_per_gpu_hour, "must be a finite number >= 0")
            )
    if not isinstance(accounting, str) or accounting not in ACCOUNTINGS:
        p.append(Problem("accounting", accounting, f"must be one of {', '.join(ACCOUNTINGS)}"))

    dims: tuple[int, int, int, int, int] | None = None
    if has_shape:
        L, H, A, S, V = (shape[k] for k in SHAPE_FIELDS)
        if L is not None and H is not None and A is not None and S is not None and V is not None:
            dims = (L, H, A, S, V)
    if n is None and dims is not None:
        n = params_from_shape(layers=dims[0], hidden=dims[1], seq_len=dims[3], vocab=dims[4])
    if n is not None and n_gpus is not None and n_gpus > n:
        p.append(Problem("gpus", gpus, f"must not exceed the parameter count ({n})"))

    if p:
        raise EstimateInputError(p)
    assert n is not None and prec is not None and opt is not None and ckpt is not None
    assert stage is not None and n_gpus is not None and mb is not None
    assert overhead is not None and util is not None

    states = model_state_bytes(
        ModelStateQuery(n, prec, opt, stage, n_gpus, offload_optimizer, offload_params),
        accounting,
    )
    model_bytes = states.params_bytes + states.grads_bytes + states.optimizer_bytes

    breakdown: ActivationBreakdown | None = None
    act_bytes: int | None = None
    per_sample: int | None = None
    if dims is not None:
        breakdown = transformer_activation_bytes(
            layers=dims[0],
            hidden=dims[1],
            heads=dims[2],
            seq_len=dims[3],
            vocab=dims[4],
            micro_batch=mb,
            checkpointing=ckpt,
            activation_bytes_per_element=4 if prec is Precision.FP32 else 2,
        )
        act_bytes = breakdown.total_bytes
        per_sample = act_bytes // mb  # every term is linear in the micro-batch
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
        checkpointing=ckpt.value,
        micro_batch=mb,
        layers=shape.get("layers"),
        hidden=shape.get("hidden"),
        heads=shape.get("heads"),
        seq_len=shape.get("seq_len"),
        vocab=shape.get("vocab"),
        overhead_gib=overhead,
        tokens=n_tokens,
        mfu=util,
        price_per_gpu_hour=price,
        accounting=accounting,
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
        if stage == 0 and opts.get("offload_optimizer") is True:
            opts["offload_optimizer"] = False
        if stage != 3 and opts.get("offload_params") is True:
            opts["offload_params"] = False
        out.append(estimate_memory(zero_stage=stage, **opts))
    return tuple(out)
