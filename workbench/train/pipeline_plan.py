"""`workbench.train.techniques.pipeline_plan`, importable at its earlier path too (the tutorials import it here)."""

from workbench.train.techniques.pipeline_plan import *  # noqa: F403
from workbench.train.techniques.pipeline_plan import __all__ as __all__
