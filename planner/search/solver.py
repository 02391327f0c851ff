"""The search: every configuration of the space screened, the best refined, all ranked.

Screening predicts each configuration of planner/search/space.py with the closed-form evaluation
(even split); every rejection is counted by reason. Candidates are then refined (stage partition,
schedule simulation: planner/search/costs.py) by branch and bound (planner/search/refinement.py):
in screen order, skipping every one whose lower bound (planner/search/bound.py) cannot enter the
top list, then (``--refine auto``, the default) lowest bound first until no configuration left
could beat plan 1, so plan 1 is what refining every screened configuration would give
(benchmarks/bench_regret.py measures it). Plans are ranked by step time, ties broken by lower
memory, then by the configuration itself, so the same inputs always give the same ranking.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

from planner.cost import constants
from planner.core.errors import NoFeasiblePlan
from planner.predict.step import predict
from planner.hardware.profiles import Cluster
from planner.core.parallel import RECOMPUTE_MODES, SCHEDULES, Parallel
from planner.core.schedules import schedule_traits
from planner.predict.plan import Plan
from planner.search.advice import batch_dp_note
from planner.search.costs import SearchCosts
from planner.search.refinement import branch_and_bound
from planner.search.request import Request
from planner.search.space import bounded_first, enumerate_configs
from planner.search.validation import validate_pins
from planner.predict.stages import may_fit


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
    elapsed_s: float = field(compare=False)  # reported only, never compared (issue #32)
    notes: tuple[str, ...] = field(default=())
    refined: int = 0  # configurations partitioned and simulated
    considered: int = 0
    not_refined: int = 0
    feasible: int = 0
    folded: int = 0
    # every feasible plan, ranked like ``plans`` (folded and below --top ones too): what
    # `plan solve --report` plots as step time against memory
    candidates: tuple[Plan, ...] = field(default=(), compare=False)

    @property
    def below_top(self) -> int:
        return self.feasible - self.folded - len(self.plans)

    @property
    def accounted(self) -> bool:
        return (self.considered == sum(self.rejected.values()) + self.not_refined + self.feasible
                and self.below_top >= 0)


def capacity_bytes(cluster: Cluster) -> float:
    return cluster.capacity_bytes


def _rank_key(par: Parallel, step_s: float, memory_bytes: float):
    """Fastest first, then least memory, then the configuration itself: a total order, so the
    same inputs always give the same ranking."""
    return (round(step_s, 9), round(memory_bytes), par.tp, par.pp, par.micro_batch,
            SCHEDULES.index(par.schedule), par.virtual_stages,
            RECOMPUTE_MODES.index(par.recompute), par.zero, par.sequence_parallel, par.ep,
            par.expert_tp)


def _plan_key(plan: Plan):
    return _rank_key(plan.parallel, plan.metrics.step_time_s, plan.metrics.peak_memory_bytes)


def search(req: Request, progress=None) -> SearchResult:
    """Screen every configuration, keep the ones that fit, rank them (best first)."""
    validate_pins(req)
    start = time.perf_counter()
    rejected: Counter = Counter()
    configs = list(enumerate_configs(req, rejected))
    capacity = capacity_bytes(req.cluster)
    costs = SearchCosts(req)
    bounded = {par for par in configs if bounded_first(req, par)}
    kept = screen(req, costs, [par for par in configs if par not in bounded], rejected, progress)
    later = memory_screen(req, costs, [par for par in configs if par in bounded], rejected)
    # before refinement rejects some kept ones
    considered = sum(rejected.values()) + len(kept) + len(later)
    refined, notes = branch_and_bound(req, costs, kept, rejected, capacity, later)
    # each kept configuration is refined at most once
    not_refined = len(kept) + len(later) - costs.refinements
    if not refined:
        raise NoFeasiblePlan(_no_plan_message(req, rejected, considered, not_refined),
                             dict(rejected))
    refined.sort(key=_plan_key)
    plans, hidden = _distinct(refined)
    if req.batch_range is None and req.pins.dp is None:  # the batch, not the cluster, caps dp
        best = plans[0].parallel
        note = batch_dp_note(best.global_batch, req.cluster.gpus, best.dp)
        notes = [*notes, note] if note else notes
    return SearchResult(plans=tuple(plans[: req.top]), rejected=dict(sorted(rejected.items())),
                        screened=len(configs), elapsed_s=time.perf_counter() - start,
                        notes=tuple(notes), refined=costs.refinements, considered=considered,
                        not_refined=not_refined, feasible=len(refined), folded=hidden,
                        candidates=tuple(refined))


def screen(req: Request, costs: SearchCosts, configs: list[Parallel], rejected: Counter,
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


def memory_screen(req: Request, costs: SearchCosts, configs: list[Parallel],
                  rejected: Counter) -> list[Parallel]:
    """The bounded-first configurations (planner/search/space.py bounded_first) the
    partitioner's necessary condition lets fit: the screen's memory rule without its even-split
    prediction, which their bounds replace (planner/search/refinement.py)."""
    kept = []
    for par in configs:
        if may_fit(req.model, req.cluster, par, req.options, costs.known(par)):
            kept.append(par)
        else:
            rejected["memory"] += 1
    return kept


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


STRUCTURAL = ("TP across", "more stages than layers", "schedule rule", "heads not divisible",
              "KV heads not divisible", "FFN not divisible", "vocabulary not divisible")


def schedule_rule_words(schedule: str) -> str:
    """The rules of core/parallel.py schedule_problem and rules.py schedule_rule, in words, by
    the schedule's traits (Megatron-LM's and DualPipe's)."""
    traits = schedule_traits(schedule)
    if traits.mirrored:
        return "an even pp and an even M of at least 2 x pp"
    if traits.microbatches_divisible_by_pp:
        return ("pp > 1, the microbatches per pipeline (M) divisible by pp, and no more pp x v "
                "chunks than layers")
    return "no more pipeline chunks than layers"


def _no_plan_message(req: Request, rejected: Counter, considered: int, not_refined: int) -> str:
    gib = (capacity_bytes(req.cluster) - constants.RESERVED_BYTES) / 1024**3
    reasons = ", ".join(f"{n} {r}" for r, n in rejected.most_common())
    # The hint follows the most common reason the user can act on: the structural rules (TP inside
    # a node and dividing the heads, no more stages than layers, the schedules' own rules) reject
    # much of every large space, counted in whole configurations, whether or not anything fits.
    actionable = Counter({r: n for r, n in rejected.items() if not r.startswith(STRUCTURAL)})
    top = (actionable or rejected).most_common(1)[0][0] if rejected else ""
    if req.pins.schedule and rejected.get("schedule rule") and not top.startswith("memory"):
        # #30: pinned interleaving at a small batch was told the batch cannot be split over the
        # data-parallel ranks, where its own rule (M divisible by pp) is what failed
        hint = (f"the pinned --schedule {req.pins.schedule} runs only where its own rule holds "
                f"({rejected['schedule rule']} configurations broke it: "
                f"{schedule_rule_words(req.pins.schedule)}): raise "
                "--global-batch for more microbatches per pipeline, pin a smaller --pp, or drop "
                "--schedule")
    elif top.startswith("memory"):
        hint = (f"the model does not fit in {gib:.0f} GiB per GPU with the options tried: add "
                "GPUs, allow recompute and ZeRO (drop pins) or use a larger GPU")
    elif top == "batch not divisible" and req.batch_range is not None:
        low, high = req.batch_range
        hint = (f"no global batch in {low}..{high} splits over this many data-parallel ranks: "
                "widen --global-batch-range or use fewer GPUs")
    elif top == "batch not divisible":
        hint = (f"the global batch ({req.batch}) cannot be split over this many data-parallel "
                "ranks: raise --global-batch, give --global-batch-range, or use fewer GPUs")
    else:
        hint = "relax the pins or limits that rejected the most"
    return (f"{req.model.name} on {req.cluster.gpus} x {req.cluster.hardware.name}: "
            f"{considered} configurations considered; rejected: {reasons or 'none'}"
            + (f"; {not_refined} more fit when screened but were not refined (raise --refine)"
               if not_refined else "") + f". {hint}")
