"""Collectives as NCCL runs them: the time of an all-reduce, all-gather or reduce-scatter of
a group of ranks placed over nodes (pure: numbers in, seconds out).

The model is NCCL's own tuning model (NCCL 2.30, `src/graph/tuning.cc` and
`src/graph/topo.h`), reduced to what a planner needs for large messages:

* **Bus bandwidth.** nccl-tests' "busbw": the rate a ring's busiest link moves, so that an
  all-reduce of S bytes over n ranks takes 2 (n-1)/n S / busbw and an all-gather or a
  reduce-scatter of S bytes (the gathered size) (n-1)/n S / busbw.
* **Inside a node** the ring runs over NVLink/NVSwitch at the GPU's bus bandwidth as NCCL's
  topology counts it (NVLink links x NCCL's per-link figure: 18 x 20.6 GB/s on an H100,
  12 x 20.0 on an A100; the catalog's `intra_bus`).
* **Across nodes** every NCCL channel's ring (or tree) leaves the node through one NIC and
  the channels are spread over all of the node's NICs. NCCL's graph search (`search.cc`)
  gives every channel one rate from its speed array (`speedArrayInter` before Hopper,
  `sm90SpeedArrayInter` on Hopper): the fastest at or below the NIC's bandwidth (its port
  speed / 8, `topo.cc`), so a NIC carries floor(NIC / rate) channels at that rate: 24 GB/s
  on a 25 GB/s HDR NIC, 48 on a 50 GB/s NDR one (RDMA writes measure the same: 24 of 25
  GB/s with ib_write_bw on HDR, NVIDIA/nccl issue #1048). A group with k ranks on each
  node, with gpus_per_node / k such groups running at once (every data-parallel group of a
  layout communicates at the same time), gets k / gpus_per_node of the node's channels
  together: the whole node's network when one group holds the node (k = gpus_per_node),
  one NIC's when tensor parallelism leaves one rank of the group on each node. The bus
  bandwidth is the lesser of that share and the NVLink bus bandwidth.
* **All-reduce across nodes** is the faster of NCCL's ring and its tree (a chain inside
  each node, a double binary tree across nodes: NCCL's hierarchical all-reduce), each with
  NCCL's latency: the tree's bandwidth is NCCL's 0.92 of the ring's (`busBw * .92`), each
  channel at most NCCL's per-channel tree ceiling (`perChMaxTreeBws`: 23.6 GB/s on 2
  nodes and 17.8 on more before Hopper, 41.4 and 36.0 on Hopper), its latency grows with
  log2(nodes) where the ring's grows with the ranks, so NCCL (and this model) picks the
  ring for large messages and the tree for smaller ones on many nodes.
  All-gather and reduce-scatter run the ring (NCCL's tree is all-reduce only; its PAT
  algorithm runs one GPU a node only).
* **Latency** (NCCL's Simple protocol constants): ring 8.4 us + 3.4 us per NVLink step +
  14 us per network step; tree 8.4 us + 2 x ((k - 1) x 4.0 us + log2(nodes) x 14 us).
  A collective moved as several calls (FSDP's one a layer, DDP's 25 MiB buckets) pays it
  for each.

* **NVLink SHARP (NVLS)**: on an NVSwitch node of Hoppers (HGX/DGX H100 and H200; the
  catalog's `nvls`) the switch reduces and multicasts. NCCL's model (`tuning.cc`): one
  channel a GPU of the group on a node (k), each at the per-channel rate NCCL's graph
  search finds (`search.cc`: the fastest of its sm90 rates, 60, 50, 40, ... GB/s, with
  (k + 1) x rate within the GPU's NVLink, the head GPU pulling twice: 40 GB/s on an H100),
  times NCCL's NVLS efficiency 0.85 and (k - 1)/k; an all-reduce pipelines its reduce and
  its multicast (x 2): 8 x 40 x 0.85 x 7/8 x 2 = 476 GB/s bus bandwidth on 8 H100s against
  the ring's 370.8. All-gather and reduce-scatter get (k - 1)/k instead of the 2, and so
  lose to the ring on one node (NCCL's own choice for large messages; across nodes NCCL
  runs them with NVLS only over CollNet). Across nodes (no CollNet) the all-reduce may run
  NVLS-Tree: NVLS inside each node, a tree over the network, each channel capped at the
  lesser of its NIC's rate (twice that on two nodes, where the tree has one hop each way)
  and NCCL's per-channel ceiling for NVLS-Tree on Hopper (57.7 GB/s on 2 nodes, 45.5 on
  more): 8 x 57.7 = 462 GB/s on two DGX H100s, 8 x 45.5 = 364 on more (where the ring's
  370.8 is as fast). Latency: 25 us inside a node, + 2 log2(nodes) x 20.9 us across.

Not modelled: SHARP in the network (CollNet, and the NVLS+CollNet all-reduce it enables),
small-message protocols (LL, LL128), congestion of a shared fabric. A fabric that carries
less than NCCL's channel rates is measured instead: `Fabric.network_factor` scales the
network (every channel's rate, and so the NIC share of NVLS-Tree and the tree's ceiling),
from the user's own nccl-tests run (`workbench.planner.nccl_tests`), or, for jobs that run
NCCL's default InfiniBand settings, `NCCL_IB_DEFAULTS_SHARE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from workbench.inputs import shown

#: the collectives modelled (nccl-tests' names without `_perf`)
KINDS = ("all_reduce", "all_gather", "reduce_scatter")

#: NCCL 2.30 `src/graph/tuning.cc`, Simple protocol: base latencies (us) of ring and tree
RING_BASE_US = 8.4
TREE_BASE_US = 8.4
#: per-step hardware latencies (us): a ring step over NVLink, a tree step over NVLink, a
#: step over the network
RING_NVLINK_STEP_US = 3.4
TREE_NVLINK_STEP_US = 4.0
NET_STEP_US = 14.0
#: NCCL's tree all-reduce bandwidth refinement (`busBw * .92`)
TREE_BANDWIDTH = 0.92

#: NVLS (NCCL 2.30 `src/graph/tuning.cc`, Hopper): `nvlsEfficiency`, the NVLink hardware
#: latency of NVLS and NVLS-Tree (us), NVLS-Tree's network latency a step (us), and
#: `perChMaxNVLSTreeBws` (GB/s a channel) on 2 nodes and on more
NVLS_EFFICIENCY = 0.85
NVLS_NVLINK_US = 25.0
NVLS_TREE_NET_US = 20.9
NVLS_TREE_MAX_2_NODES, NVLS_TREE_MAX_MORE = 57.7, 45.5
#: the share of NCCL's channel rates a collective carries across nodes with NCCL's default
#: InfiniBand settings, where the settings one B200 cluster's runs list as its "vendor NCCL
#: tuning" (NCCL_IB_QPS_PER_CONNECTION=2, NCCL_IB_AR_THRESHOLD=0,
#: NCCL_IB_SPLIT_DATA_ON_QPS=0, NCCL_IB_PCI_RELAXED_ORDERING=1, NCCL_IGNORE_CPU_AFFINITY=1)
#: are left out: that cluster's same-day A/B over the same eight 400 Gb/s rails of 4 nodes
#: at 8 GiB, forced ring (NCCL_ALGO=Ring), 307.3 GB/s of all-reduce without them and 384.0
#: with them (reduce-scatter 306.3 and 384.1, all-gather 308.7 and 376.2; NCCL's NVLS
#: all-reduce 301.8 and 350.8); togethercomputer/together-nccl-tests,
#: `baselines/flapping-airplanes/2026-07-11_nccl_collective_scaling_report.md`. One
#: cluster's figure, on B200 nodes with NDR rails: docs/planner.md says what it holds.
NCCL_IB_DEFAULTS_SHARE = 0.80
#: the plan's `Network:` line for it
IB_DEFAULTS_NOTE = (
    f"network at x{NCCL_IB_DEFAULTS_SHARE:.2f} of NCCL's channel rates for collectives: "
    "NCCL's default InfiniBand settings (without NCCL_IB_QPS_PER_CONNECTION=2, "
    f"NCCL_IB_AR_THRESHOLD=0 and three more, one B200 cluster's rings carried "
    f"{NCCL_IB_DEFAULTS_SHARE:.2f} of what they carried with them); your own nccl-tests "
    "measure your fabric (--nccl-tests)"
)
#: the per-channel rates (GB/s) NCCL's graph search tries on Hopper (`src/graph/search.cc`
#: `sm90SpeedArrayIntra`, `sm90SpeedArrayInter`): inside one node, and with a network
SM90_SPEEDS_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_SPEEDS_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                     3.0, 2.4, 1.2, 0.24, 0.12)  # fmt: skip
#: the same before Hopper (`speedArrayInter`): the rates a channel leaving the node may get
SPEEDS_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
                3.0, 2.4, 1.2, 0.24, 0.12)  # fmt: skip
#: NCCL's per-channel ceiling of the tree all-reduce (`perChMaxTreeBws`, GB/s) on 2 nodes
#: and on more, by GPU generation (SM major x 10: Volta, Ampere, Hopper)
TREE_MAX = {70: (18.5, 10.0), 80: (23.6, 17.8), 90: (41.4, 36.0)}


@dataclass(frozen=True)
class Fabric:
    """What the collectives read of a cluster: GPUs a node, a GPU's NVLink bus bandwidth
    inside a node, a node's NICs together (bytes/s per direction; None: not known),
    whether its NVSwitch reduces (NVLink SHARP: NCCL's NVLS), how many NICs share that
    network (None: one a GPU) and the GPU's generation (SM major x 10: 90 for Hopper), which
    picks NCCL's per-channel rates."""

    gpus_per_node: int
    intra_bus: float
    node_network: float | None
    nvls: bool = False
    nics: int | None = None
    sm: int = 80
    #: the share of NCCL's channel rates the network carries (1: a healthy fabric with
    #: NCCL's settings; less: yours as your nccl-tests measured it, planner.nccl_tests)
    network_factor: float = 1.0

    @cached_property  # a frozen dataclass: computed once, kept in the instance's __dict__
    def channel_rate(self) -> float:
        """The rate (bytes/s) NCCL's graph search gives a channel through one of the node's
        NICs: the fastest of its per-channel rates at or below the NIC's bandwidth."""
        assert self.node_network is not None
        nic = self.node_network / (self.nics or self.gpus_per_node) / 1e9
        return _fastest(SM90_SPEEDS_INTER if self.sm >= 90 else SPEEDS_INTER, nic) * 1e9

    @cached_property
    def network_bus(self) -> float:
        """The node's network as NCCL's channels use it (bytes/s): floor(NIC / rate)
        channels a NIC at the channel rate, over all of the node's NICs."""
        assert self.node_network is not None
        nics = self.nics or self.gpus_per_node
        rate = self.channel_rate
        if rate <= 0:  # a NIC slower than NCCL's slowest rate: its own
            return self.node_network * self.network_factor
        per_nic = math.floor(self.node_network / nics / rate + 1e-9)
        return nics * per_nic * rate * self.network_factor


@dataclass(frozen=True)
class Collective:
    """One collective's modelled time and how NCCL runs it."""

    kind: str
    ranks: int
    nodes: int
    seconds: float
    bus_bandwidth: float  # bytes/s: nccl-tests' busbw at this size (latency included)
    #: "ring (NVLink)", "NVLS (NVLink SHARP)", "ring (network)", "tree (network)",
    #: "NVLS-Tree (network)", "none"
    algorithm: str


def placement(stride: int, group: int, gpus_per_node: int) -> int:
    """Ranks of a group on each node, for a group of `group` ranks `stride` ranks apart
    (a data-parallel group of a tp x pp x dp layout: stride tp x pp; ranks fill a node
    before the next): gpus_per_node / stride of them, at least 1, at most the group."""
    if stride >= gpus_per_node:
        return 1
    return max(1, min(group, gpus_per_node // stride))


def _fastest(speeds: tuple[float, ...], limit: float) -> float:
    """The fastest of NCCL's per-channel rates at or below `limit` (GB/s; 0: none)."""
    return next((s for s in speeds if s <= limit), 0.0)


def nvls_bus_bandwidth(kind: str, k: int, nodes: int, fabric: Fabric) -> float | None:
    """NCCL's NVLS bus bandwidth (bytes/s; for an all-gather or reduce-scatter its
    algorithm bandwidth, as NCCL's model has it) for a group with `k` ranks on each of
    `nodes` nodes; None where NCCL does not run NVLS: no NVLink SHARP, fewer than 2 ranks
    (channels) a node, an all-gather or reduce-scatter across nodes (CollNet only)."""
    if not fabric.nvls or k < 2 or (nodes > 1 and kind != "all_reduce"):
        return None
    bus = fabric.intra_bus / 1e9  # GB/s, NCCL's count of the GPU's NVLink
    if nodes == 1:
        rate = _fastest(SM90_SPEEDS_INTRA, bus / (k + 1))  # the head pulls twice
        cap = SM90_SPEEDS_INTRA[0]  # the channel's "inter" rate, raised to the top
    else:
        assert fabric.node_network is not None
        # a channel's NIC as NCCL rates it (its search knows the NICs' speed, not how much
        # of it the fabric carries: `network_factor` scales the network's cap below)
        nic = fabric.network_bus / fabric.network_factor / fabric.gpus_per_node / 1e9
        rate = _fastest(SM90_SPEEDS_INTER, min(bus / (k + 1), nic))
        tree_max = NVLS_TREE_MAX_2_NODES if nodes <= 2 else NVLS_TREE_MAX_MORE
        cap = min(min(nic, 2 * rate) * (2 if nodes <= 2 else 1), tree_max) * fabric.network_factor
    if rate <= 0:
        return None
    per_channel = rate * NVLS_EFFICIENCY * (k - 1) / k
    per_channel *= 2.0 if kind == "all_reduce" else (k - 1) / k
    return k * min(per_channel, cap) * 1e9


def _nvls_seconds(kind: str, size_bytes: float, k: int, nodes: int, fabric: Fabric) -> float | None:
    """NCCL's NVLS (one node) or NVLS-Tree (across nodes) time, or None where it has none."""
    bandwidth = nvls_bus_bandwidth(kind, k, nodes, fabric)
    if bandwidth is None:
        return None
    n = k * nodes
    moved = _algbw_factor(kind, n) * size_bytes if kind == "all_reduce" else size_bytes
    lat = NVLS_NVLINK_US
    if nodes > 1:
        lat += 2 * max(1, int(math.log2(nodes))) * NVLS_TREE_NET_US
    return moved / bandwidth + lat * 1e-6


def _algbw_factor(kind: str, n: int) -> float:
    """Bus bytes over algorithm bytes: 2 (n-1)/n for an all-reduce, (n-1)/n otherwise."""
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n


#: NCCL_ALGO's names for the algorithms modelled, and the names `Collective` reports
ALGORITHMS = {
    "ring": ("ring (NVLink)", "ring (network)"),
    "nvls": ("NVLS (NVLink SHARP)",),
    "tree": ("tree (network)",),
    "nvlstree": ("NVLS-Tree (network)",),
}


def collective(
    kind: str,
    size_bytes: float,
    ranks: int,
    fabric: Fabric,
    *,
    per_node: int | None = None,
    algorithm: str | None = None,
) -> Collective:
    """The time of one `kind` collective of `size_bytes` (the all-reduced tensor, or the
    gathered / reduce-scattered whole) over `ranks` ranks with `per_node` of them on each
    node (all of them on one node by default when they fit): the fastest of the algorithms
    NCCL runs there, or the one `algorithm` names as NCCL_ALGO forces it ("ring", "tree",
    "nvls", "nvlstree"; ValueError where NCCL has no such algorithm for it)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: must be one of {', '.join(KINDS)}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={shown(algorithm)}: must be one of {', '.join(ALGORITHMS)}")
    if ranks <= 1 or size_bytes <= 0:
        return Collective(kind, ranks, 1, 0.0, 0.0, "none")
    k = min(ranks, fabric.gpus_per_node) if per_node is None else max(1, min(per_node, ranks))
    nodes = math.ceil(ranks / k)
    factor = _algbw_factor(kind, ranks)
    times = _candidates(kind, size_bytes, ranks, k, nodes, fabric)
    if algorithm is not None:
        times = {n: t for n, t in times.items() if n in ALGORITHMS[algorithm]}
        if not times:
            raise ValueError(
                f"algorithm={shown(algorithm)}: NCCL does not run it for this {kind} of {ranks} "
                f"ranks over {nodes} node(s)"
            )
    name = min(times, key=lambda n: times[n])
    best = times[name]
    return Collective(kind, ranks, nodes, best, factor * size_bytes / best, name)


def _candidates(
    kind: str, size_bytes: float, ranks: int, k: int, nodes: int, fabric: Fabric
) -> dict[str, float]:
    """Seconds of each algorithm NCCL runs for this collective, by `Collective.algorithm`."""
    factor = _algbw_factor(kind, ranks)
    steps = 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1
    times: dict[str, float] = {}
    if nodes == 1:
        lat = RING_BASE_US + steps * RING_NVLINK_STEP_US
        times["ring (NVLink)"] = factor * size_bytes / fabric.intra_bus + lat * 1e-6
        nvls = _nvls_seconds(kind, size_bytes, k, 1, fabric)
        if nvls is not None:
            times["NVLS (NVLink SHARP)"] = nvls
        return times
    if fabric.node_network is None:
        raise ValueError(
            f"ranks={ranks}: a group over {nodes} nodes needs the network's bandwidth "
            "(inter_node_gbps)"
        )
    share = fabric.network_bus * k / fabric.gpus_per_node  # this group's NICs' channels
    bus = min(fabric.intra_bus, share)
    inter_steps = 2 * (nodes - 1) if kind == "all_reduce" else nodes - 1
    ring_lat = (
        RING_BASE_US + (steps - inter_steps) * RING_NVLINK_STEP_US + inter_steps * NET_STEP_US
    )
    times["ring (network)"] = factor * size_bytes / bus + ring_lat * 1e-6
    if kind == "all_reduce":
        tree_lat = TREE_BASE_US + 2 * (
            (k - 1) * TREE_NVLINK_STEP_US + max(1, int(math.log2(nodes))) * NET_STEP_US
        )
        tree_bus = TREE_BANDWIDTH * bus
        rate = fabric.channel_rate
        if rate > 0:  # NCCL: min(busBw * .92, nChannels x perChMaxTreeBw)
            tree_max = TREE_MAX.get(fabric.sm) or TREE_MAX[90 if fabric.sm > 90 else 80]
            tree_bus = min(tree_bus, share / rate * tree_max[0 if nodes <= 2 else 1] * 1e9)
        times["tree (network)"] = factor * size_bytes / tree_bus + tree_lat * 1e-6
        nvls_tree = _nvls_seconds(kind, size_bytes, k, nodes, fabric)
        if nvls_tree is not None:
            times["NVLS-Tree (network)"] = nvls_tree
    return times


def seconds(
    kind: str,
    size_bytes: float,
    ranks: int,
    fabric: Fabric,
    *,
    per_node: int | None = None,
    calls: int = 1,
) -> float:
    """The seconds of `size_bytes` moved as `calls` equal collectives (FSDP's and ZeRO-3's
    one a layer, DDP's one a 25 MB bucket): each pays NCCL's latency."""
    calls = max(1, int(calls))
    return calls * collective(kind, size_bytes / calls, ranks, fabric, per_node=per_node).seconds


__all__ = [
    "ALGORITHMS",
    "KINDS",
    "Collective",
    "Fabric",
    "collective",
    "nvls_bus_bandwidth",
    "placement",
    "seconds",
]
