"""What the dry run and the prediction name: the model a preset or a shape builds, what
--simulate needs, and the attention kernel torch runs on the device (pure, no dry run)."""

from __future__ import annotations

import pytest

from workbench.cli import main
from workbench.estimate.activations import Attention, attention_terms, transformer_activation_bytes
from workbench.prediction import estimator_inputs, sdpa_kernel
from workbench.train.dry_run.fake import shape_config


@pytest.mark.parametrize(
    ("preset", "model_type"),
    [
        ("gpt2", "gpt2"),
        ("llama-2-7b", "llama"),
        ("mistral-7b", "mistral"),
        ("qwen2.5-7b", "qwen2"),
        ("pythia-1.4b", "gpt_neox"),
        ("Llama-3-8B", "llama"),
    ],
)
def test_a_preset_builds_its_family(preset: str, model_type: str) -> None:
    config, missing = shape_config({"model": preset, "layers": 2})
    assert missing is None and config is not None
    assert config["model_type"] == model_type
    assert config.get("num_hidden_layers", config.get("n_layer")) == 2


def test_a_count_is_not_a_model_to_build() -> None:
    config, missing = shape_config({"n_params": 7e9})
    assert config is None
    assert missing is not None and "a parameter count is not a model to build" in missing
    assert shape_config({"model": "no-such-model"})[0] is None


def test_simulate_with_params_alone_says_what_it_needs(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["estimate", "--params", "7B", "--simulate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--simulate: needs a model to build on fake tensors" in err
    assert "--model PRESET" in err and "--hf-config FILE" in err
    assert "--params gives a count, not a model to build" in err


@pytest.mark.parametrize(
    ("kernel", "device", "dropout", "expected"),
    [
        ("sdpa", "cpu", True, "math"),  # the CPU flash kernel takes no dropout
        ("sdpa", "cpu", False, "sdpa"),
        ("sdpa", "cuda", True, "sdpa"),  # flash / memory-efficient take dropout
        ("sdpa", None, True, "sdpa"),
        ("megatron", "cpu", True, "megatron"),
        ("eager", "cpu", True, "eager"),
        (None, "cpu", True, None),
    ],
)
def test_the_sdpa_kernel_torch_picks(kernel, device, dropout, expected) -> None:
    assert sdpa_kernel(kernel, device, dropout) == expected


def test_the_math_kernel_terms_are_hand_counted() -> None:
    """One layer, s 64, b 8, h 128, a 4 (f 4h): the math kernel keeps one fp32 s x s
    tensor, three with dropout, and under 16-bit compute fp32 copies of Q, K and V (2 more
    bytes each of 3sbh); nothing else of the attention differs from megatron's."""
    s, b, h, a = 64, 8, 128, 4
    sbh, as2b = s * b * h, a * s * s * b
    shape = dict(layers=1, hidden=h, heads=a, seq_len=s, micro_batch=b, vocab=256)
    for e in (2, 4):
        for dropout in (True, False):
            math = transformer_activation_bytes(
                **shape, attention="math", dropout=dropout, activation_bytes_per_element=e
            )
            megatron = transformer_activation_bytes(
                **shape, attention="megatron", dropout=dropout, activation_bytes_per_element=e
            )
            scores_math = 4 * (3 if dropout else 1) * as2b + (4 - e) * 3 * sbh
            scores_megatron = e * 2 * as2b + as2b if dropout else e * as2b
            assert math.per_layer_bytes - megatron.per_layer_bytes == (
                scores_math - scores_megatron
            )
            assert math.attention == "math"


def test_math_is_an_estimator_choice_and_the_sessions_sdpa_on_a_cpu() -> None:
    assert Attention("math") is Attention.MATH
    assert attention_terms("math") == "math"
    from types import SimpleNamespace

    from workbench.config import TrainConfig

    info = SimpleNamespace(
        n_params=1, layers=2, hidden=64, heads=4, seq_len=32, vocab=96, dropout=0.1
    )
    cfg = TrainConfig(attention="sdpa")
    assert estimator_inputs(cfg, model=info, device="cpu")["attention"] == "math"
    assert estimator_inputs(cfg, model=info, device="cuda")["attention"] == "sdpa"
