"""The buffer sizes of a DeepSpeed config that the peak of a step depends on.

`estimate_memory(deepspeed_config=...)` takes a DeepSpeed JSON config (a path or its dict)
and reads from its `zero_optimization` block, and nothing else:

    reduce_bucket_size            elements per gradient reduce bucket (default 5e8)
    allgather_bucket_size         elements per parameter all-gather bucket (default 5e8)
    overlap_comm                  two reduce buckets instead of one (stages 1 and 2)
    stage3_prefetch_bucket_size   elements stage 3 gathers ahead (default 5e7)
    stage3_max_live_parameters    elements stage 3 keeps gathered at most (default 1e9)
    sub_group_size                elements of a rank's partition stage 3's step flattens
                                  and upcasts at a time (default 1e9)

A size may be an integer or an integral number (`5e8` in JSON is a number), 0 or more as
DeepSpeed 0.19 allows (`reduce_bucket_size` 1 or more: its field is `gt=0`, the others
`ge=0`); stage 3's two keys also under their field names, as DeepSpeed reads them
(`prefetch_bucket_size`, `max_live_parameters`). Hugging Face's "auto" means the default
here. The file is read by `workbench.inputs.read_json` (a regular
file, at most 16 MiB, strict JSON); nothing in it is run. The stage, precision and batch
come from `estimate_memory`'s own arguments (`workbench estimate --deepspeed-config` reads
those from the file through `workbench.deepspeed`).

Pure Python: imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from workbench.estimate.limits import as_bool, as_float
from workbench.estimate.problems import Problem
from workbench.inputs import InputFileError, shown

#: DeepSpeed 0.19's defaults for the keys read.
DEFAULTS: dict[str, Any] = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "sub_group_size": 1_000_000_000,
    "overlap_comm": False,
}
_SIZES = tuple(k for k in DEFAULTS if k != "overlap_comm")
#: DeepSpeed's field names for the keys its config also takes under an alias
FIELD_NAMES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "max_live_parameters": "stage3_max_live_parameters",
}
#: every key of `zero_optimization` read here (`workbench.deepspeed` names them on import)
READ_KEYS = frozenset((*DEFAULTS, *FIELD_NAMES))
#: The largest bucket read (elements): 10^13, far beyond any GPU's memory.
MAX_ELEMENTS = 10**13
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def read_deepspeed_buffers(
    source: Any, field: str = "deepspeed_config"
) -> tuple[dict[str, Any], list[Problem]]:
    """(the buffer settings, DeepSpeed's defaults where the config is silent, problems)."""
    if source is None:
        return dict(DEFAULTS), []
    if isinstance(source, Mapping):
        config: Any = source
        where = "{...}"
    elif isinstance(source, (str, os.PathLike)) and str(source).strip():
        from workbench.inputs import read_json

        where = os.fspath(source) if isinstance(source, str) else str(source)
        try:
            config = read_json(where, what=field, max_bytes=MAX_CONFIG_BYTES)
        except InputFileError as exc:
            return dict(DEFAULTS), [Problem(field, where, exc.reason)]
    else:
        return dict(DEFAULTS), [
            Problem(field, source, "must be a path to a DeepSpeed JSON or a dict")
        ]
    if not isinstance(config, Mapping):
        return dict(DEFAULTS), [Problem(field, where, "must hold a JSON object")]
    zero = config.get("zero_optimization", {})
    if zero is None:
        zero = {}
    if not isinstance(zero, Mapping):
        return dict(DEFAULTS), [
            Problem(field, where, f"zero_optimization {shown(zero)}: must be an object")
        ]
    out = dict(DEFAULTS)
    problems: list[Problem] = []
    named = {FIELD_NAMES.get(k, k): k for k in zero if isinstance(k, str)}
    for key in _SIZES:
        given = named.get(key, key)
        value = zero.get(given)
        if value is None or value == "auto":
            continue
        least = 1 if key == "reduce_bucket_size" else 0
        number = as_float(value) if not isinstance(value, str) else None
        if number is None or not number.is_integer() or not least <= number <= MAX_ELEMENTS:
            message = (
                f"zero_optimization.{given} {shown(value)}: must be a whole number of "
                f"elements from {least} to 10^13"
            )
            problems.append(Problem(field, where, message))
            continue
        out[key] = int(number)
    overlap = as_bool(zero.get("overlap_comm"))
    if overlap is not None and overlap != "auto":
        if isinstance(overlap, bool):
            out["overlap_comm"] = overlap
        else:
            message = f"zero_optimization.overlap_comm {shown(overlap)}: must be true or false"
            problems.append(Problem(field, where, message))
    return out, problems


__all__ = ["DEFAULTS", "FIELD_NAMES", "READ_KEYS", "read_deepspeed_buffers"]
