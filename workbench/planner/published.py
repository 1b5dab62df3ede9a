"""Published training throughputs, each planned with its published layout pinned: the
planner's predicted tokens/s per GPU next to the measured one (docs/planner.md, "Held to
published throughputs"; tests/unit/test_planner_published_runs.py holds every row).

A row is data: the model as `plan()` takes it, the cluster, the batch, the pinned layout,
the measured tokens a second per GPU, its source, the planner-only choices the run used
(`options`: its pipeline schedule, torch.compile, float8, passed to `plan()`, whose
factors are the published ones of workbench.planner.schedules), and `missing`: what the
step-time model does not have that the run used, with its effect in numbers, never a
constant fitted to the row. `compare()` plans each row; `table()` writes the
markdown table docs/planner.md holds, so both can be re-run after a change to the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.planner.schedules import COMPUTE_FACTORS

#: how far a prediction may be from the measurement (as the ratio predicted / measured)
TOLERANCE = 0.20

_TT = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
_MOSAIC = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
_NARAYANAN = "Narayanan et al. 2021, Table 1 (TFLOP/s per GPU, their eq. 3 with recomputation)"
_KORTHIKANTI = (
    "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models', "
    "Tables 3 and 5 (iteration time; sequence parallelism, no data parallelism)"
)
#: Narayanan et al.'s scripts for Table 1 (micro-batch, virtual stages)
_SC21 = "NVIDIA/Megatron-LM examples/sc21/run_table_1.sh"
#: torch.compile's and float8's factors on Hopper (torchtitan Table 1: Llama 3.1 8B, 8 H100:
#: FSDP 5,762 -> + torch.compile 6,667 -> + Float8 8,532 tokens/s/GPU), as the planner
#: applies them (workbench.planner.schedules)
COMPILE_H100, FLOAT8_H100 = COMPUTE_FACTORS["h100-80gb"]

#: torchtitan's Table 2 (FSDP + CP + torch.compile + Float8, Llama 3.1 8B, 8 H100, local
#: batch 1, full recomputation): (sequence, context-parallel size, tokens/s a GPU)
_TT_CP = f"{_TT}, Table 2 (FSDP + CP + torch.compile + Float8, local batch 1)"
_TT_CP_MEMORY = (
    "memory: the estimator's reserved peak is 77.3 GiB at every row (each rank holds 32,768 "
    "tokens); torchtitan's 83.9-84.5 GiB"
)
#: the measured rate at cp 4 and 8 against cp 1 and 2, at the same tokens a rank
_TT_CP_RATE = (
    "the measured model-FLOP rate (tokens/s x 6 N + 12 L h s a token) falls from 376 "
    "TFLOP/s a GPU at cp 1 and 2 (3,890 x 96.6 G; 2,540 x 148.1 G) to 269 at cp 4 (1,071 x "
    "251.2 G) and 251 at cp 8 (548 x 457.3 G), at the same 32,768 tokens and memory a "
    "rank; the model keeps the rate (its K/V exchange hides behind attention over NVLink: "
    "0 s exposed), so it is {ratio} here; torchtitan does not say what slows its ring "
    "attention at cp 4 and 8"
)
_MPT = {"mlp": "gelu", "norm": "layernorm", "bias": "none", "positions": "rotary", "vocab": 50368}
_GPT = {"vocab": 51200, "seq_len": 2048}


def _megatron_tokens(tflops: float, layers: int, hidden: int, seq: int = 2048) -> float:
    """Tokens/s per GPU of a Table 1 row: its TFLOP/s per GPU over its FLOPs a token,
    96 l h^2 (1 + s / 6h + V / 16 l h) / s x s (Narayanan et al. 2021, eq. 3, per token)."""
    per_token = 96 * layers * hidden**2 * (1 + seq / (6 * hidden) + 51200 / (16 * layers * hidden))
    return tflops * 1e12 / per_token


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement and the plan() call that plans its layout."""

    name: str
    model: dict[str, Any]
    gpu: str
    gpus: int
    global_batch: int
    pin: dict[str, Any]
    measured_tokens_per_gpu: float
    source: str
    #: what the run used that the step-time model does not have, and the published factor
    #: it is worth (1.0: nothing missing, or not published)
    missing: str = ""
    missing_factor: float = 1.0
    #: plan()'s planner-only keywords for what the run used: pp_schedule, virtual_stages,
    #: compile, float8 (their effect is the step-time model's, workbench.planner.schedules)
    options: dict[str, Any] = field(default_factory=dict)
    #: where `options` and the pinned micro-batch are read, where not the row's source
    options_source: str = ""
    #: the catalog GPU planned where the estimator's memory differs from the run's GPU
    #: (same peak FLOP/s and links), and why
    planned_gpu: str | None = None
    #: what of the published layout is not pinned, and why
    note: str = ""
    #: why the prediction is further than `TOLERANCE` from the measurement: the effect the
    #: model lacks, in numbers (empty: within the tolerance)
    outside: str = ""


RUNS: tuple[PublishedRun, ...] = (
    PublishedRun(
        "Llama 3.1 8B, 8 H100, FSDP, selective recomputation",
        {"model": "llama-3-8b", "seq_len": 8192},
        "h100",
        8,
        16,
        {"engine": "full_shard", "tp": 1, "pp": 1, "dp": 8, "checkpointing": "selective"},
        5762,
        f"{_TT}, Table 1 (FSDP)",
        planned_gpu="h200",
        note="local batch 2 not pinned as one micro-batch: the estimator puts it at 154.2 GiB, "
        "over the h200's 139.8 (the preset's transformers RMSNorms keep an fp32 copy of each "
        "norm's input and the normalised input, 16.3 GiB at 2 x 8192 tokens, which "
        "torchtitan's op-level selective recomputation recomputes)",
    ),
    PublishedRun(
        "Llama 3.1 8B, 128 H100, FSDP, selective recomputation",
        {"model": "llama-3-8b", "seq_len": 8192},
        "h100",
        128,
        256,
        {"engine": "full_shard", "tp": 1, "pp": 1, "dp": 128, "checkpointing": "selective"},
        5605,
        f"{_TT}, Table 3 (FSDP)",
        planned_gpu="h200",
        note="local batch 2 not pinned as one micro-batch: the estimator puts it at 143.7 GiB, "
        "over the h200's 139.8 (the preset's transformers RMSNorms keep an fp32 copy of each "
        "norm's input and the normalised input, 16.3 GiB at 2 x 8192 tokens, which "
        "torchtitan's op-level selective recomputation recomputes)",
    ),
    PublishedRun(
        "Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, full recomputation",
        {"model": "llama-3-70b", "seq_len": 8192},
        "h100",
        256,
        512,
        {"engine": "full_shard", "tp": 8, "pp": 1, "dp": 32, "checkpointing": "full"},
        829,
        f"{_TT}, Table 4 (2D, torch.compile + Float8)",
        options={"compile": True, "float8": True},
        note="local batch 16 not pinned as one micro-batch: the estimator puts it at 227 GiB "
        "(torchtitan measured 71.9 GiB)",
    ),
    PublishedRun(
        "MPT-7B, seq 2048, 8 H100, FSDP",
        {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 2048, **_MPT},
        "h100",
        8,
        48,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "dp": 8,
            "micro_batch": 6,
            "checkpointing": "none",
        },  # fmt: skip
        10643,
        f"{_MOSAIC}, H100 80GB BF16 table",
    ),
    PublishedRun(
        "MPT-13B, seq 2048, 8 H100, FSDP",
        {"layers": 40, "hidden": 5120, "heads": 40, "seq_len": 2048, **_MPT},
        "h100",
        8,
        16,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "dp": 8,
            "micro_batch": 2,
            "checkpointing": "none",
        },  # fmt: skip
        4792,
        f"{_MOSAIC}, H100 80GB BF16 table",
    ),
    PublishedRun(
        "MPT-30B, seq 2048, 8 H100, FSDP, full recomputation",
        {"layers": 48, "hidden": 7168, "heads": 64, "seq_len": 2048, **_MPT},
        "h100",
        8,
        504,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "dp": 8,
            "micro_batch": 3,
            "checkpointing": "full",
        },  # fmt: skip
        2002,
        f"{_MOSAIC}, H100 80GB BF16 table",
    ),
    PublishedRun(
        "MPT-7B, seq 2048, 8 A100 80GB, FSDP",
        {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 2048, **_MPT},
        "a100-80gb",
        8,
        96,
        {"engine": "full_shard", "tp": 1, "pp": 1, "dp": 8, "checkpointing": "none"},
        4641,
        f"{_MOSAIC}, A100 80GB table",
        note="micro-batch 6 not pinned: the estimator puts it at 81.3 GiB, 1.3 GiB over",
    ),
    PublishedRun(
        "MPT-13B, seq 2048, 8 A100 80GB, FSDP",
        {"layers": 40, "hidden": 5120, "heads": 40, "seq_len": 2048, **_MPT},
        "a100-80gb",
        8,
        48,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "dp": 8,
            "micro_batch": 2,
            "checkpointing": "none",
        },  # fmt: skip
        2262,
        f"{_MOSAIC}, A100 80GB table",
    ),
    PublishedRun(
        "GPT 1.7B, 32 A100, data parallel, full recomputation",
        {"layers": 24, "hidden": 2304, "heads": 24, **_GPT},
        "a100-80gb",
        32,
        512,
        {"engine": "ddp", "tp": 1, "pp": 1, "dp": 32, "micro_batch": 16, "checkpointing": "full"},
        _megatron_tokens(137, 24, 2304),
        f"{_NARAYANAN}: 137 TFLOP/s",
        options_source=f"micro-batch 16: {_SC21} (MBS=16)",
    ),
    PublishedRun(
        "GPT 18.4B, 256 A100, TP 8, full recomputation",
        {"layers": 40, "hidden": 6144, "heads": 48, **_GPT},
        "a100-80gb",
        256,
        1024,
        {"engine": "ddp", "tp": 8, "pp": 1, "dp": 32, "micro_batch": 8, "checkpointing": "full"},
        _megatron_tokens(135, 40, 6144),
        f"{_NARAYANAN}: 135 TFLOP/s",
        options_source=f"micro-batch 8: {_SC21} (MBS=8)",
    ),
    PublishedRun(
        "GPT 145.6B, 1536 A100, TP 8 x PP 8, full recomputation",
        {"layers": 80, "hidden": 12288, "heads": 96, **_GPT},
        "a100-80gb",
        1536,
        2304,
        {"engine": "ddp", "tp": 8, "pp": 8, "dp": 24, "micro_batch": 2, "checkpointing": "full"},
        _megatron_tokens(148, 80, 12288),
        f"{_NARAYANAN}: 148 TFLOP/s",
        options={"pp_schedule": "interleaved-1f1b", "virtual_stages": 2},
        options_source="the interleaved schedule: section 5.1 ('we use the interleaved pipeline "
        f"schedule with the scatter/gather optimization enabled'); 2 virtual stages and "
        f"micro-batch 2: {_SC21} (MBS=2, --num-layers-per-virtual-pipeline-stage 5: 80 layers "
        "/ 8 stages / 5)",
    ),
    PublishedRun(
        "GPT 22B, 8 A100, TP 8, selective recomputation",
        {"layers": 48, "hidden": 6144, "heads": 64, **_GPT},
        "a100-80gb",
        8,
        4,
        {"engine": "ddp", "tp": 8, "pp": 1, "dp": 1, "checkpointing": "selective"},
        4 * 2048 / 1.10 / 8,
        f"{_KORTHIKANTI}: 1.10 s a step of 4 x 2048 tokens",
        note="micro-batch 4 not pinned: the Session's amp (torch autocast) keeps the residual "
        "stream in fp32, which puts it at 82.4 GiB, over the A100's 79.1; Megatron-LM's "
        "16-bit modules keep it in 16 bits and sequence parallelism splits it over the 8 GPUs",
    ),
    PublishedRun(
        "GPT 22B, 8 A100, TP 8, full recomputation",
        {"layers": 48, "hidden": 6144, "heads": 64, **_GPT},
        "a100-80gb",
        8,
        4,
        {"engine": "ddp", "tp": 8, "pp": 1, "dp": 1, "micro_batch": 4, "checkpointing": "full"},
        4 * 2048 / 1.42 / 8,
        f"{_KORTHIKANTI}: 1.42 s a step of 4 x 2048 tokens",
    ),
    PublishedRun(
        "GPT-3 175B, 64 A100, TP 8 x PP 8, full recomputation",
        {"layers": 96, "hidden": 12288, "heads": 96, **_GPT},
        "a100-80gb",
        64,
        64,
        {"engine": "ddp", "tp": 8, "pp": 8, "dp": 1, "micro_batch": 1, "checkpointing": "full"},
        64 * 2048 / 18.13 / 64,
        f"{_KORTHIKANTI}: 18.13 s a step of 64 x 2048 tokens",
        options={"pp_schedule": "interleaved-1f1b", "virtual_stages": 3},
        options_source="3 virtual stages: section 6 ('We use the interleaving schedule with "
        "three interleaving stages (m = 3) for the 175B and 530B models')",
    ),
    PublishedRun(
        "GPT 1T, 512 A100, TP 8 x PP 64, full recomputation",
        {"layers": 128, "hidden": 25600, "heads": 160, **_GPT},
        "a100-80gb",
        512,
        512,
        {"engine": "ddp", "tp": 8, "pp": 64, "dp": 1, "micro_batch": 1, "checkpointing": "full"},
        512 * 2048 / 94.42 / 512,
        f"{_KORTHIKANTI}: 94.42 s a step of 512 x 2048 tokens",
        outside="one efficiency per GPU: the paper's 1T layers (h = 25,600) ran at HFU 57.0% "
        "(Table 5, with its bubble), against the A100 median of 0.52 the model uses, and "
        "the model keeps TP all-reduces and the 63/512 bubble fully exposed",
    ),
    PublishedRun(
        "Llama 3.1 8B, seq 32768, 8 H100, FSDP 8, full recomputation",
        {"model": "llama-3-8b", "seq_len": 32768},
        "h100",
        8,
        8,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "cp": 1,
            "dp": 8,
            "micro_batch": 1,
            "checkpointing": "full",
        },  # fmt: skip
        3890,
        _TT_CP,
        options={"compile": True, "float8": True},
        note=_TT_CP_MEMORY,
    ),
    PublishedRun(
        "Llama 3.1 8B, seq 65536, 8 H100, FSDP 4 x CP 2, full recomputation",
        {"model": "llama-3-8b", "seq_len": 65536},
        "h100",
        8,
        4,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "cp": 2,
            "dp": 4,
            "micro_batch": 1,
            "checkpointing": "full",
        },  # fmt: skip
        2540,
        _TT_CP,
        options={"compile": True, "float8": True},
    ),
    PublishedRun(
        "Llama 3.1 8B, seq 131072, 8 H100, FSDP 2 x CP 4, full recomputation",
        {"model": "llama-3-8b", "seq_len": 131072},
        "h100",
        8,
        2,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "cp": 4,
            "dp": 2,
            "micro_batch": 1,
            "checkpointing": "full",
        },  # fmt: skip
        1071,
        _TT_CP,
        options={"compile": True, "float8": True},
        outside=_TT_CP_RATE.format(ratio="1.23"),
    ),
    PublishedRun(
        "Llama 3.1 8B, seq 262144, 8 H100, CP 8, full recomputation",
        {"model": "llama-3-8b", "seq_len": 262144},
        "h100",
        8,
        1,
        {
            "engine": "full_shard",
            "tp": 1,
            "pp": 1,
            "cp": 8,
            "dp": 1,
            "micro_batch": 1,
            "checkpointing": "full",
        },  # fmt: skip
        548,
        _TT_CP,
        options={"compile": True, "float8": True},
        outside=_TT_CP_RATE.format(ratio="1.27"),
    ),
)


@dataclass(frozen=True)
class Compared:
    """One row planned: the predicted tokens/s per GPU, the measured, their ratio (the
    measured divided by `missing_factor` first), and the plan that was compared."""

    run: PublishedRun
    predicted_tokens_per_gpu: float
    ratio: float
    plan_label: str
    micro_batch: int

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE


def compare(run: PublishedRun, **plan_options: Any) -> Compared:
    """`run` planned with its layout pinned (the fastest plan of that layout that fits)."""
    from workbench.planner import plan

    gpus_per_node = min(run.gpus, 8)
    result = plan(
        **run.model,
        gpu=run.planned_gpu or run.gpu,
        gpus=run.gpus,
        gpus_per_node=gpus_per_node,
        global_batch=run.global_batch,
        pin=run.pin,
        offload=False,
        **{**run.options, **plan_options},
    )
    best = result.best
    predicted = best.tokens_per_s / run.gpus
    ratio = predicted / (run.measured_tokens_per_gpu / run.missing_factor)
    return Compared(run, predicted, ratio, best.label(), int(best.settings["micro_batch"]))


def table(rows: list[Compared]) -> str:
    """The markdown table docs/planner.md holds."""
    lines = [
        "| run | pinned layout | measured tokens/s/GPU | predicted | predicted / measured "
        "| what the model lacks | source |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for c in rows:
        r = c.run
        lacks = r.missing or "-"
        if r.missing_factor != 1.0:
            lacks += f" (measured / {r.missing_factor:.2f} compared)"
        if r.note:
            lacks += f"; {r.note}"
        if r.outside:
            lacks += f"; outside {TOLERANCE:.0%}: {r.outside}"
        if r.planned_gpu:
            lacks += f"; planned on {r.planned_gpu} (same peak and links: the estimator's peak "
            lacks += f"exceeds {r.gpu}'s 80 GB)"
        source = f"{r.source}; {r.options_source}" if r.options_source else r.source
        lines.append(
            f"| {r.name} | {c.plan_label} | {r.measured_tokens_per_gpu:,.0f} | "
            f"{c.predicted_tokens_per_gpu:,.0f} | {c.ratio:.2f} | {lacks} | {source} |"
        )
    return "\n".join(lines)


__all__ = ["COMPILE_H100", "FLOAT8_H100", "RUNS", "TOLERANCE", "Compared", "PublishedRun",
           "compare", "table"]  # fmt: skip
