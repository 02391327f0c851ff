"""One point, solved: what a worker runs (in this process, a pool process or a Ray task). The
outcome is a small JSON-ready dict (never a Plan): it crosses processes, goes to the cache as it
is, and a cached and a fresh outcome are the same bytes."""

from __future__ import annotations

import json

from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.report.frames import plan_record

# What a point's row says of its best plan (the fields of `plan solve --csv`, rounded as the plan
# JSON rounds them, plus cp, ep, etp and the precision priced; the step time a run may measure
# and whether that band is calibrated, planner/fidelity/band.py), or why there is none.
OUTCOME_COLUMNS = ("status", "tp", "cp", "pp", "dp", "ep", "etp", "micro_batch",
                   "num_microbatches", "schedule", "virtual_stages", "recompute", "zero",
                   "sequence_parallel", "step_time_s", "step_time_low_s", "step_time_high_s",
                   "band_calibrated", "tokens_per_s", "tflops_per_gpu", "mfu",
                   "hfu", "peak_memory_bytes", "bubble_fraction", "reason")
OK, INFEASIBLE, INPUT = "ok", "infeasible", "input"  # status: a plan, nothing fits, bad combination


def _one_line(message: str) -> str:
    return " ".join(message.split())


def outcome_of(solution) -> dict:
    """The best plan of a planner.solve Solution as the row's outcome fields."""
    plan = solution.best
    record = plan_record(plan)
    par = plan.parallel
    out = {k: record[k] for k in OUTCOME_COLUMNS if k in record}
    out.update(status=OK, cp=par.cp, ep=par.ep, etp=par.expert_tp, reason=None)
    if plan.error_band is not None:
        low, high = plan.error_band["step_time_s"]
        out.update(step_time_low_s=low, step_time_high_s=high,
                   band_calibrated=plan.error_band["calibrated"])
    return {k: out.get(k) for k in OUTCOME_COLUMNS}


def evaluate(solve, kwargs: dict) -> dict:
    """``solve(**kwargs)`` (planner.solve itself: the same semantics as one `plan solve`), its
    best plan or the reason there is none (NoFeasiblePlan, PlanInputError: the solve's message).
    Anything else is a bug and propagates."""
    try:
        out = outcome_of(solve(**kwargs))
    except NoFeasiblePlan as e:
        out = {"status": INFEASIBLE, "reason": _one_line(str(e))}
    except PlanInputError as e:
        out = {"status": INPUT, "reason": _one_line(str(e))}
    out = {k: out.get(k) for k in OUTCOME_COLUMNS}
    return json.loads(json.dumps(out))  # the cache's form: a fresh row equals a cached one
