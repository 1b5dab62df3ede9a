"""Fuzz tests (hypothesis) of `workbench export`'s arguments and of `import_deepspeed`:
whatever the input, a valid result or a clear error (exit 2 / ValueError), never another
exception, never a hang.

Each test runs a few dozen cheap examples; WORKBENCH_FUZZ_EXAMPLES raises the count for a
longer run (e.g. `WORKBENCH_FUZZ_EXAMPLES=2000 pytest tests/unit/test_fuzz_export.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.deepspeed import import_deepspeed, to_deepspeed
from workbench.inputs import shown


def examples(default: int) -> int:
    """`default`, or WORKBENCH_FUZZ_EXAMPLES when it is set (a longer run)."""
    text = os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "")
    return int(text) if text.isdigit() and int(text) > 0 else default


FUZZ = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ----------------------------------------------------------------------------- values
#: numbers a careless or hostile user writes: huge, tiny, negative, not finite, text
NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, 2, 3, 7, -1, 2**53 + 1, 2**63, 2**64, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    NUMBERS,
    st.sampled_from(["auto", "true", "false", "no", "3", "1e-3", "1_000", "cpu", "nvme", ""]),
    st.text(max_size=12),
)
#: the keys DeepSpeed configs use, and some it does not
KEYS = st.sampled_from(
    [
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "optimizer",
        "scheduler",
        "type",
        "params",
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "momentum",
        "warmup_num_steps",
        "total_num_steps",
        "zero_optimization",
        "stage",
        "offload_optimizer",
        "offload_param",
        "device",
        "nvme_path",
        "fp16",
        "bf16",
        "enabled",
        "initial_scale_power",
        "gradient_clipping",
        "torch_autocast",
        "dtype",
        "steps_per_print",
        "zero_allow_untested_optimizer",
        "__class__",
        "bogus",
    ]
)
JSONISH = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(KEYS | st.text(max_size=6), children)
    ),
    max_leaves=12,
)
TYPES = st.sampled_from(
    ["AdamW", "Adam", "SGD", "Lamb", "Lion", "Adagrad", "OneCycle", "WarmupLR", "__class__"]
    + ["WarmupCosineLR", "WarmupDecayLR", "StepLR", "_private", "Optimizer", "x" * 300]
)


@st.composite
def deepspeed_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A DeepSpeed config near a real one: real keys, then values bent out of shape."""
    ds: dict[str, Any] = to_deepspeed(
        draw(st.sampled_from([TrainConfig(), TrainConfig(zero_stage=2, precision="bf16")]))
    )
    for _ in range(draw(st.integers(0, 4))):
        block = draw(st.sampled_from(["", "optimizer", "zero_optimization", "scheduler", "fp16"]))
        target = ds if not block else ds.setdefault(block, {})
        if not isinstance(target, dict):
            continue
        if block in ("optimizer", "scheduler") and draw(st.booleans()):
            target["type"] = draw(TYPES)
            target = target.setdefault("params", {})
            if not isinstance(target, dict):
                continue
        target[draw(KEYS)] = draw(JSONISH)
    return ds


def check_import(source: Any) -> None:
    """A valid import or a ValueError naming what is wrong, nothing else: each problem as
    data (its key path or setting, the value shown bounded, the reason), all in the text."""
    try:
        result = import_deepspeed(source)
    except ValueError as exc:
        named_problems(exc, source)
    else:
        assert isinstance(result.config, TrainConfig)
        assert result.world_size >= 1
        assert all(isinstance(w, str) for w in result.warnings)


def named_problems(exc: ValueError, source: Any) -> None:
    """`exc` lists its problems, each `field=value: reason` (or `field: reason` when no
    single value is at fault; the reason alone for the config as a whole) in its text; a
    file that holds no config at all (not JSON, not an object) is named with the reason."""
    text = str(exc)
    assert "Traceback" not in text and len(text) < 20_000
    problems = getattr(exc, "problems", None)
    if problems is None and isinstance(source, (str, Path)):
        assert text.startswith(f"DeepSpeed config {shown(str(source))}: "), text[:300]
        assert len(text) > len(f"DeepSpeed config {shown(str(source))}: ")
        return
    assert problems, f"{type(exc).__name__} without its problems as data: {text[:300]}"
    for p in problems:
        assert p.message, p
        line = str(p)
        assert line in text, (line, text[:300])
        if not p.field:
            continue
        value_text = getattr(p, "value_text", None)
        if value_text == "":
            assert line.startswith(f"{p.field}: "), line
        else:
            value = shown(p.value) if value_text is None else value_text
            assert line.startswith(f"{p.field}={value}: "), line


@FUZZ
@given(deepspeed_configs())
def test_import_deepspeed_of_a_bent_config_is_a_config_or_a_value_error(ds: dict) -> None:
    check_import(ds)


@FUZZ
@given(JSONISH)
def test_import_deepspeed_of_any_json_value_is_a_config_or_a_value_error(value: Any) -> None:
    check_import(value if isinstance(value, dict) else {"train_micro_batch_size_per_gpu": value})


@FUZZ
@given(
    ds=deepspeed_configs(),
    duplicate=st.booleans(),
    depth=st.sampled_from([0, 1, 40, 5000]),
    junk=st.sampled_from(["", "}", "\x00", "\ufffe", "1e400", "NaN", "[1,"]),
)
def test_import_deepspeed_of_a_bent_file_is_a_config_or_a_value_error(
    tmp_path: Path, ds: dict, duplicate: bool, depth: int, junk: str
) -> None:
    text = json.dumps(ds, default=str) if all(isinstance(k, str) for k in ds) else "{}"
    if duplicate:  # a key given twice: refused, never the last one taken
        text = text[:-1] + ', "zero_optimization": {"stage": 3}}'
    if depth:
        text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    text += junk
    path = tmp_path / "ds.json"
    try:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    except UnicodeEncodeError:
        path.write_bytes(text.encode("utf-8", "replace"))
    check_import(str(path))
    if duplicate:
        with pytest.raises(
            ValueError, match="appears twice|not valid JSON|nested deeper|must be finite"
        ):
            import_deepspeed(str(path))


@settings(max_examples=examples(10), deadline=None)
@given(st.binary(max_size=200))
def test_import_deepspeed_of_binary_bytes_is_a_value_error(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ds.json"
        path.write_bytes(data)
        check_import(path)


# ----------------------------------------------------------------------------- workbench export
#: flag values a careless or hostile user types
FLAG_TEXT = st.one_of(
    st.sampled_from(
        ["0", "1", "2", "-1", "3", "1e3", "1_000", "nan", "inf", "1e400", "0x10", " 2 ", ""]
        + [str(2**64), "9" * 80, "two", "true", "cpu", "none", "nvme", "\x00", "🙂", "-"]
    ),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=8),
)
VALUED_FLAGS = [
    "--gpus",
    "--nodes",
    "--steps",
    "--seed",
    "--micro-batch",
    "--grad-accum",
    "--zero",
    "--lr",
    "--precision",
    "--optimizer",
    "--fsdp",
    "--lr-schedule",
    "--warmup-steps",
    "--total-steps",
    "--clip-grad-norm",
    "--offload-optimizer",
    "--offload-params",
    "--loss-scale-init",
    "--num-workers",
    "--format",
    "--hostfile",
    "--config",
]
#: a valid value of each flag (drawn 3 times in 4, so that many examples export a job)
VALID = {
    "--gpus": ["1", "2", "4"],
    "--nodes": ["1", "2"],
    "--steps": ["5"],
    "--seed": ["3", str(2**32 - 1)],
    "--micro-batch": ["2"],
    "--grad-accum": ["2"],
    "--zero": ["0", "1", "2", "3"],
    "--lr": ["0.001"],
    "--precision": ["fp32", "bf16", "amp-bf16"],
    "--optimizer": ["adamw", "sgd"],
    "--fsdp": ["off"],
    "--lr-schedule": ["cosine", "onecycle"],
    "--warmup-steps": ["1"],
    "--total-steps": ["10"],
    "--clip-grad-norm": ["1.0"],
    "--offload-optimizer": ["none"],
    "--offload-params": ["none"],
    "--loss-scale-init": ["65536"],
    "--num-workers": ["0"],
    "--format": ["deepspeed", "lightning"],
}
MLP_OPTIONS = st.sampled_from(
    ["hidden", "depth", "in_features", "out_features", "samples", "seed", "heads", "x", ""]
)


@st.composite
def export_argv(draw: st.DrawFn) -> list[str]:
    """`workbench export` flags: the cheap 'mlp' model with tiny options, then a few flags
    with generated values."""
    models = ["mlp", "mlp", "mlp", "cnn", "gpt9", "pkg.mod:make", "a:"]
    argv = ["--model", draw(st.sampled_from(models))]
    argv += ["--model-option", "hidden=4", "--model-option", "samples=64"]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        argv += ["--model-option", f"{draw(MLP_OPTIONS)}={draw(FLAG_TEXT)}"]
    for flag in draw(st.lists(st.sampled_from(VALUED_FLAGS), max_size=5, unique=True)):
        valid = VALID.get(flag)
        bad = not valid or draw(st.sampled_from([True, False, False, False]))
        argv += [flag, draw(FLAG_TEXT) if bad else draw(st.sampled_from(valid))]
    return argv


def run_export(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`workbench.cli.main(["export", ...])` in-process: its exit status (0, or argparse's 2),
    and what it printed; any other exception fails the test."""
    try:
        code = main(["export", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@FUZZ
@given(argv=export_argv())
def test_export_with_generated_flags_writes_a_job_or_exits_2(
    argv: list[str], tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path_factory.mktemp("job")
    code, out, err = run_export(["--out", str(out_dir / "job"), *argv], capsys)
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("workbench export: error: ") and err.count("\n") == 1, err
        assert not (out_dir / "job").exists()  # nothing written
    else:
        assert (out_dir / "job" / "job.json").is_file() and out.startswith("wrote ")


@FUZZ
@given(
    gpus=NUMBERS, nodes=NUMBERS, steps=st.one_of(st.none(), NUMBERS), options=JSONISH, model=KEYS
)
def test_export_job_of_generated_arguments_writes_a_job_or_raises_value_error(
    gpus: Any, nodes: Any, steps: Any, options: Any, model: str, tmp_path_factory: Any
) -> None:
    from workbench.export import export_job

    out_dir = tmp_path_factory.mktemp("api") / "job"
    for name in (model, "mlp"):
        try:
            export_job(
                TrainConfig(),
                gpus=gpus,
                nodes=nodes,
                steps=steps,
                out_dir=out_dir,
                model=name,
                model_options=options if isinstance(options, dict) else {"hidden": options},
            )
        except ValueError as exc:
            assert str(exc).startswith("cannot export")
            assert not out_dir.exists()
