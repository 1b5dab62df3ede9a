"""What a compiled cross-entropy keeps for its backward, against eager (docs/estimator.md,
"Fine-tuning as recipes run it": the compiled loss).

The eager loss upcasts the bf16 logits and keeps the fp32 log-probabilities (4 bytes x
tokens x vocabulary) for its backward. Under `torch.compile`, AOTAutograd's min-cut
partitioner (`min_cut_rematerialization_partition`, run on inductor's decompositions, as
inductor runs it) keeps the bf16 logits, the labels and two fp32 numbers a token (the row
maximum and the log of the sum of exponentials), and recomputes the log-probabilities in
the backward. The estimate does not count this yet; the published fine-tuning rows state
the 4sbv bytes it would take off."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from functorch.compile import aot_function, min_cut_rematerialization_partition
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.decomposition import select_decomp_table

TOKENS, VOCAB = 64, 512


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB, generator=gen).to(torch.bfloat16).requires_grad_()
    return logits, torch.randint(0, VOCAB, (TOKENS,), generator=gen)


def _compiled_saved() -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The tensors the compiled forward hands its backward (the forward graph's outputs
    beyond the loss)."""
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def forward_compiler(gm: torch.fx.GraphModule, _example: object) -> object:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        values = [a.meta["val"] for a in output.args[0]]
        saved.extend((tuple(v.shape), v.dtype) for v in values[1:])  # [0] is the loss
        return make_boxed_func(gm.forward)

    def backward_compiler(gm: torch.fx.GraphModule, _example: object) -> object:
        return make_boxed_func(gm.forward)

    compiled = aot_function(
        _loss,
        fw_compiler=forward_compiler,
        bw_compiler=backward_compiler,
        partition_fn=min_cut_rematerialization_partition,
        decompositions=select_decomp_table(),
    )
    logits, labels = _inputs()
    compiled(logits, labels).backward()
    assert logits.grad is not None
    return saved


def _eager_saved() -> list[tuple[tuple[int, ...], torch.dtype]]:
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(t.shape), t.dtype))
        return t

    logits, labels = _inputs()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = _loss(logits, labels)
    loss.backward()
    return saved


def test_the_compiled_loss_keeps_no_fp32_log_probabilities() -> None:
    full = (TOKENS, VOCAB)
    eager = _eager_saved()
    compiled = _compiled_saved()
    assert (full, torch.float32) in eager  # the eager log-probabilities, 4sbv bytes
    assert (full, torch.float32) not in compiled
    assert (full, torch.bfloat16) in compiled  # the logits, which the forward holds anyway
    # beyond the logits and the labels: at most two fp32 numbers a token
    rest = [
        (shape, dtype)
        for shape, dtype in compiled
        if (shape, dtype) not in ((full, torch.bfloat16), ((TOKENS,), torch.int64))
    ]
    rest_bytes = sum(
        int(torch.tensor(shape).prod()) * torch.empty((), dtype=dtype).element_size()
        for shape, dtype in rest
    )
    assert rest_bytes <= 2 * 4 * TOKENS + 16, rest
