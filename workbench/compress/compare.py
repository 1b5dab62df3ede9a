"""Compress a model with several methods and measure each against the model before.

    report = compress(model, held_out, loss_fn, methods=["int8", "prune", "channels"])
    print(report)                       # the table, with a verdict per method
    report.chart()                      # the same as bars
    small = report.models["channels"]   # the compressed copies

`compare(before, {"name": model, ...}, held_out, loss_fn)` measures models you compressed
(or distilled) yourself the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench.compress.layers import (
    Compressed,
    check_model,
    raise_problems,
    sparsity_problem,
)
from workbench.compress.measure import (
    disk_bytes,
    evaluate,
    first_batch,
    latencies,
    stop_if_cancelled,
    weights_bytes,
    zero_fraction,
)
from workbench.compress.prune import prune_structured, prune_unstructured
from workbench.compress.quantize import ENGINES, quantize_int8
from workbench.compress.report import (
    MAX_ACCURACY_DROP,
    MAX_LOSS_RATIO,
    CompressionReport,
    Figures,
    QualityTolerance,
    Row,
    tolerance_problems,
    verdict_of,
)
from workbench.inputs import shown
from workbench.problems import SettingProblem
from workbench.spread import spread

#: Method names `compress` takes; "a+b" applies a, then b (quantize last: "channels+int8").
METHODS = ("int8", "prune", "channels", "heads")
DEFAULT_METHODS = ("int8", "prune", "channels")
BEFORE = "before"


def _cancel_problems(cancel: Any) -> list[str]:
    if cancel is None or callable(getattr(cancel, "is_set", None)):
        return []
    return [f"cancel={shown(cancel)}: must be a threading.Event or None"]


def _positive_int(name: str, value: Any, minimum: int = 1) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{name}={shown(value)}: must be an integer >= {minimum}"
    return None


def method_problems(methods: Any) -> list[SettingProblem]:
    """What is wrong with a list of method names (empty when all are usable), each a
    problem of `methods` with the list, or the one method it is about, as its value."""
    if isinstance(methods, str) or not isinstance(methods, Iterable):
        return [
            SettingProblem(
                "methods", methods, f"must be a list of method names ({', '.join(METHODS)})"
            )
        ]
    names = list(methods)
    if not names:
        return [SettingProblem("methods", [], f"name at least one of {', '.join(METHODS)}")]
    problems = []
    for spec in names:
        steps = spec.split("+") if isinstance(spec, str) else [spec]
        bad = [s for s in steps if s not in METHODS]
        if bad:
            problems.append(
                SettingProblem(
                    "methods",
                    spec,
                    f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}, or join "
                    "them with '+' (e.g. 'channels+int8')",
                )
            )
        elif "int8" in steps[:-1]:
            problems.append(
                SettingProblem(
                    "methods",
                    spec,
                    "int8 must come last (the other methods start from float weights), e.g. "
                    "'channels+int8'",
                )
            )
    if len(set(map(str, names))) != len(names):
        problems.append(SettingProblem("methods", names, "each method once"))
    return problems


def apply_method(model: nn.Module, spec: str, *, sparsity: float, engine: str) -> Compressed:
    """`spec` ("int8", "prune", "channels", "heads", or steps joined by '+') applied to a
    copy of `model`."""
    current = model
    layers: list[str] = []
    skipped: list[str] = []
    notes: list[str] = []
    why: list[tuple[str, str]] = []
    for step in spec.split("+"):
        if step == "int8":
            done = quantize_int8(current, engine=engine)
        elif step == "prune":
            done = prune_unstructured(current, sparsity)
        elif step in ("channels", "heads"):
            done = prune_structured(current, sparsity, unit=step)
        else:
            raise ValueError(f"methods: {shown(spec, 1000)}: unknown method {shown(step)}")
        current = done.model
        layers += [name for name in done.layers if name not in layers]
        skipped += done.skipped
        notes += done.notes
        if done.why_no_gain:
            why.append((step, done.why_no_gain))
    return Compressed(
        model=current,
        method=spec,
        layers=tuple(layers),
        skipped=tuple(skipped),
        notes=tuple(notes),
        why_no_gain="; ".join(reason for _, reason in why),
        why_by_step=tuple(why),
    )


def _reasons_left(c: Compressed, before: Row, rows: list[Row]) -> str:
    """Why `c` may not pay, leaving out the reason of a step of a combination that measured
    faster than the model before on its own (its row above): "channels+int8" slower while
    "channels" alone was faster is int8's doing, not the pruning's."""
    if not c.why_by_step:
        return c.why_no_gain
    alone = {row.method: row for row in rows}
    kept = [
        reason
        for step, reason in c.why_by_step
        if step not in alone or verdict_of(before, alone[step]).latency != "faster"
    ]
    return "; ".join(kept)


def _figures(
    model: nn.Module,
    times: list[float],
    held_out: Dataset[Any] | DataLoader[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    batch_size: int,
    eval_samples: int | None,
    cancel: Any = None,
) -> Figures:
    quality = evaluate(
        model, held_out, loss_fn, batch_size=batch_size, max_samples=eval_samples, cancel=cancel
    )
    latency = spread(times)
    assert latency is not None  # at least 3 timed passes, each a finite number of seconds
    return Figures(
        params_bytes=weights_bytes(model),
        disk_bytes=disk_bytes(model),
        latency_seconds=latency.median,
        latency_p25_seconds=latency.p25,
        latency_p75_seconds=latency.p75,
        latency_min_seconds=min(times),
        latency_samples=len(times),
        loss=quality.loss,
        accuracy=quality.accuracy,
        zero_fraction=zero_fraction(model),
        held_out_samples=quality.samples,
    )


def compare(
    before: nn.Module,
    candidates: Mapping[str, nn.Module | Compressed],
    held_out: Dataset[Any] | DataLoader[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    *,
    batch_size: int = 64,
    repeats: int = 30,
    eval_samples: int | None = None,
    compile: bool = False,
    title: str | None = None,
    cancel: Any = None,
    max_loss_ratio: float = MAX_LOSS_RATIO,
    max_accuracy_drop: float = MAX_ACCURACY_DROP,
    held_out_unseen: bool = True,
) -> CompressionReport:
    """Measure `before` and each candidate (a module, or what a compression function
    returned) on the same held-out data and the same batch: weights and file size,
    latency (median of `repeats` forward passes of the first `batch_size` held-out
    samples, the models taking turns), held-out loss and accuracy (over at most
    `eval_samples` samples; default all). `compile=True` times each model (the one
    before too) after `torch.compile` (compiling takes seconds to minutes per model).
    `loss_fn(outputs, targets)` is the task's loss (None when batches are mappings and the
    model returns its own `.loss`). `cancel`: a threading.Event; setting it stops the
    measurement at the next model or batch with `CompressionCancelled`.
    `max_loss_ratio`, `max_accuracy_drop`: the held-out quality a candidate may lose and
    still pay (`QualityTolerance`: its loss at most that many times the loss before, its
    accuracy at most that many points lower; 1.05 and 1 by default). `held_out_unseen=False`
    when the model may have trained on `held_out` (a checkpoint's own data set): the report
    then calls its quality figures "eval" ones, not "held-out".
    """
    check_model(before)
    problems = []
    if not isinstance(candidates, Mapping) or not candidates:
        problems.append("candidates: must be a non-empty mapping of name -> model")
    else:
        for name, cand in candidates.items():
            if not isinstance(name, str) or not name or name == BEFORE:
                problems.append(
                    f"candidates: name {shown(name)}: must be a non-empty string, not {BEFORE!r}"
                )
            if not isinstance(cand, (nn.Module, Compressed)):
                problems.append(
                    f"candidates[{shown(name)}]: must be an nn.Module or a Compressed result"
                )
    problems += [
        p
        for p in (
            _positive_int("batch_size", batch_size),
            _positive_int("repeats", repeats, 3),
            None if eval_samples is None else _positive_int("eval_samples", eval_samples),
        )
        if p
    ]
    if not isinstance(compile, bool):
        problems.append(f"compile={shown(compile)}: must be True or False")
    if not isinstance(held_out_unseen, bool):
        problems.append(f"held_out_unseen={shown(held_out_unseen)}: must be True or False")
    if loss_fn is not None and not callable(loss_fn):
        problems.append(f"loss_fn={shown(loss_fn)}: must be callable(outputs, targets) or None")
    if not isinstance(held_out, (Dataset, DataLoader)):
        problems.append(f"held_out={shown(held_out)}: must be a torch Dataset or DataLoader")
    problems += _cancel_problems(cancel)
    problems += [str(p) for p in tolerance_problems(max_loss_ratio, max_accuracy_drop)]
    raise_problems(problems)

    results = {
        name: c if isinstance(c, Compressed) else Compressed(c, name, ())
        for name, c in candidates.items()
    }
    models: dict[str, nn.Module] = {BEFORE: before, **{n: c.model for n, c in results.items()}}
    batch = first_batch(held_out, batch_size)
    timed: dict[str, Any] = {n: torch.compile(m) for n, m in models.items()} if compile else models
    times = latencies(timed, batch, repeats=repeats, cancel=cancel)
    measure = (held_out, loss_fn, batch_size, eval_samples, cancel)
    rows = [Row(BEFORE, _figures(before, times[BEFORE], *measure))]
    for name, c in results.items():
        rows.append(
            Row(
                name,
                _figures(c.model, times[name], *measure),
                layers=c.layers,
                skipped=c.skipped,
                notes=c.notes,
                why_no_gain=c.why_no_gain,
            )
        )
    rows = [rows[0]] + [
        replace(row, why_no_gain=_reasons_left(c, rows[0], rows))
        for row, c in zip(rows[1:], results.values(), strict=True)
    ]
    from workbench.train.data import batch_size_of

    device = next((t.device for t in before.parameters()), torch.device("cpu"))
    setup = {
        "batch_size": batch_size_of(batch),
        "repeats": repeats,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "held_out_samples": rows[0].figures.held_out_samples,
        "compile": compile,
        "torch": torch.__version__,
    }
    return CompressionReport(
        title=title or f"compression of {type(before).__name__}",
        rows=tuple(rows),
        setup=setup,
        models={n: c.model for n, c in results.items()},
        tolerance=QualityTolerance(max_loss_ratio, max_accuracy_drop),
        quality_data="held-out" if held_out_unseen else "eval",
    )


def compress(
    model: nn.Module,
    held_out: Dataset[Any] | DataLoader[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    *,
    methods: Iterable[str] = DEFAULT_METHODS,
    sparsity: float = 0.5,
    engine: str = "torchao",
    extra: Mapping[str, nn.Module] | None = None,
    title: str | None = None,
    cancel: Any = None,
    **measure: Any,
) -> CompressionReport:
    """Compress copies of `model` with each of `methods` and measure them against it.

    `methods`: "int8" (INT8 dynamic quantization with `engine`), "prune" (global
    unstructured magnitude pruning at `sparsity`), "channels" / "heads" (structured
    pruning of that fraction of the units), or steps joined by '+' ("channels+int8").
    `extra`: more models to measure alongside (a distilled student, say). `measure`:
    `batch_size`, `repeats`, `eval_samples`, `compile`, `held_out_unseen` and the quality
    tolerance `max_loss_ratio`, `max_accuracy_drop` (see `compare`). `cancel`: a
    threading.Event; setting it stops the work at the next method, model or batch with
    `CompressionCancelled`. Every problem with the arguments is reported at once, before
    any work; your model is never changed.
    """
    check_model(model)
    names = (
        list(methods) if isinstance(methods, Iterable) and not isinstance(methods, str) else methods
    )
    problems: list[str | SettingProblem] = [*method_problems(names)]
    sparsity_bad = sparsity_problem(sparsity)
    if sparsity_bad:
        problems.append(sparsity_bad)
    if engine not in ENGINES:
        problems.append(f"engine={shown(engine)}: must be one of {', '.join(map(repr, ENGINES))}")
    if extra is not None and not isinstance(extra, Mapping):
        problems.append("extra: must be a mapping of name -> model")
    problems += _cancel_problems(cancel)
    problems += tolerance_problems(
        measure.get("max_loss_ratio", MAX_LOSS_RATIO),
        measure.get("max_accuracy_drop", MAX_ACCURACY_DROP),
    )
    raise_problems(problems)
    candidates: dict[str, nn.Module | Compressed] = {}
    for spec in names:
        stop_if_cancelled(cancel)
        candidates[spec] = apply_method(model, spec, sparsity=float(sparsity), engine=engine)
    for name, other in (extra or {}).items():
        if name in candidates:
            raise ValueError(f"extra: {shown(name)} is also a method name; rename it")
        candidates[name] = other
    return compare(model, candidates, held_out, loss_fn, title=title, cancel=cancel, **measure)
