"""Training: the live `Session` and its parts, one concept per file.

session.py       Session: its states, the loop thread, public API
session_tools.py the Session's memory, predict, profile and launch methods
session_step.py  one step of the Session's loop, its out-of-memory retry and its record
run_folders.py   a run's id, the folders it claims and its checkpoint writes
changes.py       the queue of settings changes; what a change rebuilds; what a session runs
faults.py        what a failed step does: the out-of-memory retry, a non-finite loss, errors
resume.py        where a save goes, its manifest, what a loaded checkpoint resumes with
session_log.py   a Session's run log and TensorBoard writer
owners.py        one live Session per module; open Sessions closed at exit
world.py         rank and world size from the environment
progress.py      run()'s progress bar
runtime.py       the data stream and backend one setting is built into; your module's weights
step.py          one optimizer step (timed, recorded); NaN and out-of-memory helpers
batches.py       the data contract: (inputs, targets) pairs or model(**batch) mappings
backends/        the Backend contract and one file per engine (plain, DeepSpeed, FSDP)
precision.py     precision policies (autocast context + GradScaler), the scaler's state
schedule.py      LR schedules and batch-size LR scaling
data.py          DataStream: resumable, rebuildable data loading
recompute.py     activation recomputation (checkpointing) of marked blocks, toggled live
offload.py       activation offload: the forward's saved activations kept in host memory
checkpoints.py   training checkpoints: the payload, atomic files, the newest N kept
                 (with checkpoint_files, _payload, _write and _runs.py beside it)
history.py       the bounded step history; runlog.py the run's JSON-lines log
memory.py        measured memory (tensors, saved activations) next to the prediction
profiler.py      torch.profiler around a few steps
batch_finder.py  find_max_micro_batch
devices.py       the device a session trains on; DeepSpeed's accelerator to match
toolchain.py     the tools DeepSpeed builds its ops with; which ops still need a build
launch.py        several ranks through torchrun or DeepSpeed's launcher, with
                 launch_checks.py, launch_commands.py, launch_procs.py, launch_result.py
                 (rank_worker.py is the program each rank runs)
ladder/          the optimization ladder (rungs, plan, run, report)
records.py       StepRecord, Event
"""
