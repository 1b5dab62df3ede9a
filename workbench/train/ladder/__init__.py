"""The optimization ladder: what each optimization buys, measured on this machine.

    import workbench
    result = workbench.ladder(steps=32)                  # the default ladder, tiny-gpt
    print(result)                                        # the table, with a verdict per rung
    result.chart_png(); result.to_dict()                 # the bar chart; the numbers

A ladder is a list of rungs; each rung is a set of `TrainConfig` changes applied on top
of every rung before it (cumulative), plus `ranks` for data parallelism. The first rung
is the baseline (its changes apply to `base`). Every rung trains on the same samples in
the same order, `repeats` times, interleaved; a rung's samples/s is all its samples over
all its seconds (steps after each run's first), with the spread of the same ratio over
windows of steps (report.py says how).

One concept per module:

rungs.py    Rung, the default ladder (`default_rungs`), reading rungs and applying them
plan.py     LadderSpec (the ladder's arguments, checked), `plan_ladder` -> LadderPlan
run.py      `ladder`, `run_plan`: each rung through a Session or `launch_ranks`; memory
            measured next to the prediction; the machine's facts
report.py   LadderResult: the measured figures, verdicts, table, JSON and chart
problems.py LadderError (a ValueError) and its LadderProblems: every problem as data
"""

from __future__ import annotations

from workbench.spread import spread
from workbench.train.ladder.plan import (
    LadderPlan,
    LadderSpec,
    PlannedRung,
    number_problems,
    plan_ladder,
    plan_spec,
)
from workbench.train.ladder.problems import LadderError, LadderProblem
from workbench.train.ladder.report import (
    LadderResult,
    RungPlan,
    RungResult,
    RunMeasure,
    summarize,
)
from workbench.train.ladder.run import LadderCancelled, LadderProgress, ladder, run_plan
from workbench.train.ladder.rungs import Rung, amp_precision, available_ranks, default_rungs

__all__ = [
    "LadderCancelled",
    "LadderError",
    "LadderPlan",
    "LadderProblem",
    "LadderProgress",
    "LadderResult",
    "LadderSpec",
    "PlannedRung",
    "Rung",
    "RungPlan",
    "RungResult",
    "RunMeasure",
    "amp_precision",
    "available_ranks",
    "default_rungs",
    "ladder",
    "number_problems",
    "plan_ladder",
    "plan_spec",
    "run_plan",
    "spread",
    "summarize",
]
