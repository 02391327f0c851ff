"""What one NCCL collective costs: NCCL's own choice of algorithm and protocol by message size.

NCCL prices every (algorithm, protocol) pair with a latency and a bus bandwidth and runs the pair
that finishes first (``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime`` in NVIDIA/nccl
src/graph/tuning.cc; read at commit b6475625, the 2.19-era model that Hu et al. 2025,
"Demystifying NCCL", arXiv 2507.04786, analyse). This module is that model, written for the
planner's process groups:

    time = latency(algorithm, protocol, ranks, nodes) + bus bytes / bus bandwidth(protocol)

- Algorithms: ring for every collective; tree for all-reduce only ("if (coll == ncclFuncAllGather
  && a != NCCL_ALGO_RING && a != NCCL_ALGO_NVLS && a != NCCL_ALGO_COLLNET_DIRECT) continue").
  NVLS (NVLink SHARP on H100 NVSwitch), CollNet (in-network SHARP) and PAT are not modelled: they
  need switch features the hardware profiles do not describe.
- Protocols: Simple (large chunks behind memory fences: the link's bandwidth, the largest
  latency), LL128 (128-byte lines with an 8-byte flag: 120/128 of it, lower latency) and LL
  (8-byte lines with a 4-byte flag: a quarter to a third of it, the lowest latency); Hu et al.
  2025 §3 describe the same three ("Simple ... near peak", "LL ... 25-50%", "LL128 ... ~95%").
- The Simple bus bandwidth is the group's link (planner/cost/comm.py ``group_link``: NVLink within
  a node, the node's NIC share across nodes, derated by the measured efficiency); the other
  protocols' bandwidths are NCCL's fractions of it. NCCL's per-channel caps (which need its
  channel count) and its tree correction table (which would make the time non-monotone in size)
  are left out; both only lower NCCL's own estimate at mid sizes.

Every candidate's time is affine and increasing in the bytes, so the minimum over candidates is
increasing and concave: splitting a transfer into several collectives never costs less than one
(the search's lower bound, planner/search/bound.py, relies on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

ALGORITHMS = ("tree", "ring")
PROTOCOLS = ("LL", "LL128", "Simple")
KINDS = ("all_reduce", "all_gather", "reduce_scatter")
# Point-to-point sends of up to this many bytes run LL, larger ones Simple (src/enqueue.cc:
# "NCCL_PARAM(P2pLLThreshold, "P2P_LL_THRESHOLD", 16384);").
P2P_LL_THRESHOLD = 16384

# Base latency of a collective, microseconds, by algorithm and protocol (LL, LL128, Simple).
# tuning.cc: "static const float baseLat [NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS] = {
# { 6.8, 14.0, 0 }, { 6.6, 14.0, 8.4 }, // Tree, Ring".
BASE_LATENCY_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
# Latency of one step over a link class, microseconds. tuning.cc hwLat: NVLINK "Tree
# (LL/LL128/Simple) { .6, 1.25, 28 }, Ring (LL/LL128/Simple) { .6, 1.9, 3.4 }"; NET "Tree
# (LL/LL128/Simple) { 5.0, 8.5, 28 }, Ring (LL/LL128/Simple) { 2.7, 4.0, 14.0 }".
NVLINK_STEP_US = {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)}
NET_STEP_US = {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)}
# "Inter-node rings still have to launch nsteps * net overhead": getNetOverhead returns 1 us on
# Intel (2 on AMD) and "if (p == NCCL_PROTO_SIMPLE) netOverhead *= 3"; it is a floor on every
# intra-node ring step of a multi-node ring. Intel's figure is taken.
NET_OVERHEAD_US = 1.0

# Bandwidth of each protocol as a fraction of Simple's (tuning.cc, "Various model refinements"):
# ring LL "busBw * ((nNodes > 1 || coll == ncclFuncAllReduce ...) ? 1.0/4.0 : 1.0/3.0)" capped at
# llMaxBw; ring LL128 "busBw * (ppn < 2 ? 0.7 : 0.92 /*120.0/128.0*/)"; tree "busBw*.92", tree LL
# "busBw*1.0/3.8" capped at llMaxBw, tree LL128 "busBw * (nNodes == 1 ? 7.0/9.0 : 120.0/128.0)".
RING_LL_MULTI, RING_LL_SINGLE = 1 / 4, 1 / 3
RING_LL128, RING_LL128_ONE_PER_NODE = 0.92, 0.7
TREE, TREE_LL, TREE_LL128_SINGLE, TREE_LL128_MULTI = 0.92, 1 / 3.8, 7 / 9, 120 / 128
# LL's bandwidth ceiling, GB/s (tuning.cc llMaxBws): one node of Ampere/Hopper 87.7; across nodes
# it is the CPU's (Intel rows: 39.0 on two nodes, 20.4 on more).
LL_MAX_GBPS_ONE_NODE, LL_MAX_GBPS_TWO_NODES, LL_MAX_GBPS_MORE = 87.7, 39.0, 20.4


@dataclass(frozen=True)
class Group:
    """One process group as NCCL sees it: its ranks, the nodes they span, and the bus bandwidth
    of the Simple protocol on its ring (bytes/s per rank, one direction, already derated)."""

    ranks: int
    nodes: int
    bus_bytes_per_s: float

    @property
    def per_node(self) -> float:
        return self.ranks / max(1, self.nodes)


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) candidate: fixed latency (s) and seconds per byte of the
    collective's buffer (the gathered buffer for all-gather, the input for reduce-scatter)."""

    algorithm: str
    protocol: str
    latency_s: float
    s_per_byte: float

    def time_s(self, nbytes):
        return self.latency_s + self.s_per_byte * nbytes


def _ll_cap_bytes(nodes: int) -> float:
    gbps = (LL_MAX_GBPS_ONE_NODE if nodes <= 1 else
            LL_MAX_GBPS_TWO_NODES if nodes == 2 else LL_MAX_GBPS_MORE)
    return gbps * 1e9


def _ring(kind: str, g: Group, p: int) -> Choice:
    """Ring: each of its steps moves 1/ranks of the buffer one hop; all-reduce is a
    reduce-scatter then an all-gather (2(n-1) steps), the others n-1 steps. ``nInterSteps`` of
    them cross a node boundary (tuning.cc: all-reduce 2·nNodes, the others nNodes-1)."""
    n, nodes = g.ranks, g.nodes
    all_reduce = kind == "all_reduce"
    steps = 2 * (n - 1) if all_reduce else n - 1
    inter = (2 * nodes if nodes > 1 else 0) if all_reduce else nodes - 1
    inter = min(inter, steps)
    intra_us = NVLINK_STEP_US["ring"][p]
    if nodes > 1:
        intra_us = max(intra_us, NET_OVERHEAD_US * (3 if PROTOCOLS[p] == "Simple" else 1))
    latency = BASE_LATENCY_US["ring"][p] + (steps - inter) * intra_us + \
        inter * NET_STEP_US["ring"][p]
    bw = g.bus_bytes_per_s
    if PROTOCOLS[p] == "LL":
        bw = min(_ll_cap_bytes(nodes),
                 bw * (RING_LL_MULTI if nodes > 1 or all_reduce else RING_LL_SINGLE))
    elif PROTOCOLS[p] == "LL128":
        bw *= RING_LL128_ONE_PER_NODE if g.per_node < 2 else RING_LL128
    # bus bytes: each rank sends (n-1)/n of the buffer per pass over the ring
    share = (2 if all_reduce else 1) * (n - 1) / n
    return Choice("ring", PROTOCOLS[p], latency * 1e-6, share / bw)


def _tree(g: Group, p: int) -> Choice:
    """Tree all-reduce (a reduce up and a broadcast down a double binary tree of nodes, a chain
    within each node): latency 2·((ranks per node - 1)·intra step + log2(nodes)·net step), and
    NCCL converts its bus bandwidth to an algorithm bandwidth of one half ("else ratio *= .5")."""
    per_node = max(1, g.ranks // max(1, g.nodes))
    hops = (per_node - 1) * NVLINK_STEP_US["tree"][p] + \
        int(math.log2(max(1, g.nodes))) * NET_STEP_US["tree"][p]
    latency = BASE_LATENCY_US["tree"][p] + 2 * hops
    bw = g.bus_bytes_per_s * TREE
    if PROTOCOLS[p] == "LL":
        bw = min(bw * TREE_LL, _ll_cap_bytes(g.nodes))
    elif PROTOCOLS[p] == "LL128":
        bw *= TREE_LL128_SINGLE if g.nodes <= 1 else TREE_LL128_MULTI
    return Choice("tree", PROTOCOLS[p], latency * 1e-6, 2 / bw)


@lru_cache(maxsize=4096)
def choices(kind: str, group: Group) -> tuple[Choice, ...]:
    """Every (algorithm, protocol) NCCL weighs for this collective on this group (cached: the
    search prices the same few groups thousands of times)."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; one of {', '.join(KINDS)}")
    out = tuple(_ring(kind, group, p) for p in range(len(PROTOCOLS)))
    if kind == "all_reduce":
        out += tuple(_tree(group, p) for p in range(len(PROTOCOLS)))
    return out


@lru_cache(maxsize=4096)
def _lines(kind: str, group: Group) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of :func:`choices` as two column vectors (latency, seconds per byte), so
    an array of buffers is priced against all of them in one broadcast (cached like them)."""
    cands = choices(kind, group)
    return (np.array([[c.latency_s] for c in cands]), np.array([[c.s_per_byte] for c in cands]))


def best(kind: str, nbytes: float, group: Group) -> Choice:
    """The candidate NCCL's tuner picks for a buffer of ``nbytes``: the fastest."""
    return min(choices(kind, group), key=lambda c: c.time_s(nbytes))


def collective_s(kind: str, nbytes, group: Group):
    """Seconds of one collective over ``group`` on a buffer of ``nbytes`` (a number or an
    array: every element priced alone); 0 for one rank or an empty buffer."""
    sizes = np.asarray(nbytes, dtype=float)
    if group.ranks <= 1:
        out = np.zeros_like(sizes)
        return float(out) if out.ndim == 0 else out
    # the search prices the same per-rank buffers on the same group for every configuration
    # that shares its split (schedules, microbatch counts, recompute): remember each answer
    key = (kind, group, sizes.shape, sizes.tobytes())
    out = _PRICED.get(key)
    if out is None:
        if len(_PRICED) >= 65536:
            _PRICED.clear()
        # every candidate's latency + s_per_byte * size (Choice.time_s), fastest per element
        latency, per_byte = _lines(kind, group)
        flat = sizes.reshape(1, -1)
        out = _PRICED[key] = np.where(flat > 0, (latency + per_byte * flat).min(axis=0),
                                      0.0).reshape(sizes.shape)
    return float(out) if out.ndim == 0 else out.copy()


_PRICED: dict = {}  # (kind, group, shape, buffer bytes) -> seconds (collective_s)


def p2p_s(nbytes: float, bus_bytes_per_s: float, crosses_nodes: bool) -> float:
    """Seconds of one send/recv of ``nbytes`` over a link of ``bus_bytes_per_s`` (the GPU's
    NVLink, or its share of the node's NICs when the two ranks are on different nodes).

    NCCL's tuner prices collectives only; a send is one hop of a ring, so it is priced here as
    a ring collective of one step: the base latency of the protocol NCCL runs for that size (LL
    up to P2P_LL_THRESHOLD, Simple above), one step's latency on the link class it crosses
    (hwLat NVLINK or NET), and the bytes at that protocol's share of the link (LL carries 8-byte
    lines with a 4-byte flag: a third, tuning.cc's ring LL fraction for one node)."""
    if nbytes <= 0:
        return 0.0
    p = 0 if nbytes <= P2P_LL_THRESHOLD else PROTOCOLS.index("Simple")
    step = (NET_STEP_US if crosses_nodes else NVLINK_STEP_US)["ring"][p]
    bw = bus_bytes_per_s * (RING_LL_SINGLE if p == 0 else 1.0)
    return (BASE_LATENCY_US["ring"][p] + step) * 1e-6 + nbytes / bw


def bus_bandwidth(kind: str, nbytes: float, group: Group) -> float:
    """nccl-tests' "busbw" the model predicts, bytes/s: the buffer over the time, times
    2(n-1)/n for all-reduce and (n-1)/n for all-gather and reduce-scatter (nccl-tests
    doc/PERFORMANCE.md), so it compares directly with a published bus-bandwidth curve."""
    n = group.ranks
    factor = (2 if kind == "all_reduce" else 1) * (n - 1) / n
    return nbytes * factor / collective_s(kind, nbytes, group)
