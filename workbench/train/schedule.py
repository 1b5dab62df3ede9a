"""Learning-rate schedules and batch-size LR scaling, as plain functions of the step.

A schedule has no state besides the number of optimizer steps applied, so it survives a
backend rebuild or a checkpoint by carrying that one integer.

`lr_at(config, step, base_lr)` is the learning rate of the optimizer step that follows
`step` applied steps (step 0 is the first):

* warmup: linear from base_lr/warmup_steps to base_lr over `warmup_steps` steps;
* constant: base_lr after warmup;
* cosine: half-cosine from base_lr to 0 between warmup_steps and total_steps, then 0;
* onecycle: warmup (or, with warmup_steps=0, 30% of total_steps) then a cosine
  annealing to base_lr / 1e4 at total_steps (torch's OneCycleLR shape, without its
  momentum cycling), then constant.

`scaled_lr(config, reference_batch, world_size)` applies `lr_scaling` to `config.lr`:
`linear` multiplies it by B / B0, `sqrt` by sqrt(B / B0), where B is the current
effective batch (micro_batch x grad_accum x world_size) and B0 the effective batch when
the Session started (or the one saved in its checkpoint). So `lr` always means "the
learning rate at the starting batch size", and changing micro_batch or grad_accum on a
live session rescales the learning rate the optimizer actually uses.
"""

from __future__ import annotations

import math

from workbench.config import LRScaling, LRSchedule, TrainConfig
from workbench.export import job_common

#: The formulas are the exported jobs' (`workbench.export.job_common.lr_multiplier`, one
#: implementation: the shipped scripts stand alone, the library imports them)
ONECYCLE_PCT_START = job_common.ONECYCLE_PCT_START
ONECYCLE_FINAL_DIV = job_common.ONECYCLE_FINAL_DIV


def lr_multiplier(
    schedule: LRSchedule | str, step: int, warmup_steps: int, total_steps: int
) -> float:
    """Factor applied to the base learning rate for the step after `step` applied steps
    (ValueError for a schedule that is not an LRSchedule)."""
    return job_common.lr_multiplier(LRSchedule(schedule).value, step, warmup_steps, total_steps)


def lr_at(config: TrainConfig, step: int, base_lr: float) -> float:
    return base_lr * lr_multiplier(
        config.lr_schedule, step, config.warmup_steps, config.total_steps
    )


def scaled_lr(config: TrainConfig, reference_batch: int, world_size: int = 1) -> float:
    """`config.lr` scaled by `lr_scaling` for the current effective batch (see module doc)."""
    factor = config.effective_batch_size(world_size) / reference_batch
    scaling = LRScaling(config.lr_scaling)
    if scaling is LRScaling.LINEAR:
        return float(config.lr) * factor
    if scaling is LRScaling.SQRT:
        return float(config.lr) * math.sqrt(factor)
    return float(config.lr)
