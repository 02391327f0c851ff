"""Op-by-op timing of a pipeline schedule: step time, bubble and peak activations per rank.

Each rank runs its compute ops strictly in schedule order; an op starts when its rank is free and
its inputs have arrived.  Point-to-point transfers are latency on the dependency (`comm_s`), not
work on the compute stream.  Dependencies:
    F(m, k) <- F(m, k-1) + comm[k-1]
    B(m, k) <- F(m, k) and B(m, k+1) + comm[k]      (the last chunk's B needs only its own F)
    W(m, k) <- B(m, k)
DualPipe (planner/pipeline/dualpipe.py) adds BW, a backward computing both gradients (its
dependencies are B's), and the overlapped F&B pair: an F and the paired BW after it start
together once both inputs are in and end together, after `dualpipe.pair_s`; its microbatches of
the reverse direction cross boundary k on the link between ranks p-1-k and p-2-k.
The pass visits every op once or twice (a rank is parked on the op it waits for and woken when
that op's input finishes), so it is linear in the number of ops: `simulate_ops` and
``simulate(..., method="full")`` are the reference.  ``method="auto"`` (the default) gives the
same floats faster: from a shape's second configuration on, it times the shape's run compiled
once into a dependency graph (planner/pipeline/compiled.py), a few numpy operations per depth of
the graph instead of Python per op.  For long runs `simulate` simulates a short run instead and
repeats its steady period exactly (planner/pipeline/periodic.py explains why that is exact), so
its cost stops growing with the microbatch count once the pipeline is in steady state; the
timeline it returns is then the short run's, a compressed picture of the step.

What an engine adds to the compute (`charge_actions`): every action (F, B, W) costs the stack's
``action_s`` more (dispatch, p2p setup: measured on torch.distributed.pipelining by
benchmarks/bench_engine.py), and a backward split into B and W costs ``split_backward`` (a
fraction) more than the fused one, spread over B and W in proportion.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from planner.core.schedules import GPIPE, schedule_traits
from planner.pipeline import compiled, dualpipe, graph, periodic
from planner.pipeline.schedule import Op, ScheduleError, build_schedule, check_args


PerChunk = float | Sequence[float]


@dataclass(frozen=True)
class TimedOp:
    """A compute op placed in time on its rank."""

    op: Op
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimResult:
    """Timeline and summary of one simulated step (see module docstring for the model)."""

    p: int
    m: int
    v: int
    schedule: str
    timeline: tuple[tuple[TimedOp, ...], ...]
    makespan_s: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    bubble_fraction: float  # sum(idle) / (p * makespan): idle share of the step
    bubble_ratio: float  # sum(idle) / sum(busy): idle relative to ideal compute
    peak_inflight: tuple[int, ...]  # per rank, most (microbatch, chunk) activations held at once
    peak_activation_bytes: tuple[float, ...]  # per rank, most activation bytes held at once
    # microbatches the timeline draws when it is a compressed picture of a longer run (the steady
    # period repeats in between); None when it draws all m
    timeline_m: int | None = None
    # the longest time a rank spends from its first op's start to its last op's end: what a step
    # costs when consecutive steps overlap (no global sync before the optimizer step, as in the
    # zero-bubble fork's optimizer post-validation); None: the makespan
    span_s: float | None = None
    rank_start_s: tuple[float, ...] = ()  # per rank, when its first op starts


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


def _per_chunk(value: PerChunk | None, n: int, what: str) -> list[float] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)] * n
    values = [float(x) for x in value]
    if len(values) != n:
        raise ScheduleError(f"{what} has {len(values)} entries; expected {n} (one per chunk/boundary)")
    return values


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
        table = _Times(name, p * v, args, overlap).table(run.graph)
        comm = graph.comm_table(_effective_comm(comm_s, p, v), traits.mirrored)
        return _timed(run, name, p, m, v, table, comm, act_bytes, timeline)[1]
    return _simulate_ops(build_schedule(name, p, m, v), name, p, m, v, timeline=timeline,
                         overlap=overlap, **args)[0]


FULL_UP_TO = 64  # microbatches simulated in full (every op) whatever the method: cheap, and drawn


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


def _effective_comm(comm_s: PerChunk, p: int, v: int) -> list[float]:
    """One transfer time per chunk boundary; a boundary inside one rank (p == 1) costs nothing."""
    chunks = p * v
    comm = _per_chunk(comm_s, chunks - 1, "comm_s") if chunks > 1 else []
    return [0.0 if k % p == (k + 1) % p else c for k, c in enumerate(comm)]


def charge_actions(split: bool, chunks: int, fwd_s: PerChunk, bwd_s: PerChunk,
                   wgrad_s: PerChunk | None, action_s: float = 0.0,
                   split_backward: float = 0.0) -> tuple[PerChunk, PerChunk, PerChunk | None]:
    """Per-chunk (fwd_s, bwd_s, wgrad_s) with the engine's per-action costs charged.

    Every action costs ``action_s`` more: F and a fused B once each; a split backward runs two
    actions (B and W), so bwd_s gains 2 x action_s and wgrad_s one. A split backward also costs
    ``split_backward`` x its compute more than the fused one (torch.distributed.pipelining's
    stage_backward_input + stage_backward_weight against stage_backward, measured by
    benchmarks/bench_engine.py --split), charged in proportion to B and W. Without either cost
    the times come back as given."""
    if not action_s and not (split and split_backward):
        return fwd_s, bwd_s, wgrad_s
    fwd = [f + action_s for f in _per_chunk(fwd_s, chunks, "fwd_s")]
    bwd = _per_chunk(bwd_s, chunks, "bwd_s")
    if not split:
        return fwd, [b + action_s for b in bwd], wgrad_s
    wgrad = _per_chunk(wgrad_s, chunks, "wgrad_s") or [b / 2 for b in bwd]
    scale = 1.0 + split_backward
    return (fwd, [b * scale + 2 * action_s for b in bwd],
            [w * scale + action_s for w in wgrad])


def _op_times(split: bool, chunks: int, fwd_s, bwd_s, wgrad_s) -> tuple[list[float], ...]:
    """Per chunk: F, B and W times.  With a split backward (W ops present) B takes bwd_s -
    wgrad_s and W takes wgrad_s (default half of bwd_s); otherwise B is the whole backward."""
    fwd = _per_chunk(fwd_s, chunks, "fwd_s")
    bwd = _per_chunk(bwd_s, chunks, "bwd_s")
    if split:
        wgrad = _per_chunk(wgrad_s, chunks, "wgrad_s") or [b / 2 for b in bwd]
        return fwd, [b - w for b, w in zip(bwd, wgrad)], wgrad
    return fwd, bwd, [0.0] * chunks


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
    table = _Times(name, p * v, args, overlap).table(run.graph)  # the parts index it too
    comm = graph.comm_table(_effective_comm(args["comm_s"], p, v), schedule_traits(name).mirrored)
    timed, short_run = _timed(run, name, p, short, v, table, comm, args["act_bytes"],
                              keep_timeline)
    k = (m - short) // group
    rank_end, work = compiled.extend(parts, table, comm, timed.values, k)
    makespan = max(rank_end)
    span = max(e - s for e, s in zip(rank_end, short_run.rank_start_s))
    busy = [b + k * w for b, w in zip(short_run.busy_s, work)]
    return _result(name, p, m, v, short_run.timeline, makespan, busy, short_run.peak_inflight,
                   short_run.peak_activation_bytes, timeline_m=short if keep_timeline else None,
                   span=span, rank_start=short_run.rank_start_s)


class _Times:
    """A configuration's op times as the duration table of a compiled run (graph.durations)."""

    def __init__(self, name, chunks, args, overlap):
        split = schedule_traits(name).weight_grad_ops
        self.fwd, self.bgrad, self.wgrad = _op_times(split, chunks, args["fwd_s"],
                                                     args["bwd_s"], args["wgrad_s"])
        self.full = _per_chunk(args["bwd_s"], chunks, "bwd_s")
        self.o_fwd = _per_chunk(overlap[0], chunks, "overlap_fwd_s")
        self.o_bwd = _per_chunk(overlap[1], chunks, "overlap_bwd_s")
        self.interference = overlap[2]

    def pair(self, kf: int, kb: int) -> float:
        return dualpipe.pair_s(self.fwd[kf], self.o_fwd[kf], self.full[kb], self.o_bwd[kb],
                               self.interference)

    def table(self, g: graph.Graph) -> np.ndarray:
        return graph.durations(g, self.fwd, self.bgrad, self.wgrad, self.full, self.pair)


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
    """A compiled run timed (compiled.time_run) and summarised as `_summarise` does."""
    chunks = p * v
    act = np.asarray(_per_chunk(act_bytes, chunks, "act_bytes") or [0.0] * chunks)
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
    return timed, _result(name, p, m, v, timeline, makespan, timed.busy, run.peak_n,
                          timed.peak_bytes, span=span, rank_start=first)


def _gpipe(p, m, keep_timeline, *, fwd_s, bwd_s, wgrad_s, comm_s, act_bytes) -> SimResult:
    """GPipe at any m from its exact closed form (periodic.gpipe_makespan); the timeline is a
    short run's. Rank 0 starts first and ends last (its B of microbatch 0), so no rank's span
    is longer than the step."""
    fwd = _per_chunk(fwd_s, p, "fwd_s")
    bwd = _per_chunk(bwd_s, p, "bwd_s")
    act = _per_chunk(act_bytes, p, "act_bytes") or [0.0] * p
    makespan = periodic.gpipe_makespan(fwd, bwd, _effective_comm(comm_s, p, 1), m)
    drawn = None
    if keep_timeline:
        drawn = simulate_ops(build_schedule(GPIPE.name, p, _gpipe_drawn(p), 1), GPIPE.name, p,
                             _gpipe_drawn(p), fwd_s=fwd, bwd_s=bwd, comm_s=comm_s)
    return _result(GPIPE.name, p, m, 1, drawn.timeline if drawn else (), makespan,
                   [m * (f + b) for f, b in zip(fwd, bwd)], (m,) * p, tuple(m * a for a in act),
                   timeline_m=_gpipe_drawn(p) if drawn else None)


def _result(name, p, m, v, timeline, makespan, busy, peak_n, peak_b, timeline_m=None,
            span=None, rank_start=()) -> SimResult:
    idle = [max(0.0, makespan - b) for b in busy]  # float sums can leave -1e-16
    total_busy = sum(busy)
    return SimResult(
        p=p, m=m, v=v, schedule=name, timeline=tuple(timeline), makespan_s=makespan,
        busy_s=tuple(busy), idle_s=tuple(idle),
        bubble_fraction=sum(idle) / (p * makespan) if makespan > 0 else 0.0,
        bubble_ratio=sum(idle) / total_busy if total_busy > 0 else 0.0,
        peak_inflight=tuple(peak_n), peak_activation_bytes=tuple(peak_b), timeline_m=timeline_m,
        span_s=makespan if span is None else span, rank_start_s=tuple(rank_start),
    )


def simulate_ops(
    ops: tuple[tuple[Op, ...], ...],
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
    action_s: float = 0.0,
    split_backward: float = 0.0,
    overlap_fwd_s: PerChunk = 0.0,
    overlap_bwd_s: PerChunk = 0.0,
    interference: float = 0.0,
) -> SimResult:
    """Time given per-rank compute op lists (SEND/RECV are skipped); see `simulate`."""
    split = any(op.kind == "W" for rank in ops for op in rank)
    fwd_s, bwd_s, wgrad_s = charge_actions(split, p * v, fwd_s, bwd_s, wgrad_s, action_s,
                                           split_backward)
    return _simulate_ops(ops, name, p, m, v, fwd_s=fwd_s, bwd_s=bwd_s, wgrad_s=wgrad_s,
                         comm_s=comm_s, act_bytes=act_bytes, timeline=timeline,
                         overlap=(overlap_fwd_s, overlap_bwd_s, interference))[0]


def _comm_by_op(comm: list[float], chunks: int, m: int, mirrored: bool):
    """Per op index (microbatch * chunks + chunk): the transfer after its F and after its B.
    ``mirrored``: odd microbatches run the reverse direction (DualPipe), whose boundary k
    joins ranks p-1-k and p-2-k: transfer comm[p-2-k], the reversed list."""
    fwd, bwd = comm + [0.0], [0.0] + comm
    if not mirrored:
        return fwd * m, bwd * m
    rev = comm[::-1]
    return (fwd + rev + [0.0]) * (m // 2) + fwd * (m % 2), \
        (bwd + [0.0] + rev) * (m // 2) + bwd * (m % 2)


def _simulate_ops(ops, name, p, m, v, *, fwd_s, bwd_s, wgrad_s, comm_s, act_bytes, timeline,
                  overlap=(0.0, 0.0, 0.0)):
    """`simulate_ops`, and the end of every op: ``ends[kind][microbatch * chunks + chunk]`` with
    kind 0, 1, 2 for F, B, W (a BW's end is its B's and its W's)."""
    chunks = p * v
    split = any(op.kind == "W" for rank in ops for op in rank)
    fwd, bgrad, wgrad = _op_times(split, chunks, fwd_s, bwd_s, wgrad_s)
    full = _per_chunk(bwd_s, chunks, "bwd_s")
    comm = _effective_comm(comm_s, p, v)
    act = _per_chunk(act_bytes, chunks, "act_bytes") or [0.0] * chunks
    cf, cb = _comm_by_op(comm, chunks, m, schedule_traits(name).mirrored)
    o_fwd = _per_chunk(overlap[0], chunks, "overlap_fwd_s")
    o_bwd = _per_chunk(overlap[1], chunks, "overlap_bwd_s")

    def pair_s(kf: int, kb: int) -> float:
        return dualpipe.pair_s(fwd[kf], o_fwd[kf], full[kb], o_bwd[kb], overlap[2])

    prog = graph.program(ops, chunks)
    size = m * chunks
    ready = [[None] * size, [None] * size, [None] * size]  # [kind][mb*chunks+chunk] -> end time (+comm)
    done = [[None] * size, [None] * size, [None] * size]
    waiters: dict[tuple[int, int], list[int]] = {}
    ptr = [0] * p
    free = [0.0] * p
    starts: list[list[float]] = [[] for _ in range(p)]
    ends: list[list[float]] = [[] for _ in range(p)]
    shared = [0.0] * p  # per rank, time counted twice in starts/ends (F&B pairs)
    last = chunks - 1
    dur = (fwd, bgrad, wgrad, full, full, fwd)

    def backward_input(idx: int):
        """(what B/BW(idx) waits on, or None; when its inputs are in, or None)."""
        k = idx % chunks
        if done[0][idx] is None:
            return (0, idx), None
        if k < last:
            t = ready[1][idx + 1]
            return (1, idx + 1), (None if t is None else max(t, done[0][idx]))
        return None, done[0][idx]

    def run_pair(r: int, idx: int, pidx: int) -> bool:
        """Run rank r's F(idx) and the BW(pidx) paired with it, if their inputs are in (else
        park r on the missing one): they start together and end after `dualpipe.pair_s`."""
        k = idx % chunks
        dep, t = ((0, idx - 1), ready[0][idx - 1]) if k > 0 else (None, 0.0)
        if t is not None:
            dep, t_b = backward_input(pidx)
            t = None if t_b is None else max(t, t_b)
        if t is None:
            waiters.setdefault(dep, []).append(r)
            return False
        start = max(free[r], t)
        end = start + pair_s(k, pidx % chunks)
        shared[r] += end - start
        for slot, i in ((0, idx), (1, pidx)):
            _record(done, r, slot, i, chunks, end)
            starts[r].append(start)
            ends[r].append(end)
        done[2][pidx] = free[r] = end
        ready[0][idx] = end + cf[idx]
        ready[1][pidx] = end + cb[pidx]
        ptr[r] += 2
        for key in ((0, idx), (1, pidx)):
            work.extend(waiters.pop(key, ()))
        return True

    work = list(range(p))
    while work:
        r = work.pop()
        plist = prog[r]
        while ptr[r] < len(plist):
            kind, idx = plist[ptr[r]]
            k = idx % chunks
            if kind == 5:  # an F&B pair (DualPipe): both ops at once, apart from the hot path
                if not run_pair(r, idx, plist[ptr[r] + 1][1]):
                    break
                continue
            if kind == 0:
                dep = (0, idx - 1) if k > 0 else None
                t = ready[0][idx - 1] if k > 0 else 0.0
            elif kind == 2:
                dep, t = (1, idx), done[1][idx]
            elif done[0][idx] is None:  # B or BW
                dep, t = (0, idx), None
            elif k < last:
                dep, t = (1, idx + 1), ready[1][idx + 1]
                if t is not None:
                    t = max(t, done[0][idx])
            else:
                dep, t = None, done[0][idx]
            if t is None:
                waiters.setdefault(dep, []).append(r)
                break
            start = free[r] if free[r] > t else t
            end = start + dur[kind][k]
            free[r] = end
            starts[r].append(start)
            ends[r].append(end)
            slot = kind if kind < 3 else 1
            if done[slot][idx] is not None:
                _record(done, r, slot, idx, chunks, end)  # raises
            done[slot][idx] = end
            if kind == 0:
                ready[0][idx] = end + cf[idx]
            elif slot == 1:
                ready[1][idx] = end + cb[idx]
                if kind == 3:
                    done[2][idx] = end
            ptr[r] += 1
            woken = waiters.pop((slot, idx), None)
            if woken:
                work.extend(woken)
    stuck = [r for r in range(p) if ptr[r] < len(prog[r])]
    if stuck:
        raise ScheduleError(f"schedule cannot finish: ranks {stuck} wait on inputs that never come")
    return _summarise(name, p, m, v, prog, starts, ends, act, split, timeline, shared), done


def _record(done, r: int, slot: int, idx: int, chunks: int, end: float) -> None:
    if done[slot][idx] is not None:
        raise ScheduleError(f"rank {r} runs {'FBW'[slot]}(mb={idx // chunks}, "
                            f"chunk={idx % chunks}) twice")
    done[slot][idx] = end


def _summarise(name, p, m, v, prog, starts, ends, act, split, keep_timeline,
               shared=None) -> SimResult:
    """Busy/idle, bubble and peak activations from the placed ops (``shared``: per rank, time
    an F&B pair's two ops both count, taken off once)."""
    chunks = p * v
    makespan = max((e[-1] for e in ends if e), default=0.0)
    timeline = []
    busy, peak_n, peak_b = [], [], []
    release = 2 if split else 1  # activation freed when W (zero bubble), B or BW ends
    for r in range(p):
        if keep_timeline:
            timeline.append(tuple(TimedOp(Op(graph.CODE_KIND[kind], idx // chunks, idx % chunks,
                                             paired=kind == 4), s, e)
                                  for (kind, idx), s, e in zip(prog[r], starts[r], ends[r])))
        busy.append(sum(ends[r]) - sum(starts[r]) - (shared[r] if shared else 0.0))
        n = best_n = 0
        held = best_b = 0.0
        for kind, idx in prog[r]:
            k = idx % chunks
            if kind == 0 or kind == 5:
                n += 1
                held += act[k]
                best_n, best_b = max(best_n, n), max(best_b, held)
            elif kind == release or kind == 3 or kind == 4:
                n -= 1
                held -= act[k]
        peak_n.append(best_n)
        peak_b.append(best_b)
    first = [s[0] if s else 0.0 for s in starts]
    span = max((e[-1] - f for e, f in zip(ends, first) if e), default=0.0)
    return _result(name, p, m, v, timeline, makespan, busy, peak_n, peak_b, span=span,
                   rank_start=first)
