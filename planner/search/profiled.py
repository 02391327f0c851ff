"""A search over a measured profile (`plan profile`): the check that the profile is of the model
searched, and plan 1's step time from it beside the analytical model's.
"""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.predict.step import evaluate
from planner.model.spec import ModelSpec
from planner.predict.plan import Plan
from planner.search.request import Request


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
