"""What activation offload shows on a CPU, held by tests that can fail there.

On a CPU the Session's offload moves nothing (the activations are already in host
memory), so its "same losses" hold trivially there. `ActivationOffload(host_copy=True)`
runs the same pack and unpack hooks copying each activation into a separate host buffer:
backward then computes from the copies, and the training is the same to the bit. And the
memory advice does not offer offloading to a run on a CPU, where it frees nothing.
"""

from __future__ import annotations

import pytest
import torch

from workbench import TrainConfig
from workbench.models import build_model
from workbench.train.measure.memory_advice import memory_advice
from workbench.train.techniques.offload import ActivationOffload

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64}


def _train(offload: ActivationOffload | None, steps: int = 3) -> tuple[list[float], list[int]]:
    """Losses of `steps` SGD steps of a seeded tiny GPT, its forward under `offload`'s
    hooks; and the copies each forward made."""
    torch.manual_seed(0)
    model, data, loss_fn, _ = build_model("tiny-gpt", layers=2, hidden=32, heads=2, seq_len=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.utils.data.default_collate([data[i] for i in range(4)])
    losses, copies = [], []
    for _ in range(steps):
        if offload is None:
            loss = loss_fn(model(x), y)
        else:
            with offload.hooks(model):
                loss = loss_fn(model(x), y)
        loss.backward()
        if offload is not None:
            assert offload.unpacked == offload.copies  # backward read every copy back
            copies.append(offload.copies)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, copies


def test_backward_computes_from_the_host_copies_and_trains_the_same() -> None:
    plain, _ = _train(None)
    counted, none = _train(ActivationOffload(torch.device("cpu")))
    copied, copies = _train(ActivationOffload(torch.device("cpu"), host_copy=True))
    assert copied == plain == counted  # to the bit
    assert none == [0, 0, 0] and all(n > 10 for n in copies)


def test_what_backward_reads_is_the_copy_not_the_forwards_tensor() -> None:
    """The input a Linear saves, changed in place after the forward (behind autograd's
    back): backward without offload reads the changed tensor, with the host copy the
    one the forward saw."""
    grads = {}
    for name, host_copy in (("plain", None), ("copied", True)):
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 4)
        x = torch.randn(3, 8)
        offload = ActivationOffload(torch.device("cpu"), host_copy=bool(host_copy))
        with offload.hooks(layer):
            y = layer(x).sum()
        x.data.mul_(2.0)  # after the forward: only an offloaded copy escapes it
        y.backward()
        grads[name] = layer.weight.grad.clone()
        assert offload.copies == (1 if host_copy else 0)
    torch.manual_seed(0)
    torch.nn.Linear(8, 4)
    x0 = torch.randn(3, 8)  # the same x as each run drew
    expected = torch.ones(4, 1) * x0.sum(0, keepdim=True)  # d(sum(W x + b))/dW
    assert torch.equal(grads["copied"], expected)
    assert torch.equal(grads["plain"], 2 * expected)


def test_the_memory_advice_offers_offload_only_where_it_moves_memory() -> None:
    info = build_model("tiny-gpt", **TINY)[3]
    config = TrainConfig(micro_batch=8, precision="bf16-true")
    on_gpu = memory_advice(config.replace(device="cuda"), info)
    assert [a.apply for a in on_gpu] == [{"activation_offload": True}]
    for cpu in (
        memory_advice(config.replace(device="cpu"), info),
        memory_advice(config, info, device="cpu"),
        memory_advice(config, info, device=torch.device("cpu")),
    ):
        (advice,) = cpu
        assert advice.apply != {"activation_offload": True}
        assert "activation offload" not in advice.evidence["freed_bytes"]
        assert "activation offload" in advice.evidence["not_on_this_device"]
    with pytest.raises(ValueError, match=r"device='tpu:x': must be a torch device"):
        memory_advice(config, info, device="tpu:x")
