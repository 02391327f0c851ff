"""Advice on the request itself: when the global batch is too small for the cluster.

With few microbatches per step the pipeline fills and drains most of the time: Narayanan et al.
2021 (§2.2.1) give 1F1B's bubble as (p-1)/M of the ideal step time, so the idle share of the step
is (p-1)/(M+p-1): M = 2 over 8 stages idles about 78% of it. No parallel configuration can fix that; only more microbatches can, that is
a larger global batch (or fewer pipeline stages, which the search already tried). ``batch_hint``
picks the global batch that brings the best plan's closed-form bubble under ``BUBBLE_HINT``
and searches again at it, so the hint states a plan the planner stands behind, not a formula;
it proposes no batch past ``HINT_MAX_TOKENS`` tokens a step, where larger batches stop paying.
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
# The largest batch the hint proposes, in tokens a step.  Past the critical batch size a larger
# batch stops paying: doubling it no longer nearly halves the steps to a given loss (McCandlish
# et al. 2018, "An Empirical Model of Large-Batch Training").  Kaplan et al. 2020 ("Scaling Laws
# for Neural Language Models", eq. 1.4) fit the critical batch as B*/L^(1/alpha_B) with B* about
# 2e8 tokens and alpha_B about 0.21: 16M tokens at a loss of 1.7 nats, 7M at 2.0.  Llama 3 405B
# ended its batch ramp (4M, 8M, then 16M tokens) at 16M (Llama Team 2024, section 3.4.1).  A
# judgement with those in view, not a fit: the planner does not know the loss.
HINT_MAX_TOKENS = 16 * 2**20


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
    more microbatches in flight may need recompute), doubling M while its best still idles more,
    and never past HINT_MAX_TOKENS a step: at that bound it names the bound's batch and its plan
    whatever their bubble, or, where the batch already meets the bound, says so.
    """
    par, m = plan.parallel, plan.metrics
    if m.bubble_fraction <= BUBBLE_HINT or par.pp == 1 or req.batch_range is not None:
        return None
    need = microbatches_for(par.schedule, par.pp, par.virtual_stages, BUBBLE_HINT)
    if par.schedule_traits.microbatches_divisible_by_pp:  # Megatron's interleaved schedule
        need = math.ceil(need / par.pp) * par.pp
    need = max(need, par.num_microbatches + 1)
    seq = req.model.seq_length
    step = par.micro_batch * par.dp * (par.pp if par.schedule_traits.microbatches_divisible_by_pp
                                       else 1)  # the batch grows in whole M the schedule takes
    most = max(HINT_MAX_TOKENS // seq // step * step, par.global_batch)  # the cap, in sequences
    opening = (f"the pipeline idles {m.bubble_fraction:.1%} of the step: global batch "
               f"{par.global_batch} is only {par.num_microbatches} microbatches per pipeline")
    for _ in range(MAX_TRIES):
        batch = min(par.micro_batch * need * par.dp, most)
        if batch <= par.global_batch:
            return (f"{opening}, and a larger batch would pass {HINT_MAX_TOKENS / 2**20:.0f}M "
                    "tokens a step, past the critical batch size of large-batch training "
                    "(McCandlish et al. 2018; Kaplan et al. 2020); fewer GPUs would idle less")
        try:
            # refined as the request is: a cap would leave the uneven interleaved layouts,
            # refined after the screened ones (planner/search/refinement.py), unrefined
            best = search(replace(req, global_batch=batch, top=1)).plans[0]
        except NoFeasiblePlan:
            return None
        b = best.metrics
        if b.bubble_fraction <= BUBBLE_HINT or batch == most:
            q = best.parallel
            capped = (f" ({batch * seq / 2**20:.0f}M tokens, the most the hint proposes: "
                      "past it larger batches stop paying)" if batch == most else "")
            return (f"{opening}. At --global-batch {batch}{capped} the best plan "
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
