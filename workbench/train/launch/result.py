"""What a launch of several ranks returns: each rank's records and model-state bytes next
to the estimator's figures, the first failure, and where the checkpoints went.

`workbench.train.launch.launch_ranks` builds a `LaunchResult` from what the ranks
reported (`workbench.train.launch.procs.LaunchState`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.train.records import StepRecord

#: The exit status of a run stopped early on SIGTERM, its checkpoint written (128 + SIGTERM).
EXIT_PREEMPTED = 143


@dataclass(frozen=True)
class RankError:
    """The first failure of a launch. `rank` is None for launcher-level failures
    (timeout, a launcher that died without any rank reporting)."""

    rank: int | None
    message: str
    traceback_tail: str = ""

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "launcher"
        return f"{who}: {self.message}"


@dataclass(frozen=True)
class RankReport:
    """One rank: its step records and the model-state bytes counted from its tensors
    (None when the rank never finished), next to the estimator's figures."""

    rank: int
    records: tuple[StepRecord, ...]
    params_bytes: int | None
    grads_bytes: int | None
    optimizer_bytes: int | None
    predicted: dict[str, int] | None  # accounting="deepspeed"
    predicted_paper: dict[str, int] | None  # accounting="paper"
    pid: int | None = None
    #: under tensor or pipeline parallelism: this rank's place ("tp", "pp", "dp",
    #: "tp_rank", "stage", "dp_rank"; a pipeline's also "schedule", "micro_batches",
    #: "layers", "step_seconds", "compute_seconds", "bubble_measured", "bubble_ideal")
    layout: dict[str, Any] | None = None
    #: under tensor or pipeline parallelism: the activations one probe step saved on this
    #: rank (a pipeline stage: the peak it held in flight)
    activation_bytes: int | None = None

    def summary(self) -> dict[str, Any]:
        """A short step summary: first/last step and loss, mean step seconds."""
        recs = self.records
        if not recs:
            return {"steps": 0}
        return {
            "steps": len(recs),
            "first_step": recs[0].step,
            "last_step": recs[-1].step,
            "first_loss": recs[0].loss,
            "last_loss": recs[-1].loss,
            "mean_step_seconds": sum(r.step_seconds for r in recs) / len(recs),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "predicted": self.predicted,
            "predicted_paper": self.predicted_paper,
            "layout": self.layout,
            "activation_bytes": self.activation_bytes,
            "summary": self.summary(),
            "losses": [r.loss for r in self.records],  # from summary's first_step on
        }


@dataclass(frozen=True)
class LaunchResult:
    ranks: tuple[RankReport, ...]
    world_size: int
    launcher: str
    command: tuple[str, ...]
    returncode: int | None
    first_error: RankError | None
    timed_out: bool
    preempted: bool  # the ranks stopped early on SIGTERM (checkpoint written)
    checkpoint_dir: str | None  # where rank-<r>/step-N.pt files were written, if any
    checkpoint_step: int | None
    n_params: int | None
    log_tail: str = ""
    run_dir: str | None = None  # kept only when it holds the checkpoints
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every rank finished cleanly (a pre-empted run is ok too: it saved its state)."""
        return (
            self.first_error is None
            and not self.timed_out
            and all(r.params_bytes is not None for r in self.ranks)
        )

    @property
    def records(self) -> dict[int, list[StepRecord]]:
        return {r.rank: list(r.records) for r in self.ranks}

    def to_dict(self) -> dict[str, Any]:
        err = self.first_error
        return {
            "world_size": self.world_size,
            "launcher": self.launcher,
            "returncode": self.returncode,
            "ok": self.ok,
            "error": None
            if err is None
            else {
                "rank": err.rank,
                "message": err.message,
                "traceback_tail": err.traceback_tail,
            },
            "timed_out": self.timed_out,
            "preempted": self.preempted,
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_step": self.checkpoint_step,
            "n_params": self.n_params,
            "command": list(self.command),
            "ranks": [r.to_dict() for r in self.ranks],
        }
