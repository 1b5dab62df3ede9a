"""Which setup should I run? `plan(...)` ranks every setup that fits a model on a cluster by
predicted step time, and says why the first beats the next.

    from workbench.planner import plan
    result = plan(model="llama-3-8b", gpu="h100", gpus_per_node=8, seq_len=4096,
                  global_batch=256)
    result.plans[0].settings     # TrainConfig settings of the fastest plan that fits
    print(result.text())         # the ranked table, why the winner wins, what does not fit

The search space: the engine (DDP, ZeRO 1-3, FSDP full_shard / shard_grad_op, with and
without CPU offload of the optimizer, and of the parameters under ZeRO-3), tensor- and
pipeline-parallel sizes that divide the model and the GPUs, the micro-batch and the
accumulation that reach the global batch, activation recomputation (none, selective:
the attention core, or full), the attention kernel (sdpa; eager when pinned: it has the
same FLOPs in the step-time model and keeps the s x s scores, so it never ranks above
its sdpa twin, and is for a model without a fused kernel), AdamW (8-bit AdamW when
pinned, where its engine trains it), in the mixed 16-bit precision each engine trains
(bf16 where the GPU has it, else fp16; any other, pure bf16 among them, when pinned). Only setups a `TrainConfig` accepts
and its engine trains on that many ranks (`engine_problems`) are planned, so each plan can
be run and launched as it stands (and exported where the exporters carry its settings). Every memory figure
is the estimator's peak (`workbench.estimate.estimate_memory`); the time is
`workbench.planner.steptime` (docs/planner.md gives its formulas and sources); what it returns,
`Plan` and `PlanResult`, is `workbench.planner.result`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.engines import engine_problems
from workbench.estimate import DEFAULT_MFU, EstimateInputError, estimate_memory
from workbench.estimate.activations import attention_terms
from workbench.estimate.flops import FlopCount
from workbench.inputs import is_int, plain_number, shown
from workbench.planner.checks import GlobalTokensError
from workbench.planner.checks import checked_numbers as _checked_numbers
from workbench.planner.checks import counts as _counts
from workbench.planner.collectives import IB_DEFAULTS_NOTE, NCCL_IB_DEFAULTS_SHARE
from workbench.planner.efficiency import resolve as _efficiency_of
from workbench.planner.hardware import Cluster, cluster
from workbench.planner.keywords import (
    CLI_NAMES,
    MAX_GPUS,
    OUTPUT_FLAGS,
    SEARCHED,
    SHAPE_KEYS,
)
from workbench.planner.keywords import cli_keywords as _cli_keywords
from workbench.planner.keywords import nodes_of as _nodes_of
from workbench.planner.pins import check_pin, pin_text, read_pin
from workbench.planner.result import Plan, PlanResult
from workbench.planner.schedules import Pins, checked_pins, hsdp_engines, schedule_choices
from workbench.planner.space import context_parallel_sizes as _cp_sizes
from workbench.planner.space import element_bytes as _element_bytes
from workbench.planner.space import offloads as _offloads
from workbench.planner.space import plans_context_parallel as _plans_cp
from workbench.planner.space import precisions as _precisions
from workbench.planner.steptime import Layout, Shape, step_time
from workbench.prediction import estimator_inputs

_GIB = 1 << 30
#: the largest global batch planned, in samples (Llama 3 405B's 16M tokens are 2048)
MAX_GLOBAL_BATCH = 1 << 24

#: engine -> (TrainConfig settings, the estimator's, ZeRO stage for the offload rule)
ENGINES: dict[str, dict[str, Any]] = {
    "ddp": {},
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "zero3": {"zero_stage": 3},
    "full_shard": {"fsdp": "full_shard"},
    "shard_grad_op": {"fsdp": "shard_grad_op"},
}


def _divisors(n: int, limit: int) -> list[int]:
    """The divisors of `n` up to `limit`, ascending (found up to sqrt(n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    every = sorted({*small, *(n // d for d in small)})
    return [d for d in every if d <= limit]


def _powers_dividing(n: int, limit: int) -> list[int]:
    out, p = [], 1
    while p <= min(n, limit):
        if n % p == 0:
            out.append(p)
        p *= 2
    return out


def plan(
    *,
    model: Any = None,
    hf_config: Any = None,
    n_params: int | float | str | None = None,
    gpu: str = "h100",
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    seq_len: int | None = None,
    global_batch: int = 256,
    tokens: float | None = None,
    price_per_gpu_hour: float | None = None,
    efficiency: float | None = None,
    intra_node_gbps: float | None = None,
    inter_node_gbps: float | None = None,
    engines: tuple[str, ...] | None = None,
    offload: bool = True,
    precision: str | None = None,
    optimizer: str = "adamw",
    lora_rank: int = 0,
    headroom: float = 0.0,
    global_tokens: int | None = None,
    max_micro_batch: int = 64,
    attention: str | None = None,
    pp_schedule: str = "1f1b",
    virtual_stages: int | None = None,
    compile: bool = False,
    float8: bool = False,
    hsdp: bool = False,
    mfu: float | None = None,
    calibrate: Any = None,
    nccl_tests: Any = None,
    nccl_ib_defaults: bool = False,
    pin: dict[str, Any] | str | None = None,
    **shape: Any,
) -> PlanResult:
    """Every trainable setup of the model on `nodes` x `gpus_per_node` GPUs of type `gpu`
    at `global_batch` samples of `seq_len` tokens, ranked (see the module docstring).
    The model is given as `workbench estimate` takes it (a preset or module in `model`, a
    config.json in `hf_config`, or `n_params` with `layers`, `hidden`, `heads`, ...).
    `engines` pins the engines searched (names of `ENGINES`), `offload=False` leaves
    offload out, `precision` pins one precision (else each engine's mixed 16-bit one;
    pure bf16 only when pinned: it drops the fp32 master weights), `optimizer` the
    optimizer ("adamw", or "adam8bit" where its engine trains it: 8-bit moments change
    the numerics too, so they are planned when asked for), `lora_rank` > 0 plans a LoRA fine-tune of that rank,
    `headroom` keeps that fraction of each GPU's memory free, `global_tokens` gives the
    global batch in tokens instead (a whole number of sequences), `attention` pins the
    kernel ("sdpa", searched by default, or "eager" for a model without a fused one).
    The compute runs at an efficiency (the share of the peak the GPUs sustain on the FLOPs
    they run, `workbench.planner.efficiency`): `mfu` (or its older name `efficiency`) gives
    it, `calibrate` measures it from a step of this model on your GPU (a Session, an
    observer, their step records or a run's log.jsonl), else the median of published runs
    on the GPU. `nccl_tests` (a path, or a list of them) scales the network to what your
    cluster's nccl-tests measured (`workbench.planner.nccl_tests`); `nccl_ib_defaults=True`
    says your jobs run NCCL's default InfiniBand settings (no NCCL_IB_QPS_PER_CONNECTION=2,
    NCCL_IB_AR_THRESHOLD=0, ...): collectives across nodes at
    `collectives.NCCL_IB_DEFAULTS_SHARE` of NCCL's channel rates, as one cluster's rings
    measured without them (pipeline sends keep their rate). `pin` plans only the pinned layout (`workbench.planner.pins.PINNABLE`: tp,
    pp, cp, dp, engine, micro_batch, checkpointing), e.g. {"tp": 8, "pp": 16, "dp": 8}.
    Context parallelism (cp: each sequence split over cp GPUs, torch's ring attention as
    torchtitan runs it) is searched from `space.CP_MIN_SEQ` tokens and planned wherever
    pinned; "cp N" on the label.
    `gpus` is the GPUs in all, as `workbench plan --gpus` takes it (nodes of
    `gpus_per_node`, 8 by default or `gpus` when fewer; one node without it); the CLI's
    other names are taken too (`params`, `price`, `no_offload`). Planner-only choices
    (workbench.planner.schedules, shown on each plan's label): `pp_schedule` ("1f1b",
    "gpipe", "interleaved-1f1b", "zero-bubble", or "search" for each that runs) with
    `virtual_stages` a rank, `compile` (torch.compile: the Session trains it without tp
    or pp; a tp or pp layout is planned compiled as torchtitan runs it, on the label),
    `float8` and `hsdp` (FSDP sharded inside a node, replicated across). ValueError naming the
    field for bad input (a keyword plan() does not take among them), and when no setup
    fits (which term breaks the best one and by how much)."""
    given: dict[str, Any] = {
        name: value
        for name, value in locals().items()
        if name not in ("shape", "gpus", "gpus_per_node", "nodes")
    }
    price_name = "price" if "price" in shape else "price_per_gpu_hour"  # as the caller named it
    caller_names = {"n_params": "params"} if "params" in shape else {}  # the same for params=
    _cli_keywords(shape, given)
    n_params, price_per_gpu_hour, offload = (
        given["n_params"],
        given["price_per_gpu_hour"],
        given["offload"],
    )
    gpus_per_node, nodes = _nodes_of(gpus, gpus_per_node, nodes)
    if isinstance(engines, str):  # as the command takes them: "zero3,full_shard"
        engines = tuple(e.strip() for e in engines.split(",") if e.strip())
    if isinstance(engines, (list, tuple)):  # each once ("zero3,zero3" plans zero3)
        engines = tuple(dict.fromkeys(engines))
    tokens, global_tokens = _counts(tokens, global_tokens)
    if efficiency is not None and mfu is not None:
        raise ValueError(f"mfu={shown(mfu)}: give it or efficiency= (its older name), not both")
    given_rate = mfu if mfu is not None else efficiency
    rate_name = "mfu" if mfu is not None else "efficiency"
    if given_rate is not None and calibrate is not None:
        raise ValueError(
            f"calibrate={shown(calibrate)}: give it or {rate_name}= (the efficiency either "
            "measured or given), not both"
        )
    tokens, price_per_gpu_hour, rate = _checked_numbers(
        tokens, price_per_gpu_hour, DEFAULT_MFU if given_rate is None else given_rate, headroom,
        rate_name=rate_name, price_name=price_name,
    )  # fmt: skip
    pins = checked_pins(pp_schedule, virtual_stages, compile, float8, hsdp)
    hw = cluster(
        gpu,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        intra_node_gbps=intra_node_gbps,
        inter_node_gbps=inter_node_gbps,
    )
    if not isinstance(nccl_ib_defaults, bool):
        raise ValueError(f"nccl_ib_defaults={shown(nccl_ib_defaults)}: must be True or False")
    if nccl_ib_defaults and nccl_tests is not None:
        raise ValueError(
            "nccl_ib_defaults=True: give it or nccl_tests= (your nccl-tests measured the "
            "network with whatever NCCL settings they ran), not both"
        )
    if nccl_tests is not None:  # your fabric as it measured, on the plan and its label
        from workbench.planner.nccl_tests import calibrate_network

        network = calibrate_network(nccl_tests, hw)
        hw = replace(hw, network_factor=network.factor, network_source=network.note())
    elif nccl_ib_defaults and hw.nodes > 1:
        hw = replace(
            hw,
            network_factor=NCCL_IB_DEFAULTS_SHARE,
            network_source=IB_DEFAULTS_NOTE,
            sends_at_share=False,
        )
    G = hw.gpus
    if G > MAX_GPUS:
        raise ValueError(
            f"nodes={nodes}: {nodes} x {gpus_per_node} = {G:,} GPUs; the planner plans at most "
            f"{MAX_GPUS:,}"
        )
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or not 0 <= lora_rank <= 4096:
        raise ValueError(f"lora_rank={shown(lora_rank)}: must be an integer from 0 to 4096")
    from workbench.choices import Precision

    if precision is not None and precision not in {p.value for p in Precision}:
        allowed = ", ".join(p.value for p in Precision)
        raise ValueError(f"precision={shown(precision)}: must be one of {allowed}")
    if attention is not None and attention not in ("sdpa", "eager"):
        raise ValueError(f"attention={shown(attention)}: must be one of sdpa, eager")
    optimizer = "adam8bit" if optimizer == "adamw8bit" else optimizer  # TrainConfig's alias
    if optimizer not in ("adamw", "adam8bit"):
        raise ValueError(
            f"optimizer={shown(optimizer)}: must be one of adamw, adam8bit (or adamw8bit)"
        )
    if (
        isinstance(global_batch, bool)
        or not isinstance(global_batch, int)
        or not 1 <= global_batch <= MAX_GLOBAL_BATCH
    ):
        raise ValueError(
            f"global_batch={shown(global_batch)}: must be an integer from 1 to "
            f"{MAX_GLOBAL_BATCH:,} (samples)"
        )
    chosen = tuple(ENGINES) if engines is None else tuple(engines)
    if not chosen:
        raise ValueError(
            f"engines={shown(list(chosen))}: give at least one of {', '.join(ENGINES)} "
            "(or leave it out: every one)"
        )
    bad = [e for e in chosen if e not in ENGINES]
    if bad or not chosen:
        raise ValueError(f"engines={shown(list(chosen))}: each must be one of {', '.join(ENGINES)}")
    pinned = read_pin(pin, tuple(ENGINES))
    if "engine" in pinned:
        chosen = (pinned["engine"],)
    if pins.hsdp:  # only HSDP layouts are planned
        chosen = hsdp_engines(chosen, hw.nodes)
    base: dict[str, Any] = {"model": model, "hf_config": hf_config, "n_params": n_params}
    base.update(shape)
    if seq_len is not None:
        base["seq_len"] = seq_len
    try:
        probe = estimate_memory(**base, gpu=hw.gpu.name, gpus=1)
    except EstimateInputError as exc:  # each named as the caller named it (params=)
        said = [pr.render(lambda f: caller_names.get(f, f)) for pr in exc.problems]
        if len(said) == 1:
            raise ValueError(f"invalid estimate input: {said[0]}") from exc
        listed = "".join(f"\n  - {text}" for text in said)
        raise ValueError(f"{len(said)} invalid estimate inputs:{listed}") from exc
    if probe.layers is None or probe.hidden is None or probe.heads is None:
        raise ValueError(
            "model: the planner needs the model's shape (layers, hidden, heads): give a "
            "preset or a module (model=), a config.json (hf_config=), or layers=, hidden=, "
            "heads= with n_params="
        )
    if probe.seq_len is None:
        raise ValueError("seq_len: the planner needs the tokens a sample (--seq-len)")
    seq = int(probe.seq_len)
    if global_tokens is not None:
        ok = is_int(global_tokens)  # a NumPy or torch integer is the int it holds
        global_tokens = plain_number(global_tokens)
        if not ok or global_tokens < seq or global_tokens % seq:
            q = global_tokens / seq if ok else 1.0
            near = dict.fromkeys(max(1, n) for n in (math.floor(q), math.ceil(q)))
            nearest = " or ".join(f"{n * seq:,} ({n})" for n in near)
            counted = f"{global_tokens:,} tokens is {q:,.1f} sequences of {seq}: " if ok else ""
            raise GlobalTokensError(
                global_tokens,
                seq,
                f"{counted}must be a whole number of {seq}-token sequences (a multiple of "
                f"seq_len={seq}): use {nearest}",
            )
        global_batch = global_tokens // seq
    dims = {"heads": probe.heads, "hidden": probe.hidden, "ffn_hidden": probe.ffn_hidden}
    if probe.kv_heads:
        dims["kv_heads"] = probe.kv_heads
    count = probe.flop_count  # the one FLOP count (workbench.estimate.flops)
    assert count is not None
    sh = Shape(
        n_params=int(probe.n_params),
        active_params=count.matmul_params,  # what a token multiplies: no embedding lookup
        layers=int(probe.layers),
        hidden=int(probe.hidden),
        seq_len=seq,
        kv_width=int(probe.hidden) * int(probe.kv_heads or probe.heads) // int(probe.heads),
    )
    if pinned:
        check_pin(
            pinned,
            gpus=G,
            gpus_per_node=hw.gpus_per_node,
            layers=int(probe.layers),
            global_batch=global_batch,
            dims={**dims, "kv_heads": probe.kv_heads},
            seq_len=seq,
            engines=chosen,
        )
    eff = _efficiency_of(given_rate, rate, rate_name, calibrate, count, hw, precision)
    efficiency = eff.value
    bf16 = hw.gpu.peak_bf16_flops is not None
    if precision in ("bf16", "amp-bf16", "bf16-true") and not bf16:
        raise ValueError(
            f"precision={shown(precision)}: {hw.gpu.name} has no bf16; use fp16, amp-fp16 or fp32"
        )
    fits: list[Plan] = []
    unfit: list[Plan] = []
    searched = 0
    layouts_possible = 0
    refused: list[str] = []  # why a pinned schedule cannot run a layout
    #: settings already checked against the Session, with the problem (None: it trains):
    #: the context-parallel degrees repeat the same settings
    session_checked: dict[tuple[tuple[str, Any], ...], str | None] = {}
    first_problem: str | None = None
    tps = [pinned["tp"]] if "tp" in pinned else _powers_dividing(hw.gpus_per_node, 64)
    for tp in tps:  # a group inside one node (NVLink)
        if any(v and v % tp for v in dims.values()):
            continue
        pps = [pinned["pp"]] if "pp" in pinned else _divisors(G // tp, int(probe.layers))
        # context parallelism: the sequence split over cp of the ranks tp x pp leave
        cps = ((pp, cp) for pp in pps for cp in _cp_sizes(pinned.get("cp"), G // tp // pp, seq))
        for pp, cp in cps:
            if int(probe.layers) % pp or (G // tp) % (pp * cp):  # whole layers, each the same
                continue
            dp = G // (tp * pp * cp)
            if global_batch % dp or pinned.get("dp", dp) != dp:
                continue
            layouts_possible += 1
            per_replica = global_batch // dp
            for engine in chosen:
                if cp > 1 and not _plans_cp(engine, pp, "cp" in pinned):  # over dp x cp
                    continue
                mbs = _powers_dividing(per_replica, max_micro_batch)
                choices = itertools.product(
                    _offloads(engine, offload),
                    (pinned["checkpointing"],)
                    if "checkpointing" in pinned
                    else ("none", "selective", "full"),  # activation recomputation
                    (optimizer,),
                    _precisions(engine, bf16, precision),
                    [pinned["micro_batch"]] if "micro_batch" in pinned else mbs,
                )
                for (off_opt, off_par), ckpt, opt, prec, mb in choices:
                    settings = _settings(
                        engine, prec, tp, pp, mb, per_replica // mb, ckpt, opt, off_opt, off_par
                    )
                    if attention is not None:
                        settings["attention"] = attention
                    if lora_rank:
                        settings["lora_rank"] = lora_rank
                    if pins.compile and tp == pp == 1:  # else torchtitan's: on the label
                        settings["compile"] = True
                    key = tuple(settings.items())
                    if key in session_checked:  # the same settings at another cp degree
                        problem = session_checked[key]
                    else:
                        try:  # a setup the Session trains on G ranks, as it is
                            problems = engine_problems(TrainConfig(**settings), G)
                            problem = str(problems[0]) if problems else None
                        except ConfigError as exc:  # its first problem, on one line
                            problem = str(exc.problems[0]) if exc.problems else str(exc)
                        session_checked[key] = problem
                    if problem is not None:
                        first_problem = first_problem or problem
                        continue
                    runs, why = schedule_choices(pins, pp, sh.layers, per_replica // mb)
                    refused += [w for w in why if w not in refused]
                    for schedule in runs:
                        layout = (engine, tp, pp, dp)
                        got = _one(sh, settings, layout, hw, base, efficiency, headroom,
                                   pins=pins, schedule=schedule, cp=cp)  # fmt: skip
                        if got is None:
                            continue
                        searched += 1
                        (fits if got.fits else unfit).append(got)
    if layouts_possible == 0 and pinned:
        raise ValueError(
            f"pin={pin_text(pinned)}: no layout of the {G} GPUs has it at global_batch="
            f"{global_batch}: dp = {G} / (tp x pp{' x cp' if 'cp' in pinned else ''}) must "
            "divide the global batch"
        )
    if pinned and searched == 0 and first_problem is not None:
        raise ValueError(f"pin={pin_text(pinned)}: the Session does not train it: {first_problem}")
    if layouts_possible == 0:
        raise ValueError(
            f"global_batch={global_batch}: no layout of the {G} GPUs divides it: dp = "
            f"{G} / (tp x pp) must divide the global batch, with tp a power of two that "
            f"divides the heads and widths and pp a divisor of layers={probe.layers}; a "
            f"multiple of {G} (e.g. {G} or {2 * G}) always works"
        )
    if pins.hsdp and searched == 0:
        raise ValueError(
            f"hsdp=True: no layout of the {G} GPUs shards inside a node at global_batch="
            f"{global_batch}: HSDP needs tp x pp (x cp) to divide the {hw.gpus_per_node} GPUs "
            "of a node, and dp to divide the global batch"
        )
    fits.sort(key=_rank_key)
    unfit.sort(key=_rank_key)
    piped = any(p.pp > 1 for p in fits + unfit)
    if refused and pins.pp_schedule in ("interleaved-1f1b", "zero-bubble") and not piped:
        raise ValueError(f"pp_schedule={shown(pp_schedule)}: no layout can run it: {refused[0]}")
    if not fits:
        least = min(unfit, key=lambda p: p.required_bytes) if unfit else None
        if least is None:
            raise ValueError("model: no trainable setup was found for it on these GPUs")
        term, size = max(least.peak_terms.items(), key=lambda kv: kv[1])
        usable = hw.gpu.memory_bytes * (1 - headroom)
        over = least.required_bytes - usable
        kept = f", {headroom:.0%} kept free" if headroom else ""
        raise ValueError(
            f"model: none of the {searched} setups planned (engine, layout, micro-batch, "
            f"recomputation) fits {G} x {hw.gpu.name} "
            f"({usable / _GIB:.1f} GiB each{kept}); the smallest, {least.label()}, needs "
            f"{least.required_bytes / _GIB:.1f} GiB, {over / _GIB:.1f} GiB over, its largest "
            f"term {term} {size / _GIB:.1f} GiB: more GPUs (nodes=), a larger GPU, or LoRA"
        )
    faster_unfit = [p for p in unfit if p.step_seconds < fits[0].step_seconds]
    notes = [f"pp_schedule={pp_schedule}: not run where {refused[0]}"] if refused else []
    notes += [
        f"Step time: compute at {efficiency:.0%} of the peak FLOP/s ({eff.source}), "
        "collectives over the bandwidths above, data-parallel ones hidden behind compute "
        "(docs/planner.md). MFU counts the model's FLOPs (6 N + 12 L q s a token, no "
        "embedding lookup), HFU the recomputed forward too."
    ]
    return PlanResult(
        plans=fits,
        unfit=faster_unfit,
        cluster=hw,
        global_batch=global_batch,
        seq_len=seq,
        searched=searched,
        notes=notes,
        tokens=tokens,
        price_per_gpu_hour=price_per_gpu_hour,
        headroom=float(headroom),
        efficiency=efficiency,
        efficiency_source=eff.source,
        model_shape={
            "hidden": probe.hidden,
            "heads": probe.heads,
            "mlp": probe.mlp,
            "kv_heads": probe.kv_heads or probe.heads,
            "ffn_hidden": probe.ffn_hidden or 4 * probe.hidden,
        },
    )


def _rank_key(p: Plan) -> tuple[float, float, int]:
    """Fastest first; at the same predicted time (communication hidden behind compute)
    the one that communicates less, then the one that needs less memory."""
    return (round(p.step_seconds, 9), round(p.time.data_parallel, 9), p.required_bytes)


def _settings(
    engine: str,
    precision: str,
    tp: int,
    pp: int,
    mb: int,
    accum: int,
    ckpt: str,
    opt: str,
    off_opt: bool,
    off_par: bool,
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "precision": precision,
        "optimizer": opt,
        "micro_batch": mb,
        "grad_accum": accum,
        "activation_checkpointing": ckpt,
        **ENGINES[engine],
    }
    if tp > 1:
        settings["tp"] = tp
    if pp > 1:
        settings["pp"] = pp
    if off_opt:
        settings["offload_optimizer"] = "cpu"
    if off_par:
        settings["offload_params"] = "cpu"
    return settings


def _one(
    sh: Shape,
    settings: dict[str, Any],
    layout_of: tuple[str, int, int, int],
    hw: Cluster,
    base: dict[str, Any],
    efficiency: float,
    headroom: float = 0.0,
    *,
    pins: Pins | None = None,
    schedule: tuple[str, int] = ("1f1b", 1),
    cp: int = 1,
) -> Plan | None:
    """The plan of these settings on (engine, tp, pp, dp) with the sequence split over `cp`
    GPUs (context parallelism), None where the estimator refuses the layout."""
    engine, tp, pp, dp = layout_of
    s = settings
    lora = bool(s.get("lora_rank"))
    inputs = estimator_inputs(s, hw.gpus)  # the settings as the estimator reads them
    inputs.update(
        base,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        context_parallel=cp,
        attention=attention_terms(s.get("attention", "sdpa")),
        gpu=hw.gpu.name,
    )
    pins = pins or Pins()
    shard_group, extras = None, []
    if schedule[0] != "1f1b" and pp > 1:
        extras.append(f"{schedule[0]} v{schedule[1]}" if schedule[1] > 1 else schedule[0])
    compiled = pins.compile  # the Session compiles tp = pp = 1; the others are extras
    if compiled and not s.get("compile"):
        extras.append("compile")
    if pins.float8:
        extras.append("float8")
    if cp > 1:  # torch's context parallelism, as torchtitan trains it
        extras.append(f"cp {cp}")
    fsdp_hsdp = pins.hsdp and engine in ("full_shard", "shard_grad_op") and hw.nodes > 1
    inside = hw.gpus_per_node // (tp * pp)  # FSDP's group (dp x cp) inside a node
    if fsdp_hsdp and 1 <= inside < dp * cp and inside % cp == 0:  # shard inside a node
        shard_group = hw.gpus_per_node // (tp * pp)
        inputs["gpus"] = shard_group * tp * pp  # the memory of FSDP over the shard group
        extras.append(f"hsdp {shard_group}")
    elif pins.hsdp:  # pinned: only layouts that shard inside a node and replicate across
        return None
    try:
        est = estimate_memory(**inputs)
    except EstimateInputError:
        return None
    weight_bytes, grad_bytes = _element_bytes(engine, s["precision"])
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch=s["micro_batch"],
        accum=s["grad_accum"],
        engine=engine,
        checkpointing=s["activation_checkpointing"],
        sixteen_bit=s["precision"] != "fp32",
        bf16=s["precision"] in ("bf16", "amp-bf16", "bf16-true"),
        grad_bytes=grad_bytes,
        weight_bytes=weight_bytes,
        offload_optimizer="offload_optimizer" in s,
        offload_params="offload_params" in s,
        trainable_params=int(est.lora_params) if lora and est.lora_params else None,
        schedule=schedule[0] if pp > 1 else "1f1b",
        virtual_stages=schedule[1] if pp > 1 else 1,
        shard_group=shard_group,
        compiled=compiled or bool(s.get("compile")),
        float8=pins.float8,
        cp=cp,
    )
    t = step_time(sh, layout, hw, efficiency=efficiency)
    tokens = sh.seq_len * s["micro_batch"] * s["grad_accum"] * dp
    mfu = t.model_flops / (t.step_seconds * hw.gpus * t.peak_flops)  # the peak it ran at
    trained = int(est.lora_params) if lora and est.lora_params else None
    count = FlopCount(sh.active_params, sh.layers, sh.hidden, sh.seq_len)
    hardware = count.step(tokens, layout.checkpointing, trained)[1]
    hfu = hardware / (t.step_seconds * hw.gpus * t.peak_flops)
    return Plan(
        settings=settings,
        engine=engine,
        tp=tp,
        pp=pp,
        dp=dp,
        peak_bytes=int(est.peak_bytes),
        required_bytes=int(est.required_bytes),
        fits=bool(est.fits) and est.required_bytes <= hw.gpu.memory_bytes * (1 - headroom),
        time=t,
        tokens_per_step=tokens,
        peak_terms={k: int(v) for k, v in est.peak_terms.items()},
        mfu=mfu if math.isfinite(mfu) else 0.0,
        extras=tuple(extras),
        hfu=hfu if math.isfinite(hfu) else 0.0,
        cp=cp,
    )


__all__ = [
    "CLI_NAMES",
    "ENGINES",
    "OUTPUT_FLAGS",
    "SEARCHED",
    "SHAPE_KEYS",
    "Plan",
    "PlanResult",
    "plan",
]
