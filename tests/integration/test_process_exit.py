"""A script that ends with sessions still training exits cleanly (the sessions are stopped
and closed at exit), and DeepSpeed's op builds use this interpreter's tools whatever PATH
the process was started with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench import Session, TrainConfig
from workbench.train.launch import toolchain

SCRIPT = """
import atexit, json, sys, time

# registered before workbench is imported, so it runs after workbench's own exit handler
# (atexit runs last-registered first): what that handler's close() left behind
def after_exit():
    import torch
    lines = [json.loads(x) for x in open("run/log.jsonl")]
    records = [x for x in lines if x["type"] == "record"]
    print("AFTER EXIT " + json.dumps({
        "state": s.state,
        "step": s.step,
        "published": s.history.total,
        "log_steps": [x["step"] for x in records],
        "moved": any(not torch.equal(v, initial[k]) for k, v in module.state_dict().items()),
        "dtypes": sorted({str(v.dtype) for v in module.state_dict().values()}),
    }), flush=True)

atexit.register(after_exit)

import torch
from torch import nn
from torch.utils.data import TensorDataset
from workbench import Session, TrainConfig

torch.set_num_threads(1)
stage = int(sys.argv[1])
x = torch.randn(256, 8)
module = nn.Linear(8, 2)
initial = {k: v.clone() for k, v in module.state_dict().items()}
s = Session(TrainConfig(micro_batch=8, zero_stage=stage, checkpoint_dir="run"), model=module,
            data=TensorDataset(x, x[:, :2]), loss_fn=nn.functional.mse_loss)
s.start()  # trains until stopped; the script never calls close()
while len(s.history) < 3:
    time.sleep(0.01)
print("script ends", flush=True)
"""


def run_script(tmp_path: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("stage", [0, 2])
def test_a_script_ending_with_a_running_session_exits_cleanly(tmp_path: Path, stage: int) -> None:
    # started with the system PATH only: the venv's bin is not on it, as from a plain shell
    done = run_script(tmp_path, str(stage), path="/usr/bin:/bin")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "script ends" in done.stdout
    assert "terminate called" not in done.stderr
    # close() ran at exit: the session is closed, every record it published is in the
    # log (written and flushed by the writer thread), and your module holds the trained
    # fp32 weights (under ZeRO-2 an engine trained a copy: only close() brings them back)
    after = json.loads(done.stdout.split("AFTER EXIT ", 1)[1].splitlines()[0])
    assert after["state"] == "closed"
    assert after["published"] >= 3 and after["step"] == after["published"]
    assert after["log_steps"] == list(range(1, after["step"] + 1))
    assert after["moved"] and after["dtypes"] == ["torch.float32"]


def test_use_interpreter_tools_puts_this_interpreters_bin_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    toolchain.use_interpreter_tools()
    toolchain.use_interpreter_tools()  # idempotent
    assert os.environ["PATH"] == f"{bin_dir}:/usr/bin:/bin"
    assert toolchain.child_path(f"{bin_dir}:/x") == f"{bin_dir}:/x"


def test_a_zero_session_builds_with_the_interpreters_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with Session(TrainConfig(micro_batch=4, zero_stage=1), model="mlp") as s:
        s.run(optimizer_steps=1)
    assert os.environ["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_pending_op_builds_finds_an_empty_extension_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepspeed.ops.op_builder.builder import OpBuilder

    monkeypatch.setattr(OpBuilder, "_loaded_ops", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    config = TrainConfig(zero_stage=2, offload_optimizer="cpu", optimizer="adagrad")
    assert toolchain.pending_op_builds(config) == ["deepspeed_shm_comm", "cpu_adagrad"]
    adam = TrainConfig(zero_stage=2, offload_optimizer="cpu")  # torch's Adam: nothing to build
    assert toolchain.pending_op_builds(adam) == ["deepspeed_shm_comm"]
    for name in ("deepspeed_shm_comm", "cpu_adagrad"):  # what a finished build leaves
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / f"{name}.so").write_bytes(b"")
    assert toolchain.pending_op_builds(config) == []


def test_the_first_build_is_announced_as_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "pending_op_builds", lambda config: ["deepspeed_shm_comm"])
    with Session(TrainConfig(micro_batch=4, zero_stage=1), model="mlp") as s:
        ev = [e for e in s.events if e.kind == "op-build"]
        assert len(ev) == 1 and "deepspeed_shm_comm" in ev[0].message
        assert "1-3 minutes" in ev[0].message and ev[0].details["ops"] == ["deepspeed_shm_comm"]
    with Session(TrainConfig(micro_batch=4), model="mlp") as s:  # no DeepSpeed: no build
        assert not [e for e in s.events if e.kind == "op-build"]
