"""The estimate's reserve beside the allocated peak: the CUDA context (per GPU generation,
sourced), NCCL's buffers (several ranks), the caching allocator's segment rounding; the
verdicts that judge the sum and say their margin."""

from __future__ import annotations

import math

import pytest

from workbench.estimate import estimate_memory
from workbench.estimate.catalog import CONTEXTS, GENERATIONS, GPUS, context_of, nccl_channels
from workbench.estimate.problems import EstimateInputError
from workbench.estimate.reserve import NCCL_BUFFERS_BYTES, segments_bytes

MIB = 1 << 20
GIB = 1 << 30


# ---------------------------------------------------------------- the allocator's rules
def test_requests_round_to_512_bytes_and_small_ones_share_2_mib_segments() -> None:
    assert segments_bytes({1: 1}) == 2 * MIB  # one byte opens a small-pool segment
    assert segments_bytes({512: 4096}) == 2 * MIB  # 4096 x 512 B fill one exactly
    assert segments_bytes({512: 4097}) == 4 * MIB
    assert segments_bytes({513: 2048}) == 2 * MIB  # 513 B are 1,024 B: 2048 fill one
    assert segments_bytes({513: 2049}) == 4 * MIB
    assert segments_bytes({MIB: 2}) == 2 * MIB  # 1 MiB is still the small pool


def test_blocks_of_1_to_10_mib_share_20_mib_segments() -> None:
    assert segments_bytes({MIB + 1: 1}) == 20 * MIB  # just above 1 MiB: the large pool
    assert segments_bytes({6 * MIB: 3}) == 20 * MIB
    assert segments_bytes({6 * MIB: 4}) == 40 * MIB
    # different sizes share a segment (the allocator splits a cached one for any request)
    assert segments_bytes({6 * MIB: 3, 2 * MIB: 1}) == 20 * MIB
    assert segments_bytes({10 * MIB - 512: 2}) == 20 * MIB


def test_blocks_from_10_mib_get_their_own_segment_rounded_to_2_mib() -> None:
    assert segments_bytes({10 * MIB: 1}) == 10 * MIB
    assert segments_bytes({10 * MIB + 1: 1}) == 12 * MIB
    assert segments_bytes({10 * MIB + 1: 3}) == 36 * MIB
    assert segments_bytes({10 * MIB + 1: 1, 1: 1}) == 14 * MIB  # and the small pool's 2


# ---------------------------------------------------------------- the three terms
def test_every_catalog_gpu_has_a_sourced_context_and_nccl_channels() -> None:
    assert set(GENERATIONS) == set(GPUS)
    for name in GPUS:
        figure = context_of(name)
        assert figure.generation in CONTEXTS and figure.source and figure.bytes > 0
        assert nccl_channels(name) >= 1
    assert context_of("rtx-3090").bytes == 256 * MIB and context_of("rtx-3090").measured
    # measured per generation: A100 (an A800, GA100) 414 MiB, H100 534 MiB (the H200 shows
    # ~520 MiB: the H100's figure holds for both); the A10G is GA102, the RTX 3090's die
    for name, mib in (("a100-40gb", 414), ("a100-80gb", 414), ("h100-80gb", 534)):
        assert context_of(name).bytes == mib * MIB and context_of(name).measured, name
    assert context_of("h200-141gb") == context_of("h100-80gb")
    assert context_of("a10g") == context_of("rtx-3090")
    assert context_of("mi300x").bytes == 400 * 10**6 and not context_of("mi300x").measured
    assert context_of(None).bytes == 400 * 10**6 and not context_of(None).measured
    assert context_of("h100-80gb", lazy=False).bytes == 666_632_192  # eager loading


def test_one_gpu_has_no_nccl_buffers_several_ranks_have_channels_x_peers_x_protocols() -> None:
    one = estimate_memory(model="gpt2", gpu="h100")
    assert one.reserve is not None and one.reserve.nccl_bytes == 0
    per_channel_peer = 4 * MIB + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16  # Simple, LL128, LL
    assert sum(NCCL_BUFFERS_BYTES) == per_channel_peer
    dp = estimate_memory(model="gpt2", gpu="h100", gpus=8, zero_stage=1)
    assert dp.reserve is not None and dp.reserve.nccl_bytes == 32 * 2 * per_channel_peer
    # tensor and data parallel: one communicator each
    both = estimate_memory(model="llama-3-8b", gpu="a100-80gb", gpus=16, tensor_parallel=2)
    assert both.reserve is not None and both.reserve.nccl_bytes == 2 * 16 * 2 * per_channel_peer


def test_the_allocator_reserve_rounds_the_live_tensors_at_the_peak() -> None:
    # no shapes: each peak term is one tensor; 20e9-byte parameters and gradients
    e = estimate_memory(n_params=5e9, optimizer="sgd-nomomentum", gpu="a100-40gb")
    assert e.peak_terms == {
        "parameters": 20 * 10**9,
        "optimizer states": 0,
        "gradients": 20 * 10**9,
    }
    rounded = math.ceil(20e9 / (2 * MIB)) * 2 * MIB  # its own segment, rounded to 2 MiB
    assert e.reserve is not None and e.reserve.allocator_bytes == 2 * (rounded - 20 * 10**9)
    assert e.reserve.context_bytes == 414 * MIB and e.reserve.nccl_bytes == 0
    assert e.overhead_bytes == 414 * MIB + 2 * (rounded - 20 * 10**9)


def test_allocated_reserved_and_nvidia_smi_are_three_named_figures() -> None:
    e = estimate_memory(model="llama-3-8b", precision="amp-bf16", fsdp="full_shard", gpus=8)
    r = e.reserve
    assert r is not None and r.allocator_bytes > 0 and r.nccl_bytes > 0
    assert e.reserved_peak_bytes == e.peak_bytes + r.allocator_bytes
    assert (
        e.nvidia_smi_bytes
        == e.required_bytes
        == e.reserved_peak_bytes + r.context_bytes + (r.nccl_bytes)
    )
    text = str(e)
    for line in (
        "allocated peak (max_memory_allocated)",
        "reserved peak (max_memory_reserved)",
        "what nvidia-smi shows",
    ):
        assert line in text


def test_overhead_gib_given_replaces_the_derived_reserve() -> None:
    e = estimate_memory(model="gpt2", gpu="t4", gpus=4, overhead_gib=1.5)
    assert e.overhead_bytes == math.ceil(1.5 * GIB) and e.overhead_gib == 1.5
    assert e.reserve is not None and e.reserve.terms == {"overhead_gib (given)": e.overhead_bytes}
    assert e.reserved_peak_bytes is None  # one figure, not split
    auto = estimate_memory(model="gpt2", gpu="t4", gpus=4, overhead_gib="auto")
    assert auto == estimate_memory(model="gpt2", gpu="t4", gpus=4) and auto.overhead_gib is None
    for bad in (None, "1", "derived", -1):
        with pytest.raises(EstimateInputError, match="overhead_gib="):
            estimate_memory(model="gpt2", overhead_gib=bad)


# ---------------------------------------------------------------- the verdicts
def test_a_verdict_says_its_margin_or_what_is_over_and_its_largest_term() -> None:
    fits = estimate_memory(model="gpt2", gpu="h100", precision="amp-bf16")
    spare = fits.gpu_memory_bytes - fits.required_bytes
    assert fits.fits and fits.margin_bytes == spare
    assert fits.verdict == f"fits with {spare / GIB:.2f} GiB to spare"
    over = estimate_memory(n_params="175B", gpu="h100-80gb")
    h100 = GPUS["h100-80gb"].memory_bytes  # 79.11 GiB, what PyTorch reports
    assert over.fits is False and over.margin_bytes == h100 - over.required_bytes
    assert over.verdict is not None and over.verdict.startswith("does not fit: over by ")
    assert "the largest term is optimizer states" in over.verdict  # 8 bytes a parameter
    assert estimate_memory(model="gpt2").verdict is None  # no GPU


def test_a_verdict_without_activations_says_it_leaves_them_out(capsys) -> None:
    """A parameter count alone (or a family not mapped onto the formula) has no activations:
    its "fits" is of the model states and the step's buffers only, and says so, in the
    API's verdict and on the command line."""
    from workbench.cli import main

    bare = estimate_memory(n_params="1B", gpu="h100", precision="bf16")
    assert bare.fits and bare.activation_bytes is None
    assert bare.verdict is not None and bare.verdict.endswith(
        ", without its activations (activations not estimated: give a transformer shape or a model)"
    )
    shaped = estimate_memory(model="gpt2", gpu="h100", precision="bf16")
    assert shaped.verdict is not None and "without its activations" not in shaped.verdict
    assert main(["estimate", "--params", "1B", "--gpu", "h100", "--precision", "bf16"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "per GPU ->" in ln)
    assert "fits" in line and line.endswith(
        "(activations not estimated: give a transformer shape or a model)"
    )


def test_the_largest_micro_batch_fits_with_its_own_reserve_and_one_more_does_not() -> None:
    for gpu in ("t4", "a100-40gb"):
        kw = dict(model="gpt2", gpu=gpu, precision="amp-bf16", seq_len=1024)
        m = estimate_memory(**kw).max_micro_batch
        assert m is not None and m >= 1
        at, above = estimate_memory(**kw, micro_batch=m), estimate_memory(**kw, micro_batch=m + 1)
        assert at.fits and at.required_bytes <= at.gpu_memory_bytes
        assert not above.fits and above.required_bytes > above.gpu_memory_bytes


def test_without_lazy_module_loading_the_context_is_the_eager_measurement() -> None:
    lazy = estimate_memory(model="gpt2", gpu="h100")
    eager = estimate_memory(model="gpt2", gpu="h100", lazy_loading=False)
    assert lazy.reserve is not None and eager.reserve is not None
    assert eager.reserve.context_bytes == 666_632_192 and lazy.reserve.context_bytes == 534 * MIB
    assert eager.overhead_bytes - lazy.overhead_bytes == 666_632_192 - 534 * MIB
    with pytest.raises(EstimateInputError, match="lazy_loading='no': must be True or False"):
        estimate_memory(model="gpt2", lazy_loading="no")


def test_the_estimator_panel_s_verdict_says_it_leaves_the_activations_out_too() -> None:
    """The panel words the verdict in its own units (`EstimatorPanel._verdict`): the same
    ", without its activations (...)" where they are not estimated."""
    from workbench.ui.estimator import EstimatorPanel

    bare = estimate_memory(n_params="1B", gpu="h100", precision="bf16")
    text = EstimatorPanel._verdict(bare, "GiB")
    assert text.startswith("fits with ") and text.endswith(bare.without_activations)
    assert bare.without_activations
    shaped = estimate_memory(model="gpt2", gpu="h100", precision="bf16")
    assert "without its activations" not in EstimatorPanel._verdict(shaped, "GiB")
