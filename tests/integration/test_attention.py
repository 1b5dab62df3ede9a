"""`TrainConfig.attention`: the kernel a Session trains with, switched on the module (the
built-in GPT's attention modules, a transformers model's attn_implementation), live at a
step boundary with the weights and optimizer state kept; measured next to predicted."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.data import Dataset

from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.train.techniques.attention import current_attention

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "dropout": 0.0}


def _kernels(module: torch.nn.Module) -> set[str]:
    return {m.kernel for m in module.modules() if type(m).__name__ == "CausalSelfAttention"}


def test_sdpa_trains_the_same_losses_and_saves_what_the_estimator_predicts() -> None:
    """tiny-gpt without dropout: eager and sdpa train the same losses (measured: equal to
    6 decimals; 1e-5 allowed for the kernels' different summation order); sdpa keeps no
    s x s scores or probabilities, and the activation bytes it saves are the estimator's
    ("megatron" minus "sdpa" terms), measured to the byte on this CPU."""
    measured, predicted, losses = {}, {}, {}
    for kernel in ("eager", "sdpa"):
        config = TrainConfig(micro_batch=8, attention=kernel, seed=0)
        with Session(config, model_options=TINY) as s:
            losses[kernel] = [r.loss for r in s.run(optimizer_steps=3)]
            assert _kernels(s.model) == {kernel}
            report = s.memory()
        measured[kernel] = report.activation_bytes
        predicted[kernel] = report.predicted_activation_bytes
        assert report.predicted.attention == ("megatron" if kernel == "eager" else "sdpa")
    assert losses["sdpa"] == pytest.approx(losses["eager"], rel=1e-5)
    saved = measured["eager"] - measured["sdpa"]
    assert saved > 0.15 * measured["eager"]
    assert saved == predicted["eager"] - predicted["sdpa"]


def test_switching_live_keeps_the_weights_and_the_optimizer_state() -> None:
    config = TrainConfig(micro_batch=4, seed=0)
    with Session(config, model_options=TINY) as s:
        s.run(optimizer_steps=2)
        state = {k: v.clone() for k, v in s.backend.export_state()["model"].items()}
        s.update(attention="sdpa")
        records = s.run(optimizer_steps=2)
        assert _kernels(s.model) == {"sdpa"} and s.config.attention == "sdpa"
        assert [r.step for r in records] == [3, 4]  # the run goes on, nothing rebuilt
        assert not any("reset" in e.message for e in s.events_since(0))
        after = s.backend.export_state()["model"]
        assert any(not torch.equal(state[k], after[k]) for k in state)  # it trained on
        s.update(attention="model")
        s.run(optimizer_steps=1)
        assert _kernels(s.model) == {"eager"}  # the model's own again


def test_a_deepspeed_engine_s_copy_switches_too() -> None:
    with Session(TrainConfig(micro_batch=4, zero_stage=1), model_options=TINY) as s:
        s.run(optimizer_steps=1)
        s.update(attention="sdpa")
        s.run(optimizer_steps=1)
        assert _kernels(s.backend.engine.module) == {"sdpa"} == _kernels(s.model)


def test_what_cannot_take_a_kernel_is_refused_by_name_and_the_session_kept() -> None:
    with pytest.raises(ConfigError) as info:
        Session(TrainConfig(attention="sdpa"), model="mlp")
    assert "attention" in str(info.value) and "no attention kernel" in str(info.value)
    with pytest.raises(ConfigError, match="attention='flash'"):
        TrainConfig(attention="flash")
    with Session(TrainConfig(micro_batch=4), model_options=TINY) as s:
        s.run(optimizer_steps=1)
        with pytest.raises(ConfigError, match="attention"):
            s.update(attention="flash")
        s.run(optimizer_steps=1)
        assert s.step == 2 and _kernels(s.model) == {"eager"}


class _Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_a_transformers_model_takes_it_as_its_attn_implementation() -> None:
    config = transformers.LlamaConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config)
    with Session(TrainConfig(micro_batch=4, attention="eager"), model=model, data=_Tokens()) as s:
        s.run(optimizer_steps=1)
        assert current_attention(model) == "eager" == model.config._attn_implementation
        assert s.memory().predicted.attention == "eager"
        s.update(attention="model")
        s.run(optimizer_steps=1)
        assert current_attention(model) == "sdpa"  # what it had


def test_memory_says_why_sdpa_with_dropout_measures_more_on_a_cpu() -> None:
    from workbench import Session, TrainConfig

    notes = {}
    for dropout in (0.1, 0.0):
        s = Session(
            TrainConfig(micro_batch=2, attention="sdpa"), model_options={"dropout": dropout}
        )
        try:
            s.run(1, progress=False)
            notes[dropout] = s.memory().notes
        finally:
            s.close()
    assert any("sdpa with dropout on a CPU" in n for n in notes[0.1])
    assert not any("sdpa with dropout" in n for n in notes[0.0])
