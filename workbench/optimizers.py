"""One row per optimizer: every fact the workbench knows of it, in one place.

An `OptimizerRow` holds an optimizer's name (the `TrainConfig.optimizer` value), its state
layout (the family a switch between engines carries, the tensors of that family, the fp32
state bytes per parameter), what its step allocates beyond its states, whether it exists
only as a fused kernel, how a Session builds it (the import path of its class, of the
class for sharded parameters where that one cannot step FSDP2's shards, and the keywords
it takes from the config: data, built by `workbench.train.backends.optimizer`),
its DeepSpeed name, the engines a Session trains it on and why not on the others.
`OPTIMIZERS` lists the rows; `workbench.choices.OptimizerName` is made from them, and the
tables of the estimator, the engines and the DeepSpeed import/export read them.

Pure: imports nothing (no torch, nothing of the package), so the leaves can read it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: How an optimizer's states are laid out (`OptimizerRow.state_layout`).
STATE_LAYOUTS = ("elementwise", "factored")

#: The engines a Session trains with (`workbench.choices.Engine` values).
ALL_ENGINES = ("plain", "deepspeed", "fsdp", "tensor-parallel", "pipeline")


@dataclass(frozen=True)
class Temporaries:
    """What an unfused step allocates beyond the states, in tensors the size of the stepped
    parameters: `copies` of them all at once under foreach; a for-loop holds `previous`
    tensors the size of the parameter before and `current` the size of the one stepped."""

    copies: int
    previous: int
    current: int


@dataclass(frozen=True)
class OptimizerRow:
    """One optimizer (see the module docstring); `name` is its `TrainConfig.optimizer`."""

    name: str
    #: its `OptimizerName` member ("ADAMW")
    member: str
    #: the state layout a switch between engines carries: "adam" (two moments), "sgd" (a
    #: momentum buffer), None (no state the engines carry over)
    family: str | None
    #: fp32 optimizer-state bytes per parameter, without any master copy (a "factored"
    #: layout: a 1-dim parameter's, the bound the estimator counts without shapes)
    state_bytes_per_param: int
    #: its state tensors, as torch names them
    state_keys: tuple[str, ...] = ()
    #: "elementwise" (each state the size of its parameter) or "factored" (a parameter of
    #: 2+ dims keeps a row and a column statistic, shape[:-1] and shape[:-2] + shape[-1:],
    #: a 1-dim one a full state: `factored_state_elements`)
    state_layout: str = "elementwise"
    #: 8-bit states: they stay 8-bit under pure bf16
    eight_bit: bool = False
    #: a 1-bit optimizer: error-feedback buffers beyond its states, no ZeRO
    error_feedback: bool = False
    #: exists only as a fused kernel (DeepSpeed's, bitsandbytes', torchao's)
    fused_only: bool = False
    #: DeepSpeed runs a fused kernel of it (its "auto" implementation there)
    deepspeed_fused: bool = True
    #: its torch class takes `fused=True` (torch 2.13: Adam, AdamW, SGD, Adagrad; not
    #: Adafactor, whose signature has `foreach` only)
    torch_fused: bool = True
    #: the implementation torch builds when not told ("foreach": torch's default on a GPU
    #: for most optimizers; "for-loop" where its class has no foreach default)
    default_impl: str = "foreach"
    #: an unfused step's temporaries without and with weight decay (None: none)
    step_temporaries: Temporaries | None = None
    decay_temporaries: Temporaries | None = None
    #: "module:Class" a Session builds (None: a Session does not build it)
    factory: str | None = None
    #: (keyword, source): source is a TrainConfig field name, or "=<float>" a constant
    factory_kwargs: tuple[tuple[str, str], ...] = ()
    #: which library provides the class, for the message when it does not import
    library: str | None = None
    #: "module:Class" built instead where `factory` does not import (not for sharded
    #: parameters: FSDP's shards need the factory's own class)
    fallback_factory: str | None = None
    #: "module:Class" built instead of `factory` when the parameters are sharded (DTensors:
    #: FSDP2's shards), same keywords, for a class that cannot step them (None: `factory`)
    sharded_factory: str | None = None
    #: a warning its class gives that the Session says once itself (a message prefix)
    quiet_warning: str | None = None
    #: DeepSpeed's "type" for it (None: DeepSpeed has no such optimizer)
    deepspeed_name: str | None = None
    #: DeepSpeed lists its class as tested with ZeRO (else the export sets
    #: "zero_allow_untested_optimizer" at stages 1-3)
    deepspeed_zero_tested: bool = False
    #: the engines a Session trains it on (`ALL_ENGINES` values)
    engines: tuple[str, ...] = ()
    #: why not on the others (None where it trains on every engine)
    engines_reason: str | None = None
    #: why it cannot step inside backward (`optimizer_in_backward`; None where it can)
    in_backward_reason: str | None = None
    #: why the exported FSDP and Lightning jobs do not train it (None: they do, if a
    #: Session does; their copy of the row is `job_common.OPTIMIZER_CLASSES`)
    export_reason: str | None = None
    #: why those jobs do not train it on tensor-parallel layers (None: they do)
    export_tp_reason: str | None = None
    #: why a dry run (fake tensors under the memory tracker) cannot step it (None: it can)
    dry_run_reason: str | None = None
    #: the names Hugging Face's TrainingArguments(optim=...) gives it
    hf_optims: tuple[str, ...] = ()
    #: how to ask for it in Hugging Face's Trainer and in Lightning (for the advice)
    hf_hint: str | None = None
    lightning_hint: str | None = None
    #: why a Session cannot train it at all, and the nearest optimizer it trains
    not_in_session: tuple[str, str] | None = None
    #: other names it goes by (bitsandbytes', torchao's)
    aliases: tuple[str, ...] = ()
    #: its states live in CUDA unified memory (cudaMallocManaged: bitsandbytes' paged
    #: optimizers), which the caching allocator does not hand out and the driver pages to
    #: the host when the GPU is full: beside the device peak, not in it
    paged: bool = False

    @property
    def in_session(self) -> bool:
        """Whether a Session trains it (on some engine)."""
        return bool(self.engines)

    @property
    def implementations(self) -> tuple[str, ...]:
        """The implementations it steps in: "fused" alone for one that exists only as a
        fused kernel; torch's classes' "foreach" and "for-loop", and "fused" where the
        class takes `fused=True` (`torch_fused`)."""
        if self.fused_only:
            return ("fused",)
        return ("foreach", "for-loop", "fused") if self.torch_fused else ("foreach", "for-loop")

    def temporaries(self, decay: bool) -> Temporaries | None:
        """Its step temporaries with or without weight decay."""
        return self.decay_temporaries if decay else self.step_temporaries


_ADAM_KEYS = ("exp_avg", "exp_avg_sq")
_LR_WD = (("lr", "lr"), ("weight_decay", "weight_decay"))
_ONEBIT = (
    "the Session does not build DeepSpeed's 1-bit optimizers (DeepSpeed 0.19.8 no longer "
    "ships them); "
)

#: 8-bit AdamW's engines, and why not DeepSpeed, tp or pp
ADAM8BIT_ENGINES = (
    "8-bit AdamW (torchao's AdamW8bit) trains in the plain loop and under FSDP (`zero_stage`"
    "=0, precision fp32, amp-bf16, amp-fp16 or bf16-true): DeepSpeed builds its own "
    "optimizers, and the model-parallel engines (tp, pp) build torch's; the estimator "
    "counts it for every engine"
)
#: bitsandbytes' paged 8-bit AdamW's engine, and why not the others
PAGED_ENGINES = (
    "bitsandbytes' paged 8-bit AdamW trains in the plain loop (one rank, `zero_stage`=0, no "
    "`fsdp`): DeepSpeed builds its own optimizers, and FSDP's shards take torchao's "
    "(`optimizer`='adam8bit'); the estimator counts it for every engine"
)

OPTIMIZERS: tuple[OptimizerRow, ...] = (
    OptimizerRow(
        name="adamw",
        member="ADAMW",
        family="adam",
        state_bytes_per_param=8,
        state_keys=_ADAM_KEYS,
        step_temporaries=Temporaries(1, 1, 2),
        decay_temporaries=Temporaries(1, 1, 2),
        factory="torch.optim:AdamW",
        factory_kwargs=_LR_WD,
        hf_optims=("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw"),
        hf_hint='optim="adamw_torch"',
        lightning_hint="torch.optim.AdamW in configure_optimizers",
        deepspeed_name="AdamW",
        deepspeed_zero_tested=True,
        engines=ALL_ENGINES,
    ),
    OptimizerRow(
        name="adam",
        member="ADAM",
        family="adam",
        state_bytes_per_param=8,
        state_keys=_ADAM_KEYS,
        step_temporaries=Temporaries(1, 1, 2),
        decay_temporaries=Temporaries(1, 1, 3),  # Adam's L2 decay copies the gradient
        factory="torch.optim:Adam",
        factory_kwargs=_LR_WD,
        hf_optims=("adam",),
        deepspeed_name="Adam",
        deepspeed_zero_tested=True,
        engines=ALL_ENGINES,
    ),
    OptimizerRow(
        name="sgd",
        member="SGD",
        family="sgd",
        state_bytes_per_param=4,
        state_keys=("momentum_buffer",),
        deepspeed_fused=False,
        decay_temporaries=Temporaries(1, 0, 1),  # grad + decay x param, into a new tensor
        factory="torch.optim:SGD",
        factory_kwargs=(("lr", "lr"), ("momentum", "momentum"), ("weight_decay", "weight_decay")),
        hf_optims=("sgd",),
        hf_hint='optim="sgd"',
        deepspeed_name="SGD",
        engines=ALL_ENGINES,
    ),
    OptimizerRow(
        name="sgd-nomomentum",
        member="SGD_NOMOMENTUM",
        family=None,
        state_bytes_per_param=0,
        deepspeed_fused=False,
        decay_temporaries=Temporaries(1, 0, 1),
        factory="torch.optim:SGD",
        factory_kwargs=(("lr", "lr"), ("momentum", "=0.0"), ("weight_decay", "weight_decay")),
        deepspeed_name="SGD",
        engines=ALL_ENGINES,
    ),
    OptimizerRow(
        name="adam8bit",
        member="ADAM8BIT",
        family="adam",  # carried as fp32 moments, re-quantized when loaded
        state_bytes_per_param=2,  # two 8-bit states
        state_keys=_ADAM_KEYS,
        eight_bit=True,
        fused_only=True,
        factory="torchao.optim:AdamW8bit",
        factory_kwargs=_LR_WD,
        library="torchao",
        fallback_factory="bitsandbytes.optim:AdamW8bit",
        hf_optims=("adamw_bnb_8bit", "adamw_8bit", "adamw_torch_8bit"),
        hf_hint='optim="adamw_bnb_8bit" (or "adamw_torch_8bit", torchao\'s)',
        lightning_hint="an 8-bit AdamW in configure_optimizers (torchao.optim.AdamW8bit or "
        "bitsandbytes.optim.AdamW8bit)",
        export_tp_reason=(
            "the FSDP and Lightning jobs train torchao's 8-bit AdamW data parallel and under "
            "FSDP2, not on tensor-parallel layers (nor does a Session)"
        ),
        dry_run_reason=(
            "torchao's 8-bit AdamW steps through torch.compile, which does not run under the "
            "memory tracker's dispatch mode; the formula counts its 2 bytes per parameter "
            "(workbench.predict_memory), and a Session measures it"
        ),
        engines=("plain", "fsdp"),
        engines_reason=ADAM8BIT_ENGINES,
        aliases=("adamw8bit",),
    ),
    OptimizerRow(
        name="paged-adam8bit",
        member="PAGED_ADAM8BIT",
        family="adam",  # bitsandbytes' state1/state2, as fp32 moments
        state_bytes_per_param=2,  # the same, in pageable memory
        state_keys=_ADAM_KEYS,
        eight_bit=True,
        fused_only=True,
        factory="bitsandbytes.optim:PagedAdamW8bit",
        factory_kwargs=_LR_WD,
        library="bitsandbytes",
        # on a CPU bitsandbytes keeps the states unpaged, and says so on the first step;
        # `optimizer_note` says it once, where the Session reports its settings
        quiet_warning="Paged optimizers are not supported on CPU",
        hf_optims=("paged_adamw_8bit",),
        hf_hint='optim="paged_adamw_8bit"',
        lightning_hint="bitsandbytes.optim.PagedAdamW8bit in configure_optimizers",
        export_reason=(
            "the exported jobs build torch's, torchao's or DeepSpeed's optimizers; a Session "
            "trains bitsandbytes' paged one (or export optimizer='adam8bit')"
        ),
        dry_run_reason=(
            "bitsandbytes' 8-bit step is a C++/CUDA kernel fake tensors cannot run; the "
            "formula counts its 2 bytes per parameter (workbench.predict_memory), and a "
            "Session measures it"
        ),
        engines=("plain",),
        engines_reason=PAGED_ENGINES,
        in_backward_reason=(
            "bitsandbytes' paged optimizer steps every parameter in one optimizer; the step "
            "in backward gives each its own: use optimizer='adam8bit' with "
            "`optimizer_in_backward`"
        ),
        aliases=("paged-adamw8bit", "paged_adamw8bit"),
        paged=True,
    ),
    OptimizerRow(
        name="adafactor",
        member="ADAFACTOR",
        family=None,  # no moments an engine switch carries
        state_bytes_per_param=4,  # a 1-dim parameter's `variance`; matrices far less
        state_keys=("row_var", "col_var", "variance"),
        state_layout="factored",
        deepspeed_fused=False,
        torch_fused=False,  # torch.optim.Adafactor(..., foreach=None): no fused kernel
        default_impl="for-loop",  # its class has no foreach default: None is the loop
        # the for-loop (torch's default for it): row_var @ col_var, a parameter-sized
        # estimate, while the previous parameter's is still bound
        step_temporaries=Temporaries(1, 1, 1),
        decay_temporaries=Temporaries(1, 1, 1),  # decay scales the parameter in place
        factory="torch.optim:Adafactor",
        factory_kwargs=_LR_WD,
        # torch 2.13's class fails FSDP2's shards (aten.pow_ on a partial column norm):
        # its subclass reduces each statistic over the ranks, the same arithmetic
        sharded_factory="workbench.train.techniques.sharded_adafactor:ShardedAdafactor",
        lightning_hint="torch.optim.Adafactor in configure_optimizers",
        engines=("plain", "fsdp"),
        engines_reason=(
            "torch's Adafactor (torch.optim.Adafactor) trains in the plain loop and under "
            "FSDP2 (`fsdp`, `zero_stage`=0; its shards step with the same statistics, "
            "reduced over the ranks): DeepSpeed has no Adafactor, and the model-parallel "
            "engines (tp, pp) are left out until a run checks them; the estimator counts "
            "its factored states for every engine"
        ),
        export_reason=(
            "the exported jobs build AdamW, Adam, SGD or 8-bit AdamW (DeepSpeed has no "
            "Adafactor, and FSDP2's shards need the workbench's sharded step, which the "
            "standalone job scripts do not carry); a Session trains torch's Adafactor in "
            "the plain loop and under FSDP"
        ),
        dry_run_reason=(
            "torch's Adafactor reads each parameter's norm with .item() every step, which "
            "fake tensors cannot give; the formula counts its factored states "
            "(workbench.predict_memory), and a Session measures them"
        ),
    ),
    # DeepSpeed's optimizers (docs/estimator.md names the source of each figure):
    OptimizerRow(
        name="lamb",
        member="LAMB",
        family=None,
        state_bytes_per_param=8,  # FusedLamb: exp_avg + exp_avg_sq
        state_keys=_ADAM_KEYS,
        fused_only=True,
        deepspeed_name="Lamb",
        not_in_session=(
            "DeepSpeed's Lamb is FusedLamb, a CUDA kernel (no CPU build), and the Session "
            "does not build it; Lamb is AdamW with a per-layer trust ratio",
            "adamw",
        ),
    ),
    OptimizerRow(
        name="lion",
        member="LION",
        family=None,
        state_bytes_per_param=4,  # FusedLion: exp_avg
        state_keys=("exp_avg",),
        fused_only=True,
        deepspeed_name="Lion",
        deepspeed_zero_tested=True,
        not_in_session=(
            "the Session does not build DeepSpeed's Lion (FusedLion needs CUDA; "
            "DeepSpeedCPULion only runs with optimizer offload)",
            "adamw",
        ),
    ),
    OptimizerRow(
        name="adagrad",
        member="ADAGRAD",
        family=None,
        state_bytes_per_param=4,  # torch Adagrad `sum` / DeepSpeedCPUAdagrad `exp_avg_sq`
        state_keys=("sum",),
        step_temporaries=Temporaries(2, 1, 1),  # sqrt(sum) and -lr x grad together
        decay_temporaries=Temporaries(2, 1, 1),
        deepspeed_name="Adagrad",
        deepspeed_zero_tested=True,
        not_in_session=(
            "the Session does not build Adagrad (it carries Adam and SGD state only)",
            "adam",
        ),
    ),
    OptimizerRow(
        name="onebitadam",
        member="ONEBIT_ADAM",
        family=None,
        state_bytes_per_param=8,  # exp_avg + exp_avg_sq, + error feedback
        state_keys=_ADAM_KEYS,
        error_feedback=True,
        fused_only=True,
        deepspeed_name="OneBitAdam",
        not_in_session=(
            _ONEBIT + "1-bit Adam is Adam with compressed communication and decoupled weight decay",
            "adamw",
        ),
    ),
    OptimizerRow(
        name="zerooneadam",
        member="ZERO_ONE_ADAM",
        family=None,
        state_bytes_per_param=12,  # + momentum_accumulator, + error feedback
        state_keys=(*_ADAM_KEYS, "momentum_accumulator"),
        error_feedback=True,
        fused_only=True,
        deepspeed_name="ZeroOneAdam",
        not_in_session=(
            _ONEBIT + "0/1 Adam is Adam with compressed communication and decoupled weight decay",
            "adamw",
        ),
    ),
    OptimizerRow(
        name="onebitlamb",
        member="ONEBIT_LAMB",
        family=None,
        state_bytes_per_param=12,  # + exp_avg_sq_fresh, + error feedback
        state_keys=(*_ADAM_KEYS, "exp_avg_sq_fresh"),
        error_feedback=True,
        fused_only=True,
        deepspeed_name="OneBitLamb",
        not_in_session=(
            _ONEBIT + "1-bit Lamb is Lamb, AdamW with a per-layer trust ratio, with "
            "compressed communication",
            "adamw",
        ),
    ),
)

#: name -> row
ROWS: dict[str, OptimizerRow] = {row.name: row for row in OPTIMIZERS}

#: the state tensors of each family a switch between engines carries
FAMILY_STATE_KEYS: dict[str | None, tuple[str, ...]] = {
    "adam": _ADAM_KEYS,
    "sgd": ("momentum_buffer",),
    None: (),
}


def factored_state_elements(shapes: Iterable[Sequence[int]], shards: int = 1) -> int:
    """State elements a "factored" optimizer keeps for parameters of `shapes`, each split
    over `shards` ranks along its first dimension (FSDP2's layout): a row statistic of
    shape[:-1] and a column statistic of shape[:-2] + shape[-1:] for 2+ dims (each rank
    keeps the whole column statistic of its rows), the parameter's size for 1 dim."""
    total = 0
    for shape in shapes:
        dims = [int(d) for d in shape]
        if not dims:
            total += 1
            continue
        dims[0] = -(-dims[0] // shards)
        if len(dims) == 1:
            total += dims[0]
            continue
        outer = 1
        for d in dims[:-2]:
            outer *= d
        total += outer * dims[-2] + outer * dims[-1]
    return total


def row(name: object) -> OptimizerRow:
    """The row of `name` (an `OptimizerName` or its value, or an alias); KeyError if none."""
    try:  # the names already looked up (an estimate asks three times)
        return _ROW_OF[name]
    except (KeyError, TypeError):  # not yet, or unhashable
        pass
    key = str(getattr(name, "value", name))
    for r in OPTIMIZERS:
        if key == r.name or key in r.aliases:
            if len(_ROW_OF) < 256 and isinstance(name, (str, enum.Enum)):
                _ROW_OF[name] = r
            return r
    raise KeyError(key)


#: `row`'s answers, by the name asked (an `OptimizerName` or a text; bounded)
_ROW_OF: dict[object, OptimizerRow] = {}


__all__ = [
    "ADAM8BIT_ENGINES",
    "ALL_ENGINES",
    "FAMILY_STATE_KEYS",
    "OPTIMIZERS",
    "PAGED_ENGINES",
    "ROWS",
    "OptimizerRow",
    "STATE_LAYOUTS",
    "Temporaries",
    "factored_state_elements",
    "row",
]
