"""The data-parallel group's communication in a step, ZeRO 0 to 3: what of it each pipeline rank
cannot hide behind its compute.

ZeRO-0 all-reduces the gradients; ZeRO-1 and 2 reduce-scatter them (ZeRO-2 after every
microbatch where the stack keeps only the shard) and all-gather the 16-bit weights once per step;
ZeRO-3 / FSDP gathers and reduce-scatters unit by unit inside every forward and backward
(cost/zero.py prices the units' overlap). Dense parameters sync over the DP x CP ranks, routed
experts over the expert-DP group; every collective is priced as NCCL runs it on the group's ring
(cost/nccl.py), and hidden communication still costs the SMs it holds
(comm.overlap_interference).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.core.parallel import Parallel
from planner.cost import comm, nccl, precision, zero
from planner.cost.memory import ACT_BYTES
from planner.hardware.profiles import Cluster
from planner.layout.ranks import dp_group_crosses_nodes
from planner.model.spec import ModelSpec
from planner.predict.chunks import ChunkArrays
from planner.predict.memory import chunk_gather_bytes
from planner.stack import Stack


def dp_exposed_s(par: Parallel, cluster: Cluster, opts: Stack,
                  stages: ChunkArrays, model: ModelSpec | None = None) -> np.ndarray:
    """Gradient synchronisation each rank cannot hide. ZeRO-0: all-reduce of the gradients;
    ZeRO-1/distributed optimizer: reduce-scatter gradients (all-reduce where the stack's
    optimizer does: ``zero1_grad_reduce``) + all-gather 16-bit weights once per step; ZeRO-2 reduce-scatters after every microbatch where the stack keeps only the shard
    (DeepSpeed), once per step where it reduces once (``zero2_reduce_scatter``); gradients move
    in the dtype the stack reduces them in (an fp32 accumulation buffer where it keeps one);
    ZeRO-3 gathers and reduce-scatters unit by unit inside every forward and backward
    (cost/zero.py). Every collective is priced by NCCL's own algorithm and protocol choice for
    its size on the DP group's ring (cost/nccl.py), whose node-crossing rate is the group's share
    of the node's NICs (comm.group_link).
    With overlap the reduce hides behind the last microbatch's backward and the gather behind the
    first forward (Megatron-Core --overlap-grad-reduce / --overlap-param-gather; the stack says
    which of the two it overlaps). Hidden is not
    free: while a collective runs beside compute it holds SMs the compute cannot use, so the step
    pays that share of the hidden time (comm.overlap_interference) on top of the exposed part."""
    # Dense parameters sync over the DP x CP ranks (Megatron reduces gradients over both);
    # routed-expert parameters over the expert-DP group (tp·cp·dp / (etp·ep) ranks: Megatron-
    # Core's expert rank generator), none when ep·etp covers a stage's ranks. Each group's
    # collectives are priced on their own (each assumed to have the compute windows to itself).
    p = par.pp
    experts = stages.by_rank(stages.expert_params, p)
    out = _group_sync_s(par, opts, stages, stages.by_rank(stages.params, p) - experts,
                        dp_group(par, cluster), cluster, model)
    if par.expert_dp > 1 and experts.any():
        out = out + _group_sync_s(par, opts, stages, experts,
                                  dp_group(par, cluster, experts=True), cluster, model)
    return out


def _group_sync_s(par: Parallel, opts: Stack, stages: ChunkArrays, params: np.ndarray,
                  group: nccl.Group, cluster: Cluster, model: ModelSpec | None = None
                  ) -> np.ndarray:
    """Per rank, what syncing ``params`` (per rank) over ``group`` adds to the step."""
    p = par.pp
    if group.ranks == 1 or not params.any():
        return np.zeros(p)
    grads = params * opts.reduced_grad_bytes(par.zero)
    m = par.num_microbatches
    interference = comm.overlap_interference(cluster.hardware)
    if par.zero >= 3:
        return _zero3_exposed_s(par, opts, stages, group, params, grads, interference, model)
    if par.zero == 0:
        reduce_s = nccl.collective_s("all_reduce", grads, group)
        gather_s = np.zeros(p)
    else:  # ZeRO-1 all-reduces where the stack's optimizer does (zero1_grad_reduce)
        whole = par.zero == 1 and opts.zero1_grad_reduce == "all_reduce"
        reduce_s = nccl.collective_s("all_reduce" if whole else "reduce_scatter", grads, group)
        # 16-bit weights, the block weights in FP8 where they are FP8 primary weights
        gather_s = nccl.collective_s("all_gather", params * precision.gathered_bytes_per_param(
            stages.by_rank(stages.params, p), stages.by_rank(stages.cached_bytes, p),
            par.zero, opts), group)
    per_microbatch = par.zero == 2 and opts.zero2_shards_grads()
    if per_microbatch:  # only a gradient shard is kept: reduce-scatter after every microbatch
        reduce_s = reduce_s * m
    # The reduce hides behind the backwards (the last one, or each microbatch's own), the
    # weights' gather behind the first forward; what the stack does not overlap is exposed.
    reduce_hidden = opts.overlap_grad_reduce
    gather_hidden = opts.overlap_param_gather
    exposed = (0.0 if reduce_hidden else reduce_s) + (0.0 if gather_hidden else gather_s)
    if not (reduce_hidden or gather_hidden):
        return exposed
    windows = m if per_microbatch else 1
    bwd, fwd = stages.by_rank(stages.bwd_s, p), stages.by_rank(stages.fwd_s, p)
    bwd_comm = reduce_s if reduce_hidden else np.zeros(p)
    fwd_comm = gather_s if gather_hidden else np.zeros(p)
    return exposed + overlapped_cost_s(bwd_comm, windows * bwd, interference) + \
        overlapped_cost_s(fwd_comm, fwd, interference)


def dp_group(par: Parallel, cluster: Cluster, experts: bool = False) -> nccl.Group:
    """The group gradients are reduced over, as NCCL sees it: DP x CP ranks (Megatron reduces
    over both). In tp-cp-dp-pp rank order it has domain / tp members in each NVLink domain it
    spans, and the tp groups of its stage in a node run the same collectives at once, sharing
    the node's NICs (comm.group_link). With ``experts``: the expert-DP group, etp·ep ranks
    apart (layout/ranks.py's expert generator)."""
    n, inner = par.dp * par.cp, par.tp
    if experts:
        n, inner = par.expert_dp, par.expert_tp * par.ep
    return _group_of(n, inner, par.pp, cluster)


@lru_cache(maxsize=4096)
def _group_of(n: int, inner: int, pp: int, cluster: Cluster) -> nccl.Group:
    """:func:`dp_group` for a group of ``n`` ranks ``inner`` apart on ``pp`` stages: a pure
    function of these, cached (the search asks for the same few groups thousands of times)."""
    domain = cluster.nvlink_domain
    per_domain = max(1, min(n, domain // inner))
    spans = cluster.gpus > domain and dp_group_crosses_nodes(inner, n, pp, domain)
    per_node = max(1, min(n, cluster.gpus_per_node // inner))
    link = comm.group_link(cluster.hardware, per_node, spans)
    domains = -(-n // per_domain) if spans else 1
    return nccl.Group(ranks=n, nodes=domains, bus_bytes_per_s=link.bytes_per_s)


def _zero3_exposed_s(par: Parallel, opts: Stack, stages: ChunkArrays, group: nccl.Group,
                     params: np.ndarray, grads: np.ndarray, interference: float,
                     model: ModelSpec | None = None) -> np.ndarray:
    """ZeRO-3 / FSDP, unit by unit (cost/zero.py): a unit is one layer (FSDP per-block
    wrapping) or a whole chunk (``zero3_gather``), each gathered for every microbatch's forward
    and, FULL_SHARD resharding after the forward, again for its backward, and its gradients
    reduce-scattered after every microbatch's backward. A chunk of no layers (the search's
    ideal chunk) has no known layering: priced as one transfer, all of it hideable."""
    p, m = par.pp, par.num_microbatches
    layers = (stages.last - stages.first).astype(float)
    per_chunk = layers if opts.zero3_gather == "layer" else np.minimum(layers, 1.0)
    units = stages.by_rank(per_chunk, p)
    priced = np.maximum(units, 1.0)
    gather = nccl.collective_s("all_gather", params * _gather_bytes_per_param(
        model, par, opts, stages) / priced, group)
    reduce = nccl.collective_s("reduce_scatter", grads / priced, group)
    times = zero.UnitTimes(
        units=units, fwd_s=stages.by_rank(stages.fwd_s, p) / priced,
        bwd_s=stages.by_rank(stages.bwd_s, p) / priced,
        gather_s=np.atleast_1d(gather), bwd_gather_s=np.atleast_1d(gather),
        reduce_s=np.atleast_1d(reduce))
    if zero.holds_for_step(par, opts):  # gathered once, reduce-scattered once (cost/zero.py)
        chain, after = 0.0, None
        if opts.zero3_reduce_chain:  # inside the drain: only the first chunk's end the step
            chain = zero.reduce_chain_s(per_chunk, times.reduce_s[np.arange(par.num_chunks) % p])
            after = np.zeros(p)
            after[0] = per_chunk[0]
        exposed, total = zero.step_exposed_s(times, opts.zero3_prefetch,
                                             opts.overlap_param_gather, after)
        total = np.where(units > 0, total, priced * (times.gather_s + times.reduce_s))
        return chain + exposed + interference * (total - exposed)
    exposed, total = zero.exposed_per_microbatch_s(
        times, opts.zero3_prefetch, opts.overlap_param_gather, opts.overlap_grad_reduce)
    total = np.where(units > 0, total, priced * (times.gather_s * 2 + times.reduce_s))
    return m * (exposed + interference * (total - exposed))


def _gather_bytes_per_param(model: ModelSpec | None, par: Parallel, opts: Stack,
                            stages: ChunkArrays) -> np.ndarray:
    """Per rank: the mean bytes a parameter is all-gathered in, 2 (16-bit) unless FP8 linear
    weights are gathered in FP8 (cost/zero.py): from the rank's layers, or at the least
    (1 byte) where the layering or ``model`` is unknown (the search's bound)."""
    if not zero.fp8_gathered(par, opts):
        return np.full(par.pp, float(ACT_BYTES))
    params = stages.by_rank(stages.params, par.pp)
    gathered = stages.by_rank(chunk_gather_bytes(model, par, opts, stages), par.pp)
    return np.where(params > 0, gathered / np.maximum(params, 1.0), float(ACT_BYTES))


def overlapped_cost_s(comm_s: np.ndarray, window_s: np.ndarray,
                       interference: float) -> np.ndarray:
    """What overlapping ``comm_s`` with a compute window of ``window_s`` adds to the step: the part
    that does not fit is exposed, and while the part that fits runs the compute is slowed by
    ``interference`` (the share of SMs the collective holds). The window's own growth under that
    slowdown (which would hide a little more) is second order and left out."""
    exposed = np.maximum(0.0, comm_s - window_s)
    return exposed + interference * (comm_s - exposed)
