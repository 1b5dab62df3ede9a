"""How a model splits into pipeline stages (`pp` > 1): which layers each stage holds.

`pipeline_stage(model, pp, stage)` cuts the built-in GPT (`workbench.models.gpt.TinyGPT`)
into `pp` stages of `layers / pp` consecutive blocks each (Megatron's layout, the
estimator's `Architecture.stage_params`): the first stage also holds the token and
position embeddings, the last the final norm and the output head. The stage is a
`GPTStage` module holding the model's own submodules under their own names
(`blocks.2.ln_1.weight` stays `blocks.2.ln_1.weight`), so weights and optimizer state
move by name. The tied head: on a last stage that is not also the first, the head gets
its own copy of the embedding matrix (`TIED_COPY`, "head.weight", carried as
"wte.weight"); the engine sums the two copies' gradients after each backward so they
stay equal.

Pure description: nothing distributed here (`workbench.train.backends.pipeline` runs the
stages through `torch.distributed.pipelining`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from workbench.config import SettingProblem

#: The last stage's own copy of a tied head, and the weight it copies.
TIED_COPY = ("head.weight", "wte.weight")

#: The families `pipeline_stage` splits, as users read them in errors.
PIPELINE_FAMILIES = "the built-in GPT (tiny-gpt)"


class GPTStage(nn.Module):
    """One pipeline stage of a `TinyGPT`: the embeddings (first stage), its blocks, the
    final norm and head (last stage). Takes token ids (first stage) or the previous
    stage's hidden states; returns hidden states, or logits on the last stage."""

    def __init__(self, model: nn.Module, blocks: list[int], *, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe, self.drop = model.wte, model.wpe, model.drop
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in blocks})
        if last:
            self.ln_f = model.ln_f
            self.head = model.head
            if not first and model.head.weight is model.wte.weight:
                head = copy.copy(model.head)  # the tied matrix's own copy on this stage
                head.weight = nn.Parameter(model.wte.weight.detach().clone())
                self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            return self.head(self.ln_f(x))  # type: ignore[no-any-return]
        return x


def stage_blocks(layers: int, pp: int, stage: int) -> list[int]:
    """The block indices stage `stage` of `pp` holds: `layers / pp` consecutive ones."""
    per = layers // pp
    return list(range(stage * per, (stage + 1) * per))


def pipeline_stage(model: nn.Module, pp: int, stage: int) -> GPTStage:
    """Stage `stage` of `model` cut into `pp` (ValueError naming `pp` or the model when it
    cannot be cut so)."""
    problem = pp_model_problem(model, pp)
    if problem is not None:
        raise ValueError(str(problem))
    layers = len(model.blocks)  # type: ignore[arg-type]
    return GPTStage(model, stage_blocks(layers, pp, stage), first=stage == 0, last=stage == pp - 1)


def pp_model_problem(model: nn.Module, pp: int) -> SettingProblem | None:
    """What stops `model` splitting into `pp` stages (None when nothing does, or pp=1)."""
    from workbench.models.gpt import TinyGPT

    if int(pp) == 1:
        return None
    if not isinstance(model, TinyGPT):
        return SettingProblem(
            "pp",
            int(pp),
            f"{type(model).__name__} has no pipeline split; `pp` > 1 splits {PIPELINE_FAMILIES}",
        )
    layers = len(model.blocks)
    if pp > layers:
        return SettingProblem("pp", int(pp), f"more stages than the model's {layers} layers")
    if layers % pp:
        return SettingProblem("pp", int(pp), f"must divide the model's {layers} layers evenly")
    return None


__all__ = [
    "PIPELINE_FAMILIES",
    "TIED_COPY",
    "GPTStage",
    "pipeline_stage",
    "pp_model_problem",
    "stage_blocks",
]
