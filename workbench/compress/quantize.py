"""INT8 dynamic quantization of a model's linear layers.

    small = quantize_int8(model)                       # torchao (the default engine)
    small = quantize_int8(model, engine="torch.ao")    # PyTorch's older eager-mode path

Dynamic quantization stores each `nn.Linear` weight as int8 with a scale, and quantizes
the activations to int8 at run time, batch by batch, so it needs no calibration data.

Two engines:

* `"torchao"` (default): torchao, the library PyTorch maintains for quantization, with
  `Int8DynamicActivationInt8WeightConfig` (int8 weights with one scale per output row,
  activations quantized per token). It runs on this CPU, on any device torch does, and
  its weights save and load with `torch.save`. In eager mode on a CPU its int8 matmul is
  not a fused kernel, so it can be slower than fp32 there; `torch.compile` fuses it.
* `"torch.ao"`: `torch.ao.quantization.quantize_dynamic`, PyTorch's eager-mode
  quantization (int8 weights with one scale per tensor). PyTorch has deprecated it in
  favour of torchao, but it calls fused fbgemm/oneDNN int8 kernels on x86 and ARM CPUs,
  so on a CPU it is often the faster of the two without compiling. CPU only.

Either way the result is a copy (`Compressed.model`, in eval mode); your model is not
changed. Layers with a weight tied to another module (tiny-gpt's output head) are left
out, since quantizing one side of a tie would store the weight twice.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from workbench.compress.layers import QUANTIZABLE, Compressed, check_model, select_layers
from workbench.inputs import shown

ENGINES = ("torchao", "torch.ao")
WHAT = "INT8 dynamic quantization"


def _torchao() -> Any:
    """`torchao.quantization`, imported on first use.

    On a CPU-only build of torch, torchao's import logs that its CUDA kernels cannot be
    loaded (and torch logs a deprecation about one of torchao's enums); neither concerns
    the CPU path, so they are silenced for the import on such builds only."""
    quiet = torch.version.cuda is None
    noisy = [logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")]
    levels = [log.level for log in noisy]
    if quiet:
        for log in noisy:
            log.setLevel(logging.ERROR)
    try:
        import torchao.quantization as quantization  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ImportError(
            f"engine='torchao' needs torchao: pip install torchao (or use "
            f"engine='torch.ao', PyTorch's deprecated eager-mode path, CPU only): {exc}"
        ) from exc
    finally:
        for log, level in zip(noisy, levels, strict=True):
            log.setLevel(level)
    return quantization


def torchao_version() -> str | None:
    """The installed torchao's version, or None without torchao."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:
        return None


def quantize_int8(
    model: nn.Module, *, layers: Iterable[str] | None = None, engine: str = "torchao"
) -> Compressed:
    """A copy of `model` with INT8 dynamic quantization of its `nn.Linear` layers.

    `layers`: names of the linear layers to quantize (default: all, except tied ones).
    `engine`: "torchao" (default) or "torch.ao" (see the module docstring). ValueError,
    your model untouched, for an unknown engine, a layer that is not an `nn.Linear`, or a
    model without one.
    """
    check_model(model)
    if engine not in ENGINES:
        raise ValueError(f"engine={shown(engine)}: must be one of {', '.join(map(repr, ENGINES))}")
    names, skipped = select_layers(model, layers, QUANTIZABLE, WHAT)
    if engine == "torch.ao":
        devices = {p.device.type for p in model.parameters()}
        if devices - {"cpu"}:
            raise ValueError(
                f"engine='torch.ao': runs on the CPU only and the model is on "
                f"{', '.join(sorted(devices))}; use engine='torchao' or move it with .cpu()"
            )
        out = copy.deepcopy(model).eval()
        with warnings.catch_warnings():
            # its deprecation warning is what the report's note says, once
            warnings.simplefilter("ignore", category=UserWarning)
            warnings.simplefilter("ignore", category=DeprecationWarning)
            torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
                out, set(names), dtype=torch.qint8, inplace=True
            )
        note = (
            "torch.ao.quantization.quantize_dynamic: int8 weights (one scale per tensor), "
            "activations quantized per batch; fused fbgemm/oneDNN CPU kernels. PyTorch has "
            "deprecated this path in favour of torchao"
        )
        slow = (
            "at this size the per-call cost of quantizing the activations outweighs the "
            "cheaper int8 matmul"
        )
    else:
        quantization = _torchao()
        out = copy.deepcopy(model).eval()
        chosen = set(names)
        quantization.quantize_(
            out,
            quantization.Int8DynamicActivationInt8WeightConfig(),
            filter_fn=lambda module, fqn: fqn in chosen,
        )
        note = (
            f"torchao {torchao_version()}: Int8DynamicActivationInt8WeightConfig (int8 weights "
            "with one scale per output row, activations quantized per token at run time)"
        )
        slow = (
            "torchao's int8 path runs eagerly as separate steps here (quantize the "
            "activations, multiply, rescale), not one fused kernel; torch.compile can fuse "
            "them: compare(..., compile=True)"
        )
    return Compressed(
        model=out,
        method="int8",
        layers=tuple(names),
        skipped=tuple(skipped),
        notes=(note,),
        why_no_gain=slow,
    )
