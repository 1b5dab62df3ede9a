"""The pieces of the planner's search space that depend only on an engine: which offloads
it trains, which precisions are searched for it, and the bytes of a weight as gathered and
of a gradient as reduced (what the step time's collectives move); and the context-parallel
sizes searched for a sequence (`context_parallel_sizes`)."""

from __future__ import annotations


def offloads(engine: str, allowed: bool) -> list[tuple[bool, bool]]:
    if not allowed:
        return [(False, False)]
    if engine in ("zero2", "zero1"):
        return [(False, False), (True, False)]
    if engine == "zero3":
        return [(False, False), (True, False), (True, True)]
    return [(False, False)]


def element_bytes(engine: str, precision: str) -> tuple[int, int]:
    """(bytes of a weight as gathered, of a gradient as reduced) on `engine` in
    `precision`: DeepSpeed's 16-bit holds 16-bit weights and reduces 16-bit gradients;
    under torch's autocast DeepSpeed holds fp32 weights, FSDP2 gathers 16-bit copies
    (its MixedPrecisionPolicy) and reduces in fp32, as it does for pure bf16 by default
    (`fsdp_reduce_fp32`); fp32 is 4 and 4."""
    if precision in ("bf16", "fp16"):
        return 2, 2
    if precision == "fp32":
        return 4, 4
    fsdp = engine in ("full_shard", "shard_grad_op")
    if precision == "bf16-true":
        return 2, 4 if fsdp else 2
    return (2 if fsdp else 4), 4  # amp-bf16, amp-fp16


def precisions(engine: str, bf16: bool, pinned: str | None) -> tuple[str, ...]:
    """The precisions searched for `engine`: the pinned one, else its mixed 16-bit one
    (bf16 where the GPU has it) with fp32 master weights. Pure bf16 (no fp32 copy: a
    change to the numerics, not only to speed and memory) is planned when pinned."""
    if pinned is not None:
        return (pinned,)
    if engine.startswith("zero"):  # DeepSpeed's own 16-bit
        return ("bf16",) if bf16 else ("fp16",)
    if engine == "ddp" and not bf16:  # on several ranks DeepSpeed runs DDP: its own fp16
        return ("amp-fp16", "fp16")
    return ("amp-bf16",) if bf16 else ("amp-fp16",)


#: the shortest sequence the search splits with context parallelism: below it tensor
#: parallelism and FSDP hold a sequence's activations on the GPUs a node has (torchtitan's
#: and Llama 3's context-parallel runs train 32K to 128K-token sequences); pinned, a `cp`
#: is planned at any length it can split
CP_MIN_SEQ = 16384
#: the engines context parallelism is planned with, each reducing gradients over the data-
#: and context-parallel ranks together: torchtitan's FSDP (sharded over its `dp_shard_cp`
#: mesh), and Megatron-LM's DDP and distributed optimizer (ZeRO-1), whose data-parallel
#: group with `--context-parallel-size` is dp x cp; DeepSpeed's ZeRO-2/3 run Ulysses
#: sequence parallelism instead, not this
CP_ENGINES = ("ddp", "zero1", "full_shard", "shard_grad_op")
#: the largest context-parallel size searched (Llama 3 405B's long-context stage used 16)
CP_MAX = 64
#: the fewest tokens a rank holds in a searched context-parallel layout (Llama 3 405B's
#: 131,072 over cp 16: 8,192; torchtitan's runs 32,768): below it the exchange has less
#: attention to hide behind and the search grows for layouts no published run uses
CP_MIN_SHARE = 8192


def plans_context_parallel(engine: str, pp: int, pinned: bool) -> bool:
    """Whether `engine` is planned with a context-parallel size above 1 on `pp` stages: a
    pinned cp with any of `CP_ENGINES`; searched, as the published runs ran it: FSDP
    without a pipeline (torchtitan), DDP with one (Megatron-LM, Llama 3)."""
    if engine not in CP_ENGINES:
        return False
    return pinned or (engine == "ddp" if pp > 1 else engine in ("full_shard", "shard_grad_op"))


def context_parallel_sizes(pinned: int | None, ranks: int, seq_len: int) -> list[int]:
    """The context-parallel sizes planned over `ranks` GPUs (those left by tp x pp) for
    sequences of `seq_len` tokens: the pinned one, else 1 and, from `CP_MIN_SEQ` tokens,
    each power of two up to `CP_MAX` that divides the ranks, splits the sequence into
    2 x cp equal chunks (torch's load balancer) and leaves a rank `CP_MIN_SHARE` tokens."""
    if pinned is not None:
        return [pinned]
    sizes = [1]
    c = 2
    while seq_len >= CP_MIN_SEQ and c <= min(ranks, CP_MAX, seq_len // CP_MIN_SHARE):
        if ranks % c == 0 and seq_len % (2 * c) == 0:
            sizes.append(c)
        c *= 2
    return sizes


__all__ = [
    "CP_ENGINES",
    "CP_MAX",
    "CP_MIN_SEQ",
    "CP_MIN_SHARE",
    "context_parallel_sizes",
    "plans_context_parallel",
    "element_bytes",
    "offloads",
    "precisions",
]
