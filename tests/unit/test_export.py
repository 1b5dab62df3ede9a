"""`workbench export --format deepspeed` and `export_deepspeed`: the files, the commands,
the round trip, bad input (nothing written). The generated script is run in
test_export_script.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from samples import CONFIGS, SAMPLE

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.deepspeed import import_deepspeed, to_deepspeed
from workbench.export import ExportError, export_deepspeed, train_deepspeed


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def job_values(script_path: str) -> dict[str, object]:
    """The job description written beside the exported script."""
    return json.loads((Path(script_path).parent / "job.json").read_text())


def listing(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# ----------------------------------------------------------------------------- files
def test_export_writes_config_script_and_launcher(tmp_path: Path) -> None:
    config = TrainConfig(
        zero_stage=2,
        precision="bf16",
        micro_batch=4,
        grad_accum=2,
        clip_grad_norm=1.0,
        lr_schedule="cosine",
        warmup_steps=10,
        total_steps=100,
        seed=7,
        activation_checkpointing=True,
    )
    result = export_deepspeed(config, gpus=4, out_dir=tmp_path / "job", model_options={"layers": 2})
    job = tmp_path / "job"
    assert sorted(os.listdir(tmp_path)) == ["job"]  # no temporary directory left behind
    assert sorted(os.listdir(job)) == [
        ".workbench-export.json",  # what the export wrote (a re-export keeps the rest)
        "ds_config.json",
        "job.json",
        "job_checkpoints.py",
        "job_common.py",
        "job_files.py",
        "job_parallel.py",
        "launch.sh",
        "train_deepspeed.py",
    ]
    names = (
        "ds_config.json",
        "train_deepspeed.py",
        "job_common.py",
        "job_files.py",
        "job_parallel.py",
        "job_checkpoints.py",
        "job.json",
        "launch.sh",
    )
    assert result.paths == tuple(str(job / n) for n in names)
    ds = json.loads((job / "ds_config.json").read_text())
    assert ds == to_deepspeed(config, world_size=4) == result.ds_config
    assert ds["train_batch_size"] == 4 * 2 * 4 and ds["zero_optimization"]["stage"] == 2
    assert result.world_size == 4 and result.hostfile_path is None

    script = job / "train_deepspeed.py"
    # the package's own module, copied as is (linted, type-checked and tested as code)
    assert script.read_text() == Path(train_deepspeed.__file__).read_text()
    assert script.stat().st_mode & stat.S_IXUSR
    values = job_values(str(script))
    assert values.pop("description").startswith("tiny-gpt, ZeRO stage 2")
    assert TrainConfig.from_dict(values.pop("config")) == config  # every setting, for scripts
    assert values == {
        "model": "tiny-gpt",
        "model_options": {"layers": 2},
        "seed": 7,
        "steps": 100,
        "num_workers": 0,
        "pin_memory": False,
        "activation_checkpointing": "full",
        "activation_offload": False,
        "exported_world_size": 4,
    }

    launch = job / "launch.sh"
    text = launch.read_text()
    assert launch.stat().st_mode & stat.S_IXUSR and text.startswith("#!/usr/bin/env bash\n")
    assert result.command == (
        "deepspeed --num_gpus 4 train_deepspeed.py --deepspeed_config ds_config.json"
    )
    assert f'exec {result.command} "$@"' in text
    assert result.torchrun_command == (
        "torchrun --standalone --nproc-per-node 4 train_deepspeed.py "
        "--deepspeed_config ds_config.json"
    )
    assert result.torchrun_command in text
    subprocess.run(["bash", "-n", str(launch)], check=True)  # valid shell


def test_steps_and_factory_model_go_into_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "src" / "mypkg").mkdir(parents=True)  # the factory must import at export
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "mypkg" / "models.py").write_text("def make_model(width=1): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    result = export_deepspeed(
        TrainConfig(total_steps=50),
        gpus=1,
        out_dir=tmp_path,
        model="mypkg.models:make_model",
        model_options={"width": 3},
        steps=20,
    )
    values = job_values(result.script_path)
    assert values["model"] == "mypkg.models:make_model" and values["steps"] == 20
    assert values["model_options"] == {"width": 3}
    assert result.estimate is None  # a factory's size is not known here


def test_multinode_writes_a_hostfile_template_and_the_hostfile_command(tmp_path: Path) -> None:
    config = TrainConfig(zero_stage=3, micro_batch=2, grad_accum=4)
    result = export_deepspeed(config, gpus=8, nodes=2, out_dir=tmp_path / "job")
    assert result.world_size == 16
    assert result.ds_config["train_batch_size"] == 2 * 4 * 16
    hostfile = tmp_path / "job" / "hostfile"
    assert result.hostfile_path == str(hostfile) and str(hostfile) in result.paths
    hosts = [ln for ln in hostfile.read_text().splitlines() if ln and not ln.startswith("#")]
    assert hosts == ["node-1 slots=8", "node-2 slots=8"]
    assert result.command == (
        "deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 train_deepspeed.py "
        "--deepspeed_config ds_config.json"
    )
    assert (
        "--nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK" in result.multinode_torchrun_command
    )
    text = Path(result.launch_path).read_text()
    assert f'exec {result.command} "$@"' in text and result.multinode_torchrun_command in text


def test_a_given_hostfile_is_checked_and_used(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\nworker-a slots=4\nworker-b slots=4  # spare\n")
    result = export_deepspeed(
        TrainConfig(), gpus=4, nodes=2, hostfile=hostfile, out_dir=tmp_path / "job"
    )
    copy = tmp_path / "job" / "hostfile"  # the job folder is what goes to the cluster
    assert result.hostfile_path == str(copy) and copy.read_text() == hostfile.read_text()
    assert result.command.startswith("deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 4 ")
    with pytest.raises(ValueError, match="lists 2 host\\(s\\); --nodes 3 needs at least 3"):
        export_deepspeed(TrainConfig(), gpus=4, nodes=3, hostfile=hostfile, out_dir=tmp_path / "x")
    with pytest.raises(ValueError, match="worker-a, worker-b have fewer than 8 slots"):
        export_deepspeed(TrainConfig(), gpus=8, nodes=2, hostfile=hostfile, out_dir=tmp_path / "x")
    hostfile.write_text("worker-a 4\n")
    with pytest.raises(ValueError, match="line 1 'worker-a 4': must be 'HOSTNAME slots=N'"):
        export_deepspeed(TrainConfig(), gpus=4, hostfile=hostfile, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_exported_json_imported_and_exported_again_is_identical(
    index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = export_deepspeed(CONFIGS[index], gpus=2, nodes=2, out_dir=tmp_path / "a")
    code, out, err = cli(
        [
            "export",
            "--format",
            "deepspeed",
            "--config",
            first.ds_config_path,
            "--out",
            str(tmp_path / "b"),
        ],
        capsys,
    )
    assert code == 0, err
    again = (tmp_path / "b" / "ds_config.json").read_bytes()
    assert again == Path(first.ds_config_path).read_bytes()
    assert "world size 4 (4 GPU(s) x 1 node(s))" in out  # inferred from the batch keys
    # and through the Python API
    imported = import_deepspeed(first.ds_config_path)
    third = export_deepspeed(imported.config, gpus=imported.world_size, out_dir=tmp_path / "c")
    assert Path(third.ds_config_path).read_bytes() == again


def test_reexport_in_place_and_flags_override_the_imported_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = export_deepspeed(CONFIGS[1], gpus=2, out_dir=tmp_path)
    before = Path(first.ds_config_path).read_bytes()
    code, _, err = cli(["export", "--config", first.ds_config_path, "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert Path(first.ds_config_path).read_bytes() == before
    code, _, err = cli(
        [
            "export",
            "--config",
            first.ds_config_path,
            "--out",
            str(tmp_path),
            "--zero",
            "3",
            "--gpus",
            "4",
            "--micro-batch",
            "2",
        ],
        capsys,
    )
    assert code == 0, err
    ds = json.loads(Path(first.ds_config_path).read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (2, 4)
    assert ds["train_batch_size"] == 2 * 4 * 4
    assert ds["fp16"] == json.loads(before)["fp16"]  # the rest is kept
    assert (
        "warning: train_batch_size=64: was for world size 2; exported for world size 4: "
        "8 x 4 x 4 = 128" in err
    )


# ----------------------------------------------------------------------------- the sample
def test_sample_config_imports_is_estimated_and_reexports_with_the_nvme_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.estimate import estimate_memory
    from workbench.models import build_model

    path = tmp_path / "sample.json"
    path.write_text(json.dumps(SAMPLE))
    code, out, err = cli(
        ["export", "--config", str(path), "--gpus", "8", "--out", str(tmp_path / "job")], capsys
    )
    assert code == 0, err
    warning, buffers = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    # DeepSpeed's buffer sizes: read by an estimate, not set in the session
    assert buffers.endswith("sizes its own (1): zero_optimization.overlap_comm")
    for key in ("offload_optimizer", "offload_param"):
        assert (
            f"zero_optimization.{key}.nvme_path='/mnt/nvme' (ignored while device is 'cpu')"
        ) in warning
    assert "steps_per_print" in warning
    # DeepSpeed's ZeRO-3 offload layout: no weights or states on the GPU, its reduce bucket
    assert "estimated per GPU: params 0 B, grads 1.54 MiB, optimizer states 0 B" in out
    assert "offloaded to CPU" in out
    assert "deepspeed --num_gpus 8 train_deepspeed.py --deepspeed_config ds_config.json" in out

    ds = json.loads((tmp_path / "job" / "ds_config.json").read_text())
    assert ds["train_batch_size"] == 1024 and ds["gradient_accumulation_steps"] == 8
    assert ds["train_micro_batch_size_per_gpu"] == 1024 // (8 * 8)
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale_window"] == 1000
    assert ds["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    }
    assert ds["optimizer"]["params"]["lr"] == 6e-5

    # the estimate is the estimator's, for the built-in model and the imported settings
    imported = import_deepspeed(path, world_size=8)
    result = export_deepspeed(
        imported.config, gpus=8, out_dir=tmp_path / "job2", warnings=imported.warnings
    )
    assert any("nvme_path='/mnt/nvme' (ignored" in w for w in result.warnings)
    info = build_model("tiny-gpt")[3]
    expected = estimate_memory(
        n_params=info.n_params,
        layers=info.layers,
        hidden=info.hidden,
        heads=info.heads,
        seq_len=info.seq_len,
        vocab=info.vocab,
        micro_batch=16,
        precision="fp16",
        optimizer="adamw",
        zero_stage=3,
        gpus=8,
        offload_optimizer=True,
        offload_params=True,
        accounting="deepspeed",  # the exported job runs under DeepSpeed
        attention=info.attention,  # tiny-gpt writes its attention out by hand: eager
        dropout=info.dropout > 0,
        grad_accum=8,  # the config's gradient_accumulation_steps
    )
    assert result.estimate == expected
    assert expected.params_bytes == expected.optimizer_bytes == 0
    # the stage-3 reduce bucket in fp16, which holds the whole of this small model
    assert expected.grads_bytes == 2 * info.n_params
    assert expected.cpu_offload_bytes > 0
    # re-exporting the re-export changes nothing
    code, _, err = cli(
        [
            "export",
            "--config",
            str(tmp_path / "job" / "ds_config.json"),
            "--out",
            str(tmp_path / "job3"),
        ],
        capsys,
    )
    assert code == 0, err
    assert "nvme_path" not in err  # the re-export no longer carries the ignored keys
    assert (tmp_path / "job3" / "ds_config.json").read_bytes() == (
        tmp_path / "job" / "ds_config.json"
    ).read_bytes()


# ----------------------------------------------------------------------------- CLI
def test_cli_prints_where_it_wrote_and_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "job"
    code, out, _ = cli(
        [
            "export",
            "--format",
            "deepspeed",
            "--out",
            str(out_dir),
            "--gpus",
            "2",
            "--zero",
            "3",
            "--precision",
            "bf16",
            "--micro-batch",
            "4",
            "--grad-accum",
            "2",
            "--lr",
            "1e-3",
            "--clip-grad-norm",
            "1.0",
            "--offload-optimizer",
            "--offload-params",
            "cpu",
            "--model",
            "mlp",
            "--model-option",
            "hidden=32",
        ],
        capsys,
    )
    assert code == 0
    assert out.splitlines()[0] == (
        f"wrote {out_dir}: ds_config.json, train_deepspeed.py, job_common.py, job_files.py, "
        "job_parallel.py, job_checkpoints.py, job.json, launch.sh"
    )
    assert "deepspeed --num_gpus 2 train_deepspeed.py --deepspeed_config ds_config.json" in out
    assert "torchrun --standalone --nproc-per-node 2" in out
    ds = json.loads((out_dir / "ds_config.json").read_text())
    expected = TrainConfig(
        zero_stage=3,
        precision="bf16",
        micro_batch=4,
        grad_accum=2,
        lr=1e-3,
        clip_grad_norm=1.0,
        offload_optimizer="cpu",
        offload_params="cpu",
    )
    assert ds == to_deepspeed(expected, world_size=2)
    assert job_values(str(out_dir / "train_deepspeed.py"))["model_options"] == {"hidden": 32}

    code, out, _ = cli(["export", "--out", str(out_dir), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["world_size"] == 1 and data["ds_config"] == to_deepspeed(TrainConfig())
    assert (
        data["command"]
        == "deepspeed --num_gpus 1 train_deepspeed.py --deepspeed_config ds_config.json"
    )
    assert data["estimate"]["params_bytes"] > 0


BAD = [
    (["--format", "onnx"], "--format onnx: allowed formats: deepspeed"),
    (["--zero", "5"], "--zero 5: must be 0, 1, 2 or 3"),
    (
        ["--zero", "x", "--micro-batch", "0"],
        ("--micro-batch 0: must be an integer >= 1", "; --zero x: must be 0, 1, 2 or 3"),
    ),
    (
        ["--offload-params", "cpu", "--zero", "2"],
        "--offload-params cpu: parameter offload needs --zero 3 (--zero 2)",
    ),
    (
        ["--offload-optimizer", "nvme", "--zero", "2"],
        "--nvme-path: NVMe offload needs nvme_path, a writable directory",
    ),
    (
        ["--precision", "fp8", "--lr", "-1"],
        "--precision fp8: must be one of fp32, amp-fp16, amp-bf16, fp16, bf16, bf16-true; "
        "--lr -1: must be a finite number > 0",
    ),
    (
        ["--precision", "fp16", "--loss-scale-init", "1000"],
        "--loss-scale-init 1000: DeepSpeed fp16 needs a power of two",
    ),
    (["--gpus", "0"], "--gpus 0: must be an integer >= 1"),
    (["--nodes", "two"], "--nodes two: must be an integer >= 1"),
    (["--steps", "0"], "--steps 0: must be an integer >= 1"),
    (["--model", "gpt9"], "--model gpt9: must be one of tiny-gpt, mlp, cnn or a factory"),
    (["--model", "pkg.mod:"], "--model pkg.mod:: a factory must be written 'pkg.module:function'"),
    (["--model-option", "layers=0"], "--model-option layers=0: must be an integer >= 1"),
    (["--model-option", "colour=red"], "--model-option colour: unknown for 'tiny-gpt'; allowed:"),
    (["--model-option", "seed=3"], "seeded from the config's seed"),
    (["--model-option", "nokey"], "--model-option nokey: must be KEY=VALUE"),
    (
        ["--config", "/no/such.json"],
        "--config /no/such.json: DeepSpeed config '/no/such.json': no such file",
    ),
    (
        ["--hostfile", "/no/such/hosts", "--nodes", "2"],
        "--hostfile /no/such/hosts: cannot be read: no such file",
    ),
    (["--lr"], "--lr expected one argument"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(
    argv: list[str],
    message: str | tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out_dir = tmp_path / "job"
    code, out, err = cli(["export", "--out", str(out_dir), *argv], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("workbench export: error: ")
    for part in (message,) if isinstance(message, str) else message:
        assert part in err
    assert os.listdir(tmp_path) == []


def test_bad_config_file_and_wrong_world_size_name_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = dict(SAMPLE, zero_optimization={"stage": 7, "bogus": 1})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    code, _, err = cli(["export", "--config", str(path), "--out", str(tmp_path / "job")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "zero_optimization.stage=7: DeepSpeed" in err and "Input should be 0, 1, 2, 3" in err
    assert "zero_optimization.bogus: DeepSpeed" in err and "not one of its settings here" in err
    path.write_text(json.dumps(SAMPLE))
    code, _, err = cli(
        ["export", "--config", str(path), "--gpus", "3", "--out", str(tmp_path / "job")], capsys
    )
    assert code == 2
    assert (
        "train_batch_size=1024: must be a multiple of gradient_accumulation_steps (8) x "
        "world size (3) = 24" in err
    )
    assert sorted(os.listdir(tmp_path)) == ["bad.json"]


def test_a_failed_export_leaves_an_existing_job_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export_deepspeed(TrainConfig(zero_stage=1), gpus=2, out_dir=tmp_path / "job")
    before = listing(tmp_path)
    code, _, _ = cli(
        ["export", "--out", str(tmp_path / "job"), "--zero", "2", "--gpus", "-1"], capsys
    )
    assert code == 2
    assert listing(tmp_path) == before


def test_a_write_failure_removes_what_it_created(tmp_path: Path, monkeypatch) -> None:
    def fail(source: object, target: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    out_dir = tmp_path / "new" / "deeper" / "job"
    with pytest.raises(
        ExportError, match="cannot write there: No space left on device; nothing was changed"
    ):
        export_deepspeed(TrainConfig(), gpus=1, out_dir=out_dir)
    assert os.listdir(tmp_path) == []


def test_an_export_that_fails_on_one_file_leaves_the_previous_job_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job"
    export_deepspeed(TrainConfig(zero_stage=1), gpus=2, out_dir=job)
    (job / "launch.sh").unlink()
    (job / "launch.sh").mkdir()  # the new launch.sh cannot be written
    before = listing(tmp_path)
    code, out, err = cli(["export", "--out", str(job), "--zero", "3", "--gpus", "4"], capsys)
    assert code == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1
    assert f"--out {job}: cannot write there: a folder has that name (launch.sh)" in err
    assert "nothing was changed there" in err
    assert listing(tmp_path) == before  # ds_config.json still the ZeRO-1, 2-GPU one
    assert json.loads((job / "ds_config.json").read_text())["zero_optimization"]["stage"] == 1
    assert sorted(os.listdir(job)) == sorted(
        [
            ".workbench-export.json",
            "ds_config.json",
            "job.json",
            "job_checkpoints.py",
            "job_common.py",
            "job_files.py",
            "job_parallel.py",
            "launch.sh",
            "train_deepspeed.py",
        ]
    )  # no staged file left behind


def test_out_dir_that_is_a_file_is_refused(tmp_path: Path, capsys) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    code, _, err = cli(["export", "--out", str(target)], capsys)
    assert code == 2 and f"--out {target}: exists and is not a directory" in err


def test_python_api_reports_every_problem_at_once(tmp_path: Path) -> None:
    with pytest.raises(ExportError) as info:
        export_deepspeed(
            TrainConfig(), gpus=0, nodes=True, model="nope", out_dir=tmp_path / "j", steps=0
        )  # type: ignore[arg-type]
    problems = info.value.problems
    assert [p.field for p in problems] == ["gpus", "nodes", "steps", "model"]
    assert [p.value for p in problems] == [0, True, 0, "nope"]
    assert tuple(str(p) for p in problems) == (
        "gpus=0: must be an integer >= 1, at most 1,024 (more ranks than one node runs)",
        "nodes=True: must be an integer >= 1, at most 65,536 (more nodes than any cluster has)",
        "steps=0: must be an integer >= 1, at most 1,000,000,000,000 (longer than any training "
        "run), or None (config.total_steps)",
        "model='nope': must be one of tiny-gpt, mlp, cnn or a factory 'pkg.module:function'",
    )
    assert str(info.value).startswith("cannot export, 4 problems:")
    with pytest.raises(ValueError, match="config=.*must be a workbench.TrainConfig"):
        export_deepspeed({"zero_stage": 1}, gpus=1, out_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ExportError, match="loss_scale_growth=3.0: DeepSpeed fp16 grows"):
        export_deepspeed(
            TrainConfig(precision="fp16", loss_scale_growth=3.0), gpus=1, out_dir=tmp_path / "j"
        )
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- careless input
def test_a_model_option_the_model_cannot_take_is_refused_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "job"
    code, out, err = cli(["export", "--out", str(out_dir), "--model-option", "heads=3"], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    assert "--model-option heads=3: must divide hidden=128 evenly" in err
    code, _, err = cli(
        ["export", "--out", str(out_dir), "--model", "cnn", "--model-option", "image_size=18"],
        capsys,
    )
    assert code == 2 and "--model-option image_size=18: must be a multiple of 4" in err
    code, _, err = cli(["export", "--out", str(out_dir), "--model-option", "dropout=1.5"], capsys)
    assert code == 2 and "--model-option dropout=1.5: must be a number in [0, 1)" in err
    code, _, err = cli(["export", "--out", str(out_dir), "--model-option", "layers=1e400"], capsys)
    assert code == 2
    assert "--model-option layers=1e400: '1e400': JSON numbers must be finite" in err
    assert os.listdir(tmp_path) == []


def test_an_absurd_model_size_is_refused_without_allocating_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import resource

    out_dir = tmp_path / "job"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, out, err = cli(
        ["export", "--out", str(out_dir), "--model", "mlp", "--model-option", "hidden=100000"],
        capsys,
    )
    assert code == 2 and out == "" and "Traceback" not in err
    assert "--model-option hidden=100000: must be an integer >= 1, at most 65,536" in err
    code, _, err = cli(
        ["export", "--out", str(out_dir), "--model", "mlp", "--model-option", "hidden=60000"],
        capsys,
    )
    assert code == 2
    assert (
        "--model-option hidden=60000: 'mlp' has about 7.2B parameters: more than the 2B a "
        "built-in model may have" in err
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown_kib < 2**20  # far less than the 29 GB the 7.2B parameters would take
    code, _, err = cli(
        ["export", "--out", str(out_dir), "--model", "mlp", "--model-option", f"hidden={10**30}"],
        capsys,
    )
    assert code == 2
    assert f"--model-option hidden={10**30}: must be an integer >= 1, at most 65,536" in err
    assert os.listdir(tmp_path) == []


def test_the_estimate_measured_on_the_meta_device_is_the_built_models(tmp_path: Path) -> None:
    from workbench.models import build_model
    from workbench.prediction import predict_memory

    config = TrainConfig(zero_stage=2)
    for model, options in (("tiny-gpt", {"layers": 2}), ("mlp", {"hidden": 32}), ("cnn", {})):
        result = export_deepspeed(
            config, gpus=2, out_dir=tmp_path / model, model=model, model_options=options
        )
        info = build_model(model, **options)[3]
        assert result.estimate == predict_memory(config, info, 2)


def test_a_seed_the_script_cannot_take_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "job"
    code, out, err = cli(["export", "--out", str(out_dir), "--seed", str(2**64)], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"--seed {2**64}: must be an integer >= 0, at most" in err
    code, _, err = cli(
        ["export", "--format", "lightning", "--out", str(out_dir), "--seed", str(2**40)], capsys
    )
    assert code == 2
    assert (
        f"--seed {2**40}: must be an integer >= 0, at most 4,294,967,295 (Lightning's "
        "seed_everything takes a 32-bit seed)" in err
    )
    assert os.listdir(tmp_path) == []


def test_a_binary_or_endless_hostfile_or_config_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "hosts.bin"
    binary.write_bytes(bytes([0x00, 0xD2, 0xFF, 0x80]) * 64)
    out_dir = tmp_path / "job"
    code, out, err = cli(
        ["export", "--out", str(out_dir), "--nodes", "2", "--hostfile", str(binary)], capsys
    )
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"--hostfile {binary}: cannot be read: not UTF-8 text (byte 0xd2 at offset 1)" in err
    code, _, err = cli(
        ["export", "--out", str(out_dir), "--nodes", "2", "--hostfile", "/dev/urandom"], capsys
    )
    assert code == 2 and "--hostfile /dev/urandom: cannot be read: a device" in err
    (tmp_path / "hosts").write_text(f"node-1 slots={'9' * 5000}\nnode-2 slots=8\n")
    code, _, err = cli(
        ["export", "--out", str(out_dir), "--nodes", "2", "--hostfile", str(tmp_path / "hosts")],
        capsys,
    )
    assert code == 2 and "line 1 'node-1 slots=999" in err and "(N at most 1024)" in err
    fifo = tmp_path / "ds.fifo"
    os.mkfifo(fifo)
    code, _, err = cli(["export", "--out", str(out_dir), "--config", str(fifo)], capsys)
    assert code == 2
    assert f"--config {fifo}: DeepSpeed config '{fifo}': a FIFO (named pipe), not a regular" in err
    assert sorted(os.listdir(tmp_path)) == ["ds.fifo", "hosts", "hosts.bin"]


def test_six_bad_flags_are_six_problems_in_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "job"
    code, out, err = cli(
        [
            "export",
            "--out",
            str(out_dir),
            "--gpus",
            "0",
            "--steps",
            "-3",
            "--zero",
            "9",
            "--micro-batch",
            "0",
            "--model",
            "gpt9",
            "--hostfile",
            "/no/such/hosts",
        ],
        capsys,
    )
    assert code == 2 and out == "" and err.count("\n") == 1
    for part in (
        "--gpus 0: must be an integer >= 1, at most 1,024",
        "--steps -3: must be an integer >= 1, at most 1,000,000,000,000 (longer than any "
        "training run) (without it: --total-steps)",
        "--zero 9: must be 0, 1, 2 or 3",
        "--micro-batch 0: must be an integer >= 1",
        "--model gpt9: must be one of tiny-gpt, mlp, cnn",
        "--hostfile /no/such/hosts: cannot be read: no such file",
    ):
        assert part in err
    assert err.count("; ") >= 5
    assert os.listdir(tmp_path) == []


def test_out_dir_names_that_no_file_system_takes_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_name = tmp_path / ("j" * 300)
    code, out, err = cli(["export", "--out", str(long_name)], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    assert "not a usable directory path (File name too long)" in err
    code, _, err = cli(["export", "--out", "job\0x"], capsys)
    assert code == 2 and "--out job\\x00x: not a usable directory path (embedded null" in err
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- pure bf16
def test_pure_bf16_exports_as_fsdp_and_lightning_jobs_and_deepspeed_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.export import check_export, export_job

    pure = TrainConfig(precision="bf16-true", micro_batch=4)
    fsdp = export_job(
        pure.replace(fsdp="full_shard"), format="fsdp", gpus=2, out_dir=tmp_path / "fsdp"
    )
    assert job_values(fsdp.script_path)["config"]["precision"] == "bf16-true"  # type: ignore[index]
    assert fsdp.estimate is not None and fsdp.estimate.accounting == "fsdp"
    lightning = export_job(pure, format="lightning", gpus=2, out_dir=tmp_path / "lightning")
    job = job_values(lightning.script_path)
    assert job["strategy"] == "ddp" and job["config"]["precision"] == "bf16-true"  # type: ignore[index]
    # data parallel replicas: the plain loop's accounting, 2 bytes per weight
    assert lightning.estimate is not None and lightning.estimate.accounting == "paper"
    assert lightning.estimate.params_bytes == 2 * lightning.estimate.n_params
    assert lightning.ds_config_path is None
    # DeepSpeed keeps an fp32 master copy: no DeepSpeed job trains pure bf16
    (problem,) = check_export(pure, format="deepspeed", gpus=2, out_dir=tmp_path / "ds")
    assert (problem.field, problem.value) == ("precision", "bf16-true")
    assert "use 'bf16' (DeepSpeed's bf16 with an fp32 master copy)" in problem.message
    with pytest.raises(ExportError, match=r"cannot export: precision='bf16-true': pure bf16"):
        export_deepspeed(pure, gpus=2, out_dir=tmp_path / "ds")
    code, _, err = cli(
        ["export", "--precision", "bf16-true", "--out", str(tmp_path / "ds")], capsys
    )
    assert code == 2 and "--precision bf16-true: pure bf16 has no fp32 master copy" in err
    assert "or pure bf16 with --fsdp (full_shard, shard_grad_op or no_shard) and --zero 0" in err
    assert not (tmp_path / "ds").exists()


def test_every_precision_has_lightnings_name() -> None:
    import lightning  # noqa: F401  (the `test` extra installs it; a broken install fails here)

    from workbench.config import Precision
    from workbench.export import train_lightning

    assert set(train_lightning.PRECISION) == set(Precision.choices())
    assert train_lightning.PRECISION["bf16-true"] == "bf16-true"
    assert train_lightning.PRECISION["amp-bf16"] == "bf16-mixed"


@pytest.mark.parametrize("fmt", ["fsdp", "lightning"])
def test_tensor_parallel_in_exports_carried_where_the_job_holds_the_plan(
    fmt: str, tmp_path: Path
) -> None:
    from workbench.export import check_export

    config = TrainConfig(micro_batch=4, tp=2)
    if fmt == "fsdp":
        config = config.replace(fsdp="full_shard")
    assert check_export(config, format=fmt, gpus=2, out_dir=tmp_path / "job") == []
    bad = check_export(config.replace(tp=4), format=fmt, gpus=2, out_dir=tmp_path / "j")
    assert [(p.field, p.value) for p in bad] == [("tp", 4)]
    assert "must divide the 2 ranks" in bad[0].message
    if fmt == "lightning":  # its data-parallel ranks go through FSDP2, never plain
        (off,) = check_export(config, format=fmt, gpus=4, out_dir=tmp_path / "j")
        assert (off.field, off.value) == ("fsdp", "off")
        assert "use full_shard or shard_grad_op" in off.message
        sharded = config.replace(fsdp="full_shard")
        assert check_export(sharded, format=fmt, gpus=4, out_dir=tmp_path / "j") == []
    no_shard = config.replace(fsdp="no_shard")
    (problem,) = check_export(no_shard, format=fmt, gpus=2, out_dir=tmp_path / "j")
    assert problem.field == "fsdp" and "use full_shard or shard_grad_op" in problem.message


@pytest.mark.parametrize(
    ("fmt", "setting"),
    [
        ("deepspeed", {"tp": 2}),
        ("deepspeed", {"pp": 2, "grad_accum": 4}),
        ("fsdp", {"pp": 2, "grad_accum": 4}),
        ("lightning", {"pp": 2, "grad_accum": 4}),
    ],
)
def test_tensor_and_pipeline_parallel_in_exports_refused_with_the_reason(
    fmt: str, setting: dict[str, int], tmp_path: Path
) -> None:
    from workbench.export import check_export

    config = TrainConfig(micro_batch=4, **setting)
    problems = check_export(config, format=fmt, gpus=2, out_dir=tmp_path / "job")
    name = "tp" if "tp" in setting else "pp"
    (problem,) = [p for p in problems if p.field == name]
    assert problem.value == 2
    assert f"not exported to --format {fmt}:" in problem.message
    assert f"`workbench launch --{name}` train it" in problem.message
    assert not (tmp_path / "job").exists()
