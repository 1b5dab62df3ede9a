"""Training: the live `Session` and its parts, one concept per file.

session.py       Session: its states, the loop thread, live changes, faults, public API
runtime.py       the data stream and backend one setting is built into; your module's weights
changes.py       what a settings change rebuilds; what a session can run on its device
step.py          one optimizer step (timed, recorded); NaN and out-of-memory helpers
batches.py       the data contract: (inputs, targets) pairs or model(**batch) mappings
backends/        the Backend contract and one file per engine (plain PyTorch, DeepSpeed)
precision.py     precision policies (autocast context + GradScaler), built once
schedule.py      LR schedules and batch-size LR scaling
data.py          DataStream: resumable, rebuildable data loading
recompute.py     activation recomputation (checkpointing) of marked blocks, toggled live
checkpoints.py   training checkpoints: the payload, atomic files, the newest N kept
memory.py        measured memory (tensors, saved activations) next to the prediction
profiler.py      torch.profiler around a few steps
batch_finder.py  find_max_micro_batch
devices.py       the device a session trains on; DeepSpeed's accelerator to match
toolchain.py     the tools DeepSpeed builds its ops with; which ops still need a build
launch.py        several ranks through torchrun or DeepSpeed's launcher (rank_worker.py
                 is the program each rank runs)
records.py       StepRecord, Event
"""
