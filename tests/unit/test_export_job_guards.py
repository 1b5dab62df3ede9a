"""An exported job refuses what it cannot finish before it trains, and an export refuses
what its job cannot train (each with the setting named), so nothing trained is lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import TrainConfig
from workbench.export import ExportError, export_job

REPO = Path(__file__).resolve().parents[2]
TINY_GPT = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def test_the_deepspeed_job_checks_its_save_dir_before_training(tmp_path: Path) -> None:
    out = tmp_path / "job"
    export_job(TrainConfig(micro_batch=2), gpus=1, out_dir=out, model_options=TINY_GPT, steps=1)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for bad, said in ((str(blocker), "must be a folder"), ("/proc/nope", "cannot write there")):
        done = subprocess.run(
            [sys.executable, "train_deepspeed.py", "--save_dir", bad],
            cwd=out, env=_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"--save_dir {bad!r}: {said}" in done.stderr
        assert '"step"' not in done.stdout  # refused before the first step


def _refused(tmp_path: Path, config: TrainConfig, **kwargs: object) -> str:
    out = tmp_path / "job"
    options = {"model_options": TINY_GPT} if kwargs.get("model", "tiny-gpt") == "tiny-gpt" else {}
    with pytest.raises(ExportError) as caught:
        export_job(config, out_dir=out, **{"gpus": 1, **options, **kwargs})  # type: ignore[arg-type]
    assert not out.exists()  # nothing written
    return str(caught.value)


@pytest.mark.parametrize("fmt", ["fsdp", "lightning"])
@pytest.mark.parametrize("optimizer", ["lamb", "lion", "adagrad", "onebitadam"])
def test_fsdp_and_lightning_refuse_the_optimizers_their_scripts_do_not_build(
    fmt: str, optimizer: str, tmp_path: Path
) -> None:
    config = TrainConfig(optimizer=optimizer, fsdp="full_shard" if fmt == "fsdp" else "off")
    text = _refused(tmp_path, config, format=fmt)
    assert f"optimizer={optimizer!r}: the --format {fmt} script builds adamw, adam, sgd" in text


def test_lightning_with_deepspeed_refuses_torchs_amp(tmp_path: Path) -> None:
    text = _refused(tmp_path, TrainConfig(zero_stage=2, precision="amp-bf16"), format="lightning")
    assert "precision='amp-bf16': Lightning's DeepSpeed strategy trains DeepSpeed's own" in text


def test_lightning_with_fsdp_refuses_norm_clipping(tmp_path: Path) -> None:
    """Lightning's FSDP strategy raises at the first clipped step (its FSDPPrecision, the
    installed Lightning's: checked here): refused at export naming --format fsdp, whose
    script clips, and by the job itself where job.json was edited to ask for it."""
    import json

    from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="'norm'` is currently not supported"):
        FSDPPrecision("32-true").clip_grad_by_norm(None, 1.0)
    clipped = TrainConfig(fsdp="full_shard", clip_grad_norm=1.0)
    text = _refused(tmp_path, clipped, format="lightning")
    assert (
        "clip_grad_norm=1.0: --format lightning with --fsdp (Lightning's FSDP strategy) "
        "cannot clip by norm" in text
    )
    assert "use --format fsdp, whose script clips the norm over the shards" in text
    export_job(clipped, format="fsdp", gpus=1, out_dir=tmp_path / "fsdp", model_options=TINY_GPT)
    out = tmp_path / "lightning"
    export_job(
        clipped.replace(fsdp="off"), format="lightning", gpus=1, out_dir=tmp_path / "ddp",
        model_options=TINY_GPT,
    )  # fmt: skip
    export_job(clipped.replace(clip_grad_norm=None), format="lightning", gpus=1, out_dir=out)
    job = json.loads((out / "job.json").read_text())
    job["config"]["clip_grad_norm"] = 1.0  # edited after the export
    (out / "job.json").write_text(json.dumps(job))
    done = subprocess.run(
        [sys.executable, "train_lightning.py", "--steps", "1"],
        cwd=out, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "config.clip_grad_norm=1.0: Lightning's FSDP strategy cannot clip by norm" in done.stderr
    assert '"step"' not in done.stdout


def test_deepspeed_refuses_amp_fp16_as_launch_does(tmp_path: Path) -> None:
    from workbench.engines import AMP_FP16_DEEPSPEED, engine_problems

    text = _refused(tmp_path, TrainConfig(precision="amp-fp16"))
    assert f"precision='amp-fp16': {AMP_FP16_DEEPSPEED}" in text
    launched = engine_problems(TrainConfig(precision="amp-fp16", zero_stage=1), 2)
    assert [p.message.endswith(AMP_FP16_DEEPSPEED) for p in launched] == [True]
    assert "GradScaler" not in AMP_FP16_DEEPSPEED  # DeepSpeed 0.19 has one (ZeRO-0 autocast)


@pytest.mark.parametrize("fmt", ["deepspeed", "fsdp", "lightning"])
def test_compile_is_refused_by_name_where_no_script_compiles(fmt: str, tmp_path: Path) -> None:
    config = TrainConfig(compile=True, fsdp="full_shard" if fmt == "fsdp" else "off")
    assert "compile=True: the exported jobs do not run torch.compile" in _refused(
        tmp_path, config, format=fmt
    )


@pytest.mark.parametrize(
    ("settings", "model", "said"),
    [
        ({"activation_checkpointing": "full"}, "mlp", "activation_checkpointing='full': the model"),
        ({"activation_checkpointing": "selective"}, "mlp", "activation_checkpointing='selective'"),
        ({"attention": "sdpa"}, "mlp", "attention='sdpa': the model is neither"),
        ({"lora_rank": 4, "lora_targets": "nothing"}, "tiny-gpt", "lora_targets='nothing': picks"),
    ],
)
def test_what_the_model_cannot_train_is_refused_at_export(
    settings: dict[str, object], model: str, said: str, tmp_path: Path
) -> None:
    assert said in _refused(tmp_path, TrainConfig(**settings), model=model)  # type: ignore[arg-type]


def test_the_lightning_fsdp_job_carries_cpu_offload_and_the_fp32_reduce(tmp_path: Path) -> None:
    import json

    import torch

    from workbench.export import train_lightning
    from workbench.models import build_model

    config = TrainConfig(fsdp="full_shard", precision="amp-bf16", offload_params="cpu")
    out = tmp_path / "job"
    export_job(config, format="lightning", gpus=2, out_dir=out, model_options=TINY_GPT)
    job = json.loads((out / "job.json").read_text())
    model = build_model("tiny-gpt", seed=0, **TINY_GPT)[0]
    made = train_lightning.strategy(job, model, 2)
    assert made.cpu_offload.offload_params is True
    mp = made.mixed_precision_config
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.bfloat16, torch.float32)
    job["config"].update(fsdp_reduce_fp32=False, offload_params="none")
    made = train_lightning.strategy(job, model, 2)
    assert not made.cpu_offload.offload_params and made.mixed_precision is None  # Lightning's


def test_a_relative_text_path_is_stored_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    (tmp_path / "mytext.txt").write_text("to be or not to be " * 20)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "job"
    export_job(TrainConfig(), gpus=1, out_dir=out, model_options={**TINY_GPT, "text": "mytext.txt"})
    job = json.loads((out / "job.json").read_text())
    assert job["model_options"]["text"] == str(tmp_path / "mytext.txt")
    assert f"--text {tmp_path / 'mytext.txt'}" in (out / "launch.sh").read_text()


def test_a_factory_that_does_not_import_is_refused(tmp_path: Path) -> None:
    text = _refused(tmp_path, TrainConfig(), model="nosuch.mod:fn")
    assert "model='nosuch.mod:fn': module 'nosuch.mod' is not importable" in text


def test_a_factory_found_only_in_the_export_folder_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mymodels_guard.py").write_text("def make():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    result = export_job(
        TrainConfig(), gpus=1, out_dir=tmp_path / "job", model="mymodels_guard:make"
    )
    (line,) = [w for w in result.warnings if "mymodels_guard" in w]
    assert f"imports here from the folder you export from ({tmp_path})" in line
    assert f"PYTHONPATH={tmp_path}" in line
    # in the job folder itself: found where the job runs, nothing said
    (tmp_path / "job2").mkdir()
    (tmp_path / "job2" / "mymodels_guard.py").write_text("def make():\n    pass\n")
    again = export_job(
        TrainConfig(), gpus=1, out_dir=tmp_path / "job2", model="mymodels_guard:make"
    )
    assert not [w for w in again.warnings if "mymodels_guard" in w]


def test_the_reports_batch_arithmetic_counts_data_parallel_ranks_under_tp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.cli import main

    argv = ["export", "--format", "fsdp", "--fsdp", "full_shard", "--tp", "2", "--gpus", "8"]
    assert main([*argv, "--micro-batch", "8", "--out", str(tmp_path / "j")]) == 0
    out = capsys.readouterr().out
    assert "train_batch_size 32 = micro-batch 8 x grad-accum 1 x dp 4 (8 ranks / tp 2)" in out


def test_the_launch_table_names_the_accounting_it_predicted_with(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import workbench.cli.launch as cli_launch
    from workbench.cli import main
    from workbench.train.launch import LaunchResult

    done = LaunchResult(
        ranks=(), world_size=2, launcher="torchrun", command=(), returncode=0,
        first_error=None, timed_out=False, preempted=False, checkpoint_dir=None,
        checkpoint_step=None, n_params=10,
    )  # fmt: skip
    monkeypatch.setattr(cli_launch, "launch_ranks", lambda *a, **k: done)
    for flags, accounting in (([], "deepspeed"), (["--fsdp", "full_shard"], "fsdp")):
        assert main(["launch", "--ranks", "2", "--steps", "1", *flags]) == 0
        assert f"(accounting={accounting!r})" in capsys.readouterr().out


def test_problems_are_said_once_naming_what_the_user_gave(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.cli import main

    def code(argv: list[str]) -> object:
        try:
            return main(argv)
        except SystemExit as exc:
            return exc.code

    base = ["export", "--out", str(tmp_path / "j")]
    assert code([*base, "--model-option", "text=/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert err.count("text='/dev/zero'") == 1 and err.count("\n") == 1
    assert code([*base, "--model-option", "documents=packed"]) == 2
    err = capsys.readouterr().err
    assert "--model-option documents='packed': the layout is the --documents setting" in err
    text = _refused(tmp_path, TrainConfig(tp=2), format="fsdp", gpus=4)
    assert "fsdp='off': no exported job carries plain data parallel (DDP)" in text
    assert "--format fsdp needs" not in text


def test_the_report_says_where_offloaded_states_go_and_what_a_lightning_job_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from workbench.cli import main

    nvme = ["--zero", "3", "--offload-optimizer", "nvme", "--nvme-path", str(tmp_path)]
    assert main(["export", *nvme, "--out", str(tmp_path / "n")]) == 0
    out = capsys.readouterr().out
    assert "; offloaded to NVMe " in out and "offloaded to CPU" not in out
    monkeypatch.chdir(tmp_path)  # --out left out: the format's own folder
    assert main(["export", "--format", "lightning", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'lightning_job'}: ")
    assert "tiny-gpt, data parallel (DDP), fp32" in out and "ZeRO stage" not in out
    assert "data parallel (DDP)" in (tmp_path / "lightning_job" / "launch.sh").read_text()


def test_a_hostfile_is_refused_where_the_job_starts_under_torchrun(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=1\n")
    config = TrainConfig(fsdp="full_shard")
    text = _refused(tmp_path, config, format="fsdp", nodes=2, hostfile=str(hostfile))
    assert "hostfile=" in text and "is for DeepSpeed's launcher; the --format fsdp job" in text


def test_a_hostfile_naming_a_host_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeepSpeed's launcher refuses such a file when the job starts (each host is one node);
    the export refuses it first, naming the file, the host and its lines."""
    from workbench.cli import main

    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\nnode-a slots=2\nnode-b slots=2\nnode-a slots=2  # again\n")
    text = _refused(tmp_path, TrainConfig(), nodes=2, gpus=2, hostfile=str(hostfile))
    assert (
        f"hostfile={str(hostfile)!r}: names a host more than once ('node-a' on lines 2, 4): "
        "list each host on one line" in text
    )
    hostfile.write_text("".join(f"{h} slots=1\n" for h in "abcde" * 2 + "a" * 5))
    with pytest.raises(SystemExit) as exited:
        main(["export", "--nodes", "2", "--hostfile", str(hostfile), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"--hostfile {hostfile}: names a host more than once (" in err
    assert "'a' on lines 1, 6, 11, 12, 13 and 2 more; 'b' on lines 2, 7; 'c' on lines 3, 8" in err
    assert "and 2 more host(s))" in err
    assert sorted(os.listdir(tmp_path)) == ["hosts"]


def test_a_given_hostfile_is_copied_into_the_job_and_named_relatively(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job folder is what goes to the cluster: the hostfile travels in it, as the
    template does, and launch.sh names it from the folder (was: this machine's path)."""
    from workbench.cli import main

    given = tmp_path / "hosts"
    given.write_text("# my cluster\ngpu-a slots=8\ngpu-b slots=8\n")
    out = tmp_path / "job"
    result = export_job(TrainConfig(), gpus=8, nodes=2, hostfile=str(given), out_dir=out)
    assert (out / "hostfile").read_text() == given.read_text()
    assert result.hostfile_path == str(out / "hostfile") and result.hostfile_path in result.paths
    assert result.command.startswith("deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 ")
    assert str(tmp_path) not in (out / "launch.sh").read_text()
    argv = ["export", "--gpus", "8", "--nodes", "2", "--out", str(out)]
    assert main([*argv, "--hostfile", str(out / "hostfile")]) == 0  # its own copy, again
    assert (out / "hostfile").read_text() == given.read_text()
    assert "edit " not in capsys.readouterr().out  # filled in already: nothing to edit


def test_numpy_and_torch_integers_are_taken_as_the_numbers_they_hold(tmp_path: Path) -> None:
    """A sweep's `numpy.int64` values (or torch's) export the job plain ints would: job.json
    and the result hold Python ints. A bool or a non-integral value is still refused by name."""
    import json

    import numpy as np
    import torch

    config = TrainConfig(micro_batch=np.int64(2), grad_accum=torch.tensor(2))
    options = {**TINY_GPT, "layers": np.int64(1)}
    result = export_job(
        config, gpus=np.int64(2), nodes=torch.tensor(2), steps=np.int32(3),
        model_options=options, out_dir=tmp_path / "sweep",
    )  # fmt: skip
    assert (result.gpus, result.nodes, result.world_size) == (2, 2, 4)
    assert type(result.gpus) is int and type(result.nodes) is int
    assert result.command.startswith("deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 2 ")
    job = json.loads((tmp_path / "sweep" / "job.json").read_text())
    assert job["steps"] == 3 and job["model_options"]["layers"] == 1
    assert job["config"]["micro_batch"] == 2 and job["config"]["grad_accum"] == 2
    plain = export_job(
        TrainConfig(micro_batch=2, grad_accum=2), gpus=2, nodes=2, steps=3,
        model_options={**TINY_GPT, "layers": 1}, out_dir=tmp_path / "plain",
    )  # fmt: skip
    assert plain.ds_config == result.ds_config and plain.command == result.command
    text = _refused(tmp_path, TrainConfig(), gpus=np.bool_(True), steps=np.float64(2.5))
    assert "gpus=True: must be an integer >= 1" in text
    assert "steps=2.5: must be an integer >= 1" in text
    text = _refused(tmp_path, TrainConfig(), gpus=torch.tensor(2.0), nodes=torch.tensor([2]))
    assert "gpus=2.0: must be an integer >= 1" in text
    assert "nodes=tensor([2]): must be an integer >= 1" in text


@pytest.mark.parametrize("fmt", ["deepspeed", "fsdp", "lightning"])
def test_pipeline_stages_are_refused_first_when_the_settings_are_refused_too(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--pp 2` alone also breaks TrainConfig's grad-accum rule: the refusal no fix of
    --grad-accum lifts comes first, with the other problem beside it (was: --grad-accum
    alone, then --pp after it was fixed)."""
    from workbench.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["export", "--format", fmt, "--pp", "2", "--gpus", "2", "--out", str(tmp_path / "j")])
    err = capsys.readouterr().err
    said = err.split("error: ", 1)[1]
    assert exited.value.code == 2 and said.startswith(f"--pp 2: not exported to --format {fmt}")
    assert "; --grad-accum 1: the micro-batches of a step fill the pipeline" in said
    assert not (tmp_path / "j").exists()
