"""DeepSpeed: TrainConfig <-> DeepSpeed JSON, both directions, checked by DeepSpeed's code.

* `to_json`: `to_deepspeed(config, world_size)`, the dict `deepspeed.initialize` accepts
  (the DeepSpeed backend trains with exactly this dict, and `workbench export` writes it).
* `from_json`: `import_deepspeed(source)` reads a DeepSpeed config (a dict or a JSON
  path) into a `DeepSpeedImport` (the TrainConfig, the world size the batch keys imply,
  the warnings); `from_deepspeed(source)` is the same, issuing the warnings with
  `warnings.warn` and returning the TrainConfig. `blocks` reads each block, `reader`
  checks the config's shape.
* `keys`: the DeepSpeed keys and names both directions share.
* `check`: what DeepSpeed itself accepts, checked with DeepSpeed's own classes.

Importing this package imports neither torch nor DeepSpeed (`check` imports them on first
use). Every `import deepspeed` here is absolute: it means the DeepSpeed library.
"""

from __future__ import annotations

from workbench.deepspeed.from_json import from_deepspeed, import_deepspeed
from workbench.deepspeed.keys import (
    BATCH_KEYS,
    DEEPSPEED_DEFAULT_CLIPPING,
    MODELLED_TOP_LEVEL,
    ZERO_TESTED_OPTIMIZERS,
    DeepSpeedImport,
)
from workbench.deepspeed.reader import MAX_DEPTH, MAX_INTEGER
from workbench.deepspeed.to_json import to_deepspeed

__all__ = [
    "BATCH_KEYS",
    "DEEPSPEED_DEFAULT_CLIPPING",
    "MAX_DEPTH",
    "MAX_INTEGER",
    "MODELLED_TOP_LEVEL",
    "ZERO_TESTED_OPTIMIZERS",
    "DeepSpeedImport",
    "from_deepspeed",
    "import_deepspeed",
    "to_deepspeed",
]
