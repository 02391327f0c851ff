"""Refinement by branch and bound: which screened configurations get partitioned and simulated.

In screen order, every configuration whose lower bound (planner/search/bound.py) cannot enter the
top list is skipped; then (``--refine auto``, the default) lowest bound first until no
configuration left could beat plan 1, so plan 1 is what refining every screened configuration
would give (benchmarks/bench_regret.py measures it); the notes say what a cap or the time budget
left unproven.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

from planner.core.parallel import Parallel
from planner.predict.plan import Plan
from planner.search.costs import SearchCosts
from planner.search.request import Request

# --refine auto: the configurations refined in screen order before the rest goes lowest bound
# first (the fixed cap's old default, under which most searches are already proven: the screen
# finds a near-best incumbent early), and the CPU seconds the rest may take before the output
# says what is left unproven.  Set to "a few seconds" of waiting before any result; kept after
# looking at benchmarks: 1 s would bring gpt3-175b on 1,024 GPUs under 2 s but left 1.5% regret
# on a bench_regret case (megatron-1.7b on 8 GPUs, interleaved), so the budget stays at 5 s.
AUTO_FIRST = 20
AUTO_BUDGET_S = 5.0

# A configuration the chunk bound puts within this share of plan 1 counts as a tie, not as
# faster: the bound is a solver's (chunk_bound.MIP_GAP, and chunk_bound.SAFETY kept below its
# answer), so a configuration that refines to plan 1 itself (a recompute mode allowed but
# unused) is bounded just under it.
TIE_RTOL = 1e-4


def branch_and_bound(req: Request, costs: SearchCosts, ranked: list[Parallel], rejected: Counter,
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


def _refine_until_proven(req: Request, costs: SearchCosts, capped: list[list[Parallel]],
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


def _notes(req: Request, costs: SearchCosts, capped: bool, open_best: list[Parallel],
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
