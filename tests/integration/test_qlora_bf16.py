"""QLoRA as recipes run it: pure bf16 ("bf16-true") over bitsandbytes' 4-bit NF4 base, on
this CPU (bitsandbytes 0.50 quantises, dequantises and multiplies 4-bit weights on a CPU).

What is held here, on the built-in GPT (2 layers, hidden 64):
* the NF4 base counted to the byte: `nf4_weight_bytes` equals the storages bitsandbytes
  allocates for a quantised weight (packed codes, absmax, second level, offset, code
  tables);
* a bf16-true QLoRA Session trains (finite, falling losses, on the fp32 QLoRA curve within
  bf16's rounding) with bf16 norms, embedding and head, and its measured parameters,
  gradients and optimizer states (Adam's step counters aside) equal the prediction to the
  byte, with the adapters in bf16 ("auto", torchtune's) or in fp32 (`lora_dtype="fp32"`,
  peft's `get_peft_model` default);
* your module gets its own fp32 layers back at close.
"""

from __future__ import annotations

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.estimate import estimate_memory
from workbench.estimate.lora import nf4_weight_bytes
from workbench.models import build_model
from workbench.train.techniques.lora import parameter_bytes_by_dtype

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32}


def _layout_bytes(layer: torch.nn.Module) -> int:
    """The bytes bitsandbytes holds a quantised layer's weight in: the packed codes and
    every tensor of its quantisation state (distinct storages)."""
    w = layer.weight
    tensors = [w.data]
    state = w.quant_state
    while state is not None:
        tensors += [t for t in (state.absmax, state.code, state.offset) if t is not None]
        state = state.state2
    return sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()
    )


@pytest.mark.parametrize("shape", [(64, 64), (100, 30), (300, 700), (64, 16384 + 64)])
def test_the_nf4_layout_is_counted_to_the_byte(shape: tuple[int, int]) -> None:
    from bitsandbytes.nn import Linear4bit

    layer = Linear4bit(*shape, bias=False, quant_type="nf4", device="cpu").to("cpu")
    assert layer.weight.quant_state.nested  # double quantisation, as QLoRA runs it
    assert _layout_bytes(layer) == nf4_weight_bytes(shape[0] * shape[1])


def _run(**settings: object) -> tuple[list[float], object, torch.nn.Module, torch.nn.Module]:
    model, data, loss, _ = build_model("tiny-gpt", **SMALL)  # type: ignore[arg-type]
    config = TrainConfig(micro_batch=4, seed=0, lora_rank=8, qlora=True, lr=1e-2, **settings)  # type: ignore[arg-type]
    s = Session(config, model=model, data=data, loss_fn=loss)
    try:
        losses = [r.loss for r in s.run(4, progress=False)]
        report = s.memory()
        trained = s.backend.trained_module
    finally:
        s.close()
    return losses, report, trained, model


def _states_match(report: object) -> None:
    predicted = report.predicted  # type: ignore[attr-defined]
    assert predicted is not None, report.notes  # type: ignore[attr-defined]
    assert report.params_bytes == predicted.params_bytes  # type: ignore[attr-defined]
    assert report.grads_bytes == predicted.grads_bytes  # type: ignore[attr-defined]
    optimizer = report.optimizer_bytes - report.optimizer_step_counter_bytes  # type: ignore[attr-defined]
    assert optimizer == predicted.optimizer_bytes


def test_qlora_trains_in_pure_bf16_and_its_states_are_the_prediction_to_the_byte() -> None:
    reference, _, _, _ = _run()
    losses, report, trained, model = _run(precision="bf16-true")
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert losses == pytest.approx(reference, rel=2e-3)  # the same curve, in bf16's rounding
    dtypes = {n: p.dtype for n, p in trained.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.bfloat16}
    assert dtypes["wte.weight"] == dtypes["ln_f.weight"] == torch.bfloat16  # not fp32
    assert dtypes["blocks.0.attn.qkv.base_layer.weight"] == torch.uint8  # the packed codes
    _states_match(report)
    by_dtype = parameter_bytes_by_dtype(trained)  # what memory()'s note says
    assert set(by_dtype) == {"uint8", "bfloat16", "float32"}  # fp32: the 4-bit code tables
    assert sum(by_dtype.values()) == report.params_bytes  # type: ignore[attr-defined]
    assert any(n.startswith("parameters by dtype: bfloat16") for n in report.notes)  # type: ignore[attr-defined]
    assert type(model.blocks[0].attn.qkv) is torch.nn.Linear  # your layers back, fp32
    assert model.blocks[0].attn.qkv.weight.dtype == torch.float32


def test_fp32_adapters_over_a_bf16_base_are_counted_as_fp32_training() -> None:
    losses, report, trained, _ = _run(precision="bf16-true", lora_dtype="fp32")
    assert losses[-1] < losses[0]
    adapters = {p.dtype for n, p in trained.named_parameters() if ".lora_" in n}
    assert adapters == {torch.float32}
    assert trained.wte.weight.dtype == torch.bfloat16
    _states_match(report)
    bf16 = report.predicted  # type: ignore[attr-defined]
    # the adapters' 4 + 4 + 8 bytes against bf16's 2 + 2 + 4: the gradients double
    assert bf16.grads_bytes == 4 * bf16.lora_params


def test_the_estimator_keeps_a_bf16_base_under_bf16_true() -> None:
    """A 7B's QLoRA under bf16-true holds its embedding and head in 2 bytes, not amp's 4,
    and the 4-bit base layer by layer (`nf4_weight_bytes`)."""
    common = {"model": "llama-2-7b", "lora_rank": 16, "qlora": True}
    amp = estimate_memory(precision="amp-bf16", **common)  # type: ignore[arg-type]
    pure = estimate_memory(precision="bf16-true", **common)  # type: ignore[arg-type]
    unquantized = amp.n_params - amp.qlora_params
    base = 32 * (4 * nf4_weight_bytes(4096 * 4096) + 3 * nf4_weight_bytes(4096 * 11008))
    adapters = amp.lora_params
    assert amp.params_bytes == 4 * unquantized + base + 4 * adapters
    assert pure.params_bytes == 2 * unquantized + base + 2 * adapters
    fp32 = estimate_memory(precision="bf16-true", lora_dtype="fp32", **common)  # type: ignore[arg-type]
    assert fp32.params_bytes == 2 * unquantized + base + 4 * adapters


@pytest.mark.parametrize("precision", ["bf16-true", "fp32"])
def test_the_dry_run_holds_the_4bit_base_as_a_session_does(precision: str) -> None:
    """On fake tensors the 4-bit base is bitsandbytes' layout to the byte (the packed codes
    and the quantisation state as frozen uint8 parameters), the rest in the precision's
    dtype: the model states at rest are the formula's and the Session's (Adam's step
    counters aside)."""
    from workbench.train.dry_run import simulate_memory

    config = TrainConfig(
        micro_batch=4, seed=0, lora_rank=8, qlora=True, lr=1e-2, precision=precision
    )
    dry = simulate_memory("tiny-gpt", config, model_options=SMALL, progress=False)
    formula = dry.formula
    assert formula is not None and formula.qlora_params > 0
    assert dry.params_bytes == formula.params_bytes
    assert dry.grads_bytes == formula.grads_bytes
    assert dry.optimizer_bytes - dry.optimizer_step_counter_bytes == formula.optimizer_bytes
    _, report, _, _ = _run(precision=precision)
    assert dry.params_bytes == report.params_bytes  # type: ignore[attr-defined]


def test_a_module_holding_4bit_layers_is_refused_by_the_dry_run_by_name() -> None:
    from workbench.train.dry_run import simulate_memory
    from workbench.train.dry_run.problems import DryRunError
    from workbench.train.techniques.lora import LoraAdapters

    model, _, _, _ = build_model("tiny-gpt", **SMALL)  # type: ignore[arg-type]
    config = TrainConfig(micro_batch=4, lora_rank=8, qlora=True, precision="bf16-true")
    adapters = LoraAdapters(model, config, torch.device("cpu"))
    try:
        with pytest.raises(DryRunError) as info:
            simulate_memory(model, config, progress=False)
        assert [p.field for p in info.value.problems] == ["qlora"]
        assert "simulate the base model" in str(info.value)
    finally:
        adapters.merge()
