"""The machine a plan runs on: the GPU (from the estimator's catalog), how many per node and
how many nodes, and the bandwidths its collectives and offload traffic move over.

Bandwidths are per GPU and per direction, in bytes/s. Intra-node is the GPU's NVLink (or
PCIe for a part without NVLink): the data sheet's figure, and the bus bandwidth a ring
collective gets out of it as NCCL's topology counts it (`intra_bus`: NVLink links x NCCL's
per-link rate); inter-node is one GPU's share of its node's NICs (a DGX gives each GPU its
own NIC), so a node's network together is `inter_node x gpus_per_node`, what NCCL spreads
one collective's channels over (workbench/planner/collectives.py: each NIC's channels at the
rate NCCL's graph search gives them, 24 GB/s on a 25 GB/s HDR NIC, 48 on a 50 GB/s NDR one,
from the GPU generation's rates, `sm`). An 8-GPU HGX/DGX H100
or H200 node's NVSwitch also reduces (NVLink SHARP: `nvls`, NCCL's NVLS). Both come from the data
sheets named in `LINKS` and can be given instead (`intra_node_gbps`, `inter_node_gbps`).
A GPU without an inter-node figure needs one given to plan more than one node. PCIe (the
offload traffic) is the slot's per-direction rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.estimate import GpuSpec, get_gpu
from workbench.inputs import shown
from workbench.planner.collectives import Fabric

_G = 1e9


@dataclass(frozen=True)
class Links:
    """One GPU's bandwidths, bytes/s per direction: NVLink (or PCIe) within a node, the
    network share between nodes (None: not known), its PCIe slot; and their sources.
    `intra_bus` is the bus bandwidth NCCL's ring gets inside a node (None: `intra_node`);
    `nics` the node's network as its data sheet gives it (e.g. "8 x 400 Gb/s")."""

    intra_node: float
    inter_node: float | None
    pcie: float
    source: str
    intra_bus: float | None = None
    nics: str = ""
    #: the node's NVSwitch reduces (NVLink SHARP, NCCL's NVLS): third-generation NVSwitch
    #: of an 8-GPU HGX/DGX Hopper board
    nvls: bool = False
    #: the GPU's generation as NCCL's tuning reads it (SM major x 10: 70 Volta, 80 Ampere and
    #: others, 90 Hopper): which per-channel rates its graph search gives a NIC's channels
    sm: int = 80


_NVLINK_A100 = "NVIDIA A100 data sheet: NVLink 600 GB/s (bidirectional), PCIe Gen4 64 GB/s"
_NVLINK_H100 = "NVIDIA H100 data sheet (SXM): NVLink 900 GB/s (bidirectional), PCIe Gen5 128 GB/s"
_DGX_A100 = (
    "DGX A100 user guide: 8x 200 Gb/s HDR InfiniBand (ConnectX-6) for 8 GPUs, 200 GB/s a node "
    "(25 GB/s per GPU)"
)
_DGX_H100 = (
    "DGX H100 user guide: 8x 400 Gb/s NDR InfiniBand (ConnectX-7) for 8 GPUs, 400 GB/s a node "
    "(50 GB/s per GPU)"
)
#: NCCL 2.30 src/graph/topo.h: NVLink GB/s per link as NCCL's topology counts it
_NCCL_BUS = "NCCL ring bus bandwidth: {links} NVLink links x {rate} GB/s (NCCL src/graph/topo.h)"
_PCIE4 = "PCIe Gen4 x16: 32 GB/s per direction (no NVLink on this part)"
#: NVLink SHARP: which nodes have it, and NCCL's use of it
_NVLS = (
    "NVLink SHARP: the third-generation NVSwitch of the 8-GPU HGX/DGX H100 and H200 boards "
    "reduces in the switch (NVIDIA Hopper architecture whitepaper, 'NVLink SHARP'); NCCL's "
    "all-reduce uses it by default, 'a peak busBw of ~480GB/s' on 8 GPUs (NCCL maintainer, "
    "NVIDIA/nccl-tests issue #212), and across nodes as NVLS-Tree from NCCL 2.18.1 (release "
    "notes); it needs CUDA multicast (the fabric manager)"
)

#: catalog name -> its links (the data sheet figure halved: per direction)
LINKS: dict[str, Links] = {
    "v100-16gb": Links(
        150 * _G,
        None,
        16 * _G,
        "NVIDIA V100 data sheet (SXM2): NVLink 300 GB/s; " + _NCCL_BUS.format(links=6, rate=20.0),
        intra_bus=120 * _G,
        sm=70,
    ),
    "v100-32gb": Links(
        150 * _G,
        None,
        16 * _G,
        "NVIDIA V100 data sheet (SXM2): NVLink 300 GB/s; " + _NCCL_BUS.format(links=6, rate=20.0),
        intra_bus=120 * _G,
        sm=70,
    ),
    "t4": Links(16 * _G, None, 16 * _G, "PCIe Gen3 x16: 16 GB/s per direction (no NVLink)"),
    "a10g": Links(32 * _G, None, 32 * _G, _PCIE4),
    "l4": Links(32 * _G, None, 32 * _G, _PCIE4),
    "rtx-3090": Links(32 * _G, None, 32 * _G, _PCIE4),
    "rtx-4090": Links(32 * _G, None, 32 * _G, _PCIE4),
    "a100-40gb": Links(
        300 * _G,
        25 * _G,
        32 * _G,
        f"{_NVLINK_A100}; {_DGX_A100}; " + _NCCL_BUS.format(links=12, rate=20.0),
        intra_bus=240 * _G,
        nics="8 x 200 Gb/s HDR",
    ),
    "a100-80gb": Links(
        300 * _G,
        25 * _G,
        32 * _G,
        f"{_NVLINK_A100}; {_DGX_A100}; " + _NCCL_BUS.format(links=12, rate=20.0),
        intra_bus=240 * _G,
        nics="8 x 200 Gb/s HDR",
    ),
    "l40s": Links(32 * _G, None, 32 * _G, _PCIE4),
    "h100-80gb": Links(
        450 * _G,
        50 * _G,
        64 * _G,
        f"{_NVLINK_H100}; {_DGX_H100}; " + _NCCL_BUS.format(links=18, rate=20.6) + f"; {_NVLS}",
        intra_bus=370.8 * _G,
        nics="8 x 400 Gb/s NDR",
        nvls=True,
        sm=90,
    ),
    "h200-141gb": Links(
        450 * _G,
        50 * _G,
        64 * _G,
        f"{_NVLINK_H100} (same on the H200); {_DGX_H100} (DGX H200: the same); "
        + _NCCL_BUS.format(links=18, rate=20.6)
        + f"; {_NVLS}",
        intra_bus=370.8 * _G,
        nics="8 x 400 Gb/s NDR",
        nvls=True,
        sm=90,
    ),
    "mi300x": Links(
        448 * _G,
        50 * _G,
        64 * _G,
        "AMD Instinct MI300X data sheet: 7 Infinity Fabric links, 896 GB/s aggregate "
        "(bidirectional), PCIe Gen5; 8x 400 Gb/s networking for 8 GPUs (50 GB/s per GPU)",
        nics="8 x 400 Gb/s",
    ),
}

#: the slowest and fastest link planned, GB/s per direction: 1 MB/s is slower than the
#: first 10 Mb/s Ethernet (no cluster trains over it), 10^6 GB/s 10^3 times NVLink
MIN_GBPS, MAX_GBPS = 0.001, 1e6

#: host memory bandwidth one node's CPU optimizer step shares (bytes/s): an assumption
#: (two sockets of DDR5, about 300 GB/s each, read and write at half that), docs/planner.md
HOST_BANDWIDTH = 300 * _G


@dataclass(frozen=True)
class Cluster:
    """The GPUs a plan runs on and the bandwidths between them (bytes/s per direction)."""

    gpu: GpuSpec
    gpus_per_node: int
    nodes: int
    intra_node: float
    inter_node: float | None
    pcie: float
    host_bandwidth: float
    source: str
    #: a ring collective's bus bandwidth inside a node (NCCL's; None: `intra_node`)
    intra_bus: float | None = None
    #: the node's NVSwitch reduces (NVLink SHARP: NCCL's NVLS, workbench.planner.collectives)
    nvls: bool = False
    #: the GPU's generation as NCCL's tuning reads it (`Links.sm`)
    sm: int = 80
    #: the share of NCCL's channel rates the network carries (`Fabric.network_factor`)
    network_factor: float = 1.0
    #: where that share comes from (empty: NCCL's model; `planner.nccl_tests`' note)
    network_source: str = ""
    #: whether a pipeline's sends between nodes run at that share too (a measured network
    #: carries them as it carried its collectives; NCCL's default IB settings were
    #: measured on collectives only)
    sends_at_share: bool = True

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def node_network(self) -> float | None:
        """A node's NICs together, bytes/s per direction (None: not known)."""
        return None if self.inter_node is None else self.inter_node * self.gpus_per_node

    @property
    def fabric(self) -> Fabric:
        """What workbench.planner.collectives reads of this cluster."""
        bus = self.intra_node if self.intra_bus is None else self.intra_bus
        return Fabric(
            self.gpus_per_node,
            bus,
            self.node_network,
            nvls=self.nvls,
            sm=self.sm,
            network_factor=self.network_factor,
        )

    def link(self, span: int) -> float:
        """The bandwidth one GPU's point-to-point traffic over groups of `span` consecutive
        GPUs runs at (a pipeline's sends): its own NIC's share as soon as a group leaves
        its node. Collectives: workbench.planner.collectives over `fabric`."""
        if span <= self.gpus_per_node or self.nodes == 1:
            return self.intra_node
        assert self.inter_node is not None
        return self.inter_node * (self.network_factor if self.sends_at_share else 1.0)


def cluster(
    gpu: str,
    *,
    gpus_per_node: int = 8,
    nodes: int = 1,
    intra_node_gbps: float | None = None,
    inter_node_gbps: float | None = None,
) -> Cluster:
    """The `Cluster` of `nodes` x `gpus_per_node` GPUs of catalog type `gpu`; bandwidths in
    GB/s per direction override the catalog's. ValueError naming the field and value for a
    GPU not in the catalog, a count < 1, or several nodes with no inter-node figure."""
    try:
        spec = get_gpu(gpu)
    except ValueError as exc:
        import difflib

        from workbench.estimate import gpu_names

        if "ambiguous" in str(exc):  # the error lists the names it may be
            raise
        close = difflib.get_close_matches(str(gpu).lower(), gpu_names(), n=2, cutoff=0.5)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ValueError(f"{exc}{hint}") from None
    for name, value in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
            raise ValueError(f"{name}={shown(value)}: must be an integer from 1 to 100000")
    rates: tuple[tuple[str, float | None], ...] = (
        ("intra_node_gbps", intra_node_gbps),
        ("inter_node_gbps", inter_node_gbps),
    )
    for rate_name, rate in rates:
        number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
        if rate is not None and not (number and MIN_GBPS <= rate <= MAX_GBPS):
            raise ValueError(
                f"{rate_name}={shown(rate)}: must be a number of GB/s > 0, at least "
                f"{MIN_GBPS:g} (1 MB/s: slower than the first 10 Mb/s Ethernet, no cluster's "
                "link) and at most 10^6 (10^3 times NVLink)"
            )
    links = LINKS[spec.name]
    inter = inter_node_gbps * _G if inter_node_gbps is not None else links.inter_node
    if nodes > 1 and inter is None:
        raise ValueError(
            f"nodes={nodes}: the catalog has no inter-node bandwidth for {spec.name} (its "
            "parts ship without a standard network); give inter_node_gbps (--inter-node-gbps), "
            "the GB/s per GPU per direction between nodes"
        )
    source = links.source
    if intra_node_gbps is not None or inter_node_gbps is not None:
        source += "; overridden: " + ", ".join(
            f"{n}={v:g} GB/s"
            for n, v in (("intra", intra_node_gbps), ("inter", inter_node_gbps))
            if v is not None
        )
    return Cluster(
        gpu=spec,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        intra_node=intra_node_gbps * _G if intra_node_gbps is not None else links.intra_node,
        intra_bus=intra_node_gbps * _G if intra_node_gbps is not None else links.intra_bus,
        inter_node=inter,
        pcie=links.pcie,
        host_bandwidth=HOST_BANDWIDTH,
        source=source,
        # NVLS is the 8-GPU board's NVSwitch (a 4-GPU HGX board links its GPUs directly);
        # an intra-node figure given describes another fabric
        nvls=links.nvls and gpus_per_node == 8 and intra_node_gbps is None,
        sm=links.sm,
    )
