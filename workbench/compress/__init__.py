"""Compression after training: quantize, prune and distill, with before and after measured.

    from workbench import compress
    train, held_out = compress.held_out_split(dataset)          # train on `train` only
    report = compress.compress(model, held_out, loss_fn, methods=["int8", "prune", "channels"])
    report                      # table: weights, file size, latency, held-out loss/accuracy
    report.chart()              # the same as bars; methods that do not pay are marked
    report.verdict("channels")  # smaller/faster, and within the quality tolerance?
    report.models["channels"]   # the compressed copies

The methods, each returning a compressed copy (`Compressed`); your model is never changed:

* `quantize_int8(model)`: INT8 dynamic quantization of the `nn.Linear` layers, with
  torchao (`engine="torchao"`, default) or PyTorch's older `torch.ao` eager path.
* `prune_unstructured(model, sparsity)`: global magnitude pruning, made permanent.
* `prune_structured(model, sparsity, unit="channels" | "heads")`: whole channels or
  attention heads removed; the layers get smaller.
* `distill_session(teacher, student, data, hard_loss=...)`: a `Session` that trains a
  smaller student with a `DistillationLoss` from a frozen teacher; each step's record
  carries the soft and hard losses (`StepRecord.loss_parts`).

`compare(before, {"name": model}, held_out, loss_fn)` measures any models (a distilled
student, say) the same way, and `load_trained(path)` rebuilds a model from a Session's
checkpoint (what `workbench compress CHECKPOINT` does). Bad input (a sparsity outside
[0, 1), a layer type a method does not support, a student whose outputs do not match the
teacher's) raises a ValueError naming what is allowed, before anything is changed.
"""

from workbench.compress.checkpoint import Trained, load_trained
from workbench.compress.compare import DEFAULT_METHODS, METHODS, apply_method, compare, compress
from workbench.compress.distill import (
    DistillationLoss,
    TeacherInputs,
    check_student,
    distill_session,
)
from workbench.compress.layers import PRUNABLE, QUANTIZABLE, Compressed
from workbench.compress.measure import (
    CompressionCancelled,
    Quality,
    disk_bytes,
    evaluate,
    held_out_split,
    latencies,
    weights_bytes,
    zero_fraction,
)
from workbench.compress.prune import prune_structured, prune_unstructured
from workbench.compress.quantize import ENGINES, quantize_int8
from workbench.compress.report import (
    NOISE,
    CompressionReport,
    Figures,
    QualityTolerance,
    Row,
    Verdict,
)
from workbench.compress.structure import PrunedSelfAttention, find_groups

__all__ = [
    "DEFAULT_METHODS",
    "ENGINES",
    "METHODS",
    "NOISE",
    "PRUNABLE",
    "QUANTIZABLE",
    "Compressed",
    "CompressionCancelled",
    "CompressionReport",
    "DistillationLoss",
    "Figures",
    "PrunedSelfAttention",
    "Quality",
    "QualityTolerance",
    "Row",
    "TeacherInputs",
    "Trained",
    "Verdict",
    "apply_method",
    "check_student",
    "compare",
    "compress",
    "disk_bytes",
    "distill_session",
    "evaluate",
    "find_groups",
    "held_out_split",
    "latencies",
    "load_trained",
    "prune_structured",
    "prune_unstructured",
    "quantize_int8",
    "weights_bytes",
    "zero_fraction",
]
