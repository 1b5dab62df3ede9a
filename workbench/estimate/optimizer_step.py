"""The optimizer step's share of the peak (`workbench.estimate.peak`): which implementation
runs (`resolve_impl`), what this GPU steps, and the temporaries the step allocates beyond
the optimizer's states (`optimizer_temporaries`; `peak`'s module docstring describes each
implementation's and where each was measured).

Pure Python: imports no torch.
"""

from __future__ import annotations

from workbench.config import OptimizerName, Precision
from workbench.estimate.inputs_check import EstimateInputs
from workbench.optimizers import OPTIMIZERS, factored_state_elements, row

#: Optimizers only DeepSpeed (or bitsandbytes, torchao) provides: always a fused kernel.
_FUSED_ONLY = frozenset(OptimizerName(r.name) for r in OPTIMIZERS if r.fused_only)


def resolve_impl(i: EstimateInputs, engine: str) -> str:
    """The optimizer implementation counted: `optimizer_impl`, or for "auto" the engine's
    ("fused" for DeepSpeed and for the optimizers that exist only as fused kernels, "cpu"
    under optimizer offload, torch's own default otherwise: "foreach", or the for-loop where
    the optimizer's row says so, as for Adafactor)."""
    if i.offload_optimizer or (engine == "fsdp" and i.offload_params):
        return "cpu"
    if i.optimizer in _FUSED_ONLY:
        return "fused"
    if i.optimizer_impl != "auto":
        return i.optimizer_impl
    if engine == "deepspeed" and row(i.optimizer).deepspeed_fused:
        return "fused"
    return row(i.optimizer).default_impl  # torch's own default: foreach, or its for-loop


def stepped_params(i: EstimateInputs, engine: str) -> int:
    """Parameters this GPU's optimizer steps: its shard under ZeRO >= 1 and FSDP."""
    full = i.shard_params
    if (engine == "fsdp" and i.fsdp != "no_shard") or i.zero_stage >= 1:
        return -(-full // i.data_parallel)
    return full


def parameter_order(i: EstimateInputs) -> list[int]:
    """The sizes of this GPU's parameter tensors in the order an optimizer steps them (a
    transformers decoder's: embedding, then per layer Q, K, V, output, the MLP's matrices
    and the two norms, then the final norm and an untied output projection); two layers
    stand for all, which is enough for neighbours. Empty without a shape."""
    arch = i.architecture
    if arch is None:
        return []
    t = i.tensor_parallel
    h, q, g = arch.hidden, arch.q_dim, arch.kv_dim
    rows = -(-arch.vocab // t)
    inner = (arch.moe_ffn_hidden or arch.ffn_hidden) if arch.is_moe else arch.ffn_hidden
    mlp = [h * inner // t] * (3 if arch.mlp == "swiglu" else 2)
    norm = arch.norm_params()
    layer = [h * q // t, h * g // t, h * g // t, q * h // t, *mlp, norm, norm]
    order = [rows * h, *([arch.max_positions * h] if arch.max_positions else [])]
    order += layer + layer + [norm]
    if not arch.tied_embeddings:
        order.append(rows * h)
    return order


def _loop_peak(sizes: list[int], previous: int, current: int) -> int:
    """The most elements a for-loop optimizer holds at once: `previous` tensors the size of
    the parameter before (its last temporary is still bound when the next is computed)
    and `current` the size of the one being stepped, over neighbouring pairs."""
    pairs = [previous * a + current * b for a, b in zip([0, *sizes], sizes, strict=False)]
    return max(pairs, default=0)


def optimizer_temporaries(i: EstimateInputs, engine: str, impl: str) -> int:
    """Bytes the optimizer step allocates beyond its states (see the module docstring)."""
    if impl in ("fused", "cpu"):
        return 0
    width = 2 if i.precision is Precision.BF16_TRUE else 4  # state dtype (master is fp32)
    stepped = stepped_params(i, engine)
    decay = i.weight_decay > 0
    temporaries = row(i.optimizer).temporaries(decay)  # its row's, with or without decay
    if temporaries is None:
        return 0
    copies, previous, current = temporaries.copies, temporaries.previous, temporaries.current
    if impl == "foreach":
        return copies * width * stepped
    sizes = parameter_order(i)
    if not sizes:  # no shape: the largest parameter may be the whole model
        return width * stepped * current
    share = stepped / i.shard_params if i.shard_params else 1.0  # sharded: each its share
    loop = width * min(copies * stepped, int(_loop_peak(sizes, previous, current) * share))
    return loop + factored_means(i, width)


def factored_means(i: EstimateInputs, width: int) -> int:
    """A factored optimizer's for-loop (`state_layout` "factored") also holds the row and
    column means of the parameter it steps and vectors the loop's variables still bind from
    earlier ones: at most twice the largest parameter's statistics (0 for other layouts or
    without the shapes)."""
    if row(i.optimizer).state_layout != "factored" or not i.parameter_shapes:
        return 0
    return 2 * width * max(factored_state_elements([s]) for s in i.parameter_shapes)


def in_backward_terms(i: EstimateInputs, impl: str, grads: int, temps: int) -> tuple[int, int]:
    """(the largest parameter's gradient, its own step's temporaries) under
    `optimizer_in_backward`: one optimizer per parameter, so foreach and the for-loop both
    step one tensor (the whole model's figures without a shape: an upper bound)."""
    sizes = parameter_order(i)
    if not sizes or not i.n_params:
        return grads, temps
    largest = max(sizes)
    share = largest / i.n_params
    return int(grads * share), int(temps * share) if impl == "foreach" else min(
        temps, int(optimizer_temporaries(i, "plain", "for-loop"))
    )


__all__ = [
    "factored_means",
    "in_backward_terms",
    "optimizer_temporaries",
    "parameter_order",
    "resolve_impl",
    "stepped_params",
]
