"""Property tests of the estimator (hypothesis)."""

from __future__ import annotations

import math
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import OptimizerName, Precision
from workbench.estimate import GPUS, EstimateInputError, estimate_memory, params_from_shape
from workbench.estimate.peak import PAGED_TERM

PRECISIONS = [p.value for p in Precision]
OPTIMIZERS = [o.value for o in OptimizerName]
CHECKPOINTING = ["none", "selective", "full"]

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def shapes(draw):
    heads = draw(st.integers(1, 64))
    return dict(
        layers=draw(st.integers(1, 128)),
        hidden=heads * draw(st.integers(1, 256)),
        heads=heads,
        seq_len=draw(st.integers(1, 8192)),
        vocab=draw(st.integers(1, 300_000)),
    )


@st.composite
def valid_configs(draw):
    cfg: dict = {}
    shape = draw(st.none() | shapes())
    if shape is not None:
        cfg.update(shape)
    if shape is None or draw(st.booleans()):
        cfg["n_params"] = draw(st.integers(10_000, 10**12) | st.sampled_from([7.5e9, 175e9, 1e6]))
        n = int(cfg["n_params"])
    else:
        n = params_from_shape(**{k: shape[k] for k in ("layers", "hidden", "seq_len", "vocab")})
    stage = draw(st.integers(0, 3))
    cfg.update(
        # pure bf16 has no fp32 master copy, which ZeRO needs
        precision=draw(
            st.sampled_from(
                [p.upper() if up else p for p in PRECISIONS for up in (False, True)]
                if stage == 0
                else [p for p in PRECISIONS if p != "bf16-true"]
            )
        ),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        zero_stage=stage,
        gpus=draw(st.integers(1, min(4096, n))),  # more GPUs than parameters is invalid
        micro_batch=draw(st.integers(1, 64)),
        checkpointing=draw(st.sampled_from(CHECKPOINTING)),
        offload_optimizer=stage >= 1 and draw(st.booleans()),
        offload_params=stage == 3 and draw(st.booleans()),
        gpu=draw(st.none() | st.sampled_from(list(GPUS))),
        overhead_gib=draw(st.floats(0, 8)),
        tokens=draw(st.none() | st.floats(1, 1e13)),
        mfu=draw(st.floats(0.01, 1)),
    )
    if cfg["tokens"] is not None:  # a price prices the tokens' training: only with them
        cfg["price_per_gpu_hour"] = draw(st.none() | st.floats(0, 100))
    return cfg


@SETTINGS
@given(valid_configs())
def test_random_valid_configs_never_raise_and_add_up(cfg):
    e = estimate_memory(**cfg)
    parts = [e.params_bytes, e.grads_bytes, e.optimizer_bytes, e.activation_bytes or 0]
    assert all(isinstance(x, int) and x >= 0 for x in parts + [e.cpu_offload_bytes])
    assert e.total_bytes == sum(parts)
    assert (e.activation_bytes is None) == ("layers" not in cfg)
    # the peak: its terms add up; it holds every model state (the optimizer step) and
    # the stored activations with the parameters and optimizer states (the forward's end)
    assert e.peak_bytes == sum(e.peak_terms.values()) == max(e.peak.phases.values())
    # a paged optimizer's states are beside the device peak (CUDA unified memory)
    paged = e.peak.host_terms.get(PAGED_TERM, 0)
    on_device = cfg["optimizer"] == "paged-adam8bit" and not cfg.get("offload_optimizer")
    assert paged == (e.optimizer_bytes if on_device else 0)
    assert e.peak_bytes + paged >= e.model_states_bytes
    # what grows with the micro-batch is an exact multiple of it (no term rounds), which
    # is what lets the largest micro-batch be solved for
    assert all(v % e.micro_batch == 0 for v in e.peak.variable.values())
    assert e.peak_bytes + paged >= e.params_bytes + e.optimizer_bytes + (e.activation_bytes or 0)
    if e.gpu is not None:
        assert e.fits == (e.peak_bytes + e.overhead_bytes <= e.gpu_memory_bytes)
    if e.max_micro_batch is not None:
        assert estimate_memory(**{**cfg, "micro_batch": e.max_micro_batch}).fits
        if e.max_micro_batch < 10**6:  # the largest micro-batch the estimator takes
            assert not estimate_memory(**{**cfg, "micro_batch": e.max_micro_batch + 1}).fits


@SETTINGS
@given(valid_configs(), st.integers(1, 4096))
def test_more_gpus_never_increase_per_gpu_bytes(cfg, extra):
    n = estimate_memory(**cfg).n_params
    more = min(cfg["gpus"] + extra, n)
    a = estimate_memory(**cfg)
    b = estimate_memory(**{**cfg, "gpus": more})
    for field in (
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "total_bytes",
        "cpu_offload_bytes",
    ):
        assert getattr(b, field) <= getattr(a, field)


@SETTINGS
@given(valid_configs())
def test_higher_zero_stage_never_exceeds_lower(cfg):
    cfg = {**cfg, "offload_params": False}
    if str(cfg["precision"]).lower() == "bf16-true":  # ZeRO trains no pure bf16
        cfg["precision"] = "bf16"
    totals = []
    for stage in range(4):
        offload = cfg["offload_optimizer"] and stage >= 1
        totals.append(estimate_memory(**{**cfg, "zero_stage": stage, "offload_optimizer": offload}))
    for lo, hi in pairwise(totals):
        assert hi.total_bytes <= lo.total_bytes


@SETTINGS
@given(shapes(), st.integers(1, 64), st.sampled_from(PRECISIONS))
def test_full_le_selective_le_none(shape, micro_batch, precision):
    act = {
        m: estimate_memory(**shape, micro_batch=micro_batch, precision=precision, checkpointing=m)
        for m in CHECKPOINTING
    }
    assert act["full"].activation_bytes <= act["selective"].activation_bytes
    assert act["selective"].activation_bytes <= act["none"].activation_bytes


@st.composite
def parallel_configs(draw):
    """A transformer shape and a tensor/pipeline split it allows."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    kv = tp * draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    shape = dict(
        layers=pp * draw(st.integers(1, 8)),
        hidden=heads * draw(st.integers(1, 32)),
        heads=heads,
        kv_heads=kv,
        ffn_hidden=tp * draw(st.integers(1, 512)),
        seq_len=draw(st.integers(1, 4096)),
        vocab=draw(st.integers(1, 100_000)),
        mlp=draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        bias=draw(st.sampled_from(["all", "qkv", "none"])),
        positions=draw(st.sampled_from(["learned", "rotary"])),
        tied_embeddings=draw(st.booleans()),
    )
    return shape, tp, pp


@SETTINGS
@given(parallel_configs(), st.sampled_from(CHECKPOINTING), st.booleans(), st.integers(1, 8))
def test_parallel_splits_cover_the_model_and_shrink_per_gpu_bytes(split, ckpt, sp, dp):
    shape, tp, pp = split
    sp = sp and tp > 1
    kw = dict(**shape, checkpointing=ckpt, precision="bf16", micro_batch=2)
    one = estimate_memory(**kw, gpus=dp)
    many = estimate_memory(
        **kw,
        gpus=tp * pp * dp,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        sequence_parallel=sp,
    )
    assert many.data_parallel == dp and many.n_params == one.n_params
    # every parameter is on some GPU of the tp x pp grid; none is lost by the split
    assert many.shard_params * tp * pp >= many.n_params
    assert many.shard_params <= one.shard_params
    assert many.params_bytes <= one.params_bytes
    if pp == 1:  # with pipelining the first stage holds pp micro-batches in flight
        assert many.activation_bytes <= one.activation_bytes


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(PRECISIONS + OPTIMIZERS + CHECKPOINTING + list(GPUS)),
)
FIELDS = [
    "model",
    "hf_config",
    "n_params",
    "layers",
    "hidden",
    "heads",
    "seq_len",
    "vocab",
    "micro_batch",
    "precision",
    "optimizer",
    "zero_stage",
    "gpus",
    "tensor_parallel",
    "pipeline_parallel",
    "sequence_parallel",
    "kv_heads",
    "ffn_hidden",
    "mlp",
    "norm",
    "bias",
    "positions",
    "tied_embeddings",
    "parallel_residual",
    "offload_optimizer",
    "offload_params",
    "checkpointing",
    "gpu",
    "overhead_gib",
    "tokens",
    "mfu",
    "price_per_gpu_hour",
]


@SETTINGS
@given(valid_configs(), st.dictionaries(st.sampled_from(FIELDS), JUNK, min_size=1, max_size=4))
def test_random_inputs_return_or_raise_value_error_only(cfg, junk):
    try:
        estimate_memory(**{**cfg, **junk})
    except EstimateInputError as exc:
        assert exc.problems
        assert all(p.field in FIELDS for p in exc.problems)


BAD = {
    "n_params": st.sampled_from([0, -1, 1.5, math.nan, math.inf, "seven", "7B5", True, [1]]),
    "layers": st.sampled_from([0, -3, 2.0, "2", False]),
    "micro_batch": st.sampled_from([0, -1, 1.5, None, "4"]),
    "precision": st.sampled_from(["fp64", "", 16, None]),
    "optimizer": st.sampled_from(["rmsprop9", "", None, 3]),
    "zero_stage": st.sampled_from([-1, 4, 2.5, "2", None]),
    "gpus": st.sampled_from([0, -8, 1.0, None]),
    "checkpointing": st.sampled_from(["all", True, None]),
    "gpu": st.sampled_from(["b200", "a100", "", 3]),
    "overhead_gib": st.sampled_from([-0.5, math.nan, "1", None]),
    "tokens": st.sampled_from([0, -1e9, math.inf, "lots"]),
    "mfu": st.sampled_from([0, 1.01, -0.2, math.nan, None]),
    "price_per_gpu_hour": st.sampled_from([-1, math.nan, "2"]),
    "offload_optimizer": st.sampled_from([1, "yes", None]),
    "model": st.sampled_from([5, [1], "gpt5", ""]),
    "hf_config": st.sampled_from([5, "", "/no/such/config.json"]),
    "tensor_parallel": st.sampled_from([0, -1, 1.5, "2", None]),
    "pipeline_parallel": st.sampled_from([0, -2, 2.0, None]),
    "sequence_parallel": st.sampled_from([1, "yes", None]),
    "kv_heads": st.sampled_from([0, -1, 2.5, "4"]),
    "ffn_hidden": st.sampled_from([0, -1, 2.5]),
    "mlp": st.sampled_from(["relu", 3, ""]),
    "tied_embeddings": st.sampled_from([1, "no"]),
}


@SETTINGS
@given(valid_configs(), st.sampled_from(sorted(BAD)), st.data())
def test_random_invalid_configs_raise_value_error_naming_the_field(cfg, field, data):
    bad = data.draw(BAD[field])
    kwargs = {**cfg, field: bad}
    if field == "layers" and "hidden" not in cfg:
        kwargs.update(hidden=8, heads=2, seq_len=4, vocab=5)
    try:
        estimate_memory(**kwargs)
    except ValueError as exc:
        assert isinstance(exc, EstimateInputError)
        assert field in [p.field for p in exc.problems]
    else:
        raise AssertionError(f"{field}={bad!r} was accepted")
