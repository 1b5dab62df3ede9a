"""`workbench estimate` keeps the offload device: NVMe offload is said as NVMe, in the
report and in the JSON, never as CPU memory."""

from __future__ import annotations

import json

from workbench.cli import main

RUN = ["--params", "7e9", "--zero", "3", "--gpus", "8"]


def out_of(argv: list[str], capsys) -> str:
    assert main(["estimate", *argv]) == 0
    return capsys.readouterr().out


def test_nvme_offload_is_said_as_nvme(capsys):
    out = out_of([*RUN, "--offload-optimizer", "nvme", "--offload-params", "nvme"], capsys)
    assert "offloaded to NVMe" in out and "offloaded to CPU" not in out
    assert "optimizer offload to NVMe, parameter offload to NVMe" in out.splitlines()[0]


def test_the_json_names_each_device(capsys):
    argv = [*RUN, "--offload-optimizer", "nvme", "--offload-params", "--json"]
    got = json.loads(out_of(argv, capsys))
    assert got["offload_optimizer_device"] == "nvme" and got["offload_params_device"] == "cpu"
    argv = [*RUN, "--offload-params", "nvme", "--json"]
    got = json.loads(out_of(argv, capsys))
    assert got["offload_optimizer_device"] is None and got["offload_params_device"] == "nvme"
    got = json.loads(out_of([*RUN, "--json"], capsys))  # no offload: the estimate's own JSON
    assert "offload_optimizer_device" not in got and "offload_params_device" not in got


def test_cpu_offload_is_still_cpu(capsys):
    out = out_of([*RUN, "--offload-optimizer", "cpu"], capsys)
    assert "offloaded to CPU" in out and "NVMe" not in out


def test_a_deepspeed_configs_device_is_kept(tmp_path, capsys):
    path = tmp_path / "ds.json"
    zero = {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}))
    out = out_of(["--params", "7e9", "--gpus", "8", "--deepspeed-config", str(path)], capsys)
    assert "optimizer offload to NVMe" in out and "offloaded to NVMe" in out
