"""`plan(nccl_tests=...)` / `workbench plan --nccl-tests FILE`: the network scaled to what
a cluster's own nccl-tests measured (workbench.planner.nccl_tests), every layout nccl-tests
prints read, and every file that cannot say it refused naming the file and what is wrong."""

from __future__ import annotations

import os
from dataclasses import replace
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
    "layout",
    [
        {"old": True},  # before 2.10: no Group field, no root column, the largest error
        {"timestamps": True},  # -S 1
        {"per_iteration": True},  # -I 1: four per-iteration columns after each #wrong
        {"per_iteration": True, "timestamps": True},
        {"dtype": "bfloat16"},
        {"dtype": "f8e4m3"},
    ],
)
def test_every_layout_nccl_tests_prints_is_read(tmp_path: Path, layout: dict) -> None:
    text = nccl_tests_output("all_reduce", 2, 8, {_GIB: 170.0, 8 * _GIB: 180.0}, **layout)
    if layout.get("old"):  # an old run: only the command line names the binary
        text = "$ mpirun -np 16 ./build/all_reduce_perf -b 1G -e 8G -f 2 -g 1\n" + text
        text = text.replace("     0  ", "  2e-07  ")  # the largest error of a float sum
    (run,) = read_nccl_tests(_write(tmp_path, text))
    assert (run.kind, run.size, run.ranks) == ("all_reduce", 8 * _GIB, 16)
    assert run.bus_bandwidth == pytest.approx(180e9)


def test_launcher_prefixes_crlf_and_noise_are_read(tmp_path: Path) -> None:
    """srun --label ("0: "), timestamps, mpirun --tag-output ("[1,0]<stdout>:"), CRLF line
    ends and NCCL's INFO lines between."""
    text = nccl_tests_output("all_gather", 2, 8, {8 * _GIB: 300.0})
    lines = text.splitlines()
    labelled = (
        [f"0: {line}" for line in lines[:8]]
        + [f"2026-12-05T10:11:12.123456Z {line}" for line in lines[8:14]]  # a log collector's
        + [f"[1,0]<stdout>:{line}" for line in lines[14:]]
    )
    labelled.insert(5, "gpu-node00:1234:1234 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0")
    (run,) = read_nccl_tests(_write(tmp_path, "\r\n".join(labelled) + "\r\n"))
    assert (run.kind, run.nodes, run.bus_bandwidth) == ("all_gather", 2, pytest.approx(300e9))


def test_a_row_cut_short_by_a_killed_run_is_left_out(tmp_path: Path) -> None:
    text = nccl_tests_output("all_reduce", 2, 8, {_GIB: 170.0, 2 * _GIB: 175.0})
    cut = text.replace(
        "# Out of bounds", "  4294967296    1073741824     float     sum      -1   4\n#"
    )
    (run,) = read_nccl_tests(_write(tmp_path, cut))
    assert run.size == 2 * _GIB and run.bus_bandwidth == pytest.approx(175e9)


@pytest.mark.parametrize(
    ("kind", "named"),
    [("all_reduce", False), ("reduce_scatter", False), ("all_gather", True)],
)
def test_the_collective_is_read_from_the_rows_where_no_line_names_it(
    tmp_path: Path, kind: str, named: bool
) -> None:
    """An all-reduce's count is the message's elements, a reduce-scatter's one rank's
    share; an all-gather (no reduction) is told by the binary on the command line."""
    text = nccl_tests_output(kind, 2, 8, {_GIB: 300.0})
    text = text.replace(f"# Collective test starting: {kind}_perf\n", "")
    text = text.replace(f"# Collective test concluded: {kind}_perf\n", "")
    if named:
        text = f"$ mpirun -np 16 ./build/{kind}_perf -b 1G -e 1G -g 1\n" + text
    assert [run.kind for run in read_nccl_tests(_write(tmp_path, text))] == [kind]


def test_a_job_that_ran_several_tests_gives_each_usable_one(tmp_path: Path) -> None:
    """A job script's output: a banner naming each binary before its run, the three
    collectives among others (sendrecv, alltoall), each run read on its own; a latency
    sweep of the same job (too small to calibrate) is left out, said with why."""
    parts = ["collectives = sendrecv_perf all_reduce_perf all_gather_perf alltoall_perf "
             "reduce_scatter_perf"]  # fmt: skip
    for name, bus, size in (("sendrecv", 44.0, 16 * _GIB), ("all_reduce", 50.0, 128 * 2**20),
                            ("all_reduce", 264.2, 16 * _GIB), ("all_gather", 371.0, 16 * _GIB),
                            ("alltoall", 33.3, 16 * _GIB),
                            ("reduce_scatter", 380.2, 16 * _GIB)):  # fmt: skip
        run = nccl_tests_output(name if name in ("all_reduce", "reduce_scatter") else
                                "all_gather", 2, 8, {size: bus})  # fmt: skip
        kept = [line for line in run.splitlines() if "Collective test" not in line]
        parts.append(f"%%%%%%%%% {name}_perf %%%%%%%%%%\n" + "\n".join(kept))
    path = _write(tmp_path, "\n".join(parts))
    got = [(r.kind, r.bus_bandwidth / 1e9) for r in read_nccl_tests(path)]
    assert got == [("all_reduce", 264.2), ("all_gather", 371.0), ("reduce_scatter", 380.2)]
    note = calibrate_network(str(path), replace(cluster("h100", nodes=2))).note()
    assert "left out: run.txt: all_reduce: its largest all_reduce message is 134,217,728" in note


def test_the_network_is_scaled_to_what_the_run_measured(tmp_path: Path) -> None:
    """A 4-node reduce-scatter at 80% of the model's bus bandwidth: the plan's network
    carries the share of NCCL's channel rates at which the model gives what the run
    measured (below 0.8: the healthy model is capped by NVLink's 370.8 GB/s, under the 8 x
    48 GB/s of channels), every collective across nodes runs at that share, one inside a
    node does not change, and the plan says so under its bandwidths."""
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
    assert f"Network: {cal.note()}" in after.text()
    assert after.to_dict()["cluster"]["network_source"] == cal.note()
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
    shares = {m.run.kind: m.share for m in cal.runs}
    assert shares["reduce_scatter"] < shares["all_gather"]
    assert cal.factor == shares["reduce_scatter"] and len(cal.runs) == 2


def test_a_run_at_the_models_ceiling_says_the_network_is_at_least_the_models(
    tmp_path: Path,
) -> None:
    """A healthy two-node all-gather at 371.0 GB/s: above the model's NVLink-capped 369.6,
    no share of the network reaches it, so the network is at least the model's (1.00); a
    figure far past any share (in-network reduction, another GPU) is refused."""
    path = _write(tmp_path, nccl_tests_output("all_gather", 2, 8, {8 * _GIB: 371.0}))
    cal = calibrate_network(str(path), cluster("h100", nodes=2))
    assert cal.factor == 1.0 and "the model's ceiling for it reached" in cal.note()
    far = _write(tmp_path, nccl_tests_output("all_gather", 2, 8, {8 * _GIB: 600.0}), "far.txt")
    with pytest.raises(NcclTestsError, match=r"1\.62 x the most the model reaches for it"):
        calibrate_network(str(far), cluster("h100", nodes=2))


def test_a_gpu_the_catalog_lacks_is_compared_with_the_plans_and_said(tmp_path: Path) -> None:
    text = nccl_tests_output("all_reduce", 2, 8, {8 * _GIB: 150.0}, device="NVIDIA H800")
    note = calibrate_network(str(_write(tmp_path, text)), cluster("h100", nodes=2)).note()
    assert "its GPU, NVIDIA H800, is not in the catalog: compared with h100-80gb's model" in note
    one = calibrate_network(str(_write(tmp_path, text)), cluster("h100", nodes=1)).note()
    assert one.endswith("(the plan's one node uses no network)")


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
    split = nccl_tests_output("all_gather", 2, 8, ok, groups=8)  # NCCL_TESTS_SPLIT="MOD 8"
    assert "ran its ranks in 8 groups (NCCL_TESTS_SPLIT)" in _refusal(tmp_path, split)
    gather = nccl_tests_output("all_gather", 2, 8, ok).replace(
        "# Collective test starting: all_gather_perf", "#"
    )
    gather = gather.replace("# Collective test concluded: all_gather_perf", "#")
    assert "does not say which collective it ran" in _refusal(tmp_path, gather)
    a100 = nccl_tests_output("all_reduce", 2, 8, ok, device="NVIDIA A100-SXM4-80GB")
    assert "ran on NVIDIA A100-SXM4-80GB (a100-80gb); the plan is for h100-80gb" in _refusal(
        tmp_path, a100
    )
    mixed = nccl_tests_output("all_reduce", 2, 8, ok).replace(
        f"device  3 [0000:48:00] {H100}", "device  3 [0000:48:00] NVIDIA A100-SXM4-80GB", 1
    )
    assert "ran on several kinds of GPU" in _refusal(tmp_path, mixed)
    gap = nccl_tests_output("all_reduce", 2, 8, ok).replace("Rank  9 ", "Rank 16 ")
    assert "lists 16 ranks but not rank 9" in _refusal(tmp_path, gap)
    twice = nccl_tests_output("all_reduce", 2, 8, ok).replace("Rank  1 ", "Rank  0 ")
    assert "lists rank 0 twice" in _refusal(tmp_path, twice)
    alone = "".join(  # an nccl-tests built without MPI under mpirun: a test a process
        nccl_tests_output("all_reduce", 1, 1, ok).replace("gpu-node00", f"gpu-node{n:02d}")
        for n in range(4)
    )
    assert "each process ran a test of its own" in _refusal(tmp_path, alone)
    only = nccl_tests_output("all_reduce", 2, 8, ok).replace("all_reduce_perf", "sendrecv_perf")
    assert "holds runs of sendrecv_perf only" in _refusal(tmp_path, only)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: reading it would block for ever
    with pytest.raises(NcclTestsError, match=r"a FIFO \(named pipe\), not a regular file"):
        read_nccl_tests(fifo)
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
    assert "Network: network at x" in out and "from your nccl-tests: run.txt: all_reduce" in out
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
        "reduce_scatter over 32 x 8 at 8 GiB, 300.0 GB/s against the model's 352.4 (0.85 of "
        "it; network share 0.82)"
    )
    assert note.note() == said
    docs = (Path(__file__).parents[2] / "docs" / "planner.md").read_text()
    assert " ".join(said.split()) in " ".join(docs.replace("`", "").split())


def test_nccls_default_ib_settings_plan_the_network_at_their_measured_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan(nccl_ib_defaults=True)` / `--nccl-ib-defaults`: jobs that leave NCCL's IB
    settings at their defaults plan every collective across nodes at
    NCCL_IB_DEFAULTS_SHARE of NCCL's channel rates, said on the plan, and a pipeline's sends
    at their rate (the share was measured on collectives); one node has no network to scale; with an nccl-tests file (which measured whatever settings it ran) or
    a value that is not a bool it is refused, naming the field."""
    from workbench.planner.collectives import IB_DEFAULTS_NOTE, NCCL_IB_DEFAULTS_SHARE

    kw = dict(model="llama-3-8b", gpu="h100", nodes=4, seq_len=4096, global_batch=256,
              pin={"engine": "full_shard", "tp": 1, "pp": 1, "micro_batch": 2,
                   "checkpointing": "full"})  # fmt: skip
    before = plan(**kw)
    after = plan(**kw, nccl_ib_defaults=True)
    assert before.cluster.network_factor == 1.0 and "Network:" not in before.text()
    assert after.cluster.network_factor == NCCL_IB_DEFAULTS_SHARE
    assert f"Network: {IB_DEFAULTS_NOTE}" in after.text()
    assert after.to_dict()["cluster"]["network_source"] == IB_DEFAULTS_NOTE
    # FSDP's gathers over 4 nodes: NVLink (370.8) caps the tuned 8 x 48; untuned 0.8 x 384
    assert after.best.time.data_parallel > before.best.time.data_parallel
    # measured on collectives only: a pipeline's sends between nodes keep their rate
    assert after.cluster.link(16) == before.cluster.link(16) == 50e9
    one = plan(**{**kw, "nodes": 1}, nccl_ib_defaults=True)
    assert one.cluster.network_factor == 1.0 and "Network:" not in one.text()
    with pytest.raises(ValueError, match=r"^nccl_ib_defaults='yes': must be True or False$"):
        plan(**kw, nccl_ib_defaults="yes")
    model = _model_busbw("all_reduce", 8 * _GIB, 2)
    run = _write(tmp_path, nccl_tests_output("all_reduce", 2, 8, {8 * _GIB: 0.75 * model}))
    with pytest.raises(ValueError, match=r"^nccl_ib_defaults=True: give it or nccl_tests= "):
        plan(**kw, nccl_ib_defaults=True, nccl_tests=str(run))

    base = ["plan", "--model", "llama-3-8b", "--nodes", "2", "--seq-len", "2048"]
    assert main([*base, "--nccl-ib-defaults"]) == 0
    assert f"Network: {IB_DEFAULTS_NOTE}" in capsys.readouterr().out
    assert main([*base, "--nccl-ib-defaults", "--nccl-tests", str(run)]) == 2
    err = capsys.readouterr().err
    assert "error: --nccl-ib-defaults: give it or --nccl-tests (your nccl-tests" in err
