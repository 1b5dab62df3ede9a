"""Advice that names a memory technique and the bytes it frees, from the estimator.

    memory_advice(config, model, world_size)   # [Advice]: the technique that frees the most

For the setup in effect, each technique a Session trains (`TECHNIQUES`: 8-bit AdamW, the
optimizer step in backward, sdpa attention, activation checkpointing, activation offload,
pure bf16) is tried as a
settings change: a change the config or the engine refuses is skipped, the others are
predicted (`workbench.prediction.predict_memory`, the one prediction path) and the one
that lowers the peak of a step the most becomes one `Advice` ("memory-technique"), its
message naming the term it shrinks and its share of the peak ("optimizer states are 38% of
the peak (1.2 GiB): 8-bit AdamW frees 0.9 GiB, peak 3.1 GiB -> 2.2 GiB"), its `apply` the
change a panel hands to `session.update(**apply)`; `evidence` lists every technique tried
with the bytes it frees. LoRA (`LORA_CHANGE`) is said beside it when it frees more, for
a run that fine-tunes, but never applied in one click: it changes what trains.

Activation offload moves what the forward saves from the device to host memory: on a CPU
the activations are already there, nothing moves and nothing is freed, so it is not
offered for a run on a CPU (`device`, else the config's: "auto" is the CPU on a machine
without CUDA); `evidence["not_on_this_device"]` says why.

Pure bf16 keeps no fp32 master copy of the weights: an update below roughly 1/256 of a
weight rounds away in bf16 (8 significant bits), so a run trained so can stop learning from
small updates (a low lr, late in a schedule) unless its optimizer rounds stochastically or
carries the lost part (Kahan summation). It is a last resort for memory, so it is offered
only where memory is short: the predicted peak above `SHORT_FRACTION` of the memory the run
has (`capacity_bytes`, default the device's: a GPU's total memory, the machine's RAM for a
CPU), and its message says what it costs. Elsewhere `evidence["not_offered"]` says why it
was left out.
"""

from __future__ import annotations

from typing import Any

from workbench.advisor import Advice
from workbench.config import ConfigError, TrainConfig
from workbench.display import fmt_bytes
from workbench.engines import engine_problems
from workbench.inputs import shown
from workbench.prediction import predict_memory

#: The technique without an fp32 master copy: offered only where memory is short.
PURE_BF16 = "pure bf16 (precision='bf16-true')"

#: (what the advice calls it, the settings change) in the order they are tried.
TECHNIQUES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("8-bit AdamW", {"optimizer": "adam8bit"}),
    ("the optimizer step in backward", {"optimizer_in_backward": True}),
    ("sdpa attention", {"attention": "sdpa"}),
    ("activation checkpointing", {"activation_checkpointing": True}),
    ("activation offload", {"activation_offload": True}),
    # no fp32 master copy: weights, gradients and Adam's moments in bf16 (torchtune's default)
    (PURE_BF16, {"precision": "bf16-true"}),
)


#: Memory is short when the predicted peak is above this share of what the run has.
SHORT_FRACTION = 0.9

#: What pure bf16 costs, said with it.
PURE_BF16_CAVEAT = (
    "no fp32 master copy, so an update below roughly 1/256 of a weight rounds away (bf16 "
    "keeps 8 significant bits) and small updates (a low lr, late in a schedule) can be "
    "lost; keep amp-bf16 where memory allows"
)

#: Techniques that move device memory to the host: they free nothing on a CPU.
HOST_MOVES: frozenset[str] = frozenset({"activation offload"})

#: LoRA changes what trains (adapters, the base frozen), so it is never the one-click
#: technique; when it would free more than the best one, the advice says so for
#: fine-tuning, with its own bytes.
LORA_CHANGE: dict[str, Any] = {"lora_rank": 16}


def memory_advice(
    config: TrainConfig,
    model: Any,
    world_size: int = 1,
    *,
    device: Any = None,
    capacity_bytes: int | None = None,
) -> list[Advice]:
    """The technique that frees the most of the predicted peak for `model` (a prediction
    description or a parameter count, as `predict_memory` takes) trained with `config` on
    `world_size` ranks, as one Advice; [] when none frees anything or the setup cannot be
    predicted. `device`: where the run trains (a torch device or its name; default: the
    config's `device`, "auto" resolved on this machine); on a CPU the techniques that only
    move memory to the host (`HOST_MOVES`) are not offered. `capacity_bytes`: the memory
    the run has (default: the device's, see the module docstring); pure bf16 is offered
    only where the peak is above `SHORT_FRACTION` of it."""
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={shown(config)}: must be a workbench.TrainConfig")
    if capacity_bytes is not None and (
        isinstance(capacity_bytes, bool)
        or not isinstance(capacity_bytes, int)
        or capacity_bytes < 1
    ):
        raise ValueError(
            f"capacity_bytes={shown(capacity_bytes)}: must be an integer >= 1 (the bytes the "
            "run has) or None (the device's)"
        )
    where = _device_type(config, device)
    on_cpu = where == "cpu"
    try:
        base = predict_memory(config, model, world_size, device=where)
    except ValueError:
        return []
    capacity = capacity_bytes if capacity_bytes is not None else _capacity(where, device)
    short = capacity is not None and base.peak_bytes > SHORT_FRACTION * capacity
    tried: dict[str, int] = {}
    not_here: dict[str, str] = {}
    not_offered: dict[str, str] = {}
    best: tuple[int, str, dict[str, Any], Any] | None = None
    for name, change in TECHNIQUES:
        if all(_same(getattr(config, k), v) for k, v in change.items()):
            continue  # already on
        if on_cpu and name in HOST_MOVES:
            not_here[name] = "on a CPU the activations are already in host memory: nothing moves"
            continue
        if name == PURE_BF16 and not short:
            not_offered[name] = _not_short(base.peak_bytes, capacity)
            continue
        try:
            candidate = config.replace(**change)
        except ConfigError:
            continue  # the setup excludes it (e.g. accumulation for the step in backward)
        if engine_problems(candidate, world_size):
            continue
        try:
            predicted = predict_memory(candidate, model, world_size, device=where)
        except ValueError:
            continue
        freed = base.peak_bytes - predicted.peak_bytes
        tried[name] = freed
        if freed > 0 and (best is None or freed > best[0]):
            best = (freed, name, change, predicted)
    if best is None:
        return []
    freed, name, change, predicted = best
    term, held = _shrunk_term(base.peak_terms, predicted.peak_terms)
    share = 100 * held / base.peak_bytes if base.peak_bytes else 0.0
    peak = f"peak {fmt_bytes(base.peak_bytes)} -> {fmt_bytes(predicted.peak_bytes)}"
    if name == PURE_BF16:
        assert capacity is not None  # offered only where memory is short
        has = "this GPU has" if where == "cuda" else "this machine's RAM holds"
        message = (
            f"the predicted peak of a step ({fmt_bytes(base.peak_bytes)}) is "
            f"{100 * base.peak_bytes / capacity:.0f}% of the {fmt_bytes(capacity)} {has}: "
            f"{name} keeps weights, gradients, optimizer states and activations in bf16 and "
            f"frees {fmt_bytes(freed)}, {peak}; the cost: {PURE_BF16_CAVEAT}"
        )
    else:
        message = (
            f"{term} {'are' if term.endswith('s') else 'is'} {share:.0f}% of the peak of a "
            f"step ({fmt_bytes(held)}): {name} frees {fmt_bytes(freed)}, {peak}"
        )
    lora = _lora_freed(config, model, world_size, base.peak_bytes, where)
    if lora is not None and lora > freed:
        tried["LoRA rank 16"] = lora
        message += (
            f"; if this run fine-tunes, LoRA (lora_rank=16: adapters train, the base is "
            f"frozen) frees {fmt_bytes(lora)}"
        )
    evidence = {
        "peak_bytes": base.peak_bytes,
        "technique_peak_bytes": predicted.peak_bytes,
        "freed_bytes": {k: v for k, v in tried.items()},
        "term": term,
    }
    if capacity is not None:
        evidence["capacity_bytes"] = capacity
    if not_here:
        evidence["not_on_this_device"] = not_here
    if not_offered:
        evidence["not_offered"] = not_offered
    return [Advice("memory-technique", "info", message, evidence=evidence, apply=dict(change))]


def _lora_freed(
    config: TrainConfig, model: Any, world_size: int, peak: int, device: str
) -> int | None:
    """The bytes LoRA of rank 16 frees of `peak` on `device` (None: on already, or not
    predictable)."""
    if int(config.lora_rank) > 0:
        return None
    try:
        candidate = config.replace(**LORA_CHANGE)
        if engine_problems(candidate, world_size):
            return None
        return peak - predict_memory(candidate, model, world_size, device=device).peak_bytes
    except ValueError:  # ConfigError is one; a shape-less model predicts no adapters
        return None


def _capacity(where: str, device: Any) -> int | None:
    """The bytes the run has on `where`: the CUDA device's total memory (the one `device`
    names, else the current one), the machine's RAM for a CPU; None when not known."""
    import torch

    try:
        if where == "cuda":
            if not torch.cuda.is_available():
                return None
            index = torch.device(device).index if device is not None else None
            props = torch.cuda.get_device_properties(
                index if index is not None else torch.cuda.current_device()
            )
            return int(props.total_memory)
        import psutil  # type: ignore[import-untyped]

        return int(psutil.virtual_memory().total)
    except (RuntimeError, AssertionError, OSError, ValueError):
        return None


def _not_short(peak: int, capacity: int | None) -> str:
    """Why pure bf16 was left out: memory is not short (or not known)."""
    if capacity is None:
        return (
            "the device's memory is not known (capacity_bytes=None): pure bf16 (no fp32 "
            "master copy) is offered only where the peak nears it"
        )
    return (
        f"the predicted peak {fmt_bytes(peak)} is {100 * peak / capacity:.1f}% of the "
        f"{fmt_bytes(capacity)} the run has: pure bf16 (no fp32 master copy) is offered only "
        f"above {SHORT_FRACTION:.0%}"
    )


def _device_type(config: TrainConfig, device: Any) -> str:
    """ "cpu" or "cuda": `device`'s type, else the config's device ("auto": CUDA when this
    machine has it)."""
    import torch

    if device is not None:
        try:
            return torch.device(device).type
        except (RuntimeError, TypeError):
            raise ValueError(
                f"device={shown(device)}: must be a torch device or its name (cpu, cuda, cuda:N)"
            ) from None
    configured = str(getattr(config.device, "value", config.device))
    if configured == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(configured).type


def _same(current: Any, wanted: Any) -> bool:
    return str(getattr(current, "value", current)) == str(wanted)


def _shrunk_term(before: dict[str, int], after: dict[str, int]) -> tuple[str, int]:
    """The peak term that shrinks the most, and its bytes before (the peak's largest
    term when none shrinks, e.g. a peak moving to another point of the step)."""
    drops = {k: v - after.get(k, 0) for k, v in before.items()}
    term = max(drops, key=lambda k: drops[k]) if drops else ""
    if not drops or drops[term] <= 0:
        term = max(before, key=lambda k: before[k]) if before else "the peak"
    return term, before.get(term, 0)


__all__ = ["HOST_MOVES", "PURE_BF16", "SHORT_FRACTION", "TECHNIQUES", "memory_advice"]
