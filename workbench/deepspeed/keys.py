"""The DeepSpeed keys and names both directions share (export in `to_json`, import in
`from_json` and `blocks`), and the result of an import.

Pure: imports neither torch nor DeepSpeed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.config import OptimizerName, TrainConfig
from workbench.optimizers import OPTIMIZERS

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# fp16: DeepSpeed's dynamic loss scaler grows and backs off by a factor of 2 only.
DS_SCALE_FACTOR = 2.0

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

#: Top-level keys the workbench reads into a TrainConfig. Every other key DeepSpeed reads
#: is named in the import's "not modelled" warning; keys DeepSpeed does not read either
#: are named there too, with the close DeepSpeed key.
MODELLED_TOP_LEVEL = frozenset(
    {
        *BATCH_KEYS,
        "optimizer",
        "scheduler",
        "gradient_clipping",
        "fp16",
        "bf16",
        "bfloat16",
        "torch_autocast",
        "zero_optimization",
        "zero_allow_untested_optimizer",  # the export sets it where DeepSpeed needs it
    }
)

#: DeepSpeed optimizer type (lowercased; DeepSpeed matches its own names case-insensitively)
#: -> the workbench's optimizer, from each optimizer's row (`deepspeed_name`). "adam" is
#: adam or adamw by `adam_w_mode`, and "SGD" is torch.optim.SGD (case-sensitive, as DeepSpeed
#: looks it up in torch.optim): the import reads those two itself.
OPTIMIZER_OF_TYPE = {
    r.deepspeed_name.lower(): OptimizerName(r.name)
    for r in OPTIMIZERS
    if r.deepspeed_name and r.deepspeed_name.lower() not in ("adam", "sgd")
}
#: The workbench's optimizer -> DeepSpeed's type name (export), from each row.
TYPE_OF_OPTIMIZER = {
    OptimizerName(r.name): r.deepspeed_name for r in OPTIMIZERS if r.deepspeed_name
}
#: Optimizers whose class DeepSpeed 0.19 lists as tested with ZeRO (ZERO_SUPPORTED_OPTIMIZERS:
#: torch/Fused/CPU Adam, Adagrad, CPU/Fused Lion): each row's `deepspeed_zero_tested`. The
#: others need "zero_allow_untested_optimizer": true at stages 1-3;
#: tests/unit/test_dsconfig.py checks this set against DeepSpeed's list.
ZERO_TESTED_OPTIMIZERS = frozenset(
    OptimizerName(r.name) for r in OPTIMIZERS if r.deepspeed_zero_tested
)
#: The optimizer parameters the workbench models, per optimizer family; any other given
#: parameter (with a value other than DeepSpeed's default) is listed as not modelled.
MODELLED_PARAMS = {
    # torch_adam: which implementation runs the same Adam (same state bytes); the export
    # always writes true (no fused/CPU Adam op build)
    "adam": frozenset({"lr", "weight_decay", "betas", "eps", "adam_w_mode", "torch_adam"}),
    "sgd": frozenset({"lr", "weight_decay", "momentum"}),
    "other": frozenset({"lr", "weight_decay", "betas", "eps"}),
}


@dataclass(frozen=True)
class DeepSpeedImport:
    """A DeepSpeed config read back: the TrainConfig, the world size the batch keys imply,
    and the warnings, one string each (at most: the "auto" values filled, the keys not
    modelled, and a 1-bit optimizer the installed DeepSpeed lacks). `auto_keys`: the key
    paths whose value was "auto" (filled from the session's settings, or left to
    DeepSpeed's defaults), sorted."""

    config: TrainConfig
    world_size: int
    warnings: tuple[str, ...] = field(default_factory=tuple)
    auto_keys: tuple[str, ...] = ()


#: DeepSpeed's gradient clipping when a config has no `gradient_clipping` key (0.19:
#: `GRADIENT_CLIPPING_DEFAULT = 1.0`); the export always writes the key.
DEEPSPEED_DEFAULT_CLIPPING = 1.0
