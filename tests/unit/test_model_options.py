"""Options of the built-in models: every problem named before anything is allocated."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.models import MODEL_NAMES, _approx_size, build_model, model_options, option_problems

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "100"))


@pytest.mark.parametrize(
    ("name", "options", "pattern"),
    [
        ("tiny-gpt", {"heads": 3}, r"heads=3: must divide hidden=128 evenly"),
        (
            "tiny-gpt",
            {"hidden": 100_000},
            r"hidden=100000: must be an integer >= 1, at most 65,536",
        ),
        (
            "tiny-gpt",
            {"hidden": 65536, "layers": 64},
            r"about 3,298.6B parameters: more than the 2B",
        ),
        (
            "mlp",
            {"samples": 10**7, "in_features": 10**5},
            r"GiB of generated data: more than 4 GiB",
        ),
        ("mlp", {"hidden": 10**70}, r"hidden=<an integer of about 71 digits>"),
        ("mlp", {"depth": True}, r"depth=True: must be an integer"),
        ("cnn", {"image_size": 10}, r"image_size=10: must be a multiple of 4"),
        ("tiny-gpt", {"dropout": float("nan")}, r"dropout=nan: must be a number in \[0, 1\)"),
        ("tiny-gpt", {"text": 5}, r"text=5: must be a path to a text file"),
        ("tiny-gpt", {"text": "/dev/zero"}, r"text=./dev/zero.: not a regular file"),
        ("tiny-gpt", {"text": "missing.txt"}, r"text=.missing.txt.: no such file \(a text file"),
        ("mlp", {"colour": 1}, r"unknown option\(s\) colour; allowed: in_features=64"),
    ],
)
def test_bad_options_are_named_before_anything_is_built(name, options, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        build_model(name, **options)


def test_every_problem_of_the_options_is_listed_at_once() -> None:
    problems = option_problems("tiny-gpt", {"layers": 0, "heads": 0, "dropout": 2, "x": 1})
    assert len(problems) == 4, problems
    assert any("unknown option(s) x" in p for p in problems)
    assert any("layers=0" in p for p in problems) and any("heads=0" in p for p in problems)
    assert any("dropout=2" in p for p in problems)


def test_numpy_integers_are_integers() -> None:
    module, _, _, info = build_model("mlp", hidden=np.int64(8), samples=np.int32(16), depth=1)
    assert info.hidden == 8 and type(info.hidden) is int


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.sampled_from(MODEL_NAMES),
    st.dictionaries(
        st.sampled_from(
            [
                "layers",
                "hidden",
                "heads",
                "seq_len",
                "depth",
                "samples",
                "image_size",
                "channels",
                "classes",
                "dropout",
                "text",
                "seed",
                "nope",
            ]
        ),
        st.one_of(
            st.integers(min_value=-5, max_value=10**12),
            st.floats(allow_nan=True),
            st.text(max_size=4),
            st.none(),
            st.booleans(),
        ),
        max_size=4,
    ),
)
def test_any_options_are_either_buildable_or_named(name: str, options: dict[str, Any]) -> None:
    problems = option_problems(name, options)
    if problems:
        with pytest.raises(ValueError):
            build_model(name, **options)
        return
    assert set(options) <= set(model_options(name))
    params, data_bytes = _approx_size(name, {**model_options(name), **options})
    if params < 2_000_000 and data_bytes < 20_000_000:  # small enough to build here
        _, _, _, info = build_model(name, **options)
        assert info.n_params > 0
