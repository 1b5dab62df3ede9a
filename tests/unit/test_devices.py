"""Device choice without a GPU: CUDA is simulated (is_available / device_count patched), so
the rules a GPU machine follows are checked here: an index on every CUDA device, LOCAL_RANK
under a launcher, DeepSpeed's accelerator switched to the session's device type, CPU ranks
that cannot see the GPUs, and UUIDs in NVML's form."""

from __future__ import annotations

import pytest
import torch

from workbench.train import devices


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_cpu_and_no_cuda() -> None:
    assert devices.resolve_device(None, "cpu") == torch.device("cpu")
    assert devices.resolve_device("cpu", "auto") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert devices.resolve_device(None, "auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="device='cuda': CUDA is not available"):
            devices.resolve_device("cuda", "auto")
    with pytest.raises(ValueError, match="device='mps': must be cpu, cuda or cuda:N"):
        devices.resolve_device("mps", "auto")
    with pytest.raises(ValueError, match="device='gpu0': not a torch device"):
        devices.resolve_device("gpu0", "auto")


@pytest.mark.usefixtures("two_gpus")
def test_a_cuda_device_always_has_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    assert devices.resolve_device(None, "auto") == torch.device("cuda", 0)
    assert devices.resolve_device("cuda", "auto") == torch.device("cuda", 0)
    assert str(devices.resolve_device(None, "cuda")) == "cuda:0"  # the profiler's key
    assert devices.resolve_device("cuda:1", "auto") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"device='cuda:2': this process sees 2 CUDA device"):
        devices.resolve_device("cuda:2", "auto")


@pytest.mark.usefixtures("two_gpus")
def test_under_a_launcher_each_rank_takes_its_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert devices.resolve_device(None, "auto") == torch.device("cuda", 1)
    assert devices.resolve_device("cuda", "auto") == torch.device("cuda", 1)
    assert devices.resolve_device("cuda:0", "auto") == torch.device("cuda", 0)  # explicit wins
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x': must be an integer"):
        devices.resolve_device(None, "auto")


def test_deepspeed_accelerator_follows_the_session_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepspeed.accelerator import real_accelerator

    class FakeCuda:
        _name = "cuda"

        def device_name(self, index: int | None = None) -> str:
            return "cuda"

    monkeypatch.setattr(real_accelerator, "ds_accelerator", FakeCuda())
    accel = devices.use_deepspeed_accelerator(torch.device("cpu"))
    assert accel.device_name() == "cpu" and accel.communication_backend_name() == "gloo"
    assert real_accelerator.get_accelerator() is accel
    assert devices.use_deepspeed_accelerator(torch.device("cpu")) is accel  # no churn
    assert devices.communication_backend(torch.device("cuda", 1)) == "nccl"
    assert devices.communication_backend(torch.device("cpu")) == "gloo"


def test_cpu_ranks_cannot_see_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.train.launch.commands import child_env

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    cpu = child_env(False, 2)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["DS_ACCELERATOR"] == "cpu"
    gpu = child_env(True, 2)
    assert "DS_ACCELERATOR" not in gpu and gpu.get("CUDA_VISIBLE_DEVICES") != ""


@pytest.mark.parametrize(
    ("raw", "nvml"),
    [
        ("58c9d2a8-1f1e-7c4b-9b1a-0e6f2d3c4b5a", "GPU-58c9d2a8-1f1e-7c4b-9b1a-0e6f2d3c4b5a"),
        ("GPU-58C9D2A8-1F1E-7C4B-9B1A-0E6F2D3C4B5A", "GPU-58c9d2a8-1f1e-7c4b-9b1a-0e6f2d3c4b5a"),
        ("MIG-abc", "MIG-abc"),
    ],
)
def test_uuids_are_compared_in_nvmls_form(raw: str, nvml: str) -> None:
    assert devices.normalize_uuid(raw) == nvml
