"""``torch.distributed.pipelining``: the schedule class, stage placement and microbatching a plan
runs with (torch 2.13; checked in ``torch/distributed/pipelining/schedules.py``).

Schedule classes: ``ScheduleGPipe`` and ``Schedule1F1B`` are ``PipelineScheduleSingle`` (exactly
one stage per rank); ``ScheduleInterleaved1F1B`` and ``ScheduleInterleavedZeroBubble`` are
``_PipelineScheduleRuntime`` classes that take a list of stages. torch has no single-stage
zero-bubble class: a one-stage-per-rank ZB-H1 plan runs ``ScheduleInterleavedZeroBubble`` with a
one-element stage list (its ZB1P order with v = 1 is ZB-H1); the round-trip test runs it so.
Both runtime classes split the microbatches into ``rounds = max(1, n_microbatches // pp)`` and
raise ValueError unless ``n_microbatches % rounds == 0``. Stage s runs on rank ``s mod pp`` (the
"loop" style; ``get_schedule_class`` names are what torchtitan's ``pipeline_parallel_schedule``
takes).
"""

from __future__ import annotations

from planner.core.schedules import find_schedule
from planner.launchers.common import Facts, moe_problems, schedule_basics, structure_problems
from planner.predict.plan import Plan

TARGET = "torch.distributed.pipelining (torch 2.13)"
NAME = "torch.distributed.pipelining"


def torch_class(schedule: str) -> tuple[str, str] | None:
    """(class in torch.distributed.pipelining.schedules, its get_schedule_class name) of a
    plan3d schedule (core/schedules.py Schedule.torch_class); None: torch has none."""
    traits = find_schedule(schedule)
    return traits.torch_class if traits else None


def schedule_rules(f: Facts, launcher: str = NAME) -> list[str]:
    """The rules of torch's schedule classes, named for ``launcher`` (torchtitan uses them too)."""
    classes = torch_class(f.schedule)
    if classes is None:
        return [f"{launcher}: no torch.distributed.pipelining schedule for '{f.schedule}'"]
    rounds = max(1, f.num_microbatches // f.pp)
    multi_stage = find_schedule(f.schedule).torch_multi_stage
    if f.pp > 1 and multi_stage and f.num_microbatches % rounds:
        return [f"{launcher}: {classes[0]} needs microbatches "
                f"({f.num_microbatches}) divisible by max(1, microbatches // pp) = {rounds}"]
    return []


def parallel_rules(f: Facts) -> list[str]:
    return (schedule_basics(f.pp, f.schedule, f.virtual_stages, False, f.tp, NAME)
            + schedule_rules(f))


def check(plan: Plan) -> list[str]:
    return structure_problems(plan) + parallel_rules(Facts.of(plan.parallel, plan.model)) + \
        moe_problems(plan, NAME, "plan3d's torch model builds dense blocks only")


def stage_ids_per_rank(pp: int, num_stages: int) -> list[list[int]]:
    """The "loop" placement: rank r holds stages r, r + pp, r + 2 pp, ..."""
    return [list(range(r, num_stages, pp)) for r in range(pp)]


def entry(plan: Plan) -> dict:
    """What plan.json's ``engines.torch_pipelining`` holds: the names torch takes verbatim."""
    problems = check(plan)
    if problems:
        return {"target": TARGET, "supported": False, "rule": problems[0]}
    par = plan.parallel
    cls, name = torch_class(par.schedule)
    return {"target": TARGET, "supported": True, "schedule_class": cls, "schedule_name": name,
            "n_microbatches": par.num_microbatches, "microbatch_size": par.micro_batch,
            "stages_per_rank": par.virtual_stages, "stage_to_rank": "loop",
            "stage_ids_per_rank": stage_ids_per_rank(par.pp, len(plan.stages))}
