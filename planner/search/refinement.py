"""Refinement by branch and bound: which screened configurations get partitioned and simulated.

In screen order, every configuration whose lower bound (planner/search/bound.py) cannot enter the
top list is skipped; then (``--refine auto``, the default) lowest bound first until no
configuration left could beat plan 1, so plan 1 is what refining every screened configuration
would give (benchmarks/bench_regret.py measures it); the notes say what a cap or the work budget
left unproven, and how far from the best plan 1 can then be.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from planner.core.parallel import Parallel
from planner.predict.plan import Plan
from planner.search.costs import SearchCosts
from planner.search.request import Request
from planner.search.space import CP_SEARCH_MIN_SEQ, MICRO_BATCHES, VIRTUAL_STAGES

# --refine auto: the configurations refined in screen order before the rest goes lowest bound
# first (the fixed cap's old default, under which most searches are already proven: the screen
# finds a near-best incumbent early), and the work the search may spend before the output says
# what is left unproven.  Work, not seconds (issue #32: a CPU-time budget made the answer depend
# on the machine and its load): one unit a configuration refined (partitioned and simulated),
# and one more for every ITERATIONS_PER_REFINEMENT simplex iterations its partition MILP took
# (HiGHS's count, Partition.work), which is where DualPipe over dense and MoE layers spends its
# seconds: a refinement costs about 13 ms of CPU and an iteration 0.15 to 0.3 ms, so 100
# iterations count as one.  Chosen with benchmarks/bench_solve.py and bench_regret.py in view,
# to stop about where the 5 s of CPU it replaces stopped on this project's 2-core machine: every
# bench_solve case is proven within 44 refinements, and the searches that ran out of 5 s
# (megatron-core listing DualPipe) run out of this: Qwen3-30B-A3B on 16 H100s refined 387
# configurations in 5 s and stops at 403 (5.1 s); DeepSeek-V3 on 2,048 H800s spends 1,216 units
# on its first 18 refinements (23 s: seconds each, at the root of their MILPs), where the time
# budget also stopped it, once a plan fit.
AUTO_FIRST = 20
AUTO_WORK = 400
ITERATIONS_PER_REFINEMENT = 100

# A configuration the chunk bound puts within this share of plan 1 counts as a tie, not as
# faster: the bound is a solver's (chunk_bound.MIP_GAP, and chunk_bound.SAFETY kept below its
# answer), so a configuration that refines to plan 1 itself (a recompute mode allowed but
# unused) is bounded just under it.
TIE_RTOL = 1e-4


def branch_and_bound(req: Request, costs: SearchCosts, ranked: list[Parallel], rejected: Counter,
                     capacity: float, later: list[Parallel] = ()) -> tuple[list[Plan], list[str]]:
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
    still beat plan 1, lowest bound first, until plan 1 is proven (`_refine_until_proven`).
    ``later``, the configurations bounded before they are screened (planner/search/space.py
    bounded_first), come after the screened ones, and only where they may beat plan 1
    (`_may_beat`)."""
    groups = [(min(costs.bound(par).cheap_s for par in variants), variants)
              for variants in _zero_groups(ranked)]
    refined: list[Plan] = []
    best_of_group: list[float] = []  # best refined step of each configuration-up-to-ZeRO
    capped: list[list[Parallel]] = []  # not refined for the cap alone
    for cheap, variants in groups:
        best = sorted(best_of_group)
        incumbent = best[req.top - 1] if len(best) >= req.top else float("inf")
        if cheap > incumbent:
            continue
        alive = [par for par in variants if not costs.bound(par).exceeds(incumbent)
                 and not costs.bound(par, with_memory=True).exceeds(incumbent)]
        if not alive:
            continue
        if _over_cap(req, costs, best_of_group):
            capped.append(alive)
            continue
        _refine_group(req, costs, alive, refined, best_of_group, rejected, capacity)
    for may_beat in _may_beat(costs, later, min(best_of_group, default=float("inf"))):
        incumbent = min(best_of_group, default=float("inf"))  # lowered by those refined
        alive = [par for par in may_beat
                 if not costs.bound(par, with_memory=True).exceeds(incumbent)]
        if not alive:
            continue
        if _over_cap(req, costs, best_of_group):
            capped.append(alive)
            continue
        _refine_group(req, costs, alive, refined, best_of_group, rejected, capacity)
    best = sorted(best_of_group)
    stopped = None  # what ended the adaptive refinement before its proof, if anything
    was_capped = bool(capped)
    if req.refine is None and capped:
        stopped = _refine_until_proven(req, costs, capped, refined, best_of_group, rejected,
                                       capacity)
        best = sorted(best_of_group)
    open_best = [par for alive in capped for par in alive
                 if best and not costs.bound(par, with_memory=True).exceeds(best[0])]
    open_best = _unproven(costs, open_best, best[0]) if best else open_best
    return refined, _notes(req, costs, was_capped, open_best, best[0] if best else None,
                           stopped)


def _over_cap(req: Request, costs: SearchCosts, best_of_group: list[float]) -> bool:
    """Whether the first pass has refined all it may: ``--refine K`` configurations (up to
    ZeRO), or under --refine auto ``AUTO_FIRST`` or its work budget once a plan fits."""
    return costs.refined_groups >= (AUTO_FIRST if req.refine is None else req.refine) or (
        req.refine is None and bool(best_of_group) and _spent(costs))


def _may_beat(costs: SearchCosts, later: list[Parallel],
              incumbent: float) -> list[list[Parallel]]:
    """The bounded-first configurations whose lower bounds (the cheap one, then the one with
    memory) are below plan 1's step ``incumbent``, grouped up to ZeRO, lowest bound with memory
    first.  Plan 1, not the top-th plan as for the screened ones: the bounds of most of them
    are below the top list, and most of those are memory-bound, which the bound with memory
    sees but costs building the partition problem of each (llama3-405b on 1,024 GPUs: 2,258
    under the 10th plan, 9 under plan 1 with memory).  Below plan 1 the list is then the best of
    those refined, as its note says."""
    groups = []
    for variants in _zero_groups(later):
        alive = [par for par in variants if not costs.bound(par).exceeds(incumbent)
                 and not costs.bound(par, with_memory=True).exceeds(incumbent)]
        if alive:
            groups.append(alive)
    return sorted(groups, key=lambda alive: min(costs.bound(par, with_memory=True).cheap_s
                                                for par in alive))


def _refine_until_proven(req: Request, costs: SearchCosts, capped: list[list[Parallel]],
                         refined: list[Plan], best_of_group: list[float], rejected: Counter,
                         capacity: float) -> str | None:
    """``--refine auto``: refine what the first ``AUTO_FIRST`` left, lowest bound first, every
    configuration whose lower bound (the closed forms, then the chunks' relaxation) is below plan
    1, until none is left: plan 1 is then the best of every screened configuration, whatever rank
    the screen gave it.  ``capped`` is emptied of what gets refined or proven slower.  A budget
    of ``AUTO_WORK`` units of work (`_spent`) stops it where the proof would take longer; it
    counts work, not time, so the same search answers the same on any machine at any load; the
    reason is returned, None when the proof ended it.  The chunks' mixed-integer program, which
    costs about what a refinement does (tens of milliseconds on 8 to 32 chunks, measured on
    benchmarks/bench_regret.py's interleaved cases), is tried only until the first
    configuration it cannot rule out: from there each refinement also lowers the incumbent, and
    the linear relaxation alone prunes (measured on megatron-1.7b, 8 x A100-80GB, interleaved:
    2.6 s of CPU to the proof against over 5 s with the program throughout); while it holds, a
    proof costs what the fixed cap's did.  The budget
    counts from the search's first refinement: refinements that cost seconds each (DualPipe's
    MILP over dense and MoE layers) stop the first pass too, once a plan fits."""
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
        if _spent(costs):
            capped.extend(order[n:])
            return f"its work budget ({AUTO_WORK:,} refinements' worth)"
        refining = True
        _refine_group(req, costs, open_, refined, best_of_group, rejected, capacity)
    return None


def _refine_group(req: Request, costs: SearchCosts, alive: list[Parallel], refined: list[Plan],
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


def _spent(costs: SearchCosts) -> bool:
    """Whether --refine auto's work budget is spent: ``AUTO_WORK`` units, one a configuration
    refined and one every ``ITERATIONS_PER_REFINEMENT`` simplex iterations of its partitioner
    (the constants' comment says how they were chosen)."""
    return costs.refinements + costs.solver_iterations / ITERATIONS_PER_REFINEMENT > AUTO_WORK


def _notes(req: Request, costs: SearchCosts, capped: bool, open_best: list[Parallel],
           best: float | None, stopped: str | None) -> list[str]:
    """What the output says about the proof of plan 1 (nothing when every candidate was
    refined or bounded out within the first pass); where a cap or the budget stopped it short
    of the proof, how far from the best plan 1 may be (`gap_bound`)."""
    if open_best or (capped and best is None):
        why = (f"--refine {req.refine}" if req.refine is not None else stopped)
        fix = ("raise --refine" if req.refine is not None else
               "pass --refine K to refine up to K configurations with no work budget")
        # what the chunk bound left out may still be faster by TIE_RTOL (`_unproven`)
        lowest = None if best is None else min(costs.lowest_bound(open_best),
                                               best * (1 - TIE_RTOL))
        gap = "" if best is None else f"{gap_bound(best, lowest)}; "
        return [f"refinement stopped at {why}: {gap}{len(open_best)} configurations whose lower "
                f"bound is below plan 1 were not refined, so a faster plan may exist ({fix})"]
    if capped:
        how = (f"the {req.refine} refined (--refine)" if req.refine is not None else
               f"the {costs.refined_groups} refined (--refine auto: until plan 1 is proven)")
        limits = space_limits(req)
        return [f"plan 1 is proven the fastest of all configurations searched (to "
                f"{TIE_RTOL:.2%}{'; ' + limits if limits else ''}); the rest of the list is the "
                f"best of {how}"]
    return []


def space_limits(req: Request) -> str:
    """What the space leaves out where it is not pinned (planner/search/space.py), and the pins
    that bring it in: micro-batches and virtual stages off their grids, context parallelism
    for short sequences ('' where all are pinned)."""
    free = [(f"micro-batch {'/'.join(map(str, MICRO_BATCHES))}", "--micro-batch",
             req.pins.micro_batch),
            (f"v {'/'.join(map(str, VIRTUAL_STAGES))}", "--virtual-stages",
             req.pins.virtual_stages),
            # (a longer sequence searches every CP degree: nothing left out)
            (f"CP from {CP_SEARCH_MIN_SEQ // 1024}K tokens", "--cp",
             req.pins.cp if req.model.seq_length < CP_SEARCH_MIN_SEQ else "searched")]
    free = [(what, flag) for what, flag, pin in free if pin is None]
    if not free:
        return ""
    flags = [flag for _, flag in free]
    pins = flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} or {flags[-1]}"
    return f"the space: {', '.join(what for what, _ in free)}; pin {pins} for others"


def gap_bound(best: float, lowest: float) -> str:
    """How far plan 1 (step ``best``) may be from the best screened plan, which is no faster
    than ``lowest``, the least lower bound of what was left unrefined: (best / lowest - 1),
    rounded up to 0.1% so the printed figure is still a bound."""
    if not lowest > 0 or not math.isfinite(lowest):
        return "no bound on how far plan 1 is from the best"
    gap = max(best / lowest - 1.0, 0.0)
    return f"plan 1 is within {math.ceil(gap * 1000) / 10:.1f}% of the best"


def _unproven(costs: SearchCosts, open_best: list[Parallel], best: float) -> list[Parallel]:
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
