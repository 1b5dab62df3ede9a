"""The dry run of DeepSpeed setups: DeepSpeed's own engine (ZeRO 0-3, its 16-bit modes) on
fake tensors over a fake group of ranks, held against the formula's DeepSpeed terms over a
grid, and leaving nothing behind.

`BOUNDS` are what the grid measured (run this file: `python
tests/integration/test_dry_run_deepspeed.py` prints the table of docs/dry_run.md and
BOUNDS); every setup of the grid runs here (a few seconds each).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.train.dry_run import DryRunError, simulate_memory

sys.path.insert(0, os.path.dirname(__file__))
from test_dry_run import FAMILIES, TINY  # noqa: E402

#: (family, ZeRO stage, ranks, precision, optimizer implementation)
GRID = [
    (family, *setup)
    for family in FAMILIES
    for setup in (
        (0, 2, "fp32", "foreach"),
        (0, 2, "amp-bf16", "for-loop"),
        (1, 2, "bf16", "foreach"),
        (2, 4, "bf16", "fused"),
        (2, 2, "fp16", "foreach"),
        (3, 4, "bf16", "foreach"),
        (3, 2, "amp-bf16", "fused"),
    )
]
ROWS = (
    "parameters",
    "gradients",
    "optimizer states",
    "optimizer step temporaries",
    "activations and transients",
    "DeepSpeed reduce buckets",
    "DeepSpeed flattened reduce copy",
    "DeepSpeed fp32 gradient partition",
    "ZeRO-3 gathered parameters",
    "total",
)
#: (family, stage, point, row) -> (lowest, highest) of (dry run - formula) / the dry run's
#: total at that point over the grid, rounded outward to 0.1%. Rows not listed are equal.
BOUNDS: dict[tuple[str, int, str, str], tuple[float, float]] = {
    ("gpt2", 0, "backward", "activations and transients"): (-0.12, 0.001),
    ("gpt2", 0, "backward", "total"): (-0.12, 0.001),
    ("gpt2", 0, "forward end", "activations and transients"): (-0.11, 0.002),
    ("gpt2", 0, "forward end", "total"): (-0.11, 0.002),
    ("gpt2", 0, "optimizer step", "total"): (-0.0, 0.001),
    ("gpt2", 1, "backward", "activations and transients"): (-0.01, -0.009),
    ("gpt2", 1, "backward", "gradients"): (0.013, 0.014),
    ("gpt2", 1, "backward", "total"): (0.004, 0.005),
    ("gpt2", 1, "forward end", "activations and transients"): (0.001, 0.002),
    ("gpt2", 1, "forward end", "total"): (0.001, 0.002),
    ("gpt2", 1, "optimizer step", "DeepSpeed fp32 gradient partition"): (-0.164, -0.163),
    ("gpt2", 1, "optimizer step", "gradients"): (0.02, 0.021),
    ("gpt2", 1, "optimizer step", "optimizer step temporaries"): (0.081, 0.082),
    ("gpt2", 1, "optimizer step", "total"): (-0.062, -0.061),
    ("gpt2", 2, "backward", "activations and transients"): (-0.012, -0.009),
    ("gpt2", 2, "backward", "total"): (-0.012, -0.009),
    ("gpt2", 2, "forward end", "activations and transients"): (0.001, 0.002),
    ("gpt2", 2, "forward end", "total"): (0.001, 0.002),
    ("gpt2", 2, "optimizer step", "DeepSpeed fp32 gradient partition"): (-0.209, -0.163),
    ("gpt2", 2, "optimizer step", "gradients"): (0.02, 0.026),
    ("gpt2", 2, "optimizer step", "optimizer step temporaries"): (0.081, 0.209),
    ("gpt2", 2, "optimizer step", "total"): (-0.062, 0.027),
    ("gpt2", 3, "backward", "activations and transients"): (-0.101, 0.001),
    ("gpt2", 3, "backward", "total"): (-0.101, 0.001),
    ("gpt2", 3, "forward end", "activations and transients"): (-0.03, 0.002),
    ("gpt2", 3, "forward end", "total"): (-0.03, 0.002),
    ("gpt2", 3, "optimizer step", "DeepSpeed fp32 gradient partition"): (-0.125, 0.001),
    ("gpt2", 3, "optimizer step", "optimizer step temporaries"): (-0.0, 0.125),
    ("gpt2", 3, "optimizer step", "total"): (-0.0, 0.001),
    ("llama", 0, "backward", "activations and transients"): (0.002, 0.004),
    ("llama", 0, "backward", "total"): (0.003, 0.004),
    ("llama", 0, "forward end", "activations and transients"): (0.003, 0.015),
    ("llama", 0, "forward end", "total"): (0.003, 0.015),
    ("llama", 0, "optimizer step", "total"): (-0.0, 0.001),
    ("llama", 1, "backward", "activations and transients"): (-0.015, -0.014),
    ("llama", 1, "backward", "gradients"): (0.014, 0.015),
    ("llama", 1, "backward", "total"): (0.0, 0.001),
    ("llama", 1, "forward end", "activations and transients"): (0.003, 0.004),
    ("llama", 1, "forward end", "total"): (0.003, 0.004),
    ("llama", 1, "optimizer step", "DeepSpeed fp32 gradient partition"): (-0.166, -0.165),
    ("llama", 1, "optimizer step", "gradients"): (0.005, 0.006),
    ("llama", 1, "optimizer step", "optimizer step temporaries"): (0.082, 0.083),
    ("llama", 1, "optimizer step", "total"): (-0.078, -0.077),
    ("llama", 2, "backward", "DeepSpeed reduce buckets"): (-0.138, -0.114),
    ("llama", 2, "backward", "activations and transients"): (0.105, 0.128),
    ("llama", 2, "backward", "total"): (-0.011, -0.008),
    ("llama", 2, "forward end", "activations and transients"): (0.003, 0.004),
    ("llama", 2, "forward end", "total"): (0.003, 0.004),
    ("llama", 2, "optimizer step", "DeepSpeed fp32 gradient partition"): (-0.211, -0.165),
    ("llama", 2, "optimizer step", "gradients"): (0.005, 0.02),
    ("llama", 2, "optimizer step", "optimizer step temporaries"): (0.082, 0.211),
    ("llama", 2, "optimizer step", "total"): (-0.078, 0.02),
    ("llama", 3, "backward", "activations and transients"): (-0.063, 0.003),
    ("llama", 3, "backward", "total"): (-0.062, 0.003),
    ("llama", 3, "forward end", "activations and transients"): (-0.014, 0.004),
    ("llama", 3, "forward end", "total"): (-0.014, 0.004),
    ("llama", 3, "optimizer step", "DeepSpeed fp32 gradient partition"): (-0.125, 0.001),
    ("llama", 3, "optimizer step", "optimizer step temporaries"): (-0.0, 0.125),
    ("llama", 3, "optimizer step", "total"): (-0.0, 0.001),
}


def dry_run(family: str, stage: int, ranks: int, precision: str, impl: str) -> Any:
    config = TrainConfig(micro_batch=2, precision=precision, zero_stage=stage)
    return simulate_memory(
        lambda: FAMILIES[family]("sdpa"),
        config,
        seq_len=128,
        world_size=ranks,
        optimizer_impl=impl,
        progress=False,
    )


def shares(run: Any) -> dict[tuple[str, str], tuple[float, int, int | None]]:
    """(point, row) -> ((dry - formula) / dry total at the point, dry, formula)."""
    rows = [r for r in run.compare().rows if r.category in ROWS]
    totals = {r.point: r.dry_run_bytes for r in rows if r.category == "total"}
    return {
        (r.point, r.category): (
            (r.dry_run_bytes - (r.formula_bytes or 0)) / totals[r.point],
            r.dry_run_bytes,
            r.formula_bytes,
        )
        for r in rows
    }


@pytest.mark.parametrize("setup", GRID, ids=lambda s: "-".join(map(str, s)))
def test_formula_within_the_measured_bounds(setup: tuple[Any, ...]) -> None:
    run = dry_run(*setup)
    assert (run.engine, run.zero_stage, run.world_size) == ("deepspeed", setup[1], setup[2])
    assert run.formula is not None
    # the model states at rest: DeepSpeed's layout to the byte (+ Adam's step counters)
    assert run.params_bytes == run.formula.params_bytes
    extra = run.optimizer_bytes - run.formula.optimizer_bytes
    assert 0 <= extra <= run.optimizer_step_counter_bytes
    for key, (share, dry, formula) in shares(run).items():
        if key[1] == "parameters":
            assert dry == formula, key
        elif key[1] == "optimizer states":
            assert 0 <= dry - (formula or 0) <= run.optimizer_step_counter_bytes, key
        else:
            low, high = BOUNDS.get((setup[0], setup[1], *key), (0.0, 0.0))
            assert low <= share <= high, (key, share, dry, formula)


@pytest.mark.parametrize(("precision", "ranks"), [("bf16", 1), ("fp16", 2), ("bf16", 2)])
def test_deepspeeds_16_bit_modes_without_zero_step(precision: str, ranks: int) -> None:
    """`--precision bf16` alone (or fp16, or several ranks): DeepSpeed's ZeRO-0 16-bit
    optimizer, whose step reads the gradient norm back to the host, steps on fake tensors
    (the norm answered as the overflow checks are) with DeepSpeed's model states to the
    byte."""
    run = dry_run("llama", 0, ranks, precision, "foreach")
    assert (run.engine, run.zero_stage, run.world_size) == ("deepspeed", 0, ranks)
    assert run.formula is not None and run.params_bytes == run.formula.params_bytes
    extra = run.optimizer_bytes - run.formula.optimizer_bytes  # Adam's step counters
    assert 0 <= extra <= run.optimizer_step_counter_bytes
    assert abs(run.peak_bytes - run.formula.peak_bytes) <= 0.1 * run.peak_bytes


def test_zero3_gathers_and_partitions_as_the_formula_counts() -> None:
    """ZeRO-3 on 4 ranks: each rank holds a quarter of the 16-bit weights, the gradient
    partition plus the reduce bucket from step to step, and gathers the layers it runs
    (DeepSpeed's own coordinator, told apart from the partitions)."""
    run = simulate_memory(
        "tiny-gpt",
        TrainConfig(micro_batch=4, precision="bf16", zero_stage=3),
        model_options=TINY,
        world_size=4,
        progress=False,
    )
    forward = run.points["forward end"]
    assert run.params_bytes == run.formula.params_bytes  # 2 bytes x ceil(params / 4)
    assert forward["ZeRO-3 gathered parameters"] > 0
    assert forward["gradients"] == run.formula.peak.points["forward end"]["gradients"]
    step = run.points["optimizer step"]
    assert step["DeepSpeed fp32 gradient partition"] == 4 * -(-run.n_params // 4)


def test_zero3_steps_on_deepspeed_s_largest_sub_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a `sub_group_size` under the rank's partition DeepSpeed's step upcasts one
    sub-group of whole parameters at a time: the formula's copy is its largest group
    (`engine_terms.largest_sub_group`), which runs past `sub_group_size` by up to a
    parameter's partition; both the engine the dry run builds and the formula read the
    same DeepSpeed config."""
    from workbench.train.backends import deepspeed as backend

    size = 20_000
    made = backend.engine_config

    def small_groups(*args: Any) -> dict[str, Any]:
        ds = made(*args)
        ds["zero_optimization"]["sub_group_size"] = size
        return ds

    monkeypatch.setattr(backend, "engine_config", small_groups)
    run = simulate_memory(
        "tiny-gpt",
        TrainConfig(micro_batch=4, precision="bf16", zero_stage=3),
        model_options=TINY,
        world_size=4,
        progress=False,
    )
    copy = run.points["optimizer step"]["DeepSpeed fp32 gradient partition"]
    assert copy == run.formula.peak.points["optimizer step"]["DeepSpeed fp32 gradient partition"]
    assert 4 * size < copy < 4 * -(-run.n_params // 4)  # past the size, under the partition


def _gpt2_bucket_bound() -> torch.nn.Module:
    """GPT-2's shape scaled down until its reduce bucket outweighs its activations at
    1 x 32 tokens: 4 layers, hidden 256, vocabulary 1024 (3.4M parameters)."""
    import transformers

    config = transformers.GPT2Config(
        vocab_size=1024, n_embd=256, n_layer=4, n_head=4, n_positions=64
    )
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize(
    ("stage", "precision", "width"), [(2, "amp-bf16", 4), (2, "fp16", 2), (0, "fp32", 4)]
)
def test_the_flattened_reduce_copy_is_the_backwards_peak_in_both(
    stage: int, precision: str, width: int
) -> None:
    """Where the bucket weighs most (GPT-2 124M at 1 x 128 tokens; this smaller GPT-2 at
    1 x 32) the end of backward is the step's highest moment: DeepSpeed's reduce cats
    every gradient into one new tensor (ZeRO-2's final reduce, before any gradient
    partition exists; stage 0's allreduce after backward, beside every gradient). The dry
    run names what DeepSpeed's `allreduce_bucket` makes, the formula counts it there."""
    config = TrainConfig(micro_batch=1, precision=precision, zero_stage=stage)
    run = simulate_memory(_gpt2_bucket_bound, config, seq_len=32, world_size=2, progress=False)
    assert run.formula is not None and run.formula.peak.backward_moment == "backward end"
    rows = {(r.point, r.category): r for r in run.compare().rows}
    flat = rows[("backward", "DeepSpeed flattened reduce copy")]
    assert flat.dry_run_bytes == flat.formula_bytes == width * run.n_params
    total = rows[("backward", "total")]
    assert total.formula_bytes is not None
    assert abs(total.dry_run_bytes - total.formula_bytes) <= 0.02 * total.dry_run_bytes


def _nothing_left() -> None:
    import torch.distributed as dist

    assert not dist.is_initialized()
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        assert key not in os.environ, key


def test_nothing_is_left_behind_and_a_session_trains_deepspeed_after() -> None:
    hook = sys.excepthook
    linear = torch.nn.functional.linear
    simulate_memory(
        "tiny-gpt",
        TrainConfig(micro_batch=2, precision="bf16", zero_stage=3),
        model_options=TINY,
        world_size=2,
        progress=False,
    )
    _nothing_left()
    assert sys.excepthook is hook and torch.nn.functional.linear is linear
    config = TrainConfig(micro_batch=2, zero_stage=2)
    with Session(config, model="tiny-gpt", model_options=TINY) as s:
        s.run(optimizer_steps=2)
        assert s.backend.zero_stage == 2
        # the Session's own process group exists here: its dry run runs in a child
        # process, with DeepSpeed's engine on a fake group there; the group is kept
        run = s.simulate(progress=False)
        assert (run.engine, run.zero_stage) == ("deepspeed", 2)
        assert run.params_bytes == s.memory().params_bytes
        assert s.memory().dry_run is run and "dry run" in str(s.memory())
        s.run(optimizer_steps=1)
        assert s.backend.zero_stage == 2
    _nothing_left()


def test_a_notebook_s_own_module_cannot_cross_to_the_child_and_is_named() -> None:
    """In a process that holds a group the dry run runs in a child, which cannot import a
    class a notebook defined (`__main__`): refused, naming the model, before spawning."""
    from workbench.train.dry_run.child import simulate_in_child

    local = type("NotebookNet", (torch.nn.Linear,), {"__module__": "__main__"})
    with pytest.raises(DryRunError) as info:
        simulate_in_child(local(4, 4), TrainConfig(), world_size=2)
    assert [p.field for p in info.value.problems] == ["model"]
    assert "importable module" in str(info.value)


@pytest.mark.parametrize(
    ("config", "world_size", "field", "text"),
    [
        (TrainConfig(zero_stage=2, offload_optimizer="cpu"), 2, "offload_optimizer", "offload"),
        (TrainConfig(precision="bf16-true"), 2, "precision", "pure bf16"),
        (TrainConfig(precision="amp-fp16", zero_stage=1), 2, "precision", "'fp16'"),
    ],
)
def test_what_deepspeed_cannot_run_is_refused_by_name(
    config: TrainConfig, world_size: int, field: str, text: str
) -> None:
    with pytest.raises(DryRunError) as info:
        simulate_memory("tiny-gpt", config, model_options=TINY, world_size=world_size)
    assert field in {p.field for p in info.value.problems}
    assert text in str(info.value)
    _nothing_left()


def _table(results: list[tuple[tuple[Any, ...], Any]]) -> str:
    per: dict[tuple[Any, ...], list[tuple[float, float | None]]] = {}
    for setup, run in results:
        for key, (share, dry, formula) in shares(run).items():
            ratio = dry / formula if formula else None
            per.setdefault((setup[0], setup[1], *key), []).append((share, ratio))
    lines = [
        "| model | ZeRO | point | row | dry run / formula | (dry run - formula) / point total |",
        "|---|---|---|---|---|---|",
    ]
    for (family, stage, point, row), values in sorted(per.items(), key=lambda kv: str(kv[0])):
        ratios = [r for _, r in values if r is not None]
        share = [s for s, _ in values]
        ratio = f"{min(ratios):.3f} .. {max(ratios):.3f}" if ratios else "n/a"
        lines.append(
            f"| {family} | {stage} | {point} | {row} | {ratio} | "
            f"{100 * min(share):+.1f}% .. {100 * max(share):+.1f}% |"
        )
    bounds = {
        key: (round(min(s for s, _ in v) - 0.0005, 3), round(max(s for s, _ in v) + 0.0005, 3))
        for key, v in sorted(per.items(), key=lambda kv: str(kv[0]))
        if key[3] not in ("parameters", "optimizer states") and any(abs(s) > 0 for s, _ in v)
    }
    return "\n".join(lines) + "\n\nBOUNDS = " + repr(bounds)


if __name__ == "__main__":  # the table of docs/dry_run.md (and BOUNDS)
    print(_table([(s, dry_run(*s)) for s in GRID]))
