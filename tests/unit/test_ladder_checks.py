"""The optimization ladder's pure parts: bad input named before anything runs, the default
ladder, each rung's steps / learning rate / schedule over the shared sample budget, and the
report (speed-ups with their spread, verdicts, time to target, table, JSON, chart) from
hand-made measurements."""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest

from workbench import TrainConfig
from workbench.inputs import shown
from workbench.train.ladder import Rung, default_rungs, ladder, plan_ladder
from workbench.train.ladder import run as ladder_run
from workbench.train.ladder import rungs as ladder_rungs
from workbench.train.ladder.report import (
    RungPlan,
    RunMeasure,
    rate_band,
    spread,
    summarize,
    windows,
)

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 256}


def plan(rungs, steps=4, **kw):
    return plan_ladder(rungs, "mlp", steps, model_options=MLP, device="cpu", **kw)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("rungs", "steps", "message"),
    [
        (None, 0, r"steps=0: must be an integer >= 1"),
        (
            [{}, {"precison": "amp-bf16"}],
            4,
            r"precison='amp-bf16': unknown setting; did you mean 'precision'\?",
        ),
        (
            [{}, {"name": "again", "precision": "fp32"}],
            4,
            r"rung 2 'again': changes nothing \(precision='fp32'",
        ),
        ([{}, {"grad_accum": 3}], 4, r"its effective batch 24 must divide .* use steps=6"),
        ([{}, {"grad_accum": 4}], 4, r"at least 2 steps; use steps=8"),
        ([{"name": "a"}, {"name": "a", "grad_accum": 2}], 4, r"rung name 'a': used twice"),
        ([{}, {"device": "cuda"}], 4, r"device='cuda': the ladder runs every rung on one device"),
        ([{}, {"ranks": 0}], 4, r"ranks=0: must be an integer >= 1"),
        ([{}, {"rank": 2}], 4, r"rank=2: unknown setting; did you mean 'ranks'\?"),
        ([{}, {"accumulate_grad_batches": 2}], 4, r"did you mean 'grad_accum'\?"),
        ([{}, {"lr": -1.0}], 4, r"rung 2 .*lr=-1.0: must be a finite number > 0"),
        ([{}, "fast"], 4, r"rung 2: 'fast': must be a mapping of settings"),
        ([], 4, r"rungs=\[\]: name at least the baseline rung"),
    ],
)
def test_bad_input_is_named_before_anything_runs(monkeypatch, rungs, steps, message) -> None:
    def must_not_run(*args, **kwargs):
        raise AssertionError("the ladder ran despite bad input")

    monkeypatch.setattr(ladder_run, "run_plan", must_not_run)
    with pytest.raises(ValueError, match=message):
        ladder(rungs, "mlp", steps, model_options=MLP, device="cpu")


def test_more_ranks_than_this_machine_has_cores_is_refused() -> None:
    ranks = (os.cpu_count() or 1) + 1
    with pytest.raises(ValueError, match=rf"ranks={ranks}: this machine has \d+ CPU core"):
        plan([{}, {"ranks": ranks}], steps=2 * ranks)


def test_every_problem_is_named_at_once() -> None:
    rungs = [{}, {"name": "x", "precison": "amp-bf16"}, {"name": "y", "lr_scaling": "cubic"}]
    with pytest.raises(ValueError) as info:
        plan(rungs, repeats=0, target_loss=math.nan)
    text = str(info.value)
    assert text.startswith("2 problems in the ladder")
    assert "repeats=0: must be an integer >= 1" in text
    assert "target_loss=nan: must be a finite number or None" in text
    with pytest.raises(ValueError) as info:
        plan(rungs)
    text = str(info.value)
    assert "rung 2 'x': precison=" in text and "rung 3 'y': lr_scaling='cubic'" in text


def test_what_a_machine_cannot_run_is_said_once_per_problem() -> None:
    with pytest.raises(ValueError) as info:
        plan([{}, {"name": "dp", "precision": "amp-fp16", "ranks": 2}])
    lines = [ln for ln in str(info.value).splitlines() if "amp-fp16" in ln]
    assert len(lines) == 1 and "use precision='fp16'" in lines[0]


# --------------------------------------------------------------------------- the default ladder
def test_default_ladder_follows_the_seed() -> None:
    rungs = default_rungs(device="cpu", ranks=2, lr_scaling="sqrt")
    assert [r.changes for r in rungs] == [
        {"precision": "fp32", "num_workers": 0},
        {"precision": "amp-bf16", "num_workers": 2},
        {"ranks": 2},
        {"grad_accum": 4, "lr_scaling": "sqrt", "lr_schedule": "onecycle"},
    ]
    assert rungs[3].name == "+ accumulation x4, LR sqrt, OneCycle"
    one = default_rungs(device="cpu", ranks=1, compile=True, checkpointing=True, micro_batch=4)
    assert [r.name for r in one][2:] == [
        "+ accumulation x4, LR linear, OneCycle",
        "+ torch.compile",
        "+ activation checkpointing, micro-batch 8",
    ]
    assert one[-1].changes == {"activation_checkpointing": True, "micro_batch": 8, "grad_accum": 2}


def test_default_ladder_on_a_gpu_without_bf16(monkeypatch) -> None:
    monkeypatch.setattr(ladder_rungs, "amp_precision", lambda device: "amp-fp16")
    rungs = default_rungs(device="cuda", ranks=4)
    assert rungs[1].changes == {"precision": "amp-fp16", "num_workers": 2, "pin_memory": True}
    # several ranks train through DeepSpeed: its own loss-scaled fp16
    assert rungs[2].changes == {"ranks": 4, "precision": "fp16"}


def test_plan_shares_one_sample_budget_and_scales_the_learning_rate() -> None:
    p = plan(None, steps=16, ranks=2, lr_scaling="linear", base=TrainConfig(lr=1e-3))
    assert p.samples == 16 * 8
    assert [(r.ranks, r.effective_batch, r.steps) for r in p.rungs] == [
        (1, 8, 16),
        (1, 8, 16),
        (2, 16, 8),
        (2, 64, 2),
    ]
    accum = p.rungs[3].config
    assert accum.lr == pytest.approx(1e-3 * 64 / 8)  # linear, from the baseline's batch
    assert accum.lr_schedule == "onecycle" and accum.total_steps == 2  # the rung's own run
    assert all(r.config.lr == 1e-3 for r in p.rungs[:3])
    assert p.total_steps == 3 * (16 + 16 + 8 + 2)
    sqrt = plan(None, steps=16, ranks=2, lr_scaling="sqrt", base=TrainConfig(lr=1e-3))
    assert sqrt.rungs[3].config.lr == pytest.approx(1e-3 * math.sqrt(8))
    alone = plan(None, steps=16, ranks=1)
    assert [r.ranks for r in alone.rungs] == [1, 1, 1]
    assert "no data-parallel rung" in alone.notes[0]


def test_rungs_in_every_form() -> None:
    p = plan([Rung("base"), ("amp", {"precision": "amp-bf16"}), {"grad_accum": 2}])
    assert [r.name for r in p.rungs] == ["base", "amp", "+ grad_accum=2"]
    assert p.rungs[2].config.precision == "amp-bf16"  # cumulative


# --------------------------------------------------------------------------- the report
def _plan(name: str, eff: int = 8, steps: int = 4, **settings) -> RungPlan:
    return RungPlan(name, dict(settings), {"compile": False, **settings}, 1, eff, steps)


def _run(step_s: list[float], losses: list[float] | None = None, wall: float | None = None):
    losses = losses or [4.0 - i * 0.1 for i in range(len(step_s))]
    return RunMeasure(tuple(step_s), tuple(losses), sum(step_s) + 0.5 if wall is None else wall)


def test_spread_is_median_and_quartiles() -> None:
    assert spread([3.0]) == (3.0, 3.0, 3.0)
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)
    assert spread([]) is None


def test_speedups_spreads_and_verdicts_from_measurements() -> None:
    plans = [_plan("base"), _plan("fast"), _plan("slow"), _plan("noisy")]
    runs = [
        [_run([1.0, 0.1, 0.1, 0.1]), _run([1.0, 0.1, 0.1, 0.1])],  # 80 samples/s
        [_run([2.0, 0.05, 0.05, 0.05]), _run([2.0, 0.05, 0.05, 0.05])],  # 160
        [_run([1.0, 0.2, 0.2, 0.2]), _run([1.0, 0.2, 0.2, 0.2])],  # 40
        [_run([1.0, 0.1, 0.4, 0.2]), _run([1.0, 0.1, 0.4, 0.2])],  # 48 / 1.4 s [25-70]
    ]
    result = summarize(plans, runs, setup={"model": "mlp", "device": "cpu"})
    base, fast, slow, noisy = result.rungs
    assert base.samples_per_s == pytest.approx(80) and base.verdict == "baseline"
    assert base.helped is None and base.warmup_seconds == pytest.approx(0.9)
    assert base.startup_seconds == pytest.approx(0.5) and base.time_seconds == pytest.approx(0.4)
    assert fast.speedup == pytest.approx(2.0) and fast.speedup_low == pytest.approx(2.0)
    assert fast.verdict == "helped" and fast.helped is True
    assert fast.summary.startswith("helped: 2.00x the previous rung's samples/s")
    assert slow.gain == pytest.approx(0.25) and slow.verdict == "slower"
    assert slow.helped is False and slow.summary.startswith("did not help: slower")
    # 34.3 samples/s [25-70] (under 4 steps a run: one window a step) against the slow
    # rung's 40: the spread includes 1
    assert noisy.samples_per_s == pytest.approx(48 / 1.4)
    assert (noisy.samples_per_s_low, noisy.samples_per_s_high) == pytest.approx((25.0, 70.0))
    assert noisy.gain_low < 1 < noisy.gain_high and noisy.verdict == "no gain"
    assert noisy.summary.startswith("did not help: no clear change")
    assert noisy.speedup_low <= noisy.speedup <= noisy.speedup_high
    assert all(r.samples == 32 for r in result.rungs)
    data = json.loads(result.to_json())
    assert [r["verdict"] for r in data["rungs"]] == ["baseline", "helped", "slower", "no gain"]
    assert data["rungs"][1]["step_samples_per_s"] == [160.0] * 6
    text = str(result)
    assert "fast: helped: 2.00x" in text and "slow: did not help: slower" in text
    assert result.rung("slow") is slow
    with pytest.raises(ValueError, match="name='nope': not a rung of this ladder"):
        result.rung("nope")
    assert result.chart_png().startswith(b"\x89PNG\r\n\x1a\n")


def test_a_bursty_loader_is_measured_by_its_samples_over_its_seconds() -> None:
    """Three loader workers hand over three batches every 0.3 s: one step waits 0.28 s,
    the next two none. The median step's rate is the fast steps' 800 samples/s, which the
    run never sustains; the rung delivers 8 x 12 samples in 1.2 s, 80 samples/s, the
    steady baseline's rate: no clear change, and every time is at 80 samples/s."""
    plans = [_plan("base", steps=13), _plan("+ 3 workers", steps=13)]
    losses = [4.0 - 0.1 * i for i in range(13)]  # 3.0 at step 11
    runs = [
        [_run([1.0] + [0.1] * 12, losses)],
        [_run([1.0] + [0.28, 0.01, 0.01] * 4, losses)],
    ]
    bursty = summarize(plans, runs, setup={}).rungs[1]
    assert statistics.median(bursty.step_samples_per_s) == pytest.approx(800)  # the old figure
    assert bursty.samples_per_s == pytest.approx(80)
    # four windows of three steps, each one burst: 80 samples/s each
    assert (bursty.samples_per_s_low, bursty.samples_per_s_high) == pytest.approx((80, 80))
    assert bursty.speedup == pytest.approx(1.0) and bursty.verdict == "no gain"
    assert bursty.time_seconds == pytest.approx(13 * 8 / 80)
    assert bursty.step_seconds == pytest.approx(0.01)  # the typical step stays a median
    target = summarize(plans, runs, setup={"target_loss": 3.0}, target_loss=3.0).rungs[1]
    assert target.steps_to_target == 11
    assert target.time_to_target_seconds == pytest.approx(11 * 8 / 80)  # not 11 x 0.01 s
    assert target.gain_measure == "time to target" and target.gain == pytest.approx(1.0)


def test_a_runs_steps_are_cut_into_windows_of_two_steps_or_more() -> None:
    sizes = {n: [len(w) for w in windows([0.1] * n)] for n in (1, 2, 3, 4, 5, 7, 8, 9, 31)}
    assert sizes == {
        1: [1],
        2: [1, 1],  # under 4 steps: one window a step
        3: [1, 1, 1],
        4: [2, 2],
        5: [3, 2],
        7: [3, 2, 2],
        8: [2, 2, 2, 2],
        9: [3, 2, 2, 2],
        31: [8, 8, 8, 7],
    }
    assert windows([1.0, 2.0, 3.0, 4.0, 5.0]) == [[1.0, 2.0, 3.0], [4.0, 5.0]]  # in order


def test_the_spread_of_a_rate_always_holds_the_rate() -> None:
    # one slow window, three fast: the 25th percentile of the window rates (19.4) lies
    # above the rate of all steps (8 samples in 1.04 s); the spread reaches down to it
    band = rate_band([[0.4, 0.4] + [0.04] * 6], batch=1)
    assert band is not None and band.value == pytest.approx(8 / 1.04)
    assert band.low == pytest.approx(band.value) and band.high == pytest.approx(25.0)
    assert rate_band([[]], batch=1) is None and rate_band([[0.0, 0.0]], batch=1) is None


def test_time_to_target_decides_when_a_target_is_given() -> None:
    plans = [_plan("base"), _plan("bigger batch", eff=16, steps=2), _plan("never")]
    runs = [
        [_run([1.0, 0.1, 0.1, 0.1], [4.0, 3.5, 2.9, 2.5])],  # target 3.0 at step 3: 0.3 s
        [_run([1.0, 0.1], [3.6, 2.8])],  # step 2 of 16 samples: 0.2 s, same samples/s x2
        [_run([1.0, 0.1, 0.1, 0.1], [4.0, 3.9, 3.8, 3.7])],
    ]
    result = summarize(plans, runs, setup={"target_loss": 3.0}, target_loss=3.0)
    base, bigger, never = result.rungs
    assert base.steps_to_target == 3 and base.samples_to_target == 24
    assert base.time_to_target_seconds == pytest.approx(0.3)
    assert bigger.steps_to_target == 2 and bigger.samples_to_target == 32
    assert bigger.time_to_target_seconds == pytest.approx(0.2)
    # twice the samples/s, 32 instead of 24 samples to the target: 2 x 24 / 32 = 1.5x
    assert bigger.gain_measure == "time to target" and bigger.gain == pytest.approx(1.5)
    assert bigger.verdict == "helped"
    assert never.steps_to_target is None and never.time_to_target_seconds is None
    assert never.verdict == "slower" and "does not reach loss 3" in never.summary
    assert "not reached" in str(result) and "misses it" in str(result)
    assert never.final_loss == pytest.approx(3.7)  # the last quarter of its steps


def test_a_failed_rung_is_reported_and_the_next_compares_with_the_one_before() -> None:
    plans = [_plan("base"), _plan("broken"), _plan("after")]
    runs = [
        [_run([1.0, 0.1, 0.1, 0.1])],
        [RunMeasure((), (), 0.0, error="RuntimeError: no")],
        [_run([1.0, 0.05, 0.05, 0.05])],
    ]
    result = summarize(plans, runs, setup={})
    assert result.rungs[1].verdict == "failed" and result.rungs[1].error == "RuntimeError: no"
    assert result.rungs[1].helped is None and "failed" in str(result)
    assert result.rungs[2].gain == pytest.approx(2.0) and result.rungs[2].verdict == "helped"
    assert result.chart_png().startswith(b"\x89PNG")


def test_compile_time_is_reported_apart_from_the_step_time() -> None:
    plans = [_plan("base"), _plan("+ compile", compile=True)]
    runs = [[_run([0.5, 0.1, 0.1, 0.1])], [_run([30.1, 0.1, 0.1, 0.1])]]
    result = summarize(plans, runs, setup={})
    compiled = result.rungs[1]
    assert compiled.step_seconds == pytest.approx(0.1) and compiled.warmup_seconds == pytest.approx(
        30.0
    )
    assert "compile time 30.00 s" in compiled.summary


# --------------------------------------------------------------------------- hostile input
def _must_not_run(*args, **kwargs):
    raise AssertionError("the ladder ran despite bad input")


def test_a_rung_naming_a_model_imports_nothing(monkeypatch, tmp_path) -> None:
    mark = tmp_path / "imported"
    (tmp_path / "ladder_marker_mod.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('x')\n"
        "def make(**o):\n    pathlib.Path(" + repr(str(mark)) + ").write_text('called')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ladder_run, "run_plan", _must_not_run)
    rungs = [{}, {"name": "x", "model": "ladder_marker_mod:make", "model_options": {"a": 1}}]
    with pytest.raises(ValueError) as info:
        ladder(rungs, "mlp", 4, model_options=MLP, device="cpu")
    text = str(info.value)
    assert not mark.exists()
    assert "rung 2 'x': model='ladder_marker_mod:make': a rung holds training settings only" in text
    assert "rung 2 'x': model_options={'a': 1}: a rung holds training settings only" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 10**7}, r"steps=10000000: must be at most 1,000,000 \(a ladder measures"),
        ({"steps": 10**5000}, r"steps=<an integer of about 5001 digits>: must be at most"),
        ({"steps": 4.0}, r"steps=4.0: must be an integer >= 1"),
        ({"repeats": 10**4}, r"repeats=10000: must be at most 1,000 \(the median"),
        ({"ranks": 10**60}, r"ranks=<an integer of about 61 digits>: must be at most 1,024"),
        ({"target_loss": math.inf}, r"target_loss=inf: must be a finite number or None"),
        ({"target_loss": math.nan}, r"target_loss=nan: must be a finite number or None"),
        ({"target_loss": "0.5"}, r"target_loss='0.5': must be a finite number or None"),
        ({"timeout": math.inf}, r"timeout=inf: must be a finite number of seconds > 0"),
        ({"timeout": 1e300}, r"timeout=1e\+300: must be at most 2,592,000 seconds"),
        ({"model_options": {"hidden": math.nan}}, r"model_options=.*must hold JSON values only"),
        ({"device": "tpu"}, r"device='tpu': must be 'auto', 'cpu' or 'cuda'$"),
        ({"rungs": [{"name": f"r{i}", "seed": i} for i in range(65)]}, r"at most 64"),
        ({"rungs": [{}, {"ranks": 10**60}]}, r"rung 2 .*ranks=<an integer of about 61 digits>"),
        ({"rungs": [{}, {"name": "a\nb", "seed": 1}]}, r"name='a\\nb': must be one line"),
        ({"rungs": [{}, {"name": "n" * 121, "seed": 1}]}, r"at most 120 printable characters"),
    ],
)
def test_numbers_and_names_are_range_checked(monkeypatch, kwargs, message) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", _must_not_run)
    args = {"rungs": None, "steps": 4, "model_options": MLP, "device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=message):
        ladder(args.pop("rungs"), "mlp", args.pop("steps"), **args)


def test_every_problem_of_the_arguments_at_once(monkeypatch) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", _must_not_run)
    with pytest.raises(ValueError) as info:
        ladder(
            None,
            "mlp",
            0,
            math.nan,
            model_options={"a": 1, 2: 3},
            repeats=10**9,
            ranks=-1,
            timeout=-1,
            launcher="mpi",
            device="cpu",
        )
    text = str(info.value)
    assert text.startswith("7 problems in the ladder:")
    for name in ("steps=0", "target_loss=nan", "model_options=", "repeats=", "ranks=-1"):
        assert name in text
    assert "timeout=-1" in text and "launcher='mpi'" in text


def test_numpy_scalars_are_numbers() -> None:
    import numpy as np

    p = plan_ladder(
        [{}, {"name": "w", "num_workers": np.int64(1)}],
        "mlp",
        np.int64(4),
        np.float32(0.5),
        model_options=MLP,
        device="cpu",
        repeats=np.int32(2),
        timeout=np.float64(60.0),
    )
    assert (p.rungs[0].steps, p.repeats, p.target_loss, p.timeout) == (4, 2, 0.5, 60.0)
    assert type(p.repeats) is int and type(p.target_loss) is float


def test_the_run_arguments_are_named_with_the_others(monkeypatch) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", _must_not_run)
    with pytest.raises(ValueError) as info:
        ladder(None, "mlp", 0, model_options=MLP, device="cpu", progress="yes", on_progress=3)
    text = str(info.value)
    assert text.startswith("3 problems in the ladder:")
    assert "steps=0" in text and "progress='yes'" in text and "on_progress=3" in text
    with pytest.raises(ValueError, match=r"^invalid ladder: cancel=5: must be a threading.Event"):
        ladder([{}, {"num_workers": 1}], "mlp", 4, model_options=MLP, device="cpu", cancel=5)


def test_the_json_of_a_diverged_rung_is_strict() -> None:
    plans = [_plan("base"), _plan("diverged")]
    runs = [
        [_run([1.0, 0.1, 0.1, 0.1], [4.0, 3.5, 3.0, 2.5])],
        [_run([1.0, 0.1, 0.1, 0.1], [4.0, math.inf, math.nan, math.nan])],
    ]
    text = summarize(plans, runs, setup={}).to_json()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert data["rungs"][1]["losses"] == [4.0, None, None, None]


def _overloads(function: object) -> list:
    """The `@overload` definitions of `function`, rebuilt from its module's source as
    functions of their own (annotations kept as text, defaults evaluated in the module):
    what `typing.get_overloads` returns, on every Python the project supports (3.10 has no
    `typing.get_overloads`)."""
    import __future__

    import ast
    import inspect
    import sys

    module = sys.modules[function.__module__]
    found = []
    for node in ast.parse(inspect.getsource(module)).body:
        if not (isinstance(node, ast.FunctionDef) and node.name == function.__name__):
            continue
        if any(ast.unparse(d) in ("overload", "typing.overload") for d in node.decorator_list):
            node.decorator_list = []
            flags = __future__.annotations.compiler_flag
            code = compile(ast.Module([node], []), module.__file__, "exec", flags=flags)
            scope = dict(vars(module))
            exec(code, scope)
            found.append(scope[node.name])
    return found


def test_the_typed_signatures_are_the_specs_fields() -> None:
    """`plan_ladder` and `ladder` are typed by overloads (what mypy checks callers
    against): one taking a LadderSpec, one taking its fields, held equal to them here."""
    import dataclasses
    import inspect
    import typing

    from workbench.train.ladder import LadderSpec

    def get_overloads(function: object) -> list:
        rebuilt = _overloads(function)
        if hasattr(typing, "get_overloads"):  # Python 3.11+: the rebuilt ones are the same
            registered = typing.get_overloads(function)
            assert list(map(inspect.signature, rebuilt)) == list(map(inspect.signature, registered))
        return rebuilt

    fields = [(f.name, f.default, str(f.type)) for f in dataclasses.fields(LadderSpec)]
    run_options = ["progress", "on_progress", "cancel"]
    for function, extra in ((plan_ladder, []), (ladder, run_options)):
        by_spec, by_fields = get_overloads(function)
        first = next(iter(inspect.signature(by_spec).parameters.values()))
        assert first.annotation == "LadderSpec" and first.kind is first.POSITIONAL_ONLY
        params = list(inspect.signature(by_fields).parameters.values())
        named = [(p.name, p.default, p.annotation) for p in params[: len(fields)]]
        assert named == fields
        assert [p.name for p in params[len(fields) :]] == extra
        assert [p.kind for p in params[:4]] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 4
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[4:])
        # help() and notebooks show the same keywords
        shown = list(inspect.signature(function).parameters)
        assert shown == [name for name, _, _ in fields] + extra


def test_the_model_parallel_rung_splits_the_data_parallel_ranks() -> None:
    rungs = default_rungs(device="cpu", ranks=2, model_parallel=True)
    assert rungs[-1].name == "+ model parallel (tensor parallel x2)"
    assert rungs[-1].changes == {"tp": 2}
    # one rank: no data-parallel rung, no model-parallel rung either
    assert "+ model parallel" not in [
        r.name[:16] for r in default_rungs(ranks=1, model_parallel=True)
    ]
    gpt = {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16}
    p = plan_ladder(
        None, "tiny-gpt", 16, model_options=gpt, device="cpu", ranks=2, model_parallel=True
    )
    last = p.rungs[-1]
    assert last.config.tp == 2 and last.ranks == 2
    # the 2 ranks read the same samples: one data-parallel rank's effective batch
    assert last.effective_batch == 8 * 4 and last.steps == 16 * 8 // 32
    # a model without a tensor-parallel plan: named before anything runs
    with pytest.raises(ValueError, match=r"tp=2: MLP has no tensor-parallel plan"):
        plan(None, steps=16, ranks=2, model_parallel=True)


@pytest.mark.parametrize("ranks", [0, 10**9, "2", True])
def test_a_refused_ranks_value_is_said_once_not_as_a_rung_that_changes_nothing(
    monkeypatch, ranks
) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", _must_not_run)
    with pytest.raises(ValueError) as refused:
        ladder([{"name": "a"}, {"name": "b", "ranks": ranks}], "mlp", 4, model_options=MLP)
    text = str(refused.value)
    assert f"rung 2 'b': ranks={shown(ranks)}: must be" in text
    assert "changes nothing" not in text
