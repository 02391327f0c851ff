"""What `plan simulate` runs: a schedule with stage times from flags or from a saved plan."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.core.fileset import verified_set
from planner.core.arguments import finite, number
from planner.core.limits import MAX_CHUNKS, MAX_MICROBATCHES, MAX_PASS_S, MIN_PASS_S
from planner.core.plan_schema import check_plan_document
from planner.core.schedules import DEFAULT_SCHEDULE, schedule_traits
from planner.pipeline.blocking import blocking_charges
from planner.pipeline.schedule import ScheduleError
from planner.pipeline.sim_result import SimResult
from planner.pipeline.simulate import closed_form_bubble, simulate
from planner.stack import Stack
from planner.stack.spec import check_value

__all__ = ["SimulationJob", "simulation_job", "job_of_document", "refuse_flags_with_plan", "on_stack",
           "run_simulation", "simulation_summary"]


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
    # the engine's per-action costs (Stack.pipeline_action_overhead_s, split_backward_overhead)
    action_s: float = 0.0
    split_backward: float = 0.0
    # the engine's transfers block both ranks (Stack.p2p_blocking; pipeline/blocking.py)
    p2p_blocking: bool = False
    # the step a plan.json was priced at: this pipeline plus what no schedule holds (the
    # exposed data-parallel sync and the optimizer step, predict/step.py); None from flags
    priced_step_s: float | None = None


def simulation_job(pp, microbatches, schedule, virtual_stages, stage_times, comm_time,
                   plan_file) -> SimulationJob:
    """From a plan.json (its schedule, stage and transfer times) or from the flags (None: the
    flag's default); a flag given with a plan is refused, since the plan fixes all of them."""
    if plan_file is not None:
        refuse_flags_with_plan({"--pp": pp, "--microbatches/-M": microbatches,
                                "--schedule": schedule, "--virtual-stages": virtual_stages,
                                "--stage-times": stage_times, "--comm-time": comm_time})
        return _from_plan(Path(plan_file))
    if pp is None or microbatches is None:
        raise PlanInputError("give --pp and --microbatches, or --plan plan.json")
    schedule = DEFAULT_SCHEDULE if schedule is None else schedule
    virtual_stages = 1 if virtual_stages is None else virtual_stages
    for name, value in (("--pp", pp), ("--microbatches", microbatches),
                        ("--virtual-stages", virtual_stages)):
        if value < 1:
            raise PlanInputError(f"{name} must be positive, got {value}")
    comm_time = 0.0 if comm_time is None else comm_time
    number("--comm-time", comm_time, low=0, high=MAX_PASS_S)
    check_sizes(pp, microbatches, virtual_stages)
    chunks = pp * virtual_stages
    fwd = _times(stage_times, chunks) if stage_times else (1.0,) * chunks
    return SimulationJob(schedule=schedule, p=pp, m=microbatches, v=virtual_stages, fwd_s=fwd,
                         bwd_s=tuple(2 * f for f in fwd), wgrad_s=tuple(f for f in fwd),
                         comm_s=comm_time)


def refuse_flags_with_plan(flags: dict) -> None:
    """The flags given (not None) beside --plan: the plan fixes the schedule, its sizes and its
    times, so a flag there would be silently ignored; one line names them instead."""
    given = [name for name, value in flags.items() if value is not None]
    if given:
        verb, them = ("contradicts", "it") if len(given) == 1 else ("contradict", "them")
        raise PlanInputError(f"{', '.join(given)} {verb} --plan, which fixes the schedule, its "
                             f"sizes and times; drop {them} or drop --plan")


def check_sizes(pp: int, microbatches: int, virtual_stages: int) -> None:
    """The caps of core/limits.py: a schedule beyond them is no real run, only a long wait."""
    if microbatches > MAX_MICROBATCHES:
        raise PlanInputError(f"--microbatches {microbatches}: at most {MAX_MICROBATCHES:,}")
    if pp * virtual_stages > MAX_CHUNKS:
        raise PlanInputError(f"--pp x --virtual-stages = {pp * virtual_stages} chunks; at most "
                             f"{MAX_CHUNKS} (a chunk holds at least one layer)")


def on_stack(job: SimulationJob, stack: Stack) -> SimulationJob:
    """The job as ``stack`` runs it: refused when the stack has no such schedule; the stack's
    per-action costs are charged on every action (they replace those of a plan's own stack:
    a plan's stage times, like the flags', are compute only)."""
    if job.p > 1 and job.schedule not in stack.schedules:
        raise PlanInputError(f"the {stack.name} stack runs no {job.schedule} schedule (it runs "
                             f"{', '.join(stack.schedules)}); choose one of those or another "
                             "--stack")
    if job.p == 1:  # one stage: no pipeline engine runs, so none of its costs
        return replace(job, action_s=0.0, split_backward=0.0, p2p_blocking=False)
    return replace(job, action_s=stack.pipeline_action_overhead_s,
                   split_backward=stack.split_backward_overhead,
                   p2p_blocking=stack.p2p_blocking)


def stack_note(job: SimulationJob, stack: Stack) -> str | None:
    """What of ``stack`` this op-by-op chart does not draw, in one line (None: nothing): an
    engine that runs interleaved 1F1B in lockstep time steps (Stack.pipeline_timesteps) is
    priced so by `plan solve` and `plan validate` (planner/pipeline/timestep.py), not drawn."""
    if stack.pipeline_timesteps and schedule_traits(job.schedule).takes_virtual_stages and job.p > 1:
        return (f"the {stack.name} stack runs interleaved 1F1B in lockstep time steps (torch "
                "<= 2.6); this chart draws it run as data arrives, while `plan solve` prices "
                "the time steps (planner/pipeline/timestep.py)")
    return None


def _times(text: str, chunks: int) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise PlanInputError(f"--stage-times must be numbers separated by commas, got {text!r}")
    if len(values) != chunks:
        raise PlanInputError(f"--stage-times needs {chunks} values in seconds (one per chunk: "
                             f"pp x virtual stages), got {len(values)}")
    for i, x in enumerate(values):  # backward = 2x forward: the cap keeps that finite too
        number(f"--stage-times value {i + 1}", x, low=MIN_PASS_S, high=MAX_PASS_S)
    return values


def _backward(stage: dict, schema: str) -> tuple[float, float]:
    """(full backward, weight-gradient part) of one stage entry."""
    if schema == "plan3d/plan/v2":
        return stage["bwd_input_s"] + stage["bwd_weight_s"], stage["bwd_weight_s"]
    return stage["bwd_s"], stage["wgrad_s"]


def _from_plan(path: Path) -> SimulationJob:
    hint = "write one with plan solve --export json --out DIR"
    if path.name == "plan.json":  # an export set cut short or mixed is refused, a killed swap
        with verified_set(path.parent):  # recovered; read while no writer can swap files in
            doc = read_json(path, "plan file", hint)
    else:
        doc = read_json(path, "plan file", hint)
    return job_of_document(doc, str(path))


def job_of_document(doc, origin: str) -> SimulationJob:
    """The schedule of a plan JSON document (checked: core/plan_schema.py), with its stage and
    transfer times and its stack's per-action costs; ``origin`` names it in errors."""
    schema, par, stages = check_plan_document(doc, origin)  # types, ranges: core/plan_schema.py
    backward = [_backward(s, schema) for s in stages]
    plan = doc["plans"][0] if "plans" in doc else doc
    return SimulationJob(
        schedule=par["schedule"], p=par["pp"], m=par["num_microbatches"],
        v=par["virtual_stages"], fwd_s=tuple(s["fwd_s"] for s in stages),
        bwd_s=tuple(b for b, _ in backward), wgrad_s=tuple(w for _, w in backward),
        comm_s=tuple(s.get("send_s", 0.0) for s in stages[:-1]),
        priced_step_s=_priced_step(plan), **_engine_costs(plan, origin))


def _priced_step(doc: dict) -> float | None:
    """The plan's step time, where its metrics give one (checked finite and positive)."""
    step = (doc.get("metrics") or {}).get("step_time_s")
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        return None
    return float(step) if 0 < step < float("inf") else None


def _engine_costs(doc: dict, origin: str) -> dict:
    """The per-action costs and transfer semantics of the stack a plan was priced on (none for
    a plan without one, or one written before the stack had them), checked like a stack
    file's."""
    stack = doc.get("stack")
    values = stack.get("values") if isinstance(stack, dict) else None
    values = values if isinstance(values, dict) else {}
    out = {arg: check_value(key, values.get(key, 0.0), f"{origin}: stack values")
           for arg, key in (("action_s", "pipeline_action_overhead_s"),
                            ("split_backward", "split_backward_overhead"))}
    out["p2p_blocking"] = check_value("p2p_blocking", values.get("p2p_blocking", False),
                                      f"{origin}: stack values")
    return out


def run_simulation(job: SimulationJob) -> SimResult:
    fwd, bwd, comm = job.fwd_s, job.bwd_s, job.comm_s
    chunks = job.p * job.v
    if job.p2p_blocking and job.p > 1:  # each transfer inside both ranks' ops (blocking.py)
        boundary = [float(comm)] * (chunks - 1) if isinstance(comm, (int, float)) else comm
        add_f, add_b = blocking_charges(boundary, chunks)
        fwd = tuple(f + a for f, a in zip(fwd, add_f))
        bwd = tuple(b + a for b, a in zip(bwd, add_b))
        comm = 0.0
    try:
        result = simulate(job.schedule, job.p, job.m, job.v, fwd_s=fwd, bwd_s=bwd,
                          wgrad_s=job.wgrad_s, comm_s=comm, action_s=job.action_s,
                          split_backward=job.split_backward)
    except ScheduleError as e:
        raise PlanInputError(str(e)) from None
    # every time drawn or printed is at most the step's, so a finite step is a finite chart
    finite("the simulated step time", result.makespan_s, "lower the stage and transfer times")
    return result


def simulation_summary(result: SimResult) -> dict:
    return {"schedule": result.schedule, "pp": result.p, "microbatches": result.m,
            "virtual_stages": result.v, "makespan_s": result.makespan_s,
            "bubble_fraction": result.bubble_fraction, "bubble_ratio": result.bubble_ratio,
            "closed_form_bubble_fraction": closed_form_bubble(result.schedule, result.p,
                                                              result.m, result.v),
            "busy_s": list(result.busy_s), "idle_s": list(result.idle_s),
            "peak_inflight": list(result.peak_inflight)}
