"""The peak of a step (`workbench.estimate.peak`): its terms, its settings, its errors.

Pure arithmetic checks against the formulas the module docstring states, each computed
by hand here; tests/integration/test_peak_terms.py measures the terms on this CPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.estimate import GIB, EstimateInputError, estimate_memory

REPO = Path(__file__).resolve().parents[2]
LLAMA8 = dict(model="llama-3-8b", seq_len=8192, precision="amp-bf16")


def _problem(**kw: object) -> str:
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(**kw)
    return str(info.value)


# ------------------------------------------------------------------ what the peak holds
def test_peak_is_the_highest_point_and_its_terms_add_up():
    e = estimate_memory(**LLAMA8, fsdp="full_shard", gpus=8, checkpointing="selective-op")
    assert e.peak.phase in e.peak.phases and e.peak_bytes == max(e.peak.phases.values())
    assert e.peak_bytes == sum(e.peak_terms.values())
    assert e.peak.points[e.peak.phase] == e.peak.terms | {
        k: 0 for k in e.peak.points[e.peak.phase] if k not in e.peak.terms
    }
    assert e.required_bytes == e.peak_bytes + e.overhead_bytes
    # states at rest stay under their names: the ZeRO paper's 16 bytes per parameter
    states = estimate_memory(n_params="175B", precision="fp32", optimizer="adamw")
    assert states.model_states_bytes == 16 * 175 * 10**9
    assert states.peak_bytes == 16 * 175 * 10**9 + 4 * 175 * 10**9  # + foreach's temporary


def test_fits_and_the_largest_micro_batch_use_the_peak():
    e = estimate_memory(**LLAMA8, fsdp="full_shard", gpus=8, gpu="h100", checkpointing="full")
    room = e.gpu_memory_bytes - e.overhead_bytes
    assert e.fits == (e.peak_bytes <= room)
    mb = e.max_micro_batch
    assert mb is not None and mb >= 1
    assert estimate_memory(
        **{
            **LLAMA8,
            "fsdp": "full_shard",
            "gpus": 8,
            "gpu": "h100",
            "checkpointing": "full",
            "micro_batch": mb,
        }
    ).fits
    assert not estimate_memory(
        **{
            **LLAMA8,
            "fsdp": "full_shard",
            "gpus": 8,
            "gpu": "h100",
            "checkpointing": "full",
            "micro_batch": mb + 1,
        }
    ).fits


def test_logits_and_loss_by_hand():
    """16-bit compute, no parallelism: forward e·sbv + 4sbv (fp32 copy) + 4sbv (log-probs);
    backward 4sbv (log-probs) + 8sbv (their gradient and the logits' fp32 gradient)."""
    e = estimate_memory(**LLAMA8, micro_batch=1)
    sbv = 8192 * 1 * 128256
    assert e.peak.points["forward end"]["logits and loss"] == 2 * sbv + 4 * sbv + 4 * sbv
    assert e.peak.points["backward"]["logits and loss"] == 4 * sbv + 8 * sbv
    chunked = estimate_memory(**LLAMA8, micro_batch=1, loss_chunks=8)
    assert chunked.peak.points["forward end"]["logits and loss"] == 2 * sbv + 4 * sbv // 8 + 4 * sbv
    assert chunked.peak.points["backward"]["logits and loss"] == 4 * sbv + 8 * sbv // 8
    assert e.peak.chunked_loss_saving_bytes == e.peak_bytes - chunked.peak_bytes > 0
    assert chunked.peak.chunked_loss_saving_bytes == 0


def test_optimizer_temporaries_follow_the_implementation():
    n = 10**9
    foreach = estimate_memory(n_params=n, precision="fp32", optimizer="adamw")
    assert foreach.optimizer_impl == "foreach"
    assert foreach.peak.points["optimizer step"]["optimizer step temporaries"] == 4 * n
    fused = estimate_memory(n_params=n, precision="fp32", optimizer="adamw", optimizer_impl="fused")
    assert fused.peak.points["optimizer step"]["optimizer step temporaries"] == 0
    sgd = estimate_memory(n_params=n, precision="fp32", optimizer="sgd")
    assert sgd.peak.points["optimizer step"]["optimizer step temporaries"] == 0
    pure = estimate_memory(n_params=n, precision="bf16-true", optimizer="adamw")
    assert pure.peak.points["optimizer step"]["optimizer step temporaries"] == 2 * n
    zero = estimate_memory(n_params=n, precision="bf16", optimizer="adamw", zero_stage=1, gpus=8)
    assert zero.optimizer_impl == "fused"  # DeepSpeed builds FusedAdam
    shard = estimate_memory(n_params=n, precision="fp32", fsdp="full_shard", gpus=8)
    assert shard.peak.points["optimizer step"]["optimizer step temporaries"] == 4 * n // 8
    loop = estimate_memory(**LLAMA8, optimizer_impl="for-loop")
    # for-loop: two tensors of the parameter it steps while the previous one's last is
    # still bound; largest at the untied output projection, after the final norm
    largest, norm = 128256 * 4096, 4096
    temporaries = loop.peak.points["optimizer step"]["optimizer step temporaries"]
    assert temporaries == 4 * (norm + 2 * largest)
    sgd_decay = estimate_memory(n_params=n, precision="fp32", optimizer="sgd", weight_decay=0.01)
    assert sgd_decay.peak.points["optimizer step"]["optimizer step temporaries"] == 4 * n


def test_ddp_buckets_and_the_bucket_view():
    n = 10**9
    ddp = estimate_memory(n_params=n, precision="fp32", gpus=2)
    assert ddp.peak.engine == "ddp" and ddp.peak_terms["DDP gradient buckets"] == 4 * n
    view = estimate_memory(n_params=n, precision="fp32", gpus=2, bucket_view=True)
    assert "DDP gradient buckets" not in view.peak_terms
    assert ddp.peak_bytes - view.peak_bytes == 4 * n
    single = estimate_memory(n_params=n, precision="fp32")
    assert single.peak.engine == "plain" and "DDP gradient buckets" not in single.peak_terms


def test_fsdp_modes_differ_and_offload_is_not_free():
    kw = dict(**LLAMA8, gpus=8, checkpointing="full")
    # the embedding and head gathered with the root (`fsdp_units` "blocks-only")
    full = estimate_memory(**kw, fsdp="full_shard", fsdp_units="blocks-only")
    grad_op = estimate_memory(**kw, fsdp="shard_grad_op")
    no_shard = estimate_memory(**kw, fsdp="no_shard")
    gathered = "FSDP gathered parameters"
    layer = 218_112_000  # one Llama 3 8B layer's parameters
    root = 2 * 128256 * 4096 + 4096  # embedding, output projection, final norm
    # full_shard: a layer running and the next, prefetched. shard_grad_op: every layer,
    # and the last one's all-gather output until the loss
    assert full.peak.points["forward end"][gathered] == 2 * (root + 2 * layer)
    assert full.peak.points["backward"][gathered] == 2 * (root + 2 * layer)
    assert grad_op.peak.points["forward end"][gathered] == 2 * (root + 33 * layer)
    assert grad_op.peak.points["backward"][gathered] == 2 * (root + 32 * layer)
    assert grad_op.peak_bytes > full.peak_bytes
    # the default units: the embedding and the head (with the final norm) units of their own;
    # the head gathered with its all-gather output from the forward's end into the loss's
    # backward, a layer's backward holding the layer and the next
    own = estimate_memory(**kw, fsdp="full_shard")
    head = 128256 * 4096 + 4096
    assert own.peak.points["forward end"][gathered] == 2 * 2 * head
    assert own.peak.moments["loss backward"][gathered] == 2 * 2 * head
    assert own.peak.moments["last layer's backward"][gathered] == 2 * 2 * layer
    assert own.peak.moments["backward end"][gathered] == 2 * 128256 * 4096
    assert no_shard.model_states_bytes > full.model_states_bytes
    offload = estimate_memory(**kw, fsdp="full_shard", offload_params=True)
    assert offload.model_states_bytes == 0 and offload.cpu_offload_bytes > 0
    assert offload.peak_bytes >= offload.peak.points["forward end"][gathered] > 0


def test_deepspeed_buffers_come_from_its_config():
    kw = dict(n_params="7B", precision="bf16", gpus=8)
    stage2 = estimate_memory(**kw, zero_stage=2)
    capped = stage2.peak.points["backward"]["DeepSpeed reduce buckets"]
    ds = {"zero_optimization": {"reduce_bucket_size": 2e8, "overlap_comm": True}}
    given = estimate_memory(**kw, zero_stage=2, deepspeed_config=ds)
    assert (
        given.peak.points["backward"]["DeepSpeed reduce buckets"] == 2 * 2 * 200_000_000 != capped
    )
    auto = estimate_memory(
        **kw, zero_stage=2, deepspeed_config={"zero_optimization": {"reduce_bucket_size": "auto"}}
    )
    assert auto.peak.points["backward"]["DeepSpeed reduce buckets"] == 2 * 500_000_000
    stage3 = estimate_memory(
        **kw,
        zero_stage=3,
        deepspeed_config={"zero_optimization": {"stage3_max_live_parameters": 1000}},
    )
    assert stage3.peak.points["forward end"]["ZeRO-3 gathered parameters"] == 2 * 1000


def test_attention_kernels_and_dropout_defaults():
    sdpa = estimate_memory(**LLAMA8)
    megatron = estimate_memory(**LLAMA8, attention="megatron")
    eager = estimate_memory(**LLAMA8, attention="eager")
    assert (sdpa.attention, megatron.attention, eager.attention) == ("sdpa", "megatron", "eager")
    # without dropout Megatron's attention keeps one a·s²·b score tensor per layer in
    # 16 bits where sdpa keeps a 4·a·s·b log-sum-exp, and sdpa keeps K and V at the
    # grouped width g = 1024 instead of repeated to h; transformers' eager attention also
    # keeps its fp32 softmax output, 4 bytes per score
    s, a, h, g, layers = 8192, 32, 4096, 1024, 32
    per_layer = 2 * a * s * s - 4 * a * s + 2 * 2 * s * (h - g)
    assert megatron.activation_bytes - sdpa.activation_bytes == layers * per_layer
    assert eager.activation_bytes - megatron.activation_bytes == layers * 4 * a * s * s
    assert sdpa.dropout is False  # Llama trains without dropout
    assert estimate_memory(model="gpt2").dropout is True  # GPT-2 with 0.1
    assert estimate_memory(layers=2, hidden=8, heads=2, seq_len=8, vocab=8).dropout is True
    assert estimate_memory(**LLAMA8, dropout=True).dropout is True


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (dict(attention="flash3"), r"attention='flash3': must be one of sdpa, megatron, eager"),
        (dict(optimizer_impl="fast"), r"optimizer_impl='fast': must be one of auto, foreach"),
        (dict(grad_accum=0), r"grad_accum=0: must be an integer from 1 to 10\^6"),
        (dict(loss_chunks=10**5), r"loss_chunks=100000: must not exceed seq_len \(8192\)"),
        (dict(bucket_view="yes"), r"bucket_view='yes': must be True or False"),
        (dict(deepspeed_config=7), r"deepspeed_config=7: must be a path to a DeepSpeed JSON"),
        (
            dict(deepspeed_config={"zero_optimization": {"reduce_bucket_size": "big"}}),
            r"zero_optimization.reduce_bucket_size 'big': must be a whole number",
        ),
        (
            dict(deepspeed_config={"zero_optimization": {"overlap_comm": "yes"}}),
            r"zero_optimization.overlap_comm 'yes': must be true or false",
        ),
        (
            dict(deepspeed_config={}, fsdp="full_shard", gpus=2),
            r"deepspeed_config='given': is DeepSpeed's; this setup is FSDP",
        ),
        (dict(precision="bf16-true", zero_stage=2, gpus=2), r"precision='bf16-true': is pure"),
    ],
)
def test_bad_peak_inputs_name_the_field(kw, expected):
    assert re.search(expected, _problem(**{**LLAMA8, **kw}))


def test_a_deepspeed_config_file_that_is_not_one(tmp_path):
    missing = tmp_path / "none.json"
    assert "no such file" in _problem(n_params="1B", deepspeed_config=str(missing))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert "must hold a JSON object" in _problem(n_params="1B", deepspeed_config=str(listed))


# ------------------------------------------------------------------ the command
def _run(args, capsys):
    try:
        code = main(args)
    except SystemExit as exc:  # argparse errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prints_the_peak_and_json_carries_every_term(capsys):
    code, out, _ = _run(
        [
            "estimate",
            "--model",
            "llama-3-8b",
            "--fsdp",
            "full_shard",
            "--gpus",
            "8",
            "--precision",
            "amp-bf16",
            "--checkpointing",
            "selective-op",
            "--gpu",
            "h100",
        ],
        capsys,
    )
    assert code == 0
    assert "peak of a step, at the backward" in out and "FSDP gathered parameters" in out
    assert "CUDA context and allocator reserve" in out and "model states at rest" in out
    code, out, _ = _run(["estimate", "--model", "llama-3-8b", "--json"], capsys)
    data = json.loads(out)
    assert data["peak_bytes"] == sum(data["peak"]["terms"].values())
    assert set(data["peak"]["points"]) == {"forward end", "backward", "optimizer step"}


def test_cli_reads_the_setup_from_a_deepspeed_config(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 4,
                "train_batch_size": 64,
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1000},
            }
        )
    )
    code, out, _ = _run(
        ["estimate", "--model", "llama-3-8b", "--deepspeed-config", str(path), "--json"], capsys
    )
    data = json.loads(out)
    assert code == 0 and (data["zero_stage"], data["precision"], data["gpus"]) == (3, "bf16", 8)
    assert (data["micro_batch"], data["grad_accum"]) == (2, 4)
    # `stage3_max_live_parameters` 1000 bounds nothing below the layer that runs: Llama 3 8B's
    # layer in bf16 (the dry run of DeepSpeed's engine keeps more
    # at a limit under a layer: docs/dry_run.md)
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096  # Q, O; K, V; MLP; norms
    assert layer == 218_112_000
    assert data["peak"]["points"]["forward end"]["ZeRO-3 gathered parameters"] == 2 * layer
    # a flag given wins over the file
    code, out, _ = _run(
        [
            "estimate",
            "--model",
            "llama-3-8b",
            "--deepspeed-config",
            str(path),
            *("--micro-batch", "1", "--precision", "amp-bf16", "--json"),
        ],
        capsys,
    )
    data = json.loads(out)
    assert code == 0 and (data["micro_batch"], data["precision"], data["zero_stage"]) == (
        1,
        "amp-bf16",
        3,
    )
    # a --gpus the file's batch sizes contradict is the file's problem, named once
    code, _, err = _run(
        ["estimate", "--model", "llama-3-8b", "--deepspeed-config", str(path), "--gpus", "64"],
        capsys,
    )
    assert code == 2 and "--deepspeed-config" in err and "train_batch_size" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 7}}')
    code, _, err = _run(
        ["estimate", "--model", "llama-3-8b", "--deepspeed-config", str(bad)], capsys
    )
    assert code == 2 and "--deepspeed-config" in err and "zero_optimization.stage=7" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--attention", "flash3"],
            "--attention flash3: must be one of model, sdpa, megatron, eager",
        ),
        (["--loss-chunks", "0"], "--loss-chunks 0: must be an integer from 1 to 10^6"),
        (["--optimizer-impl", "x"], "--optimizer-impl x: must be one of auto, foreach"),
        (["--fsdp-reduce", "fp8"], "--fsdp-reduce fp8: must be fp32 or compute"),
        (["--grad-accum", "many"], "--grad-accum many: must be an integer from 1 to 10^6"),
    ],
)
def test_cli_bad_peak_flags(args, expected, capsys):
    code, _, err = _run(["estimate", "--model", "llama-3-8b", *args], capsys)
    assert code == 2 and expected in err


# ------------------------------------------------------------------ the docs' table
def test_the_docs_table_of_published_cases_shows_what_the_estimator_says():
    """docs/estimator.md compares the estimate with published measurements; the estimate
    column must be what the estimator computes now."""
    text = (REPO / "docs" / "estimator.md").read_text()
    tt = dict(model="llama-3-8b", precision="amp-bf16", fsdp="full_shard", gpus=8, seq_len=8192)
    rows = [
        ("torchtitan PR #822", dict(**tt, checkpointing="selective-op")),
        (
            "`reshard_after_forward` never",
            dict(**{**tt, "fsdp": "shard_grad_op"}, checkpointing="selective-op"),
        ),
        ("torchtitan POC commit 9dc418a", dict(**tt)),
        ("torchtitan benchmark, Dec 2024", dict(**tt, micro_batch=2, checkpointing="selective-op")),
        (
            "| same | 128 GPUs |",
            dict(**{**tt, "gpus": 128}, micro_batch=2, checkpointing="selective-op"),
        ),
    ]
    for marker, kw in rows:
        line = next(line for line in text.splitlines() if marker in line)
        e = estimate_memory(**kw)
        peak, required = f"{e.peak_bytes / GIB:.1f}", f"{e.required_bytes / GIB:.1f}"
        assert f"| {peak} ({required}) |" in line, (marker, peak, required, line)


# ------------------------------------------------------------------ mixtures of experts
def test_a_mixture_of_experts_reports_active_parameters_and_expert_activations():
    kw = dict(seq_len=4096, precision="bf16", zero_stage=3, gpus=8, checkpointing="none")
    moe = estimate_memory(model="mixtral-8x7b", tokens=1e9, **kw)
    dense = estimate_memory(model="mistral-7b", **kw)  # Mixtral's attention, one MLP
    assert (moe.experts, moe.experts_per_token) == (8, 2)
    assert moe.active_params < moe.n_params and dense.active_params == dense.n_params
    # a token uses 2 of 8 experts: 6 N_active (less the 32,000 x 4,096 embedding lookup) +
    # 12 L h s (the one FLOP count, workbench.estimate.flops)
    n = moe.active_params - 32_000 * 4096
    assert moe.train_flops == (6 * n + 12 * 32 * 4096 * 4096) * 1e9
    # per layer, a token's two routed copies each keep an expert MLP's tensors (SwiGLU:
    # 4sbf elements), plus the copies of the layer input (2sbh) and the router's logits
    # (8sb elements, 2 bytes) and fp32 probabilities (4 x 8sb bytes)
    s, h, f = 4096, 4096, 14336
    extra = 2 * (4 * s * f + 2 * s * h + 8 * s) + 4 * 8 * s
    assert moe.activations.per_layer_bytes - dense.activations.per_layer_bytes == extra


def test_a_model_without_a_shape_says_why_its_activations_are_not_estimated():
    t5 = {
        "model_type": "t5",
        "d_model": 64,
        "num_layers": 2,
        "num_heads": 4,
        "d_ff": 128,
        "vocab_size": 100,
        "d_kv": 16,
    }
    e = estimate_memory(hf_config=t5)
    assert e.activation_bytes is None and "encoder-decoder" in e.activation_note
    assert "encoder-decoder" in str(e)
    assert estimate_memory(model="llama-3-8b").activation_note is None


def test_optimizer_in_backward_leaves_the_step_the_states_and_one_gradient_in_backward() -> None:
    """Each parameter stepped as its gradient is ready: the step point holds the
    parameters and the optimizer states only; the end of backward one gradient (the
    largest parameter's, here the embedding's) with its own step's temporary."""
    kwargs = dict(model="llama-3-8b", precision="bf16-true", micro_batch=1, seq_len=8)
    plain = estimate_memory(**kwargs, checkpointing="full")
    e = estimate_memory(**kwargs, checkpointing="full", optimizer_in_backward=True)
    assert sum(e.peak.points["optimizer step"].values()) == e.params_bytes + e.optimizer_bytes
    assert e.peak_bytes < plain.peak_bytes
    vocab_rows = 128256 * 4096  # the largest tensor: the embedding (untied head alike)
    assert e.peak.backward_moment == "backward end"  # 8 tokens: activations are small
    assert e.peak.points["backward"]["gradients"] == 2 * vocab_rows
    with pytest.raises(ValueError, match="optimizer_in_backward=True.*grad_accum=1"):
        estimate_memory(model="llama-3-8b", optimizer_in_backward=True, grad_accum=4)
    with pytest.raises(ValueError, match="optimizer_in_backward=True.*plain loop"):
        estimate_memory(model="llama-3-8b", optimizer_in_backward=True, zero_stage=2, gpus=8)


def test_activation_offload_moves_the_saved_activations_to_a_host_term() -> None:
    """llama-3-8b, bf16-true, full checkpointing, micro-batch 8, sequence 4096 (s·b·h =
    2^27 elements): the forward saves each of the 32 layers' input (2 bytes x 2^27) and the
    output layer's: the final norm's (transformers' RMSNorm: an fp32 copy of its input and
    the normalised input, 4 + 2 bytes) and the head's input (2), 8 x 2^27; all of it,
    36 x 2^28 bytes, is held on the host. The device keeps the layer in flight, the larger
    of one layer's input and the output layer's (4 x 2^28), so its peak (the loss's
    backward, before and after) goes down by exactly 32 x 2^28 = 2^33 bytes."""
    kwargs = dict(
        model="llama-3-8b", precision="bf16-true", micro_batch=8, seq_len=4096, checkpointing="full"
    )
    plain = estimate_memory(**kwargs)
    e = estimate_memory(**kwargs, activation_offload=True)
    assert plain.peak.host_terms == {}
    assert e.peak.host_terms == {"offloaded activations (host)": 36 * 2**28}
    assert e.peak.points["forward end"]["activations"] == 4 * 2**28
    assert plain.peak.points["forward end"]["activations"] == 36 * 2**28
    assert e.peak.phase == plain.peak.phase == "backward"
    assert plain.peak_bytes - e.peak_bytes == 2**33
    # the recomputation working set stays on the device: the last layer's backward holds it
    last = e.peak.points["backward"] if e.peak.backward_moment != "loss backward" else None
    assert last is None or last["activations"] >= e.activations.recompute_bytes
    # nothing else moves: the model states and the logits' terms are the same
    for name in ("parameters", "optimizer states", "logits and loss"):
        assert e.peak.points["forward end"][name] == plain.peak.points["forward end"][name]


def test_activation_offload_without_checkpointing_keeps_one_layer_on_the_device() -> None:
    kwargs = dict(model="llama-3-8b", precision="bf16-true", micro_batch=1, seq_len=2048)
    plain = estimate_memory(**kwargs)
    e = estimate_memory(**kwargs, activation_offload=True)
    per_layer = e.activations.per_layer_bytes
    stored = plain.peak.points["forward end"]["activations"]
    assert e.peak.host_terms["offloaded activations (host)"] == stored
    assert e.peak.points["forward end"]["activations"] == per_layer
    # the layers, and the output's: the final norm's (4 + 2 bytes an element) and the head's
    assert stored == 32 * per_layer + (4 + 2 + 2) * 2048 * 4096
    drop = plain.peak.phases["forward end"] - e.peak.phases["forward end"]
    assert drop == stored - per_layer
    # here the optimizer step is the peak either way: offloading does not lower it
    assert e.peak.phase == plain.peak.phase == "optimizer step"
    assert e.peak_bytes == plain.peak_bytes
