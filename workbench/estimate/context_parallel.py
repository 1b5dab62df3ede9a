"""Context parallelism's memory on one GPU: torch's `context_parallel` as torchtitan runs it.

Context parallelism (`context_parallel` = c > 1) splits every sequence over c GPUs. torch
2.13's `torch.distributed.tensor.experimental.context_parallel` shards the input, the labels
and the position buffers along the sequence with its load balancer (each rank holds two
chunks of s / 2c tokens, one from the head and one from the tail, so that every rank does
the same share of the causal attention: the sequence must split into 2c equal chunks), and
replaces the scaled-dot-product attention kernels (flash, memory-efficient, cuDNN) by ring
attention, `_templated_ring_attention`. What one GPU holds:

* **Activations**: every tensor a layer keeps for backward is per token, so a rank keeps
  those of s / c tokens: the activations of the same model at `seq_len / c`
  (`rank_view`). The ring attention's forward keeps what the sdpa kernel keeps (the local
  query, keys, values and output, and the softmax statistics (logsumexp) of the local
  queries, merged over the chunks in fp32 and cast back), so nothing is added at rest.
* **The K/V exchange** (`exchange_bytes`, the peak's "context-parallel K/V exchange" term,
  held while a layer's attention runs its backward, beside that layer's backward
  transient): the default rotate method (`_RotateMethod.ALL_GATHER`) all-gathers the
  keys and values of the whole sequence once per attention call, in the compute dtype:
  2·e·b·s·g/t (g = kv_heads x head size, split over tensor-parallel t; s the whole
  sequence). The backward gathers them again and accumulates the gradients in fp32
  (`convert_to_f32`): the query's (4·b·(s/c)·q/t) and the keys' and values' of the chunk
  passed round the ring (torch rotates them with `permute_tensor`, the received buffer
  and the one sent both fp32: 2 x 4·b·(s/c)·2g/t). The forward's moment (the same gathered
  keys and values, the fp32 output and logsumexp being merged) is smaller and comes with
  fewer gradients held, so the backward's is the one counted.
* **Model states**: the c ranks of a sequence hold the same parameters and sum their
  gradients, so the engine's data-parallel group is data-parallel x context-parallel:
  torchtitan shards FSDP over `dp_shard x cp` (its `dp_shard_cp` mesh). Parameters,
  gradients and optimizer states are divided by dp x c under FSDP's full_shard and
  ZeRO-3; ZeRO-1/2 shard the optimizer states (and ZeRO-2 the gradients) over dp x c the
  same way, and plain DDP replicates all three over the c ranks as over the dp ranks
  (the estimate's `data_parallel` is that group: `gpus / (tp x pp)`).

What torch 2.13 cannot run is refused (`problems`): c must divide the GPUs with tp and
pp; the sequence must split into 2c chunks (c for an encoder, whose non-causal attention
runs without load balancing); attention must be sdpa (ring attention replaces the fused
sdpa kernels only; the unfused "eager" path would attend within each rank's chunk); packed
documents' mask (`document_mask`) is an attention bias, which the ring kernels refuse
("attn_bias is not supported yet"; torchtitan runs document masks under context
parallelism with flex attention, not modelled here). Pipeline and tensor parallelism
combine with it (torchtitan's 4-D layouts).

Pure: imports no torch. docs/estimator.md ("Context parallelism") gives the formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workbench.estimate.activations import Attention
from workbench.estimate.architecture import Architecture
from workbench.estimate.problems import Problem

#: The peak's term of the ring attention's buffers (`exchange_bytes`).
CP_TERM = "context-parallel K/V exchange"


def rank_view(arch: Architecture, cp: int) -> Architecture:
    """`arch` as one of `cp` context-parallel ranks sees it: its `seq_len` is the rank's
    share of the sequence, s / cp (the parameters do not change: a learned position
    table keeps its `max_positions`)."""
    if cp == 1:
        return arch
    return replace(arch, seq_len=arch.seq_len // cp)


def exchange_bytes(
    arch: Architecture, micro_batch: int, cp: int, tensor_parallel: int, element_bytes: int
) -> int:
    """The bytes a layer's ring attention holds in its backward beyond the sdpa kernel's
    own gradients (module docstring): the gathered keys and values of the whole sequence
    (compute dtype), the query's fp32 gradient accumulator and the two fp32 K/V gradient
    buffers of the ring. `arch` is the rank's view (`rank_view`: `seq_len` = s / cp)."""
    if cp == 1:
        return 0
    t, b, local = tensor_parallel, micro_batch, arch.seq_len
    g = -(-arch.kv_dim // t)
    q = -(-arch.q_dim // t)
    gathered = 2 * element_bytes * b * local * cp * g
    query_grad = 4 * b * local * q
    ring = 2 * 4 * b * local * 2 * g
    return gathered + query_grad + ring


def ring_term(i: Any, transient_of: Callable[..., int], transient: int) -> dict[str, int]:
    """The peak's `CP_TERM` of checked inputs `i` (`EstimateInputs`, `context_parallel` >
    1): the ring's buffers (`exchange_bytes`) held in a layer's attention backward, beyond
    the backward transient `transient` (`transient_of(i, extra)`: the peak's
    `backward_transient` with `extra` held beside the attention's gradients; where the
    MLP's backward needs more, the ring's buffers, freed before it, add only the rest)."""
    arch = i.architecture
    if arch is None:
        return {}
    e = 4 if i.precision.value == "fp32" else 2  # the compute dtype (`peak.compute_bytes`)
    ring = exchange_bytes(arch, i.micro_batch, i.context_parallel, i.tensor_parallel, e)
    return {CP_TERM: transient_of(i, ring) - transient}


def problems(
    cp: int,
    arch: Architecture | None,
    n_gpus: int | None,
    gpus: object,
    tp: int | None,
    pp: int | None,
    attention: object,
    document_mask: object,
) -> list[Problem]:
    """What torch's context parallelism cannot run with `cp` > 1 (module docstring)."""
    out: list[Problem] = []
    if arch is None:
        out.append(
            Problem(
                "context_parallel",
                cp,
                "needs a transformer shape (a `model` or `layers`, `hidden`, `heads`, "
                "`seq_len`, `vocab`) to split the sequence",
                needs_model=True,
            )
        )
    else:
        chunks = 2 * cp if arch.causal else cp
        if arch.seq_len % chunks:
            why = (
                f"the load balancer splits each sequence into 2 x {cp} chunks of equal length"
                if arch.causal
                else f"each of the {cp} ranks holds an equal share of the sequence"
            )
            out.append(
                Problem(
                    "context_parallel",
                    cp,
                    f"needs `seq_len` ({arch.seq_len}) to be a multiple of {chunks}: {why}",
                )
            )
    if n_gpus is not None and tp is not None and pp is not None:
        whole = tp * pp * cp  # a count tp x pp does not divide is refused by `gpus`'s check
        if n_gpus % (tp * pp) == 0 and n_gpus % whole:
            message = (
                "must be a multiple of `tensor_parallel` x `pipeline_parallel` x "
                f"`context_parallel` = {whole}"
            )
            out.append(Problem("gpus", gpus, message))
    if attention is not None and attention is not Attention.SDPA:
        value = getattr(attention, "value", attention)
        out.append(
            Problem(
                "attention",
                value,
                "`context_parallel` > 1 runs ring attention, which replaces torch's fused "
                "sdpa kernels only: attention must be sdpa",
            )
        )
    if document_mask is True:
        out.append(
            Problem(
                "document_mask",
                True,
                "is an attention bias, which torch's ring attention refuses under "
                "`context_parallel` > 1 ('attn_bias is not supported yet'): leave it off",
            )
        )
    return out


__all__ = ["CP_TERM", "exchange_bytes", "problems", "rank_view", "ring_term"]
