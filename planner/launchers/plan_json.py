"""``plan.json``: the plan JSON of DESIGN.md §2, exactly ``json.dumps(plan.to_dict(), indent=2)``.

JSON has no comments, so this file carries no header; its ``schema`` field names the format.
"""

from __future__ import annotations

from planner.launchers.common import Facts, plan_json, structure_problems
from planner.predict.plan import Plan

TARGET = "plan3d plan JSON (schema plan3d/plan/v1)"


def check(plan: Plan) -> list[str]:
    return structure_problems(plan)


def parallel_rules(_facts: Facts) -> list[str]:
    return []


def render(plan: Plan) -> dict[str, str]:
    return {"plan.json": plan_json(plan)}
