"""Predict one configuration: per-stage time and memory, step time, throughput, MFU.

A training step on pipeline rank i is the schedule over its microbatches plus what the schedule
cannot hide: the data-parallel gradient synchronisation (partly overlapped with the last backward
when the run overlaps it) and the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from planner import calibration, comm
from planner.cost import LayerCost, RunOptions, layer_cost
from planner.hardware import Cluster
from planner.layout import dp_group_crosses_nodes, stage_hop_crosses_nodes
from planner.memory import ACT_BYTES, Shape, model_state_bytes
from planner.model import ModelSpec
from planner.plan import Metrics, Parallel, Plan, Stage
from planner.simulate import simulate

# Adam step per parameter shard: read fp32 master, m, v and the fp32 gradient (16 B), write master,
# m, v (12 B) and the 16-bit weight (2 B): 30 bytes, memory-bound (Megatron's fused Adam).
OPTIMIZER_BYTES_PER_PARAM = 30


@dataclass(frozen=True)
class StageCost:
    """One model chunk's costs for one microbatch, summed over its layers."""

    first: int
    last: int
    recompute: str
    fwd_s: float
    bwd_input_s: float
    bwd_weight_s: float
    params: float
    act_bytes: float  # per in-flight microbatch
    work_bytes: float  # largest transient of its layers
    model_flops: float
    hardware_flops: float

    @property
    def bwd_s(self) -> float:
        return self.bwd_input_s + self.bwd_weight_s

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s


def layer_costs(model: ModelSpec, par: Parallel, hw, opts: RunOptions, recompute: str,
                profile=None) -> list[LayerCost]:
    """The cost of every layer of the model under one parallel shape and recompute mode."""
    shape = Shape(tp=par.tp, sp=par.sequence_parallel, micro_batch=par.micro_batch,
                  seq_len=model.seq_length)
    cache: dict = {}
    out = []
    for i, layer in enumerate(model.layers):
        measured = profile.layers[i] if profile is not None else None
        key = (layer, id(measured))
        if key not in cache:
            cache[key] = layer_cost(layer, shape, recompute, hw, opts, measured)
        out.append(cache[key])
    return out


def even_split(model: ModelSpec, num_chunks: int) -> list[tuple[int, int]]:
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


class CostTable:
    """Prefix sums over a model's layer costs, so any stage's totals cost O(1) to read."""

    FIELDS = ("fwd_s", "bwd_input_s", "bwd_weight_s", "params", "act_bytes", "model_flops",
              "hardware_flops")

    def __init__(self, costs: list[LayerCost]):
        self.costs = costs
        self.work_bytes = [c.work_bytes for c in costs]
        rows = {
            "fwd_s": [c.fwd_s for c in costs],
            "bwd_input_s": [c.bwd_input_s + c.recompute_s for c in costs],
            "bwd_weight_s": [c.bwd_weight_s for c in costs],
            "params": [c.params for c in costs],
            "act_bytes": [c.act_bytes for c in costs],
            "model_flops": [c.model_flops for c in costs],
            "hardware_flops": [c.hardware_flops for c in costs],
        }
        self.prefix = {k: [0.0, *accumulate(v)] for k, v in rows.items()}

    def stage(self, first: int, last: int, recompute: str) -> StageCost:
        sums = {k: pre[last] - pre[first] for k, pre in self.prefix.items()}
        return StageCost(first=first, last=last, recompute=recompute,
                         work_bytes=max(self.work_bytes[first:last]), **sums)


def inflight_closed_form(schedule: str, p: int, m: int, v: int) -> list[int]:
    """Microbatches whose activations each chunk holds at peak (DESIGN.md §3; the simulator
    gives exact counts): GPipe M; 1F1B and ZB-H1 min(p - i, M) on rank i; interleaved: rank i
    holds its warm-up of (p - i - 1)·2 + (v - 1)·p forwards + 1, spread over its v chunks
    (Narayanan et al. 2021 §2.2, Megatron's interleaved schedule)."""
    if schedule == "gpipe":
        return [m] * (p * v)
    if schedule == "interleaved" and v > 1:
        out = []
        for k in range(p * v):
            rank = k % p
            held = min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v)
            out.append(-(-held // v))
        return out
    return [min(p - (k % p), m) for k in range(p * v)]


def evaluate(model: ModelSpec, cluster: Cluster, par: Parallel, opts: RunOptions = RunOptions(),
             bounds: list[tuple[int, int]] | None = None, recompute_per_chunk=None,
             profile=None, tables: dict[str, CostTable] | None = None,
             simulated: bool = False) -> Plan:
    """Predict the plan of one fully specified configuration (even split unless ``bounds``).

    ``tables`` are the layer costs per recompute mode when the caller already has them. With
    ``simulated`` the schedule runs op by op (planner/simulate.py): step time, bubble and the
    activations each rank holds come from the simulation instead of the closed forms."""
    hw = cluster.hardware
    chunks = par.num_chunks
    bounds = bounds or even_split(model, chunks)
    modes = recompute_per_chunk or [par.recompute] * chunks
    by_mode = dict(tables or {})
    for mode in set(modes) - set(by_mode):
        by_mode[mode] = CostTable(layer_costs(model, par, hw, opts, mode, profile))
    stages = [by_mode[mode].stage(a, b, mode) for (a, b), mode in zip(bounds, modes)]
    p2p = stage_transfer_s(model, par, cluster, opts)
    inflight = inflight_closed_form(par.schedule, par.pp, par.num_microbatches,
                                    par.virtual_stages)

    rank_time = [0.0] * par.pp
    for k, st in enumerate(stages):
        rank_time[k % par.pp] += st.time_s + (2 * p2p[k] if k < chunks - 1 else 0.0)
    held = None
    if simulated:
        sim = simulate(par.schedule, par.pp, par.num_microbatches, par.virtual_stages,
                       fwd_s=[st.fwd_s for st in stages], bwd_s=[st.bwd_s for st in stages],
                       wgrad_s=[st.bwd_weight_s for st in stages], comm_s=p2p,
                       act_bytes=[st.act_bytes for st in stages])
        pipeline_s, bubble, held = sim.makespan_s, sim.bubble_fraction, sim.peak_activation_bytes
    else:
        pipeline_s = _pipeline_closed_form(par, rank_time)
        busy = sum(rank_time) * par.num_microbatches
        bubble = max(0.0, 1 - busy / (par.pp * pipeline_s))

    rank_mem = _rank_memory(model, par, stages, inflight, opts, held)
    dp_exposed = max(_dp_exposed_s(par, cluster, opts, stages, r) for r in range(par.pp))
    owned = max(sum(st.params for st in stages[r::par.pp])
                for r in range(par.pp)) / (par.dp if par.zero >= 1 else 1)
    optimizer_s = owned * OPTIMIZER_BYTES_PER_PARAM / (
        hw.memory_bandwidth_gbps * 1e9 * (hw.memory_efficiency or calibration.MEMORY_EFFICIENCY))
    step_s = pipeline_s + dp_exposed + optimizer_s

    tokens = par.global_batch * model.seq_length
    replicas = par.tp * par.dp * par.num_microbatches  # per-GPU microbatch FLOPs -> whole step
    model_flops = sum(st.model_flops for st in stages) * replicas
    hardware_flops = sum(st.hardware_flops for st in stages) * replicas
    gpus = cluster.gpus
    metrics = Metrics(
        step_time_s=step_s, tokens_per_s=tokens / step_s,
        tflops_per_gpu=model_flops / step_s / gpus / 1e12,
        mfu=model_flops / (step_s * gpus * hw.peak_flops),
        hfu=hardware_flops / (step_s * gpus * hw.peak_flops),
        bubble_fraction=bubble,
        peak_memory_bytes=max(rank_mem))
    plan_stages = tuple(
        Stage(stage=k, rank=k % par.pp, first=st.first, last=st.last, recompute=st.recompute,
              time_s=st.time_s, memory_bytes=_chunk_memory(par, st, inflight[k], opts),
              fwd_s=st.fwd_s, bwd_s=st.bwd_s, wgrad_s=st.bwd_weight_s)
        for k, st in enumerate(stages))
    return Plan(model=model, cluster=cluster, parallel=par, stages=plan_stages, metrics=metrics,
                rank_memory_bytes=tuple(rank_mem), notes=_notes(opts))


def _pipeline_closed_form(par: Parallel, rank_time: list[float]) -> float:
    """1F1B/GPipe with unequal stages: the slowest rank paces the M-1 steady steps, every rank
    is on the critical path once (fill and drain). Interleaving divides the fill and drain by v;
    ZB-H1 hides about two thirds of it (Qi et al. 2023)."""
    m, v = par.num_microbatches, par.virtual_stages
    steady = (m - 1) * max(rank_time)
    fill = sum(rank_time)
    if par.schedule == "interleaved" and v > 1:
        fill = max(rank_time) + (fill - max(rank_time)) / v
    elif par.schedule == "zb-h1":
        fill = max(rank_time) + (fill - max(rank_time)) / 3
    return steady + fill


def _grad_bytes(opts: RunOptions) -> int:
    return opts.grad_bytes + (ACT_BYTES if opts.lowp_grad_copy else 0)


def _chunk_memory(par: Parallel, st: StageCost, inflight: int, opts: RunOptions) -> float:
    states = model_state_bytes(st.params, par.dp, par.zero, _grad_bytes(opts))
    return states + inflight * st.act_bytes


def _rank_memory(model: ModelSpec, par: Parallel, stages: list[StageCost], inflight: list[int],
                 opts: RunOptions, held_activations=None) -> list[float]:
    """Peak bytes per pipeline rank, conservative: states + held activations (the closed-form
    in-flight counts, or the simulated peak when given) + the largest transient + the
    framework's reserve and fragmentation (planner/calibration.py)."""
    out = []
    tied_dup = 0.0
    if model.tie_embeddings and par.num_chunks == 1:
        tied_dup = model.vocab_size * model.hidden_size / par.tp  # one copy when not split
    for r in range(par.pp):
        mine = list(enumerate(stages))[r::par.pp]
        if held_activations is None:
            held = sum(_chunk_memory(par, st, inflight[k], opts) for k, st in mine)
        else:
            held = held_activations[r] + sum(
                model_state_bytes(st.params, par.dp, par.zero, _grad_bytes(opts)) for _, st in mine)
        if opts.keep_stage_outputs:  # each in-flight microbatch's output of a non-last chunk
            out_bytes = ACT_BYTES * par.micro_batch * model.seq_length * model.hidden_size / (
                par.tp if par.sequence_parallel else 1)
            held += sum(inflight[k] * out_bytes for k, _ in mine if k < len(stages) - 1)
        if r == 0 and tied_dup:
            held -= model_state_bytes(tied_dup, par.dp, par.zero, _grad_bytes(opts))
        transient = max(st.work_bytes for _, st in mine)
        if par.zero >= 3:  # a gathered copy of the largest chunk's weights while it runs
            transient += max(st.params for _, st in mine) * ACT_BYTES
        out.append((held + transient) * (1 + calibration.FRAGMENTATION)
                   + calibration.RESERVED_BYTES)
    return out


def stage_transfer_s(model: ModelSpec, par: Parallel, cluster: Cluster,
                     opts: RunOptions) -> list[float]:
    """One microbatch's activations across each chunk boundary (chunk k to k + 1), on NVLink or
    the network depending on where the two stages' ranks live (tp-dp-pp order). With Megatron's
    scatter/gather each GPU sends 1/tp of the tensor and the receiver re-gathers it over NVLink
    (Narayanan et al. 2021 §4.1); with sequence parallelism the tensor is already sharded."""
    chunks = par.num_chunks
    if chunks == 1:
        return []
    intra, inter = comm.links(cluster.hardware)
    full = ACT_BYTES * par.micro_batch * model.seq_length * model.hidden_size
    sharded = par.sequence_parallel or opts.scatter_gather
    nbytes = full / par.tp if sharded else full
    regather = (comm.all_gather_s(full, par.tp, intra)
                if opts.scatter_gather and not par.sequence_parallel else 0.0)
    out = []
    for k in range(chunks - 1):
        a, b = k % par.pp, (k + 1) % par.pp
        crosses = cluster.nodes > 1 and stage_hop_crosses_nodes(a, b, par.tp, par.dp,
                                                                 cluster.gpus_per_node)
        out.append(comm.p2p_s(nbytes, inter if crosses else intra) + regather)
    return out


def _dp_exposed_s(par: Parallel, cluster: Cluster, opts: RunOptions, stages: list[StageCost],
                  rank: int) -> float:
    """Gradient synchronisation the step cannot hide. ZeRO-0: all-reduce of the gradients;
    ZeRO-1/distributed optimizer: reduce-scatter gradients + all-gather 16-bit weights once per
    step; ZeRO-2 reduce-scatters after every microbatch (DeepSpeed keeps only the shard);
    ZeRO-3 also gathers the weights for every forward and backward (Rajbhandari et al. 2020).
    With overlap the reduce hides behind the last microbatch's backward and the gather behind the
    first forward (Megatron-Core --overlap-grad-reduce / --overlap-param-gather)."""
    if par.dp == 1:
        return 0.0
    # tp-dp-pp rank order: a DP group has gpus_per_node / tp members on each node it spans.
    per_node = max(1, min(par.dp, cluster.gpus_per_node // par.tp))
    spans = cluster.nodes > 1 and dp_group_crosses_nodes(par.tp, par.dp, par.pp,
                                                         cluster.gpus_per_node)
    link = comm.group_link(cluster.hardware, per_node, spans)
    mine = stages[rank::par.pp]
    params = sum(st.params for st in mine)
    grads = params * opts.grad_bytes
    if par.zero == 0:
        reduce_s, gather_s = comm.all_reduce_s(grads, par.dp, link), 0.0
    else:
        reduce_s = comm.reduce_scatter_s(grads, par.dp, link)
        gather_s = comm.all_gather_s(params * ACT_BYTES, par.dp, link)
    m = par.num_microbatches
    if par.zero >= 2:  # only a gradient shard is kept: reduce-scatter after every microbatch
        reduce_s *= m
    if par.zero >= 3:  # weights gathered for every microbatch's forward and backward
        gather_s += 2 * m * comm.all_gather_s(params * ACT_BYTES, par.dp, link)
    if not opts.overlap_dp:
        return reduce_s + gather_s
    windows = m if par.zero >= 2 else 1  # each per-microbatch collective hides behind its pass
    return max(0.0, reduce_s - windows * sum(st.bwd_s for st in mine)) + \
        max(0.0, gather_s - (m if par.zero >= 3 else 1) * sum(st.fwd_s for st in mine))


def _notes(opts: RunOptions) -> tuple[str, ...]:
    return (f"attention: {'flash (scores not stored)' if opts.flash_attention else 'unfused'}",
            f"DP overlap: {'on' if opts.overlap_dp else 'off'}; TP overlap: "
            f"{'on' if opts.overlap_tp else 'off'}",
            f"gradients: {'fp32' if opts.grad_bytes == 4 else '16-bit'}")
