"""The launcher surfaces the root cause, not a peer's communication error; bad launch
arguments are named all at once, numbers range-checked, before anything starts."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from workbench.config import TrainConfig
from workbench.train.launch import (
    launch_problems,
    launch_ranks,
    resume_model_problem,
    resume_step,
    validate_launch,
)
from workbench.train.launch.procs import LaunchState

PEER = (
    "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:1234. This is typically caused by a remote worker crashing."
)


def _error(rank: int, message: str, wall_time: float) -> dict:
    return {"type": "error", "rank": rank, "message": message, "wall_time": wall_time}


def test_root_cause_wins_over_an_earlier_peer_failure():
    state = LaunchState(2, None)
    state.handle(_error(0, PEER, 10.0))
    assert state.first_error is not None and state.first_error.rank == 0  # all it knows so far
    assert not state.all_reported()
    state.handle(_error(1, "ValueError: bad batch on rank 1", 10.5))
    assert state.first_error.rank == 1
    assert state.first_error.message.startswith("ValueError")
    assert state.all_reported()


def test_earliest_of_two_real_errors_wins():
    state = LaunchState(3, None)
    state.handle(_error(2, "KeyError: 'x'", 5.0))
    state.handle(_error(0, "ValueError: y", 4.0))
    assert state.first_error.rank == 0
    state.handle({"type": "final", "rank": 1})
    assert state.all_reported()


# --------------------------------------------------------------------------- bad arguments
CPU = TrainConfig(device="cpu", micro_batch=4)


def test_every_problem_of_a_launch_at_once() -> None:
    with pytest.raises(ValueError) as info:
        validate_launch(
            CPU,
            10**60,
            "resnet",
            0,
            "mpirun",
            math.inf,
            "not callable",
            {"hidden": math.nan},
            -1,
        )
    text = str(info.value)
    for part in (
        "ranks=<an integer of about 61 digits>: must be at most 1,024",
        "steps=0: must be an integer >= 1 (the step to train to)",
        "launcher='mpirun': must be one of torchrun, deepspeed",
        "timeout=inf: must be a finite number of seconds > 0",
        "on_record='not callable': must be callable",
        "model_options={'hidden': nan}: must hold JSON values only",
        "model='resnet'",
        "threads=-1: must be an integer >= 1",
    ):
        assert part in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 10**13}, r"steps=10000000000000: must be at most 1,000,000,000,000"),
        ({"steps": 2.5}, r"steps=2.5: must be an integer >= 1"),
        ({"steps": True}, r"steps=True: must be an integer >= 1"),
        ({"timeout": 10**7}, r"timeout=10000000: must be at most 2,592,000 seconds \(30 days\)"),
        ({"timeout": 10**400}, r"timeout=<an integer of about 401 digits>: must be a finite"),
        ({"timeout": "5"}, r"timeout='5': must be a finite number of seconds"),
        ({"threads": 10**6}, r"threads=1000000: must be at most 1,024"),
        ({"model_options": {1: 2}}, r"model_options=\{1: 2\}: must be a dict of option names"),
        ({"model_options": {"a": object}}, r"model_options=.*must hold JSON values only"),
        ({"ranks": 10**5000}, r"ranks=<an integer of about 5001 digits>"),
    ],
)
def test_numbers_are_range_checked(kwargs, match) -> None:
    args = {"ranks": 1, "model": "mlp", "steps": 1, "threads": None, **kwargs}
    with pytest.raises(ValueError, match=match):
        launch_ranks(CPU, **args)


def test_numpy_scalars_are_numbers() -> None:
    validate_launch(
        CPU,
        np.int64(1),
        "mlp",
        np.int32(3),
        "torchrun",
        np.float32(5.0),
        None,
        {"hidden": np.int64(8), "samples": np.int64(64)},
        np.int16(1),
    )
    (only,) = launch_problems(CPU, np.bool_(True), "mlp", 1, "torchrun", None, None, None)
    assert (only.field, only.message) == ("ranks", "must be an integer >= 1")  # no number
    assert re.fullmatch(r"ranks=(np\.)?True_?: must be an integer >= 1", str(only))


def test_a_resume_folder_that_cannot_be_read_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"resume='x{70}.*: cannot be read \(File name too long\)"):
        resume_step("x" * 300, 1)
    (tmp_path / "rank-0").mkdir()
    os.mkfifo(tmp_path / "rank-0" / "step-00000002.pt")  # would block the rank that opens it
    with pytest.raises(ValueError, match=r"rank-0/step-00000002.pt is not a regular file"):
        resume_step(tmp_path, 1)


def test_a_manifest_naming_a_factory_is_never_imported(tmp_path, monkeypatch) -> None:
    mark = tmp_path / "imported"
    (tmp_path / "launch_marker_mod.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('x')\ndef make(**o): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "ck" / "rank-0"
    folder.mkdir(parents=True)
    (folder / "step-00000002.pt").write_bytes(b"weights")
    (folder / "step-00000002.json").write_text(
        json.dumps({"kind": "workbench-checkpoint", "model": {"name": "launch_marker_mod:make"}})
    )
    step = resume_step(tmp_path / "ck", 1)
    problem = resume_model_problem(tmp_path / "ck", 1, step, "mlp")
    assert problem is not None and not mark.exists()
    assert (problem.field, problem.value) == ("resume", str(tmp_path / "ck"))
    assert "names the model factory 'launch_marker_mod:make'" in problem.message
    assert "nothing of it was imported" in str(problem)
    assert resume_model_problem(tmp_path / "ck", 1, step, "launch_marker_mod:make") is None
    assert not mark.exists()  # the caller's own choice is compared, not imported here


def _world_info(command: list[str]) -> dict:
    import base64
    import json

    arg = next(a for a in command if a.startswith("--world_info="))
    return json.loads(base64.urlsafe_b64decode(arg.split("=", 1)[1]))


@pytest.mark.parametrize(
    ("visible", "ids"),
    [
        (None, [0, 1]),  # nothing restricts the ranks: GPUs 0 and 1
        ("2,3", [2, 3]),  # a parent restricted to GPUs 2,3 trains on them, not on 0,1
        ("3, 1, 0", [3, 1]),
        ("GPU-aaaa,GPU-bbbb", ["GPU-aaaa", "GPU-bbbb"]),
        ("", [-1, -1]),  # CPU ranks: DeepSpeed's launcher must not give them GPUs 0,1
    ],
)
def test_deepspeed_launcher_keeps_the_visible_devices(visible, ids) -> None:
    from workbench.train.launch import launcher_command

    command = launcher_command("deepspeed", 2, ["--steps", "1"], port=29500, visible=visible)
    assert _world_info(command) == {"localhost": ids}
