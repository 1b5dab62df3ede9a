"""Your cluster's network, measured: the planner's collectives scaled to your nccl-tests.

The collectives model (`workbench.planner.collectives`) is NCCL's own tuning model over the
catalog's NICs: what a healthy fabric with NCCL's settings carries (docs/planner.md holds it
to published nccl-tests runs). Real fabrics carry less, by 10-25% on the published runs of
clusters whose NCCL settings were not tuned, and the shortfall grows with the nodes on
some (congestion on a shared fabric, switch hops). Only a measurement of *your* fabric
knows it, so the planner takes one:

    all_reduce_perf -b 1G -e 8G -f 2 -g 1     # one process a GPU over every GPU of N nodes
    workbench plan ... --nccl-tests all_reduce.txt

`read_nccl_tests(path)` reads an nccl-tests run's output (all_reduce_perf,
all_gather_perf or reduce_scatter_perf, as it prints it): the collective, the ranks and
nodes (its "#  Rank  N Group ... on HOST device ..." lines), and the out-of-place bus
bandwidth at its largest message. `calibrate_network(runs, cluster)` finds, for each,
the share of NCCL's channel rates at which the model gives what the run measured for the
same collective, ranks, ranks a node and message size on the plan's cluster: the share
your network carries (the ratio of measured to modelled bus bandwidth where the network
limits the ring, more where NVLink caps the model's). The plan runs every collective across nodes and every pipeline send between
nodes at that share (the lowest of several runs: a budget is safer on the slowest), and
says so under its bandwidths. The file is read as text: nothing in it is run.

What a run must hold to calibrate the network: two or more nodes with every GPU of each in
the run (the plan's GPUs a node: a run with fewer leaves NICs idle that the model counts),
its largest message at least `MIN_BYTES` (the model is NCCL's Simple protocol: large
messages), no wrong results, and a share at most `MAX_FACTOR` (more is a network faster
than the one the plan was given: `--inter-node-gbps`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workbench.inputs import shown, typed

#: the collectives read, by the name nccl-tests gives its binary (without `_perf`)
KINDS = ("all_reduce", "all_gather", "reduce_scatter")
#: the smallest largest-message a run calibrates with (bytes)
MIN_BYTES = 256 * 2**20
#: the highest ratio of measured to modelled bus bandwidth taken
MAX_FACTOR = 1.5
#: the largest file read (an nccl-tests log of a 100,000-rank run is a few MB)
MAX_FILE_BYTES = 64 * 2**20

WHAT = (
    "give the output of nccl-tests' all_reduce_perf, all_gather_perf or reduce_scatter_perf "
    "over two or more nodes, every GPU of each (its stdout saved to a file)"
)

_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$"
)
_HEADER = re.compile(r"^#\s*nThread\s+\d+")
_STARTING = re.compile(r"Collective test starting:\s*(\w+?)_perf\b")
_BINARY = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_TYPES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
          "half": 2, "float": 4, "double": 8, "bfloat16": 2, "fp8_e4m3": 1,
          "fp8_e5m2": 1}  # fmt: skip


class NcclTestsError(ValueError):
    """A file that cannot calibrate the network: `source` as given, `problem` what is
    wrong. `str()` is plan()'s wording (`nccl_tests=...`), `cli_text()` the command's."""

    def __init__(self, source: Any, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"nccl_tests={shown(source)}: {problem}")

    def cli_text(self) -> str:
        name = (
            typed(str(self.source)) if isinstance(self.source, (str, Path)) else shown(self.source)
        )
        return f"--nccl-tests {name}: {self.problem}"


@dataclass(frozen=True)
class NcclTestsRun:
    """What one nccl-tests run measured: the collective, its ranks over `nodes` nodes of
    `per_node` ranks, the GPU its devices report, the largest message (bytes) and the
    out-of-place bus bandwidth at it (bytes/s), and the file it came from."""

    kind: str
    ranks: int
    nodes: int
    per_node: int
    device: str
    size: int
    bus_bandwidth: float
    source: str


def _kind_of(named: str | None, rows: list[list[str]], ranks: int, source: Any) -> str:
    """The collective: the binary named before the run's header, else what its rows say
    (a reduction whose count is the message's elements: all-reduce; a rank's share:
    reduce-scatter)."""
    if named is not None:
        return named
    size, count, dtype, redop = int(rows[-1][0]), int(rows[-1][1]), rows[-1][2], rows[-1][3]
    width = _TYPES.get(dtype)
    if width is not None and redop != "none":
        if count * width == size:
            return "all_reduce"
        if count * width * ranks == size:
            return "reduce_scatter"
    raise NcclTestsError(
        source,
        "does not say which collective it ran (no 'Collective test starting' line or binary "
        f"name, and rows with redop {redop!r}); {WHAT}, with the command line or nccl-tests' "
        "header",
    )


def _rows(lines: list[str]) -> list[list[str]]:
    """The result rows: size, count, type, redop, [root,] then time, algbw, busbw, #wrong
    out-of-place and in-place (nccl-tests before 2.10 prints no root column)."""
    rows = []
    for line in lines:
        fields = line.split()
        if line.lstrip().startswith("#") or len(fields) < 8:
            continue
        if not (fields[0].isdigit() and fields[1].isdigit()) or fields[2].isdigit():
            continue
        rooted = len(fields) in (9, 13) and re.fullmatch(r"-?\d+", fields[4]) is not None
        rows.append(fields if rooted else [*fields[:4], "-1", *fields[4:]])
    return rows


def _sections(text: str) -> list[tuple[str | None, list[str]]]:
    """The runs a file holds, each (the binary named last before its "# nThread" header,
    without `_perf`, or None; its lines): a job script's output often holds several."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if _HEADER.match(line)] or [0]
    out: list[tuple[str | None, list[str]]] = []
    for n, head in enumerate(heads):
        before = "\n".join(lines[heads[n - 1] if n else 0 : head])
        names = _STARTING.findall(before) or _BINARY.findall(before)
        end = heads[n + 1] if n + 1 < len(heads) else len(lines)
        out.append((names[-1] if names else None, lines[head:end]))
    return out


def _read_text(path: Any) -> str:
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise NcclTestsError(path, f"must be a path to a file; {WHAT}")
    file = Path(path).expanduser()
    if not file.is_file():
        where = "is a directory" if file.is_dir() else "no such file"
        raise NcclTestsError(path, f"{where}; {WHAT}")
    try:
        if file.stat().st_size > MAX_FILE_BYTES:
            raise NcclTestsError(
                path, f"is over {MAX_FILE_BYTES // 2**20} MiB, larger than any nccl-tests output"
            )
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise NcclTestsError(path, f"is not text (not UTF-8); {WHAT}") from None
    except OSError as exc:
        raise NcclTestsError(path, f"cannot be read ({exc.strerror or exc})") from None


def read_nccl_tests(path: Any) -> tuple[NcclTestsRun, ...]:
    """The all-reduce, all-gather and reduce-scatter runs an nccl-tests output file holds
    (one, or several where a job ran them one after another; its other collectives left
    out), see the module docstring; NcclTestsError naming the file and what is wrong for
    anything else."""
    text = _read_text(path)
    sections = _sections(text)
    runs = [_run(kind, lines, path) for kind, lines in sections if kind is None or kind in KINDS]
    if not runs:
        others = ", ".join(dict.fromkeys(f"{kind}_perf" for kind, _ in sections))
        raise NcclTestsError(path, f"holds runs of {others} only; {WHAT}")
    return tuple(runs)


def _run(named: str | None, lines: list[str], path: Any) -> NcclTestsRun:
    """One run of a file: its ranks, nodes, collective and largest message."""
    hosts: dict[int, tuple[str, str]] = {}
    for line in lines:
        m = _RANK.match(line.strip())
        if m:
            if int(m.group(1)) in hosts:
                raise NcclTestsError(
                    path,
                    f"lists rank {m.group(1)} twice: each process ran a test of its own (an "
                    "nccl-tests built without MPI under mpirun); build it with MPI=1",
                )
            hosts[int(m.group(1))] = (m.group(2), m.group(3).strip())
    if not hosts:
        raise NcclTestsError(
            path,
            "lists no ranks (nccl-tests prints a '#  Rank  N Group  0 Pid ... on HOST device "
            f"...' line for each); {WHAT}",
        )
    ranks = len(hosts)
    if sorted(hosts) != list(range(ranks)):
        raise NcclTestsError(path, f"lists ranks {sorted(hosts)[:8]}...: not 0 to {ranks - 1}")
    per_host: dict[str, int] = {}
    for host, _ in hosts.values():
        per_host[host] = per_host.get(host, 0) + 1
    nodes = len(per_host)
    if nodes < 2:
        raise NcclTestsError(
            path,
            f"ran on one node ({next(iter(per_host))}): it measures NVLink, not the network "
            f"between nodes; {WHAT}",
        )
    counts = sorted(set(per_host.values()))
    if len(counts) > 1:
        raise NcclTestsError(
            path,
            f"has {counts[0]} to {counts[-1]} ranks on its {nodes} nodes; a calibration needs "
            "the same number on each (every GPU of each node)",
        )
    rows = _rows(lines)
    if not rows:
        raise NcclTestsError(path, f"holds no result rows (size, count, type, ...); {WHAT}")
    kind = _kind_of(named, rows, ranks, path)
    last = max(rows, key=lambda r: int(r[0]))
    size = int(last[0])
    if size < MIN_BYTES:
        raise NcclTestsError(
            path,
            f"its largest {kind} message is {size:,} bytes; a calibration needs at least "
            f"{MIN_BYTES // 2**20} MiB (run nccl-tests with -e 1G or more: the model is NCCL's "
            "large-message protocol)",
        )
    wrong = last[8] if len(last) > 8 else "0"
    try:
        busbw = float(last[7])
        # "#wrong" counts wrong elements; nccl-tests before 2.10 printed the largest error
        # there instead (2e-07 in a float sum is rounding, not a wrong result)
        bad = int(wrong) > 0 if wrong.isdigit() else wrong != "N/A" and float(wrong) > 1e-3
    except ValueError:
        raise NcclTestsError(
            path, f"its row for {size:,} bytes is not nccl-tests': {last}"
        ) from None
    if bad:
        raise NcclTestsError(
            path, f"reports {wrong} wrong results in its {kind} at {size:,} bytes: a broken run"
        )
    if not math.isfinite(busbw) or busbw <= 0:
        raise NcclTestsError(path, f"its bus bandwidth at {size:,} bytes is {last[7]}: not a rate")
    devices = {device for _, device in hosts.values()}
    return NcclTestsRun(
        kind=kind,
        ranks=ranks,
        nodes=nodes,
        per_node=counts[0],
        device=devices.pop() if len(devices) == 1 else "mixed",
        size=size,
        bus_bandwidth=busbw * 1e9,
        source=str(path),
    )


@dataclass(frozen=True)
class NetworkCalibration:
    """The share of NCCL's channel rates a cluster's network carries (`factor`, the lowest
    of the runs') and each run with the model's bus bandwidth for it at the full rates
    (bytes/s) and the share at which the model gives what the run measured."""

    factor: float
    runs: tuple[tuple[NcclTestsRun, float, float], ...]

    def note(self) -> str:
        """One line for the plan: each run measured against the model."""
        parts = [
            f"{Path(r.source).name}: {r.kind} over {r.nodes} x {r.per_node} at "
            f"{r.size / 2**30:g} GiB, {r.bus_bandwidth / 1e9:.1f} GB/s against the model's "
            f"{model / 1e9:.1f} at the full rates (x{ratio:.2f})"
            for r, model, ratio in self.runs
        ]
        return f"network at x{self.factor:.2f} of NCCL's channel rates, from your nccl-tests: " + (
            "; ".join(parts)
        )


def calibrate_network(paths: Any, cluster: Any) -> NetworkCalibration:
    """Read each nccl-tests output in `paths` (one path or a list) and compare it with the
    model on `cluster` (a `workbench.planner.hardware.Cluster`)."""
    from workbench.estimate.catalog import find_gpu
    from workbench.planner.collectives import collective

    given = [paths] if isinstance(paths, (str, Path)) else paths
    if not isinstance(given, (list, tuple)) or not given:
        raise NcclTestsError(paths, f"must be a path or a list of paths; {WHAT}")
    fabric = cluster.fabric
    if fabric.node_network is None:
        raise NcclTestsError(
            paths,
            f"the catalog has no network for {cluster.gpu.name} to calibrate; give "
            "inter_node_gbps (--inter-node-gbps)",
        )
    measured = []
    for path, run in ((p, run) for p in given for run in read_nccl_tests(p)):
        if run.per_node != cluster.gpus_per_node:
            raise NcclTestsError(
                path,
                f"ran {run.per_node} ranks a node; the plan's nodes have "
                f"{cluster.gpus_per_node} GPUs: calibrate with a run over every GPU of each "
                "node (a run with fewer leaves NICs idle)",
            )
        spec = find_gpu(run.device)
        if not isinstance(spec, str) and spec.name != cluster.gpu.name:
            raise NcclTestsError(
                path,
                f"ran on {run.device} ({spec.name}); the plan is for {cluster.gpu.name}: "
                "calibrate with a run on the planned GPUs",
            )

        def bus(factor: float, run: NcclTestsRun = run) -> float:
            scaled = replace(fabric, network_factor=factor)
            return collective(
                run.kind, run.size, run.ranks, scaled, per_node=run.per_node
            ).bus_bandwidth

        model = bus(1.0)
        if bus(MAX_FACTOR) < run.bus_bandwidth:
            raise NcclTestsError(
                path,
                f"measured {run.bus_bandwidth / 1e9:.1f} GB/s of {run.kind} on {run.device}, "
                f"more than {cluster.gpu.name} nodes reach in the model at up to {MAX_FACTOR:g} "
                f"x their network ({bus(MAX_FACTOR) / 1e9:.1f} GB/s; {model / 1e9:.1f} at 1 x: "
                f"NVLink's {fabric.intra_bus / 1e9:.1f} GB/s bus or the {cluster.node_network / 1e9:g} "
                "GB/s of NICs caps it): calibrate with a run on the planned GPUs, and give "
                "their network's speed (inter_node_gbps, --inter-node-gbps: GB/s a GPU) "
                "where it is not the catalog's",
            )
        # the share at which the model gives the measured bus bandwidth (it rises with the
        # share until NVLink caps it): bisection, to a thousandth of a percent
        low, high = 0.0, MAX_FACTOR
        while high - low > 1e-5:
            mid = (low + high) / 2
            low, high = (mid, high) if bus(mid) < run.bus_bandwidth else (low, mid)
        measured.append((run, model, high))
    return NetworkCalibration(min(r for *_, r in measured), tuple(measured))


__all__ = [
    "KINDS",
    "MAX_FACTOR",
    "MIN_BYTES",
    "NcclTestsError",
    "NcclTestsRun",
    "NetworkCalibration",
    "calibrate_network",
    "read_nccl_tests",
]
