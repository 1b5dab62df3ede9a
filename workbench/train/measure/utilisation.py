"""The measured FLOP utilisation of a run: a Session's or a watched trainer's own steps.

    from workbench.train.measure.utilisation import measured_utilisation
    u = measured_utilisation(session, model="llama-3-8b", seq_len=4096)
    print(u.text())     # tokens/s, MFU and HFU, each named, on the GPU it ran on

The steps are read as `plan(calibrate=...)` reads them (`workbench.planner.efficiency.
measured_step`: a Session, an observer, their StepRecords or a run's log.jsonl; the steps
after warm-up of the last settings, all their tokens over all their seconds), the FLOPs a token are the one count
(`workbench.estimate.flops`, of the model as `estimate_memory` takes it: a preset, a
config.json or the module itself), and the peak is the catalog's for the GPU (named, or the
one this process sees). MFU counts the model's FLOPs, HFU the recomputed forward too; the
HFU is the efficiency `plan(calibrate=...)` takes for its next ranking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.inputs import shown


@dataclass(frozen=True)
class Utilisation:
    """A run's measured throughput and utilisations (see the module docstring)."""

    tokens_per_s: float
    gpus: int
    gpu: str
    recompute: str
    model_flops_per_token: int
    hardware_flops_per_token: int
    mfu: float
    hfu: float
    steps: int

    def text(self) -> str:
        return (
            f"{self.tokens_per_s:,.0f} tokens/s on {self.gpus} x {self.gpu} (the tokens of "
            f"{self.steps} step(s) after warm-up over their seconds, {self.recompute} "
            f"recomputation): MFU {self.mfu:.1%} "
            f"(model FLOPs, {self.model_flops_per_token / 1e9:,.2f} GFLOP a token), HFU "
            f"{self.hfu:.1%} (with the recomputed forward)"
        )


def measured_utilisation(
    steps: Any, *, model: Any = None, gpu: str | None = None, **shape: Any
) -> Utilisation:
    """The MFU and HFU of `steps` (a Session, an observer, StepRecords or a log.jsonl) for
    `model` (as `estimate_memory` takes it, with its `shape` keywords, e.g. seq_len) on
    `gpu` (a catalog name; the local CUDA device's when not given). ValueError naming the
    input: no measured step (and where one comes from), a GPU not in the catalog."""
    from workbench.estimate import estimate_memory, find_gpu
    from workbench.planner.efficiency import measured_step

    try:
        step = measured_step(steps)
    except ValueError as exc:  # the planner's words name its keyword: here it is `steps`
        text = str(exc)
        if text.startswith("calibrate="):
            raise ValueError("steps=" + text.removeprefix("calibrate=")) from None
        raise
    if gpu is None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "gpu=None: no CUDA device here to read the peak of; name the GPU the steps "
                "ran on (a catalog name, e.g. gpu='h100')"
            )
        gpu = torch.cuda.get_device_name(0)
    spec = find_gpu(gpu)
    if isinstance(spec, str):
        raise ValueError(f"gpu={shown(gpu)}: {spec}")
    count = estimate_memory(model=model, **shape).flop_count
    assert count is not None
    sixteen = step.precision != "fp32"
    peak = spec.peak_flops(sixteen, bf16="bf16" in step.precision) or spec.peak_fp32_flops
    model_flops = count.model_per_token()
    hardware = count.hardware_per_token(step.recompute)
    per_gpu = step.tokens_per_s / step.world_size
    return Utilisation(
        tokens_per_s=step.tokens_per_s,
        gpus=step.world_size,
        gpu=spec.name,
        recompute=step.recompute,
        model_flops_per_token=model_flops,
        hardware_flops_per_token=hardware,
        mfu=model_flops * per_gpu / peak,
        hfu=hardware * per_gpu / peak,
        steps=step.steps,
    )


__all__ = ["Utilisation", "measured_utilisation"]
