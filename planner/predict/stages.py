"""From a configuration to its stage-partition problem, and back to stage bounds.

The partitioner (planner/partitioning/) sees only per-layer numbers: time per microbatch under each
recompute mode the configuration allows, model-state bytes, activation bytes, the in-flight
microbatches each chunk holds under the schedule, and, per recompute mode, the per-GPU memory
left once the framework's reserve, that mode's allocator fragmentation and its largest transient
are set aside (a rank is held to the least of its chunks' modes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.cost import constants, precision, recompute, zero
from planner.predict.chunks import CostTable, ChunkArrays, even_block_bounds
from planner.predict.layer_costs import model_layer_costs
from planner.predict.pipeline_schedule import inflight_closed_form, stage_transfer_s
from planner.predict.memory import (gathered_bytes, kept_outputs, layer_gather_bytes,
                                    recompute_churn, root_gather_bytes, state_bytes)
from planner.hardware.profiles import Cluster
from planner.cost.fragmentation import fragmentation
from planner.cost.memory import ACT_BYTES
from planner.model.spec import ModelSpec
from planner.partitioning.baselines import equal_param_split, fixed_split
from planner.partitioning.problem import PartitionProblem, mirrored_ranks
from planner.partitioning.split import Partition
from planner.partitioning.solve import partition
from planner.partitioning.dp import partition_dp
from planner.core.parallel import RECOMPUTE_MODES, Parallel
from planner.stack import Stack

# How a stage split is solved. "auto": each solver where it is best, measured (bench_partition.py,
# plan solve with --partition ilp / dp): one chunk per rank is a chain, where the exact DP is
# faster than the MILP (default plan solve: 1.1 s against 1.6 s of CPU); interleaved chunks share
# a rank's memory and time, which the chain DP cannot express, so the MILP splits them. "ilp"
# and "dp" force one solver everywhere. Each split names the solver that produced it.
METHODS = ("auto", "ilp", "dp")


@dataclass(frozen=True)
class Split:
    bounds: tuple[tuple[int, int], ...]
    recompute: tuple[str, ...]
    partition: Partition
    # per chunk: None, or N of Megatron's block method (only the first N blocks recompute)
    recompute_layers: tuple[int | None, ...] = ()

    @property
    def how(self) -> str:
        """The solver that produced the split, as output and plan notes show it."""
        return self.partition.label


BLOCK_PIN = "block"
"""The recompute pin for Megatron's block method alone: every stage recomputes its first N blocks,
N from 0 to all chosen per stage by the partitioner (full granularity: no selective stage)."""


def allowed_modes(model: ModelSpec, par: Parallel, opts: Stack,
                  exact: bool | str = False) -> tuple[str, ...]:
    """The recompute modes a stage may use: exactly the configuration's (a user's pin), or any
    up to it, so the partitioner can spare the stages with memory to spare ('selective' left
    out where the stack's modules discard nothing on this model, as core_attn under flash
    attention, which already drops the scores, or below full where it is not priced:
    cost/recompute.py).
    ``exact`` = BLOCK_PIN: none and full, so that a stage may recompute part of its blocks
    (partial_modes)."""
    if exact == BLOCK_PIN:
        return ("none", "full")
    if exact:
        return (par.recompute,)
    modes = RECOMPUTE_MODES[: RECOMPUTE_MODES.index(par.recompute) + 1]
    # unpriced: left out below full; a selective configuration keeps it, and the cost model
    # refuses it in one line rather than pricing it as something else
    skip = recompute.selective_discards_nothing(model, opts) or (
        par.recompute != "selective" and recompute.selective_refusal(model, opts) is not None)
    return tuple(m for m in modes if not (m == "selective" and skip))


def usable_bytes(cluster: Cluster, churn: float) -> float:
    """Bytes of tensors a GPU can hold: its memory less the framework's reserve and the
    allocator's fragmentation under a recompute of this ``churn`` (cost/fragmentation.py; True /
    False read as full recompute / none)."""
    return (cluster.capacity_bytes - constants.RESERVED_BYTES) * (
        1 - fragmentation(churn))


def _layer_states(params, par: Parallel, opts: Stack, expert_params=0.0, gathered=None):
    """Model-state bytes of each layer (or of a parameter total: the formula is linear), plus
    the layer's 16-bit weights when ZeRO-3 gathers a whole stage at a time, or its gathered
    weights (``gathered``: per layer; None: the least bytes a parameter gathers in) and
    unsharded gradients where ZeRO-3 holds them for the step (predict/memory.py held_bytes)."""
    states = state_bytes(params, par, opts, expert_params)
    if zero.holds_for_step(par, opts):  # as predict/memory.py held_bytes counts them
        least = zero.FP8_GATHER_BYTES if zero.fp8_gathered(par, opts) else zero.GATHER_BYTES
        dense = params - expert_params
        groups = ((dense, par.dp * par.cp), (expert_params, par.expert_dp))
        sharded = sum(p for p, ranks in groups if ranks > 1)
        share = np.where(np.asarray(params) > 0, sharded / np.maximum(params, 1.0), 0.0)
        states = states + share * (least * params if gathered is None else gathered) \
            + opts.reduced_grad_bytes(par.zero) * sum(p * (1 - 1 / r) for p, r in groups)
    elif par.zero >= 3 and opts.zero3_gather == "stage":
        states = states + ACT_BYTES * params
    return states


def _memory_terms(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                  tables: dict[str, CostTable]):
    """(in-flight microbatches per chunk, kept stage outputs per rank, capacity for states and
    activations per mode in ``tables``' order): evaluate.memory_parts' terms that do not depend
    on the split. A mode's capacity sets aside its allocator fragmentation (more the more
    its recompute frees and rebuilds: cost/fragmentation.py) and the largest transient of any layer under it, with ZeRO-3's gathered layers;
    a rank is held to the least capacity of its chunks' modes, as evaluate counts a rank that
    recomputes anywhere with the larger fragmentation."""
    inflight = np.array(inflight_closed_form(par.schedule, par.pp, par.num_microbatches,
                                             par.virtual_stages), dtype=float)
    gathered = (float(gathered_bytes(model, par, opts, np.zeros(1))[0])
                if par.zero >= 3 and opts.zero3_gather == "layer" else 0.0)
    kept = kept_outputs(model, par, inflight, opts).reshape(-1, par.pp).sum(axis=0)
    churn = recompute_churn(model, par, opts, tuple(tables))
    capacity = np.array([max(usable_bytes(cluster, churn[m])
                             - float(tables[m].work_bytes.max()) - gathered, 0.0) for m in tables])
    return inflight, kept, capacity


def partition_problem(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                      tables: dict[str, CostTable]) -> PartitionProblem:
    """The memory formula is evaluate.memory_parts' own, per layer: model states (plus the whole
    stage's 16-bit weights when ZeRO-3 gathers a stage at a time), activations per in-flight
    microbatch, the kept stage outputs of a pipeline engine that keeps them (per rank), and each
    mode's largest transient and fragmentation (_memory_terms) set aside from that mode's
    capacity. Only the tied-embedding saving of a single chunk is left out (conservative)."""
    modes = tuple(tables)
    costs = {m: tables[m].costs for m in modes}
    time_s = np.array([[c.total_s for c in costs[m]] for m in modes]).T
    act = np.array([[c.act_bytes for c in costs[m]] for m in modes]).T
    params = np.array([c.params for c in costs[modes[0]]], dtype=float)
    experts = np.array([c.expert_params for c in costs[modes[0]]], dtype=float)
    cached = precision.held_fp8_bytes(  # FP8 copies (or FP8 primary weights)
        np.array([c.cache_bytes for c in costs[modes[0]]], dtype=float), par.zero, opts)
    inflight, kept, capacity = _memory_terms(model, cluster, par, opts, tables)
    return PartitionProblem(
        time_s=time_s, state_bytes=_layer_states(params, par, opts, experts,
                                                  layer_gather_bytes(model, par, opts)) + cached
        + root_gather_bytes(model, par, opts),
        act_bytes=act,
        inflight=inflight, capacity_bytes=capacity, modes=modes,
        boundary_s=2 * np.array(stage_transfer_s(model, par, cluster, opts)),
        extra_bytes=kept if kept.any() else None,
        partial=partial_modes(model, par, modes, time_s, act),
        blocks=np.array([layer.kind == "block" for layer in model.layers]))


def partial_modes(model: ModelSpec, par: Parallel, modes: tuple[str, ...], time_s: np.ndarray,
                  act: np.ndarray) -> tuple[int, int] | None:
    """(none, full) when a chunk may recompute only its first N blocks (Megatron's
    --recompute-method block, TransformerConfig.recompute_num_layers: "the number of
    transformer layers to recompute within each pipeline stage"; with virtual pipelining Megatron
    builds one TransformerBlock per model chunk and counts within it): wherever both modes are
    allowed and recomputing a block costs time and saves memory. The chain DP (one chunk per
    rank) solves it for any layer sequence, the option MILP for embedding, identical blocks and
    head; an interleaved or DualPipe split of other models (the boundary MILP) keeps whole-chunk
    modes."""
    if "none" not in modes or "full" not in modes:
        return None
    b, f = modes.index("none"), modes.index("full")
    blocks = np.array([layer.kind == "block" for layer in model.layers])
    if not blocks.any() or np.any(time_s[blocks, f] < time_s[blocks, b]) or \
            np.any(act[blocks, f] > act[blocks, b]):
        return None
    uniform = (blocks[1:-1].all() and not blocks[0] and not blocks[-1]
               and bool((time_s[blocks] == time_s[blocks][0]).all())
               and bool((act[blocks] == act[blocks][0]).all()))
    one_chunk_a_rank = par.schedule_traits.chunks_per_rank(par.virtual_stages) == 1
    return (b, f) if one_chunk_a_rank or uniform else None


def may_fit(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
            tables: dict[str, CostTable], even_stages: ChunkArrays | None = None) -> bool:
    """A cheap necessary condition for the partitioner to fit this configuration (the search's
    memory screen: it never rejects what the partitioner can fit; tests/test_stack_pricing.py
    checks it against --explain). With S the model states, A the activations under the lightest
    mode each layer allows, f_k the in-flight microbatches of chunk k and C the largest capacity
    of any mode, any split has max_r M_r >= sum_r w_r M_r for weights w_r >= 0 summing to 1:
    w_r = 1/p gives (S + min f · A)/p; with one chunk per rank, w_r proportional to 1/f_r gives
    (S/max f + A)/sum(1/f_r). Those bounds, plus the least kept-output bytes of any rank, must
    be within C. Interleaved chunks are partitioned too (of any sizes), so the even split's own
    memory is no bound for them. ``even_stages`` is accepted for the callers that have it."""
    inflight, kept, capacity = _memory_terms(model, cluster, par, opts, tables)
    any_table = next(iter(tables.values()))
    total_s = float(_layer_states(any_table.prefix["params"][-1], par, opts,
                                  any_table.prefix["expert_params"][-1])
                    + precision.held_fp8_bytes(any_table.prefix["cache_bytes"][-1],
                                               par.zero, opts)
                    + root_gather_bytes(model, par, opts).sum())
    total_a = float(np.minimum.reduce([np.diff(t.prefix["act_bytes"])
                                       for t in tables.values()]).sum())
    f = inflight
    bound = (total_s + f.min() * total_a) / par.pp
    if par.virtual_stages == 1:
        bound = max(bound, (total_s / f.max() + total_a) / float((1 / f).sum()))
    return bound + float(kept.min()) <= float(capacity.max()) * (1 + 1e-9)


def cost_tables(model: ModelSpec, par: Parallel, hw, opts: Stack, profile=None,
                known: dict | None = None, exact: bool = False) -> dict[str, CostTable]:
    """Cost tables for every mode the configuration allows (reusing ``known`` ones)."""
    known = known or {}
    return {m: known.get(m) or CostTable(model_layer_costs(model, par, hw, opts, m, profile))
            for m in allowed_modes(model, par, opts, exact)}


def best_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
               tables: dict[str, CostTable], method: str = "auto", lp_path=None) -> Split:
    """The compute-balanced split under memory, interleaved chunks included: with v > 1 the
    chunks of a rank may differ in size (every launcher that runs the interleaved schedule takes
    uneven chunks: Megatron's --pipeline-model-parallel-layout, torchtitan's split points)."""
    several = par.schedule_traits.chunks_per_rank(par.virtual_stages) > 1  # chunks a rank
    ranks = ranks_of(par)
    if method == "auto":
        method = "ilp" if several or lp_path is not None else "dp"
    if method == "ilp":
        # Interleaved (and DualPipe's two stages a rank): among splits of equal bottleneck the
        # schedule still runs some faster (its critical path crosses every chunk); keep
        # Megatron's even split on a tie. The chunk-order tie-break (step 3) is left out there:
        # with many chunks it can take the whole node limit, and the order of equal chunks is
        # not what the step time ranks.
        even = [b for _, b in even_block_bounds(model, par.num_chunks)] if several else None
        return _solved(lambda problem: partition(problem, par.num_chunks, ranks,
                                                 lp_path=lp_path, prefer=even,
                                                 tie_break_steps=2 if several else 3),
                       model, cluster, par, opts, tables)
    if several:  # the exact DP is one chunk a rank only (else: enumeration, tiny cases)
        ends = [b for _, b in even_block_bounds(model, par.num_chunks)]
        split = _solved(lambda problem: fixed_split(problem, ends, ranks, par.recompute),
                        model, cluster, par, opts, tables)
        return replace(split, partition=replace(
            split.partition, method="even",
            note=f"{'interleaved chunks' if par.virtual_stages > 1 else 'two stages a rank'}; "
                 "the DP is one chunk a rank only"))
    return _solved(lambda problem: partition_dp(problem, par.num_chunks, par.pp),
                   model, cluster, par, opts, tables)


def param_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                tables: dict[str, CostTable]) -> Split:
    """The common hand-made split: equal parameter counts per stage, each stage with its
    fastest recompute mode that fits."""
    params = [c.params for c in next(iter(tables.values())).costs]
    return _solved(lambda problem: equal_param_split(problem, par.num_chunks, ranks_of(par),
                                                     params, None),
                   model, cluster, par, opts, tables)


def one_block_count(model: ModelSpec, split: Split) -> Split:
    """``split`` with one N of Megatron's block method for every chunk, as Megatron runs it
    (--recompute-num-layers is one number: the first N blocks of each chunk recompute, all of a
    chunk with at most N): N the most blocks any chunk of the split recomputes, so no chunk holds
    more activations than the partitioner fitted (a block recomputed costs time and saves
    memory: PartitionProblem.partial), and some may run slower than it chose."""
    blocks = [sum(1 for layer in model.layers[a:b] if layer.kind == "block")
              for a, b in split.bounds]
    layers = split.recompute_layers or (None,) * len(blocks)
    asked = [(n if n is not None else b) if mode == "full" else 0
             for mode, n, b in zip(split.recompute, layers, blocks)]
    n = max(asked)
    if all(a == min(n, b) for a, b in zip(asked, blocks)):
        return split  # (n = 0, no chunk recomputing, among them)
    modes = ("full",) * len(blocks)
    counts = tuple(n if n < b else None for b in blocks)
    note = f"block {n} on every stage, as Megatron's one --recompute-num-layers runs it"
    partition = replace(split.partition, note="; ".join(filter(None, (split.partition.note,
                                                                      note))))
    return replace(split, recompute=modes, recompute_layers=counts, partition=partition)


def megatron_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                   tables: dict[str, CostTable]) -> Split:
    """Megatron's default even split, each stage with its fastest recompute mode that fits."""
    ends = [b for _, b in even_block_bounds(model, par.num_chunks)]
    return _solved(lambda problem: fixed_split(problem, ends, ranks_of(par), None),
                   model, cluster, par, opts, tables)


def ranks_of(par: Parallel) -> int:
    """The ranks the partitioner places chunks on: pp, or pp / 2 for DualPipe, whose ranks r
    and pp - 1 - r hold the same two stages (:func:`placed`)."""
    return par.pp // 2 if par.schedule_traits.mirrored else par.pp


def placed(problem: PartitionProblem, par: Parallel) -> PartitionProblem:
    """The configuration's partition problem placed on :func:`ranks_of` ranks. DualPipe
    (planner/pipeline/dualpipe.py) cuts the model into pp stages, rank r running stage r of the
    forward direction and stage pp - 1 - r of the reverse one, so ranks r and pp - 1 - r hold the
    same two stages, with the same activations held of each (dualpipe.held_at_peak): pp chunks
    on pp / 2 ranks (partitioning/problem.py mirrored_ranks), a rank's time per microbatch pair
    and its memory those of both stages, the stage outputs it keeps (extra bytes, per stage
    here) of both summed."""
    if not par.schedule_traits.mirrored:
        return problem
    extra = problem.extra_bytes
    if extra is not None:
        extra = (np.asarray(extra) + np.asarray(extra)[::-1])[: par.pp // 2]
    return replace(problem, chunk_ranks=mirrored_ranks(par.pp), extra_bytes=extra)


def _solved(solve, model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
            tables: dict[str, CostTable]) -> Split:
    return _as_split(solve(placed(partition_problem(model, cluster, par, opts, tables), par)))


def _as_split(result: Partition) -> Split:
    return Split(tuple((c.first, c.last_exclusive) for c in result.chunks),
                 tuple(c.recompute for c in result.chunks), result,
                 tuple(c.recompute_layers for c in result.chunks))
