"""`workbench estimate --simulate`: the dry run of a config.json's model beside the formula."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    return path


def test_simulate_prints_the_dry_run_beside_the_formula(config, capsys) -> None:
    args = ["estimate", "--hf-config", str(config), "--seq-len", "64", "--micro-batch", "2"]
    code, out, _ = _run([*args, "--simulate", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    dry, formula = data["dry_run"], data["estimate"]
    # the model states are the same bytes on both sides; the peak is measured
    assert dry["params_bytes"] == formula["params_bytes"]
    assert dry["peak_bytes"] > dry["params_bytes"]
    code, out, _ = _run([*args, "--simulate"], capsys)
    assert code == 0 and "dry run vs formula" in out and "peak of a step" in out


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--zero", "2", "--offload-optimizer", "cpu", "--gpus", "2"], "offload is not"),
        (["--checkpointing", "selective"], "--checkpointing selective: the dry run"),
        (["--loss-chunks", "4"], "--loss-chunks: not simulated (the dry run runs the model"),
        (["--no-dropout"], "--no-dropout: not simulated"),
        (["--layers", "3"], "--layers: not simulated (the dry run builds the config.json as"),
    ],
)
def test_simulate_refuses_what_it_cannot_run(config, capsys, extra, expected) -> None:
    code, _, err = _run(["estimate", "--hf-config", str(config), "--simulate", *extra], capsys)
    assert code == 2 and expected in err


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--lora-rank", "8"], "LoRA rank 8"),
        (["--optimizer-in-backward"], "optimizer in backward"),
        (["--attention", "eager"], None),
    ],
)
def test_simulate_runs_the_setup_the_estimate_shows(config, capsys, extra, said) -> None:
    """Every setting of the estimate reaches the dry run: its header names it, and its
    formula is the estimate's own figure (the same setup on both sides)."""
    args = ["estimate", "--hf-config", str(config), "--seq-len", "64", *extra]
    code, out, _ = _run([*args, "--simulate", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["dry_run"]["formula"]["peak_bytes"] == data["estimate"]["peak_bytes"]
    if said is not None:
        code, out, _ = _run([*args, "--simulate"], capsys)
        header = next(line for line in out.splitlines() if line.startswith("dry run of a step"))
        assert said in header


def test_simulate_runs_deepspeed_zero_on_fake_ranks(config, capsys) -> None:
    """`--zero 2 --precision bf16 --gpus 2`: DeepSpeed's own engine on a fake group of two
    ranks; its model states are the formula's DeepSpeed layout to the byte."""
    args = ["estimate", "--hf-config", str(config), "--seq-len", "64", "--micro-batch", "2"]
    zero = ["--zero", "2", "--precision", "bf16", "--gpus", "2"]
    code, out, _ = _run([*args, *zero, "--simulate", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    dry, formula = data["dry_run"], data["estimate"]
    assert (dry["engine"], dry["zero_stage"], dry["world_size"]) == ("deepspeed", 2, 2)
    assert dry["params_bytes"] == formula["params_bytes"]
    assert (
        dry["optimizer_bytes"] - formula["optimizer_bytes"] == dry["optimizer_step_counter_bytes"]
    )
    # the step makes an fp32 copy of the bf16 gradient partition (twice its bytes), held
    # as a step temporary until the optimizer takes it as the masters' gradient
    step = dry["points"]["optimizer step"]
    made = step["optimizer step temporaries"] + step["DeepSpeed fp32 gradient partition"]
    assert made >= 2 * dry["grads_bytes"] > 0


def test_simulate_needs_a_model_to_build(capsys) -> None:
    code, _, err = _run(["estimate", "--params", "7B", "--simulate"], capsys)
    assert code == 2 and "--simulate: needs a model to build on fake tensors" in err
    assert "--model PRESET" in err and "--hf-config FILE" in err and "--layers" in err
    assert "--params gives a count, not a model to build" in err


def test_a_session_simulates_its_own_setup_and_memory_shows_it() -> None:
    from workbench import Session, TrainConfig

    tiny = dict(layers=2, hidden=64, heads=4, seq_len=32)
    with Session(TrainConfig(micro_batch=8), model_options=tiny) as s:
        s.run(optimizer_steps=1)
        before = {k: v.clone() for k, v in s.model.state_dict().items()}
        run = s.simulate(progress=False)
        assert s.simulate() is run  # cached per setup
        assert run.params_bytes == s.memory().params_bytes  # the same model states
        report = s.memory()
        assert report.dry_run is run and "dry run" in str(report)
        assert all((before[k] == v).all() for k, v in s.model.state_dict().items())
        s.update(micro_batch=4)
        assert s.memory().dry_run is None  # another setup: not simulated yet
        assert s.simulate(progress=False) is not run


def test_every_preset_builds_as_a_transformers_model_of_its_count() -> None:
    """The dry run of a preset or shape builds a transformers model of it (hf_shape.config_of)
    on the meta device: its parameter count is the preset's."""
    from workbench.estimate import get_model, model_names
    from workbench.estimate.hf_build import meta_module
    from workbench.estimate.hf_shape import config_of

    for name in model_names():
        arch = get_model(name).architecture
        module, problems = meta_module(config_of(arch))
        assert problems == [] and module is not None, name
        assert sum(p.numel() for p in module.parameters()) == arch.n_params, name
