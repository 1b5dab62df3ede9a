"""The lock over torch's process-wide random number generators.

torch's global generators (`torch.manual_seed`, dropout, `torch.randn` without a generator)
are one per process, while each Session draws its own stream (`workbench.train.runtime.
RngStream`). A stream is put into the global generators only while `GLOBAL_RNG_LOCK` is
held, and so is anything else that moves them for a while: a built-in model's seeded build
(`workbench.models.build_model`), `torch.random.fork_rng` around a Session's probe. So a
Session created, or probed, while another trains in a background thread never changes the
other's dropout masks.

Imports nothing of the package and no torch: the models and the training loop both use it.
"""

from __future__ import annotations

import threading

#: Held while torch's global generators hold something other than what the caller found.
GLOBAL_RNG_LOCK = threading.RLock()

__all__ = ["GLOBAL_RNG_LOCK"]
