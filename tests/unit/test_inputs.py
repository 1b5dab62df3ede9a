"""Reading user files bounded and strict (workbench.inputs), writing all or nothing
(workbench.outputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.inputs import InputFileError, parse_json, read_json, read_text, shown, ungrouped
from workbench.outputs import OutputError, write_file, write_files

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "200"))


def test_the_modules_are_pure() -> None:
    code = (
        "import sys, workbench.inputs, workbench.outputs; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/dev/zero", "a device, not a regular file"),
        ("/dev/urandom", "a device, not a regular file"),
        ("/", "a directory, not a regular file"),
        ("missing.json", "no such file"),
        ("x" * 300, r"cannot be read \(File name too long\)"),
        ("a\0b", "cannot be read"),
    ],
)
def test_what_is_not_a_regular_file_is_refused_before_it_is_opened(
    path, reason, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputFileError, match=reason) as info:
        read_json(path, what="--hf-config")
    assert info.value.what == "--hf-config" and str(info.value).startswith("--hf-config ")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    reader = threading.Thread(target=lambda: _collect(result, fifo), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert "a FIFO (named pipe), not a regular file" in str(result[0])


def _collect(out: list[BaseException], path: Path) -> None:
    try:
        read_text(path, what="config")
    except InputFileError as exc:
        out.append(exc)


def test_size_limit_and_encoding_are_named(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(InputFileError, match=r"1,203 bytes: larger than the 1,000-byte limit"):
        read_json(big, what="config", max_bytes=1000)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(InputFileError, match=r"not UTF-8 text \(byte 0xe9 at offset 7\)"):
        read_json(latin, what="config")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '{"num_hidden_layers": 32, "num_hidden_layers": 320}',
            r"key 'num_hidden_layers' appears twice",
        ),
        ('{"a": {"b": 1, "b": 1}}', r"key 'b' appears twice"),
        ("[1e400]", r"'1e400': JSON numbers must be finite"),
        ('{"x": NaN}', r"'NaN': JSON numbers must be finite"),
        ("-Infinity", r"'-Infinity': JSON numbers must be finite"),
        ("[" * 200_000 + "]" * 200_000, "nested deeper than 64 levels"),
        ("[" * 65 + "]" * 65, "nested deeper than 64 levels"),
        ("9" * 5000, r"an integer of more than 4,300 digits"),
        ('{"a": ', r"not valid JSON \(Expecting value at line 1 column 7\)"),
    ],
)
def test_json_is_strict(text, reason):
    with pytest.raises(InputFileError, match=reason):
        parse_json(text, what="--model-options")


def test_json_at_the_depth_limit_and_plain_values_read() -> None:
    assert parse_json("[" * 64 + "]" * 64, what="x") is not None
    assert parse_json('{"a": [1, 2.5, "s", null, true]}', what="x") == {
        "a": [1, 2.5, "s", None, True]
    }


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.text(max_size=60))
def test_any_text_is_json_or_an_input_file_error(text: str) -> None:
    try:
        parse_json(text, what="x")
    except InputFileError as exc:
        assert exc.what == "x" and exc.reason


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(json_values)
def test_every_standard_json_document_reads_back(value) -> None:
    assert parse_json(json.dumps(value), what="x") == value


def test_shown_bounds_what_it_prints() -> None:
    assert shown(10**60) == "<an integer of about 61 digits>"
    assert shown(-(10**5000)).startswith("-<an integer of about 5001 digits")
    assert shown(12345) == "12345" and shown("ab") == "'ab'"
    assert len(shown("x" * 10_000)) == 80 and shown("x" * 10_000).endswith("...")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,000", "1000"),
        ("1,000,000.5", "1000000.5"),
        ("12", "12"),
        ("1,2,3", None),
        ("1,00", None),
        (",5", None),
    ],
)
def test_thousands_separators_group_threes_or_nothing(text, expected) -> None:
    assert ungrouped(text) == expected


def test_write_files_leaves_the_previous_output_whole_when_one_file_fails(tmp_path):
    job = tmp_path / "job"
    write_files(
        job, {"ds_config.json": "old config", "launch.sh": "old launch"}, modes={"launch.sh": 0o755}
    )
    (job / "job.json").mkdir()  # a name taken by a folder: that file cannot be written
    with pytest.raises(
        OutputError, match=r"job.json': a folder has that name; nothing was changed"
    ):
        write_files(job, {"ds_config.json": "new", "launch.sh": "new", "job.json": "new"})
    assert (job / "ds_config.json").read_text() == "old config"
    assert (job / "launch.sh").read_text() == "old launch"
    assert sorted(p.name for p in job.iterdir()) == ["ds_config.json", "job.json", "launch.sh"]
    assert os.stat(job / "launch.sh").st_mode & 0o777 == 0o755


def test_write_file_replaces_in_one_rename(tmp_path):
    target = write_file(tmp_path / "out" / "chart.png", b"\x89PNG")
    assert target.read_bytes() == b"\x89PNG"
    write_file(target, b"new")
    assert target.read_bytes() == b"new" and [p.name for p in target.parent.iterdir()] == [
        "chart.png"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7B", "7B"),
        ("", "''"),
        (" 8", "' 8'"),
        ("a\nb", "'a\\nb'"),
        ("x" * 90, "'" + "x" * 76 + "..."),
    ],
)
def test_typed_keeps_a_message_on_one_readable_line(text, expected) -> None:
    from workbench.inputs import typed

    assert typed(text) == expected


def test_target_problem_says_why_an_output_cannot_go_there(tmp_path) -> None:
    from workbench.outputs import target_problem

    afile = tmp_path / "a.txt"
    afile.write_text("x")
    assert target_problem(tmp_path / "new" / "deeper", folder=True) is None
    assert target_problem(afile, folder=True) == "exists and is a file, where a folder is needed"
    assert target_problem(tmp_path, folder=False) == "is a folder; name a file"
    assert target_problem(afile / "inside", folder=True) == (
        f"{afile} is a file, where a folder is needed"
    )
    assert target_problem("/dev/null", folder=True) == (
        "exists and is a device, where a folder is needed"
    )
    assert target_problem("x" * 5000, folder=True).startswith("cannot be used (")


def test_numpy_and_torch_scalars_are_the_numbers_they_hold() -> None:
    """A sweep's `numpy.int64(2)` or a `torch.tensor(2)` is an integer to every check that
    asks `is_int` (TrainConfig, export_job, launch_ranks, ...); a bool never is, and a float,
    a tensor of several values or one without data is no integer either."""
    import numpy as np
    import torch

    from workbench.inputs import is_bool, is_int, is_number, plain_number

    integers = [np.int64(2), np.uint8(2), np.int32(2), torch.tensor(2), torch.tensor(2).int()]
    for v in integers:
        assert is_int(v) and is_number(v) and not is_bool(v), v
        assert plain_number(v) == 2 and type(plain_number(v)) is int, v
    for v in (np.float64(2.5), torch.tensor(2.5), torch.tensor(2.0, dtype=torch.bfloat16)):
        assert not is_int(v) and is_number(v) and type(plain_number(v)) is float, v
    for v in (np.bool_(True), torch.tensor(True)):
        assert is_bool(v) and not is_int(v) and not is_number(v), v
        assert plain_number(v) is True
    others = [
        torch.tensor([2]),  # a tensor of several values is no scalar
        torch.tensor(2, device="meta"),  # no value to read
        torch.tensor(float("nan")),
        np.float64("inf"),
        torch.tensor(1 + 2j),
        "2",
        None,
    ]
    for v in others:
        assert not is_int(v) and not is_number(v) and plain_number(v) is v, v
    for v in (2, 2.5, True, None, "x"):
        assert plain_number(v) is v
