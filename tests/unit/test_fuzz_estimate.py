"""Fuzz tests of the estimator's entry points (hypothesis): hostile and careless input gives
a clear error or a valid result, never another exception, never a hang, never `inf`/`nan`.

* `workbench estimate` flags, in-process through `workbench.cli.main`: exit 0 or 2;
* `estimate_memory(**kwargs)`: a `MemoryEstimate` with finite figures, or `ValueError`;
* `read_hf_config` on generated config.json dicts and files (wrong types, nesting, keys
  given twice): (fields, problems), never an exception.

Each test runs a few hundred examples (a second or two); WORKBENCH_FUZZ_EXAMPLES raises the
count for a longer run.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workbench.cli import main
from workbench.estimate import (
    FAMILIES,
    GPUS,
    MODELS,
    EstimateInputError,
    MemoryEstimate,
    estimate_memory,
    read_hf_config,
)
from workbench.estimate.limits import MAX_BYTES_PER_GPU
from workbench.inputs import shown

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "0") or 0)


def fuzz_settings(default: int) -> Any:
    # capsys is read out at the start of each example, so sharing it between them is safe
    return settings(
        max_examples=EXAMPLES or default,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


# ------------------------------------------------------------------ hostile values
HUGE = st.sampled_from([10**20, 10**59, 10**65, 2**64, 10**400, -(10**400), 10**5000])
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [1e300, -1e300, 1e308, 5e-324, -0.0, 0.5, 1.5, 1e20]
)
NUMPY = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 2**32 - 1).map(np.uint32),
    st.floats(width=32).map(np.float32),
    st.floats().map(np.float64),
    st.booleans().map(np.bool_),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5000),
    st.integers(),
    HUGE,
    FLOATS,
    NUMPY,
    st.text(max_size=20),
    st.sampled_from(["7B", "1,2,3", "1,000", "1e400", "nan", "inf", "", " ", "\x00", "1_0"]),
)
HOSTILE = st.one_of(
    SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), SCALARS)
)

SMALL_SHAPE = dict(layers=2, hidden=64, heads=4, seq_len=128, vocab=100)
VALID: dict[str, Any] = {
    "model": st.sampled_from(list(MODELS)),
    "n_params": st.sampled_from([10**6, 7 * 10**9, "7B", 1.5e9, "124,439,808"]),
    "layers": st.integers(1, 48),
    "hidden": st.sampled_from([64, 256, 4096]),
    "heads": st.sampled_from([1, 4, 32]),
    "seq_len": st.integers(1, 8192),
    "vocab": st.integers(1, 200_000),
    "kv_heads": st.sampled_from([1, 2, 4, 8]),
    "ffn_hidden": st.integers(1, 20_000),
    "mlp": st.sampled_from(["gelu", "swiglu"]),
    "norm": st.sampled_from(["layernorm", "rmsnorm"]),
    "bias": st.sampled_from(["all", "qkv", "none"]),
    "positions": st.sampled_from(["learned", "rotary"]),
    "tied_embeddings": st.booleans(),
    "parallel_residual": st.booleans(),
    "micro_batch": st.integers(1, 10**6),
    "precision": st.sampled_from(["fp32", "amp-bf16", "bf16", "fp16"]),
    "optimizer": st.sampled_from(["adamw", "sgd", "lion"]),
    "zero_stage": st.integers(0, 3),
    "gpus": st.sampled_from([1, 2, 8, 64, 10**7]),
    "tensor_parallel": st.sampled_from([1, 2, 4]),
    "pipeline_parallel": st.sampled_from([1, 2]),
    "sequence_parallel": st.booleans(),
    "offload_optimizer": st.booleans(),
    "offload_params": st.booleans(),
    "fsdp": st.sampled_from(["off", "full_shard", "no_shard"]),
    "checkpointing": st.sampled_from(["none", "selective", "full"]),
    "dropout": st.booleans(),
    "gpu": st.sampled_from(list(GPUS)),
    "overhead_gib": st.floats(0, 1024),
    "tokens": st.floats(1, 1e16) | st.sampled_from(["300B", 10**16]),
    "mfu": st.floats(0.001, 1),
    "price_per_gpu_hour": st.floats(0, 1e6),
    "accounting": st.sampled_from(["paper", "deepspeed", "fsdp"]),
}


@st.composite
def estimator_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    """A few fields, each valid or hostile; usually a small shape so that the deeper checks
    (parallel splits, activations, time and cost) are reached."""
    kwargs: dict[str, Any] = dict(SMALL_SHAPE) if draw(st.booleans()) else {}
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=6, unique=True)):
        kwargs[name] = draw(HOSTILE if draw(st.integers(0, 3)) == 0 else VALID[name])
    return kwargs


def _finite_figures(e: MemoryEstimate) -> None:
    """Every figure finite and sane; the dict JSON-ready without NaN or Infinity."""
    json.dumps(e.to_dict(), allow_nan=False)
    for name in ("train_flops", "train_seconds", "cost"):
        value = getattr(e, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    assert 0 <= e.total_bytes <= 16 * 10**16 + MAX_BYTES_PER_GPU
    assert e.micro_batch <= 10**6 and e.gpus <= 10**7


@fuzz_settings(400)
@given(estimator_kwargs())
def test_estimate_memory_gives_a_result_or_a_value_error(kwargs):
    try:
        e = estimate_memory(**kwargs)
    except ValueError as exc:
        event("ValueError")
        _names_the_inputs(exc, kwargs)
    else:
        event("estimate")
        _finite_figures(e)


def _names_the_inputs(exc: ValueError, kwargs: dict[str, Any]) -> None:
    """One `EstimateInputError` listing each problem as `field=value: what is allowed` (or
    `field is missing: ...`, for a field not given or given as None), the value shown
    bounded."""
    assert isinstance(exc, EstimateInputError), (type(exc).__name__, str(exc)[:300])
    text = str(exc)
    assert exc.problems and len(text) < 20_000
    for p in exc.problems:
        line = str(p)
        assert p.field and p.message and line in text, (line, text[:300])
        if p.missing:  # not given, or given as None
            assert line.startswith(f"{p.field} is missing: "), line
            assert kwargs.get(p.field) is None, (p.field, kwargs[p.field])
        else:
            assert line.startswith(f"{p.field}={shown(p.value)}: "), line


# ------------------------------------------------------------------ the CLI
FLAG_TEXT = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.integers(20, 6000).map(lambda digits: "9" * digits),
    FLOATS.map(repr),
    st.sampled_from(
        ["1e20", "1e59", "1e300", "1e308", "inf", "nan", "-0", "1,2,3", "1,000", "1_000", "7B"]
    ),
    st.text(max_size=12),
)
VALUE_FLAGS = {
    "--model": st.sampled_from(list(MODELS)),
    "--params": st.sampled_from(["7B", "1e9", "350M"]),
    "--layers": st.sampled_from(["2", "12"]),
    "--hidden": st.sampled_from(["64", "768"]),
    "--heads": st.sampled_from(["4", "12"]),
    "--seq-len": st.sampled_from(["128", "1024"]),
    "--vocab": st.sampled_from(["100", "50257"]),
    "--kv-heads": st.sampled_from(["1", "4"]),
    "--ffn-hidden": st.sampled_from(["256", "3072"]),
    "--mlp": st.sampled_from(["gelu", "swiglu"]),
    "--norm": st.sampled_from(["layernorm", "rmsnorm"]),
    "--bias": st.sampled_from(["all", "none"]),
    "--positions": st.sampled_from(["learned", "rotary"]),
    "--embeddings": st.sampled_from(["tied", "untied"]),
    "--micro-batch": st.sampled_from(["1", "8"]),
    "--precision": st.sampled_from(["fp32", "bf16"]),
    "--optimizer": st.sampled_from(["adamw", "sgd"]),
    "--zero": st.sampled_from(["0", "3"]),
    "--fsdp": st.sampled_from(["off", "full_shard"]),
    "--gpus": st.sampled_from(["1", "8"]),
    "--tp": st.sampled_from(["1", "2"]),
    "--pp": st.sampled_from(["1", "2"]),
    "--checkpointing": st.sampled_from(["none", "full"]),
    "--gpu": st.sampled_from(["h100", "t4"]),
    "--overhead-gib": st.sampled_from(["0", "1.5"]),
    "--tokens": st.sampled_from(["300e9", "1e16"]),
    "--mfu": st.sampled_from(["0.4", "0.001"]),
    "--price-per-gpu-hour": st.sampled_from(["2", "1e6"]),
    "--units": st.sampled_from(["gib", "gb"]),
}
SWITCHES = [
    "--parallel-residual",
    "--sequence-parallel",
    "--offload-optimizer",
    "--offload-params",
    "--json",
    "--compare-stages",
]
_NOT_FINITE = re.compile(r"\b(inf|infinity|nan)\b", re.IGNORECASE)


@st.composite
def estimate_argv(draw: st.DrawFn) -> list[str]:
    argv: list[str] = list(
        draw(
            st.sampled_from(
                [
                    [],
                    ["--params", "1e9"],
                    ["--model", "gpt2"],
                    ["--layers=2", "--hidden=64", "--heads=4", "--seq-len=128", "--vocab=100"],
                ]
            )
        )
    )
    flags = sorted(set(VALUE_FLAGS) - {a.split("=")[0] for a in argv})
    for flag in draw(st.lists(st.sampled_from(flags), max_size=6, unique=True)):
        text = draw(FLAG_TEXT if draw(st.integers(0, 3)) == 0 else VALUE_FLAGS[flag])
        argv += [f"{flag}={text}"] if draw(st.booleans()) else [flag, text]
    if draw(st.integers(0, 2)) == 0:
        argv += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    return draw(st.permutations(argv)) if draw(st.integers(0, 3)) == 0 else argv


@fuzz_settings(250)
@given(estimate_argv())
def test_estimate_cli_exits_0_or_2_with_one_line(capsys, argv):
    capsys.readouterr()
    try:
        code = main(["estimate", *argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, out, err)
    event(f"exit {code}")
    assert "Traceback" not in out + err
    if code == 2:
        assert out == "" and len(err.strip().splitlines()) == 1, (argv, err)
        assert err.startswith("usage:") or "error:" in err
    else:
        assert err == "" and not _NOT_FINITE.search(out), (argv, out)
        if "--json" in argv and out.lstrip().startswith("{"):
            json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


# ------------------------------------------------------------------ read_hf_config
KEYS = [
    "model_type",
    "n_layer",
    "n_embd",
    "n_head",
    "n_positions",
    "n_inner",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",
    "tie_word_embeddings",
    "use_parallel_residual",
    "attention_bias",
    "mlp_bias",
]
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70_000),
    st.integers(),
    st.sampled_from([10**400, 2**64, 10**10]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["false", "no", "4096", *FAMILIES]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
GOOD = {
    "model_type": st.sampled_from(FAMILIES),
    "n_layer": st.just(2),
    "n_embd": st.just(64),
    "n_head": st.just(4),
    "n_positions": st.just(128),
    "n_inner": st.none() | st.just(256),
    "num_hidden_layers": st.just(2),
    "hidden_size": st.just(64),
    "num_attention_heads": st.just(4),
    "num_key_value_heads": st.sampled_from([None, 1, 2, 4]),
    "intermediate_size": st.just(172),
    "vocab_size": st.just(100),
    "max_position_embeddings": st.just(256),
    "head_dim": st.sampled_from([None, 16, 8]),
    "tie_word_embeddings": st.booleans(),
    "use_parallel_residual": st.booleans(),
    "attention_bias": st.booleans(),
    "mlp_bias": st.booleans(),
}


@st.composite
def hf_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A config of one of the families with some keys left out, some wrong, some extra."""
    config: dict[str, Any] = {}
    for key in KEYS:
        choice = draw(st.integers(0, 9))
        if choice < 6:
            config[key] = draw(GOOD[key])
        elif choice < 9:
            config[key] = draw(JSON_VALUES)
    config.update(draw(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=2)))
    return config


def _check_read(source: Any) -> None:
    fields, problems = read_hf_config(source)
    assert isinstance(fields, dict) and isinstance(problems, list)
    assert not (fields and problems)
    for p in problems:
        assert p.field == "hf_config" and p.message and len(str(p)) < 2_000
    event("problems" if problems else "fields")
    if fields:
        try:
            e = estimate_memory(hf_config=source)
        except ValueError as exc:
            _names_the_inputs(exc, {"hf_config": source})
        else:
            _finite_figures(e)


@fuzz_settings(300)
@given(hf_configs())
def test_read_hf_config_of_a_dict_never_raises(config):
    _check_read(config)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_configs")


def _json_text(config: dict[str, Any]) -> str:
    """json.dumps, with integers too long for `str` written digit by digit."""
    try:
        return json.dumps(config)
    except ValueError:  # an integer of more than 4,300 digits
        return json.dumps({k: v for k, v in config.items() if not isinstance(v, int)})


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """The JSON text of a generated config, sometimes damaged: a key given twice, nested
    deep, cut short, NaN, a huge number, or not JSON at all."""
    text = _json_text(draw(hf_configs()))
    damage = draw(st.integers(0, 7))
    if damage == 1 and len(text) > 2:
        key = draw(st.sampled_from(KEYS))
        text = text[:-1] + (", " if text != "{}" else "") + f'"{key}": 320}}'
        text = text.replace("{, ", "{")
    elif damage == 2:
        depth = draw(st.sampled_from([65, 1000, 200_000]))
        text = '{"model_type": ' + "[" * depth + "]" * depth + "}"
    elif damage == 3:
        text = text[: draw(st.integers(0, len(text)))]
    elif damage == 4:
        text = (
            text[:-1]
            + ', "hidden_size": '
            + draw(st.sampled_from(["NaN", "1e400", "-Infinity"]))
            + "}"
        )
    elif damage == 5:
        text = '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}"
    elif damage == 6:
        text = draw(st.text(max_size=40))
    return text


@fuzz_settings(200)
@given(config_texts(), st.booleans())
def test_read_hf_config_of_a_file_never_raises(folder, text, as_folder):
    path = folder / "config.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _check_read(folder if as_folder else path)
    _check_read(str(path))
