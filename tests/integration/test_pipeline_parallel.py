"""Pipeline parallelism (`pp`) on CPU ranks (gloo): the built-in GPT cut into 2 and 4 stages
trains the single-rank losses under 1F1B and GPipe; 2 stages x 2 pipelines train plain data
parallel's losses; the user's module gets every stage's trained weights back; the first
stage holds the estimator's largest stage, and the activations it holds in flight are the
estimator's 1F1B figure (GPipe holds every micro-batch's); each rank reports its bubble.

Two spawns (2 and 4 processes) run every configuration in turn; the single-rank reference
runs in this process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.ui.training import layout_text

GPT = {"layers": 4, "hidden": 32, "heads": 4, "seq_len": 16, "dropout": 0.0}
STEPS = 3
MICRO_BATCHES = 4
LOSS_TOL = 1e-5  # the ZeRO tests' tolerance


def config(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "micro_batch": 2,
        "grad_accum": MICRO_BATCHES,
        "lr": 1e-2,
        "seed": 1,
        "clip_grad_norm": 1.0,
    }
    base.update(kw)
    return TrainConfig(device="cpu", **base)


RUNS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "pp2 1f1b": {"pp": 2},
        "pp2 gpipe": {"pp": 2, "pp_schedule": "gpipe"},
        "dp2": {"fsdp": "no_shard"},
        "pp2 switched": {"pp": 2, "switch": {"pp_schedule": "gpipe"}},
    },
    4: {"pp4": {"pp": 4}, "pp2 dp2": {"pp": 2}, "pp2 tp2": {"pp": 2, "tp": 2}},
}


def _train(settings: dict[str, Any]) -> dict[str, Any]:
    settings = dict(settings)
    switch = settings.pop("switch", None)  # settings applied live after the first step
    with Session(config(**settings), model="tiny-gpt", model_options=GPT) as s:
        if switch is None:
            records = s.run(optimizer_steps=STEPS)
        else:
            records = s.run(optimizer_steps=1)
            s.update(**switch)  # no loop running: a new engine, weights and state carried
            records += s.run(optimizer_steps=STEPS - 1)
        report = s.memory()
        pred = report.predicted
        pipeline = getattr(s.backend, "pipeline_report", None)
        out = {
            "engine": type(s.backend).__name__,
            "losses": [r.loss for r in records],
            "grad_norms": [r.grad_norm for r in records],
            "params_bytes": report.params_bytes,
            "grads_bytes": report.grads_bytes,
            "optimizer_bytes": report.optimizer_bytes - report.optimizer_step_counter_bytes,
            "activation_bytes": report.activation_bytes,
            "predicted": {
                "params_bytes": pred.params_bytes,
                "grads_bytes": pred.grads_bytes,
                "optimizer_bytes": pred.optimizer_bytes,
                "activation_bytes": report.predicted_activation_bytes,
            },
            "pipeline": pipeline() if pipeline is not None else None,
            "errors": [e.message for e in s.events if e.kind == "error"],
            "layout": s.layout(),
            "status": layout_text(s),  # what the training panel's status line shows
        }
    out["weights"] = {k: v.clone() for k, v in s.model.state_dict().items()}
    return out


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of `world` ranks (`run_ranks`): every run of RUNS[world] in turn."""
    import torch.distributed as dist

    world = dist.get_world_size()
    result: dict[str, Any] = {}
    for name, settings in RUNS[world].items():
        got = _train(settings)
        torch.save(got.pop("weights"), os.path.join(out_dir, f"{name}-{rank}.pt"))
        result[name] = got
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, list[Any]], Path]:
    out = tmp_path_factory.mktemp("pp-ranks")
    got: dict[int, list[Any]] = {}
    for world in (2, 4):
        got[world] = run_ranks(_rank, out, world=world)
        for r, result in enumerate(got[world]):
            assert "error" not in result, (world, r, result.get("error"))
            for name in RUNS[world]:
                assert not result[name]["errors"], (world, r, name, result[name]["errors"])
    return got, out


@pytest.fixture(scope="module")
def single() -> dict[str, Any]:
    got = _train({})
    assert got["engine"] == "PlainBackend"
    return got


def test_stages_train_the_single_rank_losses_under_both_schedules(
    ranks: Any, single: dict[str, Any]
) -> None:
    got, _ = ranks
    # "pp2 switched": 1F1B for a step, then GPipe, the stage's weights and Adam state carried
    runs = ((2, "pp2 1f1b"), (2, "pp2 gpipe"), (4, "pp4"), (2, "pp2 switched"), (4, "pp2 tp2"))
    for world, name in runs:
        for r in range(world):
            run = got[world][r][name]
            assert run["engine"] == "PipelineBackend"
            assert run["losses"] == pytest.approx(single["losses"], abs=LOSS_TOL), (name, r)
            assert run["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-4), (name, r)


def test_stages_split_over_tensor_parallel_ranks_hold_their_share(ranks: Any) -> None:
    """pp=2 x tp=2 on 4 ranks (rank = stage x 2 + tp rank): each stage's layers split over
    its 2 ranks; the first stage holds the estimator's tensor-parallel share of the largest
    stage exactly."""
    got, _ = ranks
    for r in range(4):
        run = got[4][r]["pp2 tp2"]
        assert (run["layout"]["stage"], run["layout"]["tp_rank"]) == (r // 2, r % 2)
        assert run["layout"]["dp_rank"] == 0 and run["pipeline"]["dp_rank"] == 0
        assert run["pipeline"]["layers"] == ([0, 1] if r < 2 else [2, 3])
    first = got[4][0]["pp2 tp2"]
    assert first["params_bytes"] == first["predicted"]["params_bytes"]
    assert first["optimizer_bytes"] == first["predicted"]["optimizer_bytes"]
    assert first["params_bytes"] < got[2][0]["pp2 1f1b"]["params_bytes"] * 0.6


def test_pipelines_over_data_parallel_ranks_train_the_data_parallel_losses(ranks: Any) -> None:
    got, _ = ranks
    for r in range(4):
        reference = got[2][r // 2]["dp2"]  # ranks 0, 1: pipeline 0 reads dp rank 0's samples
        run = got[4][r]["pp2 dp2"]
        assert run["losses"] == pytest.approx(reference["losses"], abs=LOSS_TOL), r
        assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-4), r


def test_your_module_gets_every_stages_weights(ranks: Any, single: dict[str, Any]) -> None:
    """Atol 1e-4 at lr 1e-2: Adam's step of an element with a near-zero gradient follows
    its rounding."""
    _, out = ranks
    dp2 = torch.load(out / "dp2-0.pt", weights_only=True)
    for name, world, reference in (
        ("pp2 tp2", 4, single["weights"]),
        ("pp2 1f1b", 2, single["weights"]),
        ("pp2 gpipe", 2, single["weights"]),
        ("pp4", 4, single["weights"]),
        ("pp2 dp2", 4, dp2),
    ):
        for r in range(world):
            w = torch.load(out / f"{name}-{r}.pt", weights_only=True)
            assert w.keys() == reference.keys()
            for key, value in reference.items():
                torch.testing.assert_close(w[key], value, rtol=0, atol=1e-4, msg=(name, key))


def test_each_stage_holds_its_layers_and_the_first_the_estimators_stage(
    ranks: Any, single: dict[str, Any]
) -> None:
    got, _ = ranks
    for world, name in ((2, "pp2 1f1b"), (4, "pp4")):
        stages = [got[world][r][name] for r in range(world)]
        # the first stage is the largest: the estimator's stage, exact
        first = stages[0]
        for field in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            assert first[field] == first["predicted"][field], (name, field)
        assert max(s["params_bytes"] for s in stages) == first["params_bytes"]
        per = 4 // world
        assert [s["pipeline"]["layers"] for s in stages] == [
            list(range(i * per, (i + 1) * per)) for i in range(world)
        ]
        # every parameter once, plus the last stage's own copy of the tied head
        head = single["weights"]["wte.weight"].numel() * 4
        assert sum(s["params_bytes"] for s in stages) == single["params_bytes"] + head


def test_in_flight_activations_follow_the_schedule(ranks: Any) -> None:
    got, _ = ranks
    ones = got[2][0]["pp2 1f1b"]
    gpipe = got[2][0]["pp2 gpipe"]
    predicted = ones["predicted"]["activation_bytes"]
    # 1F1B: the first stage holds pp=2 micro-batches of its 2 layers, the estimator's figure
    # (within 2%: the in-flight peak also counts a micro-batch's inputs being sent)
    assert predicted <= ones["activation_bytes"] <= predicted * 1.02
    # GPipe holds all 4 micro-batches before the first backward: twice 1F1B's
    assert gpipe["activation_bytes"] == pytest.approx(2 * ones["activation_bytes"], rel=0.02)


def test_each_rank_reports_its_bubble(ranks: Any) -> None:
    """The ideal bubble is the schedule's (pp-1)/(m+pp-1); the measured one is the share of
    the last step's wall time this stage spent outside its forward and backward chunks, as
    the panel's status line shows it. Not compared with the ideal: on shared CPU cores a
    tiny model's step is mostly the ranks' messages, whatever the schedule."""
    got, _ = ranks
    for world, name, stages in ((2, "pp2 1f1b", 2), (2, "pp2 gpipe", 2), (4, "pp4", 4)):
        for r in range(world):
            report = got[world][r][name]["pipeline"]
            layout = got[world][r][name]["layout"]
            assert layout["stage"] == r and layout["pp"] == stages and layout["dp"] == 1
            status = got[world][r][name]["status"]
            assert status.startswith(f"pipeline stage {r} of {stages} (layers ")
            assert f"over {MICRO_BATCHES} micro-batches, bubble " in status
            assert report["stage"] == r and report["pp"] == stages
            assert report["micro_batches"] == MICRO_BATCHES
            assert report["bubble_ideal"] == pytest.approx(
                (stages - 1) / (MICRO_BATCHES + stages - 1)
            )
            assert 0 < report["compute_seconds"] < report["step_seconds"]
            idle = 1 - report["compute_seconds"] / report["step_seconds"]
            assert report["bubble_measured"] == pytest.approx(idle, rel=1e-9)
            measured = (
                f"bubble {report['bubble_measured']:.0%} (ideal {report['bubble_ideal']:.0%})"
            )
            assert f"micro-batches, {measured} x data parallel 1" in status


def test_bad_pipeline_sizes_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r"pp=2: pipeline stages train through"):
        TrainConfig(pp=2, zero_stage=2)
    with pytest.raises(ConfigError, match=r"pp=2: pipeline stages train with plain data"):
        TrainConfig(pp=2, fsdp="full_shard")
    with pytest.raises(ConfigError, match=r"grad_accum=2: the micro-batches of a step fill"):
        config(pp=3, grad_accum=2)  # needs at least pp=3 of them: the config itself
    with pytest.raises(ConfigError) as caught:
        Session(config(pp=3, grad_accum=3), model="tiny-gpt", model_options=GPT)
    text = str(caught.value)
    assert "pp=3: must divide the 1 rank" in text
    assert "pp=3: must divide the model's 4 layers evenly" in text
    with pytest.raises(ConfigError, match=r"pp=2: times tp=2, must divide the 1 rank"):
        Session(config(pp=2, tp=2, grad_accum=2), model="tiny-gpt", model_options=GPT)
    with pytest.raises(ConfigError, match=r"pp=8: more stages than the model's 4 layers"):
        Session(config(pp=8, grad_accum=8), model="tiny-gpt", model_options=GPT)
    with pytest.raises(ConfigError, match=r"pp=2: MLP has no pipeline split"):
        Session(config(pp=2), model="mlp")


@pytest.mark.parametrize("settings", [{"tp": 2}, {"pp": 2, "grad_accum": 4}])
def test_a_dry_run_of_a_split_model_says_it_is_not_simulated(settings: dict[str, int]) -> None:
    import workbench
    from workbench.models import build_model
    from workbench.train.dry_run.problems import DryRunError

    module = build_model("tiny-gpt", **GPT)[0]
    name = next(iter(settings))
    with pytest.raises(DryRunError, match=rf"{name}=2: the dry run simulates one rank") as caught:
        workbench.simulate_memory(module, config=TrainConfig(**settings), world_size=2)
    assert f"`workbench launch --{name}` measures it" in str(caught.value)
