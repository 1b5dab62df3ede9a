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
limits the model's ring; lower where NVLink caps it, the network's channels then having
room to spare). The plan runs every collective across nodes and every pipeline send
between nodes at that share (the lowest of several runs: a budget is safer on the
slowest), and says so under its bandwidths. The file is read as text: nothing in it is run.

What a run must hold to calibrate the network: two or more nodes with every GPU of each in
the run (the plan's GPUs a node: a run with fewer leaves NICs idle that the model counts),
one collective over all of them (not split with NCCL_TESTS_SPLIT), its largest message at
least `MIN_BYTES` (the model is NCCL's Simple protocol: large messages), no wrong results,
and at most `BEYOND` x the most the model reaches for it at up to `MAX_FACTOR` x the
network (more is another GPU, or in-network reduction the model leaves out). A run that
reaches the model's ceiling (NVLink, NCCL's per-channel caps) says the network is at least
the model's: share 1. A file holding several runs (a job's script) gives each usable one;
the others are left out, said with why. nccl-tests' layouts from 2.0 on are read (no Group
or root column before 2.13.4 and 2.10, `-S 1` timestamps, `-I 1` per-iteration columns,
srun's `--label` and mpirun's `--tag-output` prefixes).
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
#: the highest share of NCCL's channel rates searched
MAX_FACTOR = 1.5
#: how far past the model's most a measurement may lie and still read as the model's
#: ceiling reached (NVLink's real bus is a little above NCCL's count of it)
BEYOND = 1.15
#: the largest file read (an nccl-tests log of a 100,000-rank run is a few MB)
MAX_FILE_BYTES = 64 * 2**20

WHAT = (
    "give the output of nccl-tests' all_reduce_perf, all_gather_perf or reduce_scatter_perf "
    "over two or more nodes, every GPU of each (its stdout saved to a file)"
)

_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+"
    r"\s+\[[^\]]*\]\s*(.*)$"
)
#: a result row, found by its type name: size, count, type, then the rest
_ROW = re.compile(
    r"(?:^|\s)(\d+)\s+(\d+)\s+(int8|uint8|int32|uint32|int64|uint64|half|float|double|"
    r"bfloat16|f8e4m3|f8e5m2|fp8_e4m3|fp8_e5m2)\s+(\S.*)$"
)
_HEADER = re.compile(r"^#\s*nThread\s+\d+")
_STARTING = re.compile(r"Collective test starting:\s*(\w+?)_perf\b")
_BINARY = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_TYPES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
          "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1,
          "fp8_e4m3": 1, "fp8_e5m2": 1}  # fmt: skip


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


def _kind_of(
    named: str | None, rows: list[tuple[int, int, str, str, str, str]], ranks: int, source: Any
) -> str:
    """The collective: the binary named before the run's header, else what its rows say
    (a reduction whose count is the message's elements: all-reduce; a rank's share:
    reduce-scatter)."""
    if named is not None:
        return named
    size, count, dtype, redop, *_ = rows[-1]
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


def _columns(lines: list[str]) -> tuple[int, str] | None:
    """Where the out-of-place busbw sits in a row, and the name of the column after it
    ("#wrong", a count; "error", the largest error before 2.10), from the table's header;
    None where the section has no header."""
    for line in lines:
        if not line.lstrip().startswith("#"):
            continue
        names = line.lstrip().lstrip("#").split()
        if "size" in names and "busbw" in names:
            at = names.index("busbw")
            return at, names[at + 1] if at + 1 < len(names) else "#wrong"
    return None


def _rows(lines: list[str]) -> list[tuple[int, int, str, str, str, str]]:
    """The result rows: (size, count, type, redop, out-of-place busbw, the column after
    it), found by their type name wherever a launcher's prefix puts them, each value read
    where the table's header puts it (else as nccl-tests 2.10+ prints it, with or without
    the root column before); a row cut short (a run killed mid-line) is left out."""
    where = _columns(lines)
    rows = []
    for line in lines:
        m = _ROW.search(line)
        if m is None or line.lstrip().startswith("#"):
            continue
        fields = [m.group(1), m.group(2), m.group(3), *m.group(4).split()]
        if where is not None:
            at = where[0]
        else:
            rooted = len(fields) >= 9 and re.fullmatch(r"-?\d+", fields[4]) is not None
            at = 7 if rooted else 6
        if len(fields) <= at:
            continue
        try:
            float(fields[at])
        except ValueError:
            continue
        after = fields[at + 1] if len(fields) > at + 1 else "N/A"
        rows.append((int(fields[0]), int(fields[1]), fields[2], fields[3], fields[at], after))
    return rows


def _sections(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """The runs a file holds, each (the binary named last before its "# nThread" header,
    without `_perf`, or None; its lines): a job script's output often holds several."""
    heads = [i for i, line in enumerate(lines) if _HEADER.match(line)] or [0]
    out: list[tuple[str | None, list[str]]] = []
    for n, head in enumerate(heads):
        before = "\n".join(lines[heads[n - 1] if n else 0 : head])
        names = _STARTING.findall(before) or _BINARY.findall(before)
        end = heads[n + 1] if n + 1 < len(heads) else len(lines)
        out.append((names[-1] if names else None, lines[head:end]))
    return out


def _read_text(path: Any) -> str:
    """The file's text: a regular file (never a FIFO or device, which could block or never
    end), at most `MAX_FILE_BYTES`, UTF-8 (`workbench.inputs.read_bytes`)."""
    from workbench.inputs import InputFileError, read_bytes

    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise NcclTestsError(path, f"must be a path to a file; {WHAT}")
    file = Path(path).expanduser()
    if file.is_dir():
        raise NcclTestsError(path, f"is a directory; {WHAT}")
    try:
        data = read_bytes(file, what="nccl-tests output", max_bytes=MAX_FILE_BYTES)
    except InputFileError as exc:
        raise NcclTestsError(path, f"{exc.reason}; {WHAT}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise NcclTestsError(path, f"is not text (not UTF-8); {WHAT}") from None


def _ranks(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """(rank, group, host, device) of each '#  Rank' line."""
    out = []
    for line in lines:
        m = _RANK.match(line.strip())
        if m:
            out.append((int(m.group(1)), int(m.group(2) or 0), m.group(3), m.group(4).strip()))
    return out


def read_nccl_tests(path: Any) -> tuple[NcclTestsRun, ...]:
    """The all-reduce, all-gather and reduce-scatter runs an nccl-tests output file holds
    that can calibrate the network (see the module docstring); NcclTestsError naming the
    file and what is wrong where none can."""
    return _read(path)[0]


def _read(path: Any) -> tuple[tuple[NcclTestsRun, ...], list[str]]:
    """The usable runs of a file, and why each other run of the three collectives in it
    was left out."""
    text = _read_text(path)
    # what launchers and log collectors put before each line (mpirun --tag-output's
    # "[1,0]<stdout>:", srun --label's "0: ", timestamps): nccl-tests' own lines start at
    # their "#"; its rows are found by their type name
    lines = [line[line.index("#") :] if "#" in line else line for line in text.splitlines()]
    sections = _sections(lines)
    _no_mpi(sections, path)
    runs: list[NcclTestsRun] = []
    left_out: list[str] = []
    problems: list[NcclTestsError] = []
    for kind, section in sections:
        if kind is not None and kind not in KINDS:
            continue
        try:
            runs.append(_run(kind, section, path))
        except NcclTestsError as exc:
            problems.append(exc)
            left_out.append(f"{kind or 'a run'}: {exc.problem}")
    if runs:
        return tuple(runs), left_out
    if problems:
        if len(problems) == 1:
            raise problems[0]
        raise NcclTestsError(
            path, f"none of its {len(problems)} runs can calibrate: " + "; ".join(left_out)
        )
    others = ", ".join(dict.fromkeys(f"{kind}_perf" for kind, _ in sections))
    raise NcclTestsError(path, f"holds runs of {others} only; {WHAT}")


def _no_mpi(sections: list[tuple[str | None, list[str]]], path: Any) -> None:
    """Refuse the output of an nccl-tests built without MPI under mpirun: each process
    prints a test of its own, on its own node, as rank 0."""
    if len(sections) < 2:
        return
    seen = [_ranks(section) for _, section in sections]
    hosts = [{host for _, _, host, _ in ranks} for ranks in seen if ranks]
    alone = len(hosts) >= 2 and all(len(h) == 1 for h in hosts)
    from_zero = all(min(r for r, *_ in ranks) == 0 for ranks in seen if ranks)
    if alone and from_zero and len(set().union(*hosts)) >= 2:
        raise NcclTestsError(
            path,
            f"holds {len(hosts)} tests each on one node, numbered from rank 0: each "
            "process ran a test of its own (an nccl-tests built without MPI under "
            "mpirun); build it with MPI=1",
        )


def _run(named: str | None, lines: list[str], path: Any) -> NcclTestsRun:
    """One run of a file: its ranks, nodes, collective and largest message."""
    listed = _ranks(lines)
    if not listed:
        raise NcclTestsError(
            path,
            "lists no ranks (nccl-tests prints a '#  Rank  N Group  0 Pid ... on HOST device "
            f"...' line for each); {WHAT}",
        )
    hosts: dict[int, tuple[str, str]] = {}
    for rank, _, host, device in listed:
        if rank in hosts:
            raise NcclTestsError(
                path,
                f"lists rank {rank} twice: each process ran a test of its own (an "
                "nccl-tests built without MPI under mpirun); build it with MPI=1",
            )
        hosts[rank] = (host, device)
    groups = sorted({group for _, group, _, _ in listed})
    if len(groups) > 1:
        raise NcclTestsError(
            path,
            f"ran its ranks in {len(groups)} groups (NCCL_TESTS_SPLIT): each group a "
            "collective of its own, not one over the nodes; calibrate with a run without it",
        )
    ranks = len(hosts)
    missing = next((r for r in range(ranks) if r not in hosts), None)
    if missing is not None:
        raise NcclTestsError(
            path, f"lists {ranks} ranks but not rank {missing}: a rank line is missing or cut"
        )
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
    size, _, _, _, bus_text, after = max(rows, key=lambda r: r[0])
    if size < MIN_BYTES:
        raise NcclTestsError(
            path,
            f"its largest {kind} message is {size:,} bytes; a calibration needs at least "
            f"{MIN_BYTES // 2**20} MiB (run nccl-tests with -e 1G or more: the model is NCCL's "
            "large-message protocol)",
        )
    magnitude = (_columns(lines) or (0, "#wrong"))[1] == "error"
    try:  # "#wrong" counts wrong elements; "error" (before 2.10) is the largest error
        bad = after != "N/A" and float(after) > (1e-3 if magnitude else 0)
    except ValueError:
        bad = False  # a row cut after its busbw: the check is not printed
    if bad:
        raise NcclTestsError(
            path, f"reports {after} wrong results in its {kind} at {size:,} bytes: a broken run"
        )
    busbw = float(bus_text)
    if not math.isfinite(busbw) or busbw <= 0:
        raise NcclTestsError(path, f"its bus bandwidth at {size:,} bytes is {bus_text}: not a rate")
    devices = sorted({device for _, device in hosts.values()})
    return NcclTestsRun(
        kind=kind,
        ranks=ranks,
        nodes=nodes,
        per_node=counts[0],
        device=devices[0] if len(devices) == 1 else " and ".join(devices),
        size=size,
        bus_bandwidth=busbw * 1e9,
        source=str(path),
    )


@dataclass(frozen=True)
class Measured:
    """One run against the model: the model's bus bandwidth for it at NCCL's full rates
    (bytes/s), the share of those rates at which the model gives what it measured, and a
    remark (the model's ceiling reached, an uncatalogued GPU)."""

    run: NcclTestsRun
    model: float
    share: float
    remark: str = ""


@dataclass(frozen=True)
class NetworkCalibration:
    """The share of NCCL's channel rates a cluster's network carries (`factor`, the lowest
    of the runs'), each run measured against the model, the runs left out (with why), and
    whether the plan it is for has nodes to connect."""

    factor: float
    runs: tuple[Measured, ...]
    left_out: tuple[str, ...] = ()
    one_node: bool = False

    def note(self) -> str:
        """One line for the plan: each run measured against the model."""
        parts = []
        for m in self.runs:
            r = m.run
            parts.append(
                f"{Path(r.source).name}: {r.kind} over {r.nodes} x {r.per_node} at "
                f"{r.size / 2**30:g} GiB, {r.bus_bandwidth / 1e9:.1f} GB/s against the model's "
                f"{m.model / 1e9:.1f} ({r.bus_bandwidth / m.model:.2f} of it; network share "
                f"{m.share:.2f}{', ' + m.remark if m.remark else ''})"
            )
        text = (
            f"network at x{self.factor:.2f} of NCCL's channel rates, from your nccl-tests: "
            + "; ".join(parts)
        )
        if self.left_out:
            text += "; left out: " + "; ".join(self.left_out)
        if self.one_node:
            text += " (the plan's one node uses no network)"
        return text


def calibrate_network(paths: Any, cluster: Any) -> NetworkCalibration:
    """Read each nccl-tests output in `paths` (one path or a list) and compare it with the
    model on `cluster` (a `workbench.planner.hardware.Cluster`)."""
    given = [paths] if isinstance(paths, (str, Path)) else paths
    if not isinstance(given, (list, tuple)) or not given:
        raise NcclTestsError(paths, f"must be a path or a list of paths; {WHAT}")
    if cluster.fabric.node_network is None:
        raise NcclTestsError(
            paths,
            f"the catalog has no network for {cluster.gpu.name} to calibrate; give "
            "inter_node_gbps (--inter-node-gbps)",
        )
    measured: list[Measured] = []
    left_out: list[str] = []
    for path in given:
        runs, skipped = _read(path)
        left_out += [f"{Path(str(path)).name}: {why}" for why in skipped]
        measured += [_measure(run, path, cluster) for run in runs]
    return NetworkCalibration(
        min(m.share for m in measured), tuple(measured), tuple(left_out), cluster.nodes == 1
    )


def _measure(run: NcclTestsRun, path: Any, cluster: Any) -> Measured:
    """`run` against the model on `cluster`'s fabric: the share of the network's rates at
    which the model gives what it measured (bisection: the model's bus bandwidth rises
    with the share until NVLink or NCCL's per-channel ceilings cap it)."""
    from workbench.estimate.catalog import find_gpu
    from workbench.planner.collectives import collective

    if run.per_node != cluster.gpus_per_node:
        raise NcclTestsError(
            path,
            f"ran {run.per_node} ranks a node; the plan's nodes have {cluster.gpus_per_node} "
            "GPUs: calibrate with a run over every GPU of each node (a run with fewer leaves "
            "NICs idle)",
        )
    if " and " in run.device:
        raise NcclTestsError(path, f"ran on several kinds of GPU ({run.device}); calibrate "
                             "with a run on the planned GPUs only")  # fmt: skip
    spec = find_gpu(run.device)
    if not isinstance(spec, str) and spec.name != cluster.gpu.name:
        raise NcclTestsError(
            path,
            f"ran on {run.device} ({spec.name}); the plan is for {cluster.gpu.name}: "
            "calibrate with a run on the planned GPUs",
        )
    remark = (
        f"its GPU, {run.device}, is not in the catalog: compared with {cluster.gpu.name}'s model"
        if isinstance(spec, str)
        else ""
    )
    fabric = cluster.fabric

    def bus(share: float) -> float:
        scaled = replace(fabric, network_factor=share)
        return collective(
            run.kind, run.size, run.ranks, scaled, per_node=run.per_node
        ).bus_bandwidth

    model, most = bus(1.0), bus(MAX_FACTOR)
    got = run.bus_bandwidth
    if got >= most:
        if got > BEYOND * most:
            raise NcclTestsError(
                path,
                f"measured {got / 1e9:.1f} GB/s of {run.kind} on {run.device}, "
                f"{got / most:.2f} x the most the model reaches for it on {cluster.gpu.name} "
                f"nodes ({most / 1e9:.1f} GB/s even at {MAX_FACTOR:g} x their network): a run "
                "on other GPUs, or in-network reduction (SHARP, CollNet) the model leaves "
                "out; calibrate with a run on the planned GPUs with NCCL_COLLNET_ENABLE=0",
            )
        reached = "the model's ceiling for it reached: the network at least the model's"
        return Measured(run, model, 1.0, "; ".join(x for x in (reached, remark) if x))
    low, high = 0.0, MAX_FACTOR
    while high - low > 1e-5:
        mid = (low + high) / 2
        low, high = (mid, high) if bus(mid) < got else (low, mid)
    return Measured(run, model, high, remark)


__all__ = [
    "BEYOND",
    "KINDS",
    "MAX_FACTOR",
    "MIN_BYTES",
    "Measured",
    "NcclTestsError",
    "NcclTestsRun",
    "NetworkCalibration",
    "calibrate_network",
    "read_nccl_tests",
]
