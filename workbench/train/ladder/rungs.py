"""The ladder's rungs: what one is, the default ladder, reading rungs and applying them.

A rung is a name and a set of `TrainConfig` changes applied on top of every rung before
it (cumulative), plus `ranks` for data parallelism. The default ladder (`default_rungs`):

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
   time, and the memory compile saved, measured and predicted);
6. optional + activation checkpointing with a 2x larger micro-batch and half the
   accumulation (`checkpointing=True`);
7. optional + model parallel (`model_parallel=True`, after the accumulation rung): the
   data-parallel ranks become one tensor-parallel group (`tp` = ranks), the case study's
   "model parallel + gradient accumulation + OneCycleLR"; the built-in GPT and
   transformers Llama-style models split (`workbench.train.techniques.tensor_plan`).

The memory ladder (`memory_rungs`, `workbench ladder --memory`): baseline fp32 AdamW with
eager attention, + sdpa attention, + activation checkpointing, + 8-bit AdamW, + the
optimizer step in backward.

`read_rung` takes a rung as a user writes it (a `Rung`, a (name, changes) pair or a
mapping with an optional "name"); `cumulative_configs` applies the rungs in order and
names every change a rung may not make.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from workbench.config import TrainConfig, did_you_mean
from workbench.inputs import shown
from workbench.train.ladder.problems import LadderProblem, in_rung, of_error, said

#: The ladder's own setting in a rung (not a TrainConfig field): data-parallel ranks.
RANKS = "ranks"
#: Settings a rung may not change: the ladder runs every rung on one device.
FIXED = ("device",)
#: Default data-parallel ranks on a CPU: ranks there share the same cores.
CPU_RANKS = 2
#: Keys a rung may not hold: the model (code) is the ladder's own argument, never a rung's
#: (a rungs file cannot choose code to run).
NOT_SETTINGS = ("model", "model_options", "data", "loss_fn", "sampler", "factory")
#: Settings that choose where the workbench writes, and what it deletes there: a rung
#: (often read from a file) never sets them; the ladder's runs save no checkpoints.
WHERE_TO_WRITE = (
    "checkpoint_dir",
    "checkpoint_every_steps",
    "checkpoint_every_seconds",
    "keep_checkpoints",
)
#: Rungs in one ladder: each is run `repeats` times; more would take days.
MAX_RUNGS = 64
#: A rung's name is a table row and a chart label.
MAX_NAME_CHARS = 120


@dataclass(frozen=True)
class Rung:
    """One rung: a name and the changes it adds on top of the rungs before it
    (`TrainConfig` fields, and `ranks` for data parallelism)."""

    name: str
    changes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.changes}


def amp_precision(device: str) -> str:
    """The AMP setting for `device`: "amp-bf16" where autocast supports bfloat16 there
    (every CPU build of torch 2.x; GPUs of compute capability 8.0 and later), else
    "amp-fp16"."""
    from workbench.train.techniques.precision import amp_supported

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
    model_parallel: bool = False,
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
    if model_parallel and ranks > 1:
        # the case study's last rung: the data-parallel ranks become one tensor-parallel
        # group (each layer's matmuls split over them; every rank reads the same samples)
        mp: dict[str, Any] = {"tp": ranks}
        if amp == "amp-fp16":
            mp["precision"] = "fp32"  # GradScaler is not wired into tensor parallelism
        rungs.append(Rung(f"+ model parallel (tensor parallel x{ranks})", mp))
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


#: What `workbench ladder --memory` climbs (`memory_rungs`).
KINDS = ("speed", "memory")


def memory_rungs() -> list[Rung]:
    """The memory ladder: the techniques a Session trains, cumulative, each measured for
    the memory it frees and the step time it costs (the report's notes compare each rung
    with the one before). A rung its setup excludes (the optimizer step in backward with
    accumulation or clipping, say) fails and is reported; the others run on."""
    return [
        Rung(
            "baseline: fp32, AdamW, eager attention",
            {"precision": "fp32", "optimizer": "adamw", "attention": "eager"},
        ),
        Rung("+ sdpa attention", {"attention": "sdpa"}),
        Rung("+ activation checkpointing", {"activation_checkpointing": True}),
        Rung("+ activation offload", {"activation_offload": True}),
        Rung("+ 8-bit AdamW", {"optimizer": "adam8bit"}),
        Rung("+ optimizer step in backward", {"optimizer_in_backward": True}),
    ]


def read_rung(value: Any, index: int, problems: list[LadderProblem]) -> Rung | None:
    """A Rung from a Rung, a (name, changes) pair or a mapping with an optional "name";
    None (its problem appended to `problems`) when it is none of these. `index`: its
    place in the ladder (0 for the baseline), for the default name and the messages."""
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
            said(
                f"{shown(value)}: must be a mapping of settings (with an optional 'name'), a "
                "(name, changes) pair or a workbench.train.ladder.Rung",
                where=where,
            )
        )
        return None
    if not isinstance(changes, Mapping) or not all(isinstance(k, str) for k in changes):
        problems.append(
            LadderProblem("changes", changes, "must map setting names to values", where=where)
        )
        return None
    if name is None:
        name = (
            "baseline" if index == 0 else "+ " + ", ".join(f"{k}={v}" for k, v in changes.items())
        )
        if len(name) > MAX_NAME_CHARS:
            name = name[: MAX_NAME_CHARS - 3] + "..."
    if not isinstance(name, str) or not name.strip():
        problems.append(LadderProblem("name", name, "must be a non-empty string", where=where))
        return None
    if len(name.strip()) > MAX_NAME_CHARS or not name.strip().isprintable():
        problems.append(
            LadderProblem(
                "name",
                name,
                f"must be one line of at most {MAX_NAME_CHARS} printable characters (a table "
                "row and a chart label)",
                where=where,
            )
        )
        return None
    return Rung(name.strip(), dict(changes))


def cumulative_configs(
    parsed: Sequence[Rung | None], start: TrainConfig, problems: list[LadderProblem]
) -> list[tuple[TrainConfig, int]]:
    """(config, ranks) after each rung: its changes on top of every rung before it, from
    `start`; every change a rung may not make (the model, the device, an unknown or bad
    setting, a rung that changes nothing) appended to `problems`. A rung that could not be
    read (None) keeps the settings before it."""
    from workbench.train.launch import MAX_RANKS, integer_problem

    known = {f.name for f in fields(TrainConfig)}
    config, world = start, 1
    out: list[tuple[TrainConfig, int]] = []
    for i, rung in enumerate(parsed):
        if rung is None:
            out.append((config, world))
            continue
        where = f"rung {i + 1} {shown(rung.name)}"
        refused_before = len(problems)  # a rung with a refused value is not "unchanged"
        changes = dict(rung.changes)
        new_world = world
        for name in [n for n in NOT_SETTINGS if n in changes]:
            problems.append(
                LadderProblem(
                    name,
                    changes.pop(name),
                    "a rung holds training settings only; the model is the ladder's own "
                    "(model=, --model), never a rung's",
                    where=where,
                )
            )
        writes = [n for n in WHERE_TO_WRITE if n in changes]
        for name in writes:
            problems.append(
                LadderProblem(
                    name,
                    changes.pop(name),
                    "a rung file never chooses where the workbench writes (checkpoints and "
                    "what is pruned there); the ladder's runs save no checkpoints",
                    where=where,
                )
            )
        if RANKS in changes:
            value = changes.pop(RANKS)
            bad = integer_problem(
                RANKS, value, 1, MAX_RANKS, "more local ranks than one machine runs"
            )
            if bad:
                problems += in_rung([bad], where=where)
            else:
                new_world = int(value)
        refused = [name for name in FIXED if name in changes]
        for name in refused:
            problems.append(
                LadderProblem(
                    name,
                    changes.pop(name),
                    "the ladder runs every rung on one device; pass device= to the ladder instead",
                    where=where,
                )
            )
        unknown = sorted(set(changes) - known)
        for name in [n for n in unknown if did_you_mean(n, [RANKS])]:
            unknown.remove(name)
            problems.append(
                LadderProblem(
                    name,
                    changes.pop(name),
                    f"unknown setting; did you mean {RANKS!r}? (the ladder's data-parallel ranks)",
                    where=where,
                )
            )
        if unknown:
            # TrainConfig's own message: "did you mean", other trainers' names included
            try:
                config.replace(**{name: changes.pop(name) for name in unknown})
            except ValueError as exc:
                problems += of_error(
                    exc,
                    where=where,
                    message=lambda m: m.replace(
                        " known settings: ", f" known settings: {RANKS} (data-parallel ranks), ", 1
                    ),
                )
        try:
            new = config.replace(**changes)
        except ValueError as exc:
            problems += of_error(exc, where=where)
            out.append((config, new_world))
            continue
        if i > 0 and new == config and new_world == world and len(problems) == refused_before:
            same = ", ".join(f"{k}={shown(v)}" for k, v in rung.changes.items()) or "no settings"
            problems.append(
                said(
                    f"changes nothing ({same}: already in effect after the rungs before it); "
                    "drop it or change a setting",
                    where=where,
                )
            )
        config, world = new, new_world
        out.append((config, world))
    return out
