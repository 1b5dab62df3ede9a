"""`workbench plan --probe K`: the planner's top plans trained for a few steps on 2 CPU
ranks (`workbench.train.measure.plan_probe`), measured next to predicted and re-ranked."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.planner import plan
from workbench.train.measure.plan_probe import scaled_settings


def test_probes_run_the_top_plans_on_two_cpu_ranks_and_rerank_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--probe 2`: the top 2 plans' engines trained for a few steps on 2 CPU ranks (the
    built-in GPT, the layouts scaled to 2 ranks); each rank's model states measured equal
    the estimator's for what ran, and the probes come back ordered by the measured step."""
    args = ["plan", "--model", "llama-3-8b", "--seq-len", "4096", "--global-batch", "64"]
    assert main([*args, "--json", "--probe", "2"]) == 0
    got = json.loads(capsys.readouterr().out)
    probes = got["probes"]
    assert len(probes) == 2
    assert {p["plan"] for p in probes} == {p["label"] for p in got["plans"][:2]}
    for p in probes:
        assert p["error"] is None, p
        assert p["ranks"] == 2 and p["device"] == "cpu"
        assert p["measured_states_bytes"] == p["predicted_states_bytes"] > 0
        assert p["measured_step_seconds"] > 0
    steps = [p["measured_step_seconds"] for p in probes]
    assert steps == sorted(steps)
    assert main([*args, "--probe", "21"]) == 2
    assert "--probe 21: must be an integer from 1 to 20" in capsys.readouterr().err


def test_a_plans_layout_is_scaled_to_the_ranks_at_hand() -> None:
    result = plan(model="llama-3-70b", gpu="h100", nodes=8, seq_len=4096, global_batch=512)
    for p in result.plans[:10]:
        s = scaled_settings(p, 2, 4)
        assert s.get("tp", 1) in (1, 2) and s.get("pp", 1) in (1, 2)
        assert s.get("tp", 1) * s.get("pp", 1) <= 2
        assert s["micro_batch"] <= 4 and s.get("pp", 1) <= s["grad_accum"] <= 2
        for key in ("precision", "optimizer", "activation_checkpointing"):
            assert s[key] == p.settings[key]


def test_probes_run_tensor_and_pipeline_parallel_plans() -> None:
    """A plan with tp (FSDP2 over the rest) and one with pipeline stages, each probed on
    2 CPU ranks through the tensor-parallel and pipeline engines: both train, and rank 0
    holds the estimator's share of the model states for what ran."""
    import dataclasses

    from workbench.train.measure.plan_probe import probe_plans

    result = plan(model="llama-3-70b", gpu="h100", nodes=8, seq_len=4096, global_batch=512)
    tp = next(p for p in result.plans if p.tp > 1 and p.pp == 1)
    pp = next(p for p in [*result.plans, *result.unfit] if p.tp == 1 and p.pp > 1)
    probes = probe_plans(dataclasses.replace(result, plans=[tp, pp]), k=2)
    assert [p.settings.get("tp", 1) for p in probes] == [2, 1]
    assert [p.settings.get("pp", 1) for p in probes] == [1, 2]
    for p in probes:
        assert p.error is None, p.error
        assert p.states_bytes == p.predicted_states_bytes
        assert p.states_bytes is not None and p.states_bytes > 0


@pytest.mark.gpu
def test_on_a_gpu_the_probes_measure_the_efficiency_the_planner_takes() -> None:
    """On a GPU of the catalog each probe carries the efficiency measured on one layer of
    the planned model at its real width and sequence (`probe_layer`): a fraction of the
    peak that is not launch-bound (above 5%), and `plan(efficiency=...)` takes it for the
    next ranking."""
    import torch

    from workbench.estimate import find_gpu
    from workbench.train.measure.plan_probe import probe_plans

    gpu = find_gpu(torch.cuda.get_device_name(0))
    assert not isinstance(gpu, str), gpu
    result = plan(model="llama-3-8b", gpu=gpu.name, gpus_per_node=1, seq_len=1024, global_batch=8)
    probes = probe_plans(result, 1, ranks=1)
    (probe,) = probes
    assert probe.error is None and probe.device == "cuda"
    assert probe.efficiency is not None and 0.05 < probe.efficiency < 1
    again = plan(model="llama-3-8b", gpu=gpu.name, gpus_per_node=1, seq_len=1024,
                 global_batch=8, efficiency=probe.efficiency)  # fmt: skip
    assert again.best.time.compute == pytest.approx(
        result.best.time.compute * result.efficiency / probe.efficiency
    )
