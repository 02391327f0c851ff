"""What a search knows about each configuration, computed once and shared by all of them.

The layer-cost tables (keyed by what a layer's cost depends on, so configurations that differ only
in ZeRO share them where they agree), the even split's stage totals the screen predicts with,
the lower bounds of planner/search/bound.py, chunk_bound.py and dualpipe_bound.py, the
partition problems, and the refinement of one configuration: its stage split (compute-balanced
under memory) simulated op by op.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost.zero import fp8_gathered
from planner.predict.step import evaluate
from planner.predict.chunks import CostTable, ChunkArrays, even_block_bounds, split_stages
from planner.predict.layer_costs import cp_crosses, model_layer_costs
from planner.partitioning.problem import PartitionError
from planner.partitioning.split import fits
from planner.core.parallel import Parallel
from planner.predict.plan import Plan
from planner.search.bound import Bound, layer_times, step_bound
from planner.search.chunk_bound import chunk_bound
from planner.search.dualpipe_bound import least_pair_compute_s
from planner.search.request import Request, exact_recompute
from planner.predict.stages import (BLOCK_PIN, allowed_modes, best_split, megatron_split,
                                    one_block_count, partition_problem)

# Chunks up to which the chunk bound's mixed-integer program is tried after its linear one:
# beyond, it ran into its limit (then 0.1 s; chunk_bound.NODE_LIMIT nodes now) on gpt3-175b's 48
# to 96 chunks, several times what refining the configuration costs (measured on
# benchmarks/bench_solve.py's cases)
MILP_CHUNKS = 32


class SearchCosts:
    """Layer-cost tables and even-split stage totals shared by the configurations of a search,
    with each configuration's bounds, partition problem and refined plan, each built once."""

    def __init__(self, req: Request):
        self.req = req
        self.tables: dict = {}
        self.stages: dict = {}
        self.simulations: dict = {}
        self.bounds: dict = {}
        self.layer_times: dict = {}
        self.chunk_bounds: dict = {}
        self.problems: dict = {}
        self.chunk_best: dict = {}  # the highest chunk bound found for a configuration
        self.refinements = 0  # configurations refined
        self.refined_groups = 0  # of them, distinct up to ZeRO
        self.solver_iterations = 0  # the simplex iterations their partition MILPs took

    def bound(self, par: Parallel, with_memory: bool = False) -> Bound:
        """A lower bound on the refined step time of ``par`` (planner/search/bound.py);
        ``with_memory`` adds what memory forces, which costs building the partition problem."""
        r = self.req
        modes = allowed_modes(r.model, par, r.options, exact_recompute(r))
        key = (par, with_memory)
        if key not in self.bounds:
            times_key = (*self.shape_key(par), par.sequence_parallel, par.micro_batch, modes,
                         par.ep, par.expert_tp)
            if times_key not in self.layer_times:
                self.layer_times[times_key] = layer_times({m: self.table(par, m) for m in modes})
            bound = step_bound(par, r.cluster, r.options, self.layer_times[times_key],
                               self.problem(par) if with_memory else None)
            if par.schedule_traits.mirrored:
                bound = self._dualpipe_bound(par, bound)
            self.bounds[key] = bound
        return self.bounds[key]

    def _dualpipe_bound(self, par: Parallel, bound: Bound) -> Bound:
        """DualPipe's bound (planner/search/bound.py's pipeline terms count one stage per rank
        and the all-to-all its pairs hide): rank r runs M/2 microbatches of stages r and
        p - 1 - r, each F and B at least its compute (an F&B pair takes at least both computes:
        pipeline/dualpipe.py pair_s), so the step is at least M/2 x the busiest rank's pair,
        bounded for any split the partitioner may choose (search/dualpipe_bound.py); bound.py's
        data-parallel and optimizer part holds (it counts one stage's parameters of the two)."""
        pair = least_pair_compute_s(self.known(par), par.pp)
        pipeline = par.num_microbatches / 2 * pair
        return Bound(pipeline + bound.rest_s, bound.rest_s, None)

    def problem(self, par: Parallel):
        """The configuration's partition problem (its memory terms), built once."""
        if par not in self.problems:
            r = self.req
            self.problems[par] = partition_problem(r.model, r.cluster, par, r.options,
                                                   self.known(par))
        return self.problems[par]

    def chunks_exceed(self, par: Parallel, value: float, linear_only: bool = False) -> bool:
        """Whether the chunks' bound (planner/search/chunk_bound.py: its linear relaxation,
        then, unless ``linear_only``, the mixed-integer program; interleaved and 1F1B) proves
        every split of ``par`` slower than ``value``."""
        if not par.schedule_traits.steady_one_f_one_b or value == float("inf"):
            return False
        rest = self.bound(par).rest_s
        for whole in (False, True)[:2 if par.num_chunks <= MILP_CHUNKS and not linear_only else 1]:
            key = (par, whole, value - rest if whole else None)  # the MILP stops at the cutoff
            if key not in self.chunk_bounds:
                self.chunk_bounds[key] = chunk_bound(par, self.problem(par), self.known(par),
                                                     integer=whole, cutoff=value - rest)
            found = self.chunk_bounds[key] + rest
            self.chunk_best[par] = max(found, self.chunk_best.get(par, 0.0))
            if found > value:
                return True
        return False

    def lowest_bound(self, configs: list[Parallel]) -> float:
        """The least lower bound on the refined step of any of ``configs``, each bounded by the
        best it has: the closed forms with memory and the split inequalities
        (planner/search/bound.py, `Bound.value`), and its chunk bound where one was computed.
        In order of the cheap bound, and only until it passes the least found: a bound is at
        least its cheap part."""
        lowest = float("inf")
        for par in sorted(configs, key=lambda par: self.bound(par, with_memory=True).cheap_s):
            memory = self.bound(par, with_memory=True)
            if memory.cheap_s >= lowest:
                break
            lowest = min(lowest, max(memory.value(), self.bound(par).cheap_s,
                                     self.chunk_best.get(par, 0.0)))
        return lowest

    def shape_key(self, par: Parallel) -> tuple:
        """What a layer's cost depends on besides SP, micro-batch, recompute and the expert
        split: tp, cp, whether the CP group leaves the NVLink domain, and what the ZeRO stage
        changes in it (predict/layer_costs.py model_layer_costs: FP8 weights gathered in FP8, the
        gradient accumulation bytes), so configurations that differ only in ZeRO share tables
        exactly where those agree."""
        opts = self.req.options
        return (par.tp, par.cp, cp_crosses(par, self.req.cluster.hardware),
                fp8_gathered(par, opts), opts.accumulation_bytes(par.zero))

    def table(self, par: Parallel, mode: str) -> CostTable:
        key = (*self.shape_key(par), par.sequence_parallel, par.micro_batch, mode, par.ep,
               par.expert_tp)
        if key not in self.tables:
            r = self.req
            self.tables[key] = CostTable(model_layer_costs(r.model, par, r.cluster.hardware, r.options,
                                                     mode, r.profile))
        return self.tables[key]

    def known(self, par: Parallel) -> dict:
        """The cost tables of every recompute mode this configuration's stages may use."""
        r = self.req
        return {m: self.table(par, m) for m in allowed_modes(r.model, par, r.options,
                                                              exact_recompute(r))}

    def even_stages(self, par: Parallel) -> ChunkArrays:
        key = (*self.shape_key(par), par.sequence_parallel, par.micro_batch, par.recompute,
               par.num_chunks, par.ep, par.expert_tp)
        if key not in self.stages:
            bounds = even_block_bounds(self.req.model, par.num_chunks)
            self.stages[key] = split_stages({par.recompute: self.table(par, par.recompute)},
                                            bounds, [par.recompute] * par.num_chunks)
        return self.stages[key]

    def refined(self, par: Parallel) -> Plan | str:
        """Partition (compute-balanced under memory) and simulate one configuration; a
        rejection reason when no split fits."""
        r = self.req
        self.refinements += 1
        known = self.known(par)
        try:
            split = best_split(r.model, r.cluster, par, r.options, known, r.partition_method)
            self.solver_iterations += split.partition.work
        except PartitionError as exc:
            if not par.schedule_traits.mirrored:
                return "memory (no stage split fits)"
            # DualPipe's stages of a model whose layers differ (the boundary MILP) may find no
            # split within its node limit: Megatron's even split where it fits, labelled so
            split = megatron_split(r.model, r.cluster, par, r.options, known)
            if not fits(split.partition):
                return "memory (no stage split fits)"
            split = replace(split, partition=replace(  # (a given split: no gap to report)
                split.partition, method="even", optimal=True, note=f"the partitioner: {exc}"))
        split = self._launchable(split)
        plan = self._simulated(par, split, known)
        label = split.how
        several = par.schedule_traits.chunks_per_rank(par.virtual_stages) > 1  # chunks a rank
        if several and split.partition.method != "even":
            # The partitioner ranks interleaved splits by their largest chunk, then their busiest
            # rank; the schedule's steady state also stalls on chunks that differ in size, which
            # neither sees (partitioning/largest_chunk.py): where Megatron's even split fits,
            # the faster of the two, both simulated.
            even = self._launchable(megatron_split(r.model, r.cluster, par, r.options, known))
            if fits(even.partition) and (even.bounds, even.recompute, even.recompute_layers) != (
                    split.bounds, split.recompute, split.recompute_layers):
                other = self._simulated(par, even, known)
                if other.metrics.step_time_s < plan.metrics.step_time_s:
                    label = (f"Megatron's even split, "
                             f"{1 - other.metrics.step_time_s / plan.metrics.step_time_s:.1%} "
                             f"faster when simulated than the partitioner's ({split.how})")
                    plan = other
        return replace(plan, notes=plan.notes + (f"stage split: {label}",))

    def _launchable(self, split):
        """The split as the plan's launcher runs it: under the block pin, one N of recomputed
        blocks on every stage (predict/stages.py one_block_count)."""
        r = self.req
        if exact_recompute(r) == BLOCK_PIN and r.runs_on is not None:
            return one_block_count(r.model, split)
        return split

    def _simulated(self, par: Parallel, split, known) -> Plan:
        """The plan of ``split``, simulated."""
        r = self.req
        return evaluate(r.model, r.cluster, par, r.options, bounds=list(split.bounds),
                        recompute_per_chunk=list(split.recompute), tables=known,
                        profile=r.profile, simulated=True, sim_cache=self.simulations,
                        recompute_layers=list(split.recompute_layers))
