"""Tensor parallelism (`tp`) on CPU ranks (gloo): the built-in GPT split over 2 and 4 ranks
trains the single-rank run's losses; tp=2 x dp=2, with data parallel or FSDP2 over the
second mesh dimension, trains the losses of plain data parallel on 2 ranks; the user's
module gets the trained weights back in its own row order; each rank's parameters,
gradients, optimizer states and activations are the estimator's tensor-parallel share.

Two spawns (2 and 4 processes) run every configuration in turn; the single-rank reference
runs in this process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.ui.training import layout_text

GPT = {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16, "dropout": 0.0}
STEPS = 3
#: the ZeRO tests' tolerance for a loss trajectory trained another way
LOSS_TOL = 1e-5


def config(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "micro_batch": 4,
        "grad_accum": 2,
        "lr": 1e-2,
        "seed": 1,
        "clip_grad_norm": 1.0,
    }
    base.update(kw)
    return TrainConfig(device="cpu", **base)


#: a live change after the first step that rebuilds the engine (clipping tighter)
SWITCH = {"clip_grad_norm": 0.5}
#: world size -> name -> settings
RUNS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "tp2": {"tp": 2},
        "dp2": {"fsdp": "no_shard"},
        "llama tp2": {"tp": 2, "model": "llama"},
        "llama tp2 sp": {"tp": 2, "model": "llama", "sequence_parallel": True},
        "tp2 sp": {"tp": 2, "sequence_parallel": True},
        "tp2 switched": {"tp": 2, "switch": SWITCH},
        "tp2 dropout": {"tp": 2, "model_options": {"dropout": 0.1}},
    },
    4: {
        "tp4": {"tp": 4},
        "tp2 dp2": {"tp": 2},
        "tp2 fsdp2": {"tp": 2, "fsdp": "full_shard"},
        "tp4 sp": {"tp": 4, "sequence_parallel": True},
    },
}


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Token ids with their labels (a `transformers` model computes its own loss)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 96, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def llama() -> torch.nn.Module:
    """A Llama-style decoder from a config (grouped K/V heads, SwiGLU, RMSNorm, rotary)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config)


def _session(settings: dict[str, Any]) -> Session:
    settings = dict(settings)
    if settings.pop("model", None) == "llama":
        return Session(config(**settings), model=llama(), data=Tokens())
    options = {**GPT, **settings.pop("model_options", {})}
    return Session(config(**settings), model="tiny-gpt", model_options=options)


def _train(settings: dict[str, Any]) -> dict[str, Any]:
    settings = dict(settings)
    switch = settings.pop("switch", None)  # settings applied live after the first step
    with _session(settings) as s:
        if switch is None:
            records = s.run(optimizer_steps=STEPS)
        else:  # no loop running: a new engine at once, weights and Adam state carried
            records = s.run(optimizer_steps=1)
            s.update(**switch)
            records += s.run(optimizer_steps=STEPS - 1)
        # Adam's first moments by parameter name, whole (collective under tp)
        moments = {
            name: st["exp_avg"].clone()
            for name, st in s.backend.export_state()["optimizer"]["state"].items()
        }
        report = s.memory()
        pred = report.predicted
        out = {
            "engine": type(s.backend).__name__,
            "losses": [r.loss for r in records],
            "grad_norms": [r.grad_norm for r in records],
            "samples": round(records[-1].samples_per_s * records[-1].step_seconds),
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
            "errors": [e.message for e in s.events if e.kind == "error"],
            "layout": s.layout(),
            "status": layout_text(s),  # what the training panel's status line shows
        }
    out["weights"] = {k: v.clone() for k, v in s.model.state_dict().items()}
    out["moments"] = moments
    return out


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of `world` ranks (`run_ranks`): every run of RUNS[world] in turn."""
    import torch.distributed as dist

    world = dist.get_world_size()
    result: dict[str, Any] = {}
    for name, settings in RUNS[world].items():
        got = _train(settings)
        torch.save(got.pop("weights"), os.path.join(out_dir, f"{name}-{rank}.pt"))
        torch.save(got.pop("moments"), os.path.join(out_dir, f"{name}-{rank}-moments.pt"))
        result[name] = got
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, list[Any]], Path]:
    out = tmp_path_factory.mktemp("tp-ranks")
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
    """The same model and samples on one rank, the plain loop."""
    got = _train({})
    assert got["engine"] == "PlainBackend"
    return got


@pytest.fixture(scope="module")
def single_llama() -> dict[str, Any]:
    got = _train({"model": "llama"})
    assert got["engine"] == "PlainBackend"
    return got


@pytest.fixture(scope="module")
def single_switched() -> dict[str, Any]:
    got = _train({"switch": SWITCH})
    assert got["engine"] == "PlainBackend"
    return got


def test_a_live_switch_carries_the_split_weights_and_adam_state(
    ranks: Any, single: dict[str, Any], single_switched: dict[str, Any]
) -> None:
    """A change after the first step rebuilds the tensor-parallel engine from the state it
    exported (weights and Adam moments gathered whole, the qkv rows put back in your
    module's order, then split again): the run follows one rank's that switched the same
    way, and the moments it exports equal one rank's by name."""
    got, out = ranks
    assert single_switched["losses"][0] == single["losses"][0]
    assert single_switched["losses"][2] != pytest.approx(single["losses"][2], abs=1e-7)
    for r in range(2):
        run = got[2][r]["tp2 switched"]
        assert run["losses"] == pytest.approx(single_switched["losses"], abs=LOSS_TOL), r
        assert run["grad_norms"] == pytest.approx(single_switched["grad_norms"], rel=1e-4)
        moments = torch.load(out / f"tp2 switched-{r}-moments.pt", weights_only=True)
        assert moments.keys() == single_switched["moments"].keys()
        for name, value in single_switched["moments"].items():
            torch.testing.assert_close(moments[name], value, rtol=1e-3, atol=1e-6, msg=name)


def test_with_dropout_the_ranks_stay_one_model(ranks: Any) -> None:
    """Dropout draws from each rank's RNG, seeded alike, so the masks on the whole
    (replicated) residual stream are the same on both ranks and the stream stays one: the
    two ranks report the same losses and give back the same weights, the norms and
    position table (held whole on each rank) included."""
    got, out = ranks
    a, b = got[2][0]["tp2 dropout"], got[2][1]["tp2 dropout"]
    assert a["losses"] == b["losses"] and all(isinstance(x, float) for x in a["losses"])
    assert a["losses"] != pytest.approx(got[2][0]["tp2"]["losses"], abs=1e-6)  # dropout acts
    w0 = torch.load(out / "tp2 dropout-0.pt", weights_only=True)
    w1 = torch.load(out / "tp2 dropout-1.pt", weights_only=True)
    for name, value in w0.items():
        assert torch.equal(value, w1[name]), name


def test_every_rank_holds_its_vocabulary_share(ranks: Any) -> None:
    """tp=4 over a vocabulary of 66 rows: torch.chunk gives 17, 17, 17 and 15 rows. DTensor
    scatters padded chunks, so the last rank's 15 weight rows sit in a 17-row buffer (the
    estimator's ceil(V/t), exact on every rank); its gradient and Adam moments are made
    for the 15 rows alone: 2 rows less there (the head is tied: one matrix)."""
    got, _ = ranks
    row = GPT["hidden"] * 4  # one fp32 row of the (vocab x hidden) embedding
    for r, short in enumerate((0, 0, 0, 2)):
        run = got[4][r]["tp4"]
        predicted = run["predicted"]
        assert run["params_bytes"] == predicted["params_bytes"], r
        assert run["grads_bytes"] == predicted["grads_bytes"] - short * row, r
        assert run["optimizer_bytes"] == predicted["optimizer_bytes"] - 2 * short * row, r


def test_workbench_launch_reports_each_ranks_place_and_share() -> None:
    """`workbench launch --tp 2` and `--pp 2`: every rank's layout, its measured states and
    activations next to the estimator's figure for it, and the table's columns."""
    from workbench.cli.launch import _table
    from workbench.train.launch import launch_ranks

    for settings, place in (({"tp": 2}, "tp rank"), ({"pp": 2, "grad_accum": 2}, "stage")):
        result = launch_ranks(
            config(**settings), ranks=2, model="tiny-gpt", steps=2, model_options=GPT, threads=1
        )
        assert result.ok, result.first_error
        for r in result.ranks:
            assert r.layout is not None and r.predicted is not None
            assert r.layout["tp"] == settings.get("tp", 1) and r.layout["pp"] == settings.get(
                "pp", 1
            )
            assert isinstance(r.activation_bytes, int) and r.activation_bytes > 0
            assert isinstance(r.predicted["activation_bytes"], int)
        first = result.ranks[0]
        assert first.params_bytes == first.predicted["params_bytes"]
        table = _table(result)
        assert place in table and "activations KiB" in table
        if "pp" in settings:
            assert "bubble" in table and result.ranks[1].layout["stage"] == 1
        else:
            assert [r.layout["tp_rank"] for r in result.ranks] == [0, 1]


def test_a_transformers_llama_splits_and_trains_the_single_rank_losses(
    ranks: Any, single_llama: dict[str, Any]
) -> None:
    """q, k, v, gate, up column-wise, o and down row-wise, 2 K/V heads split 1 a rank, its
    own loss computed vocabulary-parallel in its forward."""
    got, out = ranks
    for r in range(2):
        run = got[2][r]["llama tp2"]
        assert run["engine"] == "TensorParallelBackend"
        assert run["losses"] == pytest.approx(single_llama["losses"], abs=LOSS_TOL)
        assert run["grad_norms"] == pytest.approx(single_llama["grad_norms"], rel=1e-4)
        w = torch.load(out / f"llama tp2-{r}.pt", weights_only=True)
        for key, value in single_llama["weights"].items():
            torch.testing.assert_close(w[key], value, rtol=0, atol=1e-4, msg=key)
    run = got[2][0]["llama tp2"]
    for field in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert run[field] == run["predicted"][field], field
    offset = single_llama["activation_bytes"] - single_llama["predicted"]["activation_bytes"]
    assert run["activation_bytes"] - run["predicted"]["activation_bytes"] == offset


def test_a_transformers_llama_trains_sequence_parallel(
    ranks: Any, single_llama: dict[str, Any]
) -> None:
    """Sequence parallel on the Llama: the embedding's output stays whole (the decoder
    reads positions and the causal mask from it), the first layer takes this rank's
    positions, the RMSNorms and the residual stream hold s/t of them, and the attention
    and the MLP each gather their input once (q, k, v and gate, up share that copy, as
    torchtitan's plan does; a gather per projection would keep five). Measured at tp=2:
    188,036 bytes of activations against 229,636 without: the estimator's sequence-parallel
    figure plus the single-rank offset plus the gathered inputs' other half (the attention's
    and the MLP's in each layer and the head's, which PyTorch keeps whole where Table 2
    counts s/t of them, as the GPT test below says), within 1%. (Before transformers'
    RMSNorm copies were the formula's, the single-rank offset held them whole where each
    rank keeps s/t of them, which hid the gathered inputs.)"""
    got, out = ranks
    for r in range(2):
        run = got[2][r]["llama tp2 sp"]
        assert run["losses"] == pytest.approx(single_llama["losses"], abs=LOSS_TOL)
        assert run["grad_norms"] == pytest.approx(single_llama["grad_norms"], rel=1e-4)
        w = torch.load(out / f"llama tp2 sp-{r}.pt", weights_only=True)
        for key, value in single_llama["weights"].items():
            torch.testing.assert_close(w[key], value, rtol=0, atol=1e-4, msg=key)
    run, plain = got[2][0]["llama tp2 sp"], got[2][0]["llama tp2"]
    assert run["activation_bytes"] < plain["activation_bytes"]
    offset = single_llama["activation_bytes"] - single_llama["predicted"]["activation_bytes"]
    b, s, h, e, layers = 4, 16, 32, 4, 2  # the Tokens' micro-batch, the llama()'s shape, fp32
    gathered = (2 * layers + 1) * e * b * s * h // 2  # t = 2: the other half of each input
    expected = run["predicted"]["activation_bytes"] + offset + gathered
    assert run["activation_bytes"] == pytest.approx(expected, rel=0.01)
    assert run["predicted"]["activation_bytes"] < plain["predicted"]["activation_bytes"]


@pytest.mark.parametrize("sequence", [False, True], ids=["tp", "tp sp"])
def test_the_jobs_copy_of_the_llama_plan_is_the_sessions(sequence: bool) -> None:
    """The exported jobs import nothing of workbench: job_common splits a Llama by its own
    copy of the plan, the same layers in the same styles."""
    from workbench.export import job_parallel
    from workbench.train.techniques.tensor_plan import tensor_plan

    model = llama()
    layers, sizes, tied = job_parallel._tp_layers(model, 2, sequence)
    plan = tensor_plan(model, 2, sequence_parallel=sequence)
    assert layers == plan.layers and sizes == plan.sizes and tied == plan.tied
    assert ("model.layers.0" in layers) is sequence


def test_tensor_parallel_trains_the_single_rank_losses(ranks: Any, single: dict[str, Any]) -> None:
    got, _ = ranks
    for world, name in ((2, "tp2"), (4, "tp4")):
        for r, result in enumerate(got[world]):
            run = result[name]
            assert run["engine"] == "TensorParallelBackend"
            assert run["losses"] == pytest.approx(single["losses"], abs=LOSS_TOL), (name, r)
            # the full gradient's norm, shards and replicas counted once
            assert run["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-4), (name, r)
            assert run["samples"] == single["samples"]  # dp=1: one rank's samples a step


def test_sequence_parallel_trains_the_same_losses_and_splits_the_norms_inputs(
    ranks: Any, single: dict[str, Any]
) -> None:
    """The norms, dropout and residual stream hold s/t positions: the activations fall
    below plain tensor parallel's. PyTorch keeps each column-parallel matmul's gathered
    input (qkv and fc in each layer, the head) for backward where Megatron gathers it
    again, so the measurement sits above Table 2's sequence-parallel figure by at most
    those inputs' other (t-1)/t (docs/estimator.md)."""
    got, _ = ranks
    offset = single["activation_bytes"] - single["predicted"]["activation_bytes"]
    b, s, h, e = 4, GPT["seq_len"], GPT["hidden"], 4
    gathered = (2 * GPT["layers"] + 1) * e * b * s * h
    for world, name, plain in ((2, "tp2 sp", "tp2"), (4, "tp4 sp", "tp4")):
        for r in range(world):
            run = got[world][r][name]
            assert run["losses"] == pytest.approx(single["losses"], abs=LOSS_TOL), (name, r)
            assert run["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-4)
        run = got[world][0][name]
        assert run["params_bytes"] == run["predicted"]["params_bytes"]
        assert run["activation_bytes"] < got[world][0][plain]["activation_bytes"]
        low = run["predicted"]["activation_bytes"] + offset
        assert low <= run["activation_bytes"] <= low + gathered * (world - 1) // world, name


def test_tp_times_dp_trains_the_data_parallel_losses(ranks: Any) -> None:
    got, _ = ranks
    for r in range(4):
        dp_rank = r // 2  # ranks 0, 1 are dp rank 0; 2, 3 dp rank 1
        reference = got[2][dp_rank]["dp2"]
        for name in ("tp2 dp2", "tp2 fsdp2"):
            run = got[4][r][name]
            assert run["losses"] == pytest.approx(reference["losses"], abs=LOSS_TOL), (name, r)
            assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-4)
            assert run["samples"] == reference["samples"]  # two data-parallel ranks' samples


def test_your_module_gets_the_trained_weights_in_its_own_layout(
    ranks: Any, single: dict[str, Any]
) -> None:
    """Whole tensors in the module's own row order (the fused qkv's permutation undone),
    equal to the run each trains like; atol 1e-4 at lr 1e-2: Adam's step of an element
    with a near-zero gradient follows its rounding."""
    _, out = ranks
    dp2 = torch.load(out / "dp2-0.pt", weights_only=True)
    for name, world, reference in (
        ("tp2", 2, single["weights"]),
        ("tp4", 4, single["weights"]),
        ("tp2 dp2", 4, dp2),
        ("tp2 fsdp2", 4, dp2),
    ):
        for r in range(world):
            w = torch.load(out / f"{name}-{r}.pt", weights_only=True)
            assert w.keys() == reference.keys()
            for key, value in reference.items():
                assert type(w[key]) is torch.Tensor, key  # not a shard
                torch.testing.assert_close(w[key], value, rtol=0, atol=1e-4, msg=key)


def test_each_rank_holds_the_estimators_tensor_parallel_share(
    ranks: Any, single: dict[str, Any]
) -> None:
    got, _ = ranks
    # what the estimator does not count in a step's saved tensors, one rank or split
    offset = single["activation_bytes"] - single["predicted"]["activation_bytes"]
    for world, name in ((2, "tp2"), (4, "tp4")):
        run = got[world][0][name]  # rank 0: the vocabulary's larger share
        for field in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            assert run[field] == run["predicted"][field], (name, field)
        assert run["params_bytes"] < single["params_bytes"] * 0.6
        assert run["activation_bytes"] - run["predicted"]["activation_bytes"] == offset, name
        assert run["activation_bytes"] < single["activation_bytes"]
    # FSDP2 over the data-parallel ranks pads each shard to equal rows: at most a row more
    fsdp = got[4][0]["tp2 fsdp2"]
    for field in ("params_bytes", "grads_bytes"):
        measured, predicted = fsdp[field], fsdp["predicted"][field]
        assert predicted <= measured <= predicted * 1.01, (field, measured, predicted)


def test_bad_tensor_parallel_sizes_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r"tp=2: tensor parallelism trains through PyTorch"):
        TrainConfig(tp=2, zero_stage=1)
    with pytest.raises(ConfigError, match=r"tp=0: must be an integer >= 1, at most 64"):
        TrainConfig(tp=0)
    # one rank: tp must divide the ranks; 3 does not divide the 4 heads either
    with pytest.raises(ConfigError) as caught:
        Session(config(tp=3), model="tiny-gpt", model_options=GPT)
    text = str(caught.value)
    assert "tp=3: must divide the 1 rank" in text
    assert "tp=3: must divide heads=4, hidden=32, ffn_hidden=128 evenly" in text
    with pytest.raises(ConfigError, match=r"tp=2: .*MLP has no tensor-parallel plan"):
        Session(config(tp=2), model="mlp")
    with pytest.raises(ConfigError, match=r"fsdp='no_shard': with tp > 1, FSDP2 shards"):
        Session(config(tp=2, fsdp="no_shard"), model="tiny-gpt", model_options=GPT)
    with pytest.raises(ConfigError, match=r"sequence_parallel=True: splits the sequence of a"):
        Session(
            config(tp=2, sequence_parallel=True, documents="packed"),
            model="tiny-gpt",
            model_options=GPT,
        )
    with pytest.raises(ConfigError, match=r"sequence_parallel=True: .* needs tp > 1"):
        TrainConfig(sequence_parallel=True)
    with pytest.raises(ConfigError, match=r"lora_rank=4: not with tp=2: LoRA"):
        Session(config(tp=2, lora_rank=4), model="tiny-gpt", model_options=GPT)


def test_each_rank_knows_its_place_and_the_panel_says_it(
    ranks: Any, single: dict[str, Any]
) -> None:
    got, _ = ranks
    assert single["layout"] is None and single["status"] == ""
    for r in range(4):
        run = got[4][r]["tp2 dp2"]
        assert run["layout"] == {
            "tp": 2,
            "pp": 1,
            "dp": 2,
            "tp_rank": r % 2,
            "stage": 0,
            "dp_rank": r // 2,
        }
        assert run["status"] == f"tensor parallel 2 (this rank {r % 2}) x data parallel 2"


@pytest.mark.parametrize("sequence", [False, True], ids=["tp2", "tp2 sp"])
def test_the_exported_fsdp_job_trains_tensor_parallel_with_the_sessions_losses(
    sequence: bool, ranks: Any, tmp_path: Path
) -> None:
    """`workbench export --format fsdp --tp 2`: the job splits the layers as the Session
    does (its own copy of the plan) and FSDP2 shards over the data-parallel dimension;
    on 2 ranks (tp=2 x dp=1) its losses are the Session's tp=2 run's."""
    from tests.integration.job_runs import run_script
    from workbench.export import export_job

    got, _ = ranks
    settings = {"tp": 2, "fsdp": "full_shard", "sequence_parallel": sequence}
    job = export_job(
        config(**settings), format="fsdp", gpus=2, out_dir=tmp_path / "job", model_options=GPT
    )
    lines, _ = run_script("train_fsdp.py", Path(job.out_dir), steps=STEPS, ranks=2)
    session = got[2][0]["tp2 sp" if sequence else "tp2"]
    assert [ln["loss"] for ln in lines] == pytest.approx(session["losses"], abs=LOSS_TOL)
    assert [ln["grad_norm"] for ln in lines] == pytest.approx(session["grad_norms"], rel=1e-4)


def test_the_exported_lightning_job_trains_tensor_parallel_with_the_sessions_losses(
    ranks: Any, tmp_path: Path
) -> None:
    """`workbench export --format lightning --tp 2`: Lightning's ModelParallelStrategy,
    the job's `configure_model` splitting the layers (and FSDP2 over the data-parallel
    dimension); on 2 devices its losses are the Session's tp=2 run's."""
    import subprocess
    import sys

    from workbench.export import export_job

    got, _ = ranks
    job = export_job(
        config(tp=2), format="lightning", gpus=2, out_dir=tmp_path / "job", model_options=GPT
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    saved = tmp_path / "saved"
    argv = [sys.executable, "train_lightning.py", "--steps", str(STEPS), "--devices", "2",
            "--save-dir", str(saved)]  # fmt: skip
    done = subprocess.run(
        argv, cwd=job.out_dir, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith('{"step"')]
    assert [ln["loss"] for ln in lines] == pytest.approx(got[2][0]["tp2"]["losses"], abs=LOSS_TOL)
    # --save-dir: the split layers gathered whole, every weight of the model
    from safetensors.torch import load_file

    from workbench.models import build_model

    weights = load_file(str(saved / "model.safetensors"))
    seed = json.loads((Path(job.out_dir) / "job.json").read_text())["seed"]
    model, _, _, _ = build_model("tiny-gpt", seed=seed, **GPT)  # the job's initial weights
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(weights, strict=True)  # whole shapes: a shard would not load
    qkv = [k for k in weights if k.endswith("qkv.weight")]  # trained: moved from the start
    assert qkv and all(not torch.equal(initial[k], weights[k]) for k in qkv)
