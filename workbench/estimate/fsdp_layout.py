"""The "fsdp" accounting: model states as PyTorch FSDP2 (`fully_shard`) holds them.

At the optimizer step FSDP2 keeps every parameter sharded over the N data-parallel ranks
in its original dtype (fp32 here: the model is built in fp32; bf16 under "bf16-true",
where the states are bf16 too and K is halved), its gradient sharded in
the same dtype, and the optimizer states of that shard; there is no master copy, since
the sharded parameter is already fp32. Mixed precision (`MixedPrecisionPolicy`) only
changes the copies gathered for compute. So per rank, with K optimizer-state bytes per
parameter (Adam: 8):

    full_shard, shard_grad_op   params 4·ceil(Ψ/N)   grads 4·ceil(Ψ/N)   optimizer K·ceil(Ψ/N)
    no_shard (replicated)       params 4·Ψ           grads 4·Ψ           optimizer K·Ψ

The modes differ in what is gathered while a step runs, not at rest: full_shard gathers
one block's parameters at a time (in the compute dtype) and frees them after its forward
and backward; shard_grad_op keeps every block gathered from its forward to its backward
(up to Ψ parameters in the compute dtype at the peak of a step). That working set, like
the communication buffers, is not a model state and is not counted here.

`offload_params` (full_shard): sharded parameters, gradients and optimizer states live in
host memory (`CPUOffloadPolicy`), reported in `cpu_offload_bytes`.

FSDP2 shards each tensor along its first dimension and pads it to a multiple of N rows;
the estimator, knowing only Ψ, uses ceil(Ψ/N) (measured per rank: docs/deepspeed.md,
"FSDP next to ZeRO").
"""

from __future__ import annotations

from workbench.config import Precision
from workbench.estimate.model_states import (
    ModelStateQuery,
    ModelStates,
    error_feedback_bytes,
    optimizer_state_bytes,
)

FP32 = 4


def model_states(q: ModelStateQuery) -> ModelStates:
    """FSDP2's model states per rank (see the module docstring)."""
    held = q.n_params if q.fsdp == "no_shard" else -(-q.n_params // q.gpus)
    width = 2 if q.precision is Precision.BF16_TRUE else FP32  # the dtype the model is built in
    params = width * held
    grads = width * held
    shards = 1 if q.fsdp == "no_shard" else q.gpus
    optim = optimizer_state_bytes(q, held, shards) + error_feedback_bytes(q.optimizer, held, q.gpus)
    if q.offload_params:
        return ModelStates(0, 0, 0, params + grads + optim)
    return ModelStates(params, grads, optim, 0)
