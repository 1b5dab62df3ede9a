"""Measuring on the CPU what `workbench.estimate.peak` predicts: live bytes, inputs, models.

* `LiveBytes`: a `TorchDispatchMode` that counts the bytes of every storage an operator
  allocates while the mode is on, until that storage is freed (a weak reference on the
  storage fires when its last tensor dies), and the highest such sum (`peak_bytes`). A
  storage is fresh when an operator's return is not an alias of an input (the schema's
  `alias_info`): in-place ops and views allocate nothing. Storages that existed before the
  mode (parameters, gradients, optimizer states, inputs) are not counted. 0-dim tensors
  (a loss value, cross-entropy's total weight, a step counter: 4 to 8 bytes each) are
  left out with `scalars=False`, so that a figure in whole tensors compares exactly.
  `UntypedStorage.resize_` is not an operator: FSDP's resharding is not seen here (the
  FSDP test reads `FSDPMemTracker`, which patches it).
* `estimator_inputs(**keywords)`: `estimate_memory`'s checked inputs (`check_inputs`)
  for the keywords given and every other keyword at its default, the input of the
  module-level term functions of `workbench.estimate.peak`.
* `tiny_llama(...)`: a Hugging Face Llama built from a config (never downloaded), fp32,
  without dropout.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from workbench.estimate import estimate_memory
from workbench.estimate.inputs_check import EstimateInputs, check_inputs


class LiveBytes(TorchDispatchMode):
    """Live bytes of the storages allocated under the mode (see the module docstring)."""

    def __init__(self, *, scalars: bool = True) -> None:
        super().__init__()
        self.scalars = scalars
        self.live_bytes = 0
        self.peak_bytes = 0
        self._refs: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def reset_peak(self) -> int:
        """Start a new peak from the bytes live now; returns them."""
        self.peak_bytes = self.live_bytes
        return self.live_bytes

    def _freed(self, nbytes: int, _ref: Any) -> None:
        self.live_bytes -= nbytes

    def _fresh(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" or (t.dim() == 0 and not self.scalars):
            return
        st = t.untyped_storage()
        if st in self._refs:
            return
        nbytes = st.nbytes()
        self._refs[st] = weakref.ref(st, lambda ref, n=nbytes: self._freed(n, ref))
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        outputs = out if len(returns) > 1 else (out,)
        for ret, value in zip(returns, outputs, strict=False):
            if ret.alias_info is not None:  # a view or an in-place result: no allocation
                continue
            for t in tree_leaves(value):
                if isinstance(t, torch.Tensor):
                    self._fresh(t)
        return out


def estimator_inputs(**given: Any) -> EstimateInputs:
    """`estimate_memory`'s checked inputs: `given` over every keyword's default."""
    keywords = {
        name: p.default for name, p in inspect.signature(estimate_memory).parameters.items()
    }
    unknown = set(given) - set(keywords)
    if unknown:
        raise TypeError(f"estimate_memory has no keyword {sorted(unknown)}")
    return check_inputs({**keywords, **given})


def tiny_llama(
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 4,
    ffn: int = 96,
    vocab: int = 100,
    seq_len: int = 32,
    attention: str = "sdpa",
    tied: bool = False,
) -> torch.nn.Module:
    """A Hugging Face `LlamaForCausalLM` of the given shape (dropout 0, fp32, train mode)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        vocab_size=vocab,
        max_position_embeddings=seq_len,
        tie_word_embeddings=tied,
        attention_dropout=0.0,
        attn_implementation=attention,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.train()
    return model
