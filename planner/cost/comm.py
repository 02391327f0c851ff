"""Collective and point-to-point communication times.

Ring algorithms over n ranks with per-GPU one-direction bandwidth beta (bytes/s) and per-hop latency
alpha (Thakur, Rabenseifner & Gropp 2005; NCCL's "bus bandwidth" definition in nccl-tests
PERFORMANCE.md): all-reduce moves 2(n-1)/n of the buffer through each link, all-gather and
reduce-scatter (n-1)/n.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import constants
from planner.hardware.profiles import Hardware


@dataclass(frozen=True)
class Link:
    """One class of link: bytes/s one direction per GPU (already derated) and per-hop latency."""

    bytes_per_s: float
    latency_s: float


def links(hw: Hardware) -> tuple[Link, Link]:
    """The (intra-node, inter-node) links of a GPU kind, derated by the network efficiency."""
    eff = hw.network_efficiency or constants.NETWORK_EFFICIENCY
    intra = Link(hw.intra_node_gbps * 1e9 * eff, constants.INTRA_NODE_LATENCY_S)
    inter = Link(hw.inter_node_gbps * 1e9 * eff, constants.INTER_NODE_LATENCY_S)
    return intra, inter


def group_link(hw: Hardware, members_per_node: int, spans_nodes: bool) -> Link:
    """The link a collective over one process group runs at, per member.

    Within a node it is NVLink. Across nodes, NCCL runs one ring (channel) per NIC, and on
    rail-optimised nodes (one NIC per GPU: DGX A100/H100 reference architecture, NVIDIA DGX
    SuperPOD RA) a group with L members on a node drives L NICs at once, so each member's share
    of the node-crossing traffic moves at L x the per-GPU NIC bandwidth, capped by NVLink.
    ``inter_node_gbps`` is per GPU, so a node with fewer NICs than GPUs is already averaged in."""
    intra, inter = links(hw)
    if not spans_nodes:
        return intra
    rails = max(1, members_per_node)
    return Link(min(intra.bytes_per_s, inter.bytes_per_s * rails), inter.latency_s)


def all_reduce_s(nbytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bytes_per_s + 2 * (n - 1) * link.latency_s


def all_gather_s(nbytes: float, n: int, link: Link) -> float:
    """``nbytes`` is the gathered (full) buffer; reduce-scatter costs the same."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bytes_per_s + (n - 1) * link.latency_s


reduce_scatter_s = all_gather_s


def all_to_all_s(nbytes: float, n: int, link: Link) -> float:
    """``nbytes`` is what one rank holds; it keeps 1/n and sends (n-1)/n of it, one piece to
    each other rank, pairwise (NCCL's all-to-all is n - 1 concurrent send/recv pairs)."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bytes_per_s + (n - 1) * link.latency_s


def p2p_s(nbytes: float, link: Link) -> float:
    return nbytes / link.bytes_per_s + link.latency_s


def overlap_interference(hw: Hardware) -> float:
    """Fraction of the GPU's compute lost while an overlapped collective runs beside it.

    An NCCL collective holds ``constants.NCCL_SMS`` SMs for as long as it runs, one CTA per
    channel that no compute kernel shares (NVIDIA/nccl #689), so compute running concurrently has
    that share of the SMs fewer: work it would have done during the collective is done afterwards.
    A profile without its SM count gets the mean measured slowdown
    (``constants.OVERLAP_INTERFERENCE``, Lee et al. 2025). Wave quantization of persistent
    Hopper GEMMs can make it much worse (PyTorch issue #143988: matmuls 2x slower beside NCCL on
    H100); that depends on the kernels cuBLAS picks and is not modelled.
    """
    if hw.sm_count:
        return min(1.0, constants.NCCL_SMS / hw.sm_count)
    return constants.OVERLAP_INTERFERENCE
