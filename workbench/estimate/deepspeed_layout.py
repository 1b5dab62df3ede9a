"""`accounting="deepspeed"`: model-state bytes per rank as DeepSpeed's engine lays them out.

The ZeRO paper's accounting (`workbench.estimate.model_states.paper_model_states`, the
default) counts ideal shards. DeepSpeed 0.16-0.19's engine, as the workbench configures
it (`workbench.train.backends.deepspeed.engine_config`), differs in four ways, measured per rank from
each rank's own tensors on 2 CPU ranks (docs/deepspeed.md lists the figures):

1. ZeRO 1 and 2 keep an fp32 master partition even in fp32 training
   (`single_partition_of_fp32_groups`): optimizer bytes are (4 + K)·P, not K·P, e.g.
   12Ψ/N for Adam instead of the paper's 8Ψ/N. (16-bit training has the master copy in
   both accountings.)
2. Stage 0 with DeepSpeed's 16-bit modes (fp16/bf16) keeps one flat fp32 master copy of
   the whole model, not sharded: optimizer (4 + K)·Ψ.
3. Stage 3 gradients are this rank's partition plus one reduce bucket of
   min(reduce_bucket_size, Ψ) elements in the gradient dtype. The workbench caps the
   bucket at the model's size rounded up to a multiple of 64 (DeepSpeed's default is
   5e8 elements), so for small models the bucket is about one full gradient copy.
4. Padding: ZeRO 1/2 flatten the parameters into one buffer padded to a multiple of
   2·N elements (`nccl_start_alignment_factor` = 2) and cut it into N equal partitions
   P = ceil(Ψ / 2N)·2; stage 3 partitions every tensor on its own into ceil(numel/N)
   elements. Without per-tensor sizes this accounting uses ceil(Ψ/N), which
   under-counts by fewer than one element per parameter tensor per rank.

Per rank, with W = 2 bytes for fp16/bf16 and 4 otherwise (gradients have the weights'
dtype), K = fp32 optimizer-state bytes per parameter (adam/adamw 8, sgd 4,
sgd-nomomentum 0, adam8bit 2; DeepSpeed's other optimizers in docs/estimator.md, with
DeepSpeedCPULion's extra 4 under offload and the 1-bit optimizers' error-feedback
buffers added to the optimizer column), A = ceil(Ψ/2N)·2N, P = A/N, P3 = ceil(Ψ/N),
B = roundup64(min(5e8, Ψ)):

    stage  params   grads          optimizer
    0      W·Ψ      W·Ψ            K·Ψ (fp32/amp)   or (4+K)·Ψ (fp16/bf16)
    1      W·A      W·P            (4+K)·P
    2      W·A      W·P            (4+K)·P
    3      W·P3     W·P3 + W·B     (4+K)·P3

Offload: optimizer offload (stages 1-3) moves the gradient partition and the optimizer
column to host memory (`cpu_offload_bytes`); the stage-3 reduce bucket stays on the
device. Parameter offload (stage 3) moves the parameter partition. The figures are the
tensors alive at the optimizer step (what `DeepSpeedBackend.model_state_bytes()` counts);
buffers that live only during backward are not counted, as in the paper's accounting.

Pure Python: imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config import OptimizerName, Precision
from workbench.estimate.model_states import (
    OPTIMIZER_STATE_BYTES,
    ModelStateQuery,
    ModelStates,
    error_feedback_bytes,
    optimizer_state_bytes,
)
from workbench.inputs import shown
from workbench.optimizers import row

#: DeepSpeed's `nccl_start_alignment_factor`: ZeRO 1/2 flat buffers are padded to a
#: multiple of this times the data-parallel size (elements).
ALIGNMENT_FACTOR = 2
#: DeepSpeed's default `reduce_bucket_size` (elements).
DEFAULT_BUCKET_ELEMENTS = 500_000_000
#: The workbench rounds its bucket sizes up to a multiple of this (elements).
BUCKET_ROUNDING = 64
#: fp32 master-copy bytes per parameter.
MASTER_BYTES = 4
#: Extra fp32 bytes per parameter of the CPU optimizer DeepSpeed builds under optimizer
#: offload: DeepSpeedCPULion also allocates an `exp_avg_sq` that Lion never reads.
CPU_OPTIMIZER_EXTRA_BYTES = {OptimizerName.LION: 4}

_SIXTEEN_BIT = (Precision.FP16, Precision.BF16)


@dataclass(frozen=True)
class DeepSpeedLayout:
    """The element counts behind one rank's figures (see the module docstring)."""

    n_params: int
    gpus: int
    zero_stage: int
    aligned_elements: int  # A: the ZeRO 1/2 flat buffer (Ψ padded to 2N)
    partition_elements: int  # this rank's partition: P (stages 1/2), P3 (stage 3), Ψ (0)
    bucket_elements: int  # the stage-3 reduce bucket B (0 for other stages)
    weight_bytes: int  # W: bytes per weight and per gradient element
    optimizer_bytes_per_param: int  # K (+4 for the fp32 master where DeepSpeed keeps one)
    states: ModelStates


def bucket_elements(n_params: int, bucket_size: int = DEFAULT_BUCKET_ELEMENTS) -> int:
    """The reduce bucket the workbench gives DeepSpeed: min(bucket_size, Ψ) rounded up
    to a multiple of 64 elements."""
    _check_positive("n_params", n_params)
    _check_positive("bucket_size", bucket_size)
    n = min(bucket_size, n_params)
    return -(-n // BUCKET_ROUNDING) * BUCKET_ROUNDING


def deepspeed_layout(q: ModelStateQuery) -> DeepSpeedLayout:
    """Element counts and per-rank bytes of `q` under DeepSpeed's layout."""
    _check_positive("n_params", q.n_params)
    _check_positive("gpus", q.gpus)
    if q.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={shown(q.zero_stage)}: must be 0, 1, 2 or 3")
    precision = Precision(q.precision)
    k = OPTIMIZER_STATE_BYTES[OptimizerName(q.optimizer)]
    w = 2 if precision in _SIXTEEN_BIT else 4
    n, gpus = q.n_params, q.gpus
    align = ALIGNMENT_FACTOR * gpus
    aligned = -(-n // align) * align
    bucket = 0
    if q.zero_stage == 0:
        part = n
        opt_per = k + (MASTER_BYTES if precision in _SIXTEEN_BIT else 0)
        params, grads = w * n, w * n
    elif q.zero_stage in (1, 2):
        part = aligned // gpus
        opt_per = k + MASTER_BYTES
        params, grads = w * aligned, w * part
    else:
        part = -(-n // gpus)
        opt_per = k + MASTER_BYTES
        bucket = bucket_elements(n)
        params, grads = w * part, w * part
    if q.offload_optimizer:
        opt_per += CPU_OPTIMIZER_EXTRA_BYTES.get(OptimizerName(q.optimizer), 0)
    optim = opt_per * part + error_feedback_bytes(q.optimizer, part, gpus)
    if row(q.optimizer).state_layout == "factored":  # its statistics, not k per parameter
        factored = optimizer_state_bytes(q, part, gpus if q.zero_stage >= 1 else 1)
        optim += factored - k * part
    cpu = 0
    if q.offload_optimizer:
        cpu += grads + optim
        grads, optim = 0, 0
    if q.zero_stage == 3:
        grads += w * bucket  # the reduce bucket lives on the device
    if q.offload_params:
        cpu += params
        params = 0
    return DeepSpeedLayout(
        n_params=n,
        gpus=gpus,
        zero_stage=q.zero_stage,
        aligned_elements=aligned,
        partition_elements=part,
        bucket_elements=bucket,
        weight_bytes=w,
        optimizer_bytes_per_param=opt_per,
        states=ModelStates(params, grads, optim, cpu),
    )


def model_states(q: ModelStateQuery) -> ModelStates:
    """The `"deepspeed"` accounting registered in `ACCOUNTINGS`."""
    return deepspeed_layout(q).states


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={shown(value)}: must be an integer >= 1")
