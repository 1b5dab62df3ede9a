"""nccl-tests output as nccl-tests prints it, for the tests of `--nccl-tests`
(workbench.planner.nccl_tests): importable from every test folder (tests/ is on the path
beside its conftest.py)."""

from __future__ import annotations

_GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"
_WIDTH = {"float": 4, "half": 2, "bfloat16": 2}


def nccl_tests_output(
    kind: str | None,
    nodes: int,
    per_node: int,
    busbw: dict[int, float],
    *,
    device: str = H100,
    dtype: str = "float",
    root_column: bool = True,
    wrong: str = "0",
    hosts: list[int] | None = None,
) -> str:
    """What nccl-tests prints for a run of `kind` (None: no line names it) over `nodes`
    nodes of `per_node` ranks: its header, a '#  Rank' line a rank, and a row a message size
    (bytes -> out-of-place busbw GB/s; in-place the same)."""
    ranks = nodes * per_node
    lines = []
    if kind is not None:
        lines.append(f"# Collective test starting: {kind}_perf")
    lines += [
        "# nThread 1 nGpus 1 minBytes 1073741824 maxBytes 8589934592 step: 2(factor) warmup "
        "iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    per_host = hosts or [per_node] * nodes
    rank = 0
    for node, count in enumerate(per_host):
        for local in range(count):
            lines.append(
                f"#  Rank {rank:>3} Group  0 Pid {1000 + rank:>6} on gpu-node{node:02d} device "
                f"{local:>2} [0x{16 * local + 24:02x}] {device}"
            )
            rank += 1
    ranks = rank
    root = "    root" if root_column else ""
    lines += [
        "#",
        "#                                                              out-of-place"
        "                       in-place",
        f"#       size         count      type   redop{root}     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
    ]
    factor = (2.0 if kind in ("all_reduce", None) else 1.0) * (ranks - 1) / ranks
    for size, bus in busbw.items():
        count = size // _WIDTH[dtype] // (1 if kind in ("all_reduce", None) else ranks)
        redop = "none" if kind == "all_gather" else "sum"
        algbw = bus / factor
        time_us = size / (algbw * 1e9) * 1e6
        cells = f"{size:>12} {count:>12} {dtype:>9} {redop:>7}" + (
            "      -1" if root_column else ""
        )
        result = f"{time_us:>8.1f} {algbw:>7.2f} {bus:>7.2f} {wrong:>6}"
        lines.append(f"{cells} {result} {result}")
    lines += [
        "# Out of bounds values : 0 OK",
        f"# Avg bus bandwidth    : {min(busbw.values()):.3f}",
    ]
    return "\n".join(lines) + "\n"
