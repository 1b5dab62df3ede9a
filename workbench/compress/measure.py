"""What a compressed model costs and how good it is, measured.

* `weights_bytes(model)`: the bytes of the tensors in its state dict (parameters and
  persistent buffers) in the dtypes they are stored in: int8 data with their scales for a
  quantized layer, each shared (tied) tensor once.
* `disk_bytes(model)`: the size of the file `torch.save(model.state_dict(), "model.pt")`
  writes.
* `zero_fraction(model)`: the share of exactly-zero entries in the weights of its linear
  and convolution layers (quantized ones read back as floats).
* `evaluate(model, data, loss_fn)`: mean loss over a held-out data set, and the accuracy
  where the task has one (integer class targets, outputs with one score per class:
  classification, or next-token prediction).
* `latencies(models, batch)`: seconds per forward pass of each model on the same batch,
  in eval mode without autograd, the models taking turns so that a busy moment on a
  shared machine slows them all alike.
* `held_out_split(dataset)`: a training part and a held-out tail of a data set.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from workbench.inputs import shown
from workbench.train import batches
from workbench.train.data import batch_size_of, move_to


class CompressionCancelled(RuntimeError):
    """A measurement was cancelled (its `cancel` event was set) before it finished."""


def stop_if_cancelled(cancel: Any) -> None:
    """Raise `CompressionCancelled` once `cancel` (a threading.Event, or None) is set."""
    if cancel is not None and cancel.is_set():
        raise CompressionCancelled("the measurement was cancelled")


# --------------------------------------------------------------------------- size


def _leaves(value: Any) -> list[torch.Tensor]:
    """The plain tensors a state-dict value is made of (tensor subclasses such as
    torchao's int8 weights, quantized tensors' scales, tuples of packed parameters)."""
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _leaves(v)]
    if not isinstance(value, torch.Tensor):
        return []
    flatten = getattr(value, "__tensor_flatten__", None)
    if flatten is not None and type(value) not in (torch.Tensor, nn.Parameter):
        names, _ = flatten()
        return [t for name in names for t in _leaves(getattr(value, name))]
    if value.is_quantized:
        extra: list[torch.Tensor] = []
        if value.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            extra = [value.q_per_channel_scales(), value.q_per_channel_zero_points()]
        else:  # one scale (float64) and zero point (int64)
            extra = [torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.int64)]
        return [value, *extra]
    return [value]


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the tensors in `model.state_dict()`, as stored, shared tensors once."""
    seen: set[tuple[Any, ...]] = set()
    total = 0
    for value in model.state_dict().values():
        for t in _leaves(value):
            nbytes = t.numel() * t.element_size()
            if t.device.type != "meta" and nbytes:
                key = (t.device, t.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
                if key in seen:
                    continue
                seen.add(key)
            total += nbytes
    return total


def disk_bytes(model: nn.Module) -> int:
    """Size in bytes of the file `torch.save(model.state_dict(), "model.pt")` writes (the
    archive records the file's name, so another name changes the size by a few bytes)."""
    with tempfile.TemporaryDirectory(prefix="workbench-compress-") as folder:
        path = os.path.join(folder, "model.pt")
        torch.save(model.state_dict(), path)
        return os.path.getsize(path)


def _dense_weight(module: nn.Module) -> torch.Tensor | None:
    weight = getattr(module, "weight", None)
    if callable(weight) and not isinstance(weight, torch.Tensor):  # torch.ao quantized linear
        with contextlib.suppress(Exception):
            weight = weight()
    if not isinstance(weight, torch.Tensor):
        return None
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.is_quantized:
        try:
            weight = weight.dequantize()
        except Exception:
            return None
    return weight.detach()


def zero_fraction(model: nn.Module) -> float | None:
    """Share of exactly-zero weight entries of the linear and convolution layers (None
    when the model has none)."""
    from workbench.compress.layers import PRUNABLE

    zeros = total = 0
    seen: set[int] = set()
    for module in model.modules():
        quantized = type(module).__module__.startswith("torch.ao.nn.quantized")
        if not isinstance(module, PRUNABLE) and not quantized:
            continue
        weight = _dense_weight(module)
        if weight is None or id(getattr(module, "weight", None)) in seen:
            continue
        seen.add(id(getattr(module, "weight", None)))
        zeros += int((weight == 0).sum())
        total += weight.numel()
    return zeros / total if total else None


# --------------------------------------------------------------------------- quality


@dataclass(frozen=True)
class Quality:
    """Held-out quality: mean loss per sample, accuracy (None where the task has none)."""

    loss: float
    accuracy: float | None
    samples: int


def _device(model: nn.Module) -> torch.device:
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Any:
    """`model` in eval mode and without autograd, its own mode restored afterwards."""
    was = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was)


def _correct(out: Any, targets: Any) -> tuple[int, int] | None:
    """(correct, counted) predictions, or None when the task is not classification."""
    logits = getattr(out, "logits", out)
    if not isinstance(logits, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return None
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        return None
    if logits.dim() != targets.dim() + 1 or logits.shape[:-1] != targets.shape:
        return None
    pred = logits.argmax(dim=-1)
    return int((pred == targets).sum()), targets.numel()


def evaluate(
    model: nn.Module,
    data: Dataset[Any] | DataLoader[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    *,
    batch_size: int = 64,
    max_samples: int | None = None,
    cancel: Any = None,
) -> Quality:
    """Mean loss over `data` (each batch's mean loss weighted by its samples) and the
    accuracy where the task has one, in eval mode without autograd. `cancel`: a
    threading.Event checked before each batch (`CompressionCancelled` once set)."""
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)
    device = _device(model)
    loss_sum = 0.0
    samples = correct = counted = 0
    classification = True
    with eval_mode(model):
        for batch in loader:
            stop_if_cancelled(cancel)
            batch = move_to(batch, device)
            n = batch_size_of(batch)
            out = batches.forward(model, batch)
            loss_sum += float(batches.loss_of(out, batch, loss_fn)) * n
            samples += n
            if classification and not isinstance(batch, Mapping):
                hit = _correct(out, batch[1])
                if hit is None:
                    classification = False
                else:
                    correct += hit[0]
                    counted += hit[1]
            else:
                classification = False
            if max_samples is not None and samples >= max_samples:
                break
    if not samples:
        raise ValueError("data: the held-out data set is empty")
    accuracy = correct / counted if classification and counted else None
    return Quality(loss=loss_sum / samples, accuracy=accuracy, samples=samples)


# --------------------------------------------------------------------------- speed


def first_batch(data: Dataset[Any] | DataLoader[Any], batch_size: int) -> Any:
    """The first `batch_size` samples of `data` as one batch (the first batch of a
    DataLoader as it is)."""
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)
    return next(iter(loader))


def latencies(
    models: Mapping[str, Any],
    batch: Any,
    *,
    repeats: int = 30,
    rounds: int | None = None,
    warmup: int = 3,
    cancel: Any = None,
) -> dict[str, list[float]]:
    """Seconds per forward pass of each model on `batch` (moved to each model's device):
    `warmup` untimed calls each, then `rounds` turns (default: `repeats`, one call per
    model per turn) in which every model runs `repeats / rounds` timed calls; eval mode,
    no autograd. `cancel`: a threading.Event checked before each model's calls
    (`CompressionCancelled` once set)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    rounds = repeats if rounds is None else rounds
    per_round = max(1, math.ceil(repeats / rounds))
    placed = {name: move_to(batch, _device(m)) for name, m in models.items()}
    for name, model in models.items():
        stop_if_cancelled(cancel)
        with eval_mode(model):
            for _ in range(warmup):
                batches.forward(model, placed[name])
    for _ in range(rounds):
        for name, model in models.items():
            stop_if_cancelled(cancel)
            sync = _synchronizer(_device(model))
            with eval_mode(model):
                for _ in range(per_round):
                    if len(times[name]) >= repeats:
                        break
                    start = time.perf_counter()
                    batches.forward(model, placed[name])
                    sync()  # the host waits for the device, so the time is the forward's
                    times[name].append(time.perf_counter() - start)
    return times


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


# --------------------------------------------------------------------------- data


def held_out_split(
    dataset: Dataset[Any], fraction: float = 0.1, *, gap: int | None = None
) -> tuple[Subset[Any], Subset[Any]]:
    """(training part, held-out tail) of a map-style data set.

    The last `fraction` of the samples are held out. `gap` samples before them are
    dropped from both parts: by default `seq_len + 1` for a data set of text windows with
    a `seq_len` (tiny-gpt's, where neighbouring windows share characters), else 0.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"fraction={shown(fraction)}: must be a number in (0, 1)")
    n = len(dataset)  # type: ignore[arg-type]
    if gap is None:
        seq_len = getattr(dataset, "seq_len", None)
        gap = int(seq_len) + 1 if isinstance(seq_len, int) else 0
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise ValueError(f"gap={shown(gap)}: must be an integer >= 0")
    held = max(1, int(n * fraction))
    train_end = n - held - gap
    if train_end < 1:
        raise ValueError(
            f"dataset: {n} samples are too few to hold out {fraction:.0%} with a gap of {gap}"
        )
    return Subset(dataset, range(train_end)), Subset(dataset, range(n - held, n))
