"""Tensor-parallel collectives of one layer, priced as NCCL prices them (cost/nccl.py).

Megatron's tensor parallelism all-reduces each block's attention and MLP outputs over the TP
group in the forward, and their input gradients in the backward: "f is an identity operator in
the forward pass and all reduce in the backward pass while g is an all reduce in the forward
pass and identity in the backward pass" (Shoeybi et al. 2019, Megatron-LM, Fig. 3). With
sequence parallelism each all-reduce becomes an all-gather before the column-parallel GEMM and a
reduce-scatter after the row-parallel one (Korthikanti et al. 2022, §4.2.2), the same bytes on
the ring. The buffer is one microbatch's hidden states,
tokens x hidden x 2 bytes, whatever the TP degree.

The TP group is ``tp`` consecutive ranks (Megatron's rank order puts TP innermost): within one
NVLink domain it runs NCCL's intra-node ring at the NVLink bus bandwidth; a TP group wider than
the domain also crosses the network, at the node's NIC bandwidth (comm.group_link).
"""

from __future__ import annotations

from planner.cost import comm, nccl
from planner.hardware.profiles import Hardware


def tp_group(hw: Hardware, tp: int) -> nccl.Group:
    """The TP group as NCCL sees it: ``tp`` ranks, the NVLink domains they span, and the bus
    bandwidth of its ring (NVLink within a domain; the NICs once it leaves one)."""
    domain = hw.nvlink_domain or hw.gpus_per_node
    if tp <= domain:
        return nccl.Group(ranks=tp, nodes=1, bus_bytes_per_s=comm.links(hw)[0].bytes_per_s)
    per_node = min(tp, hw.gpus_per_node)
    link = comm.group_link(hw, per_node, True, groups_per_node=max(1, hw.gpus_per_node // per_node))
    return nccl.Group(ranks=tp, nodes=-(-tp // domain), bus_bytes_per_s=link.bytes_per_s)


def collective_s(nbytes: float, tp: int, sequence_parallel: bool, hw: Hardware) -> float:
    """Seconds of one TP collective on a buffer of ``nbytes`` (the full hidden states): an
    all-reduce, or with sequence parallelism an all-gather and a reduce-scatter."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    group = tp_group(hw, tp)
    if sequence_parallel:
        return float(nccl.collective_s("all_gather", nbytes, group)
                     + nccl.collective_s("reduce_scatter", nbytes, group))
    return float(nccl.collective_s("all_reduce", nbytes, group))


def all_gather_s(nbytes: float, tp: int, hw: Hardware) -> float:
    """Seconds of one all-gather of a ``nbytes`` buffer over the TP group (a pipeline stage's
    input rebuilt from the 1/tp pieces its TP ranks received)."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    return float(nccl.collective_s("all_gather", nbytes, tp_group(hw, tp)))


def reduce_scatter_s(nbytes: float, tp: int, hw: Hardware) -> float:
    """Seconds of one reduce-scatter of a ``nbytes`` buffer (the full hidden states) over the TP
    group: a row-parallel GEMM's output summed and left as 1/tp shards."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    return float(nccl.collective_s("reduce_scatter", nbytes, tp_group(hw, tp)))
