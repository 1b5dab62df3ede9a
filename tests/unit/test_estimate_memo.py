"""What an estimate remembers between calls (the last shape built, the last shapes counted,
the last model states rounded) never changes an answer: a remembered value is used only
for the same inputs, and anything else is checked and computed afresh."""

from __future__ import annotations

import pytest

from workbench.estimate import EstimateInputError, estimate_memory
from workbench.estimate.architecture import build_architecture, parameter_shapes

SHAPE = dict(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000)


def test_a_shape_checked_once_is_still_checked_when_a_field_changes_type() -> None:
    arch, problems = build_architecture({**SHAPE, "causal": True})
    assert arch is not None and problems == []
    # 1 == True for a dict lookup, but 1 is not a flag: the remembered shape must not answer
    arch, problems = build_architecture({**SHAPE, "causal": 1})
    assert arch is None and [p.field for p in problems] == ["causal"]


def test_a_bad_shape_after_a_good_one_is_refused() -> None:
    estimate_memory(**SHAPE)
    with pytest.raises(EstimateInputError, match="heads"):
        estimate_memory(**{**SHAPE, "heads": 3})


def test_the_shapes_are_the_same_object_for_the_same_architecture() -> None:
    arch, _ = build_architecture(dict(SHAPE))
    assert arch is not None
    assert parameter_shapes(arch) is parameter_shapes(arch.replace(seq_len=128))


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "adafactor"])
def test_remembered_figures_equal_fresh_ones(optimizer: str) -> None:
    """Alternating two models and two optimizers gives each estimate the figures it gives
    alone (each remembered value is keyed by everything it depends on)."""
    a = dict(**SHAPE, gpu="h100", optimizer=optimizer)
    b = dict(model="gpt2", gpu="h100", optimizer="adamw", micro_batch=3)
    first_a, first_b = estimate_memory(**a), estimate_memory(**b)
    for _ in range(2):
        assert estimate_memory(**a) == first_a
        assert estimate_memory(**b) == first_b
    fresh = dict(a, hidden=512)
    assert estimate_memory(**fresh).reserve != first_a.reserve


GRID = [
    dict(model="gpt2", gpu="t4"),
    dict(model="gpt2", gpu="t4", micro_batch=4, precision="amp-bf16", checkpointing="full"),
    dict(
        model="llama-2-7b",
        gpu="a100-40gb",
        lora_rank=16,
        micro_batch=2,
        precision="amp-bf16",
        checkpointing="full",
    ),
    dict(model="mistral-7b", gpu="a100-40gb", lora_rank=8, qlora=True, precision="amp-bf16"),
    dict(model="pythia-1.4b", gpu="a100-80gb", optimizer="adam8bit", activation_offload=True),
    dict(model="llama-3-8b", gpu="h100", gpus=8, zero_stage=3, precision="bf16", micro_batch=3),
    dict(model="llama-3-8b", gpu="h100", gpus=8, fsdp="full_shard", precision="amp-bf16"),
    dict(**SHAPE, gpu="t4", optimizer="adafactor", grad_accum=4, micro_batch=64),
]


@pytest.mark.parametrize("config", GRID, ids=[str(i) for i in range(len(GRID))])
def test_the_largest_micro_batch_is_what_a_scan_finds(config: dict[str, object]) -> None:
    """`max_micro_batch` found from the peak's lines (one peak computed, most often) equals
    a scan of every micro-batch from 1 up, each estimated on its own."""
    e = estimate_memory(**config)
    found = e.max_micro_batch
    scan_to = (found or 0) + 2
    fitting = [
        n for n in range(1, scan_to + 1) if estimate_memory(**{**config, "micro_batch": n}).fits
    ]
    assert found == (max(fitting) if fitting else None)
    assert fitting == list(range(1, len(fitting) + 1))  # no gap below the answer
