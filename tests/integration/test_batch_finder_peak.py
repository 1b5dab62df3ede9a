"""The micro-batch finder on a CPU answers what it answers on a GPU: the largest
micro-batch whose training step peaks within the budget, every transient counted (the
recomputation under activation checkpointing, the optimizer step's temporaries)."""

from __future__ import annotations

import torch
from torch import nn

from workbench import Session, TrainConfig, find_max_micro_batch
from workbench.train.measure.cpu_peak import StoragePeak
from workbench.train.measure.memory import held_bytes

BUDGET = 3_000_000


def whole_step_peak(config: TrainConfig, micro: int, **session: object) -> int:
    """An independent measure: the most tensor memory one whole training step at `micro`
    holds at once (after a first step, so the optimizer states exist)."""
    with Session(config.replace(micro_batch=micro), **session) as s:  # type: ignore[arg-type]
        s.run(1)
        held = held_bytes(s.backend, s.model)
        with StoragePeak() as peak:
            s.run(1)
    return held + peak.peak_bytes


def test_the_answer_fits_a_whole_step_with_and_without_checkpointing(tiny):
    found = {}
    for ckpt in (True, False):
        cfg = TrainConfig(activation_checkpointing=ckpt)
        search = find_max_micro_batch(cfg, BUDGET, model_options=tiny)
        m = found[ckpt] = search.micro_batch
        assert m > 2 and search.method == "measured-budget"
        assert whole_step_peak(cfg, m, model_options=tiny) <= BUDGET, (ckpt, m)
        assert whole_step_peak(cfg, m + 1, model_options=tiny) > BUDGET, (ckpt, m)
    # two blocks: checkpointing keeps two block inputs but recomputes one block whole in
    # the backward pass, so it can at most about halve the activations; it still pays
    assert found[False] < found[True] <= 2 * found[False], found


def test_a_probe_measures_the_recomputation_under_checkpointing(tiny):
    """The probe's CPU peak counts the block the backward pass recomputes, which the
    saved tensors (`total_bytes`) leave out, and agrees with a whole step's peak."""
    cfg = TrainConfig(micro_batch=16, activation_checkpointing=True)
    with Session(cfg, model_options=tiny) as s:
        s.run(1)
        report = s.memory(cpu_peak=True)
        plain = s.memory()
    assert plain.cpu_peak_bytes is None
    recompute = report.predicted.activations.recompute_bytes
    assert report.cpu_peak_bytes > report.total_bytes + recompute // 2
    step = whole_step_peak(cfg, 16, model_options=tiny)
    assert abs(report.cpu_peak_bytes - step) <= 0.02 * step
    assert "CPU peak of forward + backward (probe)" in str(report)


def test_the_optimizer_step_is_the_floor_of_every_probe():
    """A model whose weights dwarf its activations peaks in the optimizer step (AdamW's
    temporaries on top of the weights, gradients and moments): a budget above the model
    states but below that step fits no micro-batch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 1))
    data = torch.utils.data.TensorDataset(torch.randn(64, 512), torch.randn(64, 1))
    session = dict(model=model, data=data, loss_fn=nn.functional.mse_loss)
    cfg = TrainConfig()
    step = whole_step_peak(cfg, 1, **session)
    with Session(cfg.replace(micro_batch=1), **session) as s:  # type: ignore[arg-type]
        s.run(1)
        states = s.memory(cpu_peak=True)
    assert step > states.cpu_peak_bytes > states.params_bytes * 4  # weights, grads, 2 moments
    budget = (step + states.cpu_peak_bytes) // 2
    search = find_max_micro_batch(cfg, budget, **session)  # type: ignore[arg-type]
    assert search.first_step_peak_bytes is not None
    assert abs(search.first_step_peak_bytes - step) <= 0.02 * step
    assert all(p.measured_bytes >= search.first_step_peak_bytes for p in search.probes)
    assert search.micro_batch == 0
    assert find_max_micro_batch(cfg, step + 10_000, **session).micro_batch > 0  # type: ignore[arg-type]
