"""One row per engine: everything the package knows about an `Engine`, in one place.

    ENGINES[engine]            its `EngineRow`
    engine_for(config, ranks)  which engine trains a config (the one answer)
    engine_problems(config, ranks)  what that engine cannot train of a valid config
    accounting_for(config, ranks)   the estimator's accounting of that engine's layout

An `EngineRow` holds an engine's backend (the "module:Class" that trains it, imported only
when picked), its memory accounting in the estimator ("paper", "deepspeed" or "fsdp"), its
export strategy (what an exported job runs it as) and what it can train (its refusals, each
naming the setting, its value and why). Every table that repeats these facts reads the row:
`workbench.train.backends.BACKENDS`, the prediction's accounting, `workbench export`'s
strategy and checks, a Session's live changes and the dry run's checks.

A new engine is one `Engine` member (workbench/choices.py), its row here and its backend
file in workbench/train/backends/ (a `DistributedBackend` subclass when it spans ranks).

Pure Python: imports the config, the optimizer rows and the choices, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.choices import (  # the engine refusals TrainConfig makes too, re-exported
    PP_NOT_DEEPSPEED,
    TP_NOT_DEEPSPEED,
    Documents,
    Engine,
    FsdpMode,
    OffloadDevice,
    OptimizerName,
    Precision,
    bf16_true_problem,
)
from workbench.config import TrainConfig, plain_value
from workbench.problems import ConfigError, SettingProblem

#: An engine's refusals of a valid config on some number of ranks (empty: it trains it).
Check = Callable[[TrainConfig, int], list[SettingProblem]]


def engine_for(config: TrainConfig, world_size: int = 1) -> Engine:
    """The one answer to "which engine runs this config on `world_size` ranks": PyTorch's
    pipelining when `pp` > 1; tensor parallelism when `tp` > 1 (FSDP2 over the
    data-parallel ranks when `fsdp` is on too); FSDP2 when `fsdp` is on; DeepSpeed when the
    config asks for it (ZeRO >= 1, DeepSpeed 16-bit) or a Session trains several ranks
    without FSDP (its data parallelism is DeepSpeed's ZeRO-0); else the plain loop. Every
    caller (the backends, the prediction, live changes, export) asks here."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError([SettingProblem("world_size", world_size, "must be an integer >= 1")])
    if int(config.pp) > 1:
        return Engine.PIPELINE
    if int(config.tp) > 1:
        return Engine.TENSOR_PARALLEL
    if FsdpMode(config.fsdp) is not FsdpMode.OFF:
        return Engine.FSDP
    if config.uses_deepspeed or world_size > 1:
        return Engine.DEEPSPEED
    return Engine.PLAIN


# --- the refusals' texts --------------------------------------------------------------------


#: Which engines train QLoRA (each row's `qlora` says why one does not).
QLORA_ENGINES = (
    "a Session trains QLoRA's 4-bit base in the plain loop (bitsandbytes' Linear4bit) and "
    "under FSDP2 on 2+ ranks (torchao's NF4 tensor, which FSDP2 shards and gathers, as "
    "torchtune does), under a torch precision (fp32, amp-bf16, amp-fp16, bf16-true); LoRA "
    "on a base in its own dtype trains on every data-parallel engine"
)

#: Why an engine does not train QLoRA (its row's `qlora`).
QLORA_NOT_DEEPSPEED = (
    "DeepSpeed's engine casts every weight to its 16-bit dtype and flattens them into its "
    "partitions, where bitsandbytes' packed 4-bit codes and their quantisation state do not "
    "survive"
)
QLORA_NOT_TENSOR_PARALLEL = (
    "the tensor-parallel plan splits each linear layer's weight along a dimension, which a "
    "4-bit layer's packed codes and block scales are not split along"
)
QLORA_FSDP_ONE_RANK = (
    "torch's FSDP2 on a one-rank mesh copies a parameter's first all-gather input only, "
    "skipping the NF4 tensor's own gather hooks: launch 2+ ranks, or train QLoRA in the "
    "plain loop (`fsdp`='off')"
)
QLORA_NOT_PIPELINE = "LoRA's adapters are not put on the pipeline stages' copies"

#: What the tensor-parallel and pipeline engines do not train, with why.
TP_UNSUPPORTED: dict[str, str] = {
    "lora_rank": "LoRA's adapters are not put on the model-parallel engines' copies",
    "optimizer_in_backward": "its per-parameter hooks would step unreduced gradients",
    "offload_params": "the model-parallel engines keep their shards on the device",
    "offload_optimizer": "the model-parallel engines keep their shards on the device",
    "compile": "torch.compile is not wired into the model-parallel engines",
    "activation_offload": "its hooks are not wired into the model-parallel engines",
}


def _ranks(world_size: int) -> str:
    return f"{world_size} rank{'s' if world_size > 1 else ''}"


# --- each engine's capability check ---------------------------------------------------------


def tp_problems(config: TrainConfig, world_size: int) -> list[SettingProblem]:
    """What `tp` > 1 cannot train on `world_size` ranks (empty when it can): a `tp` that
    does not divide the ranks, and the settings the tensor-parallel engine refuses."""
    tp = int(config.tp)
    if tp == 1:
        return []
    p: list[SettingProblem] = []
    if world_size % tp:
        p.append(
            SettingProblem(
                "tp",
                tp,
                f"must divide the {_ranks(world_size)} "
                f"(ranks = tp x data parallel; launch {tp} x N ranks)",
            )
        )
    if config.sequence_parallel and Documents(config.documents) is not Documents.STREAM:
        p.append(
            SettingProblem(
                "sequence_parallel",
                True,
                "splits the sequence of a stream of characters; a document batch's mask and "
                "positions are not split with it: use `documents`='stream' with it",
            )
        )
    if FsdpMode(config.fsdp) is FsdpMode.NO_SHARD:
        p.append(
            SettingProblem(
                "fsdp",
                "no_shard",
                "with `tp` > 1, FSDP2 shards over the data-parallel ranks of the 2-D mesh: use "
                "full_shard or shard_grad_op, or 'off' (plain data parallel over them)",
            )
        )
    return p + _model_parallel_limits(config, Engine.TENSOR_PARALLEL)


def pp_problems(config: TrainConfig, world_size: int) -> list[SettingProblem]:
    """What `pp` > 1 cannot train on `world_size` ranks (empty when it can): a `pp` (times
    `tp`) that does not divide the ranks, and what the pipeline engine refuses (those of
    the tensor-parallel engine, and document batches). Fewer micro-batches than stages is
    the config's own problem (`TrainConfig` refuses it)."""
    pp = int(config.pp)
    if pp == 1:
        return []
    p: list[SettingProblem] = []
    tp = int(config.tp)
    if world_size % (pp * tp):
        what = f"times `tp`={tp}, " if tp > 1 else ""
        p.append(
            SettingProblem(
                "pp",
                pp,
                f"{what}must divide the {_ranks(world_size)} "
                f"(ranks = pp x tp x data parallel; launch {pp * tp} x N ranks)",
            )
        )
    if Documents(config.documents) is not Documents.STREAM:
        p.append(
            SettingProblem(
                "documents",
                plain_value(config.documents),
                "a pipeline stage passes hidden states only, not the document mask: use "
                "'stream' with `pp` > 1",
            )
        )
    return p + _model_parallel_limits(config, Engine.PIPELINE)


def _model_parallel_limits(config: TrainConfig, engine: Engine) -> list[SettingProblem]:
    """The settings the tensor-parallel and pipeline engines do not train."""
    field = "tp" if engine is Engine.TENSOR_PARALLEL else "pp"
    size = int(getattr(config, field))
    p: list[SettingProblem] = []
    if Precision(config.precision) is Precision.AMP_FP16:
        p.append(
            SettingProblem(
                "precision",
                "amp-fp16",
                f"torch's GradScaler is not wired into the model-parallel engines: use fp32, "
                f"amp-bf16 or bf16-true with `{field}` > 1",
            )
        )
    p += _optimizer_problems(config, engine)
    for name, why in TP_UNSUPPORTED.items():
        value = getattr(config, name)
        on = OffloadDevice(value) is not OffloadDevice.NONE if "offload_" in name else value
        if on:
            p.append(SettingProblem(name, plain_value(value), f"not with `{field}`={size}: {why}"))
    return p


def _optimizer_problems(config: TrainConfig, engine: Engine) -> list[SettingProblem]:
    """The optimizer's refusal of `engine` (its row's `engines`), if any."""
    optimizer = OptimizerName(config.optimizer)
    if optimizer.row.in_session and engine.value not in optimizer.row.engines:
        return [SettingProblem("optimizer", optimizer.value, optimizer.row.engines_reason or "")]
    return []


#: why DeepSpeed does not train torch's amp-fp16 here (DeepSpeed 0.19's engine scales the
#: loss of its `torch_autocast` fp16 with torch's GradScaler only without ZeRO, and the
#: workbench maps neither that block nor its loss-scale settings onto it)
AMP_FP16_DEEPSPEED = (
    "the workbench does not map amp-fp16 onto DeepSpeed (its torch_autocast fp16 scales "
    "the loss only without ZeRO, and takes none of the loss-scale settings); use "
    "precision='fp16' (DeepSpeed's loss-scaled fp16) or 'amp-bf16'"
)


def _deepspeed_why(config: TrainConfig, world_size: int) -> str:
    """What sends `config` to DeepSpeed, as a problem says it."""
    if int(config.zero_stage):
        return f"`zero_stage`={int(config.zero_stage)} runs"
    return f"{world_size} ranks without `fsdp`"


def _deepspeed_problems(config: TrainConfig, world_size: int) -> list[SettingProblem]:
    """Pure bf16 or torch's amp-fp16 when several ranks without FSDP send a config to
    DeepSpeed (with ZeRO >= 1 the config itself is refused already); then what every
    data-parallel engine refuses."""
    if Precision(config.precision) is Precision.BF16_TRUE:
        return [bf16_true_problem(f"{world_size} ranks without `fsdp` train through it")]
    if Precision(config.precision) is Precision.AMP_FP16:
        return [
            SettingProblem(
                "precision",
                "amp-fp16",
                f"{_deepspeed_why(config, world_size)} train through DeepSpeed: "
                + AMP_FP16_DEEPSPEED,
            )
        ]
    return _data_parallel_problems(Engine.DEEPSPEED)(config, world_size)


def _data_parallel_problems(engine: Engine) -> Check:
    """The check of a data-parallel engine (plain, DeepSpeed, FSDP): the optimizer's row,
    then what only the plain loop trains (the optimizer step in backward). QLoRA is each
    row's own word (`qlora_problems`)."""

    def check(config: TrainConfig, world_size: int) -> list[SettingProblem]:
        p = _optimizer_problems(config, engine)
        if p or engine is Engine.PLAIN or config.qlora:
            return p
        if config.optimizer_in_backward:
            return [
                SettingProblem(
                    "optimizer_in_backward",
                    True,
                    f"steps in the plain loop only; {world_size} ranks without `fsdp` train "
                    "through DeepSpeed",
                )
            ]
        return []

    return check


# --- the rows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRow:
    """What the package knows about one engine."""

    engine: Engine
    #: the backend class that trains it, "module:Class" (imported only when picked)
    backend: str
    #: the estimator's accounting of its memory layout: "paper", "deepspeed" or "fsdp"
    accounting: str
    #: what an exported job runs it as: "ddp", "deepspeed", "fsdp", or the model-parallel
    #: engines' names (which the export checks refuse where a format does not carry them)
    export_strategy: str
    #: the setting `workbench export --format fsdp` names when it refuses this engine's
    #: config ("fsdp": no FSDP mode, "zero_stage": a DeepSpeed config), None: it exports it
    fsdp_export_refusal: str | None
    #: what it cannot train of a valid config on some number of ranks (empty: it can)
    check: Check
    #: whether it takes the `fsdp` setting as FSDP2 over its data-parallel ranks (the
    #: estimator then uses FSDP2's accounting)
    fsdp_inside: bool = False
    #: QLoRA: None when it trains a 4-bit base, else why it does not
    qlora: str | None = None
    #: QLoRA: the fewest ranks it trains a 4-bit base on, and why fewer do not
    qlora_min_ranks: tuple[int, str] = (1, "")

    def accounting_of(self, config: TrainConfig) -> str:
        """The accounting of this engine's layout for `config` (FSDP2's when it shards
        its data-parallel ranks with `fsdp`)."""
        if self.fsdp_inside and FsdpMode(config.fsdp) is not FsdpMode.OFF:
            return ENGINES[Engine.FSDP].accounting
        return self.accounting


_BACKENDS = "workbench.train.backends"

ENGINES: dict[Engine, EngineRow] = {
    Engine.PLAIN: EngineRow(
        Engine.PLAIN,
        backend=f"{_BACKENDS}.plain:PlainBackend",
        accounting="paper",
        export_strategy="ddp",
        fsdp_export_refusal="fsdp",
        check=_data_parallel_problems(Engine.PLAIN),
    ),
    Engine.DEEPSPEED: EngineRow(
        Engine.DEEPSPEED,
        backend=f"{_BACKENDS}.deepspeed:DeepSpeedBackend",
        accounting="deepspeed",
        export_strategy="deepspeed",
        fsdp_export_refusal="zero_stage",
        check=_deepspeed_problems,
        qlora=QLORA_NOT_DEEPSPEED,
    ),
    Engine.FSDP: EngineRow(
        Engine.FSDP,
        backend=f"{_BACKENDS}.fsdp:FSDPBackend",
        accounting="fsdp",
        export_strategy="fsdp",
        fsdp_export_refusal=None,
        check=_data_parallel_problems(Engine.FSDP),
        qlora_min_ranks=(2, QLORA_FSDP_ONE_RANK),
    ),
    Engine.TENSOR_PARALLEL: EngineRow(
        Engine.TENSOR_PARALLEL,
        backend=f"{_BACKENDS}.tensor_parallel:TensorParallelBackend",
        accounting="paper",
        export_strategy="tensor-parallel",
        fsdp_export_refusal="fsdp",  # with `fsdp` off: plain data parallel over the rest
        check=tp_problems,
        fsdp_inside=True,
        qlora=QLORA_NOT_TENSOR_PARALLEL,
    ),
    Engine.PIPELINE: EngineRow(
        Engine.PIPELINE,
        backend=f"{_BACKENDS}.pipeline:PipelineBackend",
        accounting="paper",
        export_strategy="pipeline",
        fsdp_export_refusal=None,  # `pp` is refused by the export checks
        check=pp_problems,
        qlora=QLORA_NOT_PIPELINE,
    ),
}


def engine_row(config: TrainConfig, world_size: int = 1) -> EngineRow:
    """The row of the engine that trains `config` on `world_size` ranks."""
    return ENGINES[engine_for(config, world_size)]


def engine_problems(config: TrainConfig, world_size: int = 1) -> list[SettingProblem]:
    """What the engine `engine_for(config, world_size)` picks cannot train of a valid
    `config` (empty when it can): its row's check (pure bf16 or torch's amp-fp16 when
    several ranks without FSDP send it to DeepSpeed, the model-parallel engines' limits
    (`tp_problems`, `pp_problems`), an optimizer its row does not train, QLoRA and the
    optimizer step in backward off the plain loop), then QLoRA where its row does not
    train it (`qlora_problems`)."""
    return engine_row(config, world_size).check(config, world_size) + qlora_problems(
        config, world_size
    )


def qlora_problems(config: TrainConfig, world_size: int = 1) -> list[SettingProblem]:
    """QLoRA on an engine whose row does not train it, naming the engine and why (empty
    without QLoRA or where it trains). A precision that sends the setup to DeepSpeed
    (fp16, bf16) is DeepSpeed's refusal."""
    if not config.qlora:
        return []
    engine = engine_for(config, world_size)
    why = ENGINES[engine].qlora
    fewest, few_why = ENGINES[engine].qlora_min_ranks
    if why is None and world_size < fewest:
        why = few_why
    if why is None:
        return []
    return [
        SettingProblem(
            "qlora",
            True,
            f"{QLORA_ENGINES}; this setup trains through {engine.value} "
            f"({_ranks(world_size)}{_deepspeed_cause(config, world_size, engine)}): {why}",
        )
    ]


def _deepspeed_cause(config: TrainConfig, world_size: int, engine: Engine) -> str:
    """What sends `config` to DeepSpeed, said after the ranks ("" for another engine)."""
    if engine is not Engine.DEEPSPEED:
        return ""
    if Precision(config.precision).is_deepspeed:
        return f", `precision`={Precision(config.precision).value} is DeepSpeed's 16-bit mode"
    if int(config.zero_stage):
        return f", `zero_stage`={int(config.zero_stage)}"
    return ""


def accounting_for(config: TrainConfig, world_size: int = 1) -> str:
    """The estimator accounting of the engine that trains `config` on `world_size` ranks
    (`engine_for`): FSDP2's layout under FSDP (and under tensor parallelism with `fsdp`),
    DeepSpeed's under DeepSpeed, else the ZeRO paper's."""
    return engine_row(config, world_size).accounting_of(config)


#: The estimator's accounting for each engine's memory layout (from the rows).
ACCOUNTING: dict[Engine, str] = {engine: row.accounting for engine, row in ENGINES.items()}


__all__ = [
    "ACCOUNTING",
    "ENGINES",
    "PP_NOT_DEEPSPEED",
    "QLORA_ENGINES",
    "QLORA_NOT_DEEPSPEED",
    "QLORA_FSDP_ONE_RANK",
    "QLORA_NOT_PIPELINE",
    "QLORA_NOT_TENSOR_PARALLEL",
    "TP_NOT_DEEPSPEED",
    "TP_UNSUPPORTED",
    "EngineRow",
    "accounting_for",
    "bf16_true_problem",
    "engine_for",
    "engine_problems",
    "engine_row",
    "pp_problems",
    "qlora_problems",
    "tp_problems",
]
