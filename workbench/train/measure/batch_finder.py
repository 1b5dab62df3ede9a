"""`find_max_micro_batch`: the largest micro-batch that fits, found by measuring.

* On a GPU without a budget: out-of-memory probing. Each probe is one forward+backward
  of a real micro-batch (`Session.memory()`); an OOM means "does not fit".
* With `memory_budget_bytes` (any device) or on the CPU: a probe fits when the measured
  bytes stay within the budget. On CUDA the measure is the probe's
  `torch.cuda.max_memory_allocated()`; on the CPU it is params + grads + optimizer states
  + activations counted from the tensors (`MemoryReport.total_bytes`), and the budget
  defaults to the memory the OS reports available.

The search runs on a throwaway Session (a deep copy of your module, so your weights stay
untouched), after one optimizer step so the optimizer states exist. It doubles the
micro-batch until a probe does not fit (on the CPU it first jumps to the micro-batch the
first two probes extrapolate to, since activations grow linearly), then bisects.
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
    that fits on the device or within `memory_budget_bytes` (see the module docstring)."""
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
        session.run(1)  # optimizer states exist from here on
        probes: dict[int, Probe] = {}
        per_sample: list[tuple[int, int]] = []

        def fits(m: int) -> bool:
            if m in probes:
                return probes[m].fits
            session.update(micro_batch=m)
            try:
                report = session.memory()
            except Exception as exc:
                if not is_oom(exc):
                    raise
                if cuda:
                    torch.cuda.empty_cache()
                probes[m] = Probe(m, False, None)
                return False
            used = report.cuda_max_allocated_bytes if cuda else report.total_bytes
            per_sample.append((m, report.total_bytes))
            ok = budget is None or (used is not None and used <= budget)
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
                    (m1, b1), (m2, b2) = per_sample[0], per_sample[-1]
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
        )
