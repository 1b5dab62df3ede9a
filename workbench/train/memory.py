"""`workbench.train.measure.memory`, importable at its earlier path too (the tutorials import it here)."""

from workbench.train.measure.memory import *  # noqa: F403
