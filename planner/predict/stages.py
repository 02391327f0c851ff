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
from planner.cost.layer import RunOptions
from planner.predict.step import (CostTable, even_block_bounds, inflight_closed_form, model_layer_costs,
                              stage_transfer_s, state_bytes)
from planner.hardware.profiles import Cluster
from planner.cost.memory import fragmentation
from planner.model.spec import ModelSpec
from planner.partition.problem import Partition, PartitionProblem, equal_param_split, fixed_split
from planner.partition.solve import partition
from planner.partition.dp import partition_dp
from planner.core.parallel import RECOMPUTE_MODES, Parallel

METHODS = ("ilp", "dp")


@dataclass(frozen=True)
class Split:
    bounds: tuple[tuple[int, int], ...]
    recompute: tuple[str, ...]
    partition: Partition | None  # None for a fixed (even) split


def allowed_modes(par: Parallel, opts: RunOptions, exact: bool = False) -> tuple[str, ...]:
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


def partition_problem(model: ModelSpec, cluster: Cluster, par: Parallel, opts: RunOptions,
                      tables: dict[str, CostTable],
                      recompute_fragmentation: bool = False) -> PartitionProblem:
    modes = tuple(tables)
    costs = {m: tables[m].costs for m in modes}
    time_s = np.array([[c.total_s for c in costs[m]] for m in modes]).T
    act = np.array([[c.act_bytes for c in costs[m]] for m in modes]).T
    states = state_bytes(np.array([c.params for c in costs[modes[0]]], dtype=float), par, opts)
    transient = max(max(c.work_bytes for c in costs[m]) for m in modes)
    return PartitionProblem(
        time_s=time_s, state_bytes=states, act_bytes=act,
        inflight=np.array(inflight_closed_form(par.schedule, par.pp, par.num_microbatches,
                                               par.virtual_stages), dtype=float),
        capacity_bytes=max(usable_bytes(cluster, recompute_fragmentation) - transient, 0.0),
        modes=modes,
        boundary_s=2 * np.array(stage_transfer_s(model, par, cluster, opts)))


def cost_tables(model: ModelSpec, par: Parallel, hw, opts: RunOptions, profile=None,
                known: dict | None = None, exact: bool = False) -> dict[str, CostTable]:
    """Cost tables for every mode the configuration allows (reusing ``known`` ones)."""
    known = known or {}
    return {m: known.get(m) or CostTable(model_layer_costs(model, par, hw, opts, m, profile))
            for m in allowed_modes(par, opts, exact)}


def best_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: RunOptions,
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


def param_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: RunOptions,
                tables: dict[str, CostTable]) -> Split:
    """The common hand-made split: equal parameter counts per stage, each stage with its
    fastest recompute mode that fits."""
    params = [c.params for c in next(iter(tables.values())).costs]
    return _solved(lambda problem: equal_param_split(problem, par.num_chunks, par.pp, params,
                                                     None),
                   model, cluster, par, opts, tables)


def megatron_split(model: ModelSpec, cluster: Cluster, par: Parallel, opts: RunOptions,
                   tables: dict[str, CostTable]) -> Split:
    """Megatron's default even split, each stage with its fastest recompute mode that fits."""
    ends = [b for _, b in even_block_bounds(model, par.num_chunks)]
    return _solved(lambda problem: fixed_split(problem, ends, par.pp, None),
                   model, cluster, par, opts, tables)


def _solved(solve, model: ModelSpec, cluster: Cluster, par: Parallel, opts: RunOptions,
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
