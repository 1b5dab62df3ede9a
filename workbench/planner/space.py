"""The pieces of the planner's search space that depend only on an engine: which offloads
it trains, which precisions are searched for it, and the bytes of a weight as gathered and
of a gradient as reduced (what the step time's collectives move)."""

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


__all__ = ["element_bytes", "offloads", "precisions"]
