"""Observe a run the workbench does not own: your Hugging Face `Trainer`, your Lightning
`Trainer`, your own loop.

    from workbench.integrations import WorkbenchTrainerCallback      # transformers
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[cb := WorkbenchTrainerCallback()])
    trainer.train(); workbench.dashboard(cb.observer)

    from workbench.integrations import WorkbenchLightningCallback    # Lightning
    L.Trainer(callbacks=[cb := WorkbenchLightningCallback()]).fit(module, loader)

    with workbench.observe(model, optimizer, micro_batch=8) as obs:  # your loop
        ...; obs.step(loss)

Each records every optimizer step into the `StepRecord` stream a Session publishes, with
the memory prediction for the trainer's own settings (read from its arguments or strategy)
and advice naming your trainer's argument (`workbench.integrations.observer`). The
callbacks import transformers / Lightning only when used.
"""

from __future__ import annotations

from typing import Any

from workbench.integrations.observer import Observer, observe

__all__ = ["Observer", "WorkbenchLightningCallback", "WorkbenchTrainerCallback", "observe"]


def __getattr__(name: str) -> Any:
    if name == "WorkbenchTrainerCallback":
        from workbench.integrations.hf import WorkbenchTrainerCallback

        return WorkbenchTrainerCallback
    if name == "WorkbenchLightningCallback":
        from workbench.integrations.lightning import WorkbenchLightningCallback

        return WorkbenchLightningCallback
    raise AttributeError(f"module 'workbench.integrations' has no attribute {name!r}")
