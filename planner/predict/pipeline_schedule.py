"""The pipeline schedule's share of a step: the fill, steady state and drain, before the
data-parallel sync and the optimizer step (predict/step.py adds those).

A chunk's output crosses to the next stage on NVLink or the network (stage_transfer_s); each chunk
holds the activations of the microbatches in flight at its peak (inflight_closed_form); and the
schedule's time over the per-chunk forward and backward comes from closed forms, from torch 2.6's
lockstep time steps where the stack's engine runs them, or from the op-by-op simulation
(pipeline/simulate.py), which also counts the activations each rank holds exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.core.parallel import Parallel
from planner.core.schedules import HOLDS_ALL, HOLDS_BOTH_DIRECTIONS, HOLDS_LIMIT, schedule_traits
from planner.cost import comm, constants, nccl, tensor_parallel
from planner.cost.memory import ACT_BYTES
from planner.hardware.profiles import Cluster
from planner.layout.ranks import stage_hop_crosses_nodes
from planner.model.spec import ModelSpec
from planner.pipeline import dualpipe, timestep
from planner.pipeline.blocking import blocking_charges
from planner.pipeline.chunk_times import charge_actions
from planner.pipeline.simulate import simulate, simulated_ops
from planner.predict.chunks import ChunkArrays
from planner.stack import Stack


def stage_transfer_s(model: ModelSpec, par: Parallel, cluster: Cluster,
                     opts: Stack) -> list[float]:
    """One microbatch's activations across each chunk boundary (chunk k to k + 1), on NVLink or
    the network depending on where the two stages' ranks live (tp-cp-dp-pp order: a stage is
    tp·cp·dp consecutive ranks; NVLink reaches across its domain). With Megatron's
    scatter/gather each GPU sends 1/tp of the tensor and the receiver re-gathers it over NVLink
    (Narayanan et al. 2021 §4.1); with sequence parallelism the tensor is already sharded; a CP
    rank sends its own seq/cp tokens. A send is priced as NCCL runs it (nccl.p2p_s: latency and
    bandwidth of the link it crosses, the GPU's share of its node's NICs across nodes, all GPUs
    of a node sending at once) and the re-gather as an all-gather on the TP group's ring."""
    chunks = par.num_chunks
    if chunks == 1:
        return []
    hops = _rank_hops_s(model.seq_length, model.hidden_size, cluster, opts.p2p_scatter_gather,
                        par.tp, par.cp, par.dp, par.pp, par.micro_batch, par.sequence_parallel)
    # a hop depends only on the rank it leaves (chunk k on rank k mod pp sends to the next rank)
    return [hops[k % par.pp] for k in range(chunks - 1)]


@lru_cache(maxsize=4096)
def _rank_hops_s(seq_length: int, hidden_size: int, cluster: Cluster, scatter_gather: bool,
                 tp: int, cp: int, dp: int, pp: int, micro_batch: int,
                 sequence_parallel: bool) -> tuple[float, ...]:
    """:func:`stage_transfer_s`'s hop from each pipeline rank to the next: a pure function of
    these, cached (the ZeRO, recompute and schedule variants of a shape share it)."""
    hw = cluster.hardware
    intra, inter = comm.links(hw)
    domain = cluster.nvlink_domain
    full = ACT_BYTES * micro_batch * seq_length // cp * hidden_size
    sharded = sequence_parallel or scatter_gather
    nbytes = full / tp if sharded else full
    regather = (tensor_parallel.all_gather_s(full, tp, hw)
                if scatter_gather and not sequence_parallel else 0.0)
    hops = []
    for a in range(pp):
        b = (a + 1) % pp
        crosses = cluster.gpus > domain and stage_hop_crosses_nodes(a, b, tp * cp, dp, domain)
        hops.append(nccl.p2p_s(nbytes, (inter if crosses else intra).bytes_per_s, crosses)
                    + regather)
    return tuple(hops)


def inflight_closed_form(schedule: str, p: int, m: int, v: int) -> list[int]:
    """Microbatches whose activations each chunk holds at peak (DESIGN.md §3; the simulator
    gives exact counts): GPipe M; 1F1B min(p - i, M) on rank i; ZB-H1 min(p, M) on every rank,
    since a deferred W keeps what it needs until it runs (Qi et al. 2023: the peak, on rank 0,
    equals 1F1B's); interleaved: rank i holds its warm-up of (p - i - 1)·2 + (v - 1)·p forwards
    + 1, spread over its v chunks (Narayanan et al. 2021 §2.2, Megatron's interleaved schedule).
    tests/test_evaluate.py checks every rank against the simulator."""
    return list(inflight_counts(schedule, p, m, v))


@lru_cache(maxsize=4096)
def inflight_counts(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """:func:`inflight_closed_form` as a tuple, cached: a pure function of four integers that
    the screen asks for every configuration (the ZeRO and recompute variants of a shape share
    it)."""
    traits = schedule_traits(schedule)
    if traits.holds == HOLDS_ALL:
        return (m,) * (p * v)
    if traits.holds == HOLDS_BOTH_DIRECTIONS:  # per stage, on each of its two ranks (dualpipe.py)
        return tuple(dualpipe.held_at_peak(p, m))
    if traits.holds == HOLDS_LIMIT:  # ZB-H1: p; ZB-2p fills up to 2p (pipeline/schedule.py)
        return (min(traits.inflight_limit * p, m),) * p
    if traits.takes_virtual_stages and v > 1:
        out = []
        for k in range(p * v):
            rank = k % p
            held = min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v)
            out.append(-(-held // v))
        return tuple(out)
    return tuple(min(p - (k % p), m) for k in range(p * v))


@dataclass(frozen=True, eq=False)
class PipelineTime:
    """The schedule's run over one split: what the step spends in the pipeline."""

    pipeline_s: float  # the fill, steady state and drain (no DP sync, no optimizer step)
    bubble: float  # the idle share of the ranks over pipeline_s
    transfer_s: np.ndarray  # per chunk: its output to the next chunk (0 for the last)
    # per pipeline rank, the most activation bytes held at once, where the schedule was
    # simulated; None where the closed forms priced it (the in-flight counts hold then)
    held_activation_bytes: np.ndarray | None = None


def pipeline_time(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                  stages: ChunkArrays, simulated: bool = False,
                  sim_cache: dict | None = None) -> PipelineTime:
    """The pipeline's time and bubble over ``stages`` (mirrored for a mirrored schedule: each
    rank's sums count both its stages). With ``simulated`` the schedule runs op by op
    (pipeline/simulate.py): time, bubble and the activations each rank holds come from the
    simulation instead of the closed forms."""
    hw, p = cluster.hardware, par.pp
    p2p = np.array(stage_transfer_s(model, par, cluster, opts) + [0.0])
    fwd_s, bwd_s, dependency = stages.fwd_s, stages.bwd_s, p2p
    # transfers inside both ranks' ops (pipeline/blocking.py); DualPipe's paired F&B is its own
    if (opts.p2p_blocking and par.num_chunks > 1
            and not par.schedule_traits.pairs_forward_backward):
        add_fwd, add_bwd = blocking_charges(p2p[:-1], par.num_chunks)
        fwd_s, bwd_s, dependency = fwd_s + add_fwd, bwd_s + add_bwd, np.zeros_like(p2p)
    # the pipeline engine's own costs; with one stage no pipeline engine runs (a plain loop)
    engine = ((opts.pipeline_action_overhead_s, opts.split_backward_overhead) if p > 1
              else (0.0, 0.0))
    charged = charge_actions(par.schedule_traits.weight_grad_ops,
                             par.num_chunks, fwd_s, bwd_s, stages.bwd_weight_s,
                             *engine)  # the engine's costs
    rank_time = stages.by_rank(np.add(charged[0], charged[1]) + 2 * dependency, p)
    held = None
    pairs = _pair_overlap(par, hw, stages)
    if simulated:
        args = (par.schedule, p, par.num_microbatches, par.virtual_stages,
                tuple(fwd_s.tolist()), tuple(bwd_s.tolist()),
                tuple(stages.bwd_weight_s.tolist()), tuple(dependency[:-1].tolist()),
                tuple(stages.act_bytes.tolist()), engine, pairs)
        sim = (sim_cache or {}).get(args)
        if sim is None:
            name, pp, m, v, fwd, bwd, wgrad, comm_s, act, (action_s, split), (o_f, o_b, i) = args
            sim = simulate(name, pp, m, v, fwd_s=fwd, bwd_s=bwd, wgrad_s=wgrad, comm_s=comm_s,
                           act_bytes=act, timeline=False, action_s=action_s,
                           split_backward=split, overlap_fwd_s=o_f, overlap_bwd_s=o_b,
                           interference=i)
            if sim_cache is not None:  # configurations differing only in ZeRO share a schedule
                sim_cache[args] = sim
        pipeline_s, bubble = sim.makespan_s, sim.bubble_fraction
        if opts.optimizer_post_validation:  # steps overlap: a step costs the longest rank span
            pipeline_s = sim.span_s
        held = np.array(sim.peak_activation_bytes)
    else:
        pipeline_s = _pipeline_closed_form(par, rank_time, stages)
        busy = rank_time.sum() * par.num_microbatches
        bubble = max(0.0, 1 - busy / (p * pipeline_s))
    if _runs_timesteps(par, opts):
        pipeline_s, bubble = _timestep_pipeline(par, stages, p2p, engine[0])
    return PipelineTime(pipeline_s=pipeline_s, bubble=bubble, transfer_s=p2p,
                        held_activation_bytes=held)


def _runs_timesteps(par: Parallel, opts: Stack) -> bool:
    """Whether the stack's engine runs the schedule in torch 2.6's lockstep time steps."""
    return opts.pipeline_timesteps and par.schedule_traits.takes_virtual_stages and par.pp > 1


def pipeline_work(par: Parallel, opts: Stack, simulated: bool = True) -> int:
    """The ops :func:`pipeline_time` walks for a configuration whose shape nothing has simulated
    yet, counted before any is built: the simulation's (simulate.simulated_ops, with
    ``simulated``) and, where the stack runs torch 2.6's time steps, the most the walk of their
    table takes (timestep.interleaved_slots: independent of M, its steady periods skipped).
    What a work budget counts (planner/fidelity/work.py)."""
    m, v = par.num_microbatches, par.virtual_stages
    ops = simulated_ops(par.schedule, par.pp, m, v) if simulated else 0
    if _runs_timesteps(par, opts):
        ops += timestep.interleaved_slots(par.pp, m, v)
    return ops


def _timestep_pipeline(par: Parallel, stages: ChunkArrays, p2p: np.ndarray,
                       action_s: float) -> tuple[float, float]:
    """(seconds, idle share) of the pipeline on an engine that runs the interleaved schedule in
    lockstep time steps (Stack.pipeline_timesteps: torch.distributed.pipelining up to torch 2.6;
    planner/pipeline/timestep.py). Its transfers are inside the steps, each waited on before the
    next, so they are priced there (``p2p``: per chunk, its output's transfer) and not as a
    blocking charge; the compute order, and so the activations each rank holds, is the one the
    op-by-op simulation runs. Its work is bounded independent of M (the walk skips the table's
    steady periods: timestep.interleaved_slots), so `plan solve` may price it at any batch."""
    m = par.num_microbatches
    fwd, bwd = stages.fwd_s.tolist(), stages.bwd_s.tolist()
    makespan = timestep.interleaved_makespan_s(par.pp, m, par.virtual_stages, fwd, bwd,
                                               p2p[:-1].tolist(), action_s)
    busy = m * (sum(fwd) + sum(bwd) + 2 * action_s * par.num_chunks)
    return makespan, max(0.0, 1 - busy / (par.pp * makespan))


def _pair_overlap(par: Parallel, hw, stages: ChunkArrays) -> tuple:
    """DualPipe's F&B pairs (pipeline/dualpipe.py): per chunk, the all-to-all of its forward
    and of its full backward (a full-recompute chunk's backward repeats the forward's: layer
    cost's a2a_s is 2 or 3 times a forward's), and the share of compute hiding it costs; zeros
    for other schedules, which overlap nothing."""
    if not par.schedule_traits.pairs_forward_backward:
        return (0.0, 0.0, 0.0)
    per_fwd = np.array([3.0 if mode == "full" else 2.0 for mode in stages.recompute])
    fwd = stages.a2a_s / per_fwd
    return (tuple(fwd.tolist()), tuple((stages.a2a_s - fwd).tolist()),
            dualpipe.interference(hw.sm_count, constants.OVERLAP_INTERFERENCE))


def _pipeline_closed_form(par: Parallel, rank_time: np.ndarray,
                          stages: ChunkArrays | None = None) -> float:
    """1F1B/GPipe with unequal stages: the slowest rank paces the M-1 steady steps, every rank
    is on the critical path once (fill and drain). Interleaving divides the fill and drain by v;
    ZB-H1 hides about two thirds of it (Qi et al. 2023). DualPipe: each rank runs a microbatch
    of each direction per M/2 steps (rank_time counts both of its stages), plus the report's
    bubble (PP/2-1)(F&B + B - 3W) taken at F&B = F + B (no overlap: an upper bound)."""
    m, v = par.num_microbatches, par.virtual_stages
    if par.schedule_traits.mirrored and stages is not None:
        bubble = float((stages.fwd_s + 2 * stages.bwd_s - 3 * stages.bwd_weight_s).max())
        return m / 2 * float(rank_time.max()) + (par.pp / 2 - 1) * bubble
    slowest = float(rank_time.max())
    fill = float(rank_time.sum())
    # interleaving: / v; a split backward (zb-2p: no closed form of its own, zb-h1's): / 3
    divisor = par.schedule_traits.fill_divisor(v)
    if divisor > 1:
        fill = slowest + (fill - slowest) / divisor
    return (m - 1) * slowest + fill
