"""`workbench.train.measure.plan_probe`, importable at its earlier path too (the tutorials import it here)."""

from workbench.train.measure.plan_probe import *  # noqa: F403
from workbench.train.measure.plan_probe import __all__ as __all__
