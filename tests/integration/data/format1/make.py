"""How step-00000003.pt was written: by the workbench of the commit before checkpoint format
2 (CHECKPOINT_FORMAT = 1: one pickle, NumPy's and Python's RNG state tuples, the history
inside, no manifest), so the previous-format test resumes a file that code really wrote.

    git archive 42b4f69111be602677c3bf24fe1b62eb3a10db1a workbench | tar -x -C /tmp/oldwb
    PYTHONPATH=/tmp/oldwb .venv/bin/python tests/integration/data/format1/make.py OUT_DIR

It trains 3 steps, saves, trains 3 more and writes continued.json: the losses of the
history inside the file and of the 3 steps after it, which a resume must reproduce.
"""

import json
import sys

import torch

import workbench
from workbench import Session, TrainConfig
from workbench.train import checkpoints as ckpt

torch.set_num_threads(1)
assert ckpt.CHECKPOINT_FORMAT == 1, workbench.__file__
opts = {"in_features": 4, "hidden": 8, "depth": 1, "out_features": 2, "samples": 64}
out = sys.argv[1]
with Session(
    TrainConfig(micro_batch=4, seed=7, lr=1e-2, grad_accum=2), model="mlp", model_options=opts
) as s:
    s.run(3)
    path = s.save_checkpoint(out)
    history = [r.loss for r in s.history]
    rest = [r.loss for r in s.run(3)]
with open(out + "/continued.json", "w") as f:
    json.dump(
        {
            "file": path.split("/")[-1],
            "model_options": opts,
            "history_losses": history,
            "continued_losses": rest,
        },
        f,
        indent=1,
    )
