"""Timing a pipeline schedule's step: step time, bubble and peak activations per rank.

`simulate` times a step by the fastest exact path.  The model, and the reference, is the op-by-op
walk (planner/pipeline/op_by_op.py: `simulate_ops`, and ``simulate(..., method="full")``).
``method="auto"`` (the default) gives the same floats faster: from a shape's second configuration on, it times the shape's run compiled
once into a dependency graph (planner/pipeline/compiled.py), a few numpy operations per depth of
the graph instead of Python per op.  For long runs `simulate` simulates a short run instead and
repeats its steady period exactly (planner/pipeline/periodic.py explains why that is exact), so
its cost stops growing with the microbatch count once the pipeline is in steady state; the
timeline it returns is then the short run's, a compressed picture of the step.

The step's times per chunk and the engine's per-action charges: planner/pipeline/chunk_times.py;
what a step reports: planner/pipeline/sim_result.py.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.core.schedules import GPIPE, schedule_traits
from planner.pipeline import compiled, graph, periodic
from planner.pipeline.chunk_times import OpTimes, PerChunk, boundary_comm, charge_actions, per_chunk
from planner.pipeline.op_by_op import simulate_ops, time_ops
from planner.pipeline.ops import Op
from planner.pipeline.schedule import ScheduleError, build_schedule, check_args
from planner.pipeline.sim_result import SimResult, TimedOp, step_result


def closed_form_bubble(name: str, p: int, m: int, v: int = 1) -> float:
    """Textbook idle share of the step with uniform stages and free communication.

    GPipe/1F1B: (p-1)/(m+p-1); interleaved: (p-1)/(v*m+p-1); zb-h1 with F = B = W:
    (p-1)/(3m+p-1), i.e. a third of 1F1B's idle time (Qi et al. 2023). zb-2p reaches the same
    with F = B = W once m > p (the last rank cannot start before p-1 forwards): its gain over
    zb-h1 shows when B and W differ or transfers cost time (tests/test_simulate.py).
    dualpipe with F = B = W and no overlap: every rank idles the report's (p/2-1)(F&B+B-3W) =
    (p-2)F beside 3mF of work, (p-2)/(3m+p-2) (tests/test_dualpipe.py).
    """
    traits = schedule_traits(name)
    if traits.mirrored:  # (p/2 - 1)(F&B + B - 3W) idle with F&B = F + B = 3, B = 2, W = 1
        return (p - 2) / (3 * m + p - 2)
    return (p - 1) / (traits.fill_divisor(v) * m + p - 1)


def simulate(
    name: str,
    p: int,
    m: int,
    v: int = 1,
    *,
    fwd_s: PerChunk,
    bwd_s: PerChunk,
    wgrad_s: PerChunk | None = None,
    comm_s: PerChunk = 0.0,
    act_bytes: PerChunk | None = None,
    timeline: bool = True,
    method: str = "auto",
    action_s: float = 0.0,
    split_backward: float = 0.0,
    overlap_fwd_s: PerChunk = 0.0,
    overlap_bwd_s: PerChunk = 0.0,
    interference: float = 0.0,
) -> SimResult:
    """Simulate schedule `name` for p ranks, m microbatches, v chunks per rank.

    fwd_s, bwd_s, wgrad_s, act_bytes: a float for every chunk or a sequence of p*v indexed by
    global chunk.  bwd_s is the full backward; in zb-h1 and zb-2p B takes bwd_s - wgrad_s, W takes
    wgrad_s (default half of bwd_s); other schedules ignore wgrad_s.  comm_s: one transfer across
    a chunk boundary, float or p*v-1 values (boundary k sits between chunks k and k+1).
    ``timeline=False`` skips building the per-op timeline (the planner needs only the summary).
    ``method``: "full" times every op (the reference); "auto" (default) does that for short runs
    and, for long ones, times a short run and repeats its steady period (or, for GPipe, uses its
    exact closed form): the same step, busy, idle and peaks, at a cost that stops growing with m.
    The timeline is then the short run's (``timeline_m`` says how many microbatches it draws).
    ``action_s`` and ``split_backward``: the engine's per-action costs (see `charge_actions`).
    ``overlap_fwd_s`` / ``overlap_bwd_s`` (per chunk) and ``interference``: DualPipe's F&B pairs
    (`dualpipe.pair_s`): the all-to-all in a chunk's forward and full backward that a pair hides,
    and the share of the compute the hiding costs; other schedules ignore them.
    """
    if method not in ("auto", "full"):
        raise ScheduleError(f"unknown simulation method {method!r}; choose auto or full")
    check_args(name, p, m, v)
    traits = schedule_traits(name)
    fwd_s, bwd_s, wgrad_s = charge_actions(traits.weight_grad_ops, p * v,
                                           fwd_s, bwd_s, wgrad_s, action_s, split_backward)
    args = dict(fwd_s=fwd_s, bwd_s=bwd_s, wgrad_s=wgrad_s, comm_s=comm_s, act_bytes=act_bytes)
    overlap = (overlap_fwd_s, overlap_bwd_s, interference)
    if method == "auto" and m > FULL_UP_TO:
        if not traits.periodic and m > _gpipe_drawn(p):
            return _gpipe(p, m, timeline, **args)
        if traits.periodic and m > 2 * _first_short_run(name, p, v):
            fast = _extrapolated(name, p, m, v, timeline, overlap, **args)
            if fast is not None:
                return fast
    run = _compiled_run(name, p, m, v) if method == "auto" else None
    if run is not None:
        table = OpTimes(name, p * v, args, overlap).table(run.graph)
        comm = graph.comm_table(boundary_comm(comm_s, p, v), traits.mirrored)
        return _timed(run, name, p, m, v, table, comm, act_bytes, timeline)[1]
    return time_ops(build_schedule(name, p, m, v), name, p, m, v, timeline=timeline,
                    overlap=overlap, **args)[0]


FULL_UP_TO = 64  # microbatches simulated in full (every op) whatever the method: cheap, and drawn


def simulated_ops(name: str, p: int, m: int, v: int = 1) -> int:
    """The ops `simulate` builds for a shape it has not seen (``method="auto"``), known before
    any of them is built (an upper bound where F&B pairs fuse two): a forward and a backward (and
    a W where the schedule has W ops) per chunk a microbatch passes, per simulated microbatch,
    the microbatches following `simulate`'s own dispatch. A long periodic run builds its first
    short run and that run plus one period (`_steady_cut`); GPipe's closed form builds none. The
    count assumes the first short run has its cut, as tests/test_work_budget.py checks for every
    schedule (a run without one would double it, and simulate the whole run at last). The
    caller's work budget counts these (planner/fidelity/work.py), never seconds, so the same
    input gets the same answer."""
    traits = schedule_traits(name)
    # a mirrored schedule's microbatch runs one direction, through p of its 2p chunks
    stages = p if traits.mirrored else p * traits.chunks_per_rank(v)
    per_microbatch = stages * (3 if traits.weight_grad_ops else 2)
    if m > FULL_UP_TO:
        if not traits.periodic and m > _gpipe_drawn(p):
            return 0
        short = _first_short_run(name, p, v)
        if traits.periodic and m > 2 * short:
            return per_microbatch * (2 * short + _group(name, p))
    return per_microbatch * m


def _first_short_run(name: str, p: int, v: int) -> int:
    """Microbatches of the first short run: warm-up (ZB-H1's last rank starts deferring W after
    p - 1 backwards; DualPipe's rank 0 enters its steady pairs after 2p), a cut, the next period
    and cool-down; doubled while no cut is found.  1F1B has a steady cut from p + 1 microbatches
    on (checked for p = 2 to 64 in tests/test_periodic.py): its run is half as long as 2p + 4,
    and the cut found there is as exact as any (planner/pipeline/periodic.py checks it, not
    assumes it)."""
    per_rank, extra = schedule_traits(name).short_run
    return per_rank * p + extra


def _gpipe_drawn(p: int) -> int:
    return 2 * p + 4


def _group(name: str, p: int) -> int:
    """Microbatches of one period: p for interleaved, one of each direction for DualPipe."""
    return schedule_traits(name).period_microbatches(p)


def _extrapolated(name, p, m, v, keep_timeline, overlap, **args) -> SimResult | None:
    """The step of m microbatches from a short run and its steady period (see
    planner/pipeline/periodic.py); None when no short run of at most m/2 microbatches has a cut
    in its periodic part (the caller then simulates all m)."""
    group = _group(name, p)
    short = _first_short_run(name, p, v)
    while 2 * short <= m:
        if _steady_cut(name, p, v, short, group) is not None:
            parts = _periodic_parts(name, p, v, short, group)
            return None if parts is None else _repeated(name, p, m, v, short, group, parts,
                                                        keep_timeline, args, overlap)
        short *= 2
    return None


@lru_cache(maxsize=64)
def _steady_cut(name, p, v, short, group):
    """The short run's ops, labels, the last cut in its periodic part and the state's
    components there, or None.  A function of the schedule's shape only, so memoised: the
    planner simulates many configurations of the same shape."""
    ops = build_schedule(name, p, short, v)
    labels = tuple(tuple(lab) for lab in periodic.group_labels(ops, group, v))
    keys = periodic.cut_keys(ops, labels, p, v, group)
    if keys is None:
        return None
    release = schedule_traits(name).releases
    cuts = periodic.steady_cuts(ops, build_schedule(name, p, short + group, v), labels, keys,
                                group, release)
    # the last one: the fewest ops left to time symbolically after it
    return (ops, labels, cuts[-1], keys[cuts[-1]]) if cuts else None


@lru_cache(maxsize=16)
def _periodic_parts(name, p, v, short, group) -> compiled.Periodic | None:
    """The compiled short run and its periodic parts (compiled.py), memoised like the cut."""
    run = compiled.compile_run(name, p, short, v)
    if run is None:
        return None
    _, labels, cut, keys = _steady_cut(name, p, v, short, group)
    return compiled.periodic_parts(run, labels, cut, keys, p, v, group,
                                   schedule_traits(name).mirrored)


def _repeated(name, p, m, v, short, group, parts: compiled.Periodic, keep_timeline, args,
              overlap=(0.0, 0.0, 0.0)):
    """Time the short run, then the m - short microbatches more as (m - short) / group steady
    periods and the cool-down after them (compiled.extend, planner/pipeline/periodic.py)."""
    run = compiled.compile_run(name, p, short, v)
    table = OpTimes(name, p * v, args, overlap).table(run.graph)  # the parts index it too
    comm = graph.comm_table(boundary_comm(args["comm_s"], p, v), schedule_traits(name).mirrored)
    timed, short_run = _timed(run, name, p, short, v, table, comm, args["act_bytes"],
                              keep_timeline)
    k = (m - short) // group
    rank_end, work = compiled.extend(parts, table, comm, timed.values, k)
    makespan = max(rank_end)
    span = max(e - s for e, s in zip(rank_end, short_run.rank_start_s))
    busy = [b + k * w for b, w in zip(short_run.busy_s, work)]
    return step_result(name, p, m, v, short_run.timeline, makespan, busy,
                       short_run.peak_inflight, short_run.peak_activation_bytes,
                       timeline_m=short if keep_timeline else None, span=span,
                       rank_start=short_run.rank_start_s)


_ASKED: dict[tuple, int] = {}  # shapes the whole-run path was asked for (`_compiled_run`)


def _compiled_run(name, p, m, v) -> compiled.Run | None:
    """The compiled run of a shape asked for before, else None (simulated op by op): compiling
    costs about one op-by-op run, timing the compiled run a fifth to a third of one (1F1B on 128
    ranks, interleaved on 16 with v = 6, measured), so it pays from a shape's second
    configuration on."""
    shape = (name, p, m, v)
    asked = _ASKED.get(shape, 0) + 1
    if asked < 2:
        if len(_ASKED) >= 256:
            _ASKED.pop(next(iter(_ASKED)))
        _ASKED[shape] = asked
        return None
    return compiled.compile_run(name, p, m, v)


def _timed(run: compiled.Run, name, p, m, v, table, comm, act_bytes,
           keep_timeline) -> tuple[compiled.Timed, SimResult]:
    """A compiled run timed (compiled.time_run) and summarised as the op-by-op walk summarises
    its ops (planner/pipeline/op_by_op.py)."""
    chunks = p * v
    act = np.asarray(per_chunk(act_bytes, chunks, "act_bytes") or [0.0] * chunks)
    timed = compiled.time_run(run, table, comm, act)
    timeline = []
    if keep_timeline:
        for row, ends, starts in zip(run.prog, timed.ends, timed.starts):
            timeline.append(tuple(
                TimedOp(Op(graph.CODE_KIND[code], idx // chunks, idx % chunks, paired=code == 4),
                        start, end) for (code, idx), start, end in zip(row, starts, ends)))
    makespan = max((e[-1] for e in timed.ends if e), default=0.0)
    first = [s[0] if s else 0.0 for s in timed.starts]
    span = max((e[-1] - f for e, f in zip(timed.ends, first) if e), default=0.0)
    return timed, step_result(name, p, m, v, timeline, makespan, timed.busy, run.peak_n,
                              timed.peak_bytes, span=span, rank_start=first)


def _gpipe(p, m, keep_timeline, *, fwd_s, bwd_s, wgrad_s, comm_s, act_bytes) -> SimResult:
    """GPipe at any m from its exact closed form (periodic.gpipe_makespan); the timeline is a
    short run's. Rank 0 starts first and ends last (its B of microbatch 0), so no rank's span
    is longer than the step."""
    fwd = per_chunk(fwd_s, p, "fwd_s")
    bwd = per_chunk(bwd_s, p, "bwd_s")
    act = per_chunk(act_bytes, p, "act_bytes") or [0.0] * p
    makespan = periodic.gpipe_makespan(fwd, bwd, boundary_comm(comm_s, p, 1), m)
    drawn = None
    if keep_timeline:
        drawn = simulate_ops(build_schedule(GPIPE.name, p, _gpipe_drawn(p), 1), GPIPE.name, p,
                             _gpipe_drawn(p), fwd_s=fwd, bwd_s=bwd, comm_s=comm_s)
    return step_result(GPIPE.name, p, m, 1, drawn.timeline if drawn else (), makespan,
                       [m * (f + b) for f, b in zip(fwd, bwd)], (m,) * p,
                       tuple(m * a for a in act), timeline_m=_gpipe_drawn(p) if drawn else None)
