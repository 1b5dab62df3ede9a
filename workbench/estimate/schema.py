"""The estimator's inputs, declared once: one `EstimateField` per keyword of
`workbench.estimate.estimate_memory`.

Each field says what the keyword is (`kind`, `default`, its `choices` or, for a number,
its range in `workbench.estimate.limits.LIMITS`), one line of help, the flag
`workbench estimate` gives it (with the old spellings it still accepts), the estimator
panel's label and place, and the `TrainConfig` field of the same meaning (`config_field`).
From these: `estimate_memory`'s checks of a choice or a switch (`inputs_check`), the flags
of `workbench estimate` (`workbench.cli.estimate`) and the panel's fields
(`workbench.ui.estimator`); `estimate_memory` keeps its explicit keyword signature for
IDEs and docs, and a test holds it equal to `FIELDS`.

A flag shared with TrainConfig takes the TrainConfig setting's own flag and metavar
(`workbench.config.SETTINGS`), so `--activation-checkpointing` or `--tp` means the same in
every command. Pure: imports no torch.

Past 700 lines because it is a table: one declaration for each of `estimate_memory`'s 58
keywords, a few lines each, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.config import SETTINGS, OptimizerName, Precision
from workbench.estimate.activation_functions import NAMES as ACTIVATION_NAMES
from workbench.estimate.activations import Attention, Checkpointing
from workbench.estimate.architecture import Bias, Mlp, Norm, Positions
from workbench.estimate.implementations import NORM_NAMES, SOFTMAX_NAMES
from workbench.estimate.lora import LORA_DTYPES, LORA_TARGETS
from workbench.estimate.model_states import FSDP_MODES

#: FSDP's unit policies the estimator counts (`fsdp_units`); a Session's own list of module
#: names is the dry run's to measure.
UNIT_POLICIES = ("blocks", "blocks-only")

#: The optimizer implementations `optimizer_impl` names ("auto": what the engine builds;
#: `workbench.estimate.peak` counts each one's temporaries).
OPTIMIZER_IMPLS = ("auto", "foreach", "for-loop", "fused")

#: The flat per-GPU figure for the CUDA context and allocator reserve the estimator used
#: before it derived them (`workbench.estimate.reserve`: the CUDA context per GPU
#: generation, NCCL's buffers, the allocator's segment rounding). No longer the default
#: (`overhead_gib="auto"`); kept for code that passes it as `overhead_gib` explicitly.
DEFAULT_OVERHEAD_GIB = 1.0

#: `overhead_gib`'s default: the reserve derived from the setup (`workbench.estimate.reserve`).
OVERHEAD_AUTO = "auto"

#: The utilisation assumed for time estimates, applied to the hardware FLOPs (recomputation
#: included: HFU; the MFU where nothing is recomputed): well-tuned large-model training
#: reports 0.35-0.55 on A100/H100 (e.g. PaLM 46%, Megatron-LM ~50%); 0.4 is a middle value.
DEFAULT_MFU = 0.4

#: How `workbench estimate` reads a flag's text (`EstimateField.read`): "int", "float",
#: "str" (passed on as typed), "count" (a number or text such as 7B, passed on as typed),
#: "switch" (store_true), "tied" (tied/untied), "offload" (a device, a bare flag meaning
#: cpu), "nodrop" (a switch that sets False), "reduce" (fp32/compute), "kernel" (an
#: attention kernel, "model" meaning the model's own), "recompute" (a bare flag meaning full).
READS: tuple[str, ...] = (
    "int",
    "float",
    "str",
    "count",
    "switch",
    "tied",
    "offload",
    "nodrop",
    "reduce",
    "kernel",
    "recompute",
)

#: The groups of `workbench estimate -h`, in order.
CLI_GROUPS: dict[str, str] = {
    "model": "model (a --model, a --hf-config, --params, or the shape flags; shape flags "
    "given with a model override its values)",
    "setup": "training setup",
    "step": "the peak of a step (kernels and buffers)",
    "tune": "fine-tuning with LoRA / QLoRA",
    "hw": "hardware, time and cost",
}

#: The columns of the estimator panel, in order, with their headings.
PANEL_COLUMNS: dict[str, str] = {
    "model": "Model",
    "setup": "Training setup",
    "step": "The step's peak",
    "cost": "Time and cost",
}


@dataclass(frozen=True)
class EstimateField:
    """One keyword of `estimate_memory` (see the module docstring).

    `kind`: "model" (a preset, an Architecture or a module), "path", "count" (a number or
    text such as "7B"), "int", "float", "bool", "choice" (one of `choices`), "gpu" (a
    catalog name), "accounting" (a key of the `model_states.ACCOUNTINGS` registry) or
    "config" (a DeepSpeed JSON path or dict). `optional`: None is
    allowed. `flag`: the flag of `workbench estimate` (None: no flag), read as `read`
    says, in group `cli` of the help; `aliases`: old spellings still accepted.
    `label` and `panel` (column, position): the estimator panel's field (None: no field).
    `config_field`: the TrainConfig field with the same meaning (None: the estimator's
    own); its flag and metavar are the setting's."""

    name: str
    kind: str
    default: Any
    help: str = ""
    choices: tuple[Any, ...] = ()
    optional: bool = False
    flag: str | None = None
    read: str = "str"
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    cli: str = ""
    label: str | None = None
    panel: tuple[str, int] | None = None
    config_field: str | None = None

    @property
    def cli_flag(self) -> str | None:
        """Its flag in `workbench estimate`: its own, else its TrainConfig setting's (None:
        no flag)."""
        if not self.cli:
            return None
        if self.flag is not None or self.config_field is None:
            return self.flag
        return SETTINGS[self.config_field].flag

    @property
    def cli_metavar(self) -> str | None:
        """Its flag's metavar: its own, else its TrainConfig setting's."""
        if self.metavar is not None or self.config_field is None:
            return self.metavar
        return SETTINGS[self.config_field].metavar


def _f(name: str, kind: str, default: Any, **declared: Any) -> EstimateField:
    return EstimateField(name, kind, default, **declared)


def _values(enum: Any) -> tuple[str, ...]:
    return tuple(member.value for member in enum)


_SHAPE = "model"

#: Every keyword of `estimate_memory`, in its signature's order.
FIELDS: tuple[EstimateField, ...] = (
    _f(
        "model",
        "model",
        None,
        optional=True,
        help="a preset, e.g. llama-3-8b (--list-models)",
        flag="--model",
        metavar="NAME",
        cli=_SHAPE,
        label="model preset",
        panel=("model", 0),
    ),
    _f(
        "hf_config",
        "path",
        None,
        optional=True,
        help="a Hugging Face config.json (or its folder) on disk",
        flag="--hf-config",
        metavar="PATH",
        cli=_SHAPE,
    ),
    _f(
        "n_params",
        "count",
        None,
        optional=True,
        help="parameter count, e.g. 7B, 1.5e9, 350M",
        flag="--params",
        read="count",
        metavar="N",
        cli=_SHAPE,
        label="parameters",
        panel=("model", 1),
    ),
    _f(
        "layers",
        "int",
        None,
        optional=True,
        flag="--layers",
        read="int",
        metavar="L",
        cli=_SHAPE,
        label="layers",
        panel=("model", 2),
    ),
    _f(
        "hidden",
        "int",
        None,
        optional=True,
        flag="--hidden",
        read="int",
        metavar="H",
        cli=_SHAPE,
        label="hidden size",
        panel=("model", 3),
    ),
    _f(
        "heads",
        "int",
        None,
        optional=True,
        flag="--heads",
        read="int",
        metavar="A",
        cli=_SHAPE,
        label="attention heads",
        panel=("model", 4),
    ),
    _f(
        "seq_len",
        "int",
        None,
        optional=True,
        flag="--seq-len",
        read="int",
        metavar="S",
        cli=_SHAPE,
        label="sequence length",
        panel=("model", 5),
    ),
    _f(
        "vocab",
        "int",
        None,
        optional=True,
        flag="--vocab",
        read="int",
        metavar="V",
        cli=_SHAPE,
        label="vocabulary",
        panel=("model", 6),
    ),
    _f(
        "kv_heads",
        "int",
        None,
        optional=True,
        help="key/value heads: GQA, 1 = MQA (= heads)",
        flag="--kv-heads",
        read="int",
        metavar="K",
        cli=_SHAPE,
        label="kv heads",
        panel=("model", 7),
    ),
    _f(
        "ffn_hidden",
        "int",
        None,
        optional=True,
        help="MLP inner size (4h; SwiGLU: 2/3 of 4h)",
        flag="--ffn-hidden",
        read="int",
        metavar="F",
        cli=_SHAPE,
        label="MLP size",
        panel=("model", 8),
    ),
    _f(
        "mlp",
        "choice",
        None,
        choices=_values(Mlp),
        optional=True,
        help="gelu or swiglu (gelu)",
        flag="--mlp",
        cli=_SHAPE,
        label="MLP",
        panel=("model", 9),
    ),
    _f(
        "norm",
        "choice",
        None,
        choices=_values(Norm),
        optional=True,
        help="layernorm or rmsnorm (layernorm)",
        flag="--norm",
        cli=_SHAPE,
    ),
    _f(
        "bias",
        "choice",
        None,
        choices=_values(Bias),
        optional=True,
        help="biases on all linear layers, qkv only, or none (all)",
        flag="--bias",
        cli=_SHAPE,
    ),
    _f(
        "positions",
        "choice",
        None,
        choices=_values(Positions),
        optional=True,
        help="learned or rotary (learned)",
        flag="--positions",
        cli=_SHAPE,
    ),
    _f(
        "tied_embeddings",
        "bool",
        None,
        optional=True,
        help="tied or untied output projection (tied)",
        flag="--embeddings",
        read="tied",
        cli=_SHAPE,
        label="tied embeddings",
        panel=("model", 10),
    ),
    _f(
        "parallel_residual",
        "bool",
        None,
        optional=True,
        help="attention and MLP read the same input (GPT-NeoX)",
        flag="--parallel-residual",
        read="switch",
        cli=_SHAPE,
    ),
    _f(
        "activation_function",
        "choice",
        None,
        choices=ACTIVATION_NAMES,
        optional=True,
        help="the MLP's activation, transformers' name: gelu_new (GPT-2's Python formula, "
        "3 more MLP-wide tensors), relu, quick_gelu, ... (gelu; gated: silu)",
        flag="--activation-function",
        metavar="NAME",
        cli=_SHAPE,
    ),
    _f(
        "norm_impl",
        "choice",
        None,
        choices=NORM_NAMES,
        optional=True,
        help="what the norms keep: kernel (torch's one-kernel norm: its input), llama "
        "(transformers' RMSNorm: an fp32 copy of its input and the normalised input), gemma "
        "(that one in fp32) (layernorm: kernel; rmsnorm: llama)",
        flag="--norm-impl",
        cli=_SHAPE,
    ),
    _f(
        "eager_softmax",
        "choice",
        None,
        choices=SOFTMAX_NAMES,
        optional=True,
        help="the dtype eager attention's softmax runs in: fp32 (Llama's: an fp32 output "
        "kept beside its 16-bit cast) or input (GPT-2's: the scores' dtype) (fp32)",
        flag="--eager-softmax",
        cli=_SHAPE,
    ),
    _f(
        "qk_norm",
        "bool",
        None,
        optional=True,
        help="norms on the query and key projections' outputs (Qwen3, Gemma 3, OLMo 2)",
        flag="--qk-norm",
        read="switch",
        cli=_SHAPE,
    ),
    _f(
        "post_norms",
        "bool",
        None,
        optional=True,
        help="norms on the attention's and the MLP's outputs before each residual add "
        "(Gemma 2 and 3: four norms a layer)",
        flag="--post-norms",
        read="switch",
        cli=_SHAPE,
    ),
    _f(
        "micro_batch",
        "int",
        1,
        read="int",
        cli=_SHAPE,
        label="micro-batch",
        panel=("model", 11),
        config_field="micro_batch",
    ),
    _f(
        "precision",
        "choice",
        "fp32",
        choices=_values(Precision),
        cli="setup",
        label="precision",
        panel=("setup", 0),
        config_field="precision",
    ),
    _f(
        "optimizer",
        "choice",
        "adamw",
        choices=_values(OptimizerName),
        cli="setup",
        label="optimizer",
        panel=("setup", 1),
        config_field="optimizer",
    ),
    _f(
        "zero_stage",
        "int",
        0,
        choices=(0, 1, 2, 3),
        read="int",
        cli="setup",
        label="ZeRO stage",
        panel=("setup", 3),
        config_field="zero_stage",
    ),
    _f(
        "gpus",
        "int",
        1,
        help="all GPUs: tp x pp x cp x data-parallel (1)",
        flag="--gpus",
        read="int",
        metavar="N",
        cli="setup",
        label="GPUs",
        panel=("setup", 4),
    ),
    _f(
        "tensor_parallel",
        "int",
        1,
        help="tensor-parallel size: each layer's matmuls split over this many GPUs (1)",
        read="int",
        cli="setup",
        label="tensor parallel",
        panel=("setup", 5),
        config_field="tp",
    ),
    _f(
        "pipeline_parallel",
        "int",
        1,
        help="pipeline-parallel stages: the layers cut into this many consecutive stages (1)",
        read="int",
        cli="setup",
        label="pipeline stages",
        panel=("setup", 6),
        config_field="pp",
    ),
    _f(
        "sequence_parallel",
        "bool",
        False,
        help="shard activations over tp (Megatron)",
        read="switch",
        cli="setup",
        label="sequence parallel",
        panel=("setup", 7),
        config_field="sequence_parallel",
    ),
    _f(
        "context_parallel",
        "int",
        1,
        help="context-parallel size: the sequence split over this many GPUs, attention "
        "exchanging keys and values (torch's context_parallel, as torchtitan runs it) (1)",
        flag="--cp",
        read="int",
        metavar="N",
        aliases=("--context-parallel",),
        cli="setup",
        label="context parallel",
        panel=("setup", 11),
    ),
    _f(
        "offload_optimizer",
        "bool",
        False,
        read="offload",
        cli="setup",
        label="offload optimizer",
        panel=("setup", 8),
        config_field="offload_optimizer",
    ),
    _f(
        "offload_params",
        "bool",
        False,
        read="offload",
        cli="setup",
        label="offload parameters",
        panel=("setup", 9),
        config_field="offload_params",
    ),
    _f(
        "fsdp",
        "choice",
        "off",
        choices=FSDP_MODES,
        cli="setup",
        config_field="fsdp",
    ),
    _f(
        "checkpointing",
        "choice",
        "none",
        choices=_values(Checkpointing),
        help="activation recomputation: none, selective (the attention core), selective-op "
        "(torchtitan's op-level policy) or full (each layer keeps its input only); a bare "
        "flag means full (none)",
        read="recompute",
        aliases=("--checkpointing",),
        cli="setup",
        label="checkpointing",
        panel=("setup", 2),
        config_field="activation_checkpointing",
    ),
    _f(
        "dropout",
        "bool",
        None,
        optional=True,
        help="the model trains without dropout: no masks kept",
        flag="--no-dropout",
        read="nodrop",
        cli="step",
        label="dropout",
        panel=("step", 1),
    ),
    _f(
        "gpu",
        "gpu",
        None,
        optional=True,
        help="GPU type, e.g. h100-80gb (see --list-gpus)",
        flag="--gpu",
        cli="hw",
        label="GPU type",
        panel=("setup", 10),
    ),
    _f(
        "overhead_gib",
        "float",
        OVERHEAD_AUTO,
        help="per-GPU CUDA context, NCCL buffers and allocator reserve in GiB, replacing the "
        "derived figure (auto: derived from the GPU and the setup)",
        flag="--overhead-gib",
        read="float",
        metavar="GIB",
        cli="hw",
        label="CUDA reserve (GiB)",
        panel=("step", 5),
    ),
    _f(
        "lazy_loading",
        "bool",
        True,
        help="the CUDA context is torch's before 1.13 or CUDA's before 11.7, or "
        "CUDA_MODULE_LOADING=EAGER: every kernel loaded at start (0.67 GB, not 0.4)",
        flag="--eager-loading",
        read="nodrop",
        cli="hw",
    ),
    _f(
        "tokens",
        "count",
        None,
        optional=True,
        help="training tokens, e.g. 300e9",
        flag="--tokens",
        read="float",
        metavar="T",
        cli="hw",
        label="training tokens",
        panel=("cost", 0),
    ),
    _f(
        "mfu",
        "float",
        DEFAULT_MFU,
        help="share of the peak the GPUs run the FLOPs they execute at, recomputation "
        "included: the hardware FLOP utilisation (HFU), as the planner's efficiency; the "
        f"MFU without recomputation, lower with it (the report says both) ({DEFAULT_MFU})",
        flag="--mfu",
        read="float",
        cli="hw",
        label="MFU",
        panel=("cost", 1),
    ),
    _f(
        "price_per_gpu_hour",
        "float",
        None,
        optional=True,
        flag="--price-per-gpu-hour",
        read="float",
        metavar="PRICE",
        cli="hw",
        label="$ per GPU-hour",
        panel=("cost", 2),
    ),
    _f("accounting", "accounting", "paper", help="a key of model_states.ACCOUNTINGS"),
    _f(
        "attention",
        "choice",
        None,
        choices=_values(Attention),
        optional=True,
        help="attention kernel: model (the model's own: a config's attn_implementation, "
        "else sdpa), sdpa (fused, torch's and transformers' default: no s^2 tensors), eager "
        "(unfused, the softmax in fp32: transformers'), megatron (unfused, the softmax "
        "output in the compute dtype: Korthikanti et al.) or math (torch's sdpa math "
        "kernel, what a CPU runs with dropout: the s^2 tensors in fp32) (model)",
        read="kernel",
        cli="step",
        label="attention",
        panel=("step", 0),
        config_field="attention",
    ),
    _f(
        "optimizer_impl",
        "choice",
        "auto",
        choices=OPTIMIZER_IMPLS,
        help="auto (what the engine builds), foreach, for-loop or fused (auto)",
        flag="--optimizer-impl",
        metavar="IMPL",
        cli="step",
        label="optimizer impl",
        panel=("step", 3),
    ),
    _f(
        "grad_accum",
        "int",
        1,
        read="int",
        cli="setup",
        label="accumulation",
        panel=("step", 2),
        config_field="grad_accum",
    ),
    _f(
        "loss_chunks",
        "int",
        1,
        help="chunked cross-entropy over C chunks of the sequence (1: not chunked)",
        flag="--loss-chunks",
        read="int",
        metavar="C",
        cli="step",
        label="loss chunks",
        panel=("step", 4),
    ),
    _f(
        "bucket_view",
        "bool",
        False,
        help="DDP gradient_as_bucket_view=True: the gradients are views of DDP's buckets",
        flag="--bucket-view",
        read="switch",
        cli="step",
    ),
    _f(
        "fsdp_reduce_fp32",
        "bool",
        True,
        help="FSDP under AMP: reduce gradients in fp32 or in the compute dtype (fp32)",
        flag="--fsdp-reduce",
        read="reduce",
        metavar="DTYPE",
        cli="step",
        config_field="fsdp_reduce_fp32",
    ),
    _f(
        "fsdp_units",
        "choice",
        "blocks",
        choices=UNIT_POLICIES,
        help="FSDP's units: blocks (each block, the embedding and the output head its own "
        "unit, as torchtitan and torchtune shard them) or blocks-only (the embedding and "
        "head gathered with the root)",
        cli="setup",
        config_field="fsdp_units",
    ),
    _f(
        "weight_decay",
        "float",
        0.0,
        help="the optimizer's weight decay (0: none; a Session's default is 0.01): SGD's "
        "step makes a temporary for it",
        flag="--weight-decay",
        read="float",
        metavar="DECAY",
        cli="step",
        config_field="weight_decay",
    ),
    _f(
        "deepspeed_config",
        "config",
        None,
        optional=True,
        help="a DeepSpeed JSON (read, never run): its ZeRO stage, precision, optimizer, "
        "offload, micro-batch and accumulation (flags given override them), bucket and "
        "stage-3 prefetch sizes",
        flag="--deepspeed-config",
        metavar="PATH",
        cli="step",
    ),
    _f(
        "optimizer_in_backward",
        "bool",
        False,
        read="switch",
        cli="step",
        config_field="optimizer_in_backward",
    ),
    _f(
        "activation_offload",
        "bool",
        False,
        help="the activations the forward saves held in host memory: a host term, one "
        "layer's in flight on the GPU",
        read="switch",
        cli="step",
        config_field="activation_offload",
    ),
    _f("document_mask", "bool", False),
    _f(
        "compile",
        "bool",
        False,
        help="the model's forward through torch.compile: the activations its partitioner "
        "recomputes in backward are not kept (workbench.estimate.compiled)",
        flag="--compile",
        read="switch",
        cli="step",
        label="torch.compile",
        panel=("step", 12),
        config_field="compile",
    ),
    _f(
        "lora_rank",
        "int",
        0,
        help="LoRA adapters of this rank, the base frozen: only they have gradients and "
        "optimizer states (0: off)",
        read="int",
        cli="tune",
        label="LoRA rank (0: off)",
        panel=("step", 6),
        config_field="lora_rank",
    ),
    _f(
        "lora_targets",
        "choice",
        "all-linear",
        choices=LORA_TARGETS,
        help="all-linear (every linear layer of a block) or attention (Q, K, V, output); "
        "the estimator counts by kind, where a Session's --lora-targets names modules",
        flag="--lora-targets",
        metavar="WHICH",
        cli="tune",
    ),
    _f("lora_params", "int", None, optional=True),
    _f(
        "lora_dropout",
        "float",
        0.0,
        help="dropout on the adapters' input: each target keeps a dropped copy (0)",
        read="float",
        cli="tune",
        config_field="lora_dropout",
    ),
    _f(
        "qlora",
        "bool",
        False,
        help="the base's linear layers in 4-bit NF4 (bitsandbytes)",
        read="switch",
        cli="tune",
        label="QLoRA (4-bit base)",
        panel=("step", 7),
        config_field="qlora",
    ),
    _f("qlora_params", "int", None, optional=True),
    _f("qlora_bytes", "int", None, optional=True),
    _f(
        "lora_dtype",
        "choice",
        "auto",
        choices=LORA_DTYPES,
        help="the adapters' dtype: auto (the trained weights': bf16 under bf16-true, as "
        "torchtune keeps them) or fp32 (peft's get_peft_model default over a bf16 base)",
        cli="tune",
        config_field="lora_dtype",
    ),
)

#: The fields by keyword.
SCHEMA: dict[str, EstimateField] = {f.name: f for f in FIELDS}

#: The estimator keywords that a TrainConfig field of the same meaning sets.
CONFIG_FIELDS: dict[str, str] = {f.name: f.config_field for f in FIELDS if f.config_field}


def choices_of(name: str) -> tuple[Any, ...]:
    """The allowed values of choice keyword `name`."""
    return SCHEMA[name].choices


def panel_fields(column: str) -> tuple[str, ...]:
    """The keywords the estimator panel shows in `column` (a `PANEL_COLUMNS` key), in order."""
    placed = [(f.panel[1], f.name) for f in FIELDS if f.panel and f.panel[0] == column]
    return tuple(name for _, name in sorted(placed))


def labels() -> dict[str, str]:
    """The estimator panel's label of every keyword it shows."""
    return {f.name: f.label for f in FIELDS if f.label is not None}


__all__ = [
    "CLI_GROUPS",
    "DEFAULT_MFU",
    "DEFAULT_OVERHEAD_GIB",
    "OVERHEAD_AUTO",
    "CONFIG_FIELDS",
    "FIELDS",
    "OPTIMIZER_IMPLS",
    "PANEL_COLUMNS",
    "SCHEMA",
    "EstimateField",
    "choices_of",
    "labels",
    "panel_fields",
]
