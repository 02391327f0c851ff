"""This machine and one schedule: `plan profile` (layers and the machine measured), `plan
simulate` (a pipeline schedule run op by op) and `plan layout` (ranks placed on nodes)."""

from __future__ import annotations

from pathlib import Path

from planner.api.inputs import model_spec
from planner.api.results import Profiled
from planner.core import arguments as arg
from planner.core.errors import PlanInputError
from planner.layout.ranks import LayoutError, RankLayout, build_layout, require_node_local_tp
from planner.model.spec import ModelSpec
from planner.pipeline.job import SimulationJob, on_stack, run_simulation, simulation_job
from planner.pipeline.job import simulation_summary as summary_of, stack_note
from planner.pipeline.sim_result import SimResult
from planner.profiling.machine import calibrate
from planner.profiling.profiler import profile_model
from planner.stack import resolve_stack


def profile(model=None, *, device: str = "cpu", tp: int = 1, micro_batch: int = 1,
            seq_len: int | None = None, budget_s: float = 10.0, repeats: int = 5,
            progress=None) -> Profiled:
    """Measure every distinct layer's passes on this machine (`plan profile`): a Profiled.
    Every argument is checked first (PlanInputError)."""
    arg.text("device", device, optional=False)
    arg.whole("tp", tp, optional=False)
    arg.whole("micro_batch", micro_batch, optional=False)
    arg.whole("repeats", repeats, optional=False)
    arg.number("budget_s", budget_s, low=0, low_open=True, optional=False)
    arg.callback("progress", progress)
    return measure_layers(model_spec(model), device=device, tp=tp, micro_batch=micro_batch,
                          seq_len=seq_len, budget_s=budget_s, repeats=repeats, progress=progress)


def measure_layers(spec: ModelSpec, *, device: str, tp: int, micro_batch: int,
                   seq_len: int | None, budget_s: float, repeats: int, progress=None) -> Profiled:
    """Every distinct layer of ``spec`` timed on this machine as given (`plan profile` checks its
    flags itself): a Profiled. ``progress(done, total, label)`` is called per layer."""
    return Profiled(profile_model(spec, device=device, tp=tp, micro_batch=micro_batch,
                                  seq_len=seq_len, budget_s=budget_s, repeats=repeats,
                                  progress=progress))


def measure_machine(device: str, progress=None) -> dict:
    """This machine's matmul and memory speed measured on ``device`` (cpu or gpu): a hardware
    profile as the JSON document ``--hardware`` reads (`plan profile --calibrate`)."""
    return calibrate(device, progress=progress)


def simulation(pp: int | None, microbatches: int | None, schedule: str | None,
               virtual_stages: int | None, stage_times: str | None, comm_time: float | None,
               plan_file: str | Path | None = None,
               stack: str | Path | None = None) -> tuple[SimulationJob, str | None]:
    """The schedule to simulate, from a plan.json or from the sizes (None: the default), run as
    ``stack`` (a name or file) runs it where given; and what of the stack the chart does not
    draw, in one line (None: nothing). PlanInputError on bad sizes or a schedule the stack lacks."""
    job = simulation_job(pp, microbatches, schedule, virtual_stages, stage_times, comm_time,
                         plan_file)
    if stack is None:
        return job, None
    runs_on = resolve_stack(stack)
    job = on_stack(job, runs_on)
    return job, stack_note(job, runs_on)


def simulate(job: SimulationJob) -> SimResult:
    """``job`` run op by op: every rank's actions with their start and end times."""
    return run_simulation(job)


def simulation_summary(result: SimResult) -> dict:
    """A simulation as JSON-ready data: schedule and sizes, makespan, bubble (simulated and closed
    form) and each rank's busy and idle time and peak in-flight microbatches."""
    return summary_of(result)


def layout(tp: int, pp: int, dp: int, gpus_per_node: int, order: str, *, cp: int = 1,
           ep: int = 1, etp: int | None = None, nvlink_domain: int | None = None) -> RankLayout:
    """Which rank runs which (tp, cp, pp, dp) slice on which node, and the process groups
    (`plan layout`); PlanInputError when the sizes do not place or TP leaves the NVLink domain."""
    try:
        if nvlink_domain is not None and (nvlink_domain < 1 or nvlink_domain % gpus_per_node):
            raise LayoutError(f"--nvlink-domain {nvlink_domain} must be a positive multiple "
                              f"of --gpus-per-node {gpus_per_node}")
        rank_layout = build_layout(tp, pp, dp, gpus_per_node, order, cp=cp, ep=ep, etp=etp,
                                   nvlink_domain=nvlink_domain)
        require_node_local_tp(rank_layout)
    except LayoutError as e:
        raise PlanInputError(str(e)) from None
    return rank_layout
