"""LoRA and QLoRA on GPT-2, whose linear layers are transformers' `Conv1D` (weight stored
transposed, as (in, out)): the Session wraps them as peft does (`fan_in_fan_out=True`),
trains them on the plain loop, DeepSpeed and FSDP, merges the update into the Conv1D
weights in their own layout, saves adapters `peft.PeftModel.from_pretrained` loads onto a
GPT-2, and counts what the estimator counts; an exported job does the same.

The model is a GPT-2 built from a config (nothing downloaded): 2 layers, hidden 32, 2
heads, vocabulary 128, no dropout (so outputs are compared in training mode, where
bitsandbytes' 4-bit layer takes its training path on a CPU).
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers  # the test extra
from torch import nn

from tests.integration.job_runs import run_script
from workbench import Session, TrainConfig
from workbench.estimate import estimate_memory
from workbench.train.techniques.lora import adapter_parameter_count, resolve_targets

#: The job's and the tests' GPT-2 and its data: a factory module an exported job imports.
FACTORY = """
import torch
import transformers
from torch.utils.data import Dataset

VOCAB, SEQ = 128, 16


class Tokens(Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def config():
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        loss_type="ForCausalLM",
    )


def make():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config()), Tokens(), None
"""
FACTORY_NAME = "gpt2_lora_factory"

#: a merged model against its unmerged adapters: fp32 rounding of the merge
MERGED = {"atol": 5e-5, "rtol": 1e-4}
RANK, ALPHA = 4, 16.0
#: every block's c_attn (32 -> 96), attn.c_proj (32 -> 32), c_fc (32 -> 128), mlp.c_proj
#: (128 -> 32): rank x (in + out) each, 2 blocks
ADAPTERS = 2 * RANK * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The factory module, imported from a folder of its own (a job copies the file)."""
    folder = tmp_path_factory.mktemp("gpt2-factory")
    (folder / f"{FACTORY_NAME}.py").write_text(FACTORY)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(FACTORY_NAME)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(FACTORY_NAME, None)


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():  # training mode: no dropout in this config
        return model(input_ids=x).logits.clone()  # type: ignore[no-any-return]


def _config(**settings: Any) -> TrainConfig:
    return TrainConfig(micro_batch=4, seed=0, lr=1e-2, lora_rank=RANK, **settings)


def _rounding(four: nn.Module, conv: nn.Module) -> float:
    """How far a 4-bit layer's output is from the Conv1D's it was made from, relative: its
    NF4 rounding (measured 9-26% on these layers; the same weight left untransposed in a
    square layer gives 131-134%)."""
    h = torch.randn(3, conv.nx, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = conv(h)
        return float((four(h) - want).norm() / want.norm())


#: the bound on `_rounding`
NF4_ROUNDING = 0.4


def _merged_weight(original: torch.Tensor, adapters: dict[str, torch.Tensor], name: str) -> Any:
    """A Conv1D's weight (in, out) with the update merged in its layout: W + (B A)^T s."""
    a = adapters[f"{name}.lora_A.default.weight"]
    b = adapters[f"{name}.lora_B.default.weight"]
    return original + (b @ a).t() * (ALPHA / RANK)


def test_targets_pick_gpt2s_conv1d_projections_not_the_head(gpt2: Any) -> None:
    model, _, _ = gpt2.make()
    every = resolve_targets(model, "all-linear")
    assert every == [
        f"transformer.h.{i}.{m}"
        for i in range(2)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]  # not lm_head
    assert resolve_targets(model, "c_attn") == [f"transformer.h.{i}.attn.c_attn" for i in (0, 1)]
    assert adapter_parameter_count(model, _config()) == ADAPTERS
    assert adapter_parameter_count(model, _config(lora_targets="c_attn")) == 2 * RANK * (32 + 96)


@pytest.fixture(scope="module")
def plain(gpt2: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A plain-loop LoRA Session on GPT-2 trained 3 steps, then closed."""
    model, data, _ = gpt2.make()
    original = copy.deepcopy(model)
    x = data.ids[:2]
    s = Session(_config(), model=model, data=data)
    try:
        summary = s.lora()
        base = {n: p.detach().clone() for n, p in s._model.named_parameters() if ".lora_" not in n}
        losses = [r.loss for r in s.run(3, progress=False)]
        frozen = all(
            torch.equal(p.detach(), base[n])
            for n, p in s._model.named_parameters()
            if ".lora_" not in n
        )
        adapted = _logits(s._model, x)
        adapters = {n: p.detach().clone() for n, p in s._model.named_parameters() if ".lora_" in n}
        report = s.memory()
        folder = s.save_adapters(tmp_path_factory.mktemp("gpt2-adapters") / "saved")
    finally:
        s.close()
    return {
        "model": model, "original": original, "x": x, "summary": summary, "losses": losses,
        "frozen": frozen, "adapted": adapted, "adapters": adapters, "report": report,
        "folder": folder,
    }  # fmt: skip


def test_only_the_adapters_train_and_close_merges_into_the_conv1d_layers(
    plain: dict[str, Any],
) -> None:
    Conv1D = transformers.pytorch_utils.Conv1D
    assert plain["summary"]["adapter_params"] == ADAPTERS
    assert plain["summary"]["targets"] == 8
    assert plain["frozen"] and all(torch.isfinite(torch.tensor(plain["losses"])))
    model, original = plain["model"], plain["original"]
    # your module: GPT-2 with its own Conv1D layers, every parameter trainable as it was
    assert type(model.transformer.h[0].attn.c_attn) is Conv1D
    assert type(model.transformer.h[1].mlp.c_proj) is Conv1D
    assert all(p.requires_grad for p in model.parameters())
    assert sorted(n for n, _ in model.named_parameters()) == sorted(
        n for n, _ in original.named_parameters()
    )
    # W += (B A)^T alpha / rank, in the Conv1D's (in, out) layout
    for name in ("transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_fc"):
        want = _merged_weight(original.get_submodule(name).weight, plain["adapters"], name)
        got = model.get_submodule(name).weight
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        assert not torch.allclose(got, original.get_submodule(name).weight, atol=1e-4)
    # the merged module computes what the adapted one did
    torch.testing.assert_close(_logits(model, plain["x"]), plain["adapted"], **MERGED)
    assert not torch.allclose(_logits(original, plain["x"]), plain["adapted"], atol=1e-3)


def test_the_saved_adapters_load_onto_a_gpt2_with_peft(plain: dict[str, Any], gpt2: Any) -> None:
    from peft import PeftModel

    config = json.loads((plain["folder"] / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    base = transformers.GPT2LMHeadModel(gpt2.config())
    base.load_state_dict(plain["original"].state_dict())
    loaded = PeftModel.from_pretrained(base, str(plain["folder"]))
    torch.testing.assert_close(_logits(loaded, plain["x"]), plain["adapted"], atol=1e-6, rtol=0)


def test_the_model_states_are_the_prediction_to_the_byte(plain: dict[str, Any]) -> None:
    report = plain["report"]
    pred = report.predicted
    assert (report.params_bytes, report.grads_bytes) == (pred.params_bytes, pred.grads_bytes)
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == pred.optimizer_bytes
    assert report.grads_bytes == 4 * ADAPTERS


def test_switching_lora_off_merges_and_on_again_wraps_afresh(gpt2: Any) -> None:
    model, data, _ = gpt2.make()
    x = data.ids[:2]
    with Session(_config(), model=model, data=data) as s:
        s.run(2, progress=False)
        adapted = _logits(s._model, x)
        s.update(lora_rank=0)
        s._apply_pending(raise_errors=True)
        assert type(model.transformer.h[0].attn.c_attn) is transformers.pytorch_utils.Conv1D
        torch.testing.assert_close(_logits(model, x), adapted, **MERGED)
        s.update(lora_rank=2, lora_targets="c_attn")  # fresh adapters: the outputs hold
        s._apply_pending(raise_errors=True)
        assert s.lora()["adapter_params"] == 2 * 2 * (32 + 96)  # type: ignore[index]
        torch.testing.assert_close(_logits(s._model, x), adapted, **MERGED)
        s.run(1, progress=False)
    assert type(model.transformer.h[0].attn.c_attn) is transformers.pytorch_utils.Conv1D


@pytest.mark.parametrize(
    "settings", [{"zero_stage": 2}, {"zero_stage": 3}, {"fsdp": "full_shard"}],
    ids=["zero2", "zero3", "fsdp"],
)  # fmt: skip
def test_gpt2_lora_trains_on_the_deepspeed_and_fsdp_engines(
    settings: dict[str, Any], plain: dict[str, Any], gpt2: Any
) -> None:
    """The engines that train LoRA (every data-parallel row) train GPT-2's: the plain
    loop's losses, its merged Conv1D weights, the predicted model states to the byte."""
    model, data, _ = gpt2.make()
    with Session(_config(**settings), model=model, data=data) as s:
        losses = [r.loss for r in s.run(3, progress=False)]
        report = s.memory()
    assert losses == pytest.approx(plain["losses"], rel=1e-6)
    pred = report.predicted
    assert (report.params_bytes, report.grads_bytes) == (pred.params_bytes, pred.grads_bytes)
    assert type(model.transformer.h[0].attn.c_attn) is transformers.pytorch_utils.Conv1D
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, plain["model"].get_parameter(name), atol=1e-6, rtol=0)


def test_qlora_quantises_the_transposed_conv1d_weights_and_merges_into_the_originals(
    gpt2: Any, tmp_path: Path
) -> None:
    from bitsandbytes.nn import Linear4bit
    from peft import PeftModel

    model, data, _ = gpt2.make()
    original = copy.deepcopy(model)
    x = data.ids[:2]
    with Session(_config(qlora=True), model=model, data=data) as s:
        for name in ("transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_proj"):
            four = s._model.get_submodule(name).get_base_layer()
            conv = original.get_submodule(name)
            assert isinstance(four, Linear4bit)
            assert (four.in_features, four.out_features) == (conv.nx, conv.nf)
            assert _rounding(four, conv) < NF4_ROUNDING  # it computes the Conv1D's x W
        assert s.lora()["four_bit_layers"] == 8  # type: ignore[index]
        losses = [r.loss for r in s.run(3, progress=False)]
        adapters = {n: p.detach().clone() for n, p in s._model.named_parameters() if ".lora_" in n}
        folder = s.save_adapters(tmp_path / "qlora")
    assert all(torch.isfinite(torch.tensor(losses)))
    assert type(model.transformer.h[0].attn.c_attn) is transformers.pytorch_utils.Conv1D
    for name in ("transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_proj"):
        want = _merged_weight(original.get_submodule(name).weight, adapters, name)
        torch.testing.assert_close(model.get_submodule(name).weight, want, atol=1e-6, rtol=1e-5)
    # the adapters on the full-precision base: the merged module's outputs
    assert json.loads((folder / "adapter_config.json").read_text())["fan_in_fan_out"] is True
    loaded = PeftModel.from_pretrained(original, str(folder))
    torch.testing.assert_close(_logits(loaded, x), _logits(model, x), **MERGED)


def test_qloras_torchao_base_transposes_the_conv1d_weights(gpt2: Any) -> None:
    """Under FSDP the 4-bit base is torchao's NF4 (`NF4Linear`, quantised before the
    engine shards it): made from a Conv1D's weight transposed, it computes the Conv1D's
    x W, and merging gives the original weights back (B starts at zero). torchao splits
    a weight into blocks of 64 x 256, so this GPT-2 is 128 wide."""
    from workbench.train.techniques.lora import LoraAdapters, NF4Linear

    config = gpt2.config()
    config.n_embd, config.n_layer = 128, 1
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    original = copy.deepcopy(model)
    lora = LoraAdapters(model, _config(qlora=True, fsdp="full_shard"), torch.device("cpu"))
    for name in (
        "transformer.h.0.attn.c_attn",
        "transformer.h.0.attn.c_proj",
        "transformer.h.0.mlp.c_proj",
    ):
        four = model.get_submodule(name).get_base_layer()
        conv = original.get_submodule(name)
        assert isinstance(four, NF4Linear)
        assert (four.in_features, four.out_features) == (conv.nx, conv.nf)
        assert _rounding(four, conv) < NF4_ROUNDING
    lora.merge()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, original.get_parameter(name), atol=0, rtol=0)


@pytest.mark.parametrize("qlora", [False, True])
def test_the_dry_run_of_gpt2_lora_is_the_sessions_states(gpt2: Any, qlora: bool) -> None:
    from workbench.train.dry_run import simulate_memory

    config = _config(qlora=qlora)
    model, data, _ = gpt2.make()
    run = simulate_memory(model, config, seq_len=16, progress=False)
    with Session(config, model=model, data=data) as s:
        s.run(2, progress=False)
        report = s.memory()
    assert (run.params_bytes, run.grads_bytes, run.optimizer_bytes) == (
        report.params_bytes, report.grads_bytes, report.optimizer_bytes,
    )  # fmt: skip
    assert (run.formula.params_bytes, run.formula.grads_bytes) == (
        run.params_bytes,
        run.grads_bytes,
    )


def _meta_gpt2(**config: Any) -> nn.Module:
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(
            transformers.GPT2Config(bos_token_id=0, eos_token_id=0, **config)
        )


def test_the_estimator_counts_gpt2s_adapters_as_the_session_attaches_them() -> None:
    """GPT-2 124M at rank 8: the estimator's "all-linear" is the Session's (Q, K and V one
    Conv1D, c_attn: 12 x 8 x ((768 + 2304) + (768 + 768) + 2 x (768 + 3072)) = 1,179,648),
    its "attention" the Session's c_attn and attn.c_proj, QLoRA's 4-bit base the module's to
    the byte, and c_attn alone (the classic tutorial's 12 x 8 x (768 + 2304) = 294,912)
    comes into the dry run's formula from the module."""
    from workbench.train.dry_run import simulate_memory
    from workbench.train.techniques.lora import four_bit_weight_bytes, four_bit_weight_count

    module = _meta_gpt2()
    every = adapter_parameter_count(module, TrainConfig(lora_rank=8))
    assert every == 1_179_648
    assert estimate_memory(model="gpt2", lora_rank=8).lora_params == every
    assert estimate_memory(model=module, lora_rank=8).lora_params == every
    attention = TrainConfig(lora_rank=8, lora_targets="c_attn,attn.c_proj")
    assert (
        estimate_memory(model="gpt2", lora_rank=8, lora_targets="attention").lora_params
        == adapter_parameter_count(module, attention)
        == 12 * 8 * ((768 + 2304) + (768 + 768))
    )
    # QLoRA: the shape's 4-bit base is the module's, to the byte (one c_attn layer's
    # constants, not three)
    qlora = TrainConfig(lora_rank=8, qlora=True)
    shape = estimate_memory(model="gpt2", lora_rank=8, qlora=True)
    exact = estimate_memory(
        model="gpt2", lora_rank=8, qlora=True, lora_params=every,
        qlora_params=four_bit_weight_count(module), qlora_bytes=four_bit_weight_bytes(module, qlora),
    )  # fmt: skip
    assert (shape.qlora_params, shape.params_bytes) == (exact.qlora_params, exact.params_bytes)
    c_attn = TrainConfig(lora_rank=8, lora_targets="c_attn", micro_batch=1)
    assert adapter_parameter_count(module, c_attn) == 294_912
    run = simulate_memory(_meta_gpt2(n_layer=2), c_attn, seq_len=32, progress=False)
    assert run.grads_bytes == run.formula.grads_bytes == 4 * 2 * 8 * (768 + 2304)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32},
        {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "intermediate_size": 256, "max_position_embeddings": 32},
        {"model_type": "falcon", "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "num_kv_heads": 2, "new_decoder_architecture": True,
         "max_position_embeddings": 32},
        {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32},
        {"model_type": "bloom", "n_layer": 2, "hidden_size": 64, "n_head": 4},
    ],
    ids=lambda c: c["model_type"],
)  # fmt: skip
def test_a_fused_qkv_configs_adapters_are_the_modules(config: dict[str, Any]) -> None:
    """Families whose Q, K and V are one linear layer: the config's estimate counts the
    adapters of the module it builds, for every linear layer and for the attention's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = {**config, "vocab_size": 128, "bos_token_id": 0, "eos_token_id": 0}
    built = AutoConfig.for_model(**config)
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(built)
    every = estimate_memory(hf_config=config, lora_rank=8, seq_len=32).lora_params
    assert every == adapter_parameter_count(module, TrainConfig(lora_rank=8))
    linears = resolve_targets(module, "all-linear")
    attention = TrainConfig(
        lora_rank=8, lora_targets=",".join(n for n in linears if ".mlp." not in n)
    )
    by_kind = estimate_memory(hf_config=config, lora_rank=8, lora_targets="attention", seq_len=32)
    assert by_kind.lora_params == adapter_parameter_count(module, attention)


def test_an_exported_job_trains_and_saves_gpt2s_adapters(
    gpt2: Any, plain: dict[str, Any], tmp_path: Path
) -> None:
    """The FSDP job on one rank puts the adapters on the factory's GPT-2 as the Session
    does (8 Conv1D layers), trains them on the Session's batches with its losses, and
    saves adapters peft loads onto a GPT-2 with the Session's outputs."""
    from peft import PeftModel

    from workbench.export import export_job

    job = tmp_path / "job"
    job.mkdir()
    (job / f"{FACTORY_NAME}.py").write_text(FACTORY)  # the job imports it from its folder
    spec = f"{FACTORY_NAME}:make"
    out = Path(export_job(_config(fsdp="full_shard"), format="fsdp", gpus=1, out_dir=job,
                          model=spec).out_dir)  # fmt: skip
    saved = tmp_path / "saved"
    lines, stderr = run_script(
        "train_fsdp.py", out, steps=3, extra=("--model", spec, "--save-dir", str(saved))
    )
    assert f"LoRA rank {RANK} on 8 layers: {ADAPTERS:,} adapter parameters train" in stderr
    assert [ln["loss"] for ln in lines] == pytest.approx(plain["losses"], rel=1e-6)
    config = json.loads((saved / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True
    assert sorted(config["target_modules"]) == resolve_targets(gpt2.make()[0], "all-linear")
    loaded = PeftModel.from_pretrained(copy.deepcopy(plain["original"]), str(saved))
    torch.testing.assert_close(_logits(loaded, plain["x"]), plain["adapted"], atol=1e-5, rtol=0)
