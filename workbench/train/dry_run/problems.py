"""`DryRunError`: why a dry run (`workbench.train.dry_run.simulate_memory`) cannot run, as data.

Each problem is a `SettingProblem` naming the argument or setting at fault (`model`,
`batch`, `world_size`, `zero_stage`, ...), so the Python API and the command line word it
from the same data. A model that fails on fake tensors also carries the innermost module
running when it failed (`module`) and the operator (`operator`); `formula` is the formula's
estimate of the same setup when it could be made (the estimate still answers when the dry
run cannot). Pure: imports nothing but the leaves.
"""

from __future__ import annotations

from typing import Any

from workbench.problems import SettingProblem, listing


class DryRunError(ValueError):
    """A `ValueError` listing every reason a dry run cannot run (`.problems`, as
    `SettingProblem`s), with `module` (the innermost module running when the model failed,
    by its name in the model, or None), `operator` (the operator that failed, or None) and
    `formula` (the `MemoryEstimate` of the same setup, or None)."""

    def __init__(
        self,
        problems: list[SettingProblem],
        *,
        module: str | None = None,
        operator: str | None = None,
        formula: Any = None,
    ) -> None:
        self.problems = list(problems)
        self.module = module
        self.operator = operator
        self.formula = formula
        super().__init__(
            listing([str(p) for p in self.problems], "cannot dry-run", "problems stop the dry run")
        )


__all__ = ["DryRunError"]
