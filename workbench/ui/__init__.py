"""ipywidgets + matplotlib panels: thin views over the estimator, the Session and the
monitor. Each panel owns its refresh timer; `close()` stops it.

    import workbench
    d = workbench.dashboard(session)      # tabs: training, estimator, monitor, compression, ladder
    d                                     # display it (a PNG of the charts travels along)
"""

from workbench.ui.compress import CompressionPanel
from workbench.ui.dashboard import Dashboard, dashboard
from workbench.ui.estimator import EstimatorPanel
from workbench.ui.ladder import LadderPanel
from workbench.ui.monitor import MonitorPanel
from workbench.ui.training import TrainingPanel

__all__ = [
    "CompressionPanel",
    "Dashboard",
    "EstimatorPanel",
    "LadderPanel",
    "MonitorPanel",
    "TrainingPanel",
    "dashboard",
]
