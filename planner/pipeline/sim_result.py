"""What a simulated pipeline step reports: each rank's ops placed in time (`TimedOp`) and the
step's summary (`SimResult`: makespan, busy and idle per rank, bubble, activation peaks, span),
built by `step_result` from per-rank busy time and peaks, whichever path timed the step
(planner/pipeline/op_by_op.py, compiled.py, simulate.py's long-run paths)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.pipeline.ops import Op


@dataclass(frozen=True)
class TimedOp:
    """A compute op placed in time on its rank."""

    op: Op
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimResult:
    """Timeline and summary of one simulated step (the model: planner/pipeline/op_by_op.py)."""

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


def step_result(name, p, m, v, timeline, makespan, busy, peak_n, peak_b, timeline_m=None,
                span=None, rank_start=()) -> SimResult:
    """The step's summary from its makespan and each rank's busy time and activation peaks:
    idle per rank, bubble fraction and ratio; ``span`` None: the makespan."""
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
