"""The exported `train_deepspeed.py` really trains: 2 steps on CPU (gloo) in a subprocess,
one rank, without a launcher and under DeepSpeed's launcher."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.job_runs import shm_segments
from workbench.config import TrainConfig
from workbench.export import export_deepspeed

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY_GPT = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}

FACTORY = """
import torch
from torch import nn
from torch.utils.data import TensorDataset


def make(width=4):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 6, generator=g)
    y = x[:, :2].sum(1, keepdim=True)
    model = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 1))
    return model, TensorDataset(x, y), nn.functional.mse_loss
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(argv: list[str], cwd: Path, timeout: float = 420) -> tuple[int, list[dict], str]:
    """Run a command in its own process group (so a launcher's ranks go with it on a
    timeout); returns (exit status, JSON lines of stdout, stderr)."""
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"{argv} did not finish in {timeout} s:\n{err[-3000:]}")
    lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    return proc.returncode, lines, err


def check_two_steps(lines: list[dict], *, stage: int, n_params: int | None) -> None:
    start, steps, done = lines[0], lines[1:-1], lines[-1]
    assert start["event"] == "start" and start["world_size"] == 1
    assert start["zero_stage"] == stage
    if n_params is not None:
        assert start["n_params"] == n_params
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert math.isfinite(s["loss"]) and s["loss"] > 0 and not s["skipped"]
        assert s["grad_norm"] is not None and s["grad_norm"] > 0
    assert done == {"event": "done", "steps": 2}


# Without a launcher and under DeepSpeed's launcher (the exported launch.sh's). torchrun
# starts the same script the same way the launch tests' ranks are started.
@pytest.mark.parametrize("launcher", ["python", "deepspeed"])
def test_exported_script_trains_two_steps_on_one_cpu_rank(launcher: str, tmp_path: Path) -> None:
    from workbench.models import build_model

    if launcher == "python":  # the built-in model, ZeRO-2, accumulation, a schedule
        config = TrainConfig(
            zero_stage=2,
            micro_batch=4,
            grad_accum=2,
            lr_schedule="cosine",
            warmup_steps=1,
            total_steps=10,
            clip_grad_norm=1.0,
            seed=3,
        )
        model, options = "tiny-gpt", TINY_GPT
        n_params = build_model("tiny-gpt", **TINY_GPT)[3].n_params
    else:  # an importable factory, ZeRO-3 in bf16
        config = TrainConfig(zero_stage=3, precision="bf16", micro_batch=8, lr=1e-2)
        model, options, n_params = "my_models:make", {"width": 5}, 6 * 5 + 5 + 5 + 1
        (tmp_path / "job").mkdir()  # the factory lies in the job folder before the export
        (tmp_path / "job" / "my_models.py").write_text(FACTORY)
    result = export_deepspeed(
        config, gpus=1, out_dir=tmp_path / "job", model=model, model_options=options
    )
    # the script and its arguments as launch.sh runs them (a factory: --model SPEC too)
    tail = [*shlex.split(result.command)[3:], "--steps", "2"]
    if model == "my_models:make":
        assert tail[3:5] == ["--model", "my_models:make"]
        assert "--model my_models:make" in Path(result.launch_path).read_text()
    job = Path(result.out_dir)
    if launcher == "python":
        argv = [sys.executable, *tail]
    else:
        argv = [
            str(BIN / "deepspeed"),
            "--num_gpus",
            "1",
            "--master_port",
            str(_free_port()),
            *tail,
        ]
    (job / "my_models.py").write_text(FACTORY)  # importable from the job's directory
    segments = shm_segments()
    code, lines, err = run_job(argv, cwd=job)
    assert code == 0, err[-3000:]
    check_two_steps(lines, stage=config.zero_stage, n_params=n_params)
    # DeepSpeed's launcher has its CPU comm op make a /dev/shm segment: the job unlinks it
    assert shm_segments() == segments


def test_exported_script_refuses_a_different_world_size(tmp_path: Path) -> None:
    result = export_deepspeed(
        TrainConfig(zero_stage=1, micro_batch=4),
        gpus=2,
        out_dir=tmp_path,
        model="mlp",
        model_options={"hidden": 8},
    )
    code, lines, err = run_job(
        [sys.executable, "train_deepspeed.py", "--steps", "1"], cwd=Path(result.out_dir)
    )
    assert code == 2 and lines == []
    assert "train_batch_size=8 was exported for world size 2" in err
    assert "this run has 1 rank(s)" in err and "--gpus 1" in err


def no_workbench(folder: Path) -> str:
    """A directory whose `workbench` package cannot be imported: put first on PYTHONPATH,
    it shows an exported job runs from its own files (torch and the launcher only)."""
    stub = folder / "no-workbench" / "workbench"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('workbench is not installed here')\n")
    return str(stub.parent)


def run_without_workbench(argv: list[str], cwd: Path) -> tuple[int, list[dict], str]:
    """Run a job with `workbench` unimportable (the stub directory first on the path)."""
    return _run_with_pythonpath(argv, cwd, no_workbench(cwd))


def _run_with_pythonpath(
    argv: list[str], cwd: Path, pythonpath: str
) -> tuple[int, list[dict], str]:
    env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=420)
    lines = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    return done.returncode, lines, done.stderr


def test_exported_fsdp_job_trains_on_two_ranks_and_without_workbench(tmp_path: Path) -> None:
    from workbench.export import export_job

    config = TrainConfig(
        fsdp="full_shard",
        micro_batch=4,
        grad_accum=2,
        lr_schedule="cosine",
        warmup_steps=1,
        total_steps=10,
        clip_grad_norm=1.0,
    )
    built_in = export_job(
        config, format="fsdp", gpus=2, out_dir=tmp_path / "gpt", model_options=TINY_GPT
    )
    assert built_in.command == "torchrun --standalone --nproc-per-node 2 train_fsdp.py"
    assert built_in.ds_config_path is None
    job = Path(built_in.out_dir)
    argv = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        "train_fsdp.py",
        "--steps",
        "2",
    ]
    code, lines, err = run_job(argv, cwd=job)
    assert code == 0, err[-3000:]
    start, steps, done = lines[0], lines[1:-1], lines[-1]
    assert start["world_size"] == 2 and start["fsdp"] == "full_shard"
    assert [s["step"] for s in steps] == [1, 2] and all(math.isfinite(s["loss"]) for s in steps)
    assert steps[0]["lr"] == pytest.approx(config.lr)  # warm-up step 1 of 1, then cosine
    assert done == {"event": "done", "steps": 2}
    # a factory model: the folder's own files and torch, nothing of workbench
    (tmp_path / "mine").mkdir()  # the factory lies in the job folder before the export
    (tmp_path / "mine" / "my_models.py").write_text(FACTORY)
    factory = export_job(
        TrainConfig(fsdp="no_shard", micro_batch=8, lr=1e-2),
        format="fsdp",
        gpus=1,
        out_dir=tmp_path / "mine",
        model="my_models:make",
    )
    mine = Path(factory.out_dir)
    assert factory.command.endswith("train_fsdp.py --model my_models:make")
    code, lines, err = run_without_workbench(
        [sys.executable, "train_fsdp.py", "--steps", "2", "--model", "my_models:make"], mine
    )
    assert code == 0, err[-3000:]
    assert [ln.get("step") for ln in lines[1:-1]] == [1, 2]
    assert (
        "model 'my_models:make' (named by --model): importing module 'my_models' from "
        f"{mine / 'my_models.py'} and calling make(**model_options)" in err
    )


def test_exported_fsdp_and_lightning_jobs_train_pure_bf16(tmp_path: Path) -> None:
    """bf16-true: the FSDP script casts the model to bf16 before sharding (a factory's
    float inputs cast too); the Lightning job runs Lightning's own "bf16-true"."""
    from workbench.export import export_job

    pure = TrainConfig(precision="bf16-true", micro_batch=8, lr=1e-2)
    (tmp_path / "fsdp").mkdir()  # the factory lies in the job folder before the export
    (tmp_path / "fsdp" / "my_models.py").write_text(FACTORY)
    out = export_job(
        pure.replace(fsdp="full_shard"),
        format="fsdp",
        gpus=1,
        out_dir=tmp_path / "fsdp",
        model="my_models:make",
    )
    job = Path(out.out_dir)
    code, lines, err = run_without_workbench(
        [sys.executable, "train_fsdp.py", "--steps", "2", "--model", "my_models:make"], job
    )
    assert code == 0, err[-3000:]
    start, steps = lines[0], lines[1:-1]
    assert start["precision"] == "bf16-true" and start["param_dtype"] == "bfloat16"
    assert [s["step"] for s in steps] == [1, 2] and all(math.isfinite(s["loss"]) for s in steps)
    # lightning is a test dependency (pyproject's `test` extra): its job always runs here
    out = export_job(pure, format="lightning", gpus=1, out_dir=tmp_path / "lightning")
    code, lines, err = run_job(
        [sys.executable, "train_lightning.py", "--steps", "2"], cwd=Path(out.out_dir)
    )
    assert code == 0, err[-3000:]
    assert [ln["step"] for ln in lines[:-1]] == [1, 2]
    assert all(math.isfinite(ln["loss"]) for ln in lines[:-1])


def test_exported_deepspeed_job_runs_without_workbench(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()  # the factory lies in the job folder before the export
    (tmp_path / "job" / "my_models.py").write_text(FACTORY)
    result = export_deepspeed(
        TrainConfig(zero_stage=1, micro_batch=8, lr=1e-2),
        gpus=1,
        out_dir=tmp_path / "job",
        model="my_models:make",
    )
    job = Path(result.out_dir)
    code, lines, err = run_without_workbench(
        [sys.executable, "train_deepspeed.py", "--steps", "2", "--trust-model-spec"], job
    )
    assert code == 0, err[-3000:]
    check_two_steps(lines, stage=1, n_params=6 * 4 + 4 + 4 + 1)
    assert (
        "model 'my_models:make' (trusted with --trust-model-spec): importing module "
        f"'my_models' from {job / 'my_models.py'} and calling make(**model_options)" in err
    )


def test_exported_lightning_job_trains_on_cpu_and_says_which_strategies_need_a_gpu(
    tmp_path: Path,
) -> None:
    from workbench.export import export_job

    ddp = export_job(
        TrainConfig(micro_batch=4, grad_accum=2),
        format="lightning",
        gpus=1,
        out_dir=tmp_path / "ddp",
        model_options=TINY_GPT,
    )
    assert json.loads((Path(ddp.out_dir) / "job.json").read_text())["strategy"] == "ddp"
    code, lines, err = run_job(
        [sys.executable, "train_lightning.py", "--steps", "2"], cwd=Path(ddp.out_dir)
    )
    assert code == 0, err[-3000:]
    assert [ln["step"] for ln in lines[:-1]] == [1, 2]
    assert all(math.isfinite(ln["loss"]) for ln in lines[:-1])
    assert lines[-1] == {"event": "done", "steps": 2}
    for config, strategy, name in (
        (TrainConfig(fsdp="full_shard", micro_batch=4), "fsdp", "FSDP"),
        (TrainConfig(zero_stage=2, micro_batch=4), "deepspeed", "DeepSpeed"),
    ):
        out = export_job(
            config, format="lightning", gpus=1, out_dir=tmp_path / strategy, model_options=TINY_GPT
        )
        job = json.loads((Path(out.out_dir) / "job.json").read_text())
        assert job["strategy"] == strategy
        if strategy == "deepspeed":  # Lightning runs the optimizer and batches itself
            ds = json.loads((Path(out.out_dir) / "ds_config.json").read_text())
            assert ds["zero_optimization"]["stage"] == 2 and "optimizer" not in ds
        code, _, err = run_job(
            [sys.executable, "train_lightning.py", "--steps", "1"], cwd=Path(out.out_dir)
        )
        if torch_cuda():
            assert code == 0, err[-3000:]
        else:
            assert code == 2 and f"Lightning's {name} strategy runs on CUDA GPUs only" in err


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_the_jobs_learning_rate_schedule_is_the_workbenchs() -> None:
    from workbench.export.job_common import lr_multiplier as exported
    from workbench.train.schedule import lr_multiplier

    for schedule in ("constant", "cosine", "onecycle"):
        for warmup in (0, 3):
            for step in range(0, 25):
                assert exported(schedule, step, warmup, 20) == lr_multiplier(
                    schedule, step, warmup, 20
                ), (schedule, warmup, step)


# ---------------------------------------------------------------- a job.json chooses no code
EVIL = """
import pathlib

pathlib.Path("IMPORTED").write_text("the module ran")


def make(**options):
    pathlib.Path("CALLED").write_text("the factory ran")
    raise SystemExit(0)
"""


@pytest.mark.parametrize("format", ["deepspeed", "fsdp", "lightning"])
def test_a_crafted_job_json_runs_no_code(format: str, tmp_path: Path) -> None:
    """A shared job folder whose job.json was edited to name a factory: each script refuses
    it, naming the spec and the file, and imports nothing (no marker file appears)."""
    from workbench.export import export_job

    config = TrainConfig(fsdp="full_shard") if format == "fsdp" else TrainConfig()
    result = export_job(
        config,
        format=format,
        gpus=1,
        out_dir=tmp_path / "job",
        model="mlp",
        model_options={"hidden": 8},
    )
    job = Path(result.out_dir)
    assert "--model" not in result.command  # a built-in model needs no flag
    spec = job / "job.json"
    crafted = json.loads(spec.read_text())
    crafted["model"] = "evil:make"
    spec.write_text(json.dumps(crafted))
    (job / "evil.py").write_text(EVIL)
    script = Path(result.script_path).name
    for extra in ([], ["--model", "mlp"], ["--model", "other:make"]):
        code, lines, err = run_job([sys.executable, script, "--steps", "1", *extra], cwd=job)
        assert code == 2 and lines == [], err[-3000:]
        assert "Traceback" not in err
        if not extra:
            assert (
                f"{script}: error: {spec}: model 'evil:make' names Python code to import and "
                "run (module 'evil', function 'make'); a job file cannot choose code to run, "
                f"so it is not imported. Name it yourself: {script} --model evil:make" in err
            )
            assert "--trust-model-spec" in err
        else:
            assert f"--model {extra[1]!r}: {spec} names the model 'evil:make'" in err
        assert not (job / "IMPORTED").exists() and not (job / "CALLED").exists()
    # os:system with a command as its option: refused the same way, nothing runs
    crafted.update(model="os:system", model_options={"command": "touch PWNED"})
    spec.write_text(json.dumps(crafted))
    code, _, err = run_job([sys.executable, script, "--steps", "1"], cwd=job)
    assert code == 2 and "model 'os:system' names Python code to import and run" in err
    assert not (job / "PWNED").exists()


def test_a_job_json_that_is_no_job_is_refused_with_every_problem(tmp_path: Path) -> None:
    result = export_deepspeed(
        TrainConfig(), gpus=1, out_dir=tmp_path / "job", model="mlp", model_options={"hidden": 8}
    )
    job = Path(result.out_dir)
    spec = job / "job.json"
    text = spec.read_text()
    spec.write_text(text[:-2] + ', "seed": 3}\n')  # the seed twice
    code, _, err = run_job([sys.executable, "train_deepspeed.py"], cwd=job)
    assert code == 2 and "Traceback" not in err
    assert "the job description" in err and "key 'seed' appears twice in one object" in err
    crafted = json.loads(text)
    crafted.update(seed=-1, steps="10", pin_memory="false")
    spec.write_text(json.dumps(crafted))
    code, _, err = run_job([sys.executable, "train_deepspeed.py"], cwd=job)
    assert code == 2
    assert "not a job this script writes: seed=-1, steps='10', pin_memory='false'" in err
    spec.unlink()
    os.mkfifo(spec)  # opening it would block
    code, _, err = run_job([sys.executable, "train_deepspeed.py"], cwd=job, timeout=120)
    assert code == 2 and f"the job description {spec}: not a regular file" in err


def test_the_exported_fsdp_job_reduces_host_tensors_over_gloo_on_gpus() -> None:
    """CPU offload all-reduces host tensors (the gradient norm, the scaler's found-inf, the
    full-state gathers): on GPUs the group needs gloo beside NCCL, or the first step fails
    with "No backend type associated with device type cpu"."""
    from workbench.export.train_fsdp import process_group_backend

    assert process_group_backend(cuda=True) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(cuda=False) == "gloo"
    source = (Path(__file__).parents[2] / "workbench/export/train_fsdp.py").read_text()
    assert "dist.init_process_group(process_group_backend(cuda))" in source


#: tiny-gpt with dropout: its masks come from torch's global RNG, seeded by a job where a
#: Session seeds it (after the engine is built; the loaders draw from their own generator)
DROPOUT = dict(TINY_GPT, dropout=0.1)


@pytest.mark.parametrize(
    ("fmt", "script", "config"),
    [
        (  # FSDP: the workbench's own schedule (warm-up, cosine), clipping, accumulation
            "fsdp",
            "train_fsdp.py",
            TrainConfig(
                fsdp="full_shard", micro_batch=4, grad_accum=2, lr_schedule="cosine",
                warmup_steps=1, total_steps=10, clip_grad_norm=1.0, seed=3,
            ),
        ),
        (  # DeepSpeed ZeRO-2 with a constant rate (its own schedulers differ: see below)
            "deepspeed",
            "train_deepspeed.py",
            TrainConfig(zero_stage=2, micro_batch=4, grad_accum=2, clip_grad_norm=1.0, seed=3),
        ),
        (  # Lightning, data parallel on one device: its schedule, clipping and accumulation
            "lightning",
            "train_lightning.py",
            TrainConfig(
                micro_batch=4, grad_accum=2, lr_schedule="cosine", warmup_steps=1,
                total_steps=10, clip_grad_norm=1.0, seed=3,
            ),
        ),
    ],
)  # fmt: skip
def test_an_exported_job_trains_the_sessions_trajectory(
    fmt: str, script: str, config: TrainConfig, tmp_path: Path
) -> None:
    """The same config, model, seed and data: the job's losses, learning rates and
    gradient norms are the Session's at every step. Measured: equal to the last bit on
    this CPU (the same ops in the same order); the tolerance, 1e-6 relative, only allows
    for float printing, far below the 1e-3 a step of training moves the loss here."""
    from workbench import Session
    from workbench.export import export_job

    steps = 4
    out = export_job(config, format=fmt, gpus=1, out_dir=tmp_path / fmt, model_options=DROPOUT)
    code, lines, err = run_job([sys.executable, script, "--steps", str(steps)], Path(out.out_dir))
    assert code == 0, err[-3000:]
    job = [ln for ln in lines if "loss" in ln]
    with Session(config, model="tiny-gpt", model_options=DROPOUT) as s:
        records = s.run(steps)
    assert [ln["step"] for ln in job] == [r.step for r in records] == list(range(1, steps + 1))
    assert [ln["loss"] for ln in job] == pytest.approx([r.loss for r in records], rel=1e-6)
    assert [ln["lr"] for ln in job] == pytest.approx([r.lr for r in records], rel=1e-6)
    assert [ln["grad_norm"] for ln in job] == pytest.approx(
        [r.grad_norm for r in records], rel=1e-6
    )
    moved = max(abs(a.loss - b.loss) for a, b in zip(records, records[1:], strict=False))
    assert moved > 1e-3  # the steps train: a trajectory, not one loss repeated


def test_the_lightning_job_on_two_devices_trains_each_rank_on_its_own_share(
    tmp_path: Path,
) -> None:
    """`train_lightning.py --devices 2` (Lightning's DDP over gloo): each rank reads its own
    share of the samples in the FSDP job's order, so its losses and gradient norms are the
    2-rank FSDP job's (measured: equal to the last bit here; the same rank sharing every
    rank the same samples gave the one-device figures instead)."""
    from workbench.export import export_job

    config = TrainConfig(
        micro_batch=4, grad_accum=2, lr_schedule="cosine", warmup_steps=1, total_steps=10,
        clip_grad_norm=1.0, seed=3,
    )  # fmt: skip
    steps = "3"
    fsdp = export_job(
        config.replace(fsdp="full_shard"), format="fsdp", gpus=2, out_dir=tmp_path / "fsdp",
        model_options=DROPOUT,
    )  # fmt: skip
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    code, lines, err = run_job([*torchrun, "train_fsdp.py", "--steps", steps], Path(fsdp.out_dir))
    assert code == 0, err[-3000:]
    sharded = [ln for ln in lines if "loss" in ln]
    lit = export_job(
        config, format="lightning", gpus=2, out_dir=tmp_path / "lightning", model_options=DROPOUT
    )
    argv = [sys.executable, "train_lightning.py", "--steps", steps, "--devices", "2"]
    code, lines, err = run_job(argv, Path(lit.out_dir))
    assert code == 0, err[-3000:]
    job = [ln for ln in lines if "loss" in ln]
    assert [ln["step"] for ln in job] == [ln["step"] for ln in sharded] == [1, 2, 3]
    assert [ln["loss"] for ln in job] == pytest.approx([ln["loss"] for ln in sharded], rel=1e-6)
    assert [ln["grad_norm"] for ln in job] == pytest.approx(
        [ln["grad_norm"] for ln in sharded], rel=1e-6
    )


@pytest.mark.parametrize("fmt", ["deepspeed", "fsdp", "lightning"])
def test_an_exported_job_trains_with_the_sessions_attention_kernel(
    fmt: str, tmp_path: Path
) -> None:
    """`attention="sdpa"` travels in the job's config: the job's model runs PyTorch's
    fused kernel, as the Session's; a kernel the job does not know is refused by name."""
    from workbench.export import export_job
    from workbench.export.job_common import build

    config = TrainConfig(attention="sdpa", **({"fsdp": "full_shard"} if fmt != "deepspeed" else {}))
    out = export_job(config, format=fmt, gpus=1, out_dir=tmp_path / fmt, model_options=TINY_GPT)
    job = json.loads((Path(out.out_dir) / "job.json").read_text())
    assert job["config"]["attention"] == "sdpa"
    module, _, _ = build(job)
    kernels = {m.kernel for m in module.modules() if type(m).__name__ == "CausalSelfAttention"}
    assert kernels == {"sdpa"}
    job["config"]["attention"] = "flash"
    with pytest.raises(SystemExit):
        build(job)


@pytest.mark.parametrize("fmt", ["deepspeed", "fsdp", "lightning"])
def test_an_exported_job_recomputes_what_the_session_recomputes(fmt: str, tmp_path: Path) -> None:
    """`activation_checkpointing` travels as none, selective or full: the job's built-in
    GPT recomputes its attention cores (selective) or runs its blocks under checkpoint
    (full); an older job's True and False still mean full and none; a value no job
    writes is refused by name."""
    from workbench.export import export_job
    from workbench.export.job_common import build

    engine = {"fsdp": "full_shard"} if fmt != "deepspeed" else {}
    for mode in ("none", "selective", "full", True):
        config = TrainConfig(activation_checkpointing=mode, **engine)
        out = export_job(
            config, format=fmt, gpus=1, out_dir=tmp_path / f"{fmt}-{mode}", model_options=TINY_GPT
        )
        job = json.loads((Path(out.out_dir) / "job.json").read_text())
        want = "full" if mode is True else mode
        assert job["activation_checkpointing"] == want
        module, _, _ = build(job)
        cores = [m.recompute_core for m in module.modules() if hasattr(m, "recompute_core")]
        blocks = [m for m in module.modules() if getattr(m, "_workbench_checkpointable", False)]
        wrapped = ["forward" in m.__dict__ for m in blocks]
        assert cores and all(c is (want == "selective") for c in cores)
        assert blocks and all(w is (want == "full") for w in wrapped)
    job["activation_checkpointing"] = False  # an older job's words
    module, _, _ = build(job)
    assert not any(m.recompute_core for m in module.modules() if hasattr(m, "recompute_core"))
    job["activation_checkpointing"] = "attention"
    with pytest.raises(SystemExit):
        build(job)


@pytest.mark.parametrize("fmt", ["deepspeed", "fsdp", "lightning"])
def test_an_exported_script_runs_its_own_folders_files_with_workbench_installed(
    fmt: str, tmp_path: Path
) -> None:
    """The job's files beside the script are what it runs, as exported or as its user
    edited them, even where workbench is importable (another version may be installed)."""
    from workbench.export import export_job

    config = TrainConfig(micro_batch=4, fsdp="full_shard" if fmt == "fsdp" else "off")
    out = export_job(config, format=fmt, gpus=1, out_dir=tmp_path / fmt)
    job = Path(out.out_dir)
    for name in ("job_common.py", "job_files.py", "job_parallel.py", "job_checkpoints.py"):
        with open(job / name, "a") as f:
            f.write(f"\nimport sys\nprint('edited {name}', file=sys.stderr)\n")
    code, _, err = _run_with_pythonpath(
        [sys.executable, f"train_{fmt}.py", "--help"], job, str(REPO)
    )
    assert code == 0, err[-3000:]
    for name in ("job_common.py", "job_files.py", "job_parallel.py", "job_checkpoints.py"):
        assert f"edited {name}" in err


#: the keys of every exported job's per-step line
STEP_KEYS = {"step", "loss", "lr", "grad_norm", "skipped", "step_seconds"}


def test_the_three_jobs_print_one_step_line_with_the_same_meaning(tmp_path: Path) -> None:
    """Each format's per-step line has the same keys; `loss` is the mean over the step's
    micro-batches (the same first batches: the same step-1 loss everywhere), `lr` the rate
    the step applied (warm-up step 1 of 2: half the rate, where a rate read after the step
    is the whole of it) and `grad_norm` the norm before clipping."""
    from workbench import Session
    from workbench.export import export_job

    config = TrainConfig(
        micro_batch=4, grad_accum=2, lr=1e-3, lr_schedule="cosine", warmup_steps=2,
        total_steps=10, clip_grad_norm=0.5, seed=3,
    )  # fmt: skip
    engines = {"deepspeed": {"zero_stage": 1}, "fsdp": {"fsdp": "full_shard"}, "lightning": {}}
    lines = {}
    for fmt, engine in engines.items():
        out = export_job(
            config.replace(**engine), format=fmt, gpus=1, out_dir=tmp_path / fmt,
            model_options=TINY_GPT,
        )  # fmt: skip
        code, printed, err = run_job(
            [sys.executable, f"train_{fmt}.py", "--steps", "2"], Path(out.out_dir)
        )
        assert code == 0, err[-3000:]
        lines[fmt] = [ln for ln in printed if "loss" in ln]
        assert [ln["step"] for ln in lines[fmt]] == [1, 2]
        assert all(set(ln) == STEP_KEYS for ln in lines[fmt]), lines[fmt]
    with Session(config, model="tiny-gpt", model_options=TINY_GPT) as s:
        records = s.run(2)
    assert [r.lr for r in records] == pytest.approx([5e-4, 1e-3])
    for fmt in ("fsdp", "lightning"):  # the workbench's schedule
        assert [ln["lr"] for ln in lines[fmt]] == pytest.approx([r.lr for r in records])
        assert [ln["grad_norm"] for ln in lines[fmt]] == pytest.approx(
            [r.grad_norm for r in records], rel=1e-6
        )
        assert [ln["loss"] for ln in lines[fmt]] == pytest.approx(
            [r.loss for r in records], rel=1e-6
        )
    # DeepSpeed's WarmupCosineLR starts at its minimum (docs/deepspeed.md): its first two
    # steps run at 0, the third at half the rate
    assert [ln["lr"] for ln in lines["deepspeed"]] == [0.0, 0.0]
    assert lines["deepspeed"][0]["loss"] == pytest.approx(records[0].loss, rel=1e-6)
    assert lines["deepspeed"][0]["grad_norm"] == pytest.approx(records[0].grad_norm, rel=1e-6)
    assert not any(ln["skipped"] for fmt in lines for ln in lines[fmt])
