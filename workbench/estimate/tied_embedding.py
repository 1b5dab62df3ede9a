"""A tied embedding's gradient sum: the instant of the step at the embedding's backward.

A model whose output projection is its token embedding (GPT-2, `tie_word_embeddings`)
gets the one vocab x hidden weight's gradient from two places: the output projection's
matmul, early in backward, and the embedding lookup's backward (`embedding_dense_backward`,
a whole vocab x hidden gradient), the last operator of backward. Autograd's engine holds
the first in the weight's input buffer until the second comes and adds the two before
`AccumulateGrad` (torch/csrc/autograd/input_buffer.cpp, `accumulate`): in place into the
first when it holds that tensor alone and it is no view, else into a new tensor while both
are alive. So at the embedding's backward, after every layer's backward and before the
engine's final reduce, the step holds beside every other gradient

* three vocab x hidden tensors (the projection's gradient, the lookup's and their sum)
  where the projection's gradient reaches the weight as the transpose of its matmul's
  output (`TBackward0`, a view): fp32, pure 16-bit (bf16-true, DeepSpeed's bf16/fp16 at
  ZeRO 0-2) and FSDP, whose `MixedPrecisionPolicy` runs no autocast;
* two where it is a new tensor: under autocast (amp-bf16, amp-fp16 outside FSDP) the fp32
  copy of the 16-bit matmul's gradient (`ToCopyBackward0`), and under ZeRO-3 the weight
  gradient DeepSpeed's own linear function computes (`LinearFunctionForZeroStage3`).

In the gradient's dtype as autograd makes it: the weights' (4 bytes under amp-*, whose
weights are fp32) or, under FSDP, the compute dtype of the gathered weight; the rows of
this GPU's vocabulary share (ceil(v / t)). Where the weight's `.grad` lives on from one
micro-batch to the next (the plain loop, DDP, DeepSpeed's ZeRO-0 and ZeRO-1, which reduce
at the accumulation boundary) it holds, with accumulation, the earlier micro-batches' sum:
one more. The peak's other terms count one of them where the gradient stays in `.grad`
(the plain loop, DDP, ZeRO-0 and ZeRO-1 without `overlap_comm`: "gradients", with ZeRO-1's
whole gradients) or in the root unit's unsharded gradients (FSDP); none where the hooks
move gradients into DeepSpeed's buckets or partition (ZeRO-1 with `overlap_comm`, ZeRO
2/3) or each is stepped and freed as it is made (`optimizer_in_backward`). The term
(`TIED_SUM_TERM`) is the others:

    engine                                   fp32, pure 16-bit   amp-*   + accumulation
    plain, DDP, ZeRO-0, ZeRO-1               2                   1       + 1
    ZeRO-1 with overlap_comm                 3                   2       + 1
    ZeRO-2                                   3                   2
    ZeRO-3                                   2                   2
    FSDP (no autocast: its policy)           2                   2
    optimizer_in_backward                    3                   2

vocab x hidden tensors. Measured by the dry run on GPT-2 124M's vocabulary and width
(50257 x 768) at 1 x 128 tokens on every row (its fake tensors sum as a real step does,
`workbench.train.dry_run.accumulation`): the formula's moment within 0.02% of the dry
run's instant (tests/integration/test_tied_embedding.py); and with real tensors and no
dispatch mode on this CPU (torch's profiler's memory timeline of one GPT-2 backward: three
fp32 tensors above the other gradients in fp32, two under autocast, the same with the
earlier micro-batch's `.grad` held).

None with pipeline parallelism (the embedding and the output projection are on different
stages, their copies synchronised apart), LoRA (the embedding is frozen) or an untied or
unknown shape. Pure Python: imports no torch.
"""

from __future__ import annotations

from workbench.config import Precision
from workbench.estimate.inputs_check import EstimateInputs

#: The peak's term at the embedding's backward (`tied_sum_bytes`).
TIED_SUM_TERM = "tied embedding gradient sum"
#: The instant of backward that holds it (`StepPeak.moments`).
EMBEDDING_MOMENT = "embedding's backward"

_AUTOCAST = (Precision.AMP_BF16, Precision.AMP_FP16)


def tied_sum_bytes(i: EstimateInputs, engine: str, width: int) -> int:
    """The bytes `TIED_SUM_TERM` counts at the embedding's backward of checked inputs `i`
    trained by `engine`, whose tied weight's gradient has `width` bytes an element as
    autograd makes it (module docstring); 0 where the model has no tied embedding that
    trains on this stage."""
    arch = i.architecture
    if arch is None or not arch.tied_embeddings or i.pipeline_parallel > 1 or i.lora is not None:
        return 0
    rows = -(-arch.vocab // i.tensor_parallel)
    zero3 = engine == "deepspeed" and i.zero_stage >= 3
    fresh = zero3 or (i.precision in _AUTOCAST and engine != "fsdp")
    alive = (2 if fresh else 3) + _held(i, engine)
    return (alive - _counted(i, engine)) * width * rows * arch.hidden


def _keeps_grad(i: EstimateInputs, engine: str) -> bool:
    """Whether the weight's gradient stays in its `.grad` from one micro-batch to the next
    (the plain loop, DDP, DeepSpeed's ZeRO-0 and ZeRO-1, which reduces at the accumulation
    boundary only, `overlap_comm` or not)."""
    return engine in ("plain", "ddp") or (engine == "deepspeed" and i.zero_stage <= 1)


def _held(i: EstimateInputs, engine: str) -> int:
    """1 where the weight's `.grad` holds the earlier micro-batches' sum at the instant."""
    held = i.grad_accum > 1 and not i.optimizer_in_backward and _keeps_grad(i, engine)
    return 1 if held else 0


def _counted(i: EstimateInputs, engine: str) -> int:
    """How many of the tensors alive the end of backward's gradient terms count already:
    the weight's `.grad` where the gradients stay in it (the earlier micro-batches' sum, or
    this one's), the root unit's unsharded gradient under FSDP; none where the hooks move
    gradients into DeepSpeed's buckets or partition (ZeRO-1 with `overlap_comm`, ZeRO 2/3)
    or each is stepped and freed as it is made (`optimizer_in_backward`)."""
    if i.optimizer_in_backward:
        return 0
    if engine == "fsdp":
        return 1
    whole = engine == "deepspeed" and (
        i.zero_stage == 0 or (i.zero_stage == 1 and not i.deepspeed["overlap_comm"])
    )
    return 1 if engine in ("plain", "ddp") or whole else 0


__all__ = ["EMBEDDING_MOMENT", "TIED_SUM_TERM", "tied_sum_bytes"]
