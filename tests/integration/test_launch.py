"""Multi-rank launches on CPU (gloo): measured vs predicted memory per rank, a failing
rank, SIGTERM -> checkpoint -> resume, resource checks, the `launch` command line.

Each 2-rank launch costs seconds of process start-up, so they are shared: stages 0 and 3
here, stage 1 on the uninterrupted run the resume test continues, stage 2 on the issue's
`--json` command."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from torch import nn

from tests.integration.job_runs import shm_segments
from workbench.cli.launch import main
from workbench.config import TrainConfig
from workbench.models import build_model
from workbench.train.launch import LaunchResult, launch_ranks
from workbench.train.records import StepRecord
from workbench.train.session import Session

#: A small MLP: Ψ = 15·33+33 + 33·33+33 + 33·5+5 = 1820 parameters.
MLP = {"in_features": 15, "hidden": 33, "depth": 2, "out_features": 5, "samples": 256}
CPU = {"device": "cpu", "micro_batch": 4}
#: Finite, but long enough for DeepSpeed's first JIT build of its CPU comm op (minutes).
LAUNCH_TIMEOUT = 420
ROOT = Path(__file__).resolve().parents[2]


def rank_workers() -> list[psutil.Process]:
    """Rank workers that are children (at any depth) of this test process."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "workbench.train.launch.rank_worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def assert_gone(pids: list[int | None]) -> None:
    for pid in pids:
        assert pid is not None
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"rank process {pid} is still {status}"
    assert rank_workers() == []


# --------------------------------------------------------------------------- factories
def failing_mlp(**options: Any) -> tuple[Any, ...]:
    """An MLP whose forward raises on rank 1 at its second micro-batch."""
    module, data, loss_fn, info = build_model("mlp", **options)

    class Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module
            self.calls = 0

        def forward(self, x: Any) -> Any:
            self.calls += 1
            if os.environ.get("RANK") == "1" and self.calls == 2:
                raise RuntimeError("boom on rank 1")
            return self.inner(x)

    return Failing(), data, loss_fn, info


def slow_mlp(**options: Any) -> tuple[Any, ...]:
    """The MLP with a 40 ms pause per forward: a SIGTERM sent at the first step lands a few
    steps in, well before the run's end (the arithmetic is the plain MLP's)."""
    module, data, loss_fn, info = build_model("mlp", **options)

    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, x: Any) -> Any:
            time.sleep(0.04)
            return self.inner(x)

    return Slow(), data, loss_fn, info


#: fp32 AdamW tensors per parameter element: the weight, its gradient, and the optimizer's
#: fp32 master copy + 2 moments (bytes per element of each model state, in 4-byte units).
ELEMENT_BUFFERS = {"params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 3}


def check_memory(entries: list[dict[str, Any]], stage: int, n_tensors: int = 6) -> None:
    """Each rank's measured model-state bytes (counted from its tensors) against the
    estimator's "deepspeed" accounting: exact at stages 0-2; at stage 3 DeepSpeed pads
    every tensor's partition to ceil(numel/N), which the estimator (knowing only the total)
    cannot see, so the measured figure is above by less than one element per tensor per
    buffer (docs/deepspeed.md, "Padding"). `n_tensors`: parameter tensors of the model
    (the MLP: 3 weights + 3 biases). Stages >= 1 differ from the paper's accounting."""
    assert [e["rank"] for e in entries] == [0, 1]
    for entry in entries:
        predicted, paper = entry["predicted"], entry["predicted_paper"]
        assert predicted is not None and paper is not None
        for key, buffers in ELEMENT_BUFFERS.items():
            measured = entry[key]
            assert isinstance(measured, int) and measured > 0, (entry["rank"], key)
            where = (stage, entry["rank"], key, measured, predicted[key])
            if stage < 3:
                assert measured == predicted[key], where
            else:
                assert 0 <= measured - predicted[key] < n_tensors * buffers * 4, where
        if stage >= 1:
            # The paper's accounting misses DeepSpeed's fp32 master partition.
            assert entry["optimizer_bytes"] > 1.2 * paper["optimizer_bytes"]


#: Steps of the uninterrupted ZeRO-1 run that the SIGTERM/resume test continues.
STRAIGHT_STEPS = 30


@pytest.fixture(scope="module")
def straight() -> LaunchResult:
    """2 ranks, ZeRO-1, the slow MLP, never interrupted: the stage-1 memory figures and the
    trajectory a resumed run must continue."""
    result = launch_ranks(
        TrainConfig(zero_stage=1, **CPU),
        ranks=2,
        model="tests.integration.test_launch:slow_mlp",
        model_options=MLP,
        steps=STRAIGHT_STEPS,
        timeout=LAUNCH_TIMEOUT,
    )
    assert result.first_error is None, result.first_error
    return result


# --------------------------------------------------------------------------- tests
# Stage 1 is measured on the `straight` run, stage 2 through the command line (below).
@pytest.mark.parametrize(("stage", "launcher"), [(0, "torchrun"), (3, "deepspeed")])
def test_two_ranks_measured_memory_matches_deepspeed_accounting(stage: int, launcher: str) -> None:
    segments = shm_segments()
    seen: list[StepRecord] = []
    config = TrainConfig(zero_stage=stage, **CPU)
    run = {"steps": 2, "launcher": launcher, "on_record": seen.append, "timeout": LAUNCH_TIMEOUT}
    if stage == 0:  # from a notebook: a Session launches its own config and model
        with Session(config, model="mlp", model_options=dict(MLP)) as s:
            result = s.launch(ranks=2, **run)
    else:
        result = launch_ranks(config, ranks=2, model="mlp", model_options=MLP, **run)
    assert result.first_error is None, result.first_error
    assert result.ok and result.returncode == 0
    assert result.n_params == 1820
    # records streamed to the callback as they arrived, from both ranks
    assert sorted((r.rank, r.step) for r in seen) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    for rank in result.ranks:
        assert [r.step for r in rank.records] == [1, 2]
        assert all(r.world_size == 2 and r.zero_stage == stage for r in rank.records)
    check_memory([r.to_dict() for r in result.ranks], stage)
    # the two ranks trained on different shards of the data
    assert result.ranks[0].records[0].loss != result.ranks[1].records[0].loss
    assert rank_workers() == []
    # under DeepSpeed's launcher its CPU comm op made a 66 MB /dev/shm segment per rank:
    # each rank unlinked its own (release_shm_segment), so none outlives the run
    assert shm_segments() == segments


def test_stage_one_memory_on_the_straight_run(straight: LaunchResult) -> None:
    assert straight.ok and straight.returncode == 0 and not straight.preempted
    assert straight.n_params == 1820
    for rank in straight.ranks:
        assert [r.step for r in rank.records] == list(range(1, STRAIGHT_STEPS + 1))
        assert all(r.world_size == 2 and r.zero_stage == 1 for r in rank.records)
    check_memory([r.to_dict() for r in straight.ranks], 1)


def test_failure_on_one_rank_ends_all_ranks_and_surfaces_the_first_error() -> None:
    result = launch_ranks(
        TrainConfig(zero_stage=2, **CPU),
        ranks=2,
        model="tests.integration.test_launch:failing_mlp",
        model_options=MLP,
        steps=20,
        timeout=LAUNCH_TIMEOUT,
    )
    assert not result.ok
    err = result.first_error
    assert err is not None and err.rank == 1
    assert "boom on rank 1" in err.message
    assert "failing_mlp" in err.traceback_tail or "forward" in err.traceback_tail
    assert_gone([r.pid for r in result.ranks])


def test_more_ranks_than_cores_is_refused_before_anything_starts() -> None:
    cores = os.cpu_count() or 1
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=f"ranks={cores + 1}: this machine has {cores} CPU"):
        launch_ranks(TrainConfig(**CPU), ranks=cores + 1, model="mlp", steps=1)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, "steps=0"),
        ({"launcher": "mpirun"}, "launcher='mpirun'"),
        ({"model": "resnet"}, "model='resnet'"),
        ({"model": "no_such_pkg.mod:fn"}, "no_such_pkg"),
        ({"timeout": -1}, "timeout=-1"),
        ({"ranks": 0}, "ranks=0"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"ranks": 2, "model": "mlp", "steps": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        launch_ranks(TrainConfig(**CPU), **args)


def test_an_optimizer_the_ranks_cannot_train_is_refused_before_anything_starts() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=r"optimizer='lamb': cannot train here.*'adamw'"):
        launch_ranks(TrainConfig(optimizer="lamb", **CPU), ranks=2, model="mlp", steps=1)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_more_ranks_than_gpus_is_refused() -> None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"ranks={gpus + 1}: this machine has {gpus} CUDA"):
        launch_ranks(
            TrainConfig(device="cuda", micro_batch=4), ranks=gpus + 1, model="mlp", steps=1
        )


def test_timeout_stops_every_rank() -> None:
    result = launch_ranks(
        TrainConfig(**CPU), ranks=2, model="mlp", model_options=MLP, steps=10**6, timeout=6
    )
    assert result.timed_out and not result.ok
    assert result.first_error is not None and result.first_error.rank is None
    assert "timeout=6" in result.first_error.message
    assert rank_workers() == []


def test_fp16_on_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="fp16.*CPU"):
        launch_ranks(TrainConfig(precision="fp16", **CPU), ranks=2, model="mlp", steps=1)


def test_resume_needs_every_rank(tmp_path: Path) -> None:
    (tmp_path / "rank-0").mkdir()
    (tmp_path / "rank-0" / "step-00000002.pt").write_bytes(b"x")
    with pytest.raises(ValueError, match="no checkpoint for rank 1"):
        launch_ranks(TrainConfig(**CPU), ranks=2, model="mlp", steps=4, resume=tmp_path)


# --------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def cli_json(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    """The issue's command, `workbench launch --ranks 2 --zero 2 --steps 3 --json`, run as a
    user would: the `workbench` command in a folder of their own that holds `mymodels.py`,
    `--model mymodels:tiny` (a tiny GPT). One launch that the JSON-shape, stage-2 memory and
    model-from-this-folder tests share. Its temporary directory (TMPDIR, the command's and
    the ranks') is a fresh folder, `scratch`, that the launch must leave as it found it."""
    folder = tmp_path_factory.mktemp("user-folder")
    scratch = tmp_path_factory.mktemp("scratch-tmp")
    (folder / "mymodels.py").write_text(
        "from workbench.models import build_model\n\n\n"
        "def tiny(**options):\n"
        "    return build_model('tiny-gpt', **options)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TMPDIR"] = str(scratch)
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "workbench"),
            "launch",
            "--ranks",
            "2",
            "--zero",
            "2",
            "--steps",
            "3",
            "--json",
            "--device",
            "cpu",
            "--micro-batch",
            "2",
            "--model",
            "mymodels:tiny",
            "--model-options",
            json.dumps({"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}),
        ],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=LAUNCH_TIMEOUT + 60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(proc.stdout), scratch


CliLaunch = tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]


def test_cli_json_shape(cli_json: CliLaunch) -> None:
    proc, out, _ = cli_json
    assert proc.stdout.lstrip().startswith("{")  # one JSON object, nothing else on stdout
    assert out["world_size"] == 2 and out["ok"] is True and out["error"] is None
    assert out["launcher"] == "torchrun" and out["n_params"] > 0
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    for entry in out["ranks"]:
        assert set(entry["predicted"]) >= {"params_bytes", "grads_bytes", "optimizer_bytes"}
        assert entry["summary"]["steps"] == 3 and entry["summary"]["last_step"] == 3


def test_cli_stage_two_memory_matches_deepspeed_accounting(
    cli_json: CliLaunch,
) -> None:
    check_memory(cli_json[1]["ranks"], 2)


def test_a_launch_leaves_no_folder_in_the_temporary_directory(cli_json: CliLaunch) -> None:
    """torchrun's agent folders and the launch's run folder live in the launch's own folder
    and are removed: nothing of them is left in TMPDIR (a torch cache folder may be)."""
    left = [p.name for p in cli_json[2].iterdir()]
    assert [n for n in left if n.startswith(("torchelastic_", "workbench-launch-"))] == []


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--ranks", "abc"], "--ranks abc: must be an integer"),
        (["--zero", "7"], "--zero 7: must be 0, 1, 2 or 3"),
        (["--launcher", "mpirun"], "--launcher mpirun: must be one of torchrun, deepspeed"),
        (["--precision", "fp8"], "--precision fp8: must be one of"),
        (["--ranks", "999", "--device", "cpu"], "--ranks 999: this machine has"),
        (["--offload-params", "cpu", "--zero", "2"], "--offload-params"),
        (["--model-options", "[1]"], "--model-options [1]: must be a JSON object"),
    ],
)
def test_cli_bad_flags_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert needle in err


LONG = "x" * 300


def _files(tmp_path: Path) -> dict[str, str]:
    """Files no DeepSpeed config can be: a FIFO, a folder, binary bytes, JSON 200,000 deep,
    a duplicate key."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (tmp_path / "dup.json").write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    return {name: str(tmp_path / name) for name in ("fifo", "folder", "binary.json")} | {
        "deep": str(tmp_path / "deep.json"),
        "dup": str(tmp_path / "dup.json"),
    }


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("fifo", "a FIFO (named pipe), not a regular file"),
        ("folder", "a directory, not a regular file"),
        ("binary.json", "not UTF-8 text (byte 0x80 at offset 0)"),
        ("deep", "nested deeper than 64 levels"),
        ("dup", "key 'train_batch_size' appears twice in one object"),
        ("/dev/zero", "/dev/zero: a device, not a regular file"),
        (LONG, "cannot be read (File name too long)"),
    ],
)
def test_cli_a_config_that_is_no_settings_file_is_named(
    name: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _files(tmp_path).get(name, name)
    with pytest.raises(SystemExit) as info:
        main(["--config", path, "--device", "cpu", "--print-command"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench launch: error: --config ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--ranks", "1" + "0" * 60], f"--ranks 1{'0' * 60}: must be at"),
        (["--steps", "1e300"], "--steps 1e300: must be an integer"),
        (["--steps", "1" + "0" * 13], "--steps 10000000000000: must be at most 1,000,000,"),
        (["--timeout", "inf"], "--timeout inf: must be a finite number"),
        (["--timeout", "1e300"], "--timeout 1e300: must be at most 2,592,000 seconds"),
        (["--threads", "-1"], "--threads -1: must be an integer >= 1"),
        (["--model-options", '{"a": 1, "a": 2}'], "key 'a' appears twice in one object"),
        (["--model-options", '{"a": NaN}'], "JSON numbers must be finite"),
    ],
)
def test_cli_numbers_and_options_are_checked(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--device", "cpu", "--print-command"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err


def test_cli_every_problem_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    cores = os.cpu_count() or 1
    with pytest.raises(SystemExit) as info:
        main(
            ["--ranks", str(cores + 1), "--steps", "x", "--timeout", "nan", "--threads", "0"]
            + ["--micro-batch", "0", "--lr", "x", "--launcher", "mpi", "--device", "cpu"]
            + ["--model-options", "[1]"]
        )
    assert info.value.code == 2
    err = capsys.readouterr().err
    for part in (
        "--steps x: must be an integer",
        "--timeout nan: must be a finite number",
        "--threads 0: must be an integer >= 1",
        "--micro-batch 0: must be an integer >= 1",
        "--lr x: must be a finite number",
        "--launcher mpi: must be one of torchrun, deepspeed",
        "--model-options [1]: must be a JSON object",
        f"--ranks {cores + 1}: this machine has {cores} CPU core(s)",
    ):
        assert part in err
    assert err.count("\n") == 1


def test_cli_a_config_naming_a_model_runs_nothing(
    tmp_path: Path, marker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = marker.spec
    crafted = tmp_path / "ds.json"
    crafted.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "model": spec}))
    with pytest.raises(SystemExit) as info:
        main(["--config", str(crafted), "--ranks", "1", "--device", "cpu", "--print-command"])
    assert info.value.code == 2 and not marker.ran
    err = capsys.readouterr().err
    assert f"--config {crafted}: model={spec!r}: a DeepSpeed config holds settings only" in err
    assert "never a file's" in err and err.count("\n") == 1


def test_cli_a_resumed_checkpoint_naming_a_factory_runs_nothing(
    tmp_path: Path, marker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.train import checkpoints as ckpt

    spec = marker.spec
    with Session(TrainConfig(**CPU), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=2)
        saved = ckpt.load(s.save_checkpoint(tmp_path / "saved"))
    saved.pop("path")
    saved.pop("manifest")
    saved["model"] = {"name": spec, "options": MLP}
    ckpt.save(saved, tmp_path / "ck" / "rank-0" / ckpt.checkpoint_name(2))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(SystemExit) as info:
        main(
            ["--resume", str(tmp_path / "ck"), "--ranks", "1", "--steps", "4", "--model", "mlp"]
            + ["--model-options", json.dumps(MLP), "--device", "cpu", "--micro-batch", "4"]
        )
    assert info.value.code == 2 and not marker.ran
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    err = capsys.readouterr().err
    assert f"names the model factory {spec!r}" in err and "nothing of it was imported" in err
    assert err.startswith(f"workbench launch: error: --resume {tmp_path / 'ck'}: ")
    assert err.count("\n") == 1


def test_cli_print_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--ranks", "2", "--zero", "3", "--device", "cpu", "--print-command"]) == 0
    out = capsys.readouterr().out
    assert "torchrun --standalone --nproc-per-node 2 -m workbench.train.launch.rank_worker" in out
    assert "--nnodes NNODES" in out
    assert '"zero_stage": 3' in out
    assert (
        main(["--ranks", "2", "--launcher", "deepspeed", "--device", "cpu", "--print-command"]) == 0
    )
    assert "deepspeed --hostfile hostfile --num_gpus 2" in capsys.readouterr().out
    assert rank_workers() == []


def test_cli_imports_a_deepspeed_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2},
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    assert main(["--config", str(path), "--ranks", "2", "--device", "cpu", "--print-command"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("# CONFIG.json: "))
    cfg = json.loads(line.removeprefix("# CONFIG.json: "))
    assert (cfg["zero_stage"], cfg["micro_batch"], cfg["grad_accum"]) == (2, 2, 2)
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "train_batch_size": 7,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 2,
            }
        )
    )
    with pytest.raises(SystemExit) as info:
        main(["--config", str(bad), "--ranks", "2", "--print-command"])
    assert info.value.code == 2
    assert "--config" in capsys.readouterr().err


def test_sigterm_checkpoints_every_rank_and_resume_continues_the_run(
    tmp_path: Path, straight: LaunchResult
) -> None:
    """SIGTERM to `workbench launch` (a spot notice): every rank finishes its step, saves a
    checkpoint and exits; the command exits 143. `--resume` then continues from it along
    the trajectory of the run that was never interrupted."""
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench.cli.launch",
            "--ranks",
            "2",
            "--zero",
            "1",
            "--steps",
            str(STRAIGHT_STEPS),
            "--device",
            "cpu",
            "--micro-batch",
            "4",
            "--model",
            "tests.integration.test_launch:slow_mlp",
            "--model-options",
            json.dumps(MLP),
            "--checkpoint-dir",
            str(ckpt),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    # A launch that never reports a step still ends: SIGTERM (it stops its ranks), then kill.
    watchdog = threading.Timer(LAUNCH_TIMEOUT, proc.send_signal, (signal.SIGTERM,))
    watchdog.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # progress: "rank R step S loss ..."
            if line.startswith("rank ") and " step " in line:
                proc.send_signal(signal.SIGTERM)  # the notice goes to `workbench launch`
                break
        out, err = proc.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert f"continue with --resume {ckpt}" in err
    assert "measured from each rank's tensors vs predicted" in out  # the human table
    steps = [sorted(p.name for p in (ckpt / f"rank-{r}").glob("step-*.pt")) for r in (0, 1)]
    assert steps[0] == steps[1] and len(steps[0]) == 1  # both ranks stopped after one step
    assert all((ckpt / f"rank-{r}" / steps[r][0]).with_suffix(".json").is_file() for r in (0, 1))
    k = int(steps[0][0].removeprefix("step-").removesuffix(".pt"))
    assert f"stopped by SIGTERM at step {k};" in err
    assert 1 <= k < STRAIGHT_STEPS
    assert rank_workers() == []

    # resume as a user would: the command the message names, with the same settings
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "workbench"),
            "launch",
            "--ranks",
            "2",
            "--zero",
            "1",
            "--steps",
            str(STRAIGHT_STEPS),
            "--device",
            "cpu",
            "--micro-batch",
            "4",
            "--model",
            "tests.integration.test_launch:slow_mlp",
            "--model-options",
            json.dumps(MLP),
            "--resume",
            str(ckpt),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=LAUNCH_TIMEOUT + 60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads(done.stdout)
    assert resumed["ok"] and resumed["error"] is None
    for r in (0, 1):
        rank = resumed["ranks"][r]
        assert rank["summary"]["first_step"] == k + 1
        assert rank["summary"]["last_step"] == STRAIGHT_STEPS
        # the same data, RNG, weights and optimizer state: bit for bit the same losses
        assert rank["losses"] == [x.loss for x in straight.ranks[r].records[k:]]
    assert rank_workers() == []


def test_two_fsdp_ranks_report_the_fsdp_accounting(tmp_path: Path) -> None:
    """`workbench launch --ranks 2 --fsdp full_shard --steps 2 --json`: the same JSON shape
    as ZeRO; a GPT whose tensors all have an even first dimension, so FSDP2's per-tensor
    padding is zero and the measured shards equal the "fsdp" accounting exactly; the
    paper's figure is that of its ZeRO equivalent at rest (stage 3)."""
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "workbench"),
            "launch",
            "--ranks",
            "2",
            "--fsdp",
            "full_shard",
            "--steps",
            "2",
            "--json",
            "--device",
            "cpu",
            "--micro-batch",
            "2",
            "--model-options",
            json.dumps({"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT + 60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["ok"] and out["world_size"] == 2
    for entry in out["ranks"]:
        for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            assert entry[key] == entry["predicted"][key] == entry["predicted_paper"][key], key
        assert entry["predicted"]["params_bytes"] == 4 * -(-out["n_params"] // 2)
        assert len(entry["losses"]) == 2 and all(math.isfinite(v) for v in entry["losses"])


def test_sigterm_under_fsdp_checkpoints_every_rank_and_resume_continues(tmp_path: Path) -> None:
    """As for ZeRO: a SIGTERM reaches `launch_ranks`' process, every FSDP rank finishes its
    step and saves (the full state, gathered), and a resumed launch continues the
    trajectory of a run that was never interrupted, bit for bit."""
    config = TrainConfig(fsdp="full_shard", **CPU)
    steps = 12
    straight = launch_ranks(
        config,
        ranks=2,
        model="tests.integration.test_launch:slow_mlp",
        model_options=MLP,
        steps=steps,
        timeout=LAUNCH_TIMEOUT,
    )
    assert straight.ok, straight.first_error
    ckpt = tmp_path / "ckpt"

    def stop_after_first_record(record: StepRecord) -> None:
        if record.rank == 0 and record.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # forwarded to the ranks by launch_ranks

    stopped = launch_ranks(
        config,
        ranks=2,
        model="tests.integration.test_launch:slow_mlp",
        model_options=MLP,
        steps=steps,
        checkpoint_dir=ckpt,
        on_record=stop_after_first_record,
        timeout=LAUNCH_TIMEOUT,
    )
    assert stopped.preempted, stopped.first_error
    saved = [sorted(p.name for p in (ckpt / f"rank-{r}").glob("step-*.pt")) for r in (0, 1)]
    assert saved[0] == saved[1] and len(saved[0]) == 1
    k = int(saved[0][0].removeprefix("step-").removesuffix(".pt"))
    assert 2 <= k < steps
    resumed = launch_ranks(
        config,
        ranks=2,
        model="tests.integration.test_launch:slow_mlp",
        model_options=MLP,
        steps=steps,
        resume=ckpt,
        timeout=LAUNCH_TIMEOUT,
    )
    assert resumed.ok, resumed.first_error
    for r in (0, 1):
        got = resumed.ranks[r].records
        assert [x.step for x in got] == list(range(k + 1, steps + 1))
        assert [x.loss for x in got] == [x.loss for x in straight.ranks[r].records[k:]]
    assert rank_workers() == []


def test_cli_a_resume_with_other_model_options_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint trained with one width resumed with another: refused before any rank
    starts, naming the options that differ (was: a rank's traceback on a shape mismatch)."""
    from workbench.train import checkpoints as ckpt

    with Session(TrainConfig(**CPU), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=2)
        saved = ckpt.load(s.save_checkpoint(tmp_path / "saved"))
    saved.pop("path")
    saved.pop("manifest")
    ckpt.save(saved, tmp_path / "ck" / "rank-0" / ckpt.checkpoint_name(2))
    other = {**MLP, "hidden": 2 * MLP.get("hidden", 32)}
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(SystemExit) as info:
        main(
            ["--resume", str(tmp_path / "ck"), "--ranks", "1", "--steps", "4", "--model", "mlp"]
            + ["--model-options", json.dumps(other), "--device", "cpu", "--micro-batch", "4"]
        )
    assert info.value.code == 2
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    err = capsys.readouterr().err
    assert "--model-options" in err and "'hidden':" in err and "would not fit the model" in err
    assert err.count("\n") == 1
