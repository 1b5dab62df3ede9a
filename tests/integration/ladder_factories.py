"""Model factories for the ladder's real runs (tests/integration/test_ladder_run.py)."""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.models import build_model

#: a forward of this many samples raises, on the third call of the module (mid-run)
FAILING_BATCH = 12


def mlp_failing_at_batch_12(**options: Any) -> tuple[Any, ...]:
    """The built-in MLP, except that its forward raises on a batch of FAILING_BATCH
    samples from its third call on: a rung with micro_batch=12 fails while it trains."""
    module, data, loss_fn, info = build_model("mlp", **options)

    class Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module
            self.calls = 0

        def forward(self, x: Any) -> Any:
            self.calls += 1
            if x.shape[0] == FAILING_BATCH and self.calls >= 3:
                raise RuntimeError(f"boom: a batch of {FAILING_BATCH}")
            return self.inner(x)

    return Failing(), data, loss_fn, info
