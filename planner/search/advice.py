"""Advice on the request itself: when the global batch is too small for the cluster.

With few microbatches per step the pipeline fills and drains most of the time: Narayanan et al.
2021 (§2.2.1) give 1F1B's bubble as (p-1)/M of the ideal step time, so the idle share of the step
is (p-1)/(M+p-1): M = 2 over 8 stages idles about 78% of it. No parallel configuration can fix that; only more microbatches can, that is
a larger global batch (or fewer pipeline stages, which the search already tried). ``batch_hint``
picks the global batch that brings the best plan's closed-form bubble under ``BUBBLE_HINT``
and searches again at it, so the hint states a plan the planner stands behind, not a formula.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.core.errors import NoFeasiblePlan
from planner.predict.plan import Plan
from planner.core.schedules import schedule_traits
from planner.pipeline.simulate import closed_form_bubble

# Hint when the best plan idles more than this share of its step. A judgement, not a fitted or
# published number: Narayanan et al. 2021 size M so the bubble is small next to the compute, and
# a quarter of the step idle is well past that on any cluster worth planning.
BUBBLE_HINT = 0.25
MAX_TRIES = 3  # searches tried, doubling M, while the best plan at the batch still idles more
HINT_REFINE = 5  # the hint refines fewer candidates than the search: it names a batch, not a plan


def microbatches_for(schedule: str, p: int, v: int, bubble: float) -> int:
    """The fewest microbatches M whose closed-form bubble is at most ``bubble`` (>= 1)."""
    if p <= 1:
        return 1
    # (p-1)/(k*M + p-1) <= b  <=>  M >= (p-1)(1-b) / (k*b), k = 1 (1F1B, GPipe), v or 3 (ZB-H1)
    k = schedule_traits(schedule).fill_divisor(v)
    m = max(1, math.ceil((p - 1) * (1 - bubble) / (k * bubble) - 1e-9))
    while closed_form_bubble(schedule, p, m, v) > bubble:  # guard the float rounding
        m += 1
    return m


def batch_hint(req, plan: Plan, search) -> str | None:
    """A one-line suggestion of a larger global batch when ``plan`` (the best of ``req``) idles
    more than BUBBLE_HINT of its step; None when it does not, when the batch was left to the
    search (--global-batch-range), or when no batch tried brings the bubble under.

    The batch gives the best plan's pipeline the closed-form M for BUBBLE_HINT; the whole search
    then runs again at that batch (``search(request)``: a different plan may now be best, and
    more microbatches in flight may need recompute), doubling M while its best still idles more.
    """
    par, m = plan.parallel, plan.metrics
    if m.bubble_fraction <= BUBBLE_HINT or par.pp == 1 or req.batch_range is not None:
        return None
    need = microbatches_for(par.schedule, par.pp, par.virtual_stages, BUBBLE_HINT)
    if par.schedule_traits.microbatches_divisible_by_pp:  # Megatron's interleaved schedule
        need = math.ceil(need / par.pp) * par.pp
    need = max(need, par.num_microbatches + 1)
    for _ in range(MAX_TRIES):
        batch = par.micro_batch * need * par.dp
        try:
            best = search(replace(req, global_batch=batch, top=1, refine=HINT_REFINE)).plans[0]
        except NoFeasiblePlan:
            return None
        b = best.metrics
        if b.bubble_fraction <= BUBBLE_HINT:
            q = best.parallel
            return (f"the pipeline idles {m.bubble_fraction:.1%} of the step: global batch "
                    f"{par.global_batch} is only {par.num_microbatches} microbatches per "
                    f"pipeline. At --global-batch {batch} the best plan "
                    f"({q.tp}·{f'{q.cp}·' if q.cp > 1 else ''}{q.pp}·{q.dp}, "
                    f"{q.micro_batch}×{q.num_microbatches}) is predicted "
                    f"to idle {b.bubble_fraction:.1%} at MFU {b.mfu:.1%} (a larger batch also "
                    "changes the optimisation)")
        need *= 2
    return None


def batch_dp_note(global_batch: int, gpus: int, best_dp: int) -> str | None:
    """When the batch, not the cluster, caps data parallelism: dp divides the GPUs (tp·cp·pp·dp
    = GPUs) and the batch (micro-batch · M · dp), so it is at most gcd(batch, GPUs). A batch
    sharing few factors with the GPU count caps dp silently (513 on 16 GPUs: dp 1 only); when
    the best plan sits at that cap, say so and name the nearest batches that lift it."""
    most = math.gcd(global_batch, gpus)
    if most == gpus or best_dp != most:
        return None
    lower = global_batch // gpus * gpus
    nearest = " or ".join(str(b) for b in (lower, lower + gpus) if b > 0)
    return (f"global batch {global_batch} allows data parallelism up to dp {most} (dp divides "
            f"both the {gpus} GPUs and the batch), and plan 1 is at it; {nearest} would allow "
            f"dp up to {gpus}")
