"""Training: the live `Session` and its parts.

session.py       Session: the loop, live changes, faults, checkpoints, memory, profile
backend.py       the Backend contract and `build_backend` (plain or DeepSpeed)
plain.py         PlainBackend: torch optimizer + precision policy + LR schedule
precision.py     precision policies (autocast context + GradScaler), built once
schedule.py      LR schedules and batch-size LR scaling
data.py          DataStream: resumable, rebuildable data loading
checkpointing.py activation checkpointing of marked blocks, toggled live
checkpoint.py    atomic training checkpoints
memory.py        measured memory (tensors, saved activations) vs the estimator
profiler.py      torch.profiler around a few steps
batch_finder.py  find_max_micro_batch
records.py       StepRecord, Event
zero.py          DeepSpeedBackend (ZeRO stages, DeepSpeed 16-bit)
"""
