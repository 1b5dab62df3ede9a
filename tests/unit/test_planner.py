"""`workbench plan` / `workbench.planner.plan`: every trainable setup ranked by the step-time
model, each plan's memory the estimator's own figure, and bad input refused by name."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.engines import engine_problems
from workbench.estimate import estimate_memory, get_gpu
from workbench.planner import plan
from workbench.planner.hardware import LINKS, cluster
from workbench.planner.steptime import Layout, Shape, step_time

H100 = get_gpu("h100")


@pytest.fixture(scope="module")
def llama8b() -> object:
    return plan(model="llama-3-8b", gpu="h100", seq_len=4096, global_batch=64)


def test_every_plan_is_a_setup_the_session_trains_and_the_estimators_memory(llama8b) -> None:
    r = llama8b
    assert r.searched > len(r.plans)  # some setups do not fit
    assert len(r.plans) > 20
    for p in r.plans[:25]:
        config = TrainConfig(**p.settings)
        assert engine_problems(config, 8) == []
        assert p.tp * p.pp * p.dp == 8
        s = p.settings
        est = estimate_memory(
            model="llama-3-8b",
            seq_len=4096,
            micro_batch=s["micro_batch"],
            grad_accum=s["grad_accum"],
            precision=s["precision"],
            optimizer=s["optimizer"],
            zero_stage=s.get("zero_stage", 0),
            fsdp=s.get("fsdp", "off"),
            offload_optimizer="offload_optimizer" in s,
            offload_params="offload_params" in s,
            tensor_parallel=p.tp,
            pipeline_parallel=p.pp,
            checkpointing=s["activation_checkpointing"],
            attention="sdpa",
            gpus=8,
            gpu="h100",
        )
        assert (p.peak_bytes, p.required_bytes, p.fits) == (
            est.peak_bytes,
            est.required_bytes,
            est.fits,
        )
        assert p.fits and p.required_bytes <= H100.memory_bytes
        # the global batch is reached exactly
        assert s["micro_batch"] * s["grad_accum"] * p.dp == 64


def test_the_ranking_is_by_predicted_step_time_and_says_why(llama8b) -> None:
    r = llama8b
    times = [p.step_seconds for p in r.plans]
    assert times == sorted(times)
    assert all(p.step_seconds < r.best.step_seconds for p in r.unfit)
    assert not any(p.fits for p in r.unfit)
    why = r.why()
    assert len(why) == 2 and all(r.best.label() in w for w in why)
    # on 8 NVLinked H100s an 8B model's data parallel hides behind compute: the winner is
    # data parallel (no tensor-parallel all-reduces), and it ties on time with ZeRO-2/3
    assert r.best.tp == 1 and r.best.pp == 1 and r.best.dp == 8
    listed = r.by_budget()
    budgets = dict(listed)
    assert max(budgets) == H100.memory_bytes and budgets[H100.memory_bytes] is r.best
    for budget, p in budgets.items():
        assert p.required_bytes <= budget
    # a budget is listed where its plan changes (an L4's 22.03 and an A10G's 22.49 GiB buy
    # the same plan: one line), the GPU's own always
    plans = [p for _, p in listed]
    assert all(a is not b for a, b in zip(plans[:-1], plans[1:], strict=True))
    from workbench.estimate import GPUS

    smaller = [g.memory_bytes for g in GPUS.values() if g.memory_bytes < H100.memory_bytes]
    every = [next((p for p in r.plans if p.required_bytes <= b), None) for b in smaller]
    assert {id(p) for p in every if p is not None} | {id(r.best)} == {id(p) for p in plans}
    text = r.text()
    assert "Why #1:" in text and "Fastest plan per memory budget:" in text
    assert LINKS["h100-80gb"].source in text


def test_the_step_time_terms_are_the_documented_formulas() -> None:
    """docs/planner.md by hand: PaLM's 6N + 12Lhs FLOPs a token at the efficiency; a ring
    all-reduce of the fp32 gradients moves 2(d-1)/d of them; 4 tensor-parallel all-reduces
    of b*s*h 16-bit activations a layer; the bubble (p-1)/m of compute."""
    hw = cluster("h100", gpus_per_node=8)
    shape = Shape(n_params=10**9, active_params=10**9, layers=16, hidden=2048, seq_len=2048)
    base = {"micro_batch": 2, "accum": 4, "checkpointing": "none", "sixteen_bit": True}
    ddp = Layout(tp=1, pp=1, dp=8, engine="ddp", bf16=True, grad_bytes=4, **base)
    t = step_time(shape, ddp, hw, efficiency=0.5, overlap=0.0)
    tokens = 2048 * 2 * 4 * 8
    flops = (6 * 10**9 + 12 * 16 * 2048 * 2048) * tokens
    assert t.compute == pytest.approx(flops / (8 * H100.peak_bf16_flops * 0.5))
    # NCCL's NVLS inside a DGX H100 (NVLink SHARP: 8 channels x 40 GB/s x 0.85 x 7/8 x 2
    # = 476 GB/s), 25 MB buckets, each paying NVLS's latency (25 us)
    buckets = 153  # 4 GB in 25 MiB buckets, the last one partly full
    assert t.data_parallel == pytest.approx(2 * 7 / 8 * 4 * 10**9 / 476e9 + buckets * 25e-6)
    assert t.data_parallel_exposed == t.data_parallel  # no overlap asked
    assert step_time(shape, ddp, hw, efficiency=0.5).data_parallel_exposed == 0.0
    tp = Layout(tp=2, pp=2, dp=2, engine="ddp", bf16=True, grad_bytes=4, **base)
    t2 = step_time(shape, tp, hw, efficiency=0.5)
    act = 2 * 2048 * 2048 * 2
    # NCCL's ring (18 NVLink links x 20.6 GB/s) and its latency: NVLS over 2 GPUs is slower
    one = 2 * (1 / 2) * act / 370.8e9 + (8.4 + 2 * 3.4) * 1e-6
    assert t2.tensor_parallel == pytest.approx(4 * 8 * 4 * one)
    assert t2.bubble == pytest.approx(t2.compute * (2 - 1) / 4)
    full = Layout(tp=1, pp=1, dp=8, engine="ddp", bf16=True, grad_bytes=4,
                  **{**base, "checkpointing": "full"})  # fmt: skip
    recompute = (2 * 10**9 + 4 * 16 * 2048 * 2048) * tokens
    assert step_time(shape, full, hw, efficiency=0.5).compute == pytest.approx(
        (flops + recompute) / (8 * H100.peak_bf16_flops * 0.5)
    )
    # selective: the attention core's forward again, 4Lhs a token; no more all-reduces
    sel = {**base, "checkpointing": "selective"}
    selective = Layout(tp=2, pp=2, dp=2, engine="ddp", bf16=True, grad_bytes=4, **sel)
    t3 = step_time(shape, selective, hw, efficiency=0.5)
    per_token = 6 * 10**9 + 12 * 16 * 2048 * 2048
    assert t3.compute == pytest.approx(t2.compute * (per_token + 4 * 16 * 2048 * 2048) / per_token)
    assert t3.tensor_parallel == t2.tensor_parallel


def test_selective_recomputation_and_the_attention_kernel_are_searched() -> None:
    """Every plan of one layout is searched with none, selective and full recomputation;
    with the eager kernel pinned, selective keeps the 5as^2b bytes a layer fewer than
    none (16-bit probabilities and dropout output, a 1-byte mask: GPT-2 has dropout)."""
    r = plan(model="gpt2-xl", gpu="h100", seq_len=1024, global_batch=64, attention="eager",
             engines=("zero1",), offload=False)  # fmt: skip
    seen = {p.settings["activation_checkpointing"] for p in r.plans}
    assert seen == {"none", "selective", "full"}
    assert all(p.settings["attention"] == "eager" for p in r.plans)
    twins = {}
    for p in r.plans + r.unfit:
        key = (p.tp, p.pp, p.settings["micro_batch"])
        twins.setdefault(key, {})[p.settings["activation_checkpointing"]] = p
    pairs = [t for t in twins.values() if {"none", "selective"} <= t.keys()]
    assert pairs
    est = estimate_memory(model="gpt2-xl", seq_len=1024)
    for t in pairs:
        none, sel = t["none"], t["selective"]
        b, s, a = none.settings["micro_batch"], 1024, int(est.heads)
        layers = int(est.layers) // none.pp
        assert none.peak_bytes - sel.peak_bytes >= layers * 5 * a * s * s * b // none.tp
        assert sel.step_seconds > none.step_seconds
    # unpinned, the kernel is sdpa (the plans' memory), and the settings name none
    default = plan(model="gpt2-xl", gpu="h100", seq_len=1024, global_batch=64)
    assert all("attention" not in p.settings for p in default.plans)
    assert {p.settings["activation_checkpointing"] for p in default.plans} >= {"none", "full"}


def test_faster_setups_that_do_not_fit_are_listed_with_their_largest_term() -> None:
    r = plan(model="llama-3-70b", gpu="h100", nodes=8, seq_len=4096, global_batch=512)
    assert r.unfit, "at 70B on 64 GPUs plain ZeRO-1 data parallel is faster and does not fit"
    for p in r.unfit:
        assert not p.fits and p.required_bytes > H100.memory_bytes
        assert p.step_seconds < r.best.step_seconds
    assert "Faster setups that do not fit" in r.text()


def test_the_volumes_of_zero3_offload_and_lora_are_the_documented_ones() -> None:
    """ZeRO-3 gathers the 16-bit weights twice a micro-batch and reduce-scatters the
    gradients; a LoRA run's host Adam step and PCIe traffic cover only the adapters; MFU is
    against the peak the compute ran at (fp32's under fp32)."""
    hw = cluster("h100", gpus_per_node=8)
    shape = Shape(n_params=10**9, active_params=10**9, layers=16, hidden=2048, seq_len=2048)
    base = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "accum": 4, "checkpointing": "none",
            "sixteen_bit": True, "bf16": True}  # fmt: skip
    z3 = step_time(shape, Layout(engine="zero3", grad_bytes=2, weight_bytes=2, **base), hw,
                   efficiency=0.4)  # fmt: skip
    # a layer at a time (16 calls), NCCL's ring over NVLink and its latency
    ring = 7 / 8 * 2 * 10**9 / 370.8e9 + 16 * (8.4 + 7 * 3.4) * 1e-6
    assert z3.data_parallel == pytest.approx(4 * (2 * ring + ring))
    off = {"offload_optimizer": True, "engine": "zero3", "grad_bytes": 2, "weight_bytes": 2}
    full = step_time(shape, Layout(**off, **base), hw, efficiency=0.4)
    lora = step_time(shape, Layout(**off, trainable_params=10**7, **base), hw, efficiency=0.4)
    host = 30 * 10**9 / 8 / (300e9 / 8)  # 30 bytes a parameter of this rank's eighth
    assert full.offload == pytest.approx((2e9 + 2e9) / 8 / 64e9 + host)
    assert lora.offload == pytest.approx(full.offload / 100)
    fp32 = Layout(engine="ddp", grad_bytes=4, weight_bytes=4,
                  **{**base, "sixteen_bit": False, "bf16": False})  # fmt: skip
    t = step_time(shape, fp32, hw, efficiency=0.4)
    assert t.peak_flops == H100.peak_fp32_flops
    assert t.compute == pytest.approx(t.model_flops / (8 * H100.peak_fp32_flops * 0.4))


def test_more_nodes_put_data_parallel_on_the_network() -> None:
    one = cluster("a100-80gb", gpus_per_node=8, nodes=1)
    two = cluster("a100-80gb", gpus_per_node=8, nodes=2)
    assert one.link(8) == two.link(8) == 300e9
    assert two.link(16) == 25e9
    faster = cluster("a100-80gb", nodes=2, inter_node_gbps=50)
    assert faster.link(16) == 50e9 and "overridden" in faster.source


def test_a_model_no_setup_fits_says_which_term_breaks_and_by_how_much() -> None:
    with pytest.raises(ValueError) as caught:
        plan(model="gpt3-175b", gpu="h100", gpus_per_node=1, global_batch=8, offload=False)
    text = str(caught.value)
    assert text.startswith("model: none of the ") and "GiB over, its largest term" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu": "h10"}, "gpu='h10': unknown GPU; .*did you mean"),
        ({"gpu": "l4", "nodes": 2}, "nodes=2: the catalog has no inter-node bandwidth for l4"),
        ({"global_batch": 0}, "global_batch=0: must be an integer from 1 to 16,777,216"),
        ({"global_batch": True}, "global_batch=True: must be an integer from 1 to"),
        ({"gpus_per_node": 0}, "gpus_per_node=0: must be an integer from 1"),
        ({"engines": ("zero4",)}, r"engines=\['zero4'\]: each must be one of ddp"),
        ({"engines": ()}, r"engines=\[\]: give at least one of ddp, zero1, .* \(or leave it out"),
        (
            {"efficiency": 1.5},
            "efficiency=1.5: more than 1 .*allowed: a finite number from 0.001 to 1",
        ),
        ({"inter_node_gbps": -1}, "inter_node_gbps=-1: must be a number of GB/s > 0"),
        ({"nodes": 100_000, "gpus_per_node": 100}, "nodes=100000: 100000 x 100 = 10,000,000 GPUs"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs: dict[str, object], message: str) -> None:
    args = {"model": "llama-3-8b", "global_batch": 64, **kwargs}
    with pytest.raises(ValueError, match=message):
        plan(**args)  # type: ignore[arg-type]


def test_a_global_batch_no_data_parallel_size_divides_is_refused() -> None:
    """With 2 GPUs and 1 layer a replica spans 1 or 2 GPUs: an odd batch leaves only dp=1,
    which needs tp or pp of 2 (the heads do not split 3 ways, the layer not 2 ways)."""
    with pytest.raises(ValueError, match="global_batch=3: no layout of the 2 GPUs divides it"):
        plan(
            n_params=1e6, layers=1, hidden=96, heads=3, seq_len=32, vocab=100,
            gpu="h100", gpus_per_node=2, global_batch=3,
        )  # fmt: skip


def test_the_command_prints_the_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "llama-3-8b", "--seq-len", "4096", "--global-batch", "64"]
    assert main([*args, "--top", "3", "--tokens", "1T", "--price", "2.5"]) == 0
    out = capsys.readouterr().out
    assert " #  plan" in out and "tokens with #1:" in out and "$" in out
    assert main([*args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    plans = got["plans"]
    assert [p["step_seconds"] for p in plans] == sorted(p["step_seconds"] for p in plans)
    first = plans[0]
    assert first["fits"] is True and first["peak_bytes"] > 0
    assert engine_problems(TrainConfig(**first["settings"]), 8) == []
    assert main([*args, "--nodes", "x"]) == 2
    assert "--nodes x: must be an integer >= 1" in capsys.readouterr().err
    assert main([*args, "--price", "inf", "--global-batch", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        "--price inf: must be a finite number from 0 to 10^6" in err and "--global-batch 0" in err
    )
    assert main(["plan", "--model", "llama-3-8b", "--gpu", "l4", "--nodes", "2"]) == 2
    assert "--inter-node-gbps" in capsys.readouterr().err


def test_the_command_exports_plan_one_as_a_job(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--export DIR` writes plan #1 with the existing exporters: its settings in job.json."""
    shape = ["--params", "50M", "--layers", "4", "--hidden", "512", "--heads", "8",
             "--seq-len", "256", "--vocab", "1000", "--gpu", "a100-80gb",
             "--gpus-per-node", "2", "--global-batch", "16"]  # fmt: skip
    out = tmp_path / "job"  # type: ignore[operator]
    args = ["plan", *shape, "--json", "--export", str(out), "--export-model", "tiny-gpt"]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    best = got["plans"][0]
    assert got["exported"]["plan"] == best["label"]
    job = json.loads((out / "job.json").read_text())
    for key, value in best["settings"].items():
        assert job["config"][key] == value, key
    assert job["exported_world_size"] == 2
    assert main(["plan", *shape, "--export", str(out)]) == 2
    assert "give --export-model SPEC" in capsys.readouterr().err
    assert main(["plan", *shape, "--export", str(out), "--export-model", "tiny-gpt",
                 "--export-format", "megatron"]) == 2  # fmt: skip
    assert "--export-format megatron: must be one of deepspeed, fsdp, lightning" in (
        capsys.readouterr().err
    )


def test_what_the_user_pins_holds_in_every_plan() -> None:
    base = {"model": "llama-3-8b", "gpu": "h100", "seq_len": 4096}
    half = plan(**base, global_batch=64, headroom=0.5)
    assert half.plans and all(p.required_bytes <= H100.memory_bytes / 2 for p in half.plans)
    pure = plan(**base, global_batch=64, precision="bf16-true")
    assert {p.settings["precision"] for p in pure.plans} == {"bf16-true"}
    assert {p.engine for p in pure.plans} <= {"ddp", "full_shard", "shard_grad_op"}
    by_tokens = plan(**base, global_tokens=64 * 4096)
    assert [p.label() for p in by_tokens.plans] == [
        p.label() for p in plan(**base, global_batch=64).plans
    ]
    import numpy as np  # a sweep's NumPy integer is the int it holds

    assert [p.label() for p in plan(**base, global_tokens=np.int64(64 * 4096)).plans] == [
        p.label() for p in by_tokens.plans
    ]
    one = {"model": "llama-3-8b", "gpu": "h200", "gpus_per_node": 1, "seq_len": 1024}
    eight = plan(**one, global_batch=8, optimizer="adam8bit")
    assert eight.plans and {p.settings["optimizer"] for p in eight.plans} == {"adam8bit"}
    assert all(engine_problems(TrainConfig(**p.settings), 1) == [] for p in eight.plans)
    default = plan(**one, global_batch=8)
    assert {p.settings["optimizer"] for p in default.plans} == {"adamw"}
    alias = plan(**one, global_batch=8, optimizer="adamw8bit")  # TrainConfig's other name
    assert [p.label() for p in alias.plans] == [p.label() for p in eight.plans]
    # 8-bit moments (2 bytes a parameter for AdamW's 8): 8B fits one H200 without offload;
    # AdamW's 16 bytes a parameter fit it only where the step upcasts one sub-group of the
    # gradients at a time (ZeRO-3), not the whole fp32 gradient partition (ZeRO 1/2)
    kept = [p for p in default.plans if "offload_optimizer" not in p.settings]
    assert {p.settings.get("zero_stage") for p in kept} == {3}
    assert any("offload_optimizer" in p.settings for p in default.plans)
    assert "offload_optimizer" not in eight.best.settings
    lora = plan(**base, global_batch=64, lora_rank=16)
    assert all(p.settings["lora_rank"] == 16 for p in lora.plans)
    full = {p.label(): p for p in plan(**base, global_batch=64).plans}
    first = lora.best
    same = full[first.label().replace(" lora r16", "")]
    # no gradients for the frozen weights: less compute, adapters-only reductions
    assert first.time.compute < same.time.compute
    assert first.time.data_parallel < same.time.data_parallel
    assert first.required_bytes < same.required_bytes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"headroom": 1.0}, "headroom=1.0: must be a fraction >= 0 and < 1"),
        ({"lora_rank": -1}, "lora_rank=-1: must be an integer from 0 to 4096"),
        ({"precision": "bf17"}, "precision='bf17': must be one of fp32, amp-fp16"),
        ({"precision": "bf16", "gpu": "v100-32gb"}, "precision='bf16': v100-32gb has no bf16"),
        (
            {"optimizer": "lion"},
            r"optimizer='lion': must be one of adamw, adam8bit \(or adamw8bit\)",
        ),
        ({"attention": "flash"}, "attention='flash': must be one of sdpa, eager"),
        (
            {"headroom": 0.99},
            r"model: none of the \d+ setups planned \(engine, layout, micro-batch, recomputation\) fits 8 x h100-80gb \(0.8 GiB each, 99% kept",
        ),
        (
            {"global_tokens": 1000, "seq_len": 4096},
            "global_tokens=1000: 1,000 tokens is 0.2 sequences of 4096: must be a whole number of 4096-token",
        ),
    ],
)
def test_bad_pins_are_refused_by_name(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(model="llama-3-8b", **kwargs)  # type: ignore[arg-type]


def test_the_command_takes_gpus_in_all_and_tokens_a_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--model", "llama-3-8b", "--seq-len", "4096", "--json"]
    assert main([*args, "--gpus", "16", "--global-tokens", "4194304"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["cluster"]["nodes"], got["cluster"]["gpus_per_node"]) == (2, 8)
    assert got["global_batch"] == 1024
    assert main([*args, "--gpus", "4"]) == 0  # fewer than a node: one node of 4
    assert json.loads(capsys.readouterr().out)["cluster"]["gpus_per_node"] == 4
    assert main([*args, "--gpus", "12"]) == 2
    assert "--gpus 12: must be a whole number of nodes of 8 GPUs" in capsys.readouterr().err
    assert main([*args, "--global-tokens", "4M", "--global-batch", "8"]) == 2
    assert "give it or --global-batch, not both" in capsys.readouterr().err


def test_the_command_pins_the_optimizer(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--gpus", "1", "--seq-len", "1024",
            "--global-batch", "8", "--json"]  # fmt: skip
    assert main([*args, "--optimizer", "adam8bit"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and {p["settings"]["optimizer"] for p in plans} == {"adam8bit"}
    assert main([*args, "--optimizer", "lion"]) == 2
    assert "--optimizer 'lion': must be one of adamw, adam8bit" in capsys.readouterr().err


def _rank_of(result: object, tp: int, pp: int, dp: int, engine: str | None = None) -> int | None:
    for i, p in enumerate(result.plans, 1):  # type: ignore[attr-defined]
        if (p.tp, p.pp, p.dp) == (tp, pp, dp) and engine in (None, p.engine):
            return i
    return None


def test_the_published_runs_rank_where_docs_planner_md_says() -> None:
    """docs/planner.md, "Held against published practice": each row's figures (ranked at
    the 40% efficiency that table states). A regression pin: the figures are the planner's
    own, and the table says where and why they differ from what the runs did."""
    a100, h100 = {"gpu": "a100-80gb", "mfu": 0.4}, {"gpu": "h100", "mfu": 0.4}
    gpt3 = plan(model="gpt3-175b", **a100, nodes=128, global_batch=1536, seq_len=2048)
    # Megatron's layout: 1F1B's bubble (15/192 of the compute) behind FSDP over 512 x TP 2,
    # whose gathers hide behind compute once the network is the node's eight NICs
    assert _rank_of(gpt3, 8, 16, 8) == 3 and gpt3.best.settings["micro_batch"] == 1
    assert gpt3.best.label().endswith("mb1x3")
    assert gpt3.plans[2].step_seconds / gpt3.best.step_seconds == pytest.approx(1.14, abs=0.005)
    assert (gpt3.best.engine, gpt3.best.tp, gpt3.best.dp) == ("full_shard", 2, 512)
    small = plan(model="llama-3-8b", **h100, global_batch=16, seq_len=8192)
    assert (small.best.engine, small.best.tp, small.best.dp) == ("shard_grad_op", 2, 4)
    assert small.best.label().endswith("mb1x4")
    # the preset's transformers RMSNorms keep an fp32 copy of each norm's input and the
    # normalised input: ZeRO-3 over 8 at micro-batch 1 x 2 needs 86.5 GiB (77.5 before), FSDP
    # over 8 without recomputation 88.2 (79.2 before); with full recomputation FSDP fits,
    # 28% slower
    zero3 = next(
        p for p in small.unfit if p.engine == "zero3" and p.dp == 8 and p.label().endswith("mb1x2")
    )
    assert 86 * 2**30 < zero3.required_bytes < 87 * 2**30
    fsdp = plan(model="llama-3-8b", **h100, global_batch=16, seq_len=8192, engines=["full_shard"])
    whole = next(p for p in fsdp.unfit if p.dp == 8 and p.label().endswith("mb1x2"))
    assert 88 * 2**30 < whole.required_bytes < 89 * 2**30
    over = (whole.required_bytes - fsdp.usable_bytes) / 2**30
    assert over == pytest.approx(9.1, abs=0.05)  # over the 79.11 GiB an H100 shows
    rank = _rank_of(small, 1, 1, 8, "full_shard")
    assert rank == 28 and small.plans[rank - 1].settings["activation_checkpointing"] == "full"
    assert small.plans[rank - 1].step_seconds / small.best.step_seconds == pytest.approx(
        1.280, abs=0.01
    )
    big = plan(model="llama-3-70b", **h100, nodes=32, global_batch=512, seq_len=8192)
    # torchtitan's layout is #16, 14.4% behind ZeRO-3 over 256: with the preset's
    # transformers RMSNorms its selective recomputation (#9, 2.1% behind, before they were
    # counted) no longer fits, and full recomputation runs a third more compute
    assert _rank_of(big, 8, 1, 32, "full_shard") == 16
    tt = big.plans[15]
    zero3 = big.best
    assert tt.settings["activation_checkpointing"] == "full" and tt.label().endswith("mb4x4 ckpt")
    assert big.best.label().endswith("mb2x1 ckpt")
    assert tt.step_seconds / zero3.step_seconds == pytest.approx(1.144, abs=0.001)
    assert (big.best.engine, big.best.tp, big.best.dp) == ("zero3", 1, 256)
    # TP 8 x PP 16 with DDP (#1 before the allocator's reserve was counted) is #25
    assert _rank_of(big, 8, 16, 2) == 25
    opt = plan(model="gpt3-175b", **a100, nodes=124, global_batch=992, seq_len=2048)
    assert _rank_of(opt, 8, 1, 124, "full_shard") == 11
    assert (opt.best.tp, opt.best.dp, opt.best.engine) == (2, 496, "full_shard")
    assert opt.best.label().endswith("mb1x2")  # no recomputation
    metaseq = opt.plans[10]
    assert metaseq.settings["activation_checkpointing"] == "full"
    assert metaseq.step_seconds / opt.best.step_seconds == pytest.approx(1.42, abs=0.005)
    megatron = plan(model="llama-3-70b", **h100, nodes=96, global_batch=384, seq_len=4096)
    assert _rank_of(megatron, 8, 2, 48) is None  # does not fit without ZeRO over tp x pp
    # FSDP 384 x TP 2 without recomputation needs 102.5 GiB (79.8 before the preset's
    # transformers RMSNorms were counted): with full recomputation it is #1; TP 8 x PP 8
    # with DDP (#1 before) needs 113.8 GiB under the Session's amp, whose fp32 residual stream
    # and each projection's 16-bit cast every rank of a TP 8 group holds whole
    assert (megatron.best.engine, megatron.best.tp, megatron.best.pp) == ("full_shard", 2, 1)
    assert megatron.best.settings["activation_checkpointing"] == "full"
    ddp = next(p for p in megatron.unfit if p.engine == "ddp" and (p.tp, p.pp) == (8, 8))
    assert ddp.required_bytes / 2**30 == pytest.approx(113.8, abs=0.05)
    whole = next(
        p
        for p in megatron.unfit
        if (p.engine, p.tp, p.pp) == ("full_shard", 2, 1)
        and p.settings["activation_checkpointing"] == "none"
    )
    assert whole.required_bytes / 2**30 == pytest.approx(102.5, abs=0.05)
    with pytest.raises(ValueError, match="global_batch=2048: no layout of the 384 GPUs"):
        plan(
            n_params="176B",
            layers=70,
            hidden=14336,
            heads=112,
            seq_len=2048,
            vocab=250880,
            **a100,
            nodes=48,
            global_batch=2048,
        )  # fmt: skip  (BLOOM: 12 stages of 70 layers)
    llama405 = plan(model="llama-3.1-405b", **h100, nodes=2048, global_batch=2048, seq_len=8192)
    best = llama405.best
    assert (best.engine, best.tp, best.pp, best.dp) == ("full_shard", 8, 1, 2048)
    assert best.settings["activation_checkpointing"] == "full"
    assert best.peak_bytes / 2**30 == pytest.approx(41, abs=0.5)  # the allocated peak


def test_the_table_keeps_its_columns_when_a_label_or_a_step_is_long() -> None:
    """Offloaded ZeRO-3 labels pass 48 characters and a 70B step passes ten seconds: every
    row's figures still start where the header's do, and a long step reads in seconds."""
    r = plan(model="llama-3-70b", gpu="h100", gpus=64, seq_len=8192, global_batch=256)
    lines = r.text(top=len(r.plans)).splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  plan"))
    rows = lines[header + 1 : header + 1 + len(r.plans)]
    assert any(len(p.label()) > 48 for p in r.plans)
    assert all(p.step_seconds >= 10 for p in r.plans)
    end_of_peak = lines[header].index("peak/GPU") + len("peak/GPU")
    end_of_hfu = len(lines[header])
    for row, p in zip(rows, r.plans, strict=True):
        assert row[:end_of_peak].endswith(f"{p.required_bytes / (1 << 30):.1f}Gi"), row
        assert row.endswith(f"{p.hfu:>5.0%}") and len(row) == end_of_hfu, row
        assert f" {p.step_seconds:.1f}s " in row, row


def test_torchtitan_s_8b_layout_estimated_as_it_ran() -> None:
    """docs/planner.md, "The memory a GPU shows PyTorch": torchtitan's Llama 3.1 8B FSDP row
    (local batch 2 x 8192 on 8 H100, torch's fused RMSNorm, op-level selective recomputation)
    estimated as it ran: 68.0 GiB allocated, 77.3 GiB reserved with the context, where
    torchtitan measured 82.4 GiB (6% under)."""
    from workbench.estimate import estimate_memory

    e = estimate_memory(
        model="llama-3-8b", seq_len=8192, micro_batch=2, gpus=8, fsdp="full_shard",
        precision="amp-bf16", checkpointing="selective-op", norm_impl="kernel", gpu="h100",
    )  # fmt: skip
    assert e.peak_bytes / 2**30 == pytest.approx(68.0, abs=0.05)
    assert (e.peak_bytes + e.reserve.total_bytes) / 2**30 == pytest.approx(77.3, abs=0.05)
