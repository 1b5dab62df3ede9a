"""`estimate_memory`: per-GPU training memory, compute time and cost (pure Python).

The entry point checks its inputs first (`inputs_check`: every keyword read, range-checked
and resolved into one `EstimateInputs`), then computes (`arithmetic`); the result is a
`MemoryEstimate` (`result`). Accounting and formulas are described in `model_states`
(parameters, gradients, optimizer states, ZeRO, offload), `architecture` (parameter counts,
tensor/pipeline layout), `activations` (Korthikanti et al. 2022, extended) and `catalog`
(GPU data sheets); docs/estimator.md collects them and compares them with DeepSpeed's and
accelerate's estimators.
"""

from __future__ import annotations

from typing import Any

from workbench.config import OptimizerName, Precision
from workbench.estimate.activations import Checkpointing
from workbench.estimate.arithmetic import activations, estimate_from
from workbench.estimate.inputs_check import check_activation_size, check_inputs
from workbench.estimate.limits import GIB, as_bool
from workbench.estimate.problems import EstimateInputError, Problem, keywords_checked
from workbench.estimate.result import MemoryEstimate
from workbench.estimate.schema import DEFAULT_MFU, DEFAULT_OVERHEAD_GIB, OVERHEAD_AUTO


@keywords_checked
def estimate_memory(
    *,
    model: Any = None,
    hf_config: Any = None,
    n_params: int | float | str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    mlp: str | None = None,
    norm: str | None = None,
    bias: str | None = None,
    positions: str | None = None,
    tied_embeddings: bool | None = None,
    parallel_residual: bool | None = None,
    activation_function: str | None = None,
    norm_impl: str | None = None,
    eager_softmax: str | None = None,
    qk_norm: bool | None = None,
    post_norms: bool | None = None,
    micro_batch: int = 1,
    precision: Precision | str = "fp32",
    optimizer: OptimizerName | str = "adamw",
    zero_stage: int = 0,
    gpus: int = 1,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    sequence_parallel: bool = False,
    context_parallel: int = 1,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    fsdp: str = "off",
    checkpointing: Checkpointing | str = "none",
    dropout: bool | None = None,
    gpu: str | None = None,
    overhead_gib: float | str = OVERHEAD_AUTO,
    lazy_loading: bool = True,
    tokens: float | str | None = None,
    mfu: float = DEFAULT_MFU,
    price_per_gpu_hour: float | None = None,
    accounting: str = "paper",
    attention: str | None = None,
    optimizer_impl: str = "auto",
    grad_accum: int = 1,
    loss_chunks: int = 1,
    bucket_view: bool = False,
    fsdp_reduce_fp32: bool = True,
    fsdp_units: str = "blocks",
    weight_decay: float = 0.0,
    deepspeed_config: Any = None,
    optimizer_in_backward: bool = False,
    activation_offload: bool = False,
    document_mask: bool = False,
    compile: bool = False,
    lora_rank: int = 0,
    lora_targets: str = "all-linear",
    lora_params: int | None = None,
    lora_dropout: float = 0.0,
    qlora: bool = False,
    qlora_params: int | None = None,
    qlora_bytes: int | None = None,
    lora_dtype: str = "auto",
) -> MemoryEstimate:
    """Per-GPU memory of training a model, and optionally its compute time and cost.

    The model comes from one of:

    * `model`: a preset name (`workbench.estimate.model_names()`, e.g. "llama-3-8b"),
      an `Architecture`, or a torch `nn.Module` (or a function that builds one, which is
      built on the meta device, so nothing is allocated) whose parameters are counted;
    * `hf_config`: a Hugging Face config.json path (or its dict) of a gpt2, llama,
      mistral, qwen2 or gpt_neox model;
    * `n_params` (a number or text such as "7B", "1.5e9", "350M", "1.3T"), and/or a
      transformer shape (`layers`, `hidden`, `heads`, `seq_len`, `vocab`), with optional
      `kv_heads`, `ffn_hidden`, `mlp` ("gelu"/"swiglu"), `norm` ("layernorm"/"rmsnorm"),
      `bias` ("all"/"qkv"/"none"), `positions` ("learned"/"rotary"),
      `tied_embeddings`, `parallel_residual` (defaults: GPT's) and `activation_function`
      (the MLP's, transformers' name: "gelu_new", "relu", ...; default "gelu", gated
      "silu": one op that keeps its input; `workbench.estimate.activation_functions`
      counts what each keeps, a config's is read from it), `norm_impl` (what the norms
      keep: "kernel", torch's one-kernel norm, its input; "llama", transformers' RMSNorm,
      an fp32 copy of its input and the normalised input; "gemma", that one in fp32;
      default by `norm`: layernorm "kernel", rmsnorm "llama") and `eager_softmax` (the
      dtype transformers' unfused attention runs its softmax in: "fp32", default, or
      "input", GPT-2's; `workbench.estimate.implementations`) and `qk_norm` (norms on the
      query and key projections' outputs, as Qwen3, Gemma 3, OLMo 2 and OLMoE run: default
      False) and `post_norms` (norms on the attention's and the MLP's outputs, Gemma 2's and
      3's: default False); a config's family sets all four.

    Shape fields given with `model` or `hf_config` override theirs (e.g. `seq_len`).
    With both a shape and `n_params`, `n_params` counts the model states and the shape
    the activations. `gpus` = `tensor_parallel` x `pipeline_parallel` x the data-parallel
    size over which ZeRO shards; `sequence_parallel` needs `tensor_parallel` > 1.
    `context_parallel` (torch's context parallelism as torchtitan runs it,
    `workbench.estimate.context_parallel`) splits each sequence over that many GPUs: each
    keeps the activations of `seq_len / context_parallel` tokens, attention gathers the keys
    and values of the whole sequence, and the model states are sharded (ZeRO, FSDP) over the
    data-parallel x context-parallel GPUs, which hold the same parameters.
    `accounting` picks how model-state bytes are counted (a key of
    `workbench.estimate.model_states.ACCOUNTINGS`; "paper" is the ZeRO paper's model).
    `fsdp` ("off", "full_shard", "shard_grad_op", "no_shard"): PyTorch FSDP instead of
    ZeRO (`zero_stage` 0), counted with FSDP2's layout (the "fsdp" accounting, implied).
    `dropout=False`: a model trained without dropout keeps no dropout masks (and no
    dropout outputs), so its activations are smaller. None (the default) takes the
    model's: presets of families trained without dropout (Llama, Mistral, Qwen2,
    Pythia) have none, GPT-2/GPT-3 have it, as has a bare shape (Korthikanti et al.).

    The peak of a step (`peak_bytes`, `workbench.estimate.peak`) also reads: `attention`
    ("sdpa", the default of torch and transformers: no s^2 tensors; "eager": unfused;
    None: a transformers model's own `attn_implementation`, else "sdpa"),
    `grad_accum` (micro-batches per step), `optimizer_impl` ("auto": what the engine
    builds; "foreach", "for-loop", "fused"), `loss_chunks` (chunked cross-entropy),
    `bucket_view` (DDP's `gradient_as_bucket_view`), `weight_decay` (SGD's and Adam's
    decay copy the gradient in the step; torch's default 0), `fsdp_reduce_fp32` (FSDP reduces
    gradients in fp32 under AMP), `fsdp_units` (FSDP's units: "blocks", each block, the
    embedding and the output head its own; "blocks-only", embedding and head gathered with
    the root) and `deepspeed_config` (a DeepSpeed JSON path or dict:
    its bucket and stage-3 prefetch sizes, `workbench.estimate.deepspeed_buffers`), and
    `optimizer_in_backward` (each parameter stepped as its gradient is ready and the
    gradient freed: the plain loop only, no accumulation), and `activation_offload` (the
    activations the model's forward saves kept in host memory: `peak.host_terms`), and
    `document_mask` (packed documents: a block-diagonal attention mask per sample, which
    the sdpa kernel keeps for backward: `peak`'s "document mask"), and `compile` (the
    model's forward through `torch.compile`: the activations its partitioner recomputes in
    backward are not kept, `peak`'s "recomputed under torch.compile",
    `workbench.estimate.compiled`).

    LoRA (`workbench.estimate.lora`): `lora_rank` (0: off) adapters on `lora_targets`
    ("all-linear": every linear layer of a block; "attention": Q, K, V and output; a fused
    QKV matrix, `Architecture.fused_qkv` as GPT-2's c_attn, is one target), the base
    frozen; `lora_params` the exact adapter count (a module's; else the shape's),
    `lora_dropout` (each target keeps a dropped copy of its input) and `qlora` (the base
    linear layers in 4-bit NF4, bitsandbytes'; `qlora_params` the exact count of weights
    held in 4 bits, else the shape's linear layers; `qlora_bytes` their exact bytes with
    the quantisation constants, else counted layer by layer from the shape), and
    `lora_dtype` ("auto": the adapters in the trained weights' dtype, bf16 under
    bf16-true as torchtune keeps them; "fp32": fp32 adapters over a bf16 base, peft's
    default).

    What the GPU holds beside the allocated peak (`e.reserve`, `workbench.estimate.reserve`)
    is derived with `overhead_gib="auto"` (the default): the caching allocator's rounding of
    the tensors live at the peak, the CUDA context of the GPU's generation and NCCL's buffers
    on several ranks (`lazy_loading=False`: the context of a torch built with CUDA < 11.7 or
    run with CUDA_MODULE_LOADING=EAGER); `overhead_gib` given in GiB replaces all three. `fits` judges the
    allocated peak plus that sum (what nvidia-smi shows); `e.verdict` says the margin.

    Every number is range-checked (`workbench.estimate.limits` lists the ranges and why);
    numpy scalars are numbers, bools and text are not (except the counts `n_params` and
    `tokens`, which may be text such as "7B").

    Raises `EstimateInputError` (a `ValueError`) listing every invalid input at once.
    """
    inputs = check_inputs(locals())  # first statement: `locals()` holds exactly the keywords
    breakdown = activations(inputs)
    if breakdown is not None:
        check_activation_size(inputs, breakdown.total_bytes)
    return estimate_from(inputs, breakdown)


def compare_stages(**options: Any) -> tuple[MemoryEstimate, ...]:
    """Estimates for ZeRO stages 0, 1, 2 and 3 with the same other options.

    Offload options apply to the stages that support them: optimizer offload to stages
    1-3, parameter offload to stage 3; the other stages are estimated without them.
    """
    if "zero_stage" in options:
        raise EstimateInputError(
            [Problem("zero_stage", options["zero_stage"], "is set by compare_stages; leave it out")]
        )
    out = []
    for stage in range(4):
        opts = dict(options)
        if stage == 0 and as_bool(opts.get("offload_optimizer")) is True:
            opts["offload_optimizer"] = False
        if stage != 3 and as_bool(opts.get("offload_params")) is True:
            opts["offload_params"] = False
        out.append(estimate_memory(zero_stage=stage, **opts))
    return tuple(out)


#: DeepSpeed's 16-bit precisions -> the FSDP mixed-precision setting that computes alike.
_FSDP_PRECISION = {"fp16": "amp-fp16", "bf16": "amp-bf16"}


def compare_engines(**options: Any) -> tuple[MemoryEstimate, ...]:
    """ZeRO stages 0-3 (`compare_stages`) and PyTorch FSDP full_shard with the same other
    options: five estimates, side by side. FSDP keeps no 16-bit weight copy at rest, so
    DeepSpeed's "fp16"/"bf16" are compared with FSDP's "amp-fp16"/"amp-bf16"; ZeRO's
    optimizer offload has no FSDP counterpart and is left out of the FSDP estimate."""
    for name in ("zero_stage", "fsdp"):
        if name in options:
            raise EstimateInputError(
                [Problem(name, options[name], "is set by compare_engines; leave it out")]
            )
    fsdp = dict(options)
    precision = fsdp.get("precision", "fp32")
    if isinstance(precision, str):
        fsdp["precision"] = _FSDP_PRECISION.get(precision.strip().lower(), precision)
    fsdp["offload_optimizer"] = False
    if fsdp.get("accounting", "paper") != "paper":
        fsdp["accounting"] = "fsdp"
    return (*compare_stages(**options), estimate_memory(fsdp="full_shard", **fsdp))


__all__ = [
    "DEFAULT_MFU",
    "DEFAULT_OVERHEAD_GIB",
    "GIB",
    "MemoryEstimate",
    "compare_engines",
    "compare_stages",
    "estimate_memory",
]
