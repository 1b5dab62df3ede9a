"""`activation_checkpointing="selective"`: the attention core (scores, softmax, dropout, the
product with V) recomputed in backward, on the built-in GPT and on a transformers model,
measured by `Session.memory()` next to the estimator's "selective" terms, training the
same losses as no recomputation, switched live, and refused clearly where a model has no
attention core to recompute."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.data import Dataset

from workbench import Session, TrainConfig
from workbench.config import ConfigError
from workbench.train.dry_run import simulate_memory

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32}


def _memory(kernel: str, mode: str) -> object:
    config = TrainConfig(micro_batch=8, attention=kernel, activation_checkpointing=mode, seed=0)
    with Session(config, model_options=TINY) as s:
        return s.memory()


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_the_built_in_gpt_keeps_the_formulas_selective_bytes(kernel: str) -> None:
    """Measured on this CPU: the estimator's selective activations within 1% (the extra
    are the layer norms' statistics and the token ids), and the bytes it frees against
    no recomputation within 2% of the predicted (eager: the 5as^2b bytes a layer; sdpa
    with dropout runs PyTorch's math kernel on a CPU, which keeps its weights, their
    dropout mask and the dropped weights in fp32, and the Session's prediction on a CPU
    counts that kernel: 12as^2b bytes a layer)."""
    none, selective = _memory(kernel, "none"), _memory(kernel, "selective")
    predicted = selective.predicted_activation_bytes
    assert selective.activation_checkpointing == "selective"
    assert selective.activation_bytes == pytest.approx(predicted, rel=0.01)
    freed = none.activation_bytes - selective.activation_bytes
    predicted_freed = none.predicted_activation_bytes - predicted
    if kernel == "eager":
        s, b, a, layers = 32, 8, 4, 2
        # fp32: the probabilities and their dropout output, 4 bytes each, the 1-byte mask
        assert predicted_freed == layers * 9 * a * s * s * b
        assert freed == pytest.approx(predicted_freed, rel=0.02)
    else:
        assert selective.predicted.attention == "math"  # the kernel torch runs here
        s, b, a, layers = 32, 8, 4, 2
        assert predicted_freed == layers * 12 * a * s * s * b  # three fp32 s x s tensors
        assert freed == pytest.approx(predicted_freed, rel=0.02)


def test_selective_trains_the_same_losses_and_switches_live() -> None:
    """The recomputed core replays its dropout (the RNG is restored), so none, selective
    and full train the same losses; a switch at a step boundary keeps the weights."""
    losses = {}
    for mode in ("none", "selective", "full"):
        with Session(TrainConfig(micro_batch=4, seed=0, activation_checkpointing=mode),
                     model_options=TINY) as s:  # fmt: skip
            losses[mode] = [r.loss for r in s.run(optimizer_steps=3)]
    assert losses["selective"] == pytest.approx(losses["none"], rel=1e-5)
    assert losses["full"] == pytest.approx(losses["none"], rel=1e-5)
    with Session(TrainConfig(micro_batch=4, seed=0), model_options=TINY) as s:
        live = [r.loss for r in s.run(optimizer_steps=1)]
        s.update(activation_checkpointing="selective")
        cores = [m for m in s.model.modules() if hasattr(m, "recompute_core")]
        assert cores and all(m.recompute_core for m in cores)
        live += [r.loss for r in s.run(optimizer_steps=1)]
        assert s.memory().activation_checkpointing == "selective"
        s.update(activation_checkpointing=False)
        assert not any(m.recompute_core for m in cores)
        live += [r.loss for r in s.run(optimizer_steps=1)]
    assert live == pytest.approx(losses["none"], rel=1e-5)


class _Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, seq: int = 16) -> None:
        self.ids = torch.randint(0, 64, (32, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _llama(kernel: str) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=64,
        attn_implementation=kernel,
    )
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_a_transformers_model_recomputes_its_attention_function(kernel: str) -> None:
    """The Llama's attention function runs under checkpoint: the same losses as without,
    its kernel kept, and the bytes it frees against no recomputation as the estimator's
    selective terms predict for that kernel (eager: e·as^2b probabilities and
    transformers' fp32 softmax output kept besides them; sdpa: its log-sum-exp), less the
    causal mask the eager kernel's checkpoints keep."""
    from workbench.train.techniques.attention import SELECTIVE, current_attention

    reports, losses = {}, {}
    for mode in ("none", "selective"):
        model = _llama(kernel)
        config = TrainConfig(micro_batch=4, activation_checkpointing=mode, seed=0)
        with Session(config, model=model, data=_Tokens()) as s:
            losses[mode] = [r.loss for r in s.run(optimizer_steps=2)]
            reports[mode] = s.memory()
            assert current_attention(model) == kernel
            assert model.config._attn_implementation.startswith(SELECTIVE) is (mode == "selective")
            if mode == "selective":  # another kernel, still recomputed
                other = "sdpa" if kernel == "eager" else "eager"
                s.update(attention=other)
                assert model.config._attn_implementation == SELECTIVE + other
                assert current_attention(model) == other
                s.run(optimizer_steps=1)
                s.update(attention="model")
                assert model.config._attn_implementation == SELECTIVE + kernel
        assert model.config._attn_implementation == kernel  # its own function on close
        assert not any(hasattr(m, "core_inputs_observer") for m in model.modules())
    assert losses["selective"] == pytest.approx(losses["none"], rel=1e-5)
    none, selective = reports["none"], reports["selective"]
    freed = none.activation_bytes - selective.activation_bytes
    predicted = none.predicted_activation_bytes - selective.predicted_activation_bytes
    s, b, a, layers = 16, 4, 4, 2
    if kernel == "eager":  # fp32: probabilities and their dropout output are one tensor
        assert predicted == layers * 4 * a * s * s * b
        # what the formula leaves out: the checkpoints keep their input, the model's one
        # fp32 additive causal mask (b x 1 x s x s, shared by the layers), until backward
        assert freed == predicted - 4 * b * s * s
    else:  # sdpa takes no mask (is_causal): the log-sum-exp exactly
        assert predicted == layers * 4 * a * s * b
        assert freed == predicted


def test_a_model_without_an_attention_core_is_told_to_use_full() -> None:
    with pytest.raises(ConfigError) as info:
        Session(TrainConfig(activation_checkpointing="selective"), model="mlp")
    text = str(info.value)
    assert "activation_checkpointing='selective'" in text and "use 'full'" in text
    with Session(TrainConfig(), model="mlp") as s:
        s.run(optimizer_steps=1)
        with pytest.raises(ConfigError, match="activation_checkpointing='selective'"):
            s.update(activation_checkpointing="selective")
        assert str(s.config.activation_checkpointing) == "none"
        s.run(optimizer_steps=1)  # the session survives unchanged
        assert s.step == 2
    with pytest.raises(ConfigError, match=r"must be one of none, selective, full \(or True"):
        TrainConfig(activation_checkpointing="attention")


def test_the_dry_run_of_selective_keeps_less_than_none_and_more_than_full() -> None:
    """Fake tensors, the same rule: the activations at the end of the forward order
    none > selective > full, and selective's are the estimator's within 5%."""
    ends = {}
    for mode in ("none", "selective", "full"):
        config = TrainConfig(micro_batch=8, attention="eager", activation_checkpointing=mode)
        run = simulate_memory("tiny-gpt", config, model_options=TINY, progress=False)
        ends[mode] = run.points["forward end"]["activations"]
        if mode == "selective":
            (row,) = [
                r
                for r in run.compare().rows
                if (r.point, r.category) == ("forward end", "activations and transients")
            ]
            assert row.dry_run_bytes == pytest.approx(row.formula_bytes, rel=0.05)
    assert ends["none"] > ends["selective"] > ends["full"]
