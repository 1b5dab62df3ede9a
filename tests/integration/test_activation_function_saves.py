"""The table of `workbench.estimate.activation_functions` against torch's autograd: for
every activation transformers' `ACT2FN` names (and BLOOM's own), the MLP inner tensors an
MLP `fc2(act(fc1(x)))` (and a gated `down(act(gate(x)) * up(x))`) saves for backward,
counted once per storage (`saved_tensors_hooks`), without parameters and the input:

* in one dtype: fp32, pure bf16 and CPU autocast (whose lists keep every op of these
  activations in bf16), real tensors on the CPU;
* under CUDA autocast: CPU autocast with each op's dtype taken from torch's own CUDA
  autocast kernels (`CudaAutocastLists`: the op dispatched on fake CUDA tensors with the
  CUDA autocast key on, which needs no GPU) wherever they give fp32 and CPU's bf16;
* compiled (inductor, on this CPU): the tensors the compiled forward hands its backward.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from transformers.activations import ACT2CLS, ACT2FN

from workbench.estimate.activation_functions import ACTIVATION_FUNCTIONS, TRANSFORMERS_NAMES

N, H, F = 64, 16, 128  # tokens, hidden, MLP inner size


def _dtype_on(device: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The dtype `func` gives under `device`'s autocast (bf16), on fake tensors."""

    def fake(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return torch.empty(v.shape, dtype=v.dtype, device=device)
        if isinstance(v, (list, tuple)):
            return type(v)(fake(x) for x in v)
        return v

    with FakeTensorMode():
        fake_args, fake_kwargs = fake(args), {k: fake(v) for k, v in kwargs.items()}
        was, dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        torch.set_autocast_enabled(device, True)
        torch.set_autocast_dtype(device, torch.bfloat16)
        try:
            out = func(*fake_args, **fake_kwargs)
        finally:
            torch.set_autocast_enabled(device, was)
            torch.set_autocast_dtype(device, dtype)
    return out.dtype if isinstance(out, torch.Tensor) else None


class CudaAutocastLists(TorchFunctionMode):
    """Inside CPU autocast: an op that CUDA autocast runs in fp32 and CPU autocast in bf16
    (`pow`, `square`, `softplus`, ...) runs as CUDA's does, its bf16 inputs cast to fp32
    (autocast's own cast) and the op outside autocast."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        sixteen = any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)
        if sixteen and torch.is_autocast_enabled("cpu"):
            try:
                cuda, cpu = (
                    _dtype_on("cuda", func, args, kwargs),
                    _dtype_on("cpu", func, args, kwargs),
                )
            except Exception:  # not an op (a method without fake kernels): as CPU runs it
                cuda = cpu = None
            if cuda == torch.float32 and cpu == torch.bfloat16:
                up = tuple(
                    a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a
                    for a in args
                )
                with torch.autocast("cpu", enabled=False):
                    return func(*up, **kwargs)
        return func(*args, **kwargs)


class _Mlp(nn.Module):
    def __init__(self, act: nn.Module, gated: bool) -> None:
        super().__init__()
        self.fc1, self.up, self.fc2, self.act, self.gated = (
            nn.Linear(H, F), nn.Linear(H, F), nn.Linear(F, H), act, gated,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        return self.fc2(h * self.up(x) if self.gated else h)


def _activation(name: str) -> nn.Module:
    if name == "bloom_gelu":
        from transformers.models.bloom.modeling_bloom import BloomGelu

        return BloomGelu()
    return ACT2FN[name]


def _saved(name: str, gated: bool, mode: str) -> tuple[int, int]:
    """(bf16, fp32) MLP-wide tensors saved for backward; `mode` "fp32", "bf16" (pure),
    "cpu" (CPU autocast) or "cuda" (CUDA autocast's lists)."""
    torch.manual_seed(0)
    model = _Mlp(_activation(name), gated)
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    model.to(dtype)
    x = torch.randn(N, H, dtype=dtype, requires_grad=True)
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x]}
    seen: dict[int, torch.dtype] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        where = t.untyped_storage().data_ptr()
        if where not in skip and t.untyped_storage().nbytes() >= N * F * 2:
            seen[where] = t.dtype
        return t

    with contextlib.ExitStack() as stack:
        if mode in ("cpu", "cuda"):
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        if mode == "cuda":
            stack.enter_context(CudaAutocastLists())
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        model(x)
    dtypes = list(seen.values())
    return dtypes.count(torch.bfloat16), dtypes.count(torch.float32)


def test_the_table_names_every_activation_transformers_runs_but_xielu() -> None:
    """xIELU is left out (its learned parameters mix dtypes under autocast): a config that
    names it is estimated with the MLP's default, and says so."""
    assert set(TRANSFORMERS_NAMES) == set(ACT2CLS) - {"xielu"}


@pytest.mark.parametrize("gated", [False, True], ids=["two-matrix", "gated"])
@pytest.mark.parametrize("name", list(ACTIVATION_FUNCTIONS))
def test_each_activation_keeps_the_table_s_tensors(name: str, gated: bool) -> None:
    row = ACTIVATION_FUNCTIONS[name]
    kept = row.gated if gated else row.two
    assert _saved(name, gated, "fp32") == (0, kept.tensors)
    assert _saved(name, gated, "bf16") == (kept.tensors, 0)
    assert _saved(name, gated, "cpu") == (kept.tensors, 0)  # CPU autocast: all bf16
    assert _saved(name, gated, "cuda") == kept.autocast


def test_cuda_autocast_runs_pow_in_fp32_and_tanh_in_bf16() -> None:
    """What the CUDA column rests on: torch's CUDA autocast kernels, read on fake tensors."""
    x = torch.zeros(2, 2, dtype=torch.bfloat16)
    assert _dtype_on("cuda", torch.pow, (x, 3.0), {}) == torch.float32
    assert _dtype_on("cpu", torch.pow, (x, 3.0), {}) == torch.bfloat16
    assert _dtype_on("cuda", torch.tanh, (x,), {}) == torch.bfloat16


@pytest.mark.parametrize(
    ("name", "gated"), [("gelu_new", False), ("relu", False), ("gelu_new", True)]
)
def test_compiled_the_activation_s_chain_is_recomputed(name: str, gated: bool) -> None:
    """Inductor's partitioner keeps the matmul outputs: a two-matrix MLP the activation's
    input and output (one tensor where the activation keeps its output only), a gated one
    gate, up and product (`workbench.estimate.compiled`)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Mlp(_activation(name), gated)
    x = torch.randn(N, H, requires_grad=True)
    node = torch.compile(model)(x).grad_fn
    while node is not None and "CompiledFunction" not in type(node).__name__:
        node = node.next_functions[0][0]
    assert node is not None
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x]}
    kept = {
        t.untyped_storage().data_ptr()
        for t in node.saved_tensors
        if isinstance(t, torch.Tensor)
        and t.untyped_storage().data_ptr() not in skip
        and t.numel() >= N * F
    }
    row = ACTIVATION_FUNCTIONS[name]
    assert len(kept) == (3 if gated else min(2, row.two.tensors))
