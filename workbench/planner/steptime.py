"""The planner's step-time model: one optimizer step of a layout, term by term (seconds).

Every formula and its source is in docs/planner.md; in short, for a model of N parameters
(N_a used per token), L layers, width h, sequence s, a step of T tokens over G GPUs laid
out as tp x pp x dp, each data-parallel replica running `accum` micro-batches of b:

* compute: (6 N_a + 12 L h s) T model FLOPs (PaLM, appendix B; with frozen weights, as
  under LoRA, 4 N_a + 2 N_trained: no weight gradients but the adapters'), plus the
  recomputed forward (2 N_a + 4 L h s per token) under full checkpointing, the attention
  core's (4 L h s per token) under selective recomputation, split over the G GPUs at
  `efficiency` x the GPU's peak for the precision, faster by torch.compile's and
  float8's published factors when pinned (workbench.planner.schedules), on all but the
  attention core (`linear_factors`: float8 converts the `nn.Linear` layers, torch.compile
  fuses the elementwise work around them; the fused sdpa kernel is neither's);
* the pipeline bubble: (pp - 1) / accum of that compute under 1F1B (Narayanan et al.,
  2021), less under an interleaved or zero-bubble schedule (workbench.planner.schedules);
* data parallel, each collective as NCCL runs it (workbench.planner.collectives: NVLink
  inside a node, the node's NICs together across nodes, ring or tree, NCCL's latency a
  call): DDP and ZeRO-1 all-reduce the gradients once a step in 25 MiB buckets; ZeRO-2
  reduce-scatters them every micro-batch and all-gathers the 16-bit weights once;
  ZeRO-3 / FSDP full_shard all-gather the weights in each micro-batch's forward and
  backward and reduce-scatter its gradients, a layer at a time; FSDP shard_grad_op
  all-gathers once a micro-batch; HSDP does FSDP's inside a node and all-reduces the
  gradient shards across. They overlap with compute: only what exceeds `overlap` x the
  compute time is exposed (an assumption, docs/planner.md);
* tensor parallel: 4 all-reduces of b s h activations per layer per micro-batch (2 in
  the forward, 2 in the backward; 2 more with the recomputed forward), not overlapped;
  sequence parallelism moves the same bytes (all-gather + reduce-scatter);
* pipeline: each micro-batch's activations and their gradients sent to the next stage
  (v times with v virtual stages a rank);
* offload: gradients to the host and weights back over PCIe each step, the host's Adam
  step at its memory bandwidth (30 bytes a parameter), parameters fetched over PCIe in
  each micro-batch's forward and backward with `offload_params`;
* context parallel (cp > 1, torch's ring attention as torchtitan runs it): each layer's
  attention all-gathers K and V of the whole sequence (2 b s g / t elements, g = kv_heads
  x head size) over the cp group in its forward (again in the recomputed forward) and in
  its backward, and passes the K/V gradients round the ring in fp32 (a reduce-scatter's
  traffic). torch issues the gather before the rank's own block of attention and each
  gradient hop before the next block, so each hides behind that much attention compute:
  exposed = the gather less the rank's first block (1/cp of its attention), forward and
  backward, plus the gradients' traffic less the other blocks' backward. The cp ranks
  hold the same parameters: the data-parallel group is dp x cp (torchtitan's FSDP over
  `dp_shard_cp`), and tp's and pp's activations are the rank's s / cp tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from workbench.estimate.flops import FlopCount
from workbench.planner import collectives as nccl
from workbench.planner.hardware import Cluster
from workbench.planner.schedules import bubble_fraction, compute_speedup

#: bytes one parameter's host Adam step reads and writes: the fp32 weight, two moments and
#: the fp32 gradient read (16), the weight and moments written (12), the 16-bit copy (2)
HOST_ADAM_BYTES = 30
#: the bytes of one gradient bucket DDP (`bucket_cap_mb`, 25 MB) and DeepSpeed's ZeRO-1/2
#: (`reduce_bucket_size`, 5e8 elements: larger) reduce at a time; the planner counts DDP's
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Shape:
    """What the step-time model reads of a model."""

    n_params: int
    active_params: int  # the FLOP count's N: the parameters a token multiplies (estimate.flops)
    layers: int
    hidden: int
    seq_len: int
    #: the width of K and V (kv_heads x head size; 0: `hidden`, multi-head attention)
    kv_width: int = 0


@dataclass(frozen=True)
class Layout:
    """One plan's parallel layout and engine, as the step-time model reads it."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    accum: int
    engine: str  # "ddp", "zero1", "zero2", "zero3", "full_shard", "shard_grad_op"
    checkpointing: str  # "none" | "selective" | "full"
    sixteen_bit: bool
    bf16: bool
    grad_bytes: int  # bytes of one gradient element as reduced (4 under autocast, 2 in 16-bit)
    weight_bytes: int = 2  # bytes of one weight element as gathered (2 in 16-bit, 4 in fp32)
    offload_optimizer: bool = False
    offload_params: bool = False
    #: parameters that train (LoRA: the adapters'); None: every one
    trainable_params: int | None = None
    #: the pipeline schedule (workbench.planner.schedules.SCHEDULES) and its virtual
    #: stages a rank (interleaved schedules: layers cut into pp x v chunks)
    schedule: str = "1f1b"
    virtual_stages: int = 1
    #: HSDP: shard over groups of this many data-parallel ranks (within a node), replicate
    #: across them (None: shard over all dp ranks)
    shard_group: int | None = None
    #: torch.compile on, float8 matmuls on (factors from published measurements)
    compiled: bool = False
    float8: bool = False
    #: context parallelism: each sequence split over this many GPUs (tp x pp x cp x dp)
    cp: int = 1


@dataclass(frozen=True)
class StepTime:
    """One step's time by term (seconds); `step_seconds` is their sum as exposed."""

    compute: float
    bubble: float
    data_parallel: float
    data_parallel_exposed: float
    tensor_parallel: float
    pipeline: float
    offload: float
    model_flops: float  # per step, all GPUs (what MFU counts)
    peak_flops: float = 0.0  # one GPU's peak the compute ran at (FLOP/s)
    terms: dict[str, float] = field(default_factory=dict)
    context_parallel: float = 0.0  # the ring attention's K/V exchange, exposed

    @property
    def step_seconds(self) -> float:
        return (
            self.compute
            + self.bubble
            + self.data_parallel_exposed
            + self.tensor_parallel
            + self.pipeline
            + self.offload
            + self.context_parallel
        )


#: the parameters Llama 3.1 8B's tokens multiply (8,030,261,248 less the 128,256 x 4,096
#: embedding lookup): the step torch.compile's and float8's factors were measured on
#: (torchtitan Table 1: 8,192 tokens, selective recomputation; `schedules.COMPUTE_FACTORS`)
_MEASURED_STEP = FlopCount(7_504_924_672, 32, 4096, 8192)


def _attention_flops(count: FlopCount, recompute: str) -> int:
    """The attention core's hardware FLOPs a token: 12 L q s, and its forward (4 L q s)
    again where `recompute` runs it (full, selective)."""
    again = count.attention_per_token // 3 if recompute in ("full", "selective") else 0
    return count.attention_per_token + again


#: the attention core's share of the measured step's hardware FLOPs (0.276)
MEASURED_ATTENTION_SHARE = _attention_flops(_MEASURED_STEP, "selective") / (
    _MEASURED_STEP.hardware_per_token("selective")
)


def linear_factors(gpu: str, *, compiled: bool, float8: bool) -> float:
    """The factor on the time of everything but the attention core that torch.compile and
    float8 give on `gpu`: each published factor is a whole step's, measured with the
    attention core (a share a of the step's time) unchanged, so the rest ran (1 - a) /
    (1 / factor - a) times faster; float8's was measured on top of torch.compile, whose
    step had the attention core at a x compile's factor of its time."""
    a = MEASURED_ATTENTION_SHARE
    factor = 1.0
    if compiled:
        whole = compute_speedup(gpu, compiled=True)
        factor *= (1 - a) / (1 / whole - a)
        a *= whole  # the attention core's share of the compiled step's time
    if float8:
        whole = compute_speedup(gpu, float8=True)
        factor *= (1 - a) / (1 / whole - a)
    return factor


def step_time(
    shape: Shape, layout: Layout, hw: Cluster, *, efficiency: float, overlap: float = 1.0
) -> StepTime:
    """The modelled time of one optimizer step (see the module docstring)."""
    t, p, d, b, m = layout.tp, layout.pp, layout.dp, layout.micro_batch, layout.accum
    tokens = shape.seq_len * b * m * d  # one step, all replicas
    trains = shape.n_params
    if layout.trainable_params is not None:
        trains = min(layout.trainable_params, shape.n_params)
    count = FlopCount(shape.active_params, shape.layers, shape.hidden, shape.seq_len)
    model_flops, flops = count.step(tokens, layout.checkpointing, trains)  # estimate.flops
    peak = hw.gpu.peak_flops(layout.sixteen_bit, bf16=layout.bf16) or hw.gpu.peak_fp32_flops
    if layout.compiled or layout.float8:  # faster on all but the attention core
        linear = flops - _attention_flops(count, layout.checkpointing) * tokens
        factor = linear_factors(hw.gpu.name, compiled=layout.compiled, float8=layout.float8)
        flops_at_rate = linear / factor + (flops - linear)
        compute = flops_at_rate / (hw.gpus * peak * efficiency)
    else:
        compute = flops / (hw.gpus * peak * efficiency)
    v = layout.virtual_stages
    bubble = compute * bubble_fraction(layout.schedule, p, m, v) if p > 1 else 0.0

    # data parallel: this rank's slice of the model (after tp and pp), 16-bit weights
    shard = shape.n_params / (t * p)
    weights16 = layout.weight_bytes * shard  # gathered: every weight, frozen ones too
    updated = layout.weight_bytes * trains / (t * p)  # what the optimizer changes
    grads = layout.grad_bytes * trains / (t * p)  # only what trains is reduced
    fabric = hw.fabric
    c = layout.cp
    group = d * c  # the ranks that hold the same parameters: data- x context-parallel
    per_node = nccl.placement(t * p, group, hw.gpus_per_node)
    # HSDP: shard over `s` ranks inside a node, replicate over the group / s groups
    sg = layout.shard_group if layout.shard_group and layout.shard_group < group else group
    replicas = group // sg

    layers_here = shape.layers / p
    layer_calls = max(1, shape.layers // p)  # one collective a layer of this stage

    def dp(kind: str, size: float) -> float:
        # sharded engines gather and reduce a layer at a time; DDP and ZeRO-1/2 in buckets
        sharded = layout.engine in ("zero3", "full_shard", "shard_grad_op")
        calls = layer_calls if sharded else math.ceil(size / DDP_BUCKET_BYTES)
        return nccl.seconds(kind, size, sg, fabric, per_node=min(per_node, sg), calls=calls)

    per_micro = {
        "zero2": dp("reduce_scatter", grads),
        "zero3": 2 * dp("all_gather", weights16) + dp("reduce_scatter", grads),
        "full_shard": 2 * dp("all_gather", weights16) + dp("reduce_scatter", grads),
        "shard_grad_op": dp("all_gather", weights16) + dp("reduce_scatter", grads),
    }.get(layout.engine, 0.0)
    per_step = {
        "ddp": dp("all_reduce", grads),
        "zero1": dp("all_reduce", grads),
        "zero2": dp("all_gather", updated),
    }.get(layout.engine, 0.0)
    if replicas > 1:  # HSDP's replicas all-reduce their gradient shards once a step
        # one rank of each shard group a node apart: the group's ranks per node over s
        across = max(1, per_node // sg)
        per_step += nccl.seconds(
            "all_reduce", grads / sg, replicas, fabric, per_node=across, calls=layer_calls
        )
    dp_s = per_micro * m + per_step
    exposed = max(0.0, dp_s - overlap * compute)

    # tensor parallel: 4 all-reduces (6 with the recomputed forward) a layer a micro-batch
    e = 2 if layout.sixteen_bit else 4
    act = b * shape.seq_len // c * shape.hidden * e  # the rank's s / cp tokens
    reduces = 6 if layout.checkpointing == "full" else 4
    tp_one = nccl.seconds("all_reduce", act, t, fabric, per_node=min(t, hw.gpus_per_node))
    tp_s = m * layers_here * reduces * tp_one if t > 1 else 0.0
    # pipeline: activations forward and their gradients back, per micro-batch, this stage
    # (v times with v virtual stages a rank: each chunk boundary is a send)
    pp_s = 2 * m * v * act / t / hw.link(t * p) if p > 1 else 0.0

    offload = 0.0
    if layout.offload_optimizer:
        sharded = layout.engine in ("zero1", "zero2", "zero3")
        states = trains / (t * p) / (group if sharded else 1)
        node_share = hw.host_bandwidth / hw.gpus_per_node
        offload += (grads + updated) / group / hw.pcie
        offload += HOST_ADAM_BYTES * states / node_share
    if layout.offload_params:
        offload += m * 2 * weights16 / group / hw.pcie
    cp_s = 0.0
    if c > 1:
        rate = peak * efficiency  # the attention core: neither compile's nor float8's
        cp_s = m * layers_here * ring_seconds(shape, layout, hw, rate)
    return StepTime(
        compute=compute,
        bubble=bubble,
        data_parallel=dp_s,
        data_parallel_exposed=exposed,
        tensor_parallel=tp_s,
        pipeline=pp_s,
        offload=offload,
        model_flops=model_flops,
        peak_flops=peak,
        terms={
            "compute": compute,
            "pipeline bubble": bubble,
            "data-parallel communication (exposed)": exposed,
            "tensor-parallel communication": tp_s,
            "pipeline sends": pp_s,
            "offload traffic": offload,
            **({"context-parallel K/V exchange (exposed)": cp_s} if c > 1 else {}),
        },
        context_parallel=cp_s,
    )


def ring_seconds(shape: Shape, layout: Layout, hw: Cluster, rate: float) -> float:
    """The exposed seconds of one layer's ring attention exchange for one micro-batch
    (module docstring): the K/V all-gather in the forward (twice under full
    recomputation) and the backward, each less the rank's first block of attention, and
    the fp32 K/V gradients' ring less the other blocks' backward; `rate` the FLOP/s the
    compute runs at."""
    t, c, b = layout.tp, layout.cp, layout.micro_batch
    s = shape.seq_len
    g = shape.kv_width or shape.hidden
    e = 2 if layout.sixteen_bit else 4
    kv = 2 * b * s * g / t  # K and V of the whole sequence: elements on this rank
    ranks_per_node = nccl.placement(t, c, hw.gpus_per_node)  # cp ranks are tp apart
    gather = nccl.seconds("all_gather", e * kv, c, hw.fabric, per_node=ranks_per_node)
    grads = nccl.seconds("reduce_scatter", 4 * kv, c, hw.fabric, per_node=ranks_per_node)
    # the attention core's FLOPs (the FLOP count's 12 h s a token: 4 forward, 8 backward)
    forward = 4 * shape.hidden * s * (b * s / c) / t / rate
    backward = 2 * forward
    gathers = 2 if layout.checkpointing == "full" else 1  # the recomputed forward's too
    exposed = gathers * max(0.0, gather - forward / c)
    exposed += max(0.0, gather - backward / c) + max(0.0, grads - backward * (c - 1) / c)
    return exposed
