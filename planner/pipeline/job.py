"""What `plan simulate` runs: a schedule with stage times from flags or from a saved plan."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.pipeline.schedule import ScheduleError
from planner.pipeline.simulate import SimResult, closed_form_bubble, simulate
from planner.stack import Stack

__all__ = ["SimulationJob", "simulation_job", "on_stack", "run_simulation", "simulation_summary"]


@dataclass(frozen=True)
class SimulationJob:
    schedule: str
    p: int
    m: int
    v: int
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    wgrad_s: tuple[float, ...]
    comm_s: float | tuple[float, ...]  # one for every boundary, or per boundary


def simulation_job(pp, microbatches, schedule, virtual_stages, stage_times, comm_time,
                   plan_file) -> SimulationJob:
    """From a plan.json (its schedule, stage and transfer times) or from the flags."""
    if plan_file is not None:
        return _from_plan(Path(plan_file))
    if pp is None or microbatches is None:
        raise PlanInputError("give --pp and --microbatches, or --plan plan.json")
    for name, value in (("--pp", pp), ("--microbatches", microbatches),
                        ("--virtual-stages", virtual_stages)):
        if value < 1:
            raise PlanInputError(f"{name} must be positive, got {value}")
    if comm_time < 0:
        raise PlanInputError(f"--comm-time must be >= 0, got {comm_time}")
    chunks = pp * virtual_stages
    fwd = _times(stage_times, chunks) if stage_times else (1.0,) * chunks
    return SimulationJob(schedule=schedule, p=pp, m=microbatches, v=virtual_stages, fwd_s=fwd,
                         bwd_s=tuple(2 * f for f in fwd), wgrad_s=tuple(f for f in fwd),
                         comm_s=comm_time)


def on_stack(job: SimulationJob, stack: Stack, from_plan: bool) -> SimulationJob:
    """The job as ``stack`` runs it: refused when the stack has no such schedule; stage times
    from flags get the stack's per-action overhead on every forward and backward (a plan's
    times already include it)."""
    if job.p > 1 and job.schedule not in stack.schedules:
        raise PlanInputError(f"the {stack.name} stack runs no {job.schedule} schedule (it runs "
                             f"{', '.join(stack.schedules)}); choose one of those or another "
                             "--stack")
    extra = stack.pipeline_action_overhead_s
    if from_plan or not extra:
        return job
    return replace(job, fwd_s=tuple(f + extra for f in job.fwd_s),
                   bwd_s=tuple(b + extra for b in job.bwd_s))


def _times(text: str, chunks: int) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise PlanInputError(f"--stage-times must be numbers separated by commas, got {text!r}")
    if len(values) != chunks or min(values) <= 0:
        raise PlanInputError(f"--stage-times needs {chunks} positive values (one per chunk: "
                             f"pp x virtual stages), got {len(values)}")
    return values


def _from_plan(path: Path) -> SimulationJob:
    doc = read_json(path, "plan file", "write one with plan solve --export json --out DIR")
    try:
        if "plans" in doc:  # the output of `plan solve --json`: take the best plan
            doc = doc["plans"][0]
        par, stages = doc["parallel"], doc["stages"]
        return SimulationJob(
            schedule=par["schedule"], p=par["pp"], m=par["num_microbatches"],
            v=par["virtual_stages"], fwd_s=tuple(s["fwd_s"] for s in stages),
            bwd_s=tuple(s["bwd_s"] for s in stages), wgrad_s=tuple(s["wgrad_s"] for s in stages),
            comm_s=tuple(s.get("send_s", 0.0) for s in stages[:-1]))
    except (KeyError, TypeError, IndexError) as e:
        raise PlanInputError(f"{path}: not a plan3d plan JSON ({type(e).__name__}: {e}); "
                             "write one with plan solve --export json --out DIR")


def run_simulation(job: SimulationJob) -> SimResult:
    try:
        return simulate(job.schedule, job.p, job.m, job.v, fwd_s=job.fwd_s, bwd_s=job.bwd_s,
                        wgrad_s=job.wgrad_s, comm_s=job.comm_s)
    except ScheduleError as e:
        raise PlanInputError(str(e)) from None


def simulation_summary(result: SimResult) -> dict:
    return {"schedule": result.schedule, "pp": result.p, "microbatches": result.m,
            "virtual_stages": result.v, "makespan_s": result.makespan_s,
            "bubble_fraction": result.bubble_fraction, "bubble_ratio": result.bubble_ratio,
            "closed_form_bubble_fraction": closed_form_bubble(result.schedule, result.p,
                                                              result.m, result.v),
            "busy_s": list(result.busy_s), "idle_s": list(result.idle_s),
            "peak_inflight": list(result.peak_inflight)}
