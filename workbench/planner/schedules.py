"""Pipeline schedules and the compute factors the planner can pin (pure).

Pipeline schedules (torch.distributed.pipelining ships each one named here: Schedule1F1B,
ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
ScheduleZBVZeroBubble; checked on torch 2.13), with p stages, m micro-batches and v
virtual stages (layer chunks) a rank:

* "1f1b", "gpipe": the idle time is (p - 1) / m of the compute (Narayanan et al. 2021,
  "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
  section 2.2.1);
* "interleaved-1f1b": (p - 1) / (v m), for v times the point-to-point sends (the same
  paper, section 2.2.2: Megatron's GPT-3 175B and Meta's Llama 3 405B layouts run it);
  it needs m a multiple of p and the layers a multiple of p x v;
* "zero-bubble": torch's ScheduleInterleavedZeroBubble (v >= 2) or ScheduleZBVZeroBubble
  (v = 2): the backward split into its input and weight halves and the weight half moved
  into the bubble. Qi et al. 2024 ("Zero Bubble Pipeline Parallelism", ICLR, section 3,
  ZB-H1) put the idle time at a third of 1F1B's with 1F1B's memory when a forward, a
  backward-for-inputs and a backward-for-weights take as long as each other: (p - 1) /
  (3 v m) here. Their ZB-H2 and ZB-V reach about zero with more memory or tuning; the
  third is the figure claimed at 1F1B's memory.

Compute factors, measured speedups of tokens/s on the same run (torchtitan,
`docs/performance.md`, Table 1: Llama 3.1 8B, 8 H100, FSDP, local batch 2, selective
recomputation: FSDP 5,762 tokens/s a GPU; + torch.compile 6,667 (x 1.157); + float8
8,532 (x 1.280 over compile)). Per GPU generation: Hopper has both figures; float8 needs
FP8 tensor cores (Hopper, Ada, MI300X: only Hopper's is measured here, so float8 is refused
elsewhere); torch.compile on another generation has no published figure this model uses,
so it counts 1.0 there (no gain claimed).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.inputs import shown

#: the pipeline schedules the planner models
SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble")

#: torchtitan docs/performance.md Table 1 (Llama 3.1 8B on 8 H100): tokens/s a GPU
TORCHTITAN_FSDP, TORCHTITAN_COMPILE, TORCHTITAN_FLOAT8 = 5762, 6667, 8532
#: catalog GPUs -> (torch.compile's factor, float8's factor on top; None: not planned)
COMPUTE_FACTORS: dict[str, tuple[float, float | None]] = {
    "h100-80gb": (TORCHTITAN_COMPILE / TORCHTITAN_FSDP, TORCHTITAN_FLOAT8 / TORCHTITAN_COMPILE),
    "h200-141gb": (TORCHTITAN_COMPILE / TORCHTITAN_FSDP, TORCHTITAN_FLOAT8 / TORCHTITAN_COMPILE),
}


def bubble_fraction(schedule: str, stages: int, micro_batches: int, virtual: int = 1) -> float:
    """The pipeline's idle time as a fraction of the compute (see the module docstring)."""
    if stages <= 1:
        return 0.0
    base = (stages - 1) / micro_batches
    if schedule in ("1f1b", "gpipe"):
        return base
    if schedule == "interleaved-1f1b":
        return base / virtual
    if schedule == "zero-bubble":
        return base / (3 * virtual)
    raise ValueError(f"pp_schedule={shown(schedule)}: must be one of {', '.join(SCHEDULES)}")


def schedule_problems(
    schedule: str, stages: int, virtual: int, layers: int, micro_batches: int
) -> list[str]:
    """Why `schedule` with `virtual` stages a rank cannot run `layers` layers over `stages`
    stages with `micro_batches` micro-batches (empty: it can): what must divide what."""
    out = []
    if schedule not in SCHEDULES:
        return [f"pp_schedule={shown(schedule)}: must be one of {', '.join(SCHEDULES)}"]
    if schedule in ("1f1b", "gpipe") and virtual != 1:
        out.append(
            f"virtual_stages={virtual}: {schedule} runs one stage a rank; interleaved-1f1b "
            "or zero-bubble run more"
        )
    if schedule in ("interleaved-1f1b", "zero-bubble") and virtual < 2:
        out.append(f"virtual_stages={virtual}: {schedule} needs at least 2 stages a rank")
    if layers % (stages * virtual):
        out.append(
            f"layers={layers}: must be a multiple of pp x virtual_stages = {stages} x "
            f"{virtual} = {stages * virtual} (each chunk holds whole layers, as many each)"
        )
    if schedule in ("interleaved-1f1b", "zero-bubble") and micro_batches % stages:
        out.append(
            f"grad_accum={micro_batches}: {schedule} needs the micro-batches a multiple of "
            f"pp={stages}"
        )
    return out


@dataclass(frozen=True)
class Pins:
    """The planner-only choices a plan() call pins: the pipeline schedule ("search": each
    that runs), virtual stages a rank (None: 2 for an interleaved schedule), torch.compile,
    float8 matmuls, HSDP (shard inside a node, replicate across)."""

    pp_schedule: str = "1f1b"
    virtual_stages: int | None = None
    compile: bool = False
    float8: bool = False
    hsdp: bool = False


def checked_pins(
    pp_schedule: object, virtual_stages: object, compile: object, float8: object, hsdp: object
) -> Pins:
    """`Pins` from plan()'s keywords; ValueError naming a bad one and what is allowed."""
    allowed = (*SCHEDULES, "search")
    if pp_schedule not in allowed:
        raise ValueError(f"pp_schedule={shown(pp_schedule)}: must be one of {', '.join(allowed)}")
    v = virtual_stages
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64):
        raise ValueError(f"virtual_stages={shown(v)}: must be an integer from 1 to 64")
    for name, flag in (("compile", compile), ("float8", float8), ("hsdp", hsdp)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={shown(flag)}: must be True or False")
    return Pins(str(pp_schedule), v, bool(compile), bool(float8), bool(hsdp))


#: the engines HSDP shards with (FSDP's); `hsdp=True` plans only these
HSDP_ENGINES = ("full_shard", "shard_grad_op")


def hsdp_engines(engines: tuple[str, ...], nodes: int) -> tuple[str, ...]:
    """The engines `hsdp=True` plans (FSDP's among `engines`); ValueError saying what rules
    HSDP out: one node (nothing to replicate across), or no FSDP engine among them."""
    if nodes < 2:
        raise ValueError(
            f"hsdp=True: HSDP shards inside a node and replicates across nodes; nodes={nodes}: "
            "give two or more (nodes=, gpus=), or leave hsdp=True out"
        )
    sharded = tuple(e for e in engines if e in HSDP_ENGINES)
    if not sharded:
        raise ValueError(
            f"hsdp=True: HSDP is FSDP's ({', '.join(HSDP_ENGINES)}); the engines planned are "
            f"{', '.join(engines)}"
        )
    return sharded


def schedule_choices(
    pins: Pins, stages: int, layers: int, micro_batches: int
) -> tuple[list[tuple[str, int]], list[str]]:
    """The (schedule, virtual stages) to plan for `stages` pipeline stages, and why the
    pinned ones cannot run here (empty list of choices: none can)."""
    if stages <= 1:
        return [("1f1b", 1)], []
    if pins.pp_schedule == "search":
        wanted = [("1f1b", 1)]
        for v in (2, 4) if pins.virtual_stages is None else (pins.virtual_stages,):
            wanted += [("interleaved-1f1b", v), ("zero-bubble", v)]
    else:
        interleaved = pins.pp_schedule in ("interleaved-1f1b", "zero-bubble")
        default_v = 2 if interleaved else 1
        v = default_v if pins.virtual_stages is None else pins.virtual_stages
        wanted = [(pins.pp_schedule, v)]
    out: list[tuple[str, int]] = []
    why: list[str] = []
    for schedule, v in wanted:
        problems = schedule_problems(schedule, stages, v, layers, micro_batches)
        if problems:
            why.extend(problems)
        else:
            out.append((schedule, v))
    return out, why


def compute_speedup(gpu: str, *, compiled: bool = False, float8: bool = False) -> float:
    """The factor on the compute's rate of torch.compile and float8 matmuls on `gpu`."""
    compile_f, float8_f = COMPUTE_FACTORS.get(gpu, (1.0, None))
    factor = compile_f if compiled else 1.0
    if float8:
        if float8_f is None:
            raise ValueError(
                f"float8=True: no published float8 training speedup for {gpu} (FP8 tensor "
                f"cores measured here: {', '.join(COMPUTE_FACTORS)})"
            )
        factor *= float8_f
    return factor


__all__ = [
    "COMPUTE_FACTORS",
    "Pins",
    "checked_pins",
    "schedule_choices",
    "SCHEDULES",
    "bubble_fraction",
    "compute_speedup",
    "schedule_problems",
]
