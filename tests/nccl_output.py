"""nccl-tests output as nccl-tests prints it (its src/util.cu and src/common.cu), for the
tests of `--nccl-tests` (workbench.planner.nccl_tests): importable from every test folder
(tests/ is on the path beside its conftest.py)."""

from __future__ import annotations

_GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"
_WIDTH = {"float": 4, "half": 2, "bfloat16": 2, "f8e4m3": 1}


def nccl_tests_output(
    kind: str | None,
    nodes: int,
    per_node: int,
    busbw: dict[int, float],
    *,
    device: str = H100,
    dtype: str = "float",
    old: bool = False,
    timestamps: bool = False,
    per_iteration: bool = False,
    wrong: str = "0",
    hosts: list[int] | None = None,
    groups: int = 1,
) -> str:
    """What nccl-tests prints for a run of `kind` (None: no line names it) over `nodes`
    nodes of `per_node` ranks: its header, a '#  Rank' line a rank, and a row a message size
    (bytes -> out-of-place busbw GB/s; in-place the same). `old`: nccl-tests before 2.10
    (no Group field, no root column, the largest error where `wrong` is); `timestamps`:
    `-S 1`; `per_iteration`: `-I 1`; `hosts`: ranks on each node where they differ;
    `groups`: NCCL_TESTS_SPLIT's groups (rank % groups)."""
    lines = []
    if kind is not None and not old:
        lines += ["# nccl-tests version 2.19.6 nccl-headers=23003 nccl-library=23003",
                  f"# Collective test starting: {kind}_perf"]  # fmt: skip
    lines += [
        "# nThread 1 nGpus 1 minBytes 1073741824 maxBytes 8589934592 step: 2(factor) warmup "
        "iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    rank = 0
    for node, count in enumerate(hosts or [per_node] * nodes):
        for local in range(count):
            group = "" if old else f"Group {rank % groups:>2} "
            lines.append(
                f"#  Rank {rank:>2} {group}Pid {1000 + rank:>6} on gpu-node{node:02d} device "
                f"{local:>2} [0000:{16 * local + 24:02x}:00] {device}"
            )
            rank += 1
    ranks = rank
    root = "" if old else "    root"
    check = "error" if old else "#wrong"
    extra = "    i_min    i_max    i_p99    i_cv%" if per_iteration else ""
    half = f"     time   algbw   busbw {check}{extra}"
    lines += [
        "#",
        f"#       size         count      type   redop{root}{half}{half}"
        + ("            timestamp" if timestamps else ""),
    ]
    reduction = kind in ("all_reduce", None)
    factor = (2.0 if reduction else 1.0) * (ranks - 1) / ranks
    for size, bus in busbw.items():
        count = size // _WIDTH[dtype] // (1 if reduction else ranks)
        redop = "none" if kind == "all_gather" else "sum"
        algbw = bus / factor if factor else bus  # one rank: nccl-tests prints its algbw
        time_us = size / (algbw * 1e9) * 1e6
        cells = f"{size:>12}  {count:>12}  {dtype:>8}  {redop:>6}" + ("      -1" if not old else "")
        spread = "   101.2    120.9    119.8     1.45" if per_iteration else ""
        result = f"  {time_us:>7.1f}  {algbw:>6.2f}  {bus:>6.2f}  {wrong:>6}{spread}"
        stamp = "  2026-12-05 10:11:12" if timestamps else ""
        lines.append(f"{cells}{result}{result}{stamp}")
    lines += [
        "# Out of bounds values : 0 OK",
        f"# Avg bus bandwidth    : {min(busbw.values()):.3f}",
        "#",
    ]
    if kind is not None and not old:
        lines.append(f"# Collective test concluded: {kind}_perf")
    return "\n".join(lines) + "\n"
