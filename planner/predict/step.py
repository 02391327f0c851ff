"""Predict one configuration: per-stage time and memory, step time, throughput, MFU.

A training step on pipeline rank i is the schedule over its microbatches plus what the schedule
cannot hide: the data-parallel gradient synchronisation (partly overlapped with the last backward
when the run overlaps it), a tied embedding's gradient all-reduce between the first and last
stage, and the optimizer step.

Everything per stage is a numpy array over the chunks of one split, so a prediction costs a few
array operations whatever the pipeline depth: the search screens thousands of configurations
with the same code that evaluates one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.cost import constants
from planner.cost import comm, moe, nccl, precision, tensor_parallel, tied_embedding, zero
from planner.cost.layer import LayerCost, layer_cost
from planner.cost.precision import step_cast_bytes
from planner.hardware.profiles import Cluster
from planner.layout.ranks import blocks_cross, dp_group_crosses_nodes, stage_hop_crosses_nodes
from planner.cost.memory import ACT_BYTES, Shape, sp_gathered_bytes
from planner.model.spec import ModelSpec
from planner.core.parallel import Parallel
from planner.core.schedules import HOLDS_ALL, HOLDS_BOTH_DIRECTIONS, HOLDS_LIMIT, schedule_traits
from planner.predict.plan import Metrics, Plan, Stage
from planner.pipeline import dualpipe, timestep
from planner.pipeline.blocking import blocking_charges
from planner.pipeline.chunk_times import charge_actions
from planner.pipeline.simulate import simulate
from planner.stack import Stack, default_stack
from planner.predict.memory import (chunk_gather_bytes, memory_parts, side_stream_bytes,
                                    state_bytes)
from planner.predict.chunks import ChunkArrays, CostTable, mirrored, split_stages

# Adam step per parameter shard: read fp32 master, m, v and the fp32 gradient (16 B), write master,
# m, v (12 B) and the 16-bit weight (2 B): 30 bytes, memory-bound (Megatron's fused Adam).
OPTIMIZER_BYTES_PER_PARAM = 30


def model_layer_costs(model: ModelSpec, par: Parallel, hw, opts: Stack, recompute: str,
                profile=None) -> list[LayerCost]:
    """The cost of every layer of the model under one parallel shape and recompute mode."""
    shape = Shape(tp=par.tp, sp=par.sequence_parallel, micro_batch=par.micro_batch,
                  seq_len=model.seq_length // par.cp, cp=par.cp, cp_cross=cp_crosses(par, hw),
                  recompute_modules=opts.recompute_modules, loss_bytes=opts.loss_bytes,
                  fp8_gathered=zero.fp8_gathered(par, opts),
                  accumulation_bytes=opts.accumulation_bytes(par.zero),
                  sp_gathered_bytes=sp_gathered_bytes(opts),
                  **moe.shape_fields(par, hw, opts))
    cache: dict = {}
    out = []
    for i, layer in enumerate(model.layers):
        measured = profile.layers[i] if profile is not None else None
        key = (layer, id(measured))
        if key not in cache:
            cache[key] = layer_cost(layer, shape, recompute, hw, opts, measured)
        out.append(cache[key])
    return out


def nvlink_domain(hw) -> int:
    """GPUs on one NVLink fabric for this hardware (Cluster.nvlink_domain, from the profile the
    cluster's node size was set on)."""
    domain = hw.nvlink_domain or hw.gpus_per_node
    return domain if domain % hw.gpus_per_node == 0 else hw.gpus_per_node


def cp_crosses(par: Parallel, hw) -> bool:
    """Whether a CP group leaves its NVLink domain (tp-cp order: each is tp·cp consecutive
    ranks), so its K/V exchange runs on the network."""
    return par.cp > 1 and blocks_cross(par.tp * par.cp, par.dp * par.pp, nvlink_domain(hw))


def even_block_bounds(model: ModelSpec, num_chunks: int) -> list[tuple[int, int]]:
    """Megatron's default split: the blocks evenly (counts differing by at most one, larger ones
    first), the embedding joining the first chunk and the head the last. A model without that
    shape is split evenly over all its layers."""
    layers = model.layers
    standard = (len(layers) >= 3 and layers[0].kind == "embedding" and layers[-1].kind == "head"
                and all(layer.kind == "block" for layer in layers[1:-1])
                and len(layers) - 2 >= num_chunks)
    n, offset = (len(layers) - 2, 1) if standard else (len(layers), 0)
    base, extra = divmod(n, num_chunks)
    bounds, start = [], offset
    for k in range(num_chunks):
        size = base + (1 if k < extra else 0)
        bounds.append((start, start + size))
        start += size
    if standard:
        bounds[0] = (0, bounds[0][1])
        bounds[-1] = (bounds[-1][0], len(layers))
    return bounds


def inflight_closed_form(schedule: str, p: int, m: int, v: int) -> list[int]:
    """Microbatches whose activations each chunk holds at peak (DESIGN.md §3; the simulator
    gives exact counts): GPipe M; 1F1B min(p - i, M) on rank i; ZB-H1 min(p, M) on every rank,
    since a deferred W keeps what it needs until it runs (Qi et al. 2023: the peak, on rank 0,
    equals 1F1B's); interleaved: rank i holds its warm-up of (p - i - 1)·2 + (v - 1)·p forwards
    + 1, spread over its v chunks (Narayanan et al. 2021 §2.2, Megatron's interleaved schedule).
    tests/test_evaluate.py checks every rank against the simulator."""
    return list(_inflight_closed_form(schedule, p, m, v))


@lru_cache(maxsize=4096)
def _inflight_closed_form(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
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


@dataclass(frozen=True)
class Prediction:
    """What a configuration costs, before it is dressed as a Plan."""

    step_s: float
    bubble: float
    rank_memory_bytes: np.ndarray
    chunk_memory_bytes: np.ndarray
    model_flops: float  # the whole step, all GPUs
    hardware_flops: float
    transfer_s: np.ndarray  # per chunk: its output to the next chunk (0 for the last)
    # of step_s: the pipeline's fill, steady state and drain (no DP sync, no optimizer step)
    pipeline_s: float = 0.0
    # per pipeline rank, by part (MEMORY_PARTS); the parts sum to rank_memory_bytes
    memory_parts: dict | None = None
    # per pipeline rank: reserved on ZeRO-3's side streams beyond rank_memory_bytes, released
    # when an allocation fails (predict/memory.py side_stream_bytes)
    side_stream_bytes: np.ndarray | None = None

    @property
    def peak_memory_bytes(self) -> float:
        """The largest rank's peak: what must fit."""
        return float(self.rank_memory_bytes.max())

    @property
    def peak_reserved_bytes(self) -> float:
        """The largest rank's peak as the allocator reserves it (and nvidia-smi shows it): with
        what the side streams keep."""
        side = 0.0 if self.side_stream_bytes is None else self.side_stream_bytes
        return float((self.rank_memory_bytes + side).max())


def predict(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
            stages: ChunkArrays, simulated: bool = False, sim_cache: dict | None = None) -> Prediction:
    """Step time, bubble and memory of a configuration with the given split. With ``simulated``
    the schedule runs op by op (planner/simulate.py): step time, bubble and the activations each
    rank holds come from the simulation instead of the closed forms."""
    hw, p = cluster.hardware, par.pp
    if par.schedule_traits.mirrored:  # rank r also holds stage p - 1 - r: every per-rank sum
        stages = mirrored(stages)  # counts both (pipeline/dualpipe.py)
    p2p = np.array(stage_transfer_s(model, par, cluster, opts) + [0.0])
    fwd_s, bwd_s, dependency = stages.fwd_s, stages.bwd_s, p2p
    # transfers inside both ranks' ops (pipeline/blocking.py); DualPipe's paired F&B is its own
    if (opts.p2p_blocking and par.num_chunks > 1
            and not par.schedule_traits.pairs_forward_backward):
        add_fwd, add_bwd = blocking_charges(p2p[:-1], par.num_chunks)
        fwd_s, bwd_s, dependency = fwd_s + add_fwd, bwd_s + add_bwd, np.zeros_like(p2p)
    inflight = np.array(_inflight_closed_form(par.schedule, p, par.num_microbatches,
                                             par.virtual_stages), dtype=float)
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
    if opts.pipeline_timesteps and par.schedule_traits.takes_virtual_stages and p > 1:
        pipeline_s, bubble = _timestep_pipeline(par, stages, p2p, engine[0])

    states = state_bytes(stages.params, par, opts, stages.expert_params) + \
        precision.held_fp8_bytes(stages.cached_bytes, par.zero, opts)
    chunk_mem = states + inflight * stages.act_bytes
    parts = memory_parts(model, par, stages, inflight, opts, held)
    rank_mem = sum(parts.values())
    # a tied embedding's gradient all-reduce follows the drain on the first and last rank
    # (cost/tied_embedding.py)
    tied = np.zeros(p)
    tied[[0, -1]] = tied_embedding.sync_s(model, par, cluster, opts)
    dp_exposed = float((dp_exposed_s(par, cluster, opts, stages, model) + tied).max())
    # Each rank steps its shard: dense parameters over the DP x CP ranks, experts over expert DP
    # (state_parts).
    owned = (stages.by_rank(stages.params - stages.expert_params, p)
             / (par.dp * par.cp if par.zero >= 1 else 1)
             + stages.by_rank(stages.expert_params, p)
             / (par.expert_dp if par.zero >= 1 else 1)).max()
    # with cached FP8 weights, the step also recasts them once (cost/precision.py)
    step_bytes = owned * OPTIMIZER_BYTES_PER_PARAM + step_cast_bytes(
        float(stages.by_rank(stages.cached_bytes, p).max()), opts)
    optimizer_s = step_bytes / (
        hw.memory_bandwidth_gbps * 1e9 * (hw.memory_efficiency or constants.MEMORY_EFFICIENCY))
    replicas = par.tp * par.cp * par.dp * par.num_microbatches  # per-GPU FLOPs -> whole step
    return Prediction(step_s=float(pipeline_s + dp_exposed + optimizer_s), bubble=float(bubble),
                      rank_memory_bytes=rank_mem, chunk_memory_bytes=chunk_mem,
                      model_flops=float(stages.model_flops.sum()) * replicas,
                      hardware_flops=float(stages.hardware_flops.sum()) * replicas,
                      transfer_s=p2p, memory_parts=parts, pipeline_s=float(pipeline_s),
                      side_stream_bytes=side_stream_bytes(model, par, opts, stages))


def _timestep_pipeline(par: Parallel, stages: ChunkArrays, p2p: np.ndarray,
                       action_s: float) -> tuple[float, float]:
    """(seconds, idle share) of the pipeline on an engine that runs the interleaved schedule in
    lockstep time steps (Stack.pipeline_timesteps: torch.distributed.pipelining up to torch 2.6;
    planner/pipeline/timestep.py). Its transfers are inside the steps, each waited on before the
    next, so they are priced there (``p2p``: per chunk, its output's transfer) and not as a
    blocking charge; the compute order, and so the activations each rank holds, is the one the
    op-by-op simulation runs."""
    m = par.num_microbatches
    fwd, bwd = stages.fwd_s.tolist(), stages.bwd_s.tolist()
    makespan = timestep.interleaved_makespan_s(par.pp, m, par.virtual_stages, fwd, bwd,
                                               p2p[:-1].tolist(), action_s)
    busy = m * (sum(fwd) + sum(bwd) + 2 * action_s * par.num_chunks)
    return makespan, max(0.0, 1 - busy / (par.pp * makespan))


def metrics_of(model: ModelSpec, cluster: Cluster, par: Parallel, pred: Prediction,
               peak_flops: float | None = None) -> Metrics:
    """Step metrics; MFU and HFU against ``peak_flops`` when given (a profile's measured peak:
    its times come from that device, so the cluster GPU's datasheet peak would read ~0%)."""
    gpus, peak = cluster.gpus, peak_flops or cluster.hardware.peak_flops
    step = pred.step_s
    return Metrics(step_time_s=step,
                   tokens_per_s=par.global_batch * model.seq_length / step,
                   tflops_per_gpu=pred.model_flops / step / gpus / 1e12,
                   mfu=pred.model_flops / (step * gpus * peak),
                   hfu=pred.hardware_flops / (step * gpus * peak),
                   bubble_fraction=pred.bubble, peak_memory_bytes=pred.peak_memory_bytes)


def evaluate(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack | None = None,
             bounds: list[tuple[int, int]] | None = None, recompute_per_chunk=None,
             profile=None, tables: dict[str, CostTable] | None = None,
             simulated: bool = False, sim_cache: dict | None = None,
             recompute_layers=None) -> Plan:
    """Predict the plan of one fully specified configuration (even split unless ``bounds``)
    on the stack ``opts`` (default: the default stack).

    ``tables`` are the layer costs per recompute mode when the caller already has them.
    ``recompute_layers``: per chunk None, or N: only its first N blocks recomputed (Megatron's
    block method, predict/chunks.py partial_segments)."""
    return predict_plan(model, cluster, par, opts, bounds, recompute_per_chunk, profile, tables,
                        simulated, sim_cache, recompute_layers)[0]


def predict_plan(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack | None = None,
                 bounds: list[tuple[int, int]] | None = None, recompute_per_chunk=None,
                 profile=None, tables: dict[str, CostTable] | None = None,
                 simulated: bool = False, sim_cache: dict | None = None,
                 recompute_layers=None) -> tuple[Plan, Prediction]:
    """:func:`evaluate`, and the Prediction it dressed (per-rank memory parts)."""
    opts = opts or default_stack()
    bounds = bounds or even_block_bounds(model, par.num_chunks)
    modes = recompute_per_chunk or [par.recompute] * par.num_chunks
    modes, counts = block_counts_of(model, bounds, modes, recompute_layers)
    needed = set(modes) | ({"none"} if any(n is not None for n in counts) else set())
    by_mode = dict(tables or {})
    for mode in needed - set(by_mode):
        by_mode[mode] = CostTable(model_layer_costs(model, par, cluster.hardware, opts, mode,
                                                    profile))
    stages = split_stages(by_mode, bounds, modes, counts,
                          [layer.kind == "block" for layer in model.layers])
    pred = predict(model, cluster, par, opts, stages, simulated, sim_cache)
    plan_stages = tuple(
        Stage(stage=k, rank=k % par.pp, first=int(stages.first[k]), last=int(stages.last[k]),
              recompute=stages.recompute[k], time_s=float(stages.time_s[k]),
              memory_bytes=float(pred.chunk_memory_bytes[k]), fwd_s=float(stages.fwd_s[k]),
              bwd_s=float(stages.bwd_s[k]), wgrad_s=float(stages.bwd_weight_s[k]),
              send_s=float(pred.transfer_s[k]), a2a_s=float(stages.a2a_s[k]),
              recompute_layers=counts[k])
        for k in range(par.num_chunks))
    plan = Plan(model=model, cluster=cluster, parallel=par, stages=plan_stages,
                metrics=metrics_of(model, cluster, par, pred,
                                   getattr(profile, "peak_flops", None)),
                rank_memory_bytes=tuple(float(x) for x in pred.rank_memory_bytes),
                notes=_notes(opts) + moe.notes(model, par, opts), stack=opts)
    return plan, pred


def block_counts_of(model: ModelSpec, bounds, modes,
                    recompute_layers) -> tuple[list[str], list[int | None]]:
    """Per chunk, its mode and the N of Megatron's block method, or None where the mode covers
    the whole chunk: a count is kept only for a "full" chunk with 1 <= N < its blocks (N = 0 is
    no recompute, N = all is full recompute; the plan's stage then says so plainly)."""
    modes = list(modes)
    if recompute_layers is None:
        return modes, [None] * len(modes)
    out_modes, out = [], []
    for (a, b), mode, n in zip(bounds, modes, recompute_layers):
        blocks = sum(1 for layer in model.layers[a:b] if layer.kind == "block")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(f"recompute_layers must be None or a count >= 0, got {n!r}")
        out_modes.append("none" if mode == "full" and n == 0 else mode)
        out.append(n if mode == "full" and n is not None and 0 < n < blocks else None)
    return out_modes, out


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


MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "transient",
                "fragmentation", "reserved")


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
                        _dp_group(par, cluster), cluster, model)
    if par.expert_dp > 1 and experts.any():
        out = out + _group_sync_s(par, opts, stages, experts,
                                  _dp_group(par, cluster, experts=True), cluster, model)
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
    return exposed + _overlapped_cost_s(bwd_comm, windows * bwd, interference) + \
        _overlapped_cost_s(fwd_comm, fwd, interference)


def _dp_group(par: Parallel, cluster: Cluster, experts: bool = False) -> nccl.Group:
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
    """:func:`_dp_group` for a group of ``n`` ranks ``inner`` apart on ``pp`` stages: a pure
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


def _overlapped_cost_s(comm_s: np.ndarray, window_s: np.ndarray,
                       interference: float) -> np.ndarray:
    """What overlapping ``comm_s`` with a compute window of ``window_s`` adds to the step: the part
    that does not fit is exposed, and while the part that fits runs the compute is slowed by
    ``interference`` (the share of SMs the collective holds). The window's own growth under that
    slowdown (which would hide a little more) is second order and left out."""
    exposed = np.maximum(0.0, comm_s - window_s)
    return exposed + interference * (comm_s - exposed)


def _notes(opts: Stack) -> tuple[str, ...]:
    """The footer: the stack the plan was priced on, and what that means for the big terms."""
    kernel = "" if opts.attention_kernel == "flash2" else f", {opts.attention_kernel} kernel"
    attention = f"flash attention (scores not stored{kernel})" if opts.flash_attention else \
        "unfused attention"
    grads = opts.grad_dtype
    if opts.param_dtype == "bf16" and opts.grad_dtype != "fp32" and \
            opts.fp32_grad_accumulation_zero:
        stages = ",".join(str(z) for z in opts.fp32_grad_accumulation_zero)
        grads += f" (+fp32 accumulation at ZeRO {stages})"
    dp = " + ".join(k for k, on in (("grad reduce", opts.overlap_grad_reduce),
                                    ("param gather", opts.overlap_param_gather)) if on) or "off"
    fp8 = f", FP8 block GEMMs ({opts.fp8_recipe} scaling)" if opts.precision == "fp8" else ""
    return (f"stack: {opts.label()} (`plan stacks`; --stack NAME|FILE to change)",
            f"assumes {attention}, DP overlap {dp}, TP overlap "
            f"{'on' if opts.tp_comm_overlap else 'off'}, {grads} gradients{fp8}")
