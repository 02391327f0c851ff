"""Searching and splitting: `plan solve` (and --explain), `plan partition`, `plan sweep`."""

from __future__ import annotations

from planner.api.inputs import check_pins, hardware_of, model_spec, stack_of
from planner.api.solving import batch_hint, explain_request, search_plans, solve_request
from planner.api.results import Explanation, Partition, Solution
from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.core.schedules import DEFAULT_SCHEDULE
from planner.hardware.profiles import make_cluster
from planner.partitioning.problem import PartitionError
from planner.pipeline.job import check_sizes
from planner.pipeline.schedule import ScheduleError
from planner.predict.stages import METHODS
from planner.report.partition import compare_splits, place_nodes
from planner.search.request import Pins, Request
from planner.search.rules import tp_rule
from planner.search.validation import validate_pins
from planner.sweeping import DEFAULT_MAX_POINTS, SweepResult, run_sweep
from planner.core import arguments as arg


def solve(gpus: int, nodes: int, model=None, *, gpu: str | None = None, hardware=None,
          global_batch: int | None = None, global_batch_range: tuple[int, int] | None = None,
          seq_len: int | None = None, max_bubble: float | None = None, top: int = 10,
          refine: int | str = "auto", launcher: str | None = None, partition: str = "auto", profile=None,
          stack=None, flash: bool | None = None, overlap: bool | None = None,
          tp_overlap: bool | None = None, grad_dtype: str | None = None,
          precision: str | None = None, tp: int | None = None, pp: int | None = None, dp: int | None = None, micro_batch: int | None = None,
          schedule: str | None = None, virtual_stages: int | None = None,
          recompute: str | None = None, zero: int | None = None,
          sequence_parallel: bool | None = None, cp: int | None = None,
          ep: int | None = None, etp: int | None = None, power_limit: float | None = None,
          expert_load: float | None = None, memory_headroom: float | None = None,
          global_batch_tokens=None, progress=None) -> Solution:
    """Search the parallel configurations of ``model`` on ``gpus`` GPUs in ``nodes`` nodes and
    return the best plans (`plan solve`). Pins (``tp``, ``pp``, ...) fix a dimension; ``stack``
    is a stack name, file or Stack (default: the launcher's, else megatron-core), ``flash`` ...
    ``grad_dtype``, ``precision``, ``expert_load`` override its fields; ``power_limit`` (watts)
    caps the board power; ``memory_headroom`` is the share of each GPU's memory a plan keeps
    free (default: the worst memory under-estimate of comparable published runs);
    ``global_batch_tokens`` (``"16Mi"``, 4e6) gives the batch in tokens instead of sequences;
    ``progress(done, total)`` is called while screening. A wrong type or value of any argument
    raises PlanInputError."""

    pins = dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                virtual_stages=virtual_stages, recompute=recompute, zero=zero,
                sequence_parallel=sequence_parallel, cp=cp, ep=ep, etp=etp)
    arg.callback("progress", progress)
    req = solve_request(gpus, nodes, model, gpu=gpu, hardware=hardware,
                        global_batch=global_batch, global_batch_range=global_batch_range,
                        seq_len=seq_len, max_bubble=max_bubble, top=top, refine=refine,
                        launcher=launcher, partition=partition, profile=profile, stack=stack,
                        flash=flash, overlap=overlap, tp_overlap=tp_overlap,
                        grad_dtype=grad_dtype, precision=precision, pins=pins,
                        power_limit=power_limit, expert_load=expert_load,
                        memory_headroom=memory_headroom, global_batch_tokens=global_batch_tokens)
    result = search_plans(req, progress)
    return Solution(plans=result.plans, considered=result.considered,
                    rejected=dict(result.rejected), screened=result.screened,
                    elapsed_s=result.elapsed_s, notes=result.notes,
                    hint=batch_hint(req, result.plans[0]), candidates=result.candidates)


def explain(gpus: int, nodes: int, model=None, *, gpu: str | None = None, hardware=None,
            global_batch: int | None = None, seq_len: int | None = None, launcher: str | None = None,
            stack=None, flash: bool | None = None, overlap: bool | None = None,
            tp_overlap: bool | None = None, grad_dtype: str | None = None,
            precision: str | None = None, tp: int | None = None, pp: int | None = None,
            dp: int | None = None, micro_batch: int | None = None, schedule: str | None = None,
            virtual_stages: int | None = None, recompute: str | None = None,
            zero: int | None = None, sequence_parallel: bool | None = None,
            cp: int | None = None, ep: int | None = None,
            etp: int | None = None, power_limit: float | None = None,
            expert_load: float | None = None,
            memory_headroom: float | None = None) -> Explanation:
    """Predict one pinned configuration (`plan solve --explain`): fits or not, by how much."""

    pins = dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                virtual_stages=virtual_stages, recompute=recompute, zero=zero,
                sequence_parallel=sequence_parallel, cp=cp, ep=ep, etp=etp)
    req = solve_request(gpus, nodes, model, gpu=gpu, hardware=hardware, global_batch=global_batch,
                        seq_len=seq_len, refine=20, launcher=launcher, stack=stack, flash=flash,
                        overlap=overlap, tp_overlap=tp_overlap, grad_dtype=grad_dtype,
                        precision=precision, pins=pins, power_limit=power_limit,
                        expert_load=expert_load, memory_headroom=memory_headroom)
    exp = explain_request(req)
    return Explanation(exp.parallel, exp.plan, exp.capacity_bytes, exp.rule)


def partition(model=None, *, pp: int, tp: int = 1, dp: int = 1, micro_batch: int = 1,
              microbatches: int | None = None, schedule: str = DEFAULT_SCHEDULE,
              virtual_stages: int = 1,
              recompute: str = "full", zero: int = 1, gpu: str | None = None, hardware=None,
              nodes: int | None = None, seq_len: int | None = None, solver: str = "auto",
              stack=None, flash: bool | None = None, overlap: bool | None = None,
              tp_overlap: bool | None = None, grad_dtype: str | None = None,
              precision: str | None = None) -> Partition:
    """Split the layers into ``pp`` stages balanced by compute under memory (`plan partition`),
    beside the even and the equal-parameter split. ``microbatches`` defaults to 4 x pp; the
    tp·pp·dp GPUs sit on ``nodes`` nodes, by default as `plan partition` places them
    (``Partition.placement`` says how)."""
    check_pins(dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                    virtual_stages=virtual_stages, recompute=recompute, zero=zero))
    arg.whole("microbatches", microbatches)
    arg.whole("nodes", nodes)
    for name, value in (("pp", pp), ("schedule", schedule), ("recompute", recompute)):
        if value is None:
            raise PlanInputError(f"{name} is required")
    spec = model_spec(model, seq_len)
    run_stack = stack_of(stack, None, flash, overlap, tp_overlap, grad_dtype, precision)
    if not isinstance(solver, str) or solver not in METHODS:
        raise PlanInputError(f"solver must be one of {', '.join(METHODS)}, got {solver!r}")
    cmp, placement = compare_partitions(
        spec, hardware_of(gpu, hardware), run_stack, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
        microbatches=microbatches, schedule=schedule, virtual_stages=virtual_stages,
        recompute=recompute, zero=zero, nodes=nodes, solver=solver)
    return Partition(cmp.optimal, cmp.even, cmp.equal_params, cmp.method, cmp.capacity_bytes,
                     placement)


def compare_partitions(spec, hw, run_stack, *, tp: int, pp: int, dp: int, micro_batch: int,
                       microbatches: int | None, schedule: str, virtual_stages: int,
                       recompute: str, zero: int, nodes: int | None, solver: str, lp_path=None):
    """What `plan partition` and :func:`partition` compute: the tp·pp·dp GPUs placed on nodes,
    the pins checked, and the optimal split beside the even and equal-parameter ones.
    Returns (SplitComparison, placement)."""
    m = microbatches or 4 * pp
    gpus = tp * pp * dp
    node_count, placement = place_nodes(gpus, tp, hw.gpus_per_node, nodes)
    cluster = make_cluster(hw, gpus, node_count)
    pins = Pins(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                virtual_stages=virtual_stages, recompute=recompute, zero=zero)
    validate_pins(Request(model=spec, cluster=cluster, global_batch=micro_batch * m * dp,
                          pins=pins))
    rule = tp_rule(spec, cluster, tp)
    if rule is not None:
        raise PlanInputError(f"--tp {tp}: {rule}")
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, num_microbatches=m,
                   schedule=schedule, virtual_stages=virtual_stages, recompute=recompute,
                   zero=zero, sequence_parallel=tp > 1)
    try:
        cmp = compare_splits(spec, cluster, par, run_stack, solver, lp_path=lp_path,
                             placement=placement)
    except (PartitionError, ScheduleError) as e:
        raise PlanInputError(str(e)) from None
    return cmp, placement


def sweep(spec, *, backend: str = "local", workers: int | None = None, cache=None,
          max_points: int = DEFAULT_MAX_POINTS, out=None, plot=None, force: bool = False,
          progress=None) -> SweepResult:
    """Solve every point of a sweep spec (`plan sweep`): ``spec`` a YAML/JSON/TOML file, an inline
    mapping ("{gpus: [8, 16]}") or a dict of solve inputs to values, lists or ranges; each point
    is one :func:`solve`. ``backend`` local (a process pool of ``workers``, default the cores),
    ray or serial; ``cache`` a directory of finished points (resumes an interrupted sweep);
    ``out`` (.csv/.parquet) and ``plot`` (.svg/.html) are written after it. ``.to_frame()``: one
    row per point. docs/sweep.md has a worked example."""
    return run_sweep(spec, solve, backend=backend, workers=workers, cache=cache,
                     max_points=max_points, out=out, plot=plot, force=force, progress=progress)


PARTITION_SOLVERS = METHODS  # `plan partition --solver`: auto, ilp, dp


def check_pipeline(pp: int, microbatches: int, virtual_stages: int) -> None:
    """Raise PlanInputError unless ``pp`` ranks of ``virtual_stages`` chunks can run
    ``microbatches`` microbatches (the sizes every schedule needs); return nothing."""
    check_sizes(pp, microbatches, virtual_stages)
