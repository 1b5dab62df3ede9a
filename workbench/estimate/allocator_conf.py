"""`PYTORCH_CUDA_ALLOC_CONF` read as torch 2.13 reads it, for the allocator model.

`parse_alloc_conf(text)` gives `AllocatorSettings` (c10/core/AllocatorConfig.h's
`AcceleratorAllocatorConfig` and c10/cuda/CUDAAllocatorConfig.h's keys, with their
parsers' ranges); a key the model does not know, a value out of range or text that does
not parse is an `AllocatorConfigError` (a ValueError) naming the key, the value and what
is allowed. Pure: imports no torch. `workbench.estimate.allocator` replays a trace under
the settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.inputs import shown

KIB = 1024
MIB = 1024 * KIB
#: c10/core/AllocatorConfig.h
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 * MIB
K_SMALL_BUFFER = 2 * MIB
K_MIN_LARGE_ALLOC = 10 * MIB
K_ROUND_LARGE = 2 * MIB
K_LARGE_BUFFER = 20 * MIB
#: roundup_power2_divisions' intervals: 1 MiB to 64 GiB, one per power of two
POW2_START_LOG = 20
POW2_INTERVALS = 16


# ---------------------------------------------------------------------- the settings
class AllocatorConfigError(ValueError):
    """A `PYTORCH_CUDA_ALLOC_CONF` the model cannot take: `key`, `value` and what is
    allowed (`allowed`) as data; the text names all three."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"PYTORCH_CUDA_ALLOC_CONF: {key}={shown(value)}: {allowed}")


#: The keys that change where the device's blocks go (modelled).
MODELLED_KEYS = (
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "large_segment_size_mb",
    "per_process_memory_fraction",
)
#: Keys torch takes that leave the device's reserved memory as it is (host pinned memory,
#: locking, capture bookkeeping, error reporting): accepted and ignored.
IGNORED_KEYS = (
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold",
    "pinned_max_cached_size",
    "pinned_free_catch_all",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
)


@dataclass(frozen=True)
class AllocatorSettings:
    """The caching allocator's settings (`parse_alloc_conf`): `max_split_size_bytes`
    (None: every block may split), `max_non_split_rounding_bytes`,
    `garbage_collection_threshold` (0: off), `roundup_power2_divisions` (one per
    power-of-two interval from 1 MiB; 0 or 1: plain 512-byte rounding),
    `expandable_segments`, `large_segment_bytes`, `memory_fraction` (None: not set; the
    garbage collection runs only with one, as torch's `set_fraction`) and the `text` read."""

    max_split_size_bytes: int | None = None
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * POW2_INTERVALS
    expandable_segments: bool = False
    large_segment_bytes: int = K_LARGE_BUFFER
    memory_fraction: float | None = None
    text: str = ""

    @property
    def max_split(self) -> int:
        return self.max_split_size_bytes if self.max_split_size_bytes is not None else 1 << 62


def _tokens(text: str) -> list[str]:
    """torch's ConfigTokenizer: ',', ':', '[' and ']' are tokens of their own."""
    out: list[str] = []
    word = ""
    for ch in text:
        if ch in ",:[]":
            if word.strip():
                out.append(word.strip())
            word = ""
            out.append(ch)
        elif not ch.isspace():
            word += ch
    if word.strip():
        out.append(word.strip())
    return out


def _number(key: str, raw: str, kind: type, allowed: str) -> Any:
    try:
        return kind(raw)
    except ValueError:
        raise AllocatorConfigError(key, raw, allowed) from None


def _divisions(key: str, raw: str) -> int:
    allowed = "a power of two (or 0 or 1 for no power-of-two rounding)"
    value = _number(key, raw, int, allowed)
    if value < 0 or (value > 1 and value & (value - 1)):
        raise AllocatorConfigError(key, raw, allowed)
    return int(value)


def parse_alloc_conf(text: str | None) -> AllocatorSettings:
    """The settings of a `PYTORCH_CUDA_ALLOC_CONF` string ("key:value,key:value"; None or
    "" for torch's defaults), checked with torch's ranges (AcceleratorAllocatorConfig's
    parsers): `max_split_size_mb` and `max_non_split_rounding_mb` at least 20,
    `large_segment_size_mb` at least 1, `garbage_collection_threshold` and
    `per_process_memory_fraction` in (0, 1) and (0, 1], `expandable_segments` True or
    False, `roundup_power2_divisions` a power of two or a list "[256:4,>:1]". A key the
    model does not know, a value out of range or text that does not parse: an
    `AllocatorConfigError` naming the key."""
    if text is None or not str(text).strip():
        return AllocatorSettings()
    if not isinstance(text, str):
        raise AllocatorConfigError("PYTORCH_CUDA_ALLOC_CONF", text, "a text 'key:value,...'")
    toks = _tokens(text)
    fields: dict[str, Any] = {}
    i = 0
    while i < len(toks):
        key = toks[i]
        if key == ",":
            i += 1
            continue
        if key not in MODELLED_KEYS and key not in IGNORED_KEYS:
            known = ", ".join((*MODELLED_KEYS, *IGNORED_KEYS))
            raise AllocatorConfigError(key, text, f"an unknown key; known keys: {known}")
        if i + 2 >= len(toks) + (0 if i + 1 < len(toks) else 1) or toks[i + 1] != ":":
            raise AllocatorConfigError(key, text, "expected 'key:value'")
        i += 2
        if i >= len(toks):
            raise AllocatorConfigError(key, "", "a value after ':'")
        if key == "roundup_power2_divisions":
            i = _parse_divisions(toks, i, fields)
            continue
        raw = toks[i]
        i += 1
        if key in IGNORED_KEYS:
            continue
        if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            mb = _number(key, raw, int, "an integer number of MiB, at least 20")
            if mb < K_LARGE_BUFFER // MIB:
                raise AllocatorConfigError(key, raw, "at least 20 (MiB)")
            name = (
                "max_split_size_bytes"
                if key == "max_split_size_mb"
                else ("max_non_split_rounding_bytes")
            )
            fields[name] = mb * MIB
        elif key == "large_segment_size_mb":
            mb = _number(key, raw, int, "an integer number of MiB, at least 1")
            if mb < 1:
                raise AllocatorConfigError(key, raw, "at least 1 (MiB)")
            fields["large_segment_bytes"] = mb * MIB
        elif key == "garbage_collection_threshold":
            value = _number(key, raw, float, "a number in (0.0, 1.0)")
            if not 0.0 < value < 1.0:
                raise AllocatorConfigError(key, raw, "a number in (0.0, 1.0)")
            fields["garbage_collection_threshold"] = value
        elif key == "per_process_memory_fraction":
            value = _number(key, raw, float, "a number in (0.0, 1.0]")
            if not 0.0 < value <= 1.0:
                raise AllocatorConfigError(key, raw, "a number in (0.0, 1.0]")
            fields["memory_fraction"] = value
        elif key == "expandable_segments":
            if raw not in ("True", "False", "true", "false"):
                raise AllocatorConfigError(key, raw, "True or False")
            fields["expandable_segments"] = raw in ("True", "true")
    return AllocatorSettings(**fields, text=text)


def _parse_divisions(toks: list[str], i: int, fields: dict[str, Any]) -> int:
    key = "roundup_power2_divisions"
    divisions = [0] * POW2_INTERVALS
    if toks[i] != "[":
        value = _divisions(key, toks[i])
        fields[key] = tuple([value] * POW2_INTERVALS)
        return i + 1
    i += 1
    last: int | None = None  # the last interval set (parseRoundUpPower2Divisions)
    while i < len(toks) and toks[i] != "]":
        if toks[i] == ",":
            i += 1
            continue
        bound = toks[i]
        if i + 2 >= len(toks) or toks[i + 1] != ":":
            raise AllocatorConfigError(key, bound, "entries 'MiB:divisions' or '>:divisions'")
        value = _divisions(key, toks[i + 2])
        if bound == ">":  # every interval after the last one named
            start = 0 if last is None else last + 1
            for j in range(start, POW2_INTERVALS):
                divisions[j] = value
        else:
            mb = _number(key, bound, int, "a power-of-two size in MiB, 1 to 65536, or '>'")
            if mb < 1 or mb & (mb - 1) or mb > 65536:
                raise AllocatorConfigError(key, bound, "a power-of-two size in MiB, 1 to 65536")
            index = min(mb.bit_length() - 1, POW2_INTERVALS - 1)
            if last is None:  # the first entry also covers the intervals below it
                for j in range(index):
                    divisions[j] = value
            divisions[index] = value
            last = index
        i += 3
    if i >= len(toks):
        raise AllocatorConfigError(key, "[", "a closing ']'")
    fields[key] = tuple(divisions)
    return i + 1


def with_setting(text: str | None, setting: str) -> str:
    """`text` with `setting` ("key:value") in place of the same key's entry."""
    key = setting.split(":", 1)[0]
    parts = [p for p in _split_entries(text or "") if p.split(":", 1)[0].strip() != key]
    return ",".join([*parts, setting])


def _split_entries(text: str) -> list[str]:
    out: list[str] = []
    depth = 0
    word = ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            if word.strip():
                out.append(word.strip())
            word = ""
        else:
            word += ch
    if word.strip():
        out.append(word.strip())
    return out


__all__ = [
    "IGNORED_KEYS",
    "MODELLED_KEYS",
    "AllocatorConfigError",
    "AllocatorSettings",
    "parse_alloc_conf",
    "with_setting",
]
