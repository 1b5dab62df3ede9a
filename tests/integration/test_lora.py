"""LoRA and QLoRA trained in a Session: only the adapters train, your module gets the merged
weights back at a switch and at close, the adapters save alone, and the measured model
states match the estimator's prediction.

Bounds, measured on tiny-gpt (4 layers, hidden 128, micro-batch 4), fp32:
* LoRA: parameters, gradients and optimizer states (without Adam's step counters) equal
  the prediction to the byte (the Session passes the exact adapter count).
* QLoRA: parameters measured 761.2 KiB, predicted alike to the byte since the estimator
  counts each 4-bit layer's offset and code tables (1,092 bytes); the bound here is 4%, and
  tests/integration/test_qlora_bf16.py holds the bytes exactly.
* Activations with lora_dropout=0.1: measured 14.8 MB, predicted 17.5 MB (+18%): tiny-gpt's
  Q, K and V are one fused layer (one dropped input copy) where the shape's formula counts
  three; the prediction is an upper bound within 25%.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.integration.job_runs import run_script
from workbench import Session, TrainConfig
from workbench.estimate import estimate_memory
from workbench.models import build_model

#: the tolerance of a merged model against its unmerged adapters (fp32 rounding of the merge)
MERGED = {"atol": 5e-5, "rtol": 1e-4}

MB = 4


def _session(model: nn.Module | None = None, **settings: object) -> Session:
    config = TrainConfig(micro_batch=MB, seed=0, **settings)  # type: ignore[arg-type]
    if model is None:
        return Session(config)
    _, data, loss, _ = build_model("tiny-gpt")
    return Session(config, model=model, data=data, loss_fn=loss)


def _tiny() -> tuple[nn.Module, torch.Tensor]:
    model, data, _, _ = build_model("tiny-gpt")
    x = torch.stack([data[i][0] for i in range(2)])
    return model, x


def _outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    was = model.training
    model.eval()
    with torch.no_grad():
        out = model(x).clone()
    model.train(was)
    return out


def test_only_adapters_train_and_close_merges_into_your_module() -> None:
    model, x = _tiny()
    before = copy.deepcopy(model)
    s = _session(model, lora_rank=8, lr=1e-2)
    summary = s.lora()
    assert summary is not None
    assert summary["adapter_params"] == 4 * 8 * (128 + 384 + 128 + 128 + 128 + 512 + 512 + 128)
    assert summary["base_params"] == sum(p.numel() for p in before.parameters())
    assert 0 < summary["trainable_fraction"] < 0.1
    base = {n: p.detach().clone() for n, p in s._model.named_parameters() if ".lora_" not in n}
    losses = [r.loss for r in s.run(6, progress=False)]
    assert all(torch.isfinite(torch.tensor(losses)))
    for name, p in s._model.named_parameters():
        if ".lora_" not in name:
            assert torch.equal(p.detach(), base[name]), f"{name} changed: the base must be frozen"
    trained = _outputs(s._model, x)
    s.close()
    # your module: its own layers again, every parameter trainable as it was, the
    # adapters' update merged into the weights (same outputs as the trained adapters)
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    assert all(p.requires_grad for p in model.parameters())
    assert sorted(n for n, _ in model.named_parameters()) == sorted(
        n for n, _ in before.named_parameters()
    )
    # merged: W + s·BA in one matmul instead of Wx + s·B(Ax), fp32 rounding apart (measured:
    # up to 1.3e-5 on outputs of about 1 on one CPU, under 1e-5 on another; MERGED allows 4x)
    torch.testing.assert_close(_outputs(model, x), trained, **MERGED)
    assert not torch.allclose(_outputs(before, x), trained, atol=1e-3)


def test_switching_lora_off_and_on_keeps_what_was_trained() -> None:
    model, x = _tiny()
    s = _session(model, lora_rank=4, lr=1e-2)
    s.run(3, progress=False)
    with_adapters = _outputs(s._model, x)
    s.update(lora_rank=0)  # merged at the step boundary; the whole model trains now
    s._apply_pending(raise_errors=True)
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    assert s.lora() is None
    assert all(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(_outputs(model, x), with_adapters, **MERGED)
    s.run(1, progress=False)
    full_step = _outputs(model, x)
    assert not torch.allclose(full_step, with_adapters, atol=1e-4)  # the base trained
    s.update(lora_rank=8)  # fresh adapters (B = 0): the outputs do not change at the switch
    s._apply_pending(raise_errors=True)
    assert s.lora()["rank"] == 8  # type: ignore[index]
    torch.testing.assert_close(_outputs(s._model, x), full_step, atol=1e-5, rtol=1e-5)
    s.run(1, progress=False)
    s.close()
    assert type(model.blocks[0].attn.qkv) is nn.Linear


def test_adapters_saved_alone_load_back_into_the_base(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from peft import PeftModel
    from safetensors.torch import load_file

    model, x = _tiny()
    base = copy.deepcopy(model)
    s = _session(model, lora_rank=4, lora_alpha=8.0, lr=1e-2, lora_targets="qkv,fc")
    s.run(3, progress=False)
    trained = _outputs(s._model, x)
    folder = s.save_adapters(tmp_path / "adapters")
    s.close()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert sorted(config["target_modules"]) == sorted(
        f"blocks.{i}.{m}" for i in range(4) for m in ("attn.qkv", "mlp.fc")
    )
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert len(weights) == 2 * 8 and all(".lora_" in k for k in weights)
    # peft's own names (a PeftModel's around the base), which its loader expects
    assert all(k.startswith("base_model.model.blocks.") for k in weights)
    fresh = PeftModel.from_pretrained(base, str(folder))
    torch.testing.assert_close(_outputs(fresh, x), trained, atol=1e-5, rtol=1e-5)


def test_lora_model_states_match_the_prediction_to_the_byte() -> None:
    full = _session()
    full.run(1, progress=False)
    full_report = full.memory()
    full.close()
    s = _session(lora_rank=8)
    s.run(1, progress=False)
    report = s.memory()
    s.close()
    pred = report.predicted
    assert report.params_bytes == pred.params_bytes
    assert report.grads_bytes == pred.grads_bytes
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == pred.optimizer_bytes
    # the saving the estimator predicts for gradients + optimizer states is the one measured
    measured = (full_report.grads_bytes + full_report.optimizer_bytes) - (
        report.grads_bytes + report.optimizer_bytes
    )
    predicted = (full_report.predicted.grads_bytes + full_report.predicted.optimizer_bytes) - (
        pred.grads_bytes + pred.optimizer_bytes
    )
    assert measured == pytest.approx(predicted, rel=0.001)
    assert pred.peak_bytes < full_report.predicted.peak_bytes
    assert any("adapter parameters train" in n for n in report.notes)


def test_qlora_trains_a_4bit_base_and_gives_back_the_original_weights() -> None:
    model, x = _tiny()
    original = copy.deepcopy(model)
    s = _session(model, lora_rank=8, qlora=True, lr=1e-2)
    from bitsandbytes.nn import Linear4bit

    assert isinstance(s._model.blocks[0].attn.qkv.get_base_layer(), Linear4bit)
    s.run(3, progress=False)
    report = s.memory()
    pred = report.predicted
    assert report.params_bytes == pytest.approx(pred.params_bytes, rel=0.04)
    assert report.params_bytes < 0.3 * 4 * sum(p.numel() for p in original.parameters())
    assert report.grads_bytes == pred.grads_bytes
    trained_adapters = {
        n: p.detach().clone() for n, p in s._model.named_parameters() if ".lora_" in n
    }
    s.close()
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    assert model.blocks[0].attn.qkv.weight.dtype == torch.float32
    # the original fp32 weight plus B A * alpha / r, not the 4-bit copy
    a = trained_adapters["blocks.0.attn.qkv.lora_A.default.weight"]
    b = trained_adapters["blocks.0.attn.qkv.lora_B.default.weight"]
    expected = original.blocks[0].attn.qkv.weight + b @ a * (16.0 / 8)
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, expected, atol=1e-6, rtol=1e-5)
    untouched = original.blocks[0].attn.qkv.bias
    torch.testing.assert_close(model.blocks[0].attn.qkv.bias, untouched)


def test_lora_dropout_activations_within_the_documented_bound() -> None:
    s = _session(lora_rank=8, lora_dropout=0.1)
    s.run(1, progress=False)
    report = s.memory()
    s.close()
    plain = _session(lora_rank=8)
    plain.run(1, progress=False)
    without = plain.memory()
    plain.close()
    assert report.activation_bytes > without.activation_bytes  # the dropped input copies
    predicted = report.predicted_activation_bytes
    assert report.activation_bytes <= predicted <= 1.25 * report.activation_bytes


def test_bad_lora_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"lora_rank=-1: must be an integer >= 0"):
        TrainConfig(lora_rank=-1)
    with pytest.raises(ValueError, match=r"lora_targets='q k': must be \"all-linear\""):
        TrainConfig(lora_rank=4, lora_targets="q k")
    with pytest.raises(ValueError, match=r"qlora=True: .*needs lora_rank >= 1"):
        TrainConfig(qlora=True)
    # QLoRA's 4-bit base trains in the plain loop only (LoRA itself on every engine)
    with pytest.raises(ValueError, match=r"qlora=True: a Session trains QLoRA's 4-bit base"):
        _session(lora_rank=4, qlora=True, zero_stage=2, precision="bf16")
    with pytest.raises(ValueError, match=r"lora_targets='nothing_here': picks none"):
        _session(lora_rank=4, lora_targets="nothing_here")


def test_a_bad_lora_update_leaves_the_session_unchanged() -> None:
    model, x = _tiny()
    s = _session(model, lora_rank=4)
    s.run(1, progress=False)
    before = _outputs(s._model, x)
    with pytest.raises(ValueError, match="lora_targets='nope'"):
        s.update(lora_targets="nope")
    assert s.lora()["rank"] == 4  # type: ignore[index]
    torch.testing.assert_close(_outputs(s._model, x), before)
    s.run(1, progress=False)
    s.close()


def test_estimator_counts_llama_2_7b_adapters_as_peft_does() -> None:
    # peft's print_trainable_parameters for Llama-2-7B, r=16 on every linear layer of a
    # block: "trainable params: 39,976,960"
    e = estimate_memory(model="llama-2-7b", lora_rank=16, precision="bf16-true")
    full = estimate_memory(model="llama-2-7b", precision="bf16-true")
    assert e.grads_bytes == 2 * 39_976_960
    assert e.optimizer_bytes == 4 * 39_976_960  # two bf16 moments
    assert e.params_bytes == full.params_bytes + 2 * 39_976_960
    q = estimate_memory(model="llama-2-7b", lora_rank=16, qlora=True, precision="amp-bf16")
    linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    rest = full.n_params - linear
    # each of the 224 4-bit layers also holds its offset and code tables (1,092 bytes)
    constants = 32 * 7 * (4 + 16 * 4 + 256 * 4)
    assert q.params_bytes == (
        int(4 * rest + (0.5 + 1 / 64 + 4 / 16384) * linear) + constants + 4 * 39_976_960
    )
    # ZeRO-3 over 8 GPUs: the base and the adapters' weights, gradients and states all
    # split, each part ceil(x / 8)
    z3 = estimate_memory(model="llama-2-7b", lora_rank=16, zero_stage=3, gpus=8)
    assert z3.grads_bytes == 4 * -(-39_976_960 // 8)
    assert z3.optimizer_bytes == 8 * -(-39_976_960 // 8)
    assert z3.params_bytes == 4 * -(-full.n_params // 8) + 4 * -(-39_976_960 // 8)
    with pytest.raises(ValueError, match="lora_rank"):
        estimate_memory(model="llama-2-7b", lora_rank=16, tensor_parallel=2, gpus=2)
    with pytest.raises(ValueError, match="lora_targets"):
        estimate_memory(model="llama-2-7b", lora_rank=16, lora_targets="everything")


def test_the_exported_jobs_refuse_qlora_with_the_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from workbench.export import ExportError, export_job

    with pytest.raises(ExportError) as info:
        export_job(
            TrainConfig(lora_rank=8, qlora=True), format="lightning", gpus=1, out_dir=tmp_path
        )
    assert "qlora=True" in str(info.value) and "a Session trains it" in str(info.value)


JOB_MODEL = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "dropout": 0.0}
#: the LoRA settings every exported job and the Session they are held to share
JOB_LORA: dict[str, Any] = {"micro_batch": 4, "seed": 3, "lora_rank": 4, "lr": 1e-2}


@pytest.fixture(scope="module")
def plain_lora(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], Path]:
    """The Session's plain-loop LoRA run the jobs are held to, run once: its 3 losses and
    the folder its `save_adapters` wrote."""
    with Session(TrainConfig(**JOB_LORA), model="tiny-gpt", model_options=JOB_MODEL) as s:
        records = s.run(3, progress=False)
        folder = s.save_adapters(tmp_path_factory.mktemp("plain-lora") / "session")
    return [r.loss for r in records], folder


JobRun = tuple[Path, list[dict[str, Any]], str, Path]


@pytest.fixture(scope="module")
def lora_jobs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`run(fmt, script, settings, ranks, save)`: the exported LoRA job trained 3 steps
    (with `--save-dir` when `save`), each setup run once for the module: (the job's
    folder, its step lines, its stderr, the folder it saved to)."""
    from workbench.export import export_job

    runs: dict[tuple[Any, ...], JobRun] = {}

    def run(fmt: str, script: str, settings: dict[str, Any], ranks: int, save: bool) -> JobRun:
        # the whole setup is the key: a test reuses a run only of exactly its own setup
        key = (fmt, script, tuple(sorted(settings.items())), ranks, save)
        if key not in runs:
            base = tmp_path_factory.mktemp(f"lora-{fmt}-{ranks}")
            config = TrainConfig(**JOB_LORA, **settings)
            out = Path(export_job(config, format=fmt, gpus=ranks, out_dir=base / "job",
                                  model_options=JOB_MODEL).out_dir)  # fmt: skip
            saved = base / "saved"
            extra = ("--save-dir", str(saved)) if save else ()
            lines, stderr = run_script(script, out, steps=3, ranks=ranks, extra=extra)
            runs[key] = (out, lines, stderr, saved)
        return runs[key]

    return run


@pytest.mark.parametrize(
    ("fmt", "script", "settings", "save"),
    [
        ("fsdp", "train_fsdp.py", {"fsdp": "full_shard"}, True),
        ("deepspeed", "train_deepspeed.py", {"zero_stage": 2}, False),
        ("lightning", "train_lightning.py", {}, True),
    ],
)
def test_the_exported_jobs_train_lora(fmt, script, settings, save, lora_jobs, plain_lora) -> None:  # type: ignore[no-untyped-def]
    """The adapters go on the job's model (the base frozen) and train: the FSDP and
    DeepSpeed jobs' losses are the Session's plain-loop LoRA losses with the same seed; the
    Lightning job's (its loader shuffles its own way: other batches) are finite, fall, and
    stay within 2% of them. (The FSDP and Lightning runs are the ones that save the
    adapters below: saving comes after the last step.)"""
    out, lines, stderr, _ = lora_jobs(fmt, script, settings, 1, save)
    assert json.loads((out / "job.json").read_text())["config"]["lora_rank"] == 4
    assert [ln["step"] for ln in lines] == [1, 2, 3]
    adapters = 2 * 4 * (64 + 192 + 64 + 64 + 64 + 256 + 256 + 64)
    assert f"LoRA rank 4 on 8 layers: {adapters:,} adapter parameters train" in stderr
    losses = [ln["loss"] for ln in lines]
    assert torch.isfinite(torch.tensor(losses)).all() and losses[-1] < losses[0], losses
    same = 1e-6
    assert losses == pytest.approx(plain_lora[0], rel=same)


@pytest.mark.parametrize(
    ("fmt", "script", "settings", "ranks"),
    [
        ("fsdp", "train_fsdp.py", {"fsdp": "full_shard"}, 1),
        ("fsdp", "train_fsdp.py", {"fsdp": "full_shard"}, 2),
        ("lightning", "train_lightning.py", {}, 1),
    ],
)
def test_the_exported_jobs_save_the_adapters_alone(
    fmt, script, settings, ranks, lora_jobs, plain_lora
) -> None:  # type: ignore[no-untyped-def]
    """`--save-dir`: the adapters alone in peft's format, gathered from FSDP2's shards,
    under the names and config a Session's `save_adapters` writes; one rank's are the
    Session's plain-loop adapters after the same steps, and peft loads them onto the
    base."""
    from peft import PeftModel
    from safetensors.torch import load_file

    _, _, _, saved = lora_jobs(fmt, script, settings, ranks, True)
    weights = load_file(str(saved / "adapter_model.safetensors"))
    job_config = json.loads((saved / "adapter_config.json").read_text())
    folder = plain_lora[1]
    session = load_file(str(folder / "adapter_model.safetensors"))
    session_config = json.loads((folder / "adapter_config.json").read_text())
    assert sorted(weights) == sorted(session) and len(weights) == 2 * 8
    assert all(weights[k].shape == session[k].shape for k in weights)
    assert sorted(job_config["target_modules"]) == sorted(session_config["target_modules"])
    assert (job_config["r"], job_config["lora_alpha"]) == (4, session_config["lora_alpha"])
    assert not (saved / "model.safetensors").exists()  # the frozen base is not written
    if fmt == "fsdp" and ranks == 1:  # the same batches as the Session's: the same adapters
        for k in weights:
            torch.testing.assert_close(weights[k], session[k], atol=1e-6, rtol=1e-5)
    else:  # other batches (two ranks' shards, Lightning's sampler): trained, not initial
        b = [k for k in weights if ".lora_B." in k]
        assert all(weights[k].abs().max() > 0 for k in b)  # B starts at zero
    base, _, _, _ = build_model("tiny-gpt", **JOB_MODEL)
    loaded = PeftModel.from_pretrained(base, str(saved))
    for name, p in loaded.named_parameters():  # every adapter is the saved one
        if ".lora_" in name:
            key = name.replace(".default.", ".")
            torch.testing.assert_close(p.detach(), weights[key], atol=0, rtol=0)


def test_the_exported_jobs_save_the_whole_model_without_lora(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without LoRA `--save-dir` writes model.safetensors: FSDP2's shards on two ranks
    gathered into every weight of the model, which loads back into the built-in GPT; a
    file for a folder is refused before anything trains."""
    from safetensors.torch import load_file

    from workbench.export import export_job

    config = TrainConfig(micro_batch=4, seed=3, fsdp="full_shard")
    out = Path(export_job(config, format="fsdp", gpus=2, out_dir=tmp_path / "job",
                          model_options=JOB_MODEL).out_dir)  # fmt: skip
    run_script("train_fsdp.py", out, steps=2, ranks=2, extra=("--save-dir", str(tmp_path / "w")))
    weights = load_file(str(tmp_path / "w" / "model.safetensors"))
    model, _, _, _ = build_model("tiny-gpt", seed=3, **JOB_MODEL)  # the job's initial weights
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(weights, strict=True)  # whole shapes: a shard would not load
    qkv = [k for k in weights if k.endswith("qkv.weight")]  # trained: moved from the start
    assert qkv and all(not torch.equal(initial[k], weights[k]) for k in qkv)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run([sys.executable, "train_fsdp.py", "--save-dir", str(blocker)],
                          cwd=out, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert f"--save-dir {str(blocker)!r}: must be a folder" in done.stderr
    # Lightning's DeepSpeed strategy keeps its own checkpoint format: refused, saying so
    ds = Path(export_job(TrainConfig(micro_batch=4, zero_stage=2), format="lightning", gpus=1,
                         out_dir=tmp_path / "ds", model_options=JOB_MODEL).out_dir)  # fmt: skip
    done = subprocess.run([sys.executable, "train_lightning.py", "--save-dir", str(tmp_path / "d")],
                          cwd=ds, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert "Lightning's deepspeed strategy keeps its own sharded checkpoint" in done.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("settings", "world_size"),
    [({}, 1), ({"lora_targets": "qkv,fc", "precision": "amp-bf16"}, 1),
     ({"fsdp": "full_shard"}, 2), ({"zero_stage": 2}, 2)],
)  # fmt: skip
def test_the_dry_run_puts_lora_on_its_fake_copy(settings, world_size) -> None:  # type: ignore[no-untyped-def]
    """LoRA in the dry run (peft's layers on the fake copy, the base frozen): one rank's
    model states are a real Session's to the byte, on every engine they are the
    formula's, and the adapters' gradients and states are all that LoRA trains."""
    from workbench.train.dry_run import simulate_memory

    config = TrainConfig(micro_batch=MB, seed=0, lora_rank=8, **settings)
    run = simulate_memory("tiny-gpt", config, world_size=world_size, progress=False)
    assert run.formula is not None
    assert (run.params_bytes, run.grads_bytes) == (
        run.formula.params_bytes,
        run.formula.grads_bytes,
    )
    assert (
        0 <= run.optimizer_bytes - run.formula.optimizer_bytes <= run.optimizer_step_counter_bytes
    )
    full = simulate_memory(
        "tiny-gpt", config.replace(lora_rank=0), world_size=world_size, progress=False
    )
    assert run.grads_bytes < full.grads_bytes / 10 and run.params_bytes > full.params_bytes
    if world_size == 1:
        with Session(config) as s:
            s.run(2, progress=False)
            report = s.memory()
        assert (run.params_bytes, run.grads_bytes, run.optimizer_bytes) == (
            report.params_bytes, report.grads_bytes, report.optimizer_bytes,
        )  # fmt: skip


def test_a_lora_sessions_dry_run_of_your_module_is_its_measured_states() -> None:
    """`session.simulate()` on a LoRA Session of your own module: the fake copy holds the
    Session's adapters already (none put on twice), and the dry run's model states, the
    formula's and the Session's measured ones are one figure each."""
    model, _ = _tiny()
    s = _session(model, lora_rank=8)
    try:
        s.run(1, progress=False)
        run = s.simulate()
        report = s.memory()
    finally:
        s.close()
    assert (run.params_bytes, run.grads_bytes, run.optimizer_bytes) == (
        report.params_bytes, report.grads_bytes, report.optimizer_bytes,
    )  # fmt: skip
    assert (run.formula.params_bytes, run.formula.grads_bytes) == (
        run.params_bytes,
        run.grads_bytes,
    )


def test_the_dry_run_refuses_qlora_by_name_and_the_formula_still_answers() -> None:
    """QLoRA under FSDP is refused by name (the plain loop's is simulated:
    tests/integration/test_qlora_bf16.py)."""
    from workbench.train.dry_run import simulate_memory
    from workbench.train.dry_run.problems import DryRunError

    with pytest.raises(DryRunError) as info:
        simulate_memory(
            "tiny-gpt",
            TrainConfig(lora_rank=8, qlora=True, fsdp="full_shard"),
            world_size=2,
            progress=False,
        )
    assert [p.field for p in info.value.problems] == ["qlora"]
    assert "the formula counts it" in str(info.value)
    with pytest.raises(DryRunError) as info:
        simulate_memory(
            "tiny-gpt", TrainConfig(lora_rank=8, lora_targets="nothing"), progress=False
        )
    assert [p.field for p in info.value.problems] == ["lora_targets"]


def test_the_estimate_command_counts_lora_and_qlora(capsys) -> None:  # type: ignore[no-untyped-def]
    from workbench.cli import main

    code = main(["estimate", "--model", "llama-2-7b", "--lora-rank", "16", "--qlora", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["lora_rank"] == 16 and out["lora_params"] == 39_976_960
    assert out["qlora_params"] == 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert out["grads_bytes"] == 4 * 39_976_960
    with pytest.raises(SystemExit) as info:
        main(["estimate", "--model", "llama-2-7b", "--lora-rank", "-3"])
    assert info.value.code == 2
    assert "--lora-rank -3: must be an integer from 0 to 4,096" in capsys.readouterr().err


def test_a_lora_checkpoint_resumes_bit_exact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = TrainConfig(lora_rank=4, micro_batch=2, seed=0, checkpoint_dir=str(tmp_path))
    s = Session(config)
    s.run(3, progress=False)
    path = s.save_checkpoint()
    expected = [r.loss for r in s.run(2, progress=False)]
    s.close()
    resumed = Session(config, resume=path)
    try:
        assert resumed.lora()["adapter_params"] == 4 * 4 * (
            128 + 384 + 128 + 128 + 128 + 512 + 512 + 128
        )  # type: ignore[index]
        assert [r.loss for r in resumed.run(2, progress=False)] == expected
    finally:
        resumed.close()


def _trained(settings: dict[str, object], steps: int = 3) -> tuple[list[float], object, nn.Module]:
    model, data, loss, _ = build_model("tiny-gpt", **JOB_MODEL)  # type: ignore[arg-type]
    config = TrainConfig(micro_batch=4, seed=3, lora_rank=4, lr=1e-2, **settings)  # type: ignore[arg-type]
    s = Session(config, model=model, data=data, loss_fn=loss)
    try:
        losses = [r.loss for r in s.run(steps, progress=False)]
        report = s.memory()
    finally:
        s.close()
    return losses, report, model


@pytest.mark.parametrize(
    "settings",
    [
        {"zero_stage": 2},
        {"zero_stage": 3},
        {"fsdp": "full_shard"},
        {"zero_stage": 1, "precision": "bf16"},
    ],
    ids=["zero2", "zero3", "fsdp", "zero1-bf16"],
)
def test_lora_trains_on_the_deepspeed_and_fsdp_engines(settings) -> None:  # type: ignore[no-untyped-def]
    """The engines train the adapters with the plain loop's losses (bf16 to its rounding),
    their model states counted (the frozen base included) equal the prediction to the byte,
    and your module gets its own layers back with the update merged."""
    plain_losses, _, plain_model = _trained({})
    losses, report, model = _trained(settings)
    rel = 1e-2 if settings.get("precision") == "bf16" else 1e-6
    assert losses == pytest.approx(plain_losses, rel=rel)
    pred = report.predicted
    assert report.params_bytes == pred.params_bytes
    assert report.grads_bytes == pred.grads_bytes
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == pred.optimizer_bytes
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    x = torch.randint(0, 60, (4, 16), generator=torch.Generator().manual_seed(0))
    got, want = _outputs(model, x), _outputs(plain_model, x)
    if settings.get("precision") == "bf16":
        # bf16 weights round each logit by up to ~0.05 here (input dependent), so the whole
        # output is held to 5% of its norm (measured: 1.2-2.3% over three inputs)
        assert (got - want).norm() <= 5e-2 * want.norm()
    else:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_lora_switches_live_on_a_deepspeed_engine() -> None:
    model, data, loss, _ = build_model("tiny-gpt", **JOB_MODEL)  # type: ignore[arg-type]
    s = Session(
        TrainConfig(micro_batch=4, seed=3, lr=1e-2, zero_stage=2),
        model=model,
        data=data,
        loss_fn=loss,
    )
    try:
        s.run(1, progress=False)
        s.update(lora_rank=4)
        s.run(1, progress=False)
        assert s.lora()["adapter_params"] == 2 * 4 * (64 + 192 + 64 + 64 + 64 + 256 + 256 + 64)  # type: ignore[index]
        s.update(lora_rank=0)
        s.run(1, progress=False)
        assert s.lora() is None
    finally:
        s.close()
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    ("field", "value"),
    [("lora_rank", 10**9), ("lora_rank", "8"), ("lora_alpha", float("inf")),
     ("lora_dropout", 1.0), ("lora_targets", "x" * 2000)],
)  # fmt: skip
def test_a_jobs_lora_settings_are_checked_before_anything_is_built(field, value, capsys) -> None:  # type: ignore[no-untyped-def]
    """job.json is a file a user may be handed: its LoRA settings are range-checked, the
    field and the allowed values named, before peft allocates anything."""
    from workbench.export.job_common import add_lora

    model, _ = _tiny()
    config = {"lora_rank": 4, field: value}
    with pytest.raises(SystemExit):
        add_lora(model, config)
    assert f"config.{field}=" in capsys.readouterr().err
    assert not any(".lora_" in n for n, _ in model.named_parameters())
