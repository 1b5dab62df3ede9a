"""Training: the live `Session` and its parts, in rooms by concept.

The Session and its loop:
session.py       Session: its states, the loop thread, public API
session_tools.py the Session's memory, predict, profile and launch methods
session_saves.py the Session's save_checkpoint() and its autosave
session_step.py  one step of the Session's loop, its out-of-memory retry and its record
run_folders.py   a run's id, the folders it claims and its checkpoint writes
changes.py       the queue of settings changes; what a change rebuilds; what a session runs
faults.py        what a failed step does: the out-of-memory retry, a non-finite loss, errors
resume.py        where a save goes, its manifest, what a loaded checkpoint resumes with
session_log.py   a Session's run log and TensorBoard writer
owners.py        one live Session per module; open Sessions closed at exit, dropped
                 ones' weights written back
world.py         rank and world size from the environment
progress.py      run()'s progress bar
runtime.py       the data stream and backend one setting is built into; your module's weights
step.py          one optimizer step (timed, recorded); NaN and out-of-memory helpers
batches.py       the data contract: (inputs, targets) pairs or model(**batch) mappings
schedule.py      LR schedules and batch-size LR scaling
data.py          DataStream: resumable, rebuildable data loading
devices.py       the device a session trains on; DeepSpeed's accelerator to match
history.py       the bounded step history; runlog.py the run's JSON-lines log
records.py       StepRecord, Event
checkpoints.py   training checkpoints: reading, verifying, converting; every name of
                 checkpointing/ (files and names, the payload, atomic writes, run ownership)

The rooms:
backends/        the Backend contract, the shared distributed lifecycle, one file per engine
techniques/      what a setting switches on the model or the step: precision policies,
                 LoRA/QLoRA, activation recomputation and offload, the attention kernel,
                 the tensor- and pipeline-parallel plans
measure/         measured memory next to the prediction, the memory advice, the profiler,
                 the step clock, the batch-size finder, the planner's probes
dry_run/         a step on fake tensors under torch's memory tracker (simulate_memory)
launch/          several ranks through torchrun or DeepSpeed's launcher (rank_worker.py is
                 the program each rank runs; toolchain.py the tools DeepSpeed builds with)
ladder/          the optimization ladder (rungs, plan, run, report)

memory.py, plan_probe.py, tensor_plan.py and pipeline_plan.py keep the tutorials' import
paths of measure/ and techniques/ modules.
"""
