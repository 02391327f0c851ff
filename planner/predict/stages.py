"""From a configuration to its stage-partition problem, and back to stage bounds.

The partitioner (planner/partition.py) sees only per-layer numbers: time per microbatch under each
recompute mode the configuration allows, model-state bytes, activation bytes, the in-flight
microbatches each chunk holds under the schedule, and the per-GPU memory left once the
framework's reserve and the largest transient are set aside.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import constants
from planner.predict.step import (CostTable, Stages, even_block_bounds, gathered_bytes,
                                  inflight_closed_form, kept_outputs, memory_parts,
                                  model_layer_costs, split_stages, stage_transfer_s, state_bytes)
from planner.hardware.profiles import Cluster
from planner.cost.memory import ACT_BYTES, fragmentation
from planner.model.spec import ModelSpec
from planner.partition.problem import Partition, PartitionProblem, equal_param_split, fixed_split
from planner.partition.solve import partition
from planner.partition.dp import partition_dp
from planner.core.parallel import RECOMPUTE_MODES, Parallel
from planner.stack import Stack

METHODS = ("ilp", "dp")


@dataclass(frozen=True)
class Split:
    bounds: tuple[tuple[int, int], ...]
    recompute: tuple[str, ...]
    partition: Partition | None  # None for a fixed (even) split


def allowed_modes(par: Parallel, opts: Stack, exact: bool = False) -> tuple[str, ...]:
    """The recompute modes a stage may use: exactly the configuration's (a user's pin), or any
    up to it, so the partitioner can spare the stages with memory to spare (flash attention
    already drops the scores, so 'selective' adds nothing there)."""
    if exact:
        return (par.recompute,)
    modes = RECOMPUTE_MODES[: RECOMPUTE_MODES.index(par.recompute) + 1]
    return tuple(m for m in modes if not (m == "selective" and opts.flash_attention))


def usable_bytes(cluster: Cluster, recompute: bool) -> float:
    """Bytes of tensors a GPU can hold: its memory less the framework's reserve and the
    allocator's fragmentation."""
    return (cluster.hardware.memory_bytes - constants.RESERVED_BYTES) * (
        1 - fragmentation(recompute))


def _layer_states(params, par: Parallel, opts: Stack):
    """Model-state bytes of each layer (or of a parameter total: the formula is linear), plus
    the layer's 16-bit weights when ZeRO-3 gathers a whole stage at a time."""
    states = state_bytes(params, par, opts)
    if par.zero >= 3 and opts.zero3_gather == "stage":
        states = states + ACT_BYTES * params
    return states


def _memory_terms(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                  tables: dict[str, CostTable], recompute_fragmentation: bool = False):
    """(in-flight microbatches per chunk, kept stage outputs per rank, capacity for states and
    activations): evaluate.memory_parts' terms that do not depend on the split. The capacity
    sets aside the largest transient of any layer and mode, with ZeRO-3's gathered layers."""
    inflight = np.array(inflight_closed_form(par.schedule, par.pp, par.num_microbatches,
                                             par.virtual_stages), dtype=float)
    transient = max(float(tables[m].work_bytes.max()) for m in tables)
    if par.zero >= 3 and opts.zero3_gather == "layer":
        transient += float(gathered_bytes(model, par, opts, np.zeros(1))[0])
    kept = kept_outputs(model, par, inflight, opts).reshape(-1, par.pp).sum(axis=0)
    capacity = max(usable_bytes(cluster, recompute_fragmentation) - transient, 0.0)
    return inflight, kept, capacity


def partition_problem(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                      tables: dict[str, CostTable],
                      recompute_fragmentation: bool = False) -> PartitionProblem:
    """The memory formula is evaluate.memory_parts' own, per layer: model states (plus the whole
    stage's 16-bit weights when ZeRO-3 gathers a stage at a time), activations per in-flight
    microbatch, the kept stage outputs of a pipeline engine that keeps them (per rank), and the
    largest transient (_memory_terms) set aside from the capacity. Only the tied-embedding
    saving of a single chunk is left out (conservative)."""
    modes = tuple(tables)
    costs = {m: tables[m].costs for m in modes}
    time_s = np.array([[c.total_s for c in costs[m]] for m in modes]).T
    act = np.array([[c.act_bytes for c in costs[m]] for m in modes]).T
    params = np.array([c.params for c in costs[modes[0]]], dtype=float)
    inflight, kept, capacity = _memory_terms(model, cluster, par, opts, tables,
                                             recompute_fragmentation)
    return PartitionProblem(
        time_s=time_s, state_bytes=_layer_states(params, par, opts), act_bytes=act,
        inflight=inflight, capacity_bytes=capacity, modes=modes,
        boundary_s=2 * np.array(stage_transfer_s(model, par, cluster, opts)),
        extra_bytes=kept if kept.any() else None)


def may_fit(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
            tables: dict[str, CostTable], even_stages: Stages | None = None) -> bool:
    """A cheap necessary condition for the partitioner to fit this configuration (the search's
    memory screen: it never rejects what the partitioner can fit; tests/test_stack_pricing.py
    checks it against --explain). Interleaved chunks are not partitioned (best_split keeps them
    even), so their condition is the even split's own memory with one microbatch held per
    chunk, which every schedule holds at its first backward, and the light fragmentation.
    Otherwise, with S the model states, A the activations under the lightest mode each layer
    allows, f_r the in-flight microbatches of rank r and C the partitioner's capacity, any
    split has max_r (S_r + f_r A_r) >= sum_r w_r (S_r + f_r A_r) for weights w_r >= 0 summing
    to 1: w_r = 1/p gives (S + min f · A)/p, w_r proportional to 1/f_r gives
    (S/max f + A)/sum(1/f_r). Both bounds, plus the least kept-output bytes of any rank, must
    be within C (the light fragmentation's, which the partitioner tries first).
    ``even_stages``: the even split's stage totals when the caller has them."""
    if par.virtual_stages > 1:
        stages = even_stages
        if stages is None:
            mode = par.recompute
            table = tables.get(mode) or CostTable(model_layer_costs(model, par, cluster.hardware,
                                                                    opts, mode))
            stages = split_stages({mode: table}, even_block_bounds(model, par.num_chunks),
                                  [mode] * par.num_chunks)
        parts = memory_parts(model, par, stages, np.ones(par.num_chunks), opts)
        held = sum(v for k, v in parts.items() if k not in ("fragmentation", "reserved"))
        return bool((held / (1 - fragmentation(False)) + constants.RESERVED_BYTES).max()
                    <= cluster.hardware.memory_bytes)
    inflight, kept, capacity = _memory_terms(model, cluster, par, opts, tables)
    any_table = next(iter(tables.values()))
    total_s = float(_layer_states(any_table.prefix["params"][-1], par, opts))
    total_a = float(np.minimum.reduce([np.diff(t.prefix["act_bytes"])
                                       for t in tables.values()]).sum())
    f = inflight
    bound = max((total_s + f.min() * total_a) / len(f),
                (total_s / f.max() + total_a) / float((1 / f).sum())) + float(kept.min())
    return bound <= capacity * (1 + 1e-9)


def cost_tables(model: ModelSpec, par: Parallel, hw, opts: Stack, profile=None,
                known: dict | None = None, exact: bool = False) -> dict[str, CostTable]:
    """Cost tables for every mode the configuration allows (reusing ``known`` ones)."""
    known = known or {}
    return {m: known.get(m) or CostTable(model_layer_costs(model, par, hw, opts, m, profile))
            for m in allowed_modes(par, opts, exact)}


def best_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
               tables: dict[str, CostTable], method: str = "dp", lp_path=None) -> Split:
    """The compute-balanced split under memory. Interleaved chunks stay even: Megatron's
    interleaved schedule wants the same layer count in every virtual stage."""
    if par.virtual_stages > 1:
        bounds = tuple(even_block_bounds(model, par.num_chunks))
        return Split(bounds, (par.recompute,) * par.num_chunks, None)
    if method == "ilp":
        return _solved(lambda problem: partition(problem, par.num_chunks, par.pp,
                                                 lp_path=lp_path),
                       model, cluster, par, opts, tables)
    return _solved(lambda problem: partition_dp(problem, par.num_chunks, par.pp),
                   model, cluster, par, opts, tables)


def param_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                tables: dict[str, CostTable]) -> Split:
    """The common hand-made split: equal parameter counts per stage, each stage with its
    fastest recompute mode that fits."""
    params = [c.params for c in next(iter(tables.values())).costs]
    return _solved(lambda problem: equal_param_split(problem, par.num_chunks, par.pp, params,
                                                     None),
                   model, cluster, par, opts, tables)


def megatron_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                   tables: dict[str, CostTable]) -> Split:
    """Megatron's default even split, each stage with its fastest recompute mode that fits."""
    ends = [b for _, b in even_block_bounds(model, par.num_chunks)]
    return _solved(lambda problem: fixed_split(problem, ends, par.pp, None),
                   model, cluster, par, opts, tables)


def _solved(solve, model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
            tables: dict[str, CostTable]) -> Split:
    """Split with the allocator's light fragmentation; when the answer recomputes anywhere,
    split again with the larger share recompute costs (planner/constants.py), so no stage
    is promised memory its rank does not have."""
    result = solve(partition_problem(model, cluster, par, opts, tables))
    if any(c.recompute != "none" for c in result.chunks):
        result = solve(partition_problem(model, cluster, par, opts, tables,
                                         recompute_fragmentation=True))
    return _as_split(result)


def _as_split(result: Partition) -> Split:
    return Split(tuple((c.first, c.last_exclusive) for c in result.chunks),
                 tuple(c.recompute for c in result.chunks), result)
