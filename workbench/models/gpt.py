"""`tiny-gpt`: a small character-level GPT (nanoGPT-style) on Shakespeare's sonnets.

The model is built so that Korthikanti et al. (2022), Table 2, describes what it keeps
for the backward pass, tensor by tensor (`workbench.estimate.transformer_activation_bytes`):

per block (pre-LN), with s sequence length, b micro-batch, h hidden, a heads,
"elements" in the activation dtype and 1-byte dropout masks:

    ln_1 input                 sbh     (layer_norm saves its input)
    qkv linear input           sbh     (the ln_1 output)
    Q, K, V                    3sbh    (the two batched matmuls save them)
    softmax output             as^2b   (`ScaledMaskedSoftmax` saves only its output)
    attention dropout          as^2b mask + as^2b output (saved by the matmul with V)
    projection input           sbh
    projection dropout         sbh mask
    ln_2 input                 sbh
    fc input                   sbh
    GELU input                 4sbh
    fc_proj input (GELU out)   4sbh
    MLP dropout                sbh mask

Attention is written out by hand by default (no fused scaled_dot_product_attention, which
stores no `as^2b` terms); `CausalSelfAttention.kernel = "sdpa"` (the Session's
`attention="sdpa"`) runs PyTorch's fused kernel instead, the estimator's "sdpa" terms. Scaling, causal masking and softmax are one autograd function that
computes in fp32 and stores its output in the compute dtype, as Megatron's fused
softmax does, so the softmax runs in fp32 under autocast without storing fp32 scores.

Measured against the formula (`Session.memory()`, tests/integration/test_memory.py):
fp32 within 1%. The remaining extras are layer-norm mean/rstd (two fp32 values per
token per layer norm) and the int64 token ids kept by the embedding and the loss.

Under torch autocast (amp-bf16, amp-fp16) the residual stream (embeddings, residual
adds) is not autocast and stays fp32, so each layer-norm input takes 4 bytes per element
instead of 2 (+4sbh bytes per layer, +10% at the default size), and with full activation
checkpointing the kept block inputs are that fp32 stream too (4sbh instead of 2sbh per
layer). The formula counts both (`workbench.estimate.implementations`: before it did, amp
measured 10% over it, and amp with checkpointing 1.7x). Keeping the residual stream in 16
bits (as Megatron's fp16 models do) would save them at the cost of precision in the
residual sums; torch AMP does not.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.utils.data import Dataset

from workbench.inputs import shown

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TEXT = DATA_DIR / "sonnets.txt"


class ScaledMaskedSoftmax(torch.autograd.Function):
    """softmax(scale * scores with the causal mask) computed in fp32; saves only the
    output, in the input dtype (Megatron's FusedScaleMaskSoftmax does the same)."""

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        probs = torch.softmax(scores.float().mul(scale).masked_fill(mask, float("-inf")), dim=-1)
        out = probs.to(scores.dtype)
        ctx.scale = scale
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (out,) = ctx.saved_tensors
        y = out.float()
        g = grad_out.float()
        grad = y * (g - (g * y).sum(dim=-1, keepdim=True)) * ctx.scale
        return grad.to(grad_out.dtype), None, None


class MaskDropout(nn.Module):
    """Dropout that keeps a 1-byte mask for backward on every device.

    `nn.Dropout` on CPU multiplies by a float noise tensor and so keeps 4 bytes per
    element; `torch.native_dropout` keeps a bool mask, as the fused CUDA kernel does.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]

    def extra_repr(self) -> str:
        return f"p={self.p}"


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"heads={heads}: must divide hidden={hidden} evenly")
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.attn_drop = MaskDropout(dropout)
        self.resid_drop = MaskDropout(dropout)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)
        #: "eager": written out (the module docstring's terms); "sdpa": PyTorch's fused
        #: scaled_dot_product_attention, which keeps no s x s tensors for backward
        self.kernel = "eager"
        #: True: the core (scores to the product with V) runs under checkpoint and is
        #: recomputed in backward (selective recomputation, workbench.train.techniques.recompute)
        self.recompute_core = False
        #: called with the core's inputs when it is recomputed (what its checkpoint keeps:
        #: Session.memory() counts them), and the checkpoint's `context_fn` (a dry run's)
        self.core_inputs_observer: Any = None
        self.core_context_fn: Any = None

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        """`blocked`: None for plain causal attention, else a document batch's mask
        (`document_mask`: causal and across documents), (b, 1, s, s): for the eager path a
        bool tensor, True where a query must not see a key; for sdpa the same as an
        additive bias in the compute dtype (`document_bias`: 0 or -inf), one tensor every
        layer's kernel keeps for backward (a bool `attn_mask` would be converted, and
        kept, once per layer). Any `attn_mask` rules out the flash kernel on a GPU
        (PyTorch's memory-efficient or math kernel runs)."""
        b, s, h = x.shape
        d = h // self.heads
        # q, k, v as thirds of the output and heads = width / d: under tensor parallelism
        # this rank's slice of `qkv` holds its heads' q, k and v (workbench.train.techniques.tensor_plan)
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q = q.reshape(b, s, -1, d).transpose(1, 2)
        k = k.reshape(b, s, -1, d).transpose(1, 2)
        v = v.reshape(b, s, -1, d).transpose(1, 2)
        if self.recompute_core and torch.is_grad_enabled():
            if self.core_inputs_observer is not None:
                for t in (q, k, v, blocked):
                    if t is not None:
                        self.core_inputs_observer(t)
            extra = {"context_fn": self.core_context_fn} if self.core_context_fn else {}
            y = torch.utils.checkpoint.checkpoint(
                self._core, q, k, v, blocked, use_reentrant=False, **extra
            )
        else:
            y = self._core(q, k, v, blocked)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, s, -1)))

    def _core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocked: torch.Tensor | None
    ) -> torch.Tensor:
        """softmax(q k^T / sqrt(d), masked) (dropped out) times v: (b, heads, s, d)."""
        s, d = q.shape[-2], q.shape[-1]
        if self.kernel == "sdpa":
            p = self.attn_drop.p if self.training else 0.0
            if blocked is None:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=blocked, dropout_p=p)
        scores = q @ k.transpose(-2, -1)
        mask = self.causal_mask[:s, :s] if blocked is None else blocked
        att = ScaledMaskedSoftmax.apply(scores, mask, 1.0 / math.sqrt(d))
        att = self.attn_drop(att)
        y: torch.Tensor = att @ v
        return y


class MLP(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_proj = nn.Linear(4 * hidden, hidden)
        self.drop = MaskDropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc_proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block; marked checkpointable (see workbench.train.techniques.recompute)."""

    _workbench_checkpointable = True

    def __init__(self, hidden: int, heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, seq_len, dropout)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, dropout)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + (self.attn(h) if blocked is None else self.attn(h, blocked))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """Token + learned position embeddings, `layers` pre-LN blocks, final layer norm and
    an output head tied to the token embedding. Returns logits (b, s, vocab).

    Parameter count: 12Lh^2 + 13Lh + Vh + sh + 2h, the formula of
    `workbench.estimate.activations.params_from_shape`.
    """

    def __init__(
        self,
        *,
        vocab: int,
        seq_len: int = 64,
        layers: int = 4,
        hidden: int = 128,
        heads: int = 4,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.drop = MaskDropout(dropout)
        self.blocks = nn.ModuleList(Block(hidden, heads, seq_len, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2 scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (b, s, vocab) of token ids `idx` (b, s).

        A document batch (`DocumentDataset`, given as `model(**batch)`) adds `doc_ids`
        (b, s): a token attends only to earlier tokens of its own document (padding has
        id -1, so no real token sees it), and `positions` (b, s): the learned position
        embedding of each token's place in its document. `labels` are the loss's
        (`document_loss` reads them from the batch); the forward does not use them.
        """
        del labels
        s = idx.shape[1]
        if s > self.seq_len:
            raise ValueError(f"sequence length {s}: the model was built for seq_len={self.seq_len}")
        pos = torch.arange(s, device=idx.device) if positions is None else positions
        blocked = None
        if doc_ids is not None:
            blocked = document_mask(doc_ids)
            if self.blocks and getattr(self.blocks[0].attn, "kernel", "eager") == "sdpa":
                blocked = document_bias(blocked, self.wte.weight.dtype)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x, blocked) if blocked is not None else block(x)
        return self.head(self.ln_f(x))


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """The block-diagonal causal mask of a document batch: (b, 1, s, s) bool, True where
    query i must not see key j (j > i, or j in another document than i). One byte per
    (query, key) pair of each sample, shared by every layer."""
    s = doc_ids.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=doc_ids.device).triu(1)
    other = doc_ids.unsqueeze(2) != doc_ids.unsqueeze(1)
    return (other | causal).unsqueeze(1)


def document_bias(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`document_mask`'s mask as sdpa's additive `attn_mask`: 0 where a query sees a key,
    -inf where not, in the compute dtype (autocast's when it is on, else `dtype`), so the
    kernel takes it as it is."""
    device = blocked.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    bias = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device)
    return bias.masked_fill(blocked, float("-inf"))


class CharDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every window of `seq_len + 1` characters: x = chars[i:i+s], y = chars[i+1:i+s+1]."""

    def __init__(self, text: str, seq_len: int) -> None:
        if len(text) <= seq_len + 1:
            raise ValueError(f"text of {len(text)} characters is too short for seq_len={seq_len}")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.int64)
        self.seq_len = seq_len

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return len(self.data) - self.seq_len - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i : i + self.seq_len + 1]
        return chunk[:-1], chunk[1:]

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


#: The document layouts of the built-in text (`TrainConfig.documents`; "stream" is
#: `CharDataset`).
DOCUMENT_LAYOUTS = ("padded", "packed")
#: The label of a target that carries no loss (`F.cross_entropy`'s default ignore_index).
IGNORE = -100
_NUMERAL = re.compile(r"[IVXLC]+")


def split_documents(text: str) -> list[str]:
    """The documents of a text: with lines that are only a roman numeral (the sonnets'
    headings), the text between two headings is one document (the heading itself and what
    comes before the first one, the title, are not); without such lines, each paragraph
    (blank lines between). Each document without its leading and trailing blank lines."""
    lines = text.split("\n")
    heads = [i for i, line in enumerate(lines) if _NUMERAL.fullmatch(line.strip())]
    if heads:
        ends = [*heads[1:], len(lines)]
        parts = ["\n".join(lines[a + 1 : b]) for a, b in zip(heads, ends, strict=True)]
    else:
        parts = re.split(r"\n\s*\n", text)
    return [d for d in (part.strip("\n") for part in parts) if d.strip()]


@dataclass(frozen=True)
class DocumentReport:
    """What a document layout costs, over one epoch of its samples: `slot_tokens` (samples
    x seq_len), `real_tokens` (the documents' tokens and their end-of-document tokens),
    `loss_tokens` (targets that carry a loss), `dropped_tokens` (cut off by "padded"'s
    truncation to seq_len)."""

    documents: str  # the layout: "padded" or "packed"
    document_count: int
    samples: int
    seq_len: int
    slot_tokens: int
    real_tokens: int
    loss_tokens: int
    dropped_tokens: int

    @property
    def padding_tokens(self) -> int:
        return self.slot_tokens - self.real_tokens

    @property
    def padding_fraction(self) -> float:
        """The share of the samples' token slots that are padding."""
        return self.padding_tokens / self.slot_tokens

    def real_tokens_per_s(self, tokens_per_s: float | None) -> float | None:
        """Real tokens per second at a step's `tokens_per_s` (every slot counted), for
        this epoch's share of padding."""
        return None if tokens_per_s is None else tokens_per_s * (1.0 - self.padding_fraction)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "padding_tokens": self.padding_tokens,
            "padding_fraction": self.padding_fraction,
        }


class DocumentDataset(Dataset[dict[str, torch.Tensor]]):
    """The text's documents (`split_documents`) as samples of `seq_len` tokens, each a dict
    for `model(**batch)`: `idx` (token ids), `labels` (the next token, `IGNORE` where no
    loss is taken), `doc_ids` (the document of each token, -1 for padding) and `positions`
    (each token's place in its document). Every document ends with an end-of-document
    token, `eos` (id `vocab - 1`, one past the text's characters), also the padding's id.

    * "padded": one document per sample, cut to its first `seq_len` tokens (the rest is
      dropped: `dropped_tokens`) and padded to `seq_len`; padding takes no loss and no real
      token attends to it.
    * "packed": the documents one after another, cut into windows of `seq_len` tokens (a
      document may run on into the next window; its positions there restart at 0); only
      the last window is padded. A token attends only to its own document.

    Targets: each document's characters predict the next one and its last character
    predicts `eos`; the `eos` token's own target (the next document's first character)
    is `IGNORE`, so nothing is predicted across a boundary. The loss (`document_loss`)
    is the mean over the targets that are not `IGNORE`.

    What the layout costs: `slot_tokens` (samples x seq_len), `real_tokens` (not padding)
    and `padding_fraction` = 1 - real / slots; `report()` gives them as a `DocumentReport`.
    """

    def __init__(self, text: str, seq_len: int, layout: str) -> None:
        if layout not in DOCUMENT_LAYOUTS:
            raise ValueError(
                f"documents={shown(layout)}: must be one of {', '.join(DOCUMENT_LAYOUTS)}"
            )
        docs = split_documents(text)
        if not docs:
            raise ValueError("the text has no documents (no non-empty paragraph)")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.eos = len(self.chars)
        self.layout, self.seq_len, self.documents = layout, seq_len, len(docs)
        ids = [[self.stoi[c] for c in d] + [self.eos] for d in docs]
        rows = self._padded(ids) if layout == "padded" else self._packed(ids)
        if not rows:
            raise ValueError(f"the text's {len(docs)} documents give no sample")
        self.real_tokens = sum(sum(1 for d in r[2] if d >= 0) for r in rows)
        self.loss_tokens = sum(sum(1 for t in r[1] if t != IGNORE) for r in rows)
        self.slot_tokens = len(rows) * seq_len
        self.dropped_tokens = sum(len(t) for t in ids) - self.real_tokens
        names = ("idx", "labels", "doc_ids", "positions")
        self.tensors = {
            name: torch.tensor([r[k] for r in rows], dtype=torch.int64)
            for k, name in enumerate(names)
        }

    def _padded(self, ids: list[list[int]]) -> list[tuple[list[int], ...]]:
        s, rows = self.seq_len, []
        for tokens in ids:
            seq = tokens[: s + 1]
            n = min(len(seq), s)
            labels = seq[1 : s + 1] + [IGNORE] * (s - len(seq) + 1)
            rows.append(
                (
                    seq[:n] + [self.eos] * (s - n),
                    labels[:s],
                    [0] * n + [-1] * (s - n),
                    list(range(n)) + [0] * (s - n),
                )
            )
        return rows

    def _packed(self, ids: list[list[int]]) -> list[tuple[list[int], ...]]:
        s = self.seq_len
        stream = [t for tokens in ids for t in tokens]
        doc = [k for k, tokens in enumerate(ids) for _ in tokens]
        rows = []
        for start in range(0, len(stream), s):
            end = min(start + s, len(stream))
            n = end - start
            labels = [
                stream[i + 1] if i + 1 < len(stream) and doc[i + 1] == doc[i] else IGNORE
                for i in range(start, end)
            ]
            positions, place = [], 0
            for i in range(start, end):
                place = 0 if i == start or doc[i] != doc[i - 1] else place + 1
                positions.append(place)
            rows.append(
                (
                    stream[start:end] + [self.eos] * (s - n),
                    labels + [IGNORE] * (s - n),
                    doc[start:end] + [-1] * (s - n),
                    positions + [0] * (s - n),
                )
            )
        return rows

    @property
    def vocab(self) -> int:
        return len(self.chars) + 1

    @property
    def padding_fraction(self) -> float:
        """The share of the samples' token slots that are padding."""
        return self.report().padding_fraction

    def report(self) -> DocumentReport:
        """The layout and what it costs (see `DocumentReport`)."""
        return DocumentReport(
            documents=self.layout,
            document_count=self.documents,
            samples=len(self),
            seq_len=self.seq_len,
            slot_tokens=self.slot_tokens,
            real_tokens=self.real_tokens,
            loss_tokens=self.loss_tokens,
            dropped_tokens=self.dropped_tokens,
        )

    def __len__(self) -> int:
        return int(self.tensors["idx"].shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {name: t[i] for name, t in self.tensors.items()}

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] if int(i) < self.eos else "" for i in ids)


def document_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32) over the micro-batch's targets that carry a
    loss (`labels` not `IGNORE`): normalised per real token, so padding changes nothing."""
    labels = batch["labels"]
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE
    )


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-character cross-entropy over all positions (computed in fp32)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


#: The largest text file `load_text` reads (the sonnets are 95 kB).
MAX_TEXT_BYTES = 256 << 20


def load_text(path: str | Path | None = None) -> str:
    """The training text: `path` (a regular UTF-8 file of at most 256 MiB) or the sonnets."""
    from workbench.inputs import InputFileError, read_text

    try:
        return read_text(
            path or DEFAULT_TEXT, what="model 'tiny-gpt': text", max_bytes=MAX_TEXT_BYTES
        )
    except InputFileError as exc:
        raise ValueError(str(exc)) from None
