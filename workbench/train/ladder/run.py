"""Running a planned ladder: every rung `repeats` times, interleaved, each run a fresh
`Session` in this process or `launch_ranks` for several ranks; what each run measured
(step times, losses, memory next to the prediction) and the machine it ran on.

Rungs are repeated `repeats` times, interleaved (the order reversed on every other
repeat, so a machine that speeds up or slows down over time favours no rung), and the
figures are medians with their spread (`workbench.train.ladder.report`). The runs use the
public API of `Session` and `launch_ranks` only (records, `memory()`, the launch result's
per-rank figures). A target loss never reached is reported in the result, not an error.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, overload

from workbench.config import TrainConfig
from workbench.train.ladder.plan import LadderPlan, LadderSpec, PlannedRung, plan_spec
from workbench.train.ladder.problems import LadderProblem
from workbench.train.ladder.report import LadderResult, RunMeasure, summarize


class LadderCancelled(RuntimeError):
    """The ladder was cancelled (`cancel` was set) before it finished."""


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


@overload
def ladder(
    spec: LadderSpec,
    /,
    *,
    progress: bool | None = None,
    on_progress: Callable[[LadderProgress], None] | None = None,
    cancel: threading.Event | None = None,
    **changes: Any,
) -> LadderResult: ...


@overload
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
    model_parallel: bool = False,
    device: str | None = None,
    launcher: str = "torchrun",
    memory: bool = True,
    timeout: float | None = None,
    kind: str = "speed",
    progress: bool | None = None,
    on_progress: Callable[[LadderProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> LadderResult: ...


def ladder(
    *args: Any,
    progress: bool | None = None,
    on_progress: Callable[[LadderProgress], None] | None = None,
    cancel: threading.Event | None = None,
    **keywords: Any,
) -> LadderResult:
    """Measure what each rung of an optimization ladder buys (see `workbench.train.ladder`).

    Takes a `LadderSpec`'s fields (`rungs`, `model`, `steps`, `target_loss` also by
    position; the rest by keyword), or a `LadderSpec` (keywords replace its fields), and
    the run's own `progress`, `on_progress` and `cancel`.

    `rungs`: None for `default_rungs(...)` (with `ranks`, `lr_scaling`, `compile`,
    `checkpointing`, `model_parallel`), or a list of rungs: mappings of settings with an optional "name"
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
    `kind`: "speed" (the default ladder above) or "memory" (`memory_rungs`: the memory
    techniques cumulative, each rung's notes saying what it frees and what it costs).
    `progress`: a tqdm bar on stderr (None: when stderr is a terminal); `on_progress`:
    called with a `LadderProgress` after every step. `cancel`: a threading.Event; setting
    it stops the ladder at the next step (LadderCancelled).

    Returns a `LadderResult`; bad input raises `LadderError` (a ValueError whose
    `.problems` are `LadderProblem`s) before anything runs. Type checkers see the typed
    signatures of the overloads above (`LadderSpec`'s fields and the run's own, held
    equal to them by a test).
    """
    spec = LadderSpec.of("ladder", args, keywords)
    extra = []
    if progress is not None and not isinstance(progress, bool):
        extra.append(LadderProblem("progress", progress, "must be True, False or None"))
    if on_progress is not None and not callable(on_progress):
        extra.append(
            LadderProblem("on_progress", on_progress, "must be callable(progress) or None")
        )
    if cancel is not None and not (callable(getattr(cancel, "is_set", None))):
        extra.append(LadderProblem("cancel", cancel, "must be a threading.Event or None"))
    plan = plan_spec(spec, also=extra)
    return run_plan(plan, progress=progress, on_progress=on_progress, cancel=cancel)


_RUN_OPTIONS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
    for name, kind in (
        ("progress", "bool | None"),
        ("on_progress", "Callable[[LadderProgress], None] | None"),
        ("cancel", "threading.Event | None"),
    )
]
# help() and notebooks show the keywords: LadderSpec's fields and the run's own
ladder.__signature__ = inspect.signature(LadderSpec).replace(  # type: ignore[attr-defined]
    parameters=[*inspect.signature(LadderSpec).parameters.values(), *_RUN_OPTIONS],
    return_annotation="LadderResult",
)


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
                if index in failed:  # not run again; its steps still count as done
                    counter.skip(plan.rungs[index].steps)
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
        "kind": plan.kind,
    }
    notes = [
        f"every rung trains on the same {plan.samples} samples in the same order (seed "
        f"{plan.rungs[0].config.seed}); {plan.repeats} repeat(s) interleaved; samples/s: "
        "all samples over all seconds of the steps after each run's first, [the 25th-75th "
        "percentile of that ratio over windows of a few steps]; ratios: [the lowest-highest "
        "the percentiles allow]",
        "time: the rung's samples at its samples/s; one-off costs (first step, start-up) are "
        "reported apart",
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
            losses=tuple(float(r.loss) for r in records if r.loss is not None),
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
    # under compile: the activations its partitioner recomputes, which the prediction's
    # total (the formula's eager activations) still holds (workbench.estimate.compiled)
    peak = getattr(pred, "peak", None)
    not_kept = peak.compile_not_kept_bytes if peak is not None else 0
    if device == "cuda" and report.cuda_max_allocated_bytes is not None:
        return {
            "memory_measured_bytes": int(report.cuda_max_allocated_bytes),
            "memory_predicted_bytes": None if pred is None else int(pred.total_bytes) - not_kept,
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
        # a Session's records always hold their loss (None is an observer's "unknown")
        values = [float(recs[i].loss or 0.0) for recs in by_rank.values() if i < len(recs)]
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
