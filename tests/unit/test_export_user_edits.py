"""Re-exporting into a job folder never loses what the user edited there: an edited script
is replaced (the job's files must agree) and its text kept beside it as NAME.edited, said in
a warning; a filled-in hostfile is kept instead of the template."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.export import export_deepspeed, export_job
from workbench.export.edits import is_hostfile_template
from workbench.export.launch_files import hostfile_template

PACKAGE = Path(__file__).resolve().parents[2] / "workbench" / "export"


def test_an_edited_script_is_kept_beside_the_new_one(tmp_path: Path) -> None:
    out = tmp_path / "job"
    first = export_deepspeed(TrainConfig(), gpus=1, out_dir=out)
    assert first.warnings == () and not list(out.glob("*.edited*"))
    script = out / "train_deepspeed.py"
    edited = script.read_text() + "# my change\n"
    script.write_text(edited)
    again = export_deepspeed(TrainConfig(), gpus=1, out_dir=out)
    assert script.read_text() == (PACKAGE / "train_deepspeed.py").read_text()
    assert (out / "train_deepspeed.py.edited").read_text() == edited
    assert str(out / "train_deepspeed.py.edited") in again.paths
    (line,) = [w for w in again.warnings if "train_deepspeed.py" in w]
    assert "differed from the workbench's" in line and "kept in train_deepspeed.py.edited" in line
    # an unchanged folder: nothing more kept, nothing said
    third = export_deepspeed(TrainConfig(), gpus=1, out_dir=out)
    assert third.warnings == () and sorted(p.name for p in out.glob("*.edited*")) == [
        "train_deepspeed.py.edited"
    ]
    # a second edit does not write over the first one's copy
    script.write_text(edited + "# another\n")
    export_deepspeed(TrainConfig(), gpus=1, out_dir=out)
    assert (out / "train_deepspeed.py.edited").read_text() == edited
    assert (out / "train_deepspeed.py.edited.2").read_text() == edited + "# another\n"


def test_the_command_line_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job"
    export_job(TrainConfig(fsdp="full_shard"), format="fsdp", gpus=2, out_dir=out)
    common = out / "job_common.py"
    common.write_text(common.read_text() + "# mine\n")
    assert (
        main(
            ["export", "--format", "fsdp", "--fsdp", "full_shard", "--gpus", "2", "--out", str(out)]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"warning: job_common.py in {out} differed from the workbench's" in err
    assert (out / "job_common.py.edited").read_text().endswith("# mine\n")


def test_a_filled_in_hostfile_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "job"
    first = export_deepspeed(TrainConfig(), gpus=2, nodes=2, out_dir=out)
    hostfile = out / "hostfile"
    assert str(hostfile) in first.paths and is_hostfile_template(hostfile.read_text())
    # an earlier template for another shape is a template: written over
    second = export_deepspeed(TrainConfig(), gpus=4, nodes=3, out_dir=out)
    assert hostfile.read_text() == hostfile_template(3, 4) and second.warnings == ()
    hostfile.write_text("gpu-a slots=4\ngpu-b slots=4\ngpu-c slots=4\n")
    third = export_deepspeed(TrainConfig(), gpus=4, nodes=3, out_dir=out)
    assert hostfile.read_text() == "gpu-a slots=4\ngpu-b slots=4\ngpu-c slots=4\n"
    assert str(hostfile) not in third.paths and third.hostfile_path == str(hostfile)
    (line,) = third.warnings
    assert "hostfile" in line and "kept as it is" in line and "3 host(s)" in line


def test_edited_config_launcher_and_job_json_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "job"
    export_deepspeed(TrainConfig(), gpus=1, out_dir=out)
    edits = {}
    for name in ("ds_config.json", "launch.sh", "job.json"):
        path = out / name
        edits[name] = path.read_text().replace("\n", "\n ", 1)  # same meaning, other bytes
        path.write_text(edits[name])
    again = export_deepspeed(TrainConfig(), gpus=1, out_dir=out)
    for name, text in edits.items():
        assert (out / f"{name}.edited").read_text() == text
        assert (out / name).read_text() != text
        (line,) = [w for w in again.warnings if w.startswith(name)]
        assert "edited since the last export" in line and f"kept in {name}.edited" in line
    # an export that changes the settings writes over its own unedited files, silently
    third = export_deepspeed(TrainConfig(zero_stage=2), gpus=2, out_dir=out)
    assert third.warnings == ()
    assert sorted(p.name for p in out.glob("*.edited*")) == sorted(f"{n}.edited" for n in edits)


def test_the_users_own_files_in_the_folder_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}\n'
    (tmp_path / "ds_config.json").write_text(mine)
    (tmp_path / "launch.sh").write_text("echo my own launcher\n")
    code = main(["export", "--config", str(tmp_path / "ds_config.json"), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (tmp_path / "ds_config.json.edited").read_text() == mine  # the --config input
    assert (tmp_path / "launch.sh.edited").read_text() == "echo my own launcher\n"
    assert f"warning: ds_config.json in {tmp_path} was not written by an export" in err
    assert f"warning: launch.sh in {tmp_path} was not written by an export" in err


def test_another_formats_job_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "job"
    export_deepspeed(TrainConfig(), gpus=1, out_dir=out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ValueError, match=r"holds a --format deepspeed job \(train_deepspeed.py\)"):
        export_job(TrainConfig(fsdp="full_shard"), format="fsdp", gpus=1, out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == before
    export_job(TrainConfig(fsdp="full_shard"), format="fsdp", gpus=1, out_dir=tmp_path / "f")
    with pytest.raises(ValueError, match=r"holds a --format fsdp job"):
        export_deepspeed(TrainConfig(), gpus=1, out_dir=tmp_path / "f")
