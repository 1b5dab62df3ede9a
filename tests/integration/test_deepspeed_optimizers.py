"""DeepSpeed's optimizers on this CPU, built by DeepSpeed from the workbench's export.

Each exported config builds an engine (one rank, gloo), takes one optimizer step, and the
optimizer state the rank holds is counted the way `DeepSpeedBackend` counts it (every
state tensor but the 0-d step counters, plus ZeRO's fp32 master partition) and compared
with the estimator's `accounting="deepspeed"` figure. What runs here: torch's Adagrad and
SGD (SGD under ZeRO needs the `zero_allow_untested_optimizer` flag the export writes), and
with optimizer offload DeepSpeed's CPU Adam, Adagrad and Lion (their ops are compiled on
first use, about a minute each). Lamb (FusedLamb) is a CUDA kernel: DeepSpeed refuses it
on this CPU, which is what `runtime_problems` tells a Session.
"""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from typing import Any

import deepspeed
import pytest
import torch

from workbench.config import OptimizerName, Precision, TrainConfig, runtime_problems
from workbench.deepspeed import to_deepspeed
from workbench.estimate.deepspeed_layout import deepspeed_layout
from workbench.estimate.model_states import ModelStateQuery


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A one-rank gloo process group, destroyed with DeepSpeed's cached groups after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    gc.collect()
    deepspeed.comm.destroy_process_group()  # also drops DeepSpeed's cached sub-groups


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))


def train_one_step(config: TrainConfig) -> tuple[Any, int]:
    """An engine built from `to_deepspeed(config)` after one step, and the model's size."""
    module = model()
    n_params = sum(p.numel() for p in module.parameters())
    ds = to_deepspeed(config, world_size=1)
    ds["steps_per_print"] = 2**62
    engine, _, _, _ = deepspeed.initialize(
        model=module, model_parameters=list(module.parameters()), config=ds
    )
    loss = engine(torch.randn(config.micro_batch, 16)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    return engine, n_params


def optimizer_state_bytes(engine: Any) -> tuple[str, int]:
    """(the class DeepSpeed built, the bytes of its state and of ZeRO's fp32 masters)."""
    wrapper = engine.optimizer
    base = getattr(wrapper, "optimizer", wrapper)
    total = sum(
        v.numel() * v.element_size()
        for state in base.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    for t in getattr(wrapper, "single_partition_of_fp32_groups", None) or []:
        total += t.numel() * t.element_size()
    return type(base).__name__, total


def predicted_optimizer_bytes(config: TrainConfig, n_params: int) -> int:
    offload = config.offload_optimizer != "none"
    layout = deepspeed_layout(
        ModelStateQuery(
            n_params,
            Precision(config.precision),
            OptimizerName(config.optimizer),
            config.zero_stage,
            1,
            offload,
            False,
        )
    )
    if not offload:
        return layout.states.optimizer_bytes
    # offloaded: the host column holds this rank's gradient partition and optimizer states
    grads = layout.weight_bytes * layout.partition_elements
    return layout.states.cpu_offload_bytes - grads


@pytest.mark.parametrize(
    ("config", "built", "bytes_per_param"),
    [
        # torch.optim.Adagrad: `sum`, fp32 (its 0-d `step` is not counted)
        (TrainConfig(optimizer="adagrad", lr=1e-2), "Adagrad", 4),
        # ZeRO-1: fp32 master partition + the momentum buffer
        (TrainConfig(optimizer="sgd", zero_stage=1), "SGD", 4 + 4),
        # ZeRO-2 with a cosine schedule DeepSpeed builds (no warmup)
        (TrainConfig(optimizer="sgd", zero_stage=2, lr_schedule="cosine"), "SGD", 4 + 4),
        # ZeRO-Offload: fp32 master + the optimizer's states; Adam is torch's (`torch_adam`
        # in the export: no op build), Adagrad and Lion DeepSpeed's CPU optimizers
        (
            TrainConfig(optimizer="adamw", zero_stage=1, offload_optimizer="cpu"),
            "AdamW",
            4 + 8,
        ),
        (
            TrainConfig(optimizer="adagrad", zero_stage=1, offload_optimizer="cpu"),
            "DeepSpeedCPUAdagrad",
            4 + 4,
        ),
        # DeepSpeedCPULion allocates an exp_avg_sq next to Lion's one moment
        (
            TrainConfig(optimizer="lion", zero_stage=2, offload_optimizer="cpu", lr=1e-4),
            "DeepSpeedCPULion",
            4 + 4 + 4,
        ),
    ],
    ids=["adagrad", "sgd-zero1", "sgd-zero2-cosine", "cpu-adam", "cpu-adagrad", "cpu-lion"],
)
@pytest.mark.usefixtures("one_rank")
def test_measured_optimizer_state_is_the_estimate(
    config: TrainConfig, built: str, bytes_per_param: int
) -> None:
    engine, n_params = train_one_step(config)
    name, measured = optimizer_state_bytes(engine)
    assert name == built
    # 808 parameters: even, so ZeRO's one-rank partition has no padding
    assert n_params == 808
    assert measured == bytes_per_param * n_params == predicted_optimizer_bytes(config, n_params)


@pytest.mark.cpu_only  # with CUDA, DeepSpeed compiles FusedLamb and trains it
@pytest.mark.usefixtures("one_rank")
def test_lamb_does_not_run_on_this_cpu_as_runtime_problems_say() -> None:
    config = TrainConfig(optimizer="lamb")
    (lamb,) = runtime_problems(config)
    assert lamb.field == "optimizer"
    assert "FusedLamb, a CUDA kernel (no CPU build)" in str(lamb)
    with pytest.raises(ValueError, match="not been implemented on CPU"):
        train_one_step(config)
