"""The search: every configuration of the space screened, the best refined, all ranked.

Screening predicts each configuration of planner/space.py with the closed-form evaluation (even
split); every rejection is counted by reason. Candidates are then refined (stage partition,
schedule simulation) by branch and bound: in screen order, skipping every one whose lower bound
(planner/search/bound.py) cannot enter the top list, then (``--refine auto``, the default) lowest
bound first until no configuration left could beat plan 1, so plan 1 is what refining every
screened configuration would give (benchmarks/bench_regret.py measures it). Plans are ranked by step time,
ties broken by lower memory, then by the configuration itself, so the same inputs always give the
same ranking.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

from planner.cost import constants
from planner.cost.zero import fp8_gathered
from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.predict.step import evaluate, predict, predict_plan
from planner.predict.chunks import CostTable, ChunkArrays, even_block_bounds, split_stages
from planner.predict.layer_costs import cp_crosses, model_layer_costs
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.partitioning.problem import PartitionError
from planner.partitioning.split import fits
from planner.core.parallel import RECOMPUTE_MODES, SCHEDULES, Parallel
from planner.core.schedules import DEFAULT_SCHEDULE
from planner.predict.plan import Plan
from planner.search.bound import Bound, layer_times, step_bound
from planner.search.chunk_bound import chunk_bound
from planner.search.dualpipe_bound import least_pair_compute_s
from planner.search.space import (MOE_NEEDS_SP, Pins, Request, enumerate_configs, exact_recompute,
                                  launcher_rule, microbatches, pinned_recompute, schedule_rule,
                                  stack_rule, tp_rule, validate_pins)
from planner.predict.stages import (BLOCK_PIN, allowed_modes, best_split, may_fit, megatron_split,
                                    one_block_count, partition_problem)

__all__ = ["Pins", "Request", "SearchResult", "search", "explain", "enumerate_configs",
           "validate_pins", "tp_rule"]


@dataclass(frozen=True)
class SearchResult:
    """The ranked plans and where every configuration considered went, in whole configurations:

        considered = sum(rejected) + not_refined + feasible     (``accounted`` checks it)
        feasible   = len(plans) + folded + below_top

    ``not_refined``: fit at screening but slower than the ``refine`` best; ``folded``: feasible
    plans equal to a better one but for the ZeRO stage or recompute its stages do not use."""

    plans: tuple[Plan, ...]
    rejected: dict[str, int]
    screened: int
    elapsed_s: float
    notes: tuple[str, ...] = field(default=())
    refined: int = 0  # configurations partitioned and simulated
    considered: int = 0
    not_refined: int = 0
    feasible: int = 0
    folded: int = 0

    @property
    def below_top(self) -> int:
        return self.feasible - self.folded - len(self.plans)

    @property
    def accounted(self) -> bool:
        return (self.considered == sum(self.rejected.values()) + self.not_refined + self.feasible
                and self.below_top >= 0)


def capacity_bytes(cluster: Cluster) -> float:
    return cluster.hardware.memory_bytes


def _rank_key(par: Parallel, step_s: float, memory_bytes: float):
    """Fastest first, then least memory, then the configuration itself: a total order, so the
    same inputs always give the same ranking."""
    return (round(step_s, 9), round(memory_bytes), par.tp, par.pp, par.micro_batch,
            SCHEDULES.index(par.schedule), par.virtual_stages,
            RECOMPUTE_MODES.index(par.recompute), par.zero, par.sequence_parallel, par.ep,
            par.expert_tp)


def _plan_key(plan: Plan):
    return _rank_key(plan.parallel, plan.metrics.step_time_s, plan.metrics.peak_memory_bytes)


class _Costs:
    """Layer-cost tables and even-split stage totals shared by the configurations of a search."""

    def __init__(self, req: Request):
        self.req = req
        self.tables: dict = {}
        self.stages: dict = {}
        self.simulations: dict = {}
        self.bounds: dict = {}
        self.layer_times: dict = {}
        self.chunk_bounds: dict = {}
        self.problems: dict = {}
        self.refinements = 0  # configurations refined
        self.refined_groups = 0  # of them, distinct up to ZeRO

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
            if self.chunk_bounds[key] + rest > value:
                return True
        return False

    def shape_key(self, par: Parallel) -> tuple:
        """What a layer's cost depends on besides SP, micro-batch, recompute and the expert
        split: tp, cp, whether the CP group leaves the NVLink domain, and what the ZeRO stage
        changes in it (predict/step.py model_layer_costs: FP8 weights gathered in FP8, the
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
        except PartitionError as exc:
            if not par.schedule_traits.mirrored:
                return "memory (no stage split fits)"
            # DualPipe's stages of a model whose layers differ (the boundary MILP) may find no
            # split in the time limit: Megatron's even split where it fits, labelled so
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


def search(req: Request, progress=None) -> SearchResult:
    """Screen every configuration, keep the ones that fit, rank them (best first)."""
    validate_pins(req)
    start = time.perf_counter()
    rejected: Counter = Counter()
    configs = list(enumerate_configs(req, rejected))
    capacity = capacity_bytes(req.cluster)
    costs = _Costs(req)
    kept = screen(req, costs, configs, rejected, progress)
    considered = sum(rejected.values()) + len(kept)  # before refinement rejects some kept ones
    refined, notes = _branch_and_bound(req, costs, kept, rejected, capacity)
    not_refined = len(kept) - costs.refinements  # each kept configuration is refined at most once
    if not refined:
        raise NoFeasiblePlan(_no_plan_message(req, rejected, considered, not_refined),
                             dict(rejected))
    refined.sort(key=_plan_key)
    plans, hidden = _distinct(refined)
    return SearchResult(plans=tuple(plans[: req.top]), rejected=dict(sorted(rejected.items())),
                        screened=len(configs), elapsed_s=time.perf_counter() - start,
                        notes=tuple(notes), refined=costs.refinements, considered=considered,
                        not_refined=not_refined, feasible=len(refined), folded=hidden)


def screen(req: Request, costs: "_Costs", configs: list[Parallel], rejected: Counter,
           progress=None) -> list[Parallel]:
    """The configurations kept by the closed-form screen, in screen order (those Megatron's even
    split fits first, then by predicted step); rejections counted in ``rejected``."""
    capacity = capacity_bytes(req.cluster)
    kept = []
    for n, par in enumerate(configs):
        if progress and n % 256 == 0:
            progress(n, len(configs))
        even = costs.even_stages(par)
        pred = predict(req.model, req.cluster, par, req.options, even)
        even_fits = pred.peak_memory_bytes <= capacity
        # the even split's memory ranks the candidates; only the partitioner's own necessary
        # condition rejects one, so the screen never drops what a stage split could fit
        if not even_fits and not may_fit(req.model, req.cluster, par, req.options,
                                         costs.known(par), even):
            rejected["memory"] += 1
        elif req.max_bubble is not None and pred.bubble > req.max_bubble:
            rejected["bubble above limit"] += 1
        else:
            kept.append(((not even_fits,) + _rank_key(par, pred.step_s, pred.peak_memory_bytes),
                         par))
    if progress:
        progress(len(configs), len(configs))
    kept.sort(key=lambda item: item[0])
    return [par for _, par in kept]


def _branch_and_bound(req: Request, costs: "_Costs", ranked: list[Parallel], rejected: Counter,
                      capacity: float) -> tuple[list[Plan], list[str]]:
    """Branch and bound over the screened configurations, each refined with every ZeRO stage
    (the simulated memory decides which fit).  A configuration is skipped when its lower bound
    (planner/search/bound.py) exceeds the ``top``-th best step refined so far: it cannot enter
    the list, so the list is the one refining every screened configuration would give (ties
    aside).  Candidates go in screen order: the screen finds a near-best incumbent early, and so proves
    the best with fewer refinements than going best bound first (measured: 4 against 19 for
    llama3-8b on 16 GPUs, 41 against 75 for llama3-405b on 1,024).  The cheap bound is tried
    before the one with memory, which builds the partition problem.  ``req.refine`` = K caps
    how many configurations (up to ZeRO) are refined, and a note says what the cap left
    unproven; None (``--refine auto``) refines the first ``AUTO_FIRST`` so, then whatever could
    still beat plan 1, lowest bound first, until plan 1 is proven (`_refine_until_proven`)."""
    groups = [(min(costs.bound(par).cheap_s for par in variants), variants)
              for variants in _zero_groups(ranked)]
    refined: list[Plan] = []
    best_of_group: list[float] = []  # best refined step of each configuration-up-to-ZeRO
    capped: list[list[Parallel]] = []  # not refined for the cap alone
    start = time.process_time()  # --refine auto's budget counts from the first refinement
    for cheap, variants in groups:
        best = sorted(best_of_group)
        incumbent = best[req.top - 1] if len(best) >= req.top else float("inf")
        if cheap > incumbent:
            continue
        alive = [par for par in variants if not costs.bound(par).exceeds(incumbent)
                 and not costs.bound(par, with_memory=True).exceeds(incumbent)]
        if not alive:
            continue
        if costs.refined_groups >= (AUTO_FIRST if req.refine is None else req.refine) or (
                req.refine is None and best_of_group
                and time.process_time() - start > AUTO_BUDGET_S):
            capped.append(alive)
            continue
        _refine_group(req, costs, alive, refined, best_of_group, rejected, capacity)
    best = sorted(best_of_group)
    stopped = None  # what ended the adaptive refinement before its proof, if anything
    was_capped = bool(capped)
    if req.refine is None and capped:
        stopped = _refine_until_proven(req, costs, capped, refined, best_of_group, rejected,
                                       capacity, start)
        best = sorted(best_of_group)
    open_best = [par for alive in capped for par in alive
                 if best and not costs.bound(par, with_memory=True).exceeds(best[0])]
    open_best = _unproven(costs, open_best, best[0]) if best else open_best
    return refined, _notes(req, costs, was_capped, open_best, bool(best), stopped)


def _refine_until_proven(req: Request, costs: "_Costs", capped: list[list[Parallel]],
                         refined: list[Plan], best_of_group: list[float], rejected: Counter,
                         capacity: float, start: float) -> str | None:
    """``--refine auto``: refine what the first ``AUTO_FIRST`` left, lowest bound first, every
    configuration whose lower bound (the closed forms, then the chunks' relaxation) is below plan
    1, until none is left: plan 1 is then the best of every screened configuration, whatever rank
    the screen gave it.  ``capped`` is emptied of what gets refined or proven slower.  A budget
    of ``AUTO_BUDGET_S`` CPU seconds stops it where the proof would take longer (a search on a
    shared machine then answers the same as alone); the reason is returned, None when the proof
    ended it.  The chunks' mixed-integer program, which costs about what a refinement does (tens
    of milliseconds on 8 to 32 chunks, measured on benchmarks/bench_regret.py's interleaved
    cases), is tried only until the first configuration it cannot rule out: from there each
    refinement also lowers the incumbent, and the linear relaxation alone prunes (measured on
    megatron-1.7b, 8 x A100-80GB, interleaved: 2.6 s of CPU to the proof against over 5 s with
    the program throughout); while it holds, a proof costs what the fixed cap's did.  The budget
    counts from ``start``, the search's first refinement: refinements that cost seconds each
    (DualPipe's MILP over dense and MoE layers) stop the first pass too, once a plan fits."""
    order = sorted(capped, key=lambda alive: min(costs.bound(par, with_memory=True).cheap_s
                                                 for par in alive))
    capped.clear()
    refining = False  # whether the proof without refining more has failed
    for n, alive in enumerate(order):
        incumbent = min(best_of_group, default=float("inf"))
        if min(costs.bound(par, with_memory=True).cheap_s for par in alive) > incumbent:
            return None  # bound order: every later one is slower too
        open_ = [par for par in alive if not costs.bound(par).exceeds(incumbent)
                 and not costs.bound(par, with_memory=True).exceeds(incumbent)
                 and not costs.chunks_exceed(par, incumbent * (1 - TIE_RTOL),
                                             linear_only=refining)]
        if not open_:
            continue
        if time.process_time() - start > AUTO_BUDGET_S:
            capped.extend(order[n:])
            return f"its time budget ({AUTO_BUDGET_S:g} s of CPU)"
        refining = True
        _refine_group(req, costs, open_, refined, best_of_group, rejected, capacity)
    return None


def _refine_group(req: Request, costs: "_Costs", alive: list[Parallel], refined: list[Plan],
                  best_of_group: list[float], rejected: Counter, capacity: float) -> None:
    """Refine one configuration's ZeRO variants: the plans that fit go to ``refined``, their
    best step to ``best_of_group``, the rest to ``rejected`` by reason."""
    costs.refined_groups += 1
    steps = []
    for par in alive:
        plan = costs.refined(par)
        if isinstance(plan, str):
            rejected[plan] += 1
        elif plan.metrics.peak_memory_bytes > capacity:
            rejected["memory (simulated in-flight)"] += 1
        elif req.max_bubble is not None and plan.metrics.bubble_fraction > req.max_bubble:
            rejected["bubble above limit"] += 1
        else:
            refined.append(plan)
            steps.append(plan.metrics.step_time_s)
    if steps:
        best_of_group.append(min(steps))


def _notes(req: Request, costs: "_Costs", capped: bool, open_best: list[Parallel],
           found: bool, stopped: str | None) -> list[str]:
    """What the output says about the proof of plan 1 (nothing when every candidate was
    refined or bounded out within the first pass)."""
    if open_best or (capped and not found):
        why = (f"--refine {req.refine}" if req.refine is not None else stopped)
        fix = ("raise --refine" if req.refine is not None else
               "pass --refine K to refine up to K configurations with no time limit")
        return [f"refinement stopped at {why}: {len(open_best)} configurations whose lower "
                f"bound is below plan 1 were not refined, so a faster plan may exist ({fix})"]
    if capped:
        how = (f"the {req.refine} refined (--refine)" if req.refine is not None else
               f"the {costs.refined_groups} refined (--refine auto: until plan 1 is proven)")
        return [f"plan 1 is proven the fastest of all screened configurations (to "
                f"{TIE_RTOL:.2%}); the rest of the list is the best of {how}"]
    return []


# --refine auto: the configurations refined in screen order before the rest goes lowest bound
# first (the fixed cap's old default, under which most searches are already proven: the screen
# finds a near-best incumbent early), and the CPU seconds the rest may take before the output
# says what is left unproven.  Set to "a few seconds" of waiting before any result; kept after
# looking at benchmarks: 1 s would bring gpt3-175b on 1,024 GPUs under 2 s but left 1.5% regret
# on a bench_regret case (megatron-1.7b on 8 GPUs, interleaved), so the budget stays at 5 s.
AUTO_FIRST = 20
AUTO_BUDGET_S = 5.0

# Chunks up to which the chunk bound's mixed-integer program is tried after its linear one:
# beyond, it ran into its time limit (0.1 s) on gpt3-175b's 48 to 96 chunks, several times what
# refining the configuration costs (measured on benchmarks/bench_solve.py's cases)
MILP_CHUNKS = 32

# A configuration the chunk bound puts within this share of plan 1 counts as a tie, not as
# faster: the bound is a solver's (chunk_bound.MIP_GAP, and chunk_bound.SAFETY kept below its
# answer), so a configuration that refines to plan 1 itself (a recompute mode allowed but
# unused) is bounded just under it.
TIE_RTOL = 1e-4


def _unproven(costs: "_Costs", open_best: list[Parallel], best: float) -> list[Parallel]:
    """What the cap left below plan 1, bounded once more: interleaved and 1F1B chunks by their
    own relaxation (planner/search/chunk_bound.py: a linear, then a mixed-integer program, a few
    to a hundred milliseconds each, so spent on what the cap leaves rather than on every
    candidate).  Lowest bound first, and only until one stays below plan 1: from there plan 1
    is unproven whatever the rest give, and the rest are counted with the bounds they have."""
    ordered = sorted(open_best, key=lambda par: costs.bound(par, with_memory=True).cheap_s)
    for n, par in enumerate(ordered):
        if not costs.chunks_exceed(par, best * (1 - TIE_RTOL)):
            return ordered[n:]
    return []


def _zero_groups(ranked: list[Parallel]) -> list[list[Parallel]]:
    """The configurations grouped up to their ZeRO stage, groups in the order of their best."""
    groups: dict = {}
    for par in ranked:
        groups.setdefault(replace(par, zero=0), []).append(par)
    return list(groups.values())


def _distinct(plans: list[Plan]) -> tuple[list[Plan], int]:
    """Keep the best plan of each configuration that differs in more than the ZeRO stage or the
    recompute it allows but none of its stages uses: a ZeRO-2 twin of a ZeRO-1 plan at the same
    speed, or a "full recompute allowed" plan whose stages all chose none, tells the user nothing
    new (and looked like a duplicate row)."""
    seen, out = set(), []
    for plan in plans:
        key = (replace(plan.parallel, zero=0, recompute="none"),
               tuple((s.recompute, s.recompute_layers) for s in plan.stages))
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out, len(plans) - len(out)


def check_profile_matches(profile, model: ModelSpec) -> None:
    if len(profile.layers) != len(model.layers) or profile.model_name != model.name:
        raise PlanInputError(
            f"the profile is of {profile.model_name} ({len(profile.layers)} layers), not of "
            f"{model.name} ({len(model.layers)} layers): profile this model or pass --model "
            f"{profile.model_name}")


def analytical_comparison(req: Request, plan: Plan) -> str:
    """The best plan's step time from the measured profile beside the analytical model's."""
    p = plan.parallel
    analytical = evaluate(req.model, req.cluster, p, req.options,
                          bounds=[(s.first, s.last) for s in plan.stages],
                          recompute_per_chunk=[s.recompute for s in plan.stages],
                          recompute_layers=[s.recompute_layers for s in plan.stages],
                          simulated=True)
    return (f"step time of plan 1: {plan.metrics.step_time_s:.3f} s from the measured profile "
            f"({req.profile.device_name}, {req.profile.dtype}), "
            f"{analytical.metrics.step_time_s:.3f} s from the analytical model of "
            f"{req.cluster.hardware.name}. Compute times and MFU's peak come from the profile"
            + (" (its measured matmul peak)" if getattr(req.profile, "peak_flops", None) else
               f" (no measured peak in it: {req.cluster.hardware.name}'s)")
            + f"; memory and links from {req.cluster.hardware.name} (for a cluster of the "
            "profiled device, pass --hardware with the file `plan profile --calibrate` writes on "
            "it)")


@dataclass(frozen=True)
class Explanation:
    """One pinned configuration: its prediction, whether it fits, and why not if not."""

    parallel: Parallel | None
    plan: Plan | None
    capacity_bytes: float
    rule: str | None  # a rule that forbids it before any prediction
    # why no stage split fits (the plan is then Megatron's even split, to show by how much)
    no_split: str | None = None
    # per pipeline rank, bytes by part (planner/evaluate.py MEMORY_PARTS)
    memory_parts: dict | None = None
    # per pipeline rank, reserved on ZeRO-3's side streams beside the parts (not in what must
    # fit: planner/cost/side_streams.py)
    side_stream_bytes: tuple[float, ...] = ()

    @property
    def fits(self) -> bool:
        return (self.rule is None and self.plan is not None and self.no_split is None
                and self.plan.metrics.peak_memory_bytes <= self.capacity_bytes)


def explain(req: Request) -> Explanation:
    """Evaluate the pinned configuration (defaults for what is not pinned: 1f1b, v = 1, no
    recompute, ZeRO-1, SP when tp > 1), whatever its fate in the search."""
    validate_pins(req)
    pins, gpus = req.pins, req.cluster.gpus
    capacity = capacity_bytes(req.cluster)
    tp, pp, cp = pins.tp or 1, pins.pp or 1, pins.cp or 1
    dp = pins.dp or gpus // (tp * cp * pp)
    mb = pins.micro_batch or 1
    if tp * cp * pp * dp != gpus:
        return Explanation(None, None, capacity,
                           f"tp {tp} x cp {cp} x pp {pp} x dp {dp} != {gpus} GPUs: pin them "
                           "consistently")
    rule = tp_rule(req.model, req.cluster, tp)
    m = microbatches(req, mb * dp)
    if m is None:
        rule = rule or f"global batch {req.batch} is not a multiple of micro-batch x dp = {mb * dp}"
        m = 1
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=m,
                   schedule=pins.schedule or DEFAULT_SCHEDULE, virtual_stages=pins.virtual_stages or 1,
                   recompute=pinned_recompute(pins.recompute) or "none",
                   zero=1 if pins.zero is None else pins.zero,
                   sequence_parallel=tp > 1 if pins.sequence_parallel is None
                   else pins.sequence_parallel, cp=cp,
                   ep=pins.ep or 1, etp=None if pins.etp in (None, tp) else pins.etp)
    if rule is None and req.model.is_moe and tp > 1 and not par.sequence_parallel:
        rule = MOE_NEEDS_SP
    if rule is None:
        rule = stack_rule(req.options, par) or schedule_rule(req.model, par)
    if rule is None and req.runs_on:
        rule = launcher_rule(req, par)
    if rule is not None and rule.startswith("TP across"):
        domain = req.cluster.nvlink_domain
        rule = (f"TP {tp} crosses nodes: it must divide the {domain} GPUs of a node"
                if domain == req.cluster.gpus_per_node else
                f"TP {tp} crosses NVLink domains: it must divide the {domain} GPUs of a domain")
    if rule is not None:
        return Explanation(par, None, capacity, rule)
    plan = _Costs(req).refined(par)
    no_split = None
    if isinstance(plan, str):  # no split fits: show how far Megatron's even split is over
        no_split = plan
        plan = evaluate(req.model, req.cluster, par, req.options, profile=req.profile,
                        simulated=True)
    _, pred = predict_plan(req.model, req.cluster, par, req.options,
                           bounds=[(s.first, s.last) for s in plan.stages],
                           recompute_per_chunk=[s.recompute for s in plan.stages],
                           recompute_layers=[s.recompute_layers for s in plan.stages],
                           profile=req.profile, simulated=True)
    parts = {k: [float(x) for x in v] for k, v in pred.memory_parts.items()}
    return Explanation(par, plan, capacity, None, no_split, parts,
                       tuple(float(x) for x in pred.side_stream_bytes))


STRUCTURAL = ("TP across", "more stages than layers", "schedule rule", "uneven interleaving", "heads not divisible",
              "KV heads not divisible", "FFN not divisible", "vocabulary not divisible")


def _no_plan_message(req: Request, rejected: Counter, considered: int, not_refined: int) -> str:
    gib = (capacity_bytes(req.cluster) - constants.RESERVED_BYTES) / 1024**3
    reasons = ", ".join(f"{n} {r}" for r, n in rejected.most_common())
    # The hint follows the most common reason the user can act on: the structural rules (TP inside
    # a node and dividing the heads, no more stages than layers, the schedules' own rules) reject
    # much of every large space, counted in whole configurations, whether or not anything fits.
    actionable = Counter({r: n for r, n in rejected.items() if not r.startswith(STRUCTURAL)})
    top = (actionable or rejected).most_common(1)[0][0] if rejected else ""
    if top.startswith("memory"):
        hint = (f"the model does not fit in {gib:.0f} GiB per GPU with the options tried: add "
                "GPUs, allow recompute and ZeRO (drop pins) or use a larger GPU")
    elif top == "batch not divisible":
        hint = (f"the global batch ({req.batch}) cannot be split over this many data-parallel "
                "ranks: raise --global-batch, give --global-batch-range, or use fewer GPUs")
    else:
        hint = "relax the pins or limits that rejected the most"
    return (f"{req.model.name} on {req.cluster.gpus} x {req.cluster.hardware.name}: "
            f"{considered} configurations considered; rejected: {reasons or 'none'}"
            + (f"; {not_refined} more fit when screened but were not refined (raise --refine)"
               if not_refined else "") + f". {hint}")
