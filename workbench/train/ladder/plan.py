"""Planning a ladder: its arguments as one `LadderSpec`, checked, and what every rung
will train (`plan_ladder` -> `LadderPlan`), before anything runs.

Fairness: every rung trains on the same samples in the same order: `steps` optimizer
steps of the baseline make the sample budget (`steps x` the baseline's effective batch),
and a rung with a larger effective batch takes fewer, larger steps over the same samples
(same seed: same initial weights and data order; data-parallel ranks read disjoint shards
of the same order). Each rung's learning rate is scaled from the baseline's effective
batch by the rule it names, and its schedule spans its own steps.

Bad input (an unknown setting in a rung, a rung that changes nothing, zero steps, a budget
a rung's effective batch does not divide, a setting this machine cannot run) raises one
`LadderError` (a ValueError) holding every problem as data (`LadderProblem`s); planning builds the model once to check what this
machine can run and trains nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, NoReturn, overload

from workbench.config import LRScaling, LRSchedule, TrainConfig
from workbench.inputs import shown
from workbench.train.ladder.problems import LadderError, LadderProblem, in_rung, of_error, said
from workbench.train.ladder.report import RungPlan
from workbench.train.ladder.rungs import (
    KINDS,
    MAX_RUNGS,
    Rung,
    available_ranks,
    cumulative_configs,
    default_rungs,
    memory_rungs,
    read_rung,
)

#: The baseline's optimizer steps: a ladder measures speed; more is a training run.
MAX_STEPS = 10**6
#: Runs per rung: the median of more changes nothing.
MAX_REPEATS = 1000


@dataclass(frozen=True)
class LadderSpec:
    """A ladder's arguments, as `ladder` and `plan_ladder` take them (see `ladder` for
    each); `check()` names the problems of the arguments themselves, `plan_ladder(spec)`
    plans it."""

    rungs: Sequence[Any] | None = None
    model: str = "tiny-gpt"
    steps: int = 32
    target_loss: float | None = None
    _: KW_ONLY
    base: TrainConfig | None = None
    model_options: dict[str, Any] | None = None
    repeats: int = 3
    lr_scaling: str = "linear"
    ranks: int | None = None
    compile: bool = False
    checkpointing: bool = False
    model_parallel: bool = False
    device: str | None = None
    launcher: str = "torchrun"
    memory: bool = True
    timeout: float | None = None
    kind: str = "speed"

    @classmethod
    def of(cls, caller: str, args: Sequence[Any], keywords: Mapping[str, Any]) -> LadderSpec:
        """The spec `caller` (a function's name, for the TypeError) was called with: a
        LadderSpec first (its fields replaced by any keywords), or the arguments of
        `LadderSpec(...)` themselves."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in keywords if k not in known]
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        if args and isinstance(args[0], LadderSpec):
            if len(args) > 1:
                raise TypeError(f"{caller}(spec, ...): the spec's fields go as keywords")
            return dataclasses.replace(args[0], **keywords)
        return cls(*args, **keywords)

    def check(self) -> tuple[str | None, list[LadderProblem]]:
        """(the device every rung runs on, None when it is bad; the problems of the
        arguments themselves, each naming its argument). Reads no rung, builds nothing."""
        from workbench.models.spec import spec_problems
        from workbench.train.launch import LAUNCHERS

        problems = number_problems(
            steps=self.steps,
            repeats=self.repeats,
            target_loss=self.target_loss,
            ranks=self.ranks,
            timeout=self.timeout,
            model_options=self.model_options,
        )
        if self.lr_scaling not in LRScaling.choices():
            problems.append(
                LadderProblem(
                    "lr_scaling",
                    self.lr_scaling,
                    f"must be one of {', '.join(LRScaling.choices())}",
                )
            )
        for flag in ("compile", "checkpointing", "model_parallel", "memory"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                problems.append(LadderProblem(flag, value, "must be True or False"))
        if self.kind not in KINDS:
            problems.append(LadderProblem("kind", self.kind, f"must be one of {', '.join(KINDS)}"))
        elif self.kind == "memory":
            for flag in ("compile", "checkpointing", "model_parallel"):
                if getattr(self, flag) is True:
                    problems.append(
                        LadderProblem(
                            flag,
                            True,
                            "belongs to the speed ladder; the memory ladder has its own rungs",
                        )
                    )
            if self.rungs is not None:
                problems.append(
                    LadderProblem("rungs", "given", "the memory ladder has its own rungs")
                )
        if self.base is not None and not isinstance(self.base, TrainConfig):
            problems.append(
                LadderProblem("base", self.base, "must be a workbench.TrainConfig or None")
            )
        if self.launcher not in LAUNCHERS:
            problems.append(
                LadderProblem("launcher", self.launcher, f"must be one of {', '.join(LAUNCHERS)}")
            )
        problems += in_rung(spec_problems(self.model))
        dev = _device(self.device, self.base, problems)
        rungs = self.rungs
        if rungs is not None and (
            isinstance(rungs, (str, bytes, Mapping)) or not isinstance(rungs, Sequence)
        ):
            problems.append(
                LadderProblem(
                    "rungs", rungs, "must be a list of rungs or None (the default ladder)"
                )
            )
        elif rungs is not None and len(rungs) > MAX_RUNGS:
            problems.append(
                LadderProblem(
                    "rungs",
                    rungs,
                    f"{len(rungs):,} rungs; at most {MAX_RUNGS} (each runs "
                    f"{shown(self.repeats)} time(s): more would take days)",
                    value_text="",
                )
            )
        return dev, problems


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
    kind: str = "speed"  # "memory": the memory ladder (`memory_rungs`)

    @property
    def total_steps(self) -> int:
        """Optimizer steps the whole ladder trains (all rungs, all repeats)."""
        return self.repeats * sum(r.steps for r in self.rungs)


# --------------------------------------------------------------------------- checking
def _is_number(v: Any) -> bool:
    """A finite real number (a NumPy scalar too), never a bool."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool) or type(v).__name__ == "bool_":
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def number_problems(
    *,
    steps: Any = 32,
    repeats: Any = 3,
    target_loss: Any = None,
    ranks: Any = None,
    timeout: Any = None,
    model_options: Any = None,
) -> list[LadderProblem]:
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
        else LadderProblem("target_loss", target_loss, "must be a finite number or None"),
        seconds_problem("timeout", timeout),
        options_problem("model_options", model_options),
    ]
    return in_rung(p for p in found if p is not None)


#: The devices a ladder runs on (`device=`; None: the base config's).
DEVICES = ("auto", "cpu", "cuda")


def _device(device: Any, base: Any, problems: list[LadderProblem]) -> str | None:
    """The device every rung runs on: "cpu" or "cuda" (from `device`, else the base
    config's, "auto" taking CUDA when available)."""
    from workbench.config import ConfigError
    from workbench.train.devices import resolve_device

    if device is not None and not isinstance(device, str):
        problems.append(LadderProblem("device", device, "must be 'auto', 'cpu', 'cuda' or None"))
        return None
    if device is not None and device not in DEVICES:
        problems.append(LadderProblem("device", device, "must be 'auto', 'cpu' or 'cuda'"))
        return None
    configured = str(base.device) if isinstance(base, TrainConfig) else "auto"
    try:
        dev = resolve_device(None, configured if device is None else device)
    except ConfigError as exc:  # CUDA asked for where there is none: said as resolve_device says
        problems += in_rung(exc.problems)
        return None
    except ValueError as exc:  # the environment's LOCAL_RANK
        problems.append(said(" ".join(str(exc).split())))
        return None
    return dev.type


# --------------------------------------------------------------------------- planning
@overload
def plan_ladder(spec: LadderSpec, /, **changes: Any) -> LadderPlan: ...


@overload
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
    model_parallel: bool = False,
    device: str | None = None,
    launcher: str = "torchrun",
    memory: bool = True,
    timeout: float | None = None,
    kind: str = "speed",
) -> LadderPlan: ...


def plan_ladder(*args: Any, **keywords: Any) -> LadderPlan:
    """Check a ladder and return what it will run; one ValueError naming every problem
    otherwise. Takes `ladder`'s arguments (see there; without `progress`, `on_progress`
    and `cancel`), or a `LadderSpec` (keywords replace its fields). Builds the model once
    to check what this machine can run; trains nothing.

    The typed signatures (the overloads above: `LadderSpec`'s fields, which a test holds
    equal to them) are what type checkers see; the arguments themselves are checked as
    `LadderSpec(...)`, every problem at once."""
    return plan_spec(LadderSpec.of("plan_ladder", args, keywords))


# help() and notebooks show the keywords: LadderSpec's fields
plan_ladder.__signature__ = inspect.signature(LadderSpec).replace(  # type: ignore[attr-defined]
    return_annotation="LadderPlan"
)


def plan_spec(spec: LadderSpec, *, also: Sequence[LadderProblem] = ()) -> LadderPlan:
    """`plan_ladder` of a spec. `also`: problems the caller found in arguments of its own,
    raised after the spec's in the same LadderError (alone when the spec has none)."""

    def fail(found: Sequence[LadderProblem]) -> NoReturn:
        raise LadderError([*found, *also])

    dev, problems = spec.check()
    if problems:
        fail(problems)
    assert dev is not None
    steps, repeats = int(spec.steps), int(spec.repeats)
    ranks = None if spec.ranks is None else int(spec.ranks)
    target_loss = None if spec.target_loss is None else float(spec.target_loss)
    timeout = None if spec.timeout is None else float(spec.timeout)
    # the runs measure; they write no checkpoints (a rung may still ask for them)
    start = (spec.base or TrainConfig()).replace(
        device=dev, checkpoint_dir=None, checkpoint_every_steps=None, checkpoint_every_seconds=None
    )
    rungs = spec.rungs
    default = rungs is None
    if rungs is None and spec.kind == "memory":
        rungs = memory_rungs()
    elif rungs is None:
        rungs = default_rungs(
            device=dev,
            ranks=ranks,
            lr_scaling=spec.lr_scaling,
            compile=spec.compile,
            checkpointing=spec.checkpointing,
            model_parallel=spec.model_parallel,
            micro_batch=int(start.micro_batch),
        )
    elif not rungs:
        fail([LadderProblem("rungs", rungs, "name at least the baseline rung")])
    parsed = [read_rung(r, i, problems) for i, r in enumerate(rungs)]
    names = [r.name for r in parsed if r is not None]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(said(f"rung name {shown(name)}: used twice; give every rung its own name"))
    configs = cumulative_configs(parsed, start, problems)
    if problems:
        fail(problems)
    budget = steps * configs[0][0].effective_batch_size(configs[0][1])
    planned = _planned(parsed, configs, budget, steps, spec.lr_scaling, problems)
    if problems:
        fail(problems)
    description = _check_runtime(
        planned, spec.model, spec.model_options, dev, spec.launcher, timeout, problems
    )
    if problems:
        fail(problems)
    if also:
        fail([])
    notes = []
    if default and spec.kind == "speed" and not any(p.ranks > 1 for p in planned):
        notes.append(
            f"no data-parallel rung: {available_ranks(dev) if ranks is None else ranks} "
            f"rank(s) {'available' if ranks is None else 'asked for'} (it needs 2 or more)"
        )
    return LadderPlan(
        rungs=tuple(planned),
        model=spec.model,
        model_options=dict(spec.model_options) if spec.model_options else None,
        device=dev,
        samples=budget,
        repeats=repeats,
        target_loss=target_loss,
        lr_scaling=spec.lr_scaling,
        launcher=spec.launcher,
        memory=spec.memory,
        timeout=timeout,
        model_description=description,
        notes=tuple(notes),
        kind=spec.kind,
    )


def _planned(
    parsed: Sequence[Rung | None],
    configs: Sequence[tuple[TrainConfig, int]],
    budget: int,
    steps: int,
    lr_scaling: str,
    problems: list[LadderProblem],
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
                said(
                    f"every rung trains on the same {budget} samples (steps={steps} x the "
                    f"baseline's effective batch {reference}), which its effective batch {eff} "
                    f"must divide into at least 2 steps; use steps={fitting // reference}",
                    where=f"rung {i + 1} {shown(rung.name)}",
                )
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
            problems += of_error(
                exc,
                where=f"rung {i + 1} {shown(rung.name)}: {rung_steps:,} steps over {budget:,} "
                "samples",
            )
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
    problems: list[LadderProblem],
) -> Any:
    """What this machine cannot run of each rung (the Session's and the launcher's own
    checks), found by building the model once; returns the model's description for the
    estimator (its ModelInfo, or a parameter count)."""
    import torch

    from workbench.models.spec import build_from_spec, resolve_model
    from workbench.modelstats import count_parameters
    from workbench.train.changes import session_problems
    from workbench.train.launch import launch_problems

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
        problems.append(LadderProblem("model", model, text))
        return None
    description = resolved.info if resolved.info is not None else count_parameters(resolved.module)
    for i, rung in enumerate(planned):
        found = session_problems(
            rung.config,
            set(),
            model=resolved.module,
            device=torch.device(device),
            world_size=rung.ranks,
            data=resolved.data,
        )
        if rung.ranks > 1:
            named = {(p.field, shown(p.value)) for p in found}
            # the launcher's own wording of a setting the Session already refused is left out
            found += [
                p
                for p in launch_problems(
                    rung.config,
                    rung.ranks,
                    model,
                    rung.steps,
                    launcher,
                    timeout,
                    None,
                    model_options,
                )
                if (p.field, shown(p.value)) not in named
            ]
        problems += in_rung(found, where=f"rung {i + 1} {shown(rung.name)}")
    return description
