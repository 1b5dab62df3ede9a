"""`MemoryEstimate`: the result of `estimate_memory`, which renders itself (text, HTML).

Its fields are documented on the class; docs/estimator.md explains the figures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.display import Display, Readable, fmt_bytes, fmt_count
from workbench.estimate.activation_functions import default_activation
from workbench.estimate.activations import ActivationBreakdown
from workbench.estimate.flops import FlopCount
from workbench.estimate.frozen import field_names, of_every_field
from workbench.estimate.peak import StepPeak
from workbench.estimate.reserve import Reserve


@dataclass(frozen=True)
class MemoryEstimate(Readable):
    """Per-GPU bytes of one training setup, plus compute figures and the inputs echoed.
    `str(estimate)` and a notebook show it as a table in binary units (GiB).

    `peak_bytes` is the answer to "will it fit": the highest point of one training step
    (forward, backward, optimizer step; with accumulation its last micro-batch), what
    `torch.cuda.max_memory_allocated()` measures. `peak` splits it into named terms
    (`peak.terms`: model states as held at that point, activations, the logits and loss,
    the optimizer's temporaries, autocast's weight casts, the engine's buckets and
    gathered parameters, the backward transient; `workbench.estimate.peak` defines each).
    `reserve` (`workbench.estimate.reserve`) is what the GPU holds beside that peak: the
    caching allocator's reserve at the peak, the CUDA context and NCCL's buffers, each
    derived from the setup (or `overhead_gib` when given, replacing all three);
    `overhead_bytes` is their sum. Three figures, each named as the tool that shows it:
    `peak_bytes` (allocated, `max_memory_allocated`), `reserved_peak_bytes` (plus the
    allocator's reserve, `max_memory_reserved`) and `nvidia_smi_bytes` (plus the context and
    NCCL's buffers, what nvidia-smi shows; `required_bytes`). `fits` is
    `required_bytes <= gpu_memory_bytes`, `margin_bytes` the room left (negative: over) and
    `verdict` says it in words; `max_micro_batch` is the largest micro-batch whose peak plus
    its reserve fits.

    Model states at rest (the ZeRO paper's figure) stay: `params_bytes`, `grads_bytes`,
    `optimizer_bytes` (`model_states_bytes` their sum), and `total_bytes = params_bytes +
    grads_bytes + optimizer_bytes + activation_bytes` (Korthikanti et al.'s stored
    activations), with `activation_bytes` None (counted as 0) when no transformer shape
    was given. `cpu_offload_bytes` is host memory per GPU. GPU fields are None when no GPU
    was named; `max_micro_batch` is also None without a shape or when not even a
    micro-batch of 1 fits. Compute fields are None when not asked for (`tokens`),
    `train_seconds` also without a GPU, `cost` also without a price.

    `gpus = tensor_parallel x pipeline_parallel x data_parallel`, where `data_parallel`
    counts the `context_parallel` ranks too (they hold the same parameters: the group ZeRO
    and FSDP shard over; `seq_len` is the whole sequence, each of the `context_parallel`
    ranks keeping the activations of its share). `shard_params` is the
    parameter count one GPU holds before ZeRO shards it over the `data_parallel` group:
    its tensor-parallel share of the largest pipeline stage (`n_params` without tensor or
    pipeline parallelism). `model` is the preset's name or the module's class name;
    the architecture fields (`layers` ... `tied_embeddings`) are None without a shape.
    """

    # results, per GPU
    n_params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int | None
    total_bytes: int
    overhead_bytes: int
    cpu_offload_bytes: int
    gpu: str | None
    gpu_memory_bytes: int | None
    fits: bool | None
    max_micro_batch: int | None
    train_flops: float | None
    train_seconds: float | None
    cost: float | None
    activations: ActivationBreakdown | None
    # inputs
    precision: str
    optimizer: str
    zero_stage: int
    gpus: int
    offload_optimizer: bool
    offload_params: bool
    checkpointing: str
    micro_batch: int
    layers: int | None
    hidden: int | None
    heads: int | None
    seq_len: int | None
    vocab: int | None
    overhead_gib: float | None  # None: derived ("auto")
    tokens: float | None
    mfu: float
    price_per_gpu_hour: float | None
    accounting: str
    # model and parallelism (inputs; the architecture fields resolved from a model)
    model: str | None = None
    hf_config: str | None = None
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    mlp: str | None = None
    #: the MLP's activation function (`activation_functions`: transformers' names)
    activation_function: str | None = None
    #: what the norms keep (`implementations`: kernel, llama, gemma) and the dtype an
    #: unfused "eager" attention runs its softmax in (fp32, input)
    norm_impl: str | None = None
    eager_softmax: str | None = None
    #: whether the attention normalises its query and key projections' outputs
    qk_norm: bool | None = None
    #: whether the attention's and the MLP's outputs are normalised before the residual adds
    post_norms: bool | None = None
    norm: str | None = None
    bias: str | None = None
    positions: str | None = None
    tied_embeddings: bool | None = None
    parallel_residual: bool | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    context_parallel: int = 1
    data_parallel: int = 1
    shard_params: int = 0
    fsdp: str = "off"
    dropout: bool = True  # the activations count dropout masks (training with dropout)
    # a mixture of experts: the parameters one token uses (= n_params for a dense model)
    active_params: int = 0
    #: why activations are not estimated for a model given without a shape it maps onto
    #: (an encoder-decoder, latent attention): the dry run measures them
    activation_note: str | None = None
    #: what the estimate assumed where the model's config names an MLP activation function
    #: the estimator does not know (the MLP's default was counted); None otherwise
    activation_function_note: str | None = None
    #: where the shape was read when not at the config's top level (a multimodal model's
    #: language model); None otherwise
    shape_note: str | None = None
    experts: int | None = None
    experts_per_token: int | None = None
    # the peak of a step
    peak_bytes: int = 0
    peak: StepPeak | None = None
    reserve: Reserve | None = None
    attention: str = "sdpa"
    optimizer_impl: str = "foreach"
    grad_accum: int = 1
    loss_chunks: int = 1
    # LoRA (`workbench.estimate.lora`): the adapters that train (0 without LoRA), and the
    # base weights held in 4 bits under QLoRA
    lora_rank: int = 0
    lora_params: int = 0
    qlora_params: int = 0
    #: the training tokens' model FLOPs (6 N + 12 L q s a token, `estimate.flops`: what MFU
    #: counts); `train_flops` adds the recomputed forward (what the GPUs run: HFU's count)
    model_flops: float | None = None
    #: the model's FLOP count (`estimate.flops.FlopCount`: the parameters a token multiplies,
    #: layers, attention width, sequence), also without tokens
    flop_count: FlopCount | None = None

    @property
    def trainable_fraction(self) -> float:
        """The share of the parameters that train: the adapters' under LoRA, else 1."""
        if not self.lora_rank:
            return 1.0
        return self.lora_params / max(1, self.n_params + self.lora_params)

    @property
    def model_flops_utilisation(self) -> float | None:
        """The MFU the time assumes: `mfu` is the rate the GPUs run the FLOPs they execute
        at (recomputation included: the hardware FLOP utilisation, HFU), so the MFU is
        `mfu` x model FLOPs / hardware FLOPs (the same without recomputation); None
        without `tokens`."""
        if self.model_flops is None or not self.train_flops:
            return None
        return self.mfu * self.model_flops / self.train_flops

    @property
    def utilisation_text(self) -> str:
        """The rate the time assumes, named: "HFU 0.40 (MFU 0.30)" where recomputation
        runs FLOPs the model's count leaves out, else "MFU 0.4"."""
        mfu = self.model_flops_utilisation
        if mfu is None or self.train_flops is None or self.model_flops is None:
            return f"HFU {self.mfu:g}"
        if self.train_flops > self.model_flops:
            return f"HFU {self.mfu:.2f} (MFU {mfu:.2f})"
        return f"MFU {self.mfu:g}"

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def required_bytes(self) -> int:
        """What the GPU must hold: `peak_bytes + overhead_bytes`."""
        return self.peak_bytes + self.overhead_bytes

    @property
    def reserved_peak_bytes(self) -> int | None:
        """The caching allocator's reserved peak (`torch.cuda.max_memory_reserved()`): the
        allocated peak plus the allocator's reserve; None when `overhead_gib` was given
        (one figure, not split)."""
        if self.reserve is None or self.reserve.given_bytes is not None:
            return None
        return self.peak_bytes + self.reserve.allocator_bytes

    @property
    def nvidia_smi_bytes(self) -> int:
        """What nvidia-smi shows for the process at the peak: `required_bytes`."""
        return self.required_bytes

    @property
    def margin_bytes(self) -> int | None:
        """The GPU's memory left at the peak (negative: over by that much); None without
        a GPU."""
        if self.gpu_memory_bytes is None:
            return None
        return self.gpu_memory_bytes - self.required_bytes

    @property
    def largest_term(self) -> tuple[str, int]:
        """The largest named term of what the GPU must hold (the peak's terms and the
        reserve's)."""
        terms = {**self.peak_terms, **(self.reserve.terms if self.reserve else {})}
        if not terms:
            return "model states", self.peak_bytes
        name = max(terms, key=lambda k: terms[k])
        return name, terms[name]

    @property
    def verdict(self) -> str | None:
        """ "fits with 6.2 GiB to spare" or "over by 3.1 GiB: the largest term is
        activations (40.0 GiB)"; None without a GPU. Where the activations are not
        estimated (`activation_note`) it says the figure leaves them out."""
        margin = self.margin_bytes
        if margin is None:
            return None
        if margin >= 0:
            return f"fits with {fmt_bytes(margin)} to spare" + self.without_activations
        name, value = self.largest_term
        return (
            f"does not fit: over by {fmt_bytes(-margin)}, the largest term is {name} "
            f"({fmt_bytes(value)})" + self.without_activations
        )

    @property
    def without_activations(self) -> str:
        """ ", without its activations (not estimated: why)" where they are not estimated,
        else "": a fit that leaves them out is no answer to "will it fit?"."""
        if self.activation_bytes is not None:
            return ""
        why = (
            self.activation_note or "activations not estimated: give a transformer shape or a model"
        )
        return f", without its activations ({why})"

    @property
    def peak_terms(self) -> dict[str, int]:
        """The peak's named terms (bytes), largest point of the step."""
        return dict(self.peak.terms) if self.peak is not None else {}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (the activation breakdown nested)."""
        return asdict(self)

    @classmethod
    def of_every_field(cls, values: dict[str, Any]) -> MemoryEstimate:
        """`MemoryEstimate(**values)`, built in one step when `values` names every field
        once (`workbench.estimate.frozen`: the estimator makes one per call)."""
        return of_every_field(cls, _FIELD_NAMES, values)

    def _reserve_rows(self) -> list[tuple[str, str]]:
        """The reserve's terms and the three named figures (allocated, reserved, nvidia-smi)."""
        reserve = self.reserve
        if reserve is None or reserve.given_bytes is not None:
            return [
                (
                    "CUDA context and allocator reserve (overhead_gib)",
                    fmt_bytes(self.overhead_bytes),
                ),
                ("allocated peak (max_memory_allocated)", fmt_bytes(self.peak_bytes)),
                ("what nvidia-smi shows", fmt_bytes(self.required_bytes)),
            ]
        context = "measured" if reserve.context_measured else "assumed"
        return [
            ("CUDA context and allocator reserve", fmt_bytes(self.overhead_bytes)),
            ("allocated peak (max_memory_allocated)", fmt_bytes(self.peak_bytes)),
            ("  + allocator reserve (rounding)", fmt_bytes(reserve.allocator_bytes)),
            (
                "reserved peak (max_memory_reserved)",
                fmt_bytes(self.peak_bytes + reserve.allocator_bytes),
            ),
            (f"  + CUDA context ({context})", fmt_bytes(reserve.context_bytes)),
            ("  + NCCL buffers", fmt_bytes(reserve.nccl_bytes)),
            ("what nvidia-smi shows", fmt_bytes(self.required_bytes)),
        ]

    def _display(self) -> Display:
        act = self.activation_function
        own = act is not None and act != default_activation(self.mlp or "gelu")
        acts = (
            fmt_bytes(self.activation_bytes)
            + f" (micro-batch {self.micro_batch}, recomputation {self.checkpointing}, "
            f"{self.attention} attention" + (f", {act} MLP activation" if own else "") + ")"
            if self.activation_bytes is not None
            else (self.activation_note or "not estimated (give a transformer shape or a model)")
        )
        rows: list[tuple[str, str]] = []
        if self.peak is not None:
            rows.append((f"peak of a step ({self.peak.phase})", fmt_bytes(self.peak_bytes)))
            for name, value in self.peak.terms.items():
                label = name
                if name == "optimizer step temporaries":
                    label = f"{name} ({self.optimizer_impl})"
                rows.append((f"  {label}", fmt_bytes(value)))
            if self.peak.chunked_loss_saving_bytes:
                rows.append(
                    (
                        "  chunked loss (8 chunks) would save",
                        fmt_bytes(self.peak.chunked_loss_saving_bytes),
                    )
                )
        rows += self._reserve_rows()
        rows += [
            ("model states at rest", ""),
            ("  parameters", fmt_bytes(self.params_bytes)),
            ("  gradients", fmt_bytes(self.grads_bytes)),
            ("  optimizer states", fmt_bytes(self.optimizer_bytes)),
            ("stored activations", acts),
        ]
        if self.activation_function_note:
            rows.append(("  assumed", self.activation_function_note))
        if self.shape_note:
            rows.append(("  read", self.shape_note))
        rows += [
            ("states + activations", fmt_bytes(self.total_bytes)),
        ]
        if self.cpu_offload_bytes:
            rows.append(("offloaded to CPU", fmt_bytes(self.cpu_offload_bytes)))
        if self.gpu is not None:
            rows.append((f"on {self.gpu} ({fmt_bytes(self.gpu_memory_bytes)})", self.verdict or ""))
            if self.max_micro_batch is not None:
                rows.append(("largest micro-batch that fits", str(self.max_micro_batch)))
        if self.train_seconds is not None:
            rows.append(("training time", f"{self.train_seconds / 3600:,.1f} h"))
        if self.cost is not None:
            rows.append(("cost", f"{self.cost:,.0f}"))
        split = f"{self.gpus} GPU" + ("s" if self.gpus > 1 else "")
        engine = f"FSDP {self.fsdp}" if self.fsdp != "off" else f"ZeRO {self.zero_stage}"
        if self.context_parallel > 1:
            split += (
                f" (tp {self.tensor_parallel} x pp {self.pipeline_parallel} x "
                f"cp {self.context_parallel} x dp {self.data_parallel // self.context_parallel})"
            )
        elif self.tensor_parallel > 1 or self.pipeline_parallel > 1:
            split += (
                f" (tp {self.tensor_parallel} x pp {self.pipeline_parallel} x "
                f"dp {self.data_parallel})"
            )
        name = self.model or f"{fmt_count(self.n_params)} parameters"
        if self.experts:
            name += f" ({fmt_count(self.active_params)} of {fmt_count(self.n_params)} active)"
        title = f"memory per GPU: {name}, {self.precision}, {self.optimizer}, {engine}, {split}"
        return Display(title, rows)


#: Every field's name (`MemoryEstimate.of_every_field`).
_FIELD_NAMES = field_names(MemoryEstimate)

__all__ = ["MemoryEstimate"]
