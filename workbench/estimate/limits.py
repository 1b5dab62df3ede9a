"""The range of every numeric input of the estimator, and the readers that enforce them.

Each input is checked to be a number of the right kind (an integer where the quantity is
integral; bools are refused; numpy scalars are numbers), finite, and inside a range whose
upper end is far beyond any real training setup, so that a typo (`1e20` for `1e2`) is an
error that says why instead of an answer printed as `inf` or as thirty digits:

    input               allowed                   why the upper end
    n_params            1 .. 10^16                10^4 x the largest models trained (~10^12)
    layers              1 .. 10^5                 the deepest models have ~10^2 layers
    hidden              1 .. 10^6                 the widest have ~3 x 10^4
    heads, kv_heads     1 .. 10^6                 (they divide hidden)
    ffn_hidden          1 .. 10^7                 the widest MLPs are ~10^5
    seq_len             1 .. 10^9                 the longest contexts are ~10^7 tokens
    max_positions       0 .. 10^9                 as seq_len
    vocab               1 .. 10^9                 the largest vocabularies are ~10^6
    micro_batch         1 .. 10^6                 samples on one GPU per step
    grad_accum          1 .. 10^6                 micro-batches per optimizer step
    loss_chunks         1 .. 10^6 (<= seq_len)    chunks of the sequence in the loss
    weight_decay        0 .. 1,000                a decay above 1 erases the weights
    lora_rank           0 .. 4,096                wider than the layers LoRA adapts
    lora_params, qlora_params
                        1 .. 10^16                as n_params
    qlora_bytes         1 .. 10^16                as n_params (bytes of the 4-bit base)
    lora_dropout        0 .. 0.99                 a dropout of 1 drops every input
    gpus, tensor_parallel, pipeline_parallel
                        1 .. 10^7                 the largest clusters have ~10^5 GPUs
    overhead_gib        0 .. 1,024                no GPU holds 1 TiB
    tokens              > 0 .. 10^16              ~10^3 x the largest training sets
    mfu                 0.001 .. 1                below 0.1% of the peak no run is measured
    price_per_gpu_hour  0 .. 10^6                 any currency, ~10^5 x a cloud GPU-hour

Within these ranges every figure the estimator computes is a finite number. The
activations of a setup may still come to more than `MAX_BYTES_PER_GPU` (2^60 bytes, a
million GPUs' memory: e.g. a sequence of 10^9 tokens with full attention); that setup is
refused too.

Pure Python: imports no torch.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any

#: Bytes in a GiB (2^30): the binary unit the estimator prints.
GIB = 1 << 30

#: The most bytes of activations one GPU may be estimated to hold (1 EiB).
MAX_BYTES_PER_GPU = 1 << 60


def _power_text(value: float) -> str:
    """10^9 for a power of ten of 5 digits or more, else the number with thousands commas."""
    if value >= 10_000 and float(value).is_integer():
        exponent = round(math.log10(value))
        if 10**exponent == value:
            return f"10^{exponent}"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:g}"


@dataclass(frozen=True)
class Bound:
    """The range of one input: `low` .. `high`, `integer` or any finite number; `low_open`
    makes `low` itself invalid (tokens > 0). `what` names the unit of a value ("tokens in a
    sequence") and `why` says why nothing above `high` is meant."""

    low: float
    high: float
    what: str
    why: str
    integer: bool = True
    low_open: bool = False

    @property
    def high_text(self) -> str:
        """The upper end as messages write it: 10^9, 1,024, 1."""
        return _power_text(self.high)

    @property
    def allowed(self) -> str:
        """What is allowed, as a message ends: "an integer from 1 to 10^9"."""
        kind = "an integer" if self.integer else "a finite number"
        if self.low_open:
            return f"{kind} > {_power_text(self.low)} and <= {_power_text(self.high)}"
        return f"{kind} from {_power_text(self.low)} to {_power_text(self.high)}"

    def too_large(self) -> str:
        """The message for a value above `high`."""
        amount = " ".join(filter(None, (self.high_text, self.what)))
        return f"more than {amount} ({self.why}); allowed: {self.allowed}"


LIMITS: dict[str, Bound] = {
    "n_params": Bound(1, 10**16, "parameters", "10^4 times the largest models trained"),
    "layers": Bound(1, 10**5, "layers", "the deepest models have about 10^2"),
    "hidden": Bound(1, 10**6, "hidden units", "the widest models have about 3 x 10^4"),
    "heads": Bound(1, 10**6, "heads", "heads divide the hidden size"),
    "kv_heads": Bound(1, 10**6, "key/value heads", "they divide the heads"),
    "ffn_hidden": Bound(1, 10**7, "MLP units", "the widest MLPs have about 10^5"),
    "seq_len": Bound(1, 10**9, "tokens", "the longest contexts are about 10^7 tokens"),
    "max_positions": Bound(0, 10**9, "positions", "the longest contexts are about 10^7"),
    "vocab": Bound(1, 10**9, "tokens in a vocabulary", "the largest have about 10^6"),
    "micro_batch": Bound(1, 10**6, "samples per GPU", "a micro-batch is what one GPU holds"),
    "grad_accum": Bound(1, 10**6, "micro-batches per step", "10^6 micro-batches is days a step"),
    "loss_chunks": Bound(1, 10**6, "chunks", "a chunk holds at least one token"),
    "weight_decay": Bound(
        0, 1000, "", "a decay above 1 per step already erases the weights", integer=False
    ),
    "lora_rank": Bound(0, 4096, "", "wider than the layers LoRA adapts"),
    "lora_params": Bound(1, 10**16, "parameters", "as n_params"),
    "qlora_params": Bound(1, 10**16, "parameters", "as n_params"),
    "qlora_bytes": Bound(1, 10**16, "bytes", "as n_params"),
    "lora_dropout": Bound(0, 0.99, "", "a dropout of 1 drops every input", integer=False),
    "gpus": Bound(1, 10**7, "GPUs", "the largest clusters have about 10^5"),
    "tensor_parallel": Bound(1, 10**7, "GPUs", "the largest clusters have about 10^5"),
    "pipeline_parallel": Bound(1, 10**7, "GPUs", "the largest clusters have about 10^5"),
    "context_parallel": Bound(1, 10**7, "GPUs", "the largest clusters have about 10^5"),
    "overhead_gib": Bound(0, 1024, "GiB per GPU", "no GPU holds 1 TiB", integer=False),
    "tokens": Bound(
        0, 10**16, "tokens", "10^3 times the largest training sets", integer=False, low_open=True
    ),
    "mfu": Bound(0.001, 1, "", "a utilisation is a fraction of the peak rate", integer=False),
    "price_per_gpu_hour": Bound(
        0, 10**6, "per GPU-hour", "10^5 times a cloud GPU-hour in any currency", integer=False
    ),
}


def is_bool(value: Any) -> bool:
    """True for `bool` and numpy's bool scalar (neither is a number to the estimator)."""
    kind = type(value)
    if kind is int or kind is float:  # the common case, answered first
        return False
    return isinstance(value, bool) or (
        kind.__name__ in ("bool", "bool_") and kind.__module__ == "numpy"
    )


def as_bool(value: Any) -> Any:
    """`value` as a Python bool when it is one (a numpy bool too), else unchanged."""
    return bool(value) if is_bool(value) else value


def as_int(value: Any) -> int | None:
    """An integer (a Python or numpy integer, not a bool), or None."""
    if type(value) is int:
        return value
    if is_bool(value) or isinstance(value, float):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_float(value: Any) -> float | None:
    """A finite float from an int or a real number (numpy's too), or None (bools, text,
    NaN, infinities, integers too large for a float)."""
    if type(value) is float:  # the common case, answered first
        return value if math.isfinite(value) else None
    if is_bool(value):
        return None
    n = as_int(value)
    try:
        f = float(n) if n is not None else float(value) if isinstance(value, numbers.Real) else None
    except (OverflowError, ValueError, TypeError):
        return None
    return f if f is not None and math.isfinite(f) else None


def check_number(name: str, value: Any, bound: Bound | None = None) -> tuple[Any, str | None]:
    """(the value read, None) or (None, the message: what is allowed) for input `name`.

    Integers stay integers; other numbers become floats. A value below the range or of
    the wrong kind gets "must be <allowed>", one above it "more than ... (why); allowed"."""
    b = bound or LIMITS[name]
    number: int | float | None
    if b.integer:
        number = as_int(value)
    else:
        n = as_int(value)
        if n is not None and n > b.high:
            return None, b.too_large()
        number = as_float(value)
    if number is None or number < b.low or (b.low_open and number == b.low):
        return None, f"must be {b.allowed}"
    if number > b.high:
        return None, b.too_large()
    return number, None


#: The most values a nested input (a config dict) may hold, a list or dict reached twice
#: counted each time (a config.json of 16 MiB holds about 10^6).
MAX_NESTED_VALUES = 10**6


def nesting_problem(
    value: Any, max_depth: int, max_values: int = MAX_NESTED_VALUES
) -> tuple[str, tuple[Any, ...]] | None:
    """(why the dicts, lists and tuples of `value` cannot be walked as a tree, the keys and
    indexes of the container where that shows), or None. Why: it "contains itself", is
    "nested deeper than N levels" (`max_depth`, the outermost container at level 1) or
    "holds more than N values" (`max_values`, counting a container reached by two paths
    each time: `L = [L, L]` forty times over is 2^40 values). Each container is looked at
    once (memoized), so a hostile value costs no more than its distinct containers; the
    recursion is at most `max_depth` deep."""
    done: dict[int, tuple[int, int]] = {}  # id -> (levels, itself included; values)
    on_path: set[int] = set()
    keep: list[Any] = []  # the containers measured, alive while their ids are keys
    path: list[Any] = []

    def measure(item: Any, level: int) -> tuple[int, int] | str:
        if not isinstance(item, (dict, list, tuple)):
            return 0, 1
        key = id(item)
        if key in on_path:
            return "contains itself"
        if level > max_depth or level - 1 + done.get(key, (0, 0))[0] > max_depth:
            return f"nested deeper than {max_depth} levels"
        if key in done:
            return done[key]
        on_path.add(key)
        keep.append(item)
        height, count = 0, 1
        for at, child in item.items() if isinstance(item, dict) else enumerate(item):
            path.append(at)
            got = measure(child, level + 1)
            if isinstance(got, str):
                return got
            path.pop()
            height, count = max(height, got[0]), count + got[1]
            if count > max_values:
                return f"holds more than {max_values:,} values"
        on_path.discard(key)
        done[key] = (height + 1, count)
        return height + 1, count

    got = measure(value, 1)
    return (got, tuple(path)) if isinstance(got, str) else None


__all__ = [
    "GIB",
    "LIMITS",
    "MAX_BYTES_PER_GPU",
    "MAX_NESTED_VALUES",
    "Bound",
    "as_bool",
    "as_float",
    "as_int",
    "check_number",
    "nesting_problem",
]
