"""The optimization ladder: what each optimization buys, measured on this machine.

    import workbench
    result = workbench.ladder(steps=32)                  # the default ladder, tiny-gpt
    print(result)                                        # the table, with a verdict per rung
    result.chart_png(); result.to_dict()                 # the bar chart; the numbers

A ladder is a list of rungs; each rung is a set of `TrainConfig` changes applied on top
of every rung before it (cumulative), plus `ranks` for data parallelism. The first rung
is the baseline (its changes apply to `base`). The default ladder (`default_rungs`):

1. baseline: fp32, a single-process data loader (`num_workers=0`);
2. + AMP (bf16 where the device supports it, else fp16) + loader workers (+ pinned memory
   on a GPU, where it speeds up host-to-device copies);
3. + data parallel on the available ranks, through the real launcher
   (`workbench.train.launch.launch_ranks`: torchrun, one process per GPU, or 2 CPU
   processes on a CPU: more ranks on the same cores add no compute);
4. + gradient accumulation (a 4x larger effective batch), the learning rate scaled by the
   rule picked (`lr_scaling`: "linear" or "sqrt", from the baseline's effective batch) and
   a OneCycle schedule over the rung's steps;
5. optional + `torch.compile` (`compile=True`; compile time reported apart from the step
   time);
6. optional + activation checkpointing with a 2x larger micro-batch and half the
   accumulation (`checkpointing=True`).

Fairness: every rung trains on the same samples in the same order: `steps` optimizer
steps of the baseline make the sample budget (`steps x` the baseline's effective batch),
and a rung with a larger effective batch takes fewer, larger steps over the same samples
(same seed: same initial weights and data order; data-parallel ranks read disjoint shards
of the same order). Rungs are repeated `repeats` times, interleaved (the order reversed on
every other repeat, so a machine that speeds up or slows down over time favours no rung),
and the figures are medians with their spread (`workbench.train.ladder_report`).

Bad input (an unknown setting in a rung, a rung that changes nothing, zero steps, a budget
a rung's effective batch does not divide, a setting this machine cannot run) raises one
ValueError naming every problem before anything runs. A target loss never reached is
reported in the result, not an error.

Each rung's run is a fresh `Session` in this process, or `launch_ranks` for several ranks;
the ladder uses their public API only (records, `memory()`, the launch result's per-rank
figures).

Past 600 lines because the rungs, their fair runs (same samples, interleaved repeats) and
the report with its verdicts are one workflow; each rung runs through `Session` or `launch_ranks`.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from workbench.config import LRScaling, LRSchedule, TrainConfig, did_you_mean, problem_lines
from workbench.inputs import shown
from workbench.train.ladder_report import LadderResult, RungPlan, RunMeasure, summarize

__all__ = [
    "LadderCancelled",
    "LadderPlan",
    "LadderProgress",
    "LadderResult",
    "Rung",
    "default_rungs",
    "ladder",
    "plan_ladder",
]

#: The ladder's own setting in a rung (not a TrainConfig field): data-parallel ranks.
RANKS = "ranks"
#: Settings a rung may not change: the ladder runs every rung on one device.
FIXED = ("device",)
#: Default data-parallel ranks on a CPU: ranks there share the same cores.
CPU_RANKS = 2
#: Keys a rung may not hold: the model (code) is the ladder's own argument, never a rung's
#: (a rungs file cannot choose code to run).
NOT_SETTINGS = ("model", "model_options", "data", "loss_fn", "sampler", "factory")
#: The baseline's optimizer steps: a ladder measures speed; more is a training run.
MAX_STEPS = 10**6
#: Runs per rung: the median of more changes nothing.
MAX_REPEATS = 1000
#: Rungs in one ladder: each is run `repeats` times; more would take days.
MAX_RUNGS = 64
#: A rung's name is a table row and a chart label.
MAX_NAME_CHARS = 120


class LadderCancelled(RuntimeError):
    """The ladder was cancelled (`cancel` was set) before it finished."""


@dataclass(frozen=True)
class Rung:
    """One rung: a name and the changes it adds on top of the rungs before it
    (`TrainConfig` fields, and `ranks` for data parallelism)."""

    name: str
    changes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.changes}


@dataclass(frozen=True)
class PlannedRung:
    """A validated rung: the settings it trains with (after LR scaling and the schedule's
    horizon), its ranks, effective batch and optimizer steps per run."""

    name: str
    changes: dict[str, Any]
    config: TrainConfig
    ranks: int
    effective_batch: int
    steps: int

    def report_plan(self) -> RungPlan:
        return RungPlan(
            name=self.name,
            changes=dict(self.changes),
            settings=self.config.to_dict(),
            ranks=self.ranks,
            effective_batch=self.effective_batch,
            steps=self.steps,
        )


@dataclass(frozen=True)
class LadderPlan:
    """Everything a ladder run needs, checked (`plan_ladder`)."""

    rungs: tuple[PlannedRung, ...]
    model: str
    model_options: dict[str, Any] | None
    device: str  # "cpu" or "cuda"
    samples: int  # per rung and repeat
    repeats: int
    target_loss: float | None
    lr_scaling: str
    launcher: str
    memory: bool
    timeout: float | None
    model_description: Any  # what the estimator needs (ModelInfo or a parameter count)
    notes: tuple[str, ...] = ()

    @property
    def total_steps(self) -> int:
        """Optimizer steps the whole ladder trains (all rungs, all repeats)."""
        return self.repeats * sum(r.steps for r in self.rungs)


@dataclass(frozen=True)
class LadderProgress:
    """Where a running ladder is: `done` of `total` optimizer steps, the rung and repeat
    now training, and the newest step's loss (None before the first)."""

    done: int
    total: int
    rung: str
    rung_index: int
    repeat: int
    repeats: int
    loss: float | None = None


# --------------------------------------------------------------------------- rungs
def amp_precision(device: str) -> str:
    """The AMP setting for `device`: "amp-bf16" where autocast supports bfloat16 there
    (every CPU build of torch 2.x; GPUs of compute capability 8.0 and later), else
    "amp-fp16"."""
    from workbench.train.precision import amp_supported

    return "amp-bf16" if amp_supported("amp-bf16", device) is None else "amp-fp16"


def available_ranks(device: str) -> int:
    """Data-parallel ranks the default ladder uses: every visible GPU on CUDA; on a CPU
    `CPU_RANKS` when there are that many cores (ranks split the same cores), else 1."""
    if device == "cuda":
        import torch

        return int(torch.cuda.device_count())
    return CPU_RANKS if (os.cpu_count() or 1) >= CPU_RANKS else 1


def default_rungs(
    *,
    device: str = "cpu",
    ranks: int | None = None,
    lr_scaling: str = "linear",
    compile: bool = False,
    checkpointing: bool = False,
    micro_batch: int = 8,
    accumulation: int = 4,
    workers: int | None = None,
) -> list[Rung]:
    """The default ladder for `device` (see the module docstring). `ranks`: data-parallel
    ranks (default `available_ranks(device)`; 1 leaves the data-parallel rung out).
    `micro_batch`: the baseline's (the checkpointing rung doubles it). `workers`: loader
    processes of the AMP rung (default: 2, or 1 on a one-core machine)."""
    ranks = available_ranks(device) if ranks is None else ranks
    amp = amp_precision(device)
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)
    amp_changes: dict[str, Any] = {"precision": amp, "num_workers": workers}
    if device == "cuda":
        amp_changes["pin_memory"] = True
    rungs = [
        Rung("baseline: fp32, num_workers=0", {"precision": "fp32", "num_workers": 0}),
        Rung(
            f"+ AMP ({amp.removeprefix('amp-')}) + {workers} loader worker"
            + ("s" if workers != 1 else "")
            + (" + pinned memory" if device == "cuda" else ""),
            amp_changes,
        ),
    ]
    if ranks > 1:
        dp: dict[str, Any] = {RANKS: ranks}
        if amp == "amp-fp16":
            # several ranks train through DeepSpeed, which runs fp16 as its own
            # loss-scaled mode rather than torch's GradScaler
            dp["precision"] = "fp16"
        rungs.append(Rung(f"+ data parallel ({ranks} ranks)", dp))
    rungs.append(
        Rung(
            f"+ accumulation x{accumulation}, LR {lr_scaling}, OneCycle",
            {"grad_accum": accumulation, "lr_scaling": lr_scaling, "lr_schedule": "onecycle"},
        )
    )
    if compile:
        rungs.append(Rung("+ torch.compile", {"compile": True}))
    if checkpointing:
        half = max(1, accumulation // 2)
        rungs.append(
            Rung(
                f"+ activation checkpointing, micro-batch {micro_batch * 2}",
                {
                    "activation_checkpointing": True,
                    "micro_batch": micro_batch * 2,
                    "grad_accum": half,
                },
            )
        )
    return rungs


def _as_rung(value: Any, index: int, problems: list[str]) -> Rung | None:
    """A Rung from a Rung, a (name, changes) pair or a mapping with an optional "name"."""
    where = f"rung {index + 1}"
    name: Any
    changes: Any
    if isinstance(value, Rung):
        name, changes = value.name, value.changes
    elif isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], Mapping):
        name, changes = value[0], value[1]
    elif isinstance(value, Mapping):
        changes = {k: v for k, v in value.items() if k != "name"}
        name = value.get("name")
    else:
        problems.append(
            f"{where}: {shown(value)}: must be a mapping of settings (with an optional "
            "'name'), a (name, changes) pair or a workbench.train.ladder.Rung"
        )
        return None
    if not isinstance(changes, Mapping) or not all(isinstance(k, str) for k in changes):
        problems.append(f"{where}: changes={shown(changes)}: must map setting names to values")
        return None
    if name is None:
        name = (
            "baseline" if index == 0 else "+ " + ", ".join(f"{k}={v}" for k, v in changes.items())
        )
        if len(name) > MAX_NAME_CHARS:
            name = name[: MAX_NAME_CHARS - 3] + "..."
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{where}: name={shown(name)}: must be a non-empty string")
        return None
    if len(name.strip()) > MAX_NAME_CHARS or not name.strip().isprintable():
        problems.append(
            f"{where}: name={shown(name)}: must be one line of at most {MAX_NAME_CHARS} "
            "printable characters (a table row and a chart label)"
        )
        return None
    return Rung(name.strip(), dict(changes))


# --------------------------------------------------------------------------- checking
def _is_number(v: Any) -> bool:
    """A finite real number (a NumPy scalar too), never a bool."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool) or type(v).__name__ == "bool_":
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def _format(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"invalid ladder: {problems[0]}"
    return f"{len(problems)} problems in the ladder:\n" + "\n".join(f"  - {p}" for p in problems)


def plan_ladder(
    rungs: Sequence[Any] | None = None,
    model: str = "tiny-gpt",
    steps: int = 32,
    target_loss: float | None = None,
    *,
    base: TrainConfig | None = None,
    model_options: dict[str, Any] | None = None,
    repeats: int = 3,
    lr_scaling: str = "linear",
    ranks: int | None = None,
    compile: bool = False,
    checkpointing: bool = False,
    device: str | None = None,
    launcher: str = "torchrun",
    memory: bool = True,
    timeout: float | None = None,
) -> LadderPlan:
    """Check a ladder (see `ladder` for the arguments) and return what it will run; one
    ValueError naming every problem otherwise. Builds the model once to check what this
    machine can run; trains nothing."""
    problems = number_problems(
        steps=steps,
        repeats=repeats,
        target_loss=target_loss,
        ranks=ranks,
        timeout=timeout,
        model_options=model_options,
    )
    from workbench.train.launch import LAUNCHERS

    if lr_scaling not in LRScaling.choices():
        problems.append(
            f"lr_scaling={shown(lr_scaling)}: must be one of {', '.join(LRScaling.choices())}"
        )
    for flag, value in (("compile", compile), ("checkpointing", checkpointing), ("memory", memory)):
        if not isinstance(value, bool):
            problems.append(f"{flag}={shown(value)}: must be True or False")
    if base is not None and not isinstance(base, TrainConfig):
        problems.append(f"base={shown(base)}: must be a workbench.TrainConfig or None")
    if launcher not in LAUNCHERS:
        problems.append(f"launcher={shown(launcher)}: must be one of {', '.join(LAUNCHERS)}")
    from workbench.models.spec import spec_problems

    problems += spec_problems(model)
    dev = _device(device, base, problems)
    if rungs is not None and (
        isinstance(rungs, (str, bytes, Mapping)) or not isinstance(rungs, Sequence)
    ):
        problems.append(
            f"rungs={shown(rungs)}: must be a list of rungs or None (the default ladder)"
        )
    elif rungs is not None and len(rungs) > MAX_RUNGS:
        problems.append(
            f"rungs: {len(rungs):,} rungs; at most {MAX_RUNGS} (each runs {shown(repeats)} "
            "time(s): more would take days)"
        )
    if problems:
        raise ValueError(_format(problems))
    assert dev is not None
    steps, repeats = int(steps), int(repeats)
    ranks = None if ranks is None else int(ranks)
    target_loss = None if target_loss is None else float(target_loss)
    timeout = None if timeout is None else float(timeout)
    # the runs measure; they write no checkpoints (a rung may still ask for them)
    start = (base or TrainConfig()).replace(
        device=dev, checkpoint_dir=None, checkpoint_every_steps=None, checkpoint_every_seconds=None
    )
    default = rungs is None
    if rungs is None:
        rungs = default_rungs(
            device=dev,
            ranks=ranks,
            lr_scaling=lr_scaling,
            compile=compile,
            checkpointing=checkpointing,
            micro_batch=int(start.micro_batch),
        )
    elif not rungs:
        raise ValueError(_format(["rungs=[]: name at least the baseline rung"]))
    parsed = [_as_rung(r, i, problems) for i, r in enumerate(rungs)]
    names = [r.name for r in parsed if r is not None]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"rung name {name!r}: used twice; give every rung its own name")
    configs = _cumulative(parsed, start, problems)
    if problems:
        raise ValueError(_format(problems))
    budget = int(steps) * configs[0][0].effective_batch_size(configs[0][1])
    planned = _planned(parsed, configs, budget, steps, lr_scaling, problems)
    if problems:
        raise ValueError(_format(problems))
    description = _check_runtime(planned, model, model_options, dev, launcher, timeout, problems)
    if problems:
        raise ValueError(_format(problems))
    notes = []
    if default and not any(p.ranks > 1 for p in planned):
        notes.append(
            f"no data-parallel rung: {available_ranks(dev) if ranks is None else ranks} "
            f"rank(s) {'available' if ranks is None else 'asked for'} (it needs 2 or more)"
        )
    return LadderPlan(
        rungs=tuple(planned),
        model=model,
        model_options=dict(model_options) if model_options else None,
        device=dev,
        samples=budget,
        repeats=int(repeats),
        target_loss=None if target_loss is None else float(target_loss),
        lr_scaling=lr_scaling,
        launcher=launcher,
        memory=memory,
        timeout=None if timeout is None else float(timeout),
        model_description=description,
        notes=tuple(notes),
    )


def number_problems(
    *,
    steps: Any = 32,
    repeats: Any = 3,
    target_loss: Any = None,
    ranks: Any = None,
    timeout: Any = None,
    model_options: Any = None,
) -> list[str]:
    """The problems of a ladder's numbers (and model options), each naming its argument:
    integers in range (NumPy scalars count), finite numbers, JSON options."""
    from workbench.train.launch import (
        MAX_RANKS,
        integer_problem,
        options_problem,
        seconds_problem,
    )

    found = [
        integer_problem(
            "steps",
            steps,
            1,
            MAX_STEPS,
            "a ladder measures speed; a million steps per rung is a training run",
            meaning="the baseline's optimizer steps",
        ),
        integer_problem(
            "repeats", repeats, 1, MAX_REPEATS, "the median of more runs changes nothing"
        ),
        None
        if ranks is None
        else integer_problem(
            "ranks",
            ranks,
            1,
            MAX_RANKS,
            "more local ranks than one machine runs",
            meaning="or None: the available ranks",
        ),
        None
        if target_loss is None or _is_number(target_loss)
        else f"target_loss={shown(target_loss)}: must be a finite number or None",
        seconds_problem("timeout", timeout),
        options_problem("model_options", model_options),
    ]
    return [p for p in found if p]


def _device(device: Any, base: Any, problems: list[str]) -> str | None:
    """The device every rung runs on: "cpu" or "cuda" (from `device`, else the base
    config's, "auto" taking CUDA when available)."""
    from workbench.train.devices import resolve_device

    configured = str(base.device) if isinstance(base, TrainConfig) else "auto"
    if device is not None and not isinstance(device, str):
        problems.append(f"device={shown(device)}: must be 'auto', 'cpu', 'cuda' or None")
        return None
    try:
        dev = resolve_device(None, configured if device is None else device)
    except (ValueError, RuntimeError) as exc:
        text = " ".join(str(exc).split())
        if text.startswith("Expected one of"):  # torch's list of every device type
            text = f"device={shown(device)}: must be 'auto', 'cpu' or 'cuda'"
        elif not text.startswith("device="):
            text = f"device={shown(device)}: must be 'auto', 'cpu' or 'cuda' ({text})"
        problems.append(text)
        return None
    return dev.type


def _cumulative(
    parsed: Sequence[Rung | None], start: TrainConfig, problems: list[str]
) -> list[tuple[TrainConfig, int]]:
    """(config, ranks) after each rung: its changes on top of every rung before it."""
    from dataclasses import fields

    from workbench.train.launch import MAX_RANKS, integer_problem

    known = {f.name for f in fields(TrainConfig)}
    config, world = start, 1
    out: list[tuple[TrainConfig, int]] = []
    for i, rung in enumerate(parsed):
        if rung is None:
            out.append((config, world))
            continue
        where = f"rung {i + 1} {shown(rung.name)}"
        changes = dict(rung.changes)
        new_world = world
        for name in [n for n in NOT_SETTINGS if n in changes]:
            problems.append(
                f"{where}: {name}={shown(changes.pop(name))}: a rung holds training settings "
                "only; the model is the ladder's own (model=, --model), never a rung's"
            )
        if RANKS in changes:
            value = changes.pop(RANKS)
            bad = integer_problem(
                RANKS, value, 1, MAX_RANKS, "more local ranks than one machine runs"
            )
            if bad:
                problems.append(f"{where}: {bad}")
            else:
                new_world = int(value)
        refused = [name for name in FIXED if name in changes]
        for name in refused:
            problems.append(
                f"{where}: {name}={shown(changes.pop(name))}: the ladder runs every rung on "
                "one device; pass device= to the ladder instead"
            )
        unknown = sorted(set(changes) - known)
        for name in [n for n in unknown if did_you_mean(n, [RANKS])]:
            unknown.remove(name)
            problems.append(
                f"{where}: {name}={shown(changes.pop(name))}: unknown setting; did you mean "
                f"{RANKS!r}? (the ladder's data-parallel ranks)"
            )
        if unknown:
            # TrainConfig's own message: "did you mean", other trainers' names included
            try:
                config.replace(**{name: changes.pop(name) for name in unknown})
            except ValueError as exc:
                problems += [
                    f"{where}: "
                    + line.replace(
                        " known settings: ", f" known settings: {RANKS} (data-parallel ranks), ", 1
                    )
                    for line in problem_lines(exc)
                ]
        try:
            new = config.replace(**changes)
        except ValueError as exc:
            problems += [f"{where}: {line}" for line in problem_lines(exc)]
            out.append((config, new_world))
            continue
        if i > 0 and new == config and new_world == world and not (unknown or refused):
            same = ", ".join(f"{k}={shown(v)}" for k, v in rung.changes.items()) or "no settings"
            problems.append(
                f"{where}: changes nothing ({same}: already in effect after the rungs before "
                "it); drop it or change a setting"
            )
        config, world = new, new_world
        out.append((config, world))
    return out


def _planned(
    parsed: Sequence[Rung | None],
    configs: Sequence[tuple[TrainConfig, int]],
    budget: int,
    steps: int,
    lr_scaling: str,
    problems: list[str],
) -> list[PlannedRung]:
    """Each rung's steps over the sample budget, its learning rate scaled from the
    baseline's effective batch and its schedule's horizon set to its steps."""
    from workbench.train.schedule import scaled_lr

    base_config, base_world = configs[0]
    reference = base_config.effective_batch_size(base_world)
    batches = [c.effective_batch_size(w) for c, w in configs]
    # the smallest budget >= the one asked for that every rung divides into >= 2 steps
    lcm = math.lcm(*batches)
    fitting = -(-max(budget, 2 * max(batches)) // lcm) * lcm
    out = []
    for i, (rung, (config, world)) in enumerate(zip(parsed, configs, strict=True)):
        assert rung is not None
        eff = batches[i]
        if budget % eff or budget // eff < 2:
            problems.append(
                f"rung {i + 1} {shown(rung.name)}: every rung trains on the same {budget} samples "
                f"(steps={steps} x the baseline's effective batch {reference}), which its "
                f"effective batch {eff} must divide into at least 2 steps; use "
                f"steps={fitting // reference}"
            )
            continue
        rung_steps = budget // eff
        run = config
        try:
            if LRScaling(config.lr_scaling) is not LRScaling.NONE:
                # a fresh Session scales from its own starting batch (a factor of 1), so the
                # ladder applies the rule from the baseline's batch itself
                run = run.replace(lr=scaled_lr(config, reference, world))
            horizon_set = any(r is not None and "total_steps" in r.changes for r in parsed[: i + 1])
            if LRSchedule(config.lr_schedule) is not LRSchedule.CONSTANT and not horizon_set:
                # the schedule spans the rung's own run
                run = run.replace(
                    total_steps=rung_steps, warmup_steps=min(int(config.warmup_steps), rung_steps)
                )
        except ValueError as exc:  # a scaled LR or a horizon past TrainConfig's bounds
            problems += [
                f"rung {i + 1} {shown(rung.name)}: {rung_steps:,} steps over {budget:,} "
                f"samples: {line}"
                for line in problem_lines(exc)
            ]
            continue
        out.append(PlannedRung(rung.name, dict(rung.changes), run, world, eff, rung_steps))
    return out


def _check_runtime(
    planned: Sequence[PlannedRung],
    model: str,
    model_options: dict[str, Any] | None,
    device: str,
    launcher: str,
    timeout: float | None,
    problems: list[str],
) -> Any:
    """What this machine cannot run of each rung (the Session's and the launcher's own
    checks), found by building the model once; returns the model's description for the
    estimator (its ModelInfo, or a parameter count)."""
    import torch

    from workbench.models.spec import build_from_spec, resolve_model
    from workbench.modelstats import count_parameters
    from workbench.train.changes import session_problems
    from workbench.train.launch import validate_launch

    try:
        kwargs = build_from_spec(model, model_options)
        resolved = resolve_model(
            kwargs["model"],
            data=kwargs.get("data"),
            loss_fn=kwargs.get("loss_fn"),
            model_options=kwargs.get("model_options"),
            seed=int(planned[0].config.seed),
        )
    except Exception as exc:  # the model's own code, whatever it raises: said, not a traceback
        text = " ".join(str(exc).split())
        if not isinstance(exc, ValueError):
            text = f"{type(exc).__name__}: {text}"
        problems.append(f"model={shown(model)}: {text}")
        return None
    description = resolved.info if resolved.info is not None else count_parameters(resolved.module)
    for i, rung in enumerate(planned):
        where = f"rung {i + 1} {shown(rung.name)}"
        lines = session_problems(
            rung.config,
            set(),
            model=resolved.module,
            device=torch.device(device),
            world_size=rung.ranks,
            data=resolved.data,
        )
        if rung.ranks > 1:
            try:
                validate_launch(
                    rung.config,
                    rung.ranks,
                    model,
                    rung.steps,
                    launcher,
                    timeout,
                    None,
                    model_options,
                )
            except ValueError as exc:
                said = {line.split(":", 1)[0] for line in lines}
                # the launcher's own wording of a problem the Session already named is left out
                lines += [
                    part
                    for part in " ".join(str(exc).split()).split("; ")
                    if part.split(":", 1)[0] not in said
                ]
        problems += [f"{where}: {line}" for line in lines]
    return description


# --------------------------------------------------------------------------- running
def ladder(
    rungs: Sequence[Any] | None = None,
    model: str = "tiny-gpt",
    steps: int = 32,
    target_loss: float | None = None,
    *,
    base: TrainConfig | None = None,
    model_options: dict[str, Any] | None = None,
    repeats: int = 3,
    lr_scaling: str = "linear",
    ranks: int | None = None,
    compile: bool = False,
    checkpointing: bool = False,
    device: str | None = None,
    launcher: str = "torchrun",
    memory: bool = True,
    timeout: float | None = None,
    progress: bool | None = None,
    on_progress: Callable[[LadderProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> LadderResult:
    """Measure what each rung of an optimization ladder buys (see the module docstring).

    `rungs`: None for `default_rungs(...)` (with `ranks`, `lr_scaling`, `compile`,
    `checkpointing`), or a list of rungs: mappings of settings with an optional "name"
    (`{"name": "+ AMP", "precision": "amp-bf16"}`), (name, changes) pairs or `Rung`s;
    the first is the baseline. `model`: a built-in name or a factory 'pkg.module:function'
    (`model_options` go to it). `steps`: the baseline's optimizer steps; they set the
    sample budget every rung trains on. `target_loss`: also report the steps and time to
    reach it (a loss never reached is reported, not an error). `base`: the settings the
    baseline starts from (default `TrainConfig()`; its checkpoint settings are dropped:
    the runs write no checkpoints). `repeats`: runs per rung, interleaved.
    `device`: "auto" (default: the base config's), "cpu" or "cuda". `launcher`: for
    data-parallel rungs, "torchrun" or "deepspeed". `memory`: measure each rung's memory
    next to the prediction (once per rung). `timeout`: seconds per multi-rank launch.
    `progress`: a tqdm bar on stderr (None: when stderr is a terminal); `on_progress`:
    called with a `LadderProgress` after every step. `cancel`: a threading.Event; setting
    it stops the ladder at the next step (LadderCancelled).

    Returns a `LadderResult`; bad input raises ValueError before anything runs.
    """
    extra = []
    if progress is not None and not isinstance(progress, bool):
        extra.append(f"progress={shown(progress)}: must be True, False or None")
    if on_progress is not None and not callable(on_progress):
        extra.append(f"on_progress={shown(on_progress)}: must be callable(progress) or None")
    if cancel is not None and not (callable(getattr(cancel, "is_set", None))):
        extra.append(f"cancel={shown(cancel)}: must be a threading.Event or None")
    try:
        plan = plan_ladder(
            rungs,
            model,
            steps,
            target_loss,
            base=base,
            model_options=model_options,
            repeats=repeats,
            lr_scaling=lr_scaling,
            ranks=ranks,
            compile=compile,
            checkpointing=checkpointing,
            device=device,
            launcher=launcher,
            memory=memory,
            timeout=timeout,
        )
    except ValueError as exc:
        if not extra:
            raise
        found = [ln.removeprefix("invalid ladder: ") for ln in problem_lines(exc)]
        raise ValueError(_format(found + extra)) from None
    if extra:
        raise ValueError(_format(extra))
    return run_plan(plan, progress=progress, on_progress=on_progress, cancel=cancel)


def run_plan(
    plan: LadderPlan,
    *,
    progress: bool | None = None,
    on_progress: Callable[[LadderProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> LadderResult:
    """Run a checked ladder (`plan_ladder`): every rung `plan.repeats` times, interleaved."""
    import torch

    runs: list[list[RunMeasure]] = [[] for _ in plan.rungs]
    load = [_load_average()]
    failed: set[int] = set()
    counter = _Counter(plan, on_progress)
    with _progress_bar(plan, progress) as bar:
        counter.bar = bar
        for repeat in range(plan.repeats):
            order = list(range(len(plan.rungs)))
            if repeat % 2:
                order.reverse()  # ABC, CBA, ...: a drifting machine favours no rung
            for index in order:
                if index in failed:
                    continue
                counter.begin(index, repeat)
                measure = _run_rung(plan, index, repeat == 0 and plan.memory, counter, cancel)
                runs[index].append(measure)
                if measure.error is not None:
                    failed.add(index)
                    if index == 0:
                        raise RuntimeError(
                            f"the baseline rung {plan.rungs[0].name!r} failed: {measure.error}"
                        )
    load.append(_load_average())
    busiest = max((x for x in load if x is not None), default=None)
    setup = {
        "model": plan.model,
        "model_options": plan.model_options,
        "device": plan.device,
        "device_name": torch.cuda.get_device_name() if plan.device == "cuda" else _cpu_name(),
        "threads": torch.get_num_threads(),
        "samples": plan.samples,
        "steps": plan.rungs[0].steps,
        "repeats": plan.repeats,
        "target_loss": plan.target_loss,
        "lr_scaling": plan.lr_scaling,
        "launcher": plan.launcher,
        "torch": torch.__version__,
        "load_average": busiest,
        "cores": os.cpu_count(),
    }
    notes = [
        f"every rung trains on the same {plan.samples} samples in the same order (seed "
        f"{plan.rungs[0].config.seed}); {plan.repeats} repeat(s) interleaved; samples/s: "
        "the median of every step after each run's first, [25th-75th percentile]; ratios: "
        "[the lowest-highest the percentiles allow]",
        "time: the rung's samples at its median step time; one-off costs (first step, "
        "start-up) are reported apart",
        *plan.notes,
    ]
    if busiest is not None and busiest > (os.cpu_count() or 1):
        notes.append(
            f"the machine was busy: load average {busiest:.1f} on {os.cpu_count()} cores; "
            "other work slows some steps (the spread shows how much)"
        )
    return summarize(
        [r.report_plan() for r in plan.rungs],
        runs,
        setup=setup,
        target_loss=plan.target_loss,
        notes=notes,
    )


def _load_average() -> float | None:
    """The machine's 1-minute load average (None where the system has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


class _Counter:
    """Counts the steps trained so far and reports them (tqdm bar, on_progress)."""

    def __init__(self, plan: LadderPlan, on_progress: Callable[[LadderProgress], None] | None):
        self.plan = plan
        self.on_progress = on_progress
        self.done = 0
        self.index = 0
        self.repeat = 0
        self.bar: Any = None

    def begin(self, index: int, repeat: int) -> None:
        self.index, self.repeat = index, repeat
        if self.bar is not None:
            self.bar.set_description(
                f"{self.plan.rungs[index].name} ({repeat + 1}/{self.plan.repeats})", refresh=True
            )
        self._report(None)

    def step(self, loss: float | None) -> None:
        self.done += 1
        if self.bar is not None:
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
            self.bar.update(1)
        self._report(loss)

    def skip(self, steps: int) -> None:
        """Steps a failed run will not train, so the total still adds up."""
        self.done += steps
        if self.bar is not None:
            self.bar.update(steps)

    def _report(self, loss: float | None) -> None:
        if self.on_progress is not None:
            self.on_progress(
                LadderProgress(
                    done=self.done,
                    total=self.plan.total_steps,
                    rung=self.plan.rungs[self.index].name,
                    rung_index=self.index,
                    repeat=self.repeat,
                    repeats=self.plan.repeats,
                    loss=loss,
                )
            )


@contextmanager
def _progress_bar(plan: LadderPlan, show: bool | None) -> Iterator[Any]:
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        yield None
        return
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar = tqdm(total=plan.total_steps, unit="step", desc="ladder", leave=True)
    try:
        yield bar
    finally:
        bar.close()


def _run_rung(
    plan: LadderPlan,
    index: int,
    want_memory: bool,
    counter: _Counter,
    cancel: threading.Event | None,
) -> RunMeasure:
    rung = plan.rungs[index]
    before = counter.done
    if rung.ranks > 1:
        measure = _run_ranks(plan, rung, want_memory, counter, cancel)
    else:
        measure = _run_here(plan, rung, want_memory, counter, cancel)
    if cancel is not None and cancel.is_set():
        raise LadderCancelled("the ladder was cancelled")
    missing = rung.steps - (counter.done - before)
    if missing > 0:
        counter.skip(missing)
    return measure


def _run_here(
    plan: LadderPlan,
    rung: PlannedRung,
    want_memory: bool,
    counter: _Counter,
    cancel: threading.Event | None,
) -> RunMeasure:
    """One run of a one-rank rung: a fresh Session in this process."""
    from workbench.models.spec import build_from_spec
    from workbench.train.session import Session

    start = time.perf_counter()
    try:
        session = Session(
            rung.config, device=plan.device, **build_from_spec(plan.model, plan.model_options)
        )
    except Exception as exc:
        return RunMeasure((), (), 0.0, error=f"{type(exc).__name__}: {exc}")
    try:

        def on_record(record: Any) -> None:
            counter.step(record.loss)
            if cancel is not None and cancel.is_set():
                session.stop()  # from the training thread: stops after this step

        session.on_record(on_record)
        try:
            records = session.run(rung.steps, progress=False)
        except Exception as exc:
            return RunMeasure((), (), 0.0, error=f"{type(exc).__name__}: {exc}")
        wall = time.perf_counter() - start
        notes = _oom_notes(records, rung)
        mem: dict[str, Any] = {}
        if want_memory and not (cancel is not None and cancel.is_set()):
            mem = _memory_here(session, plan.device)
        return RunMeasure(
            step_seconds=tuple(r.step_seconds for r in records),
            losses=tuple(r.loss for r in records),
            wall_seconds=wall,
            notes=notes,
            **mem,
        )
    finally:
        session.close()


def _oom_notes(records: Sequence[Any], rung: PlannedRung) -> tuple[str, ...]:
    shrunk = [r for r in records if r.micro_batch != rung.config.micro_batch]
    if not shrunk:
        return ()
    return (
        f"out of memory at micro-batch {rung.config.micro_batch}: the session halved it to "
        f"{shrunk[-1].micro_batch} (same effective batch)",
    )


def _memory_here(session: Any, device: str) -> dict[str, Any]:
    """Measured next to predicted, from `session.memory()`: the CUDA peak of a probe step
    on a GPU; on a CPU the model states and one micro-batch's activations counted from
    the tensors (a CPU has no per-allocation peak counter)."""
    try:
        report = session.memory()
    except Exception as exc:
        return {"memory_note": f"not measured: {type(exc).__name__}: {exc}"}
    pred = report.predicted
    if device == "cuda" and report.cuda_max_allocated_bytes is not None:
        return {
            "memory_measured_bytes": int(report.cuda_max_allocated_bytes),
            "memory_predicted_bytes": None if pred is None else int(pred.total_bytes),
            "memory_note": "CUDA peak of a probe step (session.memory()) vs the estimator's total",
        }
    states = (
        report.params_bytes
        + report.grads_bytes
        + report.optimizer_bytes
        - report.optimizer_step_counter_bytes
    )
    if pred is None or report.predicted_activation_bytes is None:
        # the estimator predicts activations for transformer shapes only: compare what
        # both count
        return {
            "memory_measured_bytes": int(states),
            "memory_predicted_bytes": None
            if pred is None
            else int(pred.params_bytes + pred.grads_bytes + pred.optimizer_bytes),
            "memory_note": "model states, counted from the tensors (session.memory()), vs the "
            "estimator's (it predicts activations for transformer shapes only)",
        }
    return {
        "memory_measured_bytes": int(states + report.activation_bytes),
        "memory_predicted_bytes": int(
            pred.params_bytes
            + pred.grads_bytes
            + pred.optimizer_bytes
            + report.predicted_activation_bytes
        ),
        "memory_note": "model states + one micro-batch's activations, counted from the tensors "
        "(session.memory()), vs the estimator's",
    }


def _run_ranks(
    plan: LadderPlan,
    rung: PlannedRung,
    want_memory: bool,
    counter: _Counter,
    cancel: threading.Event | None,
) -> RunMeasure:
    """One run of a data-parallel rung: `launch_ranks` (the real launcher, one process
    per rank). Step times are rank 0's (the ranks meet in every step's all-reduce); a
    step's loss is the mean of the ranks' losses (each over its own shard)."""
    from workbench.train.launch import launch_ranks

    def on_record(record: Any) -> None:
        if cancel is not None and cancel.is_set():
            raise LadderCancelled("the ladder was cancelled")  # ends every rank at once
        if record.rank == 0:
            counter.step(record.loss)

    start = time.perf_counter()
    try:
        result = launch_ranks(
            rung.config,
            ranks=rung.ranks,
            model=plan.model,
            steps=rung.steps,
            launcher=plan.launcher,
            on_record=on_record,
            timeout=plan.timeout,
            model_options=plan.model_options,
        )
    except LadderCancelled:
        return RunMeasure((), (), 0.0, error="cancelled")
    wall = time.perf_counter() - start
    if not result.ok:
        return RunMeasure((), (), wall, error=str(result.first_error or "the launch failed"))
    by_rank = result.records
    first = by_rank[0]
    losses = []
    for i in range(len(first)):
        values = [recs[i].loss for recs in by_rank.values() if i < len(recs)]
        losses.append(sum(values) / len(values))
    mem: dict[str, Any] = {}
    if want_memory:
        mem = _memory_ranks(plan, rung, result)
    return RunMeasure(
        step_seconds=tuple(r.step_seconds for r in first),
        losses=tuple(losses),
        wall_seconds=wall,
        notes=(
            f"start-up: {rung.ranks} processes launched with {plan.launcher} for every run "
            "(the wall time outside the steps)",
        ),
        **mem,
    )


def _memory_ranks(plan: LadderPlan, rung: PlannedRung, result: Any) -> dict[str, Any]:
    """Per-rank memory from the launch result: the largest rank's CUDA peak over training
    on GPUs; on CPUs the model states counted from each rank's tensors; each next to the
    prediction for the same quantity."""
    if plan.device == "cuda":
        peaks = [
            r.cuda_max_allocated_bytes
            for recs in result.records.values()
            for r in recs
            if r.cuda_max_allocated_bytes is not None
        ]
        predicted = None
        if plan.model_description is not None:
            from workbench.prediction import predict_memory

            try:
                predicted = predict_memory(
                    rung.config, plan.model_description, rung.ranks
                ).total_bytes
            except ValueError:
                predicted = None
        return {
            "memory_measured_bytes": max(peaks) if peaks else None,
            "memory_predicted_bytes": predicted,
            "memory_note": "the largest rank's CUDA peak over training vs the estimator's "
            "per-rank total",
        }
    states = [
        r.params_bytes + r.grads_bytes + r.optimizer_bytes
        for r in result.ranks
        if None not in (r.params_bytes, r.grads_bytes, r.optimizer_bytes)
    ]
    pred = result.ranks[0].predicted if result.ranks else None
    return {
        "memory_measured_bytes": max(states) if states else None,
        "memory_predicted_bytes": None
        if not pred
        else int(pred["params_bytes"] + pred["grads_bytes"] + pred["optimizer_bytes"]),
        "memory_note": "model states per rank (parameters, gradients, optimizer states), "
        "counted from each rank's tensors, vs the estimator's",
    }
