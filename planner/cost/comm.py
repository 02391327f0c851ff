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


def efficiencies(hw: Hardware) -> tuple[float, float]:
    """(NVLink, NIC) achieved fractions of the datasheet bandwidth at large messages.

    The defaults are measured per link class (constants.NETWORK_EFFICIENCY for NVLink,
    constants.NIC_EFFICIENCY for the NICs). A profile's own ``network_efficiency`` (a measured
    or ``plan calibrate``d value) replaces the NVLink figure and scales the NIC figure by the
    same factor, capped at 1, so one network factor still moves both link classes together."""
    if hw.network_efficiency is None:
        return constants.NETWORK_EFFICIENCY, constants.NIC_EFFICIENCY
    scale = hw.network_efficiency / constants.NETWORK_EFFICIENCY
    return hw.network_efficiency, min(1.0, constants.NIC_EFFICIENCY * scale)


def links(hw: Hardware) -> tuple[Link, Link]:
    """The (intra-node, inter-node) links of a GPU kind, per GPU, each derated by its measured
    efficiency. The inter-node link is the GPU's share of its node's NICs (node_nic_gbps)."""
    nvlink, nic = efficiencies(hw)
    intra = Link(hw.intra_node_gbps * 1e9 * nvlink, constants.INTRA_NODE_LATENCY_S)
    inter = Link(node_nic_gbps(hw) / hw.gpus_per_node * 1e9 * nic,
                 constants.INTER_NODE_LATENCY_S)
    return intra, inter


def node_nic_gbps(hw: Hardware) -> float:
    """GB/s one direction through all the NICs of one node: ``nics_per_node`` x ``nic_gbps``
    where the profile describes its NICs, else ``inter_node_gbps`` (per GPU) x GPUs per node."""
    if hw.nics_per_node and hw.nic_gbps:
        return hw.nics_per_node * hw.nic_gbps
    return hw.inter_node_gbps * hw.gpus_per_node


def group_link(hw: Hardware, members_per_node: int, spans_nodes: bool,
               groups_per_node: int | None = None) -> Link:
    """The bus bandwidth a collective over one process group runs at, per member.

    Within a node it is NVLink. Across nodes it is set by the bytes each NIC carries. A ring
    (NCCL runs one per channel, its channels spread over the NICs) sends (n-1)/n of the buffer
    out of every node it crosses whatever the members per node, so when ``groups_per_node``
    groups of the node run the same collective at once (all DP groups of a pipeline stage do),
    each group moves its buffer through 1/groups of the node's NIC bandwidth. On a
    rail-optimised fabric (``rail_optimized``, DGX SuperPOD reference architecture: NIC k of
    every node on rail switch k) a group's traffic stays on the rails of its own members, so it
    also gets no more than their share of the NICs, members / GPUs per node; elsewhere (one
    switch per node, shared NICs) any NIC carries it. NVLink carries the ring's other hops:
    with L members on a node each channel enters and leaves the node once, so L - 1 of every L
    sends of a member go over NVLink, capping the rate at NVLink x L / (L - 1) (no cap for one
    member per node). Default: every GPU of the node in one of the concurrently running groups
    (groups = GPUs per node / members)."""
    intra, _ = links(hw)
    if not spans_nodes:
        return intra
    members = max(1, members_per_node)
    groups = max(1, groups_per_node or hw.gpus_per_node // members)
    _, nic_eff = efficiencies(hw)
    node = node_nic_gbps(hw) * 1e9 * nic_eff
    share = node / groups
    if hw.rail_optimized is not False:
        share = min(share, node * min(1.0, members / hw.gpus_per_node))
    nvlink = intra.bytes_per_s * members / (members - 1) if members > 1 else float("inf")
    return Link(min(nvlink, share), constants.INTER_NODE_LATENCY_S)


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
