"""A tied embedding's gradient sum, measured: the dry run at the embedding's backward
against the formula's moment of it ("embedding's backward", `TIED_SUM_TERM`), and the
dry run's sum against autograd's on real tensors.

The one vocab x hidden weight of GPT-2 (and of the built-in tiny GPT) gets the output
projection's gradient early in backward and the embedding lookup's at its end; autograd
adds them before the weight's `AccumulateGrad`, in place into the first where it is a new
tensor (autocast's fp32 copy of the 16-bit matmul gradient, ZeRO-3's linear function) and
into a new tensor where it is the matmul's transpose (fp32, pure 16-bit, FSDP). On fake
tensors, or under any dispatch mode, autograd never sums in place; the dry run puts the
real step's choice back (`workbench.train.dry_run.accumulation`), which the first tests
hold to real tensors on this CPU.

GPT-2 124M's vocabulary and width (50257 x 768, from a config, no download) at 1 x 128
tokens, where the embedding's backward weighs most; two of its 12 layers (the sum does not
depend on the layers, and with fewer layers the embedding's backward is the backward's
highest moment the more). Measured: every setup within 0.02% of the dry run at that instant (the gradient
flowing into the embedding, 128 x 768 elements, which the formula leaves out).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import transformers

from workbench import TrainConfig
from workbench.estimate.tied_embedding import EMBEDDING_MOMENT, TIED_SUM_TERM
from workbench.train.dry_run import simulate_memory

V, H = 50257, 768
#: the formula against the dry run at the instant: within this share of the dry run's
#: total there (measured: under 0.02%; one vocab x hidden tensor is 7% or more of it)
WITHIN = 0.005
_STATES = ("parameters", "optimizer states")


def _gpt2(layers: int = 12, vocab: int = V, hidden: int = H) -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=12 if hidden % 12 == 0 else 4,
        n_positions=1024,
    )
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config)


def instant(run: Any) -> tuple[int, int]:
    """The dry run at the last micro-batch's embedding's backward: the most bytes alive
    from the lookup's gradient (`embedding_dense_backward`, a whole vocab x hidden tensor)
    to its free, after the sum, and how many tensors of its size alive then are gradients
    (the weights and their optimizer states aside)."""
    events = run.trace.events
    last = max(e.step for e in events)
    alive: dict[int, Any] = {}
    live = block = 0
    found: tuple[int, int] | None = None
    best: tuple[int, int] | None = None
    watching = False
    for e in events:
        if e.kind == "alloc":
            alive[e.block] = e
            live += e.nbytes
        else:
            alive.pop(e.block, None)
            live -= e.nbytes
        if e.step == last and e.kind == "alloc" and e.op == "aten.embedding_dense_backward.default":
            watching, block, size, best = True, e.block, e.nbytes, None
        if watching:
            tensors = sum(
                1 for a in alive.values() if a.nbytes == size and a.category not in _STATES
            )
            if best is None or live > best[0]:
                best = (live, tensors)
            if e.kind == "free" and e.block == block:
                watching, found = False, best
    assert found is not None, "no embedding backward in the last step"
    return found


def _formula_instant(run: Any) -> dict[str, int]:
    moments = run.formula.peak.moments
    assert EMBEDDING_MOMENT in moments, sorted(moments)
    return dict(moments[EMBEDDING_MOMENT])


def _check(run: Any, tied_tensors: int, width: int) -> None:
    """The formula's instant within `WITHIN` of the dry run's; the dry run holds
    `tied_tensors` vocab x hidden tensors there (`width` bytes an element)."""
    dry, tensors = instant(run)
    terms = _formula_instant(run)
    formula = sum(terms.values())
    assert abs(dry - formula) <= WITHIN * dry, (dry, formula, terms)
    assert tensors == tied_tensors, tensors
    assert terms[TIED_SUM_TERM] % (width * run.formula.vocab * run.formula.hidden) == 0


@contextlib.contextmanager
def _overlap_comm() -> Iterator[None]:
    """DeepSpeed's `overlap_comm` in the engine config the Session's backend hands
    `deepspeed.initialize`, which the dry run and its formula both read."""
    import workbench.train.backends.deepspeed as backend

    original = backend.engine_config

    def with_overlap(*args: Any, **kwargs: Any) -> dict[str, Any]:
        ds = original(*args, **kwargs)
        ds["zero_optimization"]["overlap_comm"] = True
        return ds

    backend.engine_config = with_overlap  # type: ignore[assignment]
    try:
        yield
    finally:
        backend.engine_config = original  # type: ignore[assignment]


def _dry_run(layers: int = 2, ranks: int = 1, **settings: Any) -> Any:
    return simulate_memory(
        lambda: _gpt2(layers),
        TrainConfig(micro_batch=1, **settings),
        seq_len=128,
        world_size=ranks,
        progress=False,
    )


# --------------------------------------------------------------- autograd's sum, real
def _real_sum(precision: str) -> tuple[int, int, int]:
    """A real GPT-2 step's backward on this CPU, no dispatch mode: the data pointers of the
    output projection's gradient and the lookup's as they reach the tied weight, and of
    the weight's `.grad` after backward."""
    torch.manual_seed(0)
    model = _gpt2(layers=1, vocab=1000, hidden=64)
    weight = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is weight
    ids = torch.randint(0, 1000, (2, 16))
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if precision == "amp-bf16"
        else contextlib.nullcontext()
    )
    with autocast:
        logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    del logits
    made: dict[str, int] = {}
    feeders = []
    stack, seen = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if type(nxt).__name__ == "AccumulateGrad" and nxt.variable is weight:
                feeders.append(node)
            stack.append(nxt)
    for node in feeders:
        name = type(node).__name__

        def hook(grad_inputs: Any, _outputs: Any, name: str = name) -> None:
            made[name] = grad_inputs[0].data_ptr()

        node.register_hook(hook)
    loss.backward()  # type: ignore[no-untyped-call]
    assert weight.grad is not None
    lookup = made.pop("EmbeddingBackward0")
    (projection,) = made.values()
    return projection, lookup, weight.grad.data_ptr()


def test_real_autograd_sums_in_place_under_autocast_only() -> None:
    """fp32: the projection's gradient is a view (`TBackward0`): the sum is a new tensor,
    three alive. amp-bf16: it is the fp32 copy of the 16-bit gradient (`ToCopyBackward0`):
    summed into it in place, two alive. The dry run holds the same tensors."""
    projection, lookup, grad = _real_sum("fp32")
    assert grad not in (projection, lookup)  # a new tensor
    projection, lookup, grad = _real_sum("amp-bf16")
    assert grad == projection  # summed into the projection's gradient
    assert instant(_dry_run(layers=2, precision="fp32"))[1] == 3
    assert instant(_dry_run(layers=2, precision="amp-bf16"))[1] == 2


# --------------------------------------------------------------- the formula, measured
@pytest.mark.parametrize(
    ("settings", "tensors", "width"),
    [
        (dict(precision="fp32"), 3, 4),
        (dict(precision="amp-bf16"), 2, 4),
        (dict(precision="bf16-true"), 3, 2),
        (dict(precision="fp32", grad_accum=2), 4, 4),  # and the earlier sum in .grad
        (dict(precision="amp-bf16", grad_accum=2), 3, 4),
    ],
    ids=lambda v: str(v),
)
def test_gpt2_124m_plain_loop(settings: dict[str, Any], tensors: int, width: int) -> None:
    """GPT-2 124M's vocabulary and width, 1 x 128 tokens: the embedding's backward is the
    backward's highest moment in the dry run and in the formula, and they agree there."""
    run = _dry_run(**settings)
    _check(run, tensors, width)
    assert run.formula.peak.backward_moment == EMBEDDING_MOMENT or settings.get("grad_accum")
    if run.formula.peak.backward_moment == EMBEDDING_MOMENT:
        dry, formula = run.phases["backward"], run.formula.peak.phases["backward"]
        assert abs(dry - formula) <= WITHIN * dry, (dry, formula)


@pytest.mark.parametrize(
    ("settings", "tensors", "width"),
    [
        (dict(precision="fp32", fsdp="full_shard"), 3, 4),
        (dict(precision="amp-bf16", fsdp="full_shard"), 3, 2),  # no autocast under FSDP
        (dict(precision="amp-bf16", fsdp="full_shard", grad_accum=2), 3, 2),
        (dict(precision="bf16-true", fsdp="shard_grad_op"), 3, 2),
    ],
    ids=lambda v: str(v),
)
def test_fsdp(settings: dict[str, Any], tensors: int, width: int) -> None:
    _check(_dry_run(layers=2, ranks=2, **settings), tensors, width)


@pytest.mark.parametrize(
    ("settings", "overlap", "tensors", "width"),
    [
        (dict(precision="fp32"), False, 3, 4),  # ZeRO-0: several ranks without FSDP
        (dict(precision="bf16", zero_stage=1), False, 3, 2),
        (dict(precision="amp-bf16", zero_stage=1, grad_accum=2), False, 3, 4),
        (dict(precision="bf16", zero_stage=1), True, 3, 2),
        (dict(precision="bf16", zero_stage=1, grad_accum=2), True, 4, 2),
        (dict(precision="bf16", zero_stage=2), False, 3, 2),
        (dict(precision="amp-bf16", zero_stage=2), False, 2, 4),
        # 6 layers: ZeRO-2 keeps, between micro-batches, every parameter with a part in
        # this rank's partition whole (DeepSpeed 0.19 `copy_grads_in_partition`); with 2
        # layers that is the tied weight alone, more than the rank's share the formula
        # counts (a gap beside the sum's)
        (dict(precision="fp16", zero_stage=2, grad_accum=2, layers=6), False, 3, 2),
        (dict(precision="bf16", zero_stage=3), False, 2, 2),
        (dict(precision="amp-bf16", zero_stage=3), False, 2, 4),
    ],
    ids=lambda v: str(v),
)
def test_deepspeed(settings: dict[str, Any], overlap: bool, tensors: int, width: int) -> None:
    with _overlap_comm() if overlap else contextlib.nullcontext():
        run = _dry_run(ranks=2, **settings)
    _check(run, tensors, width)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
@pytest.mark.parametrize("grad_accum", [1, 3])
def test_the_built_in_tiny_gpt(precision: str, grad_accum: int) -> None:
    """The built-in GPT ties its head to its embedding as GPT-2 does (`head.weight is
    wte.weight`): the same sum, at its own shape (a 66-character vocabulary)."""
    from tests.integration.conftest import TINY

    config = TrainConfig(micro_batch=1, precision=precision, grad_accum=grad_accum)
    run = simulate_memory("tiny-gpt", config, model_options=TINY, progress=False)
    tensors = (3 if precision == "fp32" else 2) + (grad_accum > 1)
    dry, alive = instant(run)
    terms = _formula_instant(run)
    assert alive == tensors
    # exact but for the batch's token ids, Adam's step counters (a few hundred bytes) and,
    # summed in place (the instant is the lookup's), the fp32 gradient flowing into it
    flowing = 4 * TINY["seq_len"] * TINY["hidden"]
    assert 0 <= dry - sum(terms.values()) <= 1024 + flowing, (dry, terms)
