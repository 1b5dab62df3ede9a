"""`find_max_micro_batch`: the largest micro-batch that fits, found by measuring.

* On a GPU without a budget: out-of-memory probing. Each probe is one forward+backward
  of a real micro-batch (`Session.memory()`); an OOM means "does not fit".
* With `memory_budget_bytes` (any device) or on the CPU: a probe fits when the peak of a
  training step at its micro-batch stays within the budget. Both devices measure the same
  thing, the most memory the allocator holds at once, so every transient counts (the
  recomputed block under activation checkpointing, the logits' gradients):
  - the probe's forward and backward: on CUDA its `torch.cuda.max_memory_allocated()`; on
    the CPU the most tensor memory it held at once (`Session.memory(cpu_peak=True)`:
    the model states, buffers and batch it starts from, plus the peak of what its
    operations allocate, `workbench.train.measure.cpu_peak`);
  - the optimizer step, whose temporaries do not grow with the micro-batch: the peak of
    the search's first whole training step (at micro-batch 1, measured the same way), the
    floor under every probe (`MicroBatchSearch.first_step_peak_bytes`).
  A probe's `measured_bytes` is the higher of the two. On the CPU the budget defaults to
  the memory the OS reports available; what the process holds besides the training
  tensors (Python, libraries, the data set) is not counted, as on a GPU the CUDA
  context is not.

The search runs on a throwaway Session (a deep copy of your module, so your weights stay
untouched), after one optimizer step so the optimizer states exist. It doubles the
micro-batch until a probe does not fit, then bisects; on the CPU, where the peak grows
linearly with the micro-batch, it jumps to where the last two probes extrapolate to, and
then to where the line between the nearest fit and misfit meets the budget.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench.config import TrainConfig
from workbench.inputs import shown
from workbench.train.measure.cpu_peak import StoragePeak
from workbench.train.measure.memory import held_bytes


@dataclass(frozen=True)
class Probe:
    micro_batch: int
    fits: bool
    measured_bytes: int | None  # None when the probe ran out of memory


@dataclass(frozen=True)
class MicroBatchSearch:
    """The result: `micro_batch` is the largest that fits (0: not even 1)."""

    micro_batch: int
    method: str  # "oom-probe" | "measured-budget"
    device: str
    memory_budget_bytes: int | None
    limit: int  # the largest micro-batch considered (dataset size / max_micro_batch)
    probes: tuple[Probe, ...]
    #: the peak of the first whole training step (micro-batch 1, optimizer step included):
    #: the floor of every probe's measured bytes; None in out-of-memory probing
    first_step_peak_bytes: int | None = None

    @property
    def measured_bytes(self) -> int | None:
        """Measured bytes at the answer (None when nothing fit)."""
        for p in self.probes:
            if p.micro_batch == self.micro_batch and p.fits:
                return p.measured_bytes
        return None


def find_max_micro_batch(
    config: TrainConfig,
    memory_budget_bytes: int | None = None,
    *,
    model: str | nn.Module = "tiny-gpt",
    data: Dataset[Any] | None = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    model_options: dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    max_micro_batch: int = 65536,
) -> MicroBatchSearch:
    """The largest micro-batch for `config` (its precision, optimizer, checkpointing...)
    whose training step fits on the device or, with `memory_budget_bytes`, whose step's
    peak stays within it (see the module docstring for what is measured)."""
    from workbench.train.session import Session, is_oom

    problems = []
    if not isinstance(config, TrainConfig):
        problems.append(f"config={shown(config)}: must be a workbench.TrainConfig")
    if memory_budget_bytes is not None and (
        not isinstance(memory_budget_bytes, int)
        or isinstance(memory_budget_bytes, bool)
        or memory_budget_bytes < 1
    ):
        problems.append(
            f"memory_budget_bytes={shown(memory_budget_bytes)}: must be an integer >= 1 or None"
        )
    if (
        not isinstance(max_micro_batch, int)
        or isinstance(max_micro_batch, bool)
        or max_micro_batch < 1
    ):
        problems.append(f"max_micro_batch={shown(max_micro_batch)}: must be an integer >= 1")
    if isinstance(data, DataLoader):
        problems.append("data: must be a Dataset (the search builds loaders of each size)")
    if problems:
        raise ValueError("; ".join(problems))
    if isinstance(model, nn.Module):
        model = copy.deepcopy(model)
    base = config.replace(
        micro_batch=1,
        grad_accum=1,
        checkpoint_dir=None,
        checkpoint_every_steps=None,
        checkpoint_every_seconds=None,
        num_workers=0,
    )
    with Session(
        base, model=model, data=data, loss_fn=loss_fn, model_options=model_options, device=device
    ) as session:
        dev = session.device
        source = session.data
        limit = min(max_micro_batch, len(source))  # type: ignore[arg-type]
        cuda = dev.type == "cuda"
        budget = memory_budget_bytes
        if budget is None and not cuda:
            import psutil

            budget = int(psutil.virtual_memory().available)
        method = "measured-budget" if budget is not None else "oom-probe"
        # one whole step (optimizer states exist from here on), its peak measured
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
            session.run(1)
            first_step = int(torch.cuda.max_memory_allocated(dev))
        else:
            held = held_bytes(session.backend, session.model)
            with StoragePeak() as tracker:
                session.run(1)
            first_step = held + tracker.peak_bytes
        floor = first_step if budget is not None else None
        probes: dict[int, Probe] = {}
        per_sample: list[tuple[int, int]] = []  # (micro-batch, its probe's peak), in order
        peaks: dict[int, int] = {}

        def fits(m: int) -> bool:
            if m in probes:
                return probes[m].fits
            session.update(micro_batch=m)
            try:
                report = session.memory(cpu_peak=not cuda)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                if cuda:
                    torch.cuda.empty_cache()
                probes[m] = Probe(m, False, None)
                return False
            peak = report.cuda_max_allocated_bytes if cuda else report.cpu_peak_bytes
            assert peak is not None  # measured on both devices
            per_sample.append((m, peak))
            peaks[m] = peak
            used = max(peak, floor or 0)
            ok = budget is None or used <= budget
            probes[m] = Probe(m, ok, used)
            return ok

        lo, hi = 0, None  # largest known fit, smallest known misfit
        m = 1
        while hi is None:
            if fits(m):
                lo = m
                if m >= limit:
                    break
                nxt = min(2 * m, limit)
                if not cuda and budget is not None and len(per_sample) >= 2:
                    (m1, b1), (m2, b2) = per_sample[-2], per_sample[-1]
                    slope = (b2 - b1) / (m2 - m1) if m2 != m1 else 0.0
                    if slope > 0:
                        guess = int(m2 + (budget - b2) / slope)
                        nxt = max(m + 1, min(guess, limit))
                m = nxt
            else:
                hi = m
        if hi is not None:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if not cuda and budget is not None and lo in peaks and hi in peaks:
                    # the budget's place on the line through the two nearest probes
                    share = (budget - peaks[lo]) / max(1, peaks[hi] - peaks[lo])
                    mid = min(hi - 1, max(lo + 1, lo + int(share * (hi - lo))))
                if fits(mid):
                    lo = mid
                else:
                    hi = mid
        return MicroBatchSearch(
            micro_batch=lo,
            method=method,
            device=str(dev),
            memory_budget_bytes=budget,
            limit=limit,
            probes=tuple(sorted(probes.values(), key=lambda p: p.micro_batch)),
            first_step_peak_bytes=floor,
        )
