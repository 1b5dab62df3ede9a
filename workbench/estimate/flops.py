"""One FLOP count for training a decoder: the estimator's time, the planner, the measured
utilisation of a Session's or an observed trainer's steps and the notebooks all use it.

Model FLOPs per token, forward and backward (what model FLOP utilisation, MFU, counts):

    6 N + 12 L q s

* N: the parameters a token multiplies: every parameter (a mixture of experts: the ones a
  token is routed through) except the input embedding's and a learned position table's,
  which are looked up, not multiplied. The output projection IS a matmul and counts (with
  tied embeddings too: the one matrix is looked up at the input and multiplied at the
  output). This is torchtitan's `get_num_flop_per_token(get_num_params(model,
  exclude_embedding=True), ...)`, which subtracts the token embedding only
  (pytorch/torchtitan `torchtitan/tools/utils.py`, `torchtitan/models/utils.py`), and
  PaLM's (Chowdhery et al. 2022, appendix B: "6N + 12LHQT ... N the number of parameters
  excluding embeddings"; PaLM ties its input and output embeddings, so its N leaves the
  lookup out and keeps no separate head, and the head's matmul is counted by torchtitan's).
  2 FLOPs a parameter in the forward (a multiply and an add), 4 in the backward (the
  gradient with respect to the input and to the weight).
* 12 L q s: the attention scores (Q K^T) and their product with the values, q = heads x
  head size wide over s positions: 2 matmuls x 2 FLOPs x q s a layer in the forward, twice
  that in the backward; the causal mask's halving not counted (torchtitan's and PaLM's
  convention), nor flash attention's own recomputation in its backward.

With frozen weights (LoRA) the backward skips their weight gradients: 4 N + 2 N_trained.

Hardware FLOPs (what hardware FLOP utilisation, HFU, counts; Korthikanti et al. 2022,
section 6) add what recomputation runs again: full activation checkpointing runs the
forward twice (+ 2 N + 4 L q s a token), selective recomputation the attention core's
forward (+ 4 L q s a token, the same paper's section 5), torchtitan's op-level selective
policy ("selective-op": every other matmul's output and the attention kernel's output kept)
half of the weight matmuls' forward (+ N a token). Time is hardware FLOPs over the
GPUs' peak x the rate they sustain; MFU is model FLOPs over the same time.

Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.estimate.architecture import Architecture

#: recomputation settings (the estimator's `checkpointing` names; TrainConfig's are the
#: first three and "full")
RECOMPUTE = ("none", "selective", "selective-op", "full")


@dataclass(frozen=True)
class FlopCount:
    """What a FLOP count reads of a model: the parameters a token multiplies
    (`matmul_params`: see the module docstring), `layers`, the attention width `q` (heads x
    head size) and the sequence `seq_len`."""

    matmul_params: int
    layers: int
    attention_width: int
    seq_len: int

    @property
    def attention_per_token(self) -> int:
        """12 L q s: the attention scores and their product with the values, forward and
        backward, a token."""
        return 12 * self.layers * self.attention_width * self.seq_len

    def model_per_token(self, trained_params: int | None = None) -> int:
        """Model FLOPs a token, forward and backward: 6 N + 12 L q s; with only
        `trained_params` of the weights training (LoRA) 4 N + 2 N_trained + 12 L q s."""
        n = self.matmul_params
        if trained_params is not None and trained_params < n:
            return 4 * n + 2 * trained_params + self.attention_per_token
        return 6 * n + self.attention_per_token

    def recomputed_per_token(self, recompute: str) -> int:
        """The forward FLOPs a token that `recompute` ("none", "selective", "full") runs
        again in the backward."""
        core = self.attention_per_token // 3  # 4 L q s: the attention core's forward
        if recompute == "full":
            return 2 * self.matmul_params + core
        if recompute == "selective":
            return core
        if recompute == "selective-op":  # every other matmul's output kept: half run again
            return self.matmul_params
        if recompute == "none":
            return 0
        raise ValueError(f"recompute={recompute!r}: must be one of {', '.join(RECOMPUTE)}")

    def hardware_per_token(self, recompute: str, trained_params: int | None = None) -> int:
        """Hardware FLOPs a token: the model's and what `recompute` runs again."""
        return self.model_per_token(trained_params) + self.recomputed_per_token(recompute)

    def step(
        self, tokens: float, recompute: str, trained_params: int | None = None
    ) -> tuple[float, float]:
        """(model FLOPs, hardware FLOPs) of `tokens` tokens."""
        model = float(self.model_per_token(trained_params) * tokens)
        return model, model + float(self.recomputed_per_token(recompute) * tokens)


def matmul_params(
    used_params: int, *, vocab: int, hidden: int, lookup_rows: int | None = None, tied: bool
) -> int:
    """The parameters a token multiplies: `used_params` (all, or a mixture of experts'
    active ones) less the input embedding's `vocab` x `hidden` and a learned position
    table's `lookup_rows` - `vocab` rows (`lookup_rows`: every row looked up, vocab +
    positions; `vocab` when not given), plus the output projection's vocab x hidden when it
    is tied to the embedding (counted once in `used_params`, multiplied at the output)."""
    rows = vocab if lookup_rows is None else lookup_rows
    return int(used_params - rows * hidden + (vocab * hidden if tied else 0))


def flop_count_of(arch: Architecture, used_params: int | None = None) -> FlopCount:
    """The `FlopCount` of an `Architecture`: its active parameters (or `used_params`, a
    counted module's, when given) less the lookups, its layers, attention width and
    sequence."""
    used = int(used_params if used_params is not None else arch.active_params)
    return FlopCount(
        matmul_params=matmul_params(
            used,
            vocab=arch.vocab,
            hidden=arch.hidden,
            lookup_rows=arch.vocab + arch.max_positions,
            tied=arch.tied_embeddings,
        ),
        layers=arch.layers,
        attention_width=arch.q_dim,
        seq_len=arch.seq_len,
    )


def utilisation(flops_per_token: float, tokens_per_s: float, gpus: int, peak_flops: float) -> float:
    """The share of `gpus` x `peak_flops` that `tokens_per_s` tokens a second of
    `flops_per_token` each is: MFU with model FLOPs a token, HFU with hardware FLOPs."""
    return float(flops_per_token * tokens_per_s / (gpus * peak_flops))


__all__ = ["RECOMPUTE", "FlopCount", "flop_count_of", "matmul_params", "utilisation"]
