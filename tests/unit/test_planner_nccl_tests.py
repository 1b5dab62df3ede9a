"""`plan(nccl_tests=...)` / `workbench plan --nccl-tests FILE`: the network scaled to what
a cluster's own nccl-tests measured (workbench.planner.nccl_tests), and every file that
cannot say it refused naming the file and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from nccl_output import H100, nccl_tests_output

from workbench.cli import main
from workbench.planner import plan
from workbench.planner.collectives import collective
from workbench.planner.hardware import cluster
from workbench.planner.nccl_tests import NcclTestsError, calibrate_network, read_nccl_tests

_GIB = 2**30


def _write(tmp_path: Path, text: str, name: str = "run.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _model_busbw(kind: str, size: int, nodes: int, gpu: str = "h100") -> float:
    hw = cluster(gpu, nodes=nodes)
    return collective(kind, size, nodes * 8, hw.fabric, per_node=8).bus_bandwidth / 1e9


def test_a_run_is_read_as_nccl_tests_prints_it(tmp_path: Path) -> None:
    text = nccl_tests_output("reduce_scatter", 4, 8, {_GIB: 301.5, 8 * _GIB: 309.29})
    (run,) = read_nccl_tests(_write(tmp_path, text))
    assert (run.kind, run.ranks, run.nodes, run.per_node) == ("reduce_scatter", 32, 4, 8)
    assert run.device == H100 and run.size == 8 * _GIB
    assert run.bus_bandwidth == pytest.approx(309.29e9)  # the largest message's out-of-place


@pytest.mark.parametrize(
    ("kind", "named"),
    [("all_reduce", False), ("reduce_scatter", False), ("all_gather", True)],
)
def test_the_collective_is_read_from_the_rows_where_no_line_names_it(
    tmp_path: Path, kind: str, named: bool
) -> None:
    """An all-reduce's count is the message's elements, a reduce-scatter's one rank's
    share; an all-gather (no reduction) is told by the binary on the command line."""
    text = nccl_tests_output(kind if named else None, 2, 8, {_GIB: 300.0})
    if kind == "reduce_scatter":  # the rows of a reduce-scatter: a rank's share counted
        text = text.replace(f"{_GIB // 4:>12}", f"{_GIB // 4 // 16:>12}")
    if named:
        text = text.replace(f"# Collective test starting: {kind}_perf\n", "")
        text = f"$ mpirun -np 16 ./build/{kind}_perf -b 1G -e 1G -g 1\n" + text
    assert [run.kind for run in read_nccl_tests(_write(tmp_path, text))] == [kind]


def test_older_nccl_tests_without_a_root_column_and_with_an_error_magnitude(
    tmp_path: Path,
) -> None:
    """nccl-tests before 2.10 prints no root column and the largest error (2e-07 in a float
    sum is rounding) where later ones count wrong elements."""
    text = nccl_tests_output("all_reduce", 2, 8, {_GIB: 180.0}, root_column=False, wrong="2e-07")
    (run,) = read_nccl_tests(_write(tmp_path, text))
    assert run.bus_bandwidth == pytest.approx(180e9) and run.kind == "all_reduce"


def test_a_job_that_ran_several_tests_gives_each_of_the_three(tmp_path: Path) -> None:
    """A job script's output: a banner naming each binary before its run, the three
    collectives among others (sendrecv, alltoall), each run read on its own."""
    parts = ["collectives = sendrecv_perf all_reduce_perf all_gather_perf alltoall_perf "
             "reduce_scatter_perf"]  # fmt: skip
    for kind, bus in (("sendrecv", 44.0), ("all_reduce", 264.2), ("all_gather", 371.0),
                      ("alltoall", 33.3), ("reduce_scatter", 380.2)):  # fmt: skip
        run = nccl_tests_output(kind if kind in ("all_reduce",) else "all_gather", 2, 8,
                                {16 * _GIB: bus})  # fmt: skip
        run = run.replace("# Collective test starting: all_gather_perf\n", "")
        run = run.replace("# Collective test starting: all_reduce_perf\n", "")
        parts.append(f"%%%%%%%%% {kind}_perf %%%%%%%%%%\n{run}")
    runs = read_nccl_tests(_write(tmp_path, "\n".join(parts)))
    got = [(r.kind, r.bus_bandwidth / 1e9) for r in runs]
    assert got == [("all_reduce", 264.2), ("all_gather", 371.0), ("reduce_scatter", 380.2)]


def test_the_network_is_scaled_to_what_the_run_measured(tmp_path: Path) -> None:
    """A 4-node reduce-scatter at 80% of the model's bus bandwidth: the plan's network
    carries the share of NCCL's channel rates at which the model gives what the run
    measured (below 0.8: the healthy model is capped by NVLink's 370.8 GB/s, under the 8 x
    48 GB/s of channels), every collective across nodes runs at that share, one inside a
    node does not change, and the plan says so under its bandwidths."""
    from dataclasses import replace

    model = _model_busbw("reduce_scatter", 8 * _GIB, 4)
    measured = round(0.8 * model, 2)
    path = _write(tmp_path, nccl_tests_output("reduce_scatter", 4, 8, {8 * _GIB: measured}))
    hw = cluster("h100", nodes=4)
    cal = calibrate_network(str(path), hw)
    slow = replace(hw, network_factor=cal.factor)
    again = collective("reduce_scatter", 8 * _GIB, 32, slow.fabric, per_node=8).bus_bandwidth
    assert again / 1e9 == pytest.approx(measured, rel=1e-4)  # the run, reproduced
    assert hw.fabric.network_bus == pytest.approx(8 * 48e9)  # NCCL's channels on 8 NDR NICs
    assert cal.factor == pytest.approx(measured / model * 370.8 / 384, rel=0.01)
    across = collective("all_gather", 4 * _GIB, 32, slow.fabric, per_node=8).bus_bandwidth
    healthy = collective("all_gather", 4 * _GIB, 32, hw.fabric, per_node=8).bus_bandwidth
    assert across / healthy == pytest.approx(cal.factor * 384 / 370.8, rel=0.01)
    inside = collective("all_gather", 4 * _GIB, 8, slow.fabric).bus_bandwidth
    assert inside == collective("all_gather", 4 * _GIB, 8, hw.fabric).bus_bandwidth
    assert slow.link(16) == pytest.approx(cal.factor * hw.link(16))  # a pipeline's send
    assert f"x{cal.factor:.2f} of NCCL's channel rates" in cal.note() and "run.txt" in cal.note()

    kw = dict(model="llama-3-8b", gpu="h100", nodes=4, seq_len=4096, global_batch=256,
              pin={"engine": "full_shard", "tp": 1, "pp": 1, "micro_batch": 2,
                   "checkpointing": "full"})  # fmt: skip
    before = plan(**kw).best
    after = plan(**kw, nccl_tests=str(path))
    assert after.cluster.network_factor == pytest.approx(cal.factor)
    assert "from your nccl-tests" in after.text() and after.to_dict()["cluster"]["network_factor"]
    # FSDP over 4 nodes gathers over the network: more to hide, never less
    assert after.best.time.data_parallel > before.time.data_parallel


def test_the_lowest_of_several_runs_is_planned(tmp_path: Path) -> None:
    hw = cluster("h100", nodes=2)
    runs = []
    for kind, share in (("all_gather", 0.9), ("reduce_scatter", 0.85)):
        model = _model_busbw(kind, 8 * _GIB, 2)
        text = nccl_tests_output(kind, 2, 8, {8 * _GIB: round(share * model, 2)})
        runs.append(str(_write(tmp_path, text, f"{kind}.txt")))
    cal = calibrate_network(runs, hw)
    shares = {run.kind: share for run, _, share in cal.runs}
    assert shares["reduce_scatter"] < shares["all_gather"]
    assert cal.factor == shares["reduce_scatter"] and len(cal.runs) == 2


def _refusal(tmp_path: Path, text: str | bytes | None, gpu: str = "h100", nodes: int = 2) -> str:
    path = tmp_path / "run.txt"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(NcclTestsError) as info:
        calibrate_network(str(path), cluster(gpu, nodes=nodes))
    message = str(info.value)
    assert message.startswith(f"nccl_tests='{path}': "), message
    return message


def test_files_that_cannot_calibrate_are_refused_saying_why(tmp_path: Path) -> None:
    ok = {8 * _GIB: 300.0}
    assert "no such file" in _refusal(tmp_path, None)
    assert "not text" in _refusal(tmp_path, b"\xff\xfe\x00garbage")
    assert "lists no ranks" in _refusal(tmp_path, "hello\n")
    one_node = nccl_tests_output("all_reduce", 1, 8, ok)
    assert "ran on one node (gpu-node00): it measures NVLink" in _refusal(tmp_path, one_node)
    uneven = nccl_tests_output("all_reduce", 2, 8, ok, hosts=[8, 4])
    assert "has 4 to 8 ranks on its 2 nodes" in _refusal(tmp_path, uneven)
    four = nccl_tests_output("all_reduce", 2, 4, ok)
    assert "ran 4 ranks a node; the plan's nodes have 8 GPUs" in _refusal(tmp_path, four)
    small = nccl_tests_output("all_reduce", 2, 8, {128 * 2**20: 200.0})
    assert "largest all_reduce message is 134,217,728 bytes" in _refusal(tmp_path, small)
    broken = nccl_tests_output("all_reduce", 2, 8, ok, wrong="12")
    assert "reports 12 wrong results" in _refusal(tmp_path, broken)
    gather = nccl_tests_output("all_gather", 2, 8, ok).replace(
        "# Collective test starting: all_gather_perf", "#"
    )
    assert "does not say which collective it ran" in _refusal(tmp_path, gather)
    no_rows = "\n".join(line for line in one_node.splitlines() if line.startswith("#"))
    no_rows = no_rows.replace("gpu-node00 device  4", "gpu-node01 device  4")
    assert "has" in _refusal(tmp_path, no_rows)  # 4 and 4: refused before its rows
    a100 = nccl_tests_output("all_reduce", 2, 8, ok, device="NVIDIA A100-SXM4-80GB")
    assert "ran on NVIDIA A100-SXM4-80GB (a100-80gb); the plan is for h100-80gb" in _refusal(
        tmp_path, a100
    )
    fast = nccl_tests_output("all_reduce", 4, 8, {8 * _GIB: 900.0})
    assert "more than h100-80gb nodes reach in the model" in _refusal(tmp_path, fast, nodes=4)
    twice = nccl_tests_output("all_reduce", 2, 8, ok).replace("Rank   1 ", "Rank   0 ")
    assert "lists rank 0 twice" in _refusal(tmp_path, twice)
    only = nccl_tests_output("all_reduce", 2, 8, ok).replace("all_reduce_perf", "sendrecv_perf")
    assert "holds runs of sendrecv_perf only" in _refusal(tmp_path, only)
    (tmp_path / "dir").mkdir()
    with pytest.raises(NcclTestsError, match="is a directory"):
        read_nccl_tests(tmp_path / "dir")
    with pytest.raises(NcclTestsError, match="must be a path or a list of paths"):
        calibrate_network([], cluster("h100", nodes=2))


def test_the_command_takes_the_flag_and_says_its_errors_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model_busbw("all_reduce", 8 * _GIB, 2)
    good = _write(tmp_path, nccl_tests_output("all_reduce", 2, 8, {8 * _GIB: 0.75 * model}))
    base = ["plan", "--model", "llama-3-8b", "--nodes", "2", "--seq-len", "2048"]
    assert main([*base, "--nccl-tests", str(good)]) == 0
    out = capsys.readouterr().out
    assert "of NCCL's channel rates, from your nccl-tests: run.txt: all_reduce over 2 x 8" in out
    bad = _write(tmp_path, "no ranks here\n", "bad.txt")
    assert main([*base, "--nccl-tests", str(good), "--nccl-tests", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"error: --nccl-tests {bad}: lists no ranks" in err and "Traceback" not in err


def test_the_docs_example_prints_what_docs_planner_md_says(tmp_path: Path) -> None:
    """docs/planner.md: #1229's 32-node H100 reduce-scatter (300 GB/s at 8 GiB) plans the
    network at x0.82."""
    text = nccl_tests_output("reduce_scatter", 32, 8, {_GIB: 290.0, 8 * _GIB: 300.0})
    note = calibrate_network(str(_write(tmp_path, text, "rs32.txt")), cluster("h100", nodes=32))
    said = (
        "network at x0.82 of NCCL's channel rates, from your nccl-tests: rs32.txt: "
        "reduce_scatter over 32 x 8 at 8 GiB, 300.0 GB/s against the model's 352.4 at the "
        "full rates (x0.82)"
    )
    assert note.note() == said
    docs = (Path(__file__).parents[2] / "docs" / "planner.md").read_text()
    assert " ".join(said.split()) in " ".join(docs.replace("`", "").split())
