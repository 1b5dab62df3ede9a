"""Model-state bytes (parameters, gradients, optimizer states) per GPU: the accounting seam.

An *accounting* is one function `ModelStateQuery -> ModelStates`. This module implements
`"paper"`, the ZeRO paper's model (Rajbhandari et al. 2020, Section 3.1 and Figure 1):

    bytes per parameter    weights  grads  optimizer states (K)
    fp32                      4       4     adam/adamw 8, sgd 4, sgd-nomomentum 0, adam8bit 2
    amp-fp16, amp-bf16        4       4     same as fp32 (autocast keeps fp32 weights/grads)
    fp16, bf16                2       2     4 (fp32 master copy) + the fp32 states above
                                            (K = 12 for Adam, as in the paper)
    bf16-true (pure bf16)     2       2     the states above in bf16 (adam/adamw 4), no
                                            master copy (Lightning's "bf16-true")

A factored optimizer (Adafactor: its row's `state_layout`) keeps, for a parameter of 2+
dimensions, a row statistic (shape[:-1]) and a column statistic (shape[:-2] + shape[-1:])
in fp32, and a full one for a 1-dim parameter (`optimizer_state_bytes`, from the query's
`parameter_shapes`); without shapes its 4 bytes per parameter are counted, a bound.

`adam8bit` stores two 1-byte states per parameter (bitsandbytes-style; its small
per-block quantisation constants are ignored). DeepSpeed's Lamb, Lion, Adagrad and the
1-bit optimizers (1-bit Adam, 0/1 Adam, 1-bit Lamb, which also keep fp32 error-feedback
buffers, `error_feedback_bytes`) are in `OPTIMIZER_STATE_BYTES`; docs/estimator.md gives
the DeepSpeed source of each figure.

ZeRO over N data-parallel GPUs: stage 1 shards the optimizer column, stage 2 also the
gradients, stage 3 also the parameters. Rounding: a sharded column holds
`ceil(n_params / N)` parameters on every GPU (the last shard is padded, as real
partitioning does), so bytes are never under-counted.

Offload (ZeRO-Offload, Ren et al. 2021): optimizer offload (stages 1-3) moves the
gradient and optimizer-state columns of this GPU to host memory, where the optimizer step
runs; the GPU keeps its 16-bit (or fp32) parameters. Parameter offload (stage 3) moves
the parameter shard too. Moved bytes are reported in `cpu_offload_bytes`, per GPU (a node
with 8 GPUs holds 8 times that). Transient GPU buffers (communication buckets, the
gathered layer under stage 3) are not counted; DeepSpeed's own estimator adds 4 bytes x
the largest layer's parameters for stage 3.

Adding an accounting (for example DeepSpeed's real buffer layout): write a function
`model_states(query: ModelStateQuery) -> ModelStates` in a new module and add ONE line
to `ACCOUNTINGS` below, e.g. `"deepspeed": "workbench.estimate.deepspeed_layout:model_states"`.
The module is imported only when that accounting is asked for. Validation of the
inputs happens before the function is called (`estimate_memory` does it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from workbench.config import OptimizerName, Precision
from workbench.inputs import shown
from workbench.optimizers import OPTIMIZERS, factored_state_elements, row

# name -> "module:function". The function takes a ModelStateQuery, returns ModelStates.
ACCOUNTINGS: dict[str, str] = {
    "paper": "workbench.estimate.model_states:paper_model_states",
    "deepspeed": "workbench.estimate.deepspeed_layout:model_states",
    "fsdp": "workbench.estimate.fsdp_layout:model_states",
}

#: PyTorch FSDP's sharding modes (`estimate_memory(fsdp=...)`; "off": ZeRO or nothing).
FSDP_MODES = ("off", "full_shard", "shard_grad_op", "no_shard")

#: fp32 optimizer-state bytes per parameter, without any master copy (each optimizer's
#: row: `workbench.optimizers`; docs/estimator.md names the source of each figure).
OPTIMIZER_STATE_BYTES: dict[OptimizerName, int] = {
    OptimizerName(r.name): r.state_bytes_per_param for r in OPTIMIZERS
}

#: 1-bit optimizers' error feedback: an fp32 `worker_error` of the parameters and an fp32
#: `server_error` of 1/N of them, on each of N data-parallel GPUs.
ERROR_FEEDBACK_OPTIMIZERS = frozenset(OptimizerName(r.name) for r in OPTIMIZERS if r.error_feedback)


def error_feedback_bytes(optimizer: OptimizerName | str, elements: int, gpus: int) -> int:
    """Bytes of a 1-bit optimizer's error-feedback buffers for `elements` parameters on one
    of `gpus` GPUs (0 for other optimizers): 4·Ψ + 4·ceil(Ψ/N). DeepSpeed pads each
    tensor (1-bit Lamb: the flat buffer) to a multiple of N·lcm(N, 8) elements first; the
    estimator, which knows only Ψ, leaves that padding out."""
    if OptimizerName(optimizer) not in ERROR_FEEDBACK_OPTIMIZERS:
        return 0
    return 4 * elements + 4 * -(-elements // gpus)


#: (weight bytes, gradient bytes, master-copy bytes) per parameter.
PRECISION_BYTES: dict[Precision, tuple[int, int, int]] = {
    Precision.FP32: (4, 4, 0),
    Precision.AMP_FP16: (4, 4, 0),
    Precision.AMP_BF16: (4, 4, 0),
    Precision.FP16: (2, 2, 4),
    Precision.BF16: (2, 2, 4),
    Precision.BF16_TRUE: (2, 2, 0),  # pure bf16: no fp32 copy; states in bf16 (below)
}


def state_bytes(precision: Precision, optimizer: OptimizerName) -> int:
    """Optimizer-state bytes per parameter without a master copy: `OPTIMIZER_STATE_BYTES`
    (fp32 states), halved under pure bf16 ("bf16-true": the optimizer keeps its states in
    the parameters' dtype, as torch's optimizers do); 8-bit states stay 8-bit."""
    k = OPTIMIZER_STATE_BYTES[optimizer]
    if precision is Precision.BF16_TRUE and not optimizer.is_8bit:
        return k // 2
    return k


@dataclass(frozen=True)
class ModelStateQuery:
    """Validated inputs of an accounting function."""

    n_params: int
    precision: Precision
    optimizer: OptimizerName
    zero_stage: int
    gpus: int
    offload_optimizer: bool
    offload_params: bool
    fsdp: str = "off"  # an FSDP_MODES value; "off" means ZeRO (`zero_stage`) or nothing
    #: the trained parameters' shapes (a factored optimizer's states follow them; None:
    #: not known, its 1-dim bound per parameter is counted)
    parameter_shapes: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class ModelStates:
    """Per-GPU bytes of the model states, and the per-GPU bytes kept in host memory."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    cpu_offload_bytes: int


@dataclass(frozen=True)
class BytesPerParam:
    """Bytes per parameter before sharding; `optimizer` includes any fp32 master copy."""

    weights: int
    grads: int
    optimizer: int


def bytes_per_param(precision: Precision | str, optimizer: OptimizerName | str) -> BytesPerParam:
    """The one place where the paper accounting's per-parameter bytes are decided.

    Unknown names raise `ValueError` listing the allowed ones.
    """
    problems: list[str] = []
    if not isinstance(precision, str) or precision not in PRECISION_BYTES:
        allowed = ", ".join(p.value for p in PRECISION_BYTES)
        problems.append(f"precision={shown(precision)}: must be one of {allowed}")
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZER_STATE_BYTES:
        allowed = ", ".join(o.value for o in OPTIMIZER_STATE_BYTES)
        problems.append(f"optimizer={shown(optimizer)}: must be one of {allowed}")
    if problems:
        raise ValueError("; ".join(problems))
    weights, grads, master = PRECISION_BYTES[Precision(precision)]
    return BytesPerParam(
        weights, grads, master + state_bytes(Precision(precision), OptimizerName(optimizer))
    )


def optimizer_state_bytes(q: ModelStateQuery, held: int, shards: int) -> int:
    """The optimizer's state bytes (no master copy) for `held` parameters on one GPU, the
    model split over `shards` ranks: `state_bytes` per parameter for an elementwise layout;
    for a factored one (its row's `state_layout`) the row and column statistics of
    `q.parameter_shapes`, each split along its first dimension (`factored_state_elements`),
    or, without shapes, the 1-dim bound `state_bytes` x `held`."""
    per = state_bytes(q.precision, q.optimizer)
    if row(q.optimizer).state_layout != "factored" or q.parameter_shapes is None:
        return per * held
    width = 2 if q.precision is Precision.BF16_TRUE else 4
    return width * factored_state_elements(q.parameter_shapes, shards)


def _shard(n_params: int, gpus: int) -> int:
    return -(-n_params // gpus)  # ceil division: never under-count


def paper_model_states(q: ModelStateQuery) -> ModelStates:
    """ZeRO-paper accounting (see the module docstring); `bytes_per_param`'s figures, read
    from the tables directly (the query is checked)."""
    weights, grads_per, master = PRECISION_BYTES[q.precision]
    shard = _shard(q.n_params, q.gpus)
    full = q.n_params
    params = weights * (shard if q.zero_stage >= 3 else full)
    grads = grads_per * (shard if q.zero_stage >= 2 else full)
    held = shard if q.zero_stage >= 1 else full  # parameters whose optimizer state it holds
    states = optimizer_state_bytes(q, held, q.gpus if q.zero_stage >= 1 else 1)
    optim = master * held + states + error_feedback_bytes(q.optimizer, held, q.gpus)
    cpu = 0
    if q.offload_optimizer:
        cpu += grads + optim
        grads = optim = 0
    if q.offload_params:
        cpu += params
        params = 0
    return ModelStates(params, grads, optim, cpu)


_RESOLVED: dict[str, Callable[[ModelStateQuery], ModelStates]] = {}


def accounting_function(name: str) -> Callable[[ModelStateQuery], ModelStates]:
    """The function registered as `name` in `ACCOUNTINGS` (imported on first use).

    An unregistered name raises `ValueError` listing the registered ones.
    """
    fn = _RESOLVED.get(name)
    if fn is None and (not isinstance(name, str) or name not in ACCOUNTINGS):
        raise ValueError(f"accounting={shown(name)}: must be one of {', '.join(ACCOUNTINGS)}")
    if fn is None:
        if name == "paper":
            fn = paper_model_states
        else:
            module, _, attr = ACCOUNTINGS[name].partition(":")
            fn = getattr(importlib.import_module(module), attr)
        _RESOLVED[name] = fn
    return fn


def model_state_bytes(q: ModelStateQuery, accounting: str = "paper") -> ModelStates:
    """Model-state bytes per GPU under `accounting` (a key of `ACCOUNTINGS`). A query built
    by hand with a precision or optimizer the tables do not know is a ValueError naming it."""
    fn = accounting_function(accounting)
    problems = []
    if q.precision not in PRECISION_BYTES:
        problems.append(
            f"precision={shown(q.precision)}: must be one of "
            + ", ".join(str(p) for p in PRECISION_BYTES)
        )
    if q.optimizer not in OPTIMIZER_STATE_BYTES:
        problems.append(
            f"optimizer={shown(q.optimizer)}: must be one of "
            + ", ".join(str(o) for o in OPTIMIZER_STATE_BYTES)
        )
    if problems:
        raise ValueError("; ".join(problems))
    return fn(q)
