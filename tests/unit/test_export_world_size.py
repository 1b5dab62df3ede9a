"""An exported FSDP or Lightning job runs on the world size it was exported for, or not at
all (its global batch and learning rate were chosen for it), and a Lightning job exported
for several nodes trains one model over every node's ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.export import export_job

REPO = Path(__file__).resolve().parents[2]
TINY_GPT = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        env.pop(key, None)
    return {**env, **extra}


def _steps(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"step"')]


@pytest.mark.parametrize("fmt", ["fsdp", "lightning"])
def test_a_job_refuses_another_world_size_than_its_export(fmt: str, tmp_path: Path) -> None:
    config = TrainConfig(micro_batch=2, grad_accum=2, fsdp="full_shard" if fmt == "fsdp" else "off")
    job = export_job(config, format=fmt, gpus=2, out_dir=tmp_path / "job", model_options=TINY_GPT)
    done = subprocess.run(
        [sys.executable, f"train_{fmt}.py", "--steps", "1"],
        cwd=job.out_dir, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert _steps(done.stdout) == []  # refused before the first step
    assert (
        "job.json: exported_world_size=2: the job was exported for world size 2 (global batch "
        "8 = micro 2 x accum 2 x 2 data-parallel rank(s)); this run has " in done.stderr
    )
    running = "1 rank(s)" if fmt == "fsdp" else "--devices 1 x --num-nodes 1 = 1 rank(s)"
    again = "--gpus 1" if fmt == "fsdp" else "--gpus 1 --nodes 1"
    assert f"this run has {running}. Launch 2 ranks" in done.stderr
    assert f"re-export with `workbench export --format {fmt} {again}`" in done.stderr


def test_the_lightning_job_checks_the_launchers_world_and_node_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.export.train_lightning import check_ranks

    job = {"exported_world_size": 4, "config": {"micro_batch": 1, "grad_accum": 1}}
    for key in ("WORLD_SIZE", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    check_ranks(job, 2, 2)  # 2 devices x 2 nodes: the export's 4
    for key, value, said in (
        (
            "WORLD_SIZE",
            "2",
            "WORLD_SIZE='2': the launcher started that many ranks, but --devices 2",
        ),
        ("NODE_RANK", "2", "NODE_RANK='2': must be a node index 0..1 (--num-nodes 2)"),
        ("GROUP_RANK", "x", "GROUP_RANK='x': must be a node index 0..1"),
    ):
        monkeypatch.setenv(key, value)
        with pytest.raises(SystemExit) as stopped:
            check_ranks(job, 2, 2)
        assert stopped.value.code == 2 and said in capsys.readouterr().err
        monkeypatch.delenv(key)
    with pytest.raises(SystemExit):
        check_ranks(job, 2, 1)  # 2 ranks of the export's 4: what the review saw fail
    assert "--devices 2 x --num-nodes 1 = 2 rank(s)" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_two_node_lightning_job_trains_one_model_over_both_nodes(tmp_path: Path) -> None:
    """The launch.sh command of a 1 GPU x 2 node export, run as two "nodes" on this machine
    (gloo on the CPU): rank 0 alone prints the steps, and they are the steps of the same job
    run as 2 devices on one node (one model over both ranks; two nodes each training their
    own copy would both print rank 0's lines of a world of 1)."""
    config = TrainConfig(micro_batch=2, seed=5)
    job = export_job(
        config, format="lightning", gpus=1, nodes=2, out_dir=tmp_path / "job",
        model_options=TINY_GPT, steps=2,
    )  # fmt: skip
    command = job.multinode_command
    assert "--devices 1 --num-nodes 2" in command
    command = command.replace("--master-port 29500", f"--master-port {_free_port()}")
    nodes = [
        subprocess.Popen(
            ["bash", "-c", command],
            cwd=job.out_dir,
            text=True,
            env=_env(NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    first, second = (_steps(out) for out, _ in outputs)
    assert [s["step"] for s in first] == [1, 2] and second == []
    one_node = subprocess.run(
        [sys.executable, "train_lightning.py", "--devices", "2"],
        cwd=job.out_dir, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert one_node.returncode == 0, one_node.stderr[-3000:]
    same = _steps(one_node.stdout)
    assert [s["loss"] for s in first] == pytest.approx([s["loss"] for s in same], rel=1e-6)


def test_launch_sh_and_the_report_say_how_each_format_goes_to_several_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two = export_job(TrainConfig(), format="lightning", gpus=8, nodes=2, out_dir=tmp_path / "l2")
    text = Path(two.launch_path).read_text()
    assert "--standalone" not in text  # a single-node command in a 2-node job's comments
    assert "--nnodes 2 --nproc-per-node 8" in text and "--devices 8 --num-nodes 2" in text
    assert "NODE_RANK 0..1" in text
    fsdp = TrainConfig(fsdp="full_shard")
    one = export_job(fsdp, format="fsdp", gpus=8, out_dir=tmp_path / "f1")
    text = Path(one.launch_path).read_text()
    assert "--nnodes N" not in text  # torchrun on N nodes without a re-export: refused now
    assert "re-export with `workbench export --format fsdp --gpus G --nodes M`" in text
    assert "the job refuses to run on another world size" in text
    argv = ["export", "--format", "fsdp", "--fsdp", "full_shard", "--gpus", "2"]
    assert main([*argv, "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    assert "--hostfile" not in out  # refused for --format fsdp
    assert "several nodes: re-export with --gpus G --nodes M (launch.sh on every node" in out
