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
