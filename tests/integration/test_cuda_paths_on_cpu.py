"""CUDA paths reproduced on this CPU, each with a stand-in for what only a GPU has: paged
8-bit AdamW's CPU-typed states beside a device absmax, the allocator's statistics read once
a step, the observer leaving your trainer's CUDA peak alone, a plain step's no-gradient
norm on the device, the pipeline's bubble timed on the device's clock, the Hugging Face
observer's norm under fp16 before `unscale_`, the paged states CUDA's peak misses, and a
DeepSpeed dry run leaving DeepSpeed's process-wide accelerator as it found it."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from workbench import TrainConfig


def test_paged_states_are_dequantized_where_their_absmax_is(monkeypatch: Any) -> None:
    """bitsandbytes' paged states are CPU-typed tensors over managed memory while their
    absmax and code are on the GPU: the dequantization gets every tensor on one device
    (a "meta" device stands in for the GPU; the kernel is a stand-in that refuses mixed
    devices, as bitsandbytes' CUDA and CPU kernels do)."""
    import bitsandbytes.functional as F

    from workbench.train.backends.optimizer import neutral_state

    seen: list[set[str]] = []

    def dequantize(a: torch.Tensor, *, absmax: Any, code: Any, blocksize: int) -> torch.Tensor:
        devices = {a.device.type, absmax.device.type, code.device.type}
        seen.append(devices)
        if len(devices) != 1:
            raise RuntimeError(f"tensors on {sorted(devices)}")
        return torch.empty(a.shape, device=a.device)

    monkeypatch.setattr(F, "dequantize_blockwise", dequantize)
    device = torch.device("meta")
    state = {
        "step": 3,
        "state1": torch.zeros(512, dtype=torch.uint8),  # CPU-typed: managed memory
        "state2": torch.zeros(512, dtype=torch.uint8),
        "qmap1": torch.zeros(256, device=device),
        "qmap2": torch.zeros(256, device=device),
        "absmax1": torch.zeros(2, device=device),
        "absmax2": torch.zeros(2, device=device),
    }
    out = neutral_state(state)
    assert seen == [{"meta"}, {"meta"}]
    assert out["exp_avg"].device == device and out["exp_avg_sq"].dtype == torch.float32


def test_unpaged_states_still_dequantize_with_bitsandbytes() -> None:
    """The same function on ordinary CPU states, through bitsandbytes' own kernels."""
    import bitsandbytes.functional as F

    from workbench.train.backends.optimizer import neutral_state

    torch.manual_seed(0)
    x = torch.randn(512)
    code = F.create_dynamic_map(signed=True)
    codes, quant = F.quantize_blockwise(x, code=code, blocksize=256)
    st = {"step": 1, "state1": codes, "qmap1": code, "absmax1": quant.absmax}
    st.update(state2=codes.clone(), qmap2=code, absmax2=quant.absmax.clone())
    out = neutral_state(st)
    assert torch.allclose(out["exp_avg"], x, atol=0.05)


def _fake_cuda_stats(monkeypatch: Any) -> list[int]:
    from torch.cuda import memory as cuda_memory

    builds: list[int] = []

    def nested(device: Any = None) -> dict[str, Any]:
        builds.append(1)
        return {
            "allocated_bytes": {"all": {"current": 100, "peak": 300}},
            "reserved_bytes": {"all": {"current": 512, "peak": 512}},
        }

    monkeypatch.setattr(cuda_memory, "memory_stats_as_nested_dict", nested)
    return builds


def test_a_cuda_memory_reading_builds_the_allocator_statistics_once(monkeypatch: Any) -> None:
    """memory_allocated, max_memory_allocated and memory_reserved each build every
    statistic; the Session's and the observer's per-step reading builds them once."""
    from workbench.train.runtime import memory_reader

    builds = _fake_cuda_stats(monkeypatch)
    read = memory_reader(torch.device("cuda"))
    assert read() == (100, 300, 512, None)
    assert len(builds) == 1


def test_the_observer_leaves_your_trainers_cuda_peak_alone(monkeypatch: Any) -> None:
    """Resetting CUDA's peak each step clobbers the peak a trainer reports itself (the
    Trainer's memory metrics): the observer resets only when asked (`reset_peak=True`)."""
    from workbench.integrations.observer import Observer

    resets: list[Any] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: resets.append(d))
    _fake_cuda_stats(monkeypatch)
    model = torch.nn.Linear(4, 2)
    for reset_peak, expected in ((False, 0), (True, 2)):
        resets.clear()
        obs = Observer(model, config=TrainConfig(micro_batch=2), reset_peak=reset_peak)
        obs.device, obs._cuda = torch.device("cuda"), True  # a CUDA model, stood in for
        from workbench.train.runtime import memory_reader

        obs._read_memory = memory_reader(obs.device)
        obs.end_step(torch.tensor(1.0))
        obs.end_step(torch.tensor(1.0))
        assert len(resets) == expected
        assert obs.records()[-1].cuda_max_allocated_bytes == 300
        obs.close()
    with pytest.raises(ValueError, match=r"reset_peak='yes': must be True or False"):
        Observer(model, reset_peak="yes")  # type: ignore[arg-type]


def test_a_plain_steps_norm_without_gradients_is_on_the_device() -> None:
    """No gradient this step (every parameter unused): the norm is a zero on the
    backend's device, which the step's one read stacks with the loss (a CPU zero beside a
    CUDA loss fails there); "meta" stands in for the GPU."""
    from workbench.train.backends.plain import PlainBackend

    backend = PlainBackend(TrainConfig(micro_batch=2, device="cpu"), torch.nn.Linear(4, 2))
    backend.device = torch.device("meta")
    norm = backend.prepare_step()
    assert norm is not None and norm.device == backend.device


class _AsyncDevice:
    """A device stream: work queued by the host runs later; events are stamped with the
    stream's time when the work before them is done."""

    def __init__(self) -> None:
        self.queue_end = 0.0  # when the queued work finishes, in device seconds
        self.synced = False

    def launch(self, seconds: float) -> None:
        self.queue_end += seconds


def _event_type(device: _AsyncDevice) -> Any:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at: float | None = None

        def record(self) -> None:
            self.at = device.queue_end

        def synchronize(self) -> None:
            device.synced = True

        def elapsed_time(self, end: Event) -> float:
            assert device.synced, "read before the host waited for the device"
            assert self.at is not None and end.at is not None
            return (end.at - self.at) * 1000.0

    return Event


def test_the_pipeline_bubble_is_timed_on_the_device_clock() -> None:
    """The schedule's chunks only queue kernels (the host returns at once): host time
    around them is ~0, so the bubble read 100%. On the device's clock (events, read
    after the host waits once) the stage was busy 30 ms of a 50 ms step: a 40% bubble."""
    from workbench.train.backends.pipeline import PipelineBackend, SpanClock

    device = _AsyncDevice()
    backend = object.__new__(PipelineBackend)
    backend._clock = SpanClock(torch.device("cpu"), event=_event_type(device))
    stage = types.SimpleNamespace(
        forward_one_chunk=lambda: device.launch(0.010),
        backward_one_chunk=lambda: device.launch(0.020),
    )
    backend._time_chunks(stage)
    clock = backend._clock
    start = clock.mark()
    device.launch(0.015)  # waiting for the previous stage's activations (a receive)
    stage.forward_one_chunk()
    device.launch(0.005)
    stage.backward_one_chunk()
    end = clock.mark()
    wall, busy = clock.seconds(start, end), clock.busy()
    assert wall == pytest.approx(0.050) and busy == pytest.approx(0.030)
    assert 1 - busy / wall == pytest.approx(0.4)


class _Accelerated(torch.optim.SGD):
    """Stands in for accelerate's AcceleratedOptimizer: an optimizer with the GradScaler
    (`scaler`) and the optimizer it wraps (`optimizer`)."""

    scaler: Any
    optimizer: Any


def test_the_hf_observers_norm_under_fp16_is_the_unscaled_one(tmp_path: Any) -> None:
    """fp16 without clipping: the Trainer never calls `unscale_`, so the gradients in
    `on_pre_optimizer_step` still carry the loss scale (x65536); the recorded norm is
    divided by the scaler's scale (a CPU GradScaler here, as accelerate wraps it)."""
    from transformers import TrainingArguments

    from workbench.integrations import WorkbenchTrainerCallback

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    wrapped = _Accelerated(model.parameters(), lr=0.0)
    wrapped.scaler, wrapped.optimizer = scaler, wrapped
    sgd = wrapped
    args = TrainingArguments(
        output_dir=str(tmp_path), max_grad_norm=0.0, logging_steps=5, report_to=[], use_cpu=True
    )
    callback = WorkbenchTrainerCallback(grad_norm=True)
    callback.on_train_begin(args, None, None, model=model, optimizer=wrapped)
    callback.on_step_begin(args, None, None)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    scaler.scale(loss).backward()
    true_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in
                                                            model.parameters()]))) / 65536.0  # fmt: skip
    callback.on_pre_optimizer_step(args, None, None, optimizer=wrapped)
    scaler.step(sgd)
    scaler.update()
    callback.on_step_end(args, None, None, optimizer=wrapped)
    record = callback.observer.records()[-1]
    assert record.grad_norm == pytest.approx(true_norm, rel=1e-5)
    callback.on_train_end(args, None, None)


def test_after_unscale_the_norm_is_taken_as_it_is() -> None:
    from workbench.integrations.hf import pending_scale

    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    wrapped = types.SimpleNamespace(optimizer=sgd, scaler=scaler)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    assert pending_scale(wrapped) is scaler._scale
    scaler.unscale_(sgd)
    assert pending_scale(wrapped) is None
    assert pending_scale(sgd) is None  # no scaler: nothing to divide


def test_paged_states_are_named_where_cuda_peak_misses_them() -> None:
    from workbench.train.measure.memory import paged_state_note

    paged = torch.zeros(1000, dtype=torch.uint8)
    paged.is_paged = True  # type: ignore[attr-defined]  # as bitsandbytes flags them
    optimizer = types.SimpleNamespace(
        is_paged=True, state={0: {"state1": paged, "absmax1": torch.zeros(4)}}
    )
    note = paged_state_note(optimizer, torch.device("cuda"))
    assert note is not None and "1 paged tensors" in note and "max_memory_allocated" in note
    assert paged_state_note(optimizer, torch.device("cpu")) is None


def test_a_deepspeed_dry_run_puts_deepspeeds_accelerator_back() -> None:
    """DeepSpeed's accelerator is process-wide: a dry run on the CPU switches it to the
    CPU's and must put back the one in place (a CUDA one here, made without a GPU)."""
    import deepspeed.accelerator.real_accelerator as ra
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    from workbench.train.dry_run import simulate_memory

    before = ra.ds_accelerator
    mine = CUDA_Accelerator()
    ra.ds_accelerator = mine
    try:
        simulate_memory(
            "tiny-gpt",
            TrainConfig(micro_batch=2, zero_stage=2),
            model_options={"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8},
            world_size=2,
            progress=False,
        )
        assert ra.ds_accelerator is mine
    finally:
        ra.ds_accelerator = before
