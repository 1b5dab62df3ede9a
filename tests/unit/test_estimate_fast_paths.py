"""The estimator's fast paths give what the general paths give: the peak's highest point
alone (`peak_point`) and with a step's fixed terms reused, the first micro-batch that
provably does not fit solved from the lines, the readers' shortcuts for plain values, and
the frozen results built in one step."""

from __future__ import annotations

import copy
import inspect
import itertools
import math

from workbench.estimate import estimate_memory
from workbench.estimate.arithmetic import (
    _at_micro_batch,
    _lowest_unfitting,
    activations,
    model_states,
)
from workbench.estimate.frozen import field_names, of_every_field
from workbench.estimate.inputs_check import _checked, _choice, _flag, _table, check_inputs
from workbench.estimate.limits import LIMITS, check_number
from workbench.estimate.peak import fixed_terms, peak_point, step_peak
from workbench.estimate.reserve import (
    TRANSIENT_SHARE,
    allocator_at,
    reserve_of,
    reserve_total_bytes,
)
from workbench.estimate.result import MemoryEstimate

SHAPE = dict(layers=4, hidden=256, heads=8, seq_len=512, vocab=32000)

GRID = (
    [
        dict(
            **SHAPE,
            precision=prec,
            optimizer=opt,
            zero_stage=stage,
            gpus=gpus,
            checkpointing=ckpt,
            gpu="a100-40gb",
            **extra,
        )
        for prec, opt, stage, gpus, ckpt, extra in itertools.product(
            ["fp32", "amp-bf16", "bf16"],
            ["adamw", "sgd", "paged-adam8bit", "adafactor"],
            [0, 3],
            [1, 8],
            ["none", "full"],
            [
                {},
                {"grad_accum": 4, "activation_offload": True, "compile": True},
                {"lora_rank": 8, "qlora": True, "document_mask": True},
            ],
        )
        if not (prec == "bf16" and "qlora" in extra)
    ]
    + [
        dict(**SHAPE, fsdp=mode, precision="amp-bf16", gpus=4, fsdp_units=units, lora_rank=rank)
        for mode in ("full_shard", "shard_grad_op")
        for units in ("blocks", "blocks-only")
        for rank in (0, 16)
    ]
    + [
        dict(model="llama-3-8b", gpus=8, tensor_parallel=2, sequence_parallel=True),
        # context parallelism's K/V exchange in the last layer's backward
        dict(**SHAPE, context_parallel=2, gpus=4, fsdp="full_shard", precision="amp-bf16"),
        dict(**SHAPE, context_parallel=4, gpus=8, zero_stage=3, precision="bf16"),
        dict(**SHAPE, context_parallel=2, gpus=2, checkpointing="full", lora_rank=8),
        dict(  # a long sequence: the exchange is above the MLP's backward (a term > 0)
            **{**SHAPE, "seq_len": 8192}, context_parallel=4, gpus=4, checkpointing="full"
        ),
        dict(**{**SHAPE, "seq_len": 8192}, context_parallel=4, gpus=4, fsdp="full_shard"),
        dict(  # a small vocabulary: the last layer's backward, with the exchange, is highest
            **{**SHAPE, "seq_len": 8192, "vocab": 256}, context_parallel=4, gpus=4
        ),
        # one parameter stepped at a time in backward
        dict(**SHAPE, optimizer_in_backward=True),
        dict(
            **SHAPE, optimizer_in_backward=True, optimizer="paged-adam8bit", precision="bf16-true"
        ),
        dict(  # a wide model on a short sequence: the end of backward is highest
            layers=4,
            hidden=1024,
            heads=8,
            seq_len=16,
            vocab=256,
            checkpointing="full",
            optimizer_in_backward=True,
        ),  # fmt: skip
        dict(**SHAPE, gpus=2, overhead_gib=2.5, lazy_loading=False, gpu="h100-80gb"),
    ]
)


_DEFAULTS = {
    name: param.default for name, param in inspect.signature(estimate_memory).parameters.items()
}


def inputs_of(cfg: dict, micro_batch: int = 1):
    """`estimate_memory`'s checked inputs of `cfg` at `micro_batch`."""
    return check_inputs({**_DEFAULTS, **cfg, "micro_batch": micro_batch})


def test_peak_point_and_fixed_terms_equal_the_full_peak():
    for cfg, mb in itertools.product(GRID, (1, 3, 8)):
        i = inputs_of(cfg, mb)
        states, breakdown = model_states(i), activations(i)
        full = step_peak(i, states, breakdown)
        # the fixed terms of other micro-batches' inputs (the search's case)
        fixed = fixed_terms(inputs_of(cfg, 5), states)
        assert step_peak(i, states, breakdown, fixed=fixed).to_dict() == full.to_dict()
        point = peak_point(i, states, breakdown, fixed=fixed)
        for name in ("peak_bytes", "phase", "terms", "phases", "engine", "optimizer_impl"):
            assert getattr(point, name) == getattr(full, name), (cfg, mb, name)
        assert reserve_of(i, point.terms) == reserve_of(i, full.terms)
        reserve = reserve_of(i, full.terms)
        assert reserve_total_bytes(i, point.terms) == reserve.total_bytes
        assert allocator_at(i, point.terms) == (reserve.allocator_bytes or 0)


def _bisected(i, peak, reserve, gpu_mem, top):
    """`_lowest_unfitting` by bisection alone (what it computed before solving the lines)."""
    mb = i.micro_batch
    share = 0.0 if i.overhead_gib is not None else TRANSIENT_SHARE
    constant = reserve.total_bytes - reserve.allocator_bytes
    base = peak.points["forward end"]
    states = base.get("parameters", 0) + base.get("optimizer states", 0)
    states += peak.held_gradients_bytes
    lines = [
        (total - peak.variable.get(name, 0), peak.variable.get(name, 0) // mb)
        for name, total in peak.phases.items()
    ]
    if any(per < 0 for _, per in lines):
        return None

    def needs(n):
        highest = max(fixed + per * n for fixed, per in lines)
        return highest + constant + max(0, int(share * (highest - states)))

    if needs(top) <= gpu_mem:
        return None
    low, high = mb, top
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if needs(mid) <= gpu_mem else (low, mid)
    return high


def test_lowest_unfitting_equals_the_bisection():
    checked = 0
    for cfg, mb, gib in itertools.product(GRID, (1, 2, 7), (2, 40, 80)):
        i = inputs_of(cfg, mb)
        states, breakdown = model_states(i), activations(i)
        peak = step_peak(i, states, breakdown)
        reserve = reserve_of(i, peak.terms)
        for gpu_mem in (gib << 30, (gib << 30) + 12345):
            for top in (10**6, 1000, mb + 1):
                want = _bisected(i, peak, reserve, gpu_mem, top)
                assert _lowest_unfitting(i, peak, reserve, gpu_mem, top) == want
                checked += want is not None
    assert checked > 100  # the grid reaches the solved path


def test_readers_fast_paths_read_as_check_number():
    values = [0, 1, 2, 7, 10**6, 10**7, 10**7 + 1, 10**16, 10**17, -1, 0.0, 0.001, 0.5, 0.99]
    values += [1.0, 2.5, 1024.0, 1025.0, -0.0, math.nan, math.inf, True, False, "1", None]
    for name, value in itertools.product(LIMITS, values):
        p: list = []
        number, message = check_number(name, value)
        got = _checked(p, name, value)
        assert got == number or (got is None and number is None), (name, value)
        assert type(got) is type(number), (name, value)
        assert (message is None) == (not p), (name, value)
    for value in (True, False, 1, 0, "yes", None):
        p = []
        assert _flag(p, "compile", value) is value
        assert bool(p) == (value is not True and value is not False), value
    table = _table("precision")
    for value in ("fp32", " FP32 ", "amp-bf16", "AMP-BF16", "nope", 3):
        p = []
        want = table.get(value.strip().lower()) if isinstance(value, str) else None
        assert _choice(p, "precision", value, table) is want
        assert bool(p) == (want is None)


def test_frozen_results_built_in_one_step_equal_their_init():
    e = estimate_memory(**GRID[0])
    values = {name: getattr(e, name) for name in field_names(MemoryEstimate)}
    fast = MemoryEstimate.of_every_field(values)
    slow = MemoryEstimate(**values)
    assert fast == slow and fast.to_dict() == slow.to_dict() and str(fast) == str(slow)
    partial = {k: v for k, v in values.items() if k != "loss_chunks"}  # a default: __init__
    assert of_every_field(MemoryEstimate, field_names(MemoryEstimate), partial).loss_chunks == 1
    i = inputs_of(GRID[0], 2)
    copied = copy.copy(i)
    object.__setattr__(copied, "micro_batch", 9)
    assert _at_micro_batch(i, 9) == copied and i.micro_batch == 2


def test_the_grid_reaches_the_points_its_comments_name():
    """The grid's context-parallel and optimizer-in-backward rows exercise the fast
    totals where they decide the peak: the K/V exchange is a term above 0 and the last
    layer's backward the highest moment; the end of backward the highest with one
    parameter stepped at a time."""
    from workbench.estimate.context_parallel import CP_TERM

    long_seq = {**SHAPE, "seq_len": 8192, "vocab": 256}
    peak = estimate_memory(**long_seq, context_parallel=4, gpus=4).peak
    assert peak.moments["last layer's backward"][CP_TERM] > 0
    assert (peak.phase, peak.backward_moment) == ("backward", "last layer's backward")
    wide = dict(layers=4, hidden=1024, heads=8, seq_len=16, vocab=256)
    peak = estimate_memory(**wide, checkpointing="full", optimizer_in_backward=True).peak
    assert (peak.phase, peak.backward_moment) == ("backward", "backward end")
