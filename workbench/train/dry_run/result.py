"""`DryRun`: what a dry run measured, next to the formula's estimate of the same setup.

`DryRun` renders itself (a terminal's text, a notebook's table) as `MemoryEstimate` does:
the peak of a step with its categories, each point's total, and the formula's figure for
each beside it. `compare()` gives every point's categories side by side with the
difference and what each side counts (`Comparison` rows; `EXPLAINED` holds the
sentences). Pure: imports the display helpers only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from workbench.display import Display, Readable, fmt_bytes, fmt_count
from workbench.estimate.allocator import (
    AllocatorAdvice,
    AllocatorReplay,
    AllocEvent,
    AllocTrace,
)
from workbench.estimate.tied_embedding import TIED_SUM_TERM

#: The formula's points of a step, in order (`workbench.estimate.PHASES`).
POINTS = ("forward end", "backward", "optimizer step")


@dataclass(frozen=True)
class ModulePeak:
    """The highest total while module `name` ran: its forward, its backward (bytes on this
    rank, everything alive then, not only the module's own tensors)."""

    name: str
    forward_peak_bytes: int
    backward_peak_bytes: int

    @property
    def peak_bytes(self) -> int:
        return max(self.forward_peak_bytes, self.backward_peak_bytes)


#: One row of the comparison: the label, the dry run's categories, the formula's terms,
#: what the two count.
_ROWS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...] = (
    ("parameters", ("parameters",), ("parameters",), "the same weights in the same dtype"),
    (
        "gradients",
        ("gradients",),
        ("gradients",),
        "formula: none before backward without accumulation, the output projection's first in "
        "backward, all at the step; dry run: the gradients alive at that moment",
    ),
    (
        "optimizer states",
        ("optimizer states",),
        ("optimizer states",),
        "Adam's two moments (SGD's momentum) per parameter; the dry run adds Adam's 4-byte "
        "step counter per tensor",
    ),
    (
        "optimizer step temporaries",
        ("optimizer step temporaries",),
        ("optimizer step temporaries",),
        "foreach: one tensor of every stepped parameter (sqrt of exp_avg_sq); for-loop: two "
        "of the largest parameter; fused: none",
    ),
    (
        "activations and transients",
        ("activations", "temporaries"),
        (
            "activations",
            "logits and loss",
            "autocast weight casts",
            "backward transient",
            TIED_SUM_TERM,
        ),
        "formula: stored activations, logits and loss, autocast's weight casts, the backward "
        "transient, a tied embedding's gradient sum at its backward; dry run: every tensor "
        "the step made that is alive then (kept activations, casts, logits, and in backward "
        "the activation gradients and the gradients autograd has yet to sum)",
    ),
    (
        "FSDP gathered parameters",
        ("gathered parameters",),
        ("FSDP gathered parameters",),
        "formula: the root unit and two layers (full_shard) or every layer (shard_grad_op) "
        "in the compute dtype; dry run: FSDP2's unsharded parameters and all-gather buffers",
    ),
    (
        "FSDP unsharded gradients",
        ("unsharded gradients",),
        ("FSDP unsharded gradients",),
        "formula: two layers' and the output projection's; dry run: FSDP2's unsharded "
        "gradients and reduce-scatter buffers",
    ),
    (
        "DeepSpeed reduce buckets",
        ("DeepSpeed reduce buckets",),
        ("DeepSpeed reduce buckets",),
        "ZeRO 1/2's contiguous reduce buckets (reduce_bucket_size elements in the gradient "
        "dtype, two with overlap_comm), alive in backward; the dry run counts the ones "
        "DeepSpeed's engine allocated",
    ),
    (
        "DeepSpeed flattened reduce copy",
        ("DeepSpeed flattened reduce copy",),
        ("DeepSpeed flattened reduce copy",),
        "the new tensor DeepSpeed's allreduce_bucket cats a reduce's gradients into (the "
        "bucket's elements in the gradient dtype, at most reduce_bucket_size; stage 0: "
        "every gradient, after backward), freed when the reduce returns; formula: at the "
        "end of backward, and beside the layers' when the bucket fills before; dry run: "
        "what DeepSpeed's allreduce_bucket made that is alive then",
    ),
    (
        "DeepSpeed fp32 gradient partition",
        ("DeepSpeed fp32 gradient partition",),
        ("DeepSpeed fp32 gradient partition", "DeepSpeed flattened gradient partition"),
        "16-bit training: the fp32 copy of this rank's gradient partition the step makes "
        "for the fp32 masters (formula: with ZeRO 1/2's flat 16-bit copy beyond the "
        "step's temporaries; dry run: once it is the masters' gradient, before that a step "
        "temporary)",
    ),
    (
        "ZeRO-3 gathered parameters",
        ("ZeRO-3 gathered parameters",),
        ("ZeRO-3 gathered parameters",),
        "formula: the layer running plus what the prefetcher fetches ahead, in the compute "
        "dtype, at most the model; dry run: the parameters DeepSpeed holds gathered then",
    ),
    (
        "DeepSpeed other buffers",
        ("DeepSpeed other buffers",),
        (),
        "DeepSpeed's own bookkeeping tensors (flags, norms, small buffers); the formula "
        "leaves them out",
    ),
    (
        "buffers",
        ("buffers",),
        (),
        "the formula counts no buffers (rotary tables, causal masks)",
    ),
    (
        "the micro-batch",
        ("other",),
        (),
        "the batch's own tensors (token ids, labels): the formula leaves them out",
    ),
)

#: What each compared row counts, by label.
EXPLAINED = {label: why for label, _, _, why in _ROWS}


@dataclass(frozen=True)
class Comparison:
    """One category at one point of the step: the dry run's bytes, the formula's (None
    without a formula), their difference (dry run - formula) and what each side counts."""

    point: str
    category: str
    dry_run_bytes: int
    formula_bytes: int | None
    explanation: str

    @property
    def difference_bytes(self) -> int | None:
        return None if self.formula_bytes is None else self.dry_run_bytes - self.formula_bytes


@dataclass(frozen=True)
class DryRunComparison(Readable):
    """`DryRun.compare()`: every point's categories, dry run next to formula."""

    rows: tuple[Comparison, ...]
    title: str
    #: (name, dry run bytes, formula's peak) of the allocated and reserved peaks
    peaks: tuple[tuple[str, int | None, int | None], ...] = ()

    def _display(self) -> Display:
        rows = [
            (name, fmt_bytes(ours), fmt_bytes(theirs), _signed(_minus(ours, theirs)))
            for name, ours, theirs in self.peaks
        ]
        rows += [
            (
                f"{r.point}: {r.category}",
                fmt_bytes(r.dry_run_bytes),
                fmt_bytes(r.formula_bytes),
                _signed(r.difference_bytes),
            )
            for r in self.rows
        ]
        why: dict[str, str] = {}
        for r in self.rows:
            if r.category != "total":
                why.setdefault(r.category, r.explanation)
        notes = [f"{category}: {text}" for category, text in why.items()]
        return Display(
            self.title, rows, header=("", "dry run", "formula", "difference"), notes=notes
        )


def _minus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _signed(n: int | None) -> str:
    if n is None:
        return "n/a"
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


@dataclass(frozen=True)
class DryRun(Readable):
    """Bytes on one rank of real training steps run on fake tensors (nothing allocated),
    measured by PyTorch's memory tracker; `str()` and a notebook show them beside the
    formula's estimate.

    `peak_bytes` is the highest point of a step, `phase` which point ("forward end",
    "backward", "optimizer step": the highest moment of the forward and loss, of the
    backward, of the optimizer step), `by_category` its bytes by category (parameters,
    gradients, optimizer states, optimizer step temporaries, activations, temporaries,
    buffers, other; under FSDP also gathered parameters and unsharded gradients; under
    DeepSpeed its reduce buckets, fp32 gradient partition, ZeRO-3's gathered parameters
    and its other buffers), `points` every point's categories and `phases` their totals.
    `overhead_bytes` is the formula's CUDA context and allocator reserve, which the dry
    run cannot represent and the peak does not include (`required_bytes` adds it).
    `engine` is "plain", "fsdp" or "deepspeed" (`zero_stage` its stage).

    `by_module`: the peaks while each top-level module and transformer block ran (the
    last step). `params_bytes`, `grads_bytes`, `optimizer_bytes` are the model states at
    rest, counted from the fake tensors (`optimizer_step_counter_bytes` of them are Adam's
    step counters). `formula` is the `MemoryEstimate` of the same setup (None when the
    estimator cannot describe it: `notes` says why); `compare()` sets the two side by
    side. `device` is the device type simulated ("cuda", or "cpu" where torch has no CUDA:
    `notes` says what differs), `wall_seconds` how long the dry run took.
    """

    peak_bytes: int
    phase: str
    by_category: dict[str, int]
    points: dict[str, dict[str, int]]
    phases: dict[str, int]
    by_module: tuple[ModulePeak, ...]
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    optimizer_step_counter_bytes: int
    overhead_bytes: int
    formula: Any  # workbench.estimate.MemoryEstimate | None
    model: str
    n_params: int
    engine: str
    world_size: int
    device: str
    precision: str
    optimizer: str
    optimizer_impl: str
    attention: str | None
    activation_checkpointing: str  # none, selective, full
    fsdp: str
    zero_stage: int
    micro_batch: int
    seq_len: int | None
    grad_accum: int
    steps: int
    batch: str
    wall_seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    trace: AllocTrace | None = None
    reserved_peak_bytes: int | None = None
    fragmentation_bytes: int | None = None
    allocator: AllocatorReplay | None = None
    allocator_advice: AllocatorAdvice | None = None

    @property
    def allocated_peak_bytes(self) -> int | None:
        """The allocator's allocated peak (torch.cuda.max_memory_allocated: each block as
        the allocator rounds and splits it); None without a replay."""
        return self.allocator.allocated_peak_bytes if self.allocator is not None else None

    @property
    def fragmentation_share(self) -> float | None:
        return self.allocator.fragmentation_share if self.allocator is not None else None

    dtypes: dict[str, str] = field(default_factory=dict)  # per model-state category, as trained
    #: the techniques on the model beyond its engine, as the header says them ("LoRA rank 8")
    techniques: tuple[str, ...] = ()

    @property
    def required_bytes(self) -> int:
        """What the GPU must hold: `peak_bytes + overhead_bytes`."""
        return self.peak_bytes + self.overhead_bytes

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the formula as its own dict; the trace as its number of
        events, `trace_events`: `trace.to_dict()` gives the events)."""
        out = asdict(replace(self, trace=None, allocator=None))
        del out["trace"]
        out["trace_events"] = len(self.trace.events) if self.trace is not None else 0
        out["allocator"] = self.allocator.to_dict() if self.allocator is not None else None
        out["formula"] = self.formula.to_dict() if self.formula is not None else None
        return out

    def timeline(self, top: int = 10) -> Any:
        """The picture of the steps' memory over time (`workbench.train.dry_run.timeline`'s
        `Timeline`: `.figure()`, `.png()`, `.html()`, the data it draws); None without a
        trace."""
        if self.trace is None:
            return None
        from workbench.train.dry_run.timeline import timeline

        title = f"memory over the dry run's steps: {self._setup()}"
        return timeline(self.trace, self.allocator, top=top, title=title)

    def memory_snapshot(self) -> dict[str, Any] | None:
        """The trace as `torch.cuda.memory._snapshot()` writes one, for torch's memory
        viewer (torch.cuda.memory._memory_viz; pickle it to open it); None without a trace."""
        if self.trace is None:
            return None
        from workbench.train.dry_run.timeline import memory_snapshot

        settings = self.allocator.settings if self.allocator is not None else None
        return memory_snapshot(self.trace, settings or None)

    def compare(self) -> DryRunComparison:
        """Every point's categories, dry run next to formula, with the difference and what
        each side counts (the formula's terms at the same point; see `EXPLAINED`)."""
        rows: list[Comparison] = []
        formula_points = self._formula_points()
        for point in POINTS:
            ours = self.points.get(point, {})
            theirs = formula_points.get(point)
            for label, mine, terms, why in _ROWS:
                dry = sum(ours.get(k, 0) for k in mine)
                form = None if theirs is None else sum(theirs.get(t, 0) for t in terms)
                if dry == 0 and not form:
                    continue
                rows.append(Comparison(point, label, dry, form, why))
            total_form = None if theirs is None else sum(theirs.values())
            rows.append(
                Comparison(point, "total", self.phases.get(point, 0), total_form, "the point's sum")
            )
        title = f"dry run vs formula per point of the step: {self._setup()}"
        f_peak = self.formula.peak_bytes if self.formula is not None else None
        # the formula's peak counts allocations: beside the allocated peak only
        peaks = tuple(
            (name, value, f_peak if n == 0 else None)
            for n, (name, value) in enumerate(self.peak_lines())
        )
        return DryRunComparison(tuple(rows), title, peaks)

    def peak_lines(self) -> tuple[tuple[str, int | None], ...]:
        """The allocated peak and the reserved peak, named, for the report and compare()."""
        if self.allocator is None:
            return ()
        return (
            ("allocated peak (blocks in use, the allocator's rounding)", self.allocated_peak_bytes),
            ("reserved peak (segments the caching allocator holds)", self.reserved_peak_bytes),
        )

    def _allocator_rows(self, formula_peak: int | None, cell: Any) -> list[tuple[str, ...]]:
        if self.allocator is None:
            return []
        rows: list[tuple[str, ...]] = [
            (name, cell(value), "", "") for name, value in self.peak_lines()
        ]
        share = self.fragmentation_share or 0.0
        rows.append(
            (
                "  fragmentation at the reserved peak",
                f"{cell(self.fragmentation_bytes)} ({share:.0%})",
                "",
                "",
            )
        )
        if self.allocator_advice is not None:
            a = self.allocator_advice
            rows.append(
                (
                    f"  with {a.setting}",
                    cell(a.reserved_peak_bytes),
                    "",
                    "-" + fmt_bytes(a.saves_bytes),
                )
            )
        return rows

    def _formula_points(self) -> dict[str, dict[str, int]]:
        peak = getattr(self.formula, "peak", None)
        return dict(peak.points) if peak is not None else {}

    def _setup(self) -> str:
        ranks = f"{self.world_size} rank" + ("s" if self.world_size > 1 else "")
        engine = {
            "fsdp": f"FSDP {self.fsdp}",
            "deepspeed": f"DeepSpeed ZeRO-{self.zero_stage}",
        }.get(self.engine, self.engine)
        seq = f" x {self.seq_len}" if self.seq_len else ""
        extra = "".join(f", {t}" for t in self.techniques)
        return (
            f"{self.model}, {self.precision}, {self.optimizer} ({self.optimizer_impl}), "
            f"{engine}{extra}, {ranks}, micro-batch {self.micro_batch}{seq}"
        )

    def _display(self) -> Display:
        formula = self.formula
        points = self._formula_points()

        def cell(n: int | None) -> str:
            return fmt_bytes(n) if n is not None else "n/a"

        def diff(a: int, b: int | None) -> str:
            return _signed(None if b is None else a - b)

        f_peak = formula.peak_bytes if formula is not None else None
        rows: list[tuple[str, ...]] = [
            (
                f"peak of a step ({self.phase})",
                cell(self.peak_bytes),
                cell(f_peak),
                diff(self.peak_bytes, f_peak),
            )
        ]
        rows += self._allocator_rows(f_peak, cell)
        for r in self.compare().rows:
            if r.point == self.phase and r.category != "total":
                rows.append(
                    (
                        f"  {r.category}",
                        cell(r.dry_run_bytes),
                        cell(r.formula_bytes),
                        _signed(r.difference_bytes),
                    )
                )
        rows.append(("each point of the step", "", "", ""))
        for point in POINTS:
            f_total = sum(points[point].values()) if point in points else None
            ours = self.phases.get(point, 0)
            rows.append((f"  {point}", cell(ours), cell(f_total), diff(ours, f_total)))
        overhead = "CUDA context and allocator reserve (formula's; in neither peak)"
        rows.append((overhead, "", cell(self.overhead_bytes), ""))
        rows.append(("model states at rest", "", "", ""))
        for label, ours, key in (
            ("parameters", self.params_bytes, "params_bytes"),
            ("gradients", self.grads_bytes, "grads_bytes"),
            ("optimizer states", self.optimizer_bytes, "optimizer_bytes"),
        ):
            theirs = getattr(formula, key, None) if formula is not None else None
            rows.append((f"  {label}", cell(ours), cell(theirs), diff(ours, theirs)))
        if self.by_module:
            rows.append(("highest module peaks (forward / backward)", "", "", ""))
            top = sorted(self.by_module, key=lambda m: m.peak_bytes, reverse=True)[:5]
            for m in top:
                both = f"{fmt_bytes(m.forward_peak_bytes)} / {fmt_bytes(m.backward_peak_bytes)}"
                rows.append((f"  {m.name}", both, "", ""))
        rows.append(
            (
                f"simulated on {self.device} ({self.steps} steps)",
                f"{self.wall_seconds:.1f} s",
                "",
                "",
            )
        )
        title = (
            f"dry run of a step, per rank: {self._setup()} ({fmt_count(self.n_params)} "
            f"parameters, batch: {self.batch})"
        )
        return Display(
            title, rows, header=("", "dry run", "formula", "difference"), notes=self.notes
        )


__all__ = [
    "EXPLAINED",
    "POINTS",
    "AllocEvent",
    "AllocTrace",
    "AllocatorAdvice",
    "AllocatorReplay",
    "Comparison",
    "DryRun",
    "DryRunComparison",
    "ModulePeak",
]
