"""The peak of one training step on one GPU: model states, activations and every transient.

`estimate_memory` reports model states at rest (the ZeRO paper's figure) and the
activations kept for backward (Korthikanti et al.); neither is what the GPU must hold at
the highest point of a step. This module follows one optimizer step (with gradient
accumulation: its last micro-batch) through three points and takes the highest:

    forward end     parameters + gradients already held + optimizer states
                    + stored activations + the logits and the loss's fp32 copies
                    + the autocast weight casts + the engine's gathered parameters
    backward        the highest of three moments (`StepPeak.backward_moment`), four
                    with a tied embedding:
                    the loss's backward (fp32 log-probabilities, their gradient and the
                    logits' gradient, every activation still kept); the last layer's
                    backward (its recomputation working set, its activation gradients,
                    the output projection's gradient, the engine's unsharded
                    gradients); a tied embedding's backward (every gradient and the one
                    weight's two gradients with their sum, `tied_embedding`, before the
                    engine's final reduce); the end of backward (every gradient, the
                    first layer's recomputation, the engine's buckets and root unit)
    optimizer step  parameters + all gradients + optimizer states + the optimizer's
                    temporaries + the engine's step buffers

The recomputation working set (`ActivationBreakdown.recompute_bytes`) exists in backward
only, not at the forward's end; the moments of backward are summed apart, never all at
once (the dry run, `workbench.simulate_memory`, measures where each one's terms are).

Each point is a sum of named terms (`StepPeak.terms`); `peak_bytes` is the largest sum,
what `torch.cuda.max_memory_allocated()` measures. The CUDA context and the caching
allocator's reserve are not allocations; `estimate_memory` keeps them on their own line
(`overhead_bytes`), and `fits` compares `peak_bytes + overhead_bytes` with the GPU.

The terms (symbols as in `activations`: s sequence, b micro-batch, h hidden, f MLP inner,
a heads, v vocabulary, t tensor-parallel size; Ψ this GPU's parameters before sharding,
N the data-parallel size; e the activation bytes, 2 in 16-bit compute, 4 in fp32):

* **logits and loss**: the output projection returns logits in the compute dtype (e·sbv)
  and the loss upcasts them to fp32 and takes log_softmax, whose fp32 output (4sbv)
  cross-entropy keeps for backward (`activations` counts it as `logits_bytes`). At the
  end of the forward the logits, their fp32 copy (16-bit compute only) and the
  log-probabilities exist at once: e·sbv + 4sbv + 4sbv. The step frees the model's output
  before backward (the Session, torchtitan and the Hugging Face Trainer all do), so
  backward of the loss holds the log-probabilities, their gradient and the logits' fp32
  gradient: 12sbv at its highest. Chunked cross-entropy over c chunks of the sequence
  (torchtune's `CEWithChunkedOutputLoss`, `loss_chunks=c`) upcasts and differentiates one
  chunk at a time: the log-probabilities are still kept (4sbv) but the fp32 copy and the
  two gradients shrink to a chunk: e·sbv + 4sbv + 4sbv/c forward, 4sbv + 8sbv/c backward.
  `chunked_loss_saving_bytes` is what 8 chunks would save. v is split over t
  (vocabulary-parallel output).
* **autocast weight casts**: torch autocast (the plain loop and DeepSpeed under amp-bf16 /
  amp-fp16) caches a 16-bit copy of every weight a matmul uses for the whole forward, and
  each layer's copy is kept for its backward: 2 bytes x the matmul parameters (every
  layer's parameters but its norms, which run in fp32, and the output projection; the
  embedding lookup is not cast). FSDP's
  `MixedPrecisionPolicy` gathers 16-bit parameters instead (counted under FSDP); pure
  16-bit training casts nothing.
* **optimizer step temporaries**: torch's Adam/AdamW in their *foreach* implementation
  (torch's default on CUDA) allocate one parameter-sized tensor for the whole step (the
  square root of `exp_avg_sq` over every parameter of a dtype at once): Ψ_step x the
  state bytes (4; 2 under bf16-true), where Ψ_step is what this GPU steps (its shard
  under ZeRO >= 1 and FSDP); Adagrad two (the square root and -lr x the gradient); SGD
  with weight decay one (the gradient plus the decay). The *for-loop* implementation
  (`foreach=False`) holds, at its highest, two tensors of the parameter it is stepping
  and one of the previous parameter (still bound to the loop's variable): the most of
  previous + 2 x current over the parameters in order (`parameter_order`; Adam with L2
  decay: + 3 x current; Adagrad: previous + current; SGD with decay: the largest). The
  *fused* kernels (torch's `fused=True`, DeepSpeed's FusedAdam/FusedLamb/FusedLion, which
  DeepSpeed builds for its optimizers) allocate none; nor does SGD without weight decay,
  nor an optimizer offloaded to the CPU. Every case is measured on this CPU in
  tests/integration/test_peak_terms.py. `optimizer_impl="auto"` takes what the engine
  builds: DeepSpeed's fused kernel under DeepSpeed, torch's default otherwise (foreach;
  the for-loop for an optimizer whose row's `default_impl` says so, torch's Adafactor).
  A factored optimizer (Adafactor) holds, in its for-loop, the estimate `row_var @ col_var`
  the size of the parameter it steps and the previous parameter's still bound (its row's
  temporaries 1, 1, 1), and the row and column means of a parameter plus vectors its loop
  still binds (`factored_means`: twice the largest parameter's statistics, a bound; its
  foreach step is the row's one copy, exact); the statistics themselves are states.
* **DDP gradient buckets**: `DistributedDataParallel` copies every gradient into flat
  buckets it allocates at construction (the gradients' size, W·Ψ with W the gradient
  bytes), for the whole run, unless `gradient_as_bucket_view=True` (`bucket_view`), where
  the gradients are views into the buckets and nothing is added.
* **DeepSpeed buffers**: ZeRO 1 and 2 reduce gradients through a contiguous bucket of
  `reduce_bucket_size` elements in the gradient dtype (two with `overlap_comm`), which
  DeepSpeed 0.19 allocates at the first gradient hook (`setup_buckets`, beside the output
  projection's gradient: not in the loss's backward) and releases after backward (stage 1
  only at the accumulation boundary: with accumulation the last micro-batch's forward
  holds the buckets the first one's backward made). Each
  reduce cats the bucket's gradients into a new tensor before the collective and copies
  it back ("DeepSpeed flattened reduce copy": W x the bucket's elements, at most
  min(`reduce_bucket_size`, Ψ); DeepSpeed 0.19 `allreduce_bucket`, one at a time): at the
  end of backward (the final reduce; the gradient partition is made by the first
  reduce, after its copy is freed, so a bucket that holds every trained parameter
  reduces once with no partition yet) and, when the bucket is smaller than the trained
  parameters, beside the layers' backward. Stage 1 without `overlap_comm` reduces after
  backward, flattening gradients its whole `.grad`s no longer hold (no term of its
  own). Stage 0 flattens every gradient (at most 5e8 elements at a time) after
  autograd's backward: the copy at the end of backward only. Under 16-bit training the
  step makes an
  fp32 copy of this GPU's gradient partition (4·Ψ/N); ZeRO 1/2 first flatten it in the
  gradient dtype (W·Ψ/N), alive with the fp32 copy until the optimizer runs: the step's
  highest moment holds the larger of that flat copy and the optimizer's temporaries
  ("DeepSpeed flattened gradient partition" is the flat copy beyond the temporaries); stage 3
  flattens and upcasts one sub-group's partition (`sub_group_size`) in every precision,
  the flat copy being the fp32 one under fp32 and amp-*. Stage 3 gathers parameters in the
  dtype its partitions are held in (fp32 under amp-*): the layer running plus what the
  prefetcher fetches ahead (at most
  `stage3_prefetch_bucket_size` elements), capped at `stage3_max_live_parameters`, never
  more than the model; its reduce bucket is in the "deepspeed" accounting's gradients.
  The sizes are DeepSpeed's defaults (5e8, 5e7, 1e9, 1e9 elements) unless a DeepSpeed config
  gives them (`deepspeed_config`); the workbench's own engine caps the reduce bucket at the
  model's size (`deepspeed_layout.bucket_elements`). DeepSpeed 0.19 releases the ZeRO 1/2
  buckets at the end of each backward and frees stage 0-2 gradients at each step, so
  neither is held through the next forward; ZeRO-3 keeps its gradient partition buffer
  (what dry runs of DeepSpeed's own engine show, tests/integration/test_dry_run_deepspeed.py).
* **FSDP gathered units**: FSDP2 gathers each wrapped unit (`fsdp_units`: under "blocks",
  the default, each transformer layer, the embedding and the output head with the final
  norm, `fsdp_unit_params`; under "blocks-only" or with a head tied to the embedding, the
  root unit holds the embedding, the final norm and the output projection) in the
  compute dtype, and keeps the last all-gather's output until the next. With own units
  under `full_shard` the embedding is gathered only in its forward and at the end of
  backward; the head (kept gathered after its forward, as torchtitan keeps it) is held
  twice, with its all-gather output, from the forward's end into the loss's backward; a
  layer's backward holds two layers. Otherwise: `full_shard`
  frees a layer after its forward and backward and prefetches the next: the root and two
  layers at a time (the layer running and the one prefetched; at the instant the forward
  ends, the root and one). `shard_grad_op` and `no_shard` keep every layer gathered from
  its forward to its backward: the root and every layer, plus the last layer's
  all-gather output at the forward's end (measured on a fake group of two ranks,
  tests/integration/test_peak_terms.py). In backward each unit's unsharded gradient (in
  the compute dtype, as autograd makes it) lives until its reduce-scatter, which overlaps
  the next unit's backward: two layers', and the output projection's, whose root unit
  reduces last; reducing in fp32 (`fsdp_reduce_fp32`, under 16-bit compute) adds one
  layer's fp32 copy. Only parameters that train have gradients: under LoRA a unit's are
  its adapters' (none of the frozen head, embedding or root), as DDP's buckets and ZeRO's
  buckets and partitions hold the adapters' only (`trained_params`). At the end of backward the root is gathered with its unsharded
  gradients. CPU offload keeps none of the states on the GPU but gathers and reduces the
  same units there.
* **backward transient**: the activation gradients of the largest layer while its
  backward runs: the gradient flowing in and out of the layer (2·e·sbh) plus the larger
  of the MLP's inner gradients (2·e·sbf for GELU, 3·e·sbf gated) and the attention's
  (eager: the scores' and probabilities' gradients, 2·e·as^2b; sdpa: its fp32 query
  gradient accumulator and the key and value gradients, 4sbh + 2·e·sbh), split over t.
* **tied embedding gradient sum**: a tied embedding's weight gets the output
  projection's gradient early in backward and the lookup's at its end; autograd adds them
  while both are alive (in place into the first under autocast and ZeRO-3, into a new
  tensor otherwise), at a moment of its own, "embedding's backward", after every layer's
  and before the engine's final reduce: the vocab x hidden tensors beyond the one the
  gradients count (`workbench.estimate.tied_embedding`).
* **first gradients**: without accumulation no gradient exists before backward
  (`zero_grad(set_to_none=True)`); the first to appear, while the loss's backward
  buffers are alive, is the output projection's (W·vh/t). With accumulation every
  gradient is already held (and under ZeRO-3 its gradient partition buffer).

Without a transformer shape only the model-state terms, the optimizer temporaries, the
buckets and the engines' buffers are counted (FSDP then gathers the whole model as one
unit, and the largest parameter is taken to be the whole model: an upper bound).

Past 600 lines because `step_peak` assembles every term of every moment of the step in one
place (each engine's, offload's and LoRA's terms feed the same moments); the terms'
formulas are the functions above it, and LoRA's own in `workbench.estimate.lora`.

The terms a step's micro-batch does not change (the engine, its buffers, the autocast
copies, the optimizer's temporaries) are gathered in `workbench.estimate.engine_terms`.

Pure Python: imports no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.estimate.activations import ActivationBreakdown, Attention, Checkpointing
from workbench.estimate.compiled import COMPILE_TERM, compiled_drop_bytes
from workbench.estimate.context_parallel import ring_term
from workbench.estimate.engine_terms import (
    StepFixed,
    autocast_casts,
    compute_bytes,
    engine_of,
    fixed_terms,
)
from workbench.estimate.frozen import field_names, of_every_field
from workbench.estimate.inputs_check import OPTIMIZER_IMPLS, EstimateInputs
from workbench.estimate.lora import adapter_activation_bytes
from workbench.estimate.model_states import ModelStates
from workbench.estimate.optimizer_step import (
    factored_means,
    in_backward_terms,
    optimizer_temporaries,
    parameter_order,
    resolve_impl,
)
from workbench.estimate.tied_embedding import EMBEDDING_MOMENT, TIED_SUM_TERM

PHASES = ("forward end", "backward", "optimizer step")
_SDPA = Attention.SDPA  # bound once: an enum member read through its class costs more

#: How many chunks `chunked_loss_saving_bytes` assumes (torchtune's default).
SAVING_CHUNKS = 8

#: The host term of `activation_offload` (`StepPeak.host_terms`).
OFFLOADED_TERM = "offloaded activations (host)"
#: The term of a paged optimizer's states (`OptimizerRow.paged`, `StepPeak.host_terms`):
#: CUDA unified memory, which no allocator statistic counts and the driver moves between
#: the GPU and the host as the step needs it and room allows.
PAGED_TERM = "paged optimizer states (unified memory)"


@dataclass(frozen=True)
class StepPeak:
    """The peak of one training step on one GPU (see the module docstring).

    `terms` are the named bytes of the highest point, `phase` (a `PHASES` value);
    `peak_bytes` is their sum. `phases` holds every point's total, `variable` the part
    of it that grows in proportion to the micro-batch (activations, logits, transient). `engine` is "plain",
    "ddp", "deepspeed" or "fsdp"; `optimizer_impl` the implementation counted.
    """

    peak_bytes: int
    phase: str
    terms: dict[str, int]
    phases: dict[str, int]
    engine: str
    optimizer_impl: str
    chunked_loss_saving_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())
    #: the part of each point's total that grows with the micro-batch (in proportion)
    variable: dict[str, int] = field(default_factory=dict)
    #: every point's named terms (`terms` is the highest point's)
    points: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the backward's highest moment: "loss backward", "last layer's backward",
    #: "embedding's backward" (a tied embedding's, `tied_embedding`) or "backward end" (its
    #: terms are the "backward" point's)
    backward_moment: str = "loss backward"
    #: what the step keeps in host memory, not in the device peak (`activation_offload`)
    host_terms: dict[str, int] = field(default_factory=dict)
    #: the most gradient bytes any moment of the step holds (every backward moment, not
    #: only the highest: under `optimizer_in_backward` the largest parameter's gradient)
    held_gradients_bytes: int = 0
    #: the activations a `compile` step does not keep (`COMPILE_TERM`'s bytes; with
    #: `activation_offload` off the host's share instead of a device term)
    compile_not_kept_bytes: int = 0
    #: every moment of the backward's named terms ("loss backward", "last layer's
    #: backward", "embedding's backward" with a tied embedding, "backward end";
    #: `points["backward"]` is the highest of them)
    moments: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: `StepPeak`'s fields (`peak_point` builds one in one step).
_PEAK_FIELDS = field_names(StepPeak)


def _loss_terms(i: EstimateInputs, breakdown: ActivationBreakdown | None) -> tuple[int, int]:
    """(forward, backward) bytes of the logits and the loss beyond the fp32 log-probs the
    activations already count, with `i.loss_chunks` chunks."""
    arch = i.architecture
    if arch is None or breakdown is None or i.pipeline_parallel > 1:
        return 0, 0
    return loss_bytes(i, arch.seq_len, arch.vocab, i.loss_chunks)


def loss_bytes(i: EstimateInputs, s: int, v: int, chunks: int) -> tuple[int, int]:
    """(forward, backward) bytes of the loss beyond the fp32 log-probabilities (which the
    activations count) for `chunks` chunks (see the module docstring)."""
    e = compute_bytes(i.precision)
    sbv = s * i.micro_batch * -(-v // i.tensor_parallel)
    upcast = 4 * sbv // chunks if e != 4 else 0  # fp32 logits are log_softmax's input
    return e * sbv + upcast, 8 * sbv // chunks


def backward_transient(i: EstimateInputs, exchange: int = 0) -> int:
    """Activation gradients of the largest layer during its backward (`exchange`: what
    the attention's backward holds beside its gradients: context parallelism's buffers)."""
    arch = i.architecture
    if arch is None:
        return 0
    e = compute_bytes(i.precision)
    t = i.tensor_parallel
    s, b, h, a = arch.seq_len, i.micro_batch, arch.hidden, arch.heads
    f = arch.token_ffn_hidden
    sbh = s * b * h
    mlp = (3 if arch.mlp == "swiglu" else 2) * e * s * b * f // t
    sdpa = i.attention is _SDPA
    attention = (4 * sbh + 2 * e * sbh) // t if sdpa else 2 * e * a * s * s * b // t
    return 2 * e * sbh // (t if i.sequence_parallel else 1) + max(mlp, attention + exchange)


#: The term of packed documents' attention mask (`document_mask_bytes`).
DOCUMENT_MASK_TERM = "document mask"


def document_mask_bytes(i: EstimateInputs) -> int:
    """Packed documents' block-diagonal causal mask that the step keeps (`document_mask`):
    the sdpa kernel takes it as an additive bias in the compute dtype, one (b, 1, s, s)
    tensor shared by every layer and kept for backward: e·s^2·b. The unfused kernels read
    a bool mask (s^2·b bytes) that nothing keeps for backward and that is freed when the
    forward returns, before the loss: no term."""
    arch = i.architecture
    if not i.document_mask or arch is None or i.attention is not _SDPA:
        return 0
    return compute_bytes(i.precision) * arch.seq_len * arch.seq_len * i.micro_batch


def step_peak(
    i: EstimateInputs,
    states: ModelStates,
    breakdown: ActivationBreakdown | None,
    *,
    fixed: StepFixed | None = None,
) -> StepPeak:
    """The peak of one step of checked inputs `i`, with model states `states` and
    activations `breakdown` (`activations(i)`); `fixed`: `fixed_terms(i, states)` when
    already computed (of inputs that differ from `i` in the micro-batch at most)."""
    return _step_peak(i, states, breakdown, True, fixed)


def peak_point(
    i: EstimateInputs,
    states: ModelStates,
    breakdown: ActivationBreakdown | None,
    *,
    fixed: StepFixed | None = None,
) -> StepPeak:
    """`step_peak`'s highest point only: `peak_bytes`, `phase`, `terms`, `phases`,
    `engine` and `optimizer_impl` as `step_peak` gives them, the fields that describe the
    rest of the step (`variable`, `points`, `moments`, `host_terms`, the held gradients,
    the chunked loss's saving, compile's bytes) left at their defaults. For a search over
    micro-batches, which reads what a point needs and its reserve (`reserve.reserve_of`
    reads `terms`); tests/unit/test_estimate_fast_paths.py holds it equal to `step_peak`'s.
    `fixed` as for `step_peak`."""
    return _step_peak(i, states, breakdown, False, fixed)


#: The terms that grow in proportion to the micro-batch (`StepPeak.variable`).
_SCALING = (
    "activations",
    "logits and loss",
    "backward transient",
    DOCUMENT_MASK_TERM,
    COMPILE_TERM,
)


def _scaling_bytes(terms: dict[str, int]) -> int:
    """The bytes of a point's `_SCALING` terms (written out: it runs for every point of
    every peak the largest micro-batch's search computes)."""
    get = terms.get
    return (
        get("activations", 0)
        + get("logits and loss", 0)
        + get("backward transient", 0)
        + get(DOCUMENT_MASK_TERM, 0)
        + get(COMPILE_TERM, 0)
    )


def _step_peak(
    i: EstimateInputs,
    states: ModelStates,
    breakdown: ActivationBreakdown | None,
    report: bool,
    fixed: StepFixed | None = None,
) -> StepPeak:
    """`step_peak` (`report`) or `peak_point` (not `report`); `fixed`: `fixed_terms(i,
    states)` when already computed (for inputs that differ from `i` in the micro-batch at
    most)."""
    f = fixed if fixed is not None else fixed_terms(i, states)
    engine, impl = f.engine, f.impl
    params, grads, optim = f.params, f.grads, f.optim
    casts, temps, held_grads, first = f.casts, f.temps, f.held_grads, f.first
    dequant = f.dequant
    engine_fwd, engine_bwd, engine_step = f.engine_fwd, f.engine_bwd, f.engine_step
    acts = logits_kept = 0
    if breakdown is not None:
        logits_kept = breakdown.logits_bytes
        acts = breakdown.total_bytes - logits_kept
    loss_fwd, loss_bwd = _loss_terms(i, breakdown)
    transient = backward_transient(i)
    arch = i.architecture
    ring = ring_term(i, backward_transient, transient) if i.context_parallel > 1 else {}
    adapters = 0
    if i.lora is not None:
        e = compute_bytes(i.precision)
        full = i.checkpointing is Checkpointing.FULL  # blocks keep only their inputs
        adapters = adapter_activation_bytes(i.lora, arch, i.micro_batch, e, 0 if full else None)
        in_flight = adapter_activation_bytes(i.lora, arch, i.micro_batch, e, 1 if full else None)
    lora_fwd: dict[str, int] = {}
    lora_kept: dict[str, int] = {}
    lora_bwd: dict[str, int] = {}
    if i.lora is not None:
        lora_fwd = {"LoRA adapter activations": adapters, "QLoRA dequantized weight": dequant}
        lora_kept = {"LoRA adapter activations": adapters}
        lora_bwd = {"LoRA adapter activations": in_flight, "QLoRA dequantized weight": dequant}

    recompute = breakdown.recompute_bytes if breakdown is not None else 0
    stored = acts - recompute  # the recomputation working set exists in backward only
    not_kept = compile_not_kept = compile_term_bytes(i, breakdown)  # recomputed by compile
    host: dict[str, int] = {}
    if i.activation_offload:
        # the forward's saved activations live in host memory; the device holds the layer
        # in flight (being copied out in forward, brought back in backward)
        host[OFFLOADED_TERM] = stored - not_kept
        stored = offload_in_flight(breakdown, stored)
        acts = stored + recompute
        not_kept = 0  # what compile does not keep is off the host's share
    compiled = {COMPILE_TERM: -not_kept} if not_kept else {}
    if f.paged:
        # bitsandbytes' paged states (cudaMallocManaged) are outside the caching allocator:
        # beside the device peak, paged out by the driver when the GPU is full
        host[PAGED_TERM] = optim
        optim = 0
    base = {"parameters": params, "optimizer states": optim}
    mask = document_mask_bytes(i)
    kept_mask = {DOCUMENT_MASK_TERM: mask} if mask else {}
    one_grad = one_temps = 0
    if i.optimizer_in_backward:
        # each parameter is stepped as its gradient is ready and the gradient freed: one
        # gradient and its step's temporaries at a time, nothing left for the step
        one_grad, one_temps = in_backward_terms(i, impl, grads, temps)
    # `peak_point` (not `report`): each point's total added up from the same values as its
    # named terms below (tests/unit/test_estimate_fast_paths.py holds them equal), and only
    # the highest point named; `step_peak` names every point and adds up their terms
    moment = phase = ""
    if not report:
        fwd_sum, held_sum, bwd_sum, end_sum, step_sum, embedding_sum = f.sums
        lora_on = i.lora is not None
        held = params + optim + casts + mask - not_kept
        moment_totals = {
            "loss backward": held + held_grads + stored + logits_kept + loss_bwd
            + (adapters if lora_on else 0) + held_sum,
            "last layer's backward": held + held_grads + first + acts + transient
            + (in_flight + dequant if lora_on else 0) + bwd_sum
            + (sum(ring.values()) if ring else 0),
        }  # fmt: skip
        if f.tied_sum:  # in the order `step_peak` names them (a tie picks the first)
            moment_totals[EMBEDDING_MOMENT] = (
                params + optim + f.embedding_grads + f.tied_sum + embedding_sum
            )
        moment_totals["backward end"] = (
            params + optim + recompute + transient
            + (dequant if lora_on else 0) + end_sum
            + (one_grad + one_temps if i.optimizer_in_backward else f.end_grads)
        )  # fmt: skip
        moment = max(moment_totals, key=moment_totals.__getitem__)
        totals = {
            PHASES[0]: held + held_grads + stored + logits_kept + loss_fwd
            + (adapters + dequant if lora_on else 0) + fwd_sum,
            PHASES[1]: moment_totals[moment],
            PHASES[2]: params + optim + step_sum
            + (0 if i.optimizer_in_backward else grads + temps),
        }  # fmt: skip
        phase = max(PHASES, key=totals.__getitem__)
    forward: dict[str, int] = {}
    if report or phase == PHASES[0]:
        forward = {
            **base,
            "gradients": held_grads,
            "activations": stored,
            **compiled,
            "logits and loss": logits_kept + loss_fwd,
            "autocast weight casts": casts,
            **lora_fwd,
            **engine_fwd,
            **kept_mask,
        }
    moments: dict[str, dict[str, int]] = {}
    named = report or phase == PHASES[1]
    if named and (report or moment == "loss backward"):
        # the loss's backward: its fp32 buffers, every activation still kept
        moments["loss backward"] = {
            **base,
            "gradients": held_grads,
            "activations": stored,
            **compiled,
            "logits and loss": logits_kept + loss_bwd,
            "autocast weight casts": casts,
            **lora_kept,
            **f.held_units,
            **kept_mask,
        }
    if named and (report or moment == "last layer's backward"):
        # the last layer's backward: its recomputation, its gradients' temporaries, the
        # output projection's gradient, the engine's unsharded gradients
        moments["last layer's backward"] = {
            **base,
            "gradients": held_grads + first,
            "activations": acts,
            **compiled,
            "autocast weight casts": casts,
            "backward transient": transient,
            **ring,
            **lora_bwd,
            **engine_bwd,
            **kept_mask,
        }
    if f.tied_sum and named and (report or moment == EMBEDDING_MOMENT):
        # a tied embedding's backward, after every layer's: every gradient, the one
        # weight's two gradients and their sum (`tied_embedding`), the engine's buffers
        # before its final reduce
        moments[EMBEDDING_MOMENT] = {
            **base,
            "gradients": f.embedding_grads,
            TIED_SUM_TERM: f.tied_sum,
            **f.embedding_engine,
        }
    if named and (report or moment == "backward end"):
        # the end of backward: every gradient, the first layer's recomputation
        moments["backward end"] = {
            **base,
            "gradients": f.end_grads,
            "activations": recompute,
            "backward transient": transient,
            **({"QLoRA dequantized weight": dequant} if i.lora is not None else {}),
            **f.backward_end_engine,
        }
        if i.optimizer_in_backward:
            moments["backward end"].update(
                {"gradients": one_grad, "optimizer step temporaries": one_temps}
            )
    if i.optimizer_in_backward:
        temps, grads = 0, 0
    step: dict[str, int] = {}
    if report or phase == PHASES[2]:
        step = {
            **base,
            "gradients": grads,
            "optimizer step temporaries": temps,
            **engine_step,
        }
    if report:
        moment_totals = {name: sum(terms.values()) for name, terms in moments.items()}
        moment = max(moment_totals, key=moment_totals.__getitem__)
        totals = {
            PHASES[0]: sum(forward.values()),
            PHASES[1]: moment_totals[moment],
            PHASES[2]: sum(step.values()),
        }
        phase = max(PHASES, key=totals.__getitem__)
    backward = moments.get(moment, {})
    points = dict(zip(PHASES, (forward, backward, step), strict=True))
    terms = {k: v for k, v in points[phase].items() if v or k in base or k == "gradients"}
    if not report:
        return of_every_field(
            StepPeak,
            _PEAK_FIELDS,
            {
                "peak_bytes": totals[phase],
                "phase": phase,
                "terms": terms,
                "phases": totals,
                "engine": engine,
                "optimizer_impl": impl,
                "chunked_loss_saving_bytes": None,
                "notes": (),
                "variable": {},
                "points": {},
                "backward_moment": "loss backward",
                "host_terms": {},
                "held_gradients_bytes": 0,
                "compile_not_kept_bytes": 0,
                "moments": {},
            },
        )
    variable = {name: _scaling_bytes(terms) for name, terms in points.items()}
    saving = None
    if arch is not None and breakdown is not None and i.pipeline_parallel == 1:
        saving = 0
        if i.loss_chunks < SAVING_CHUNKS:
            f8, b8 = loss_bytes(i, arch.seq_len, arch.vocab, SAVING_CHUNKS)
            loss_moment = moment_totals["loss backward"]
            others = [v for k, v in moment_totals.items() if k != "loss backward"]
            chunked = max(
                totals["forward end"] - loss_fwd + f8,
                loss_moment - loss_bwd + b8,
                *others,
                totals["optimizer step"],
            )
            saving = max(0, totals[phase] - chunked)
    return of_every_field(
        StepPeak,
        _PEAK_FIELDS,
        {
            "peak_bytes": totals[phase],
            "phase": phase,
            "terms": terms,
            "phases": totals,
            "engine": engine,
            "optimizer_impl": impl,
            "chunked_loss_saving_bytes": saving,
            "notes": (),
            "variable": variable,
            "points": points,
            "backward_moment": moment,
            "held_gradients_bytes": max(
                forward["gradients"],
                moments["loss backward"]["gradients"],
                moments["last layer's backward"]["gradients"],
                moments.get(EMBEDDING_MOMENT, {}).get("gradients", 0),
                moments["backward end"]["gradients"],
                step["gradients"],
            ),
            "host_terms": host,
            "compile_not_kept_bytes": compile_not_kept,
            # the highest moment is the backward point itself (the same terms)
            "moments": moments,
        },
    )


def compile_term_bytes(i: EstimateInputs, breakdown: ActivationBreakdown | None) -> int:
    """The activation bytes a `compile` step does not keep (`workbench.estimate.compiled`:
    what AOTAutograd's partitioner recomputes in backward; the peak's `COMPILE_TERM`, a
    negative term beside "activations"); 0 without `compile` or a transformer shape."""
    arch = i.architecture
    if not i.compile or breakdown is None or arch is None:
        return 0
    return compiled_drop_bytes(
        breakdown,
        layers=arch.layers,
        seq_len=arch.seq_len,
        micro_batch=i.micro_batch,
        hidden=arch.hidden,
        heads=arch.heads,
    )


def offload_in_flight(breakdown: ActivationBreakdown | None, stored: int) -> int:
    """The saved activations an `activation_offload` step holds on the device: one layer's
    (its own stored bytes, or the output layer's inputs if larger), never more than all."""
    if breakdown is None:
        return 0
    output_inputs = breakdown.output_bytes - breakdown.logits_bytes
    return min(stored, max(breakdown.per_layer_bytes, output_inputs))


__all__ = [
    "COMPILE_TERM",
    "compute_bytes",
    "OFFLOADED_TERM",
    "PAGED_TERM",
    "OPTIMIZER_IMPLS",
    "PHASES",
    "StepFixed",
    "StepPeak",
    "autocast_casts",
    "backward_transient",
    "compile_term_bytes",
    "engine_of",
    "factored_means",
    "fixed_terms",
    "loss_bytes",
    "offload_in_flight",
    "optimizer_temporaries",
    "parameter_order",
    "peak_point",
    "resolve_impl",
    "step_peak",
]
