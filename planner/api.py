"""The Python API: what the CLI does, as functions returning typed results with ``.to_frame()``.

    from planner import solve
    result = solve(gpus=16, nodes=2)             # the search of `plan solve`
    result.to_frame()                            # one row per plan (pandas), best first
    result.stages().to_frame()                   # the best plan's stages

``solve``, ``explain``, ``partition``, ``validate`` and ``profile`` take the CLI's options as
keyword arguments (the same names, underscores for dashes) and raise ``PlanInputError`` (a
ValueError) with the CLI's one-line message on bad input, ``NoFeasiblePlan`` when nothing fits.
``model`` is a preset name, a model.json or HF config.json path, or a ModelSpec; ``hardware`` a
hardware JSON path or a Hardware. Every result is a frozen dataclass holding the planner's own
objects (Plan, Profile, ValidationRow, ...), so nothing is lost by the frames.

Floor: top (beside cli.py); ``planner/__init__.py`` re-exports these names lazily, so
``import planner`` (and ``plan --help``) does not pay for the search modules or pandas.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Every sub-package is imported here, not inside the functions: `planner.partitioning` and
# `planner.profiling` are both sub-packages and API functions, and importing a sub-package for the
# first time re-binds its name on `planner` (see planner/__init__.py).
from planner.core import arguments as arg
from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.core.parallel import Parallel
from planner.core.schedules import DEFAULT_SCHEDULE
from planner.fidelity.cases import DEFAULT_FILES
from planner.fidelity.published import validate_file
from planner.hardware.power import power_limited
from planner.hardware.profiles import Cluster, Hardware, load_hardware, make_cluster
from planner.launchers import refuse_unbuildable
from planner.model.spec import ModelSpec
from planner.model.load import load_model
from planner.partitioning.problem import PartitionError
from planner.pipeline.schedule import ScheduleError
from planner.predict.plan import Plan
from planner.predict.stages import METHODS
from planner.profiling.profiler import profile_model
from planner.profiling.record import Profile, device_mismatch, load_profile, save_profile
from planner.report import frames
from planner.report.partition import compare_splits, place_nodes
from planner.search.advice import batch_hint
from planner.search.explain import explain as explain_request
from planner.search.profiled import check_profile_matches
from planner.search.request import Pins, Request, parse_refine
from planner.search.rules import tp_rule
from planner.search.solver import search
from planner.search.validation import validate_pins
from planner.cost.precision import check_fp8
from planner.launchers import expert_load_refusal, precision_allows, stack_refusal
from planner.stack import Stack, resolve_stack, with_overrides
from planner.sweeping import DEFAULT_MAX_POINTS, SweepResult, run_sweep

__all__ = ["solve", "explain", "partition", "validate", "profile", "Solution", "Stages",
           "Explanation", "Partition", "Validation", "Profiled", "PlanInputError",
           "NoFeasiblePlan", "sweep", "SweepResult", "DEFAULT_MAX_POINTS"]


# --- results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stages:
    """One plan's per-stage breakdown: layers, recompute, per-microbatch times, memory."""

    plan: Plan

    def to_frame(self):
        return frames.stages_frame(self.plan)


@dataclass(frozen=True)
class Solution:
    """The plans of a search, best first, and how the configurations considered were spent."""

    plans: tuple[Plan, ...]
    considered: int  # configurations of the search space = sum(rejected) + not refined + feasible
    rejected: dict[str, int]
    screened: int
    elapsed_s: float
    notes: tuple[str, ...]
    hint: str | None = None  # a larger global batch, when the best plan's pipeline idles

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def stages(self, rank: int = 1) -> Stages:
        """The per-stage breakdown of the plan ranked ``rank`` (1 = best, as in the table)."""
        if not 1 <= rank <= len(self.plans):
            raise PlanInputError(f"rank must be 1..{len(self.plans)}, got {rank}")
        return Stages(self.plans[rank - 1])

    def to_frame(self):
        """One row per plan (index: rank, 1 = best); the columns of `plan solve --csv`."""
        return frames.plans_frame(self.plans)


@dataclass(frozen=True)
class Explanation:
    """One pinned configuration: its prediction, whether it fits in memory, or the rule it breaks."""

    parallel: Parallel | None
    plan: Plan | None
    capacity_bytes: float
    rule: str | None

    @property
    def fits(self) -> bool:
        return (self.rule is None and self.plan is not None
                and self.plan.metrics.peak_memory_bytes <= self.capacity_bytes)

    def to_frame(self):
        """The configuration's stages (empty when a rule forbids it before any prediction)."""
        if self.plan is None:
            import pandas as pd

            return pd.DataFrame()
        return frames.stages_frame(self.plan)


@dataclass(frozen=True)
class Partition:
    """`plan partition`: the min-bottleneck split beside Megatron's even and the equal-parameter
    split of the same configuration."""

    optimal: Plan
    even: Plan
    equal_params: Plan
    method: str
    capacity_bytes: float
    placement: str = ""  # how the GPUs were placed on nodes

    @property
    def gain(self) -> float:
        """Throughput gain of the min-bottleneck split over the even split."""
        return self.even.metrics.step_time_s / self.optimal.metrics.step_time_s - 1

    def stages(self, split: str = "optimal") -> Stages:
        return Stages(getattr(self, split))

    def to_frame(self):
        """One row per split: the plans-frame columns of each (index: split name)."""
        frame = frames.plans_frame([self.optimal, self.even, self.equal_params])
        frame.index = ["min-bottleneck", "even", "equal parameters"]
        frame.index.name = "split"
        frame["fits"] = frame["peak_memory_bytes"] <= self.capacity_bytes
        return frame


@dataclass(frozen=True)
class Validation:
    """`plan validate`: each published run predicted and compared, and the summary."""

    rows: tuple
    summary: object  # planner.validate.ValidationSummary

    def to_frame(self):
        """One row per case (index: case name) with the signed errors."""
        return frames.validation_frame(self.rows)


@dataclass(frozen=True)
class Profiled:
    """`plan profile`: measured per-layer times on this machine."""

    profile: object  # planner.profiling.Profile

    def to_frame(self):
        """One row per model layer with the passes' median times and their spread."""
        return frames.profile_frame(self.profile)

    def save(self, path, force: bool = False) -> Path:

        return save_profile(self.profile, path, force=force)


# --- inputs --------------------------------------------------------------------------------------


def _model(model, seq_len: int | None = None) -> ModelSpec:
    arg.source("model", model, (ModelSpec,), "a preset name or a model file path")
    arg.whole("seq_len", seq_len)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    return spec.with_seq_length(seq_len)


def _hardware(gpu: str | None, hardware, power_limit: float | None = None) -> Hardware:
    arg.text("gpu", gpu)
    arg.source("hardware", hardware, (Hardware,), "a hardware JSON path")
    if gpu is not None and hardware is not None:
        raise PlanInputError("give gpu (a bundled GPU's name) or hardware (a file or Hardware), "
                             "not both")
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(gpu, hardware)
    if power_limit is not None:
        hw = power_limited(hw, arg.number("power_limit", power_limit, low=0, low_open=True))
    return hw


def _cluster(gpus: int, nodes: int, gpu: str | None, hardware,
             power_limit: float | None = None) -> Cluster:
    arg.whole("gpus", gpus, optional=False)
    arg.whole("nodes", nodes, optional=False)
    return make_cluster(_hardware(gpu, hardware, power_limit), gpus, nodes)


def _check_pins(pins: dict) -> dict:
    """The pins by kind: degrees and counts whole and positive, zero a stage from 0, schedule and
    recompute names, sequence_parallel a real bool."""
    for key, value in pins.items():
        if key in ("schedule", "recompute"):
            arg.text(key, value)
        elif key == "sequence_parallel":
            arg.flag(key, value)
        else:
            arg.whole(key, value, low=0 if key == "zero" else 1)
    return pins


def _stack(stack, launcher=None, flash=None, overlap=None, tp_overlap=None,
           grad_dtype=None, precision=None) -> Stack:
    """A Stack as given, or resolved like the CLI's --stack and its override flags."""
    arg.source("stack", stack, (Stack,), "a stack name or file path")
    arg.text("launcher", launcher)
    for name, value in (("flash", flash), ("overlap", overlap), ("tp_overlap", tp_overlap)):
        arg.flag(name, value)  # flash='no' is truthy: it planned flash attention
    arg.text("grad_dtype", grad_dtype)
    arg.text("precision", precision)
    if isinstance(stack, Stack):
        overrides = (flash, overlap, tp_overlap, grad_dtype, precision)
        if any(x is not None for x in overrides):
            raise PlanInputError("pass a stack name or file to combine it with flash, overlap, "
                                 "tp_overlap, grad_dtype or precision; a Stack object is used "
                                 "as it is")
        return stack
    return resolve_stack(stack, launcher, flash, overlap, tp_overlap, grad_dtype, precision)


def _with_expert_load(stack: Stack, expert_load: float | None) -> Stack:
    """``expert_load`` (MoE: the busiest GPU's routed tokens over the mean) over the stack's."""
    if expert_load is None:
        return stack
    arg.number("expert_load", expert_load, low=0, low_open=True)
    return with_overrides(stack, "expert_load", moe_expert_load=expert_load)


def _request(gpus, nodes, model, gpu, hardware, global_batch, global_batch_range, seq_len,
             max_bubble, top, refine, launcher, partition_solver, profile, stack: Stack,
             pins: dict, power_limit: float | None = None):

    arg.whole("global_batch", global_batch)
    arg.number("max_bubble", max_bubble)
    arg.whole("top", top, optional=False)
    if not isinstance(refine, str):
        arg.whole("refine", refine, optional=False)
    arg.text("partition", partition_solver, optional=False)
    arg.source("profile", profile, (Profile,), "a profile file path")
    batch_range = arg.pair("global_batch_range", global_batch_range)
    _check_pins(pins)
    spec = _model(model, seq_len)
    refuse_unbuildable(launcher, spec)  # e.g. torchtitan builds only its own flavors
    measured = profile
    if isinstance(profile, (str, Path)):

        measured = load_profile(profile)
    if measured is not None:
        check_profile_matches(measured, spec)
    cluster = _cluster(gpus, nodes, gpu, hardware, power_limit)
    check_fp8(cluster.hardware, stack)  # FP8 on a GPU without FP8: one line
    # the CLI's rules: a profile of another device, a stack another launcher runs (its plans
    # would not run as priced), a precision the launcher lacks (DeepSpeed has no FP8)
    rule = (device_mismatch(measured, cluster.hardware) or stack_refusal(stack, launcher) or precision_allows(launcher, spec, stack)
            or expert_load_refusal(spec, stack))  # dense: nothing routed to weigh
    if rule:
        raise PlanInputError(rule)
    return Request(model=spec, cluster=cluster,
                   global_batch=global_batch, batch_range=batch_range, max_bubble=max_bubble,
                   profile=measured, pins=Pins(**pins), top=top, refine=parse_refine(refine),
                   launcher=launcher, partition_method=partition_solver, options=stack)


# --- functions -----------------------------------------------------------------------------------


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
          expert_load: float | None = None, progress=None) -> Solution:
    """Search the parallel configurations of ``model`` on ``gpus`` GPUs in ``nodes`` nodes and
    return the best plans (`plan solve`). Pins (``tp``, ``pp``, ...) fix a dimension; ``stack``
    is a stack name, file or Stack (default: the launcher's, else megatron-core), ``flash`` ...
    ``grad_dtype``, ``precision``, ``expert_load`` override its fields; ``power_limit`` (watts)
    caps the board power; ``progress(done, total)`` is called while screening. A wrong type or
    value of any argument raises PlanInputError."""

    pins = dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                virtual_stages=virtual_stages, recompute=recompute, zero=zero,
                sequence_parallel=sequence_parallel, cp=cp, ep=ep, etp=etp)
    arg.callback("progress", progress)
    run_stack = _stack(stack, launcher, flash, overlap, tp_overlap, grad_dtype, precision)
    req = _request(gpus, nodes, model, gpu, hardware, global_batch, global_batch_range, seq_len,
                   max_bubble, top, refine, launcher, partition, profile,
                   _with_expert_load(run_stack, expert_load), pins, power_limit)
    result = search(req, progress)
    return Solution(plans=result.plans, considered=result.considered,
                    rejected=dict(result.rejected), screened=result.screened,
                    elapsed_s=result.elapsed_s, notes=result.notes,
                    hint=batch_hint(req, result.plans[0], search))


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
            expert_load: float | None = None) -> Explanation:
    """Predict one pinned configuration (`plan solve --explain`): fits or not, by how much."""

    pins = dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                virtual_stages=virtual_stages, recompute=recompute, zero=zero,
                sequence_parallel=sequence_parallel, cp=cp, ep=ep, etp=etp)
    run_stack = _stack(stack, launcher, flash, overlap, tp_overlap, grad_dtype, precision)
    req = _request(gpus, nodes, model, gpu, hardware, global_batch, None, seq_len, None, 10, 20,
                   launcher, "auto", None, _with_expert_load(run_stack, expert_load), pins,
                   power_limit)
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
    _check_pins(dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                     virtual_stages=virtual_stages, recompute=recompute, zero=zero))
    arg.whole("microbatches", microbatches)
    arg.whole("nodes", nodes)
    for name, value in (("pp", pp), ("schedule", schedule), ("recompute", recompute)):
        if value is None:
            raise PlanInputError(f"{name} is required")
    spec = _model(model, seq_len)
    run_stack = _stack(stack, None, flash, overlap, tp_overlap, grad_dtype, precision)
    if not isinstance(solver, str) or solver not in METHODS:
        raise PlanInputError(f"solver must be one of {', '.join(METHODS)}, got {solver!r}")
    cmp, placement = compare_partitions(
        spec, _hardware(gpu, hardware), run_stack, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
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


def validate(file=None, progress=None) -> Validation:
    """Predict the bundled published runs (or those of ``file``) and compare (`plan validate`)."""

    arg.callback("progress", progress)
    if file is not None and not isinstance(file, (str, Path)):
        files = file if isinstance(file, (list, tuple)) else None
        if not files or not all(isinstance(f, (str, Path)) for f in files):
            # {} or [] is falsy: it validated the bundled runs without a word
            raise PlanInputError(f"file must be a runs-file path or a non-empty list of them, "
                                 f"got {file!r:.60}")
    rows, summary = validate_file(DEFAULT_FILES if file is None else file, progress=progress)
    return Validation(rows, summary)


def profile(model=None, *, device: str = "cpu", tp: int = 1, micro_batch: int = 1,
            seq_len: int | None = None, budget_s: float = 10.0, repeats: int = 5,
            progress=None) -> Profiled:
    """Measure every distinct layer's passes on this machine (`plan profile`)."""
    arg.text("device", device, optional=False)
    arg.whole("tp", tp, optional=False)
    arg.whole("micro_batch", micro_batch, optional=False)
    arg.whole("repeats", repeats, optional=False)
    arg.number("budget_s", budget_s, low=0, low_open=True, optional=False)
    arg.callback("progress", progress)

    return Profiled(profile_model(_model(model), device=device, tp=tp, micro_batch=micro_batch,
                                  seq_len=seq_len, budget_s=budget_s, repeats=repeats,
                                  progress=progress))


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
