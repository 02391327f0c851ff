"""Op-by-op timing of a pipeline schedule: step time, bubble and peak activations per rank.

Each rank runs its compute ops strictly in schedule order; an op starts when its rank is free and
its inputs have arrived.  Point-to-point transfers are latency on the dependency (`comm_s`), not
work on the compute stream.  Dependencies:
    F(m, k) <- F(m, k-1) + comm[k-1]
    B(m, k) <- F(m, k) and B(m, k+1) + comm[k]      (the last chunk's B needs only its own F)
    W(m, k) <- B(m, k)
The pass visits every op once or twice (a rank is parked on the op it waits for and woken when
that op's input finishes), so it is linear in the number of ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.pipeline.schedule import Op, ScheduleError, build_schedule

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


def closed_form_bubble(name: str, p: int, m: int, v: int = 1) -> float:
    """Textbook idle share of the step with uniform stages and free communication.

    GPipe/1F1B: (p-1)/(m+p-1); interleaved: (p-1)/(v*m+p-1); zb-h1 with F = B = W:
    (p-1)/(3m+p-1), i.e. a third of 1F1B's idle time (Qi et al. 2023).
    """
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if name == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (m + p - 1)


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
) -> SimResult:
    """Simulate schedule `name` for p ranks, m microbatches, v chunks per rank.

    fwd_s, bwd_s, wgrad_s, act_bytes: a float for every chunk or a sequence of p*v indexed by
    global chunk.  bwd_s is the full backward; in zb-h1, B takes bwd_s - wgrad_s and W takes
    wgrad_s (default half of bwd_s); other schedules ignore wgrad_s.  comm_s: one transfer across
    a chunk boundary, float or p*v-1 values (boundary k sits between chunks k and k+1).
    ``timeline=False`` skips building the per-op timeline (the planner needs only the summary).
    """
    ops = build_schedule(name, p, m, v)
    return simulate_ops(ops, name, p, m, v, fwd_s=fwd_s, bwd_s=bwd_s, wgrad_s=wgrad_s,
                        comm_s=comm_s, act_bytes=act_bytes, timeline=timeline)


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
) -> SimResult:
    """Time given per-rank compute op lists (SEND/RECV are skipped); see `simulate`."""
    chunks = p * v
    fwd = _per_chunk(fwd_s, chunks, "fwd_s")
    bwd = _per_chunk(bwd_s, chunks, "bwd_s")
    split = any(op.kind == "W" for rank in ops for op in rank)
    if split:
        wgrad = _per_chunk(wgrad_s, chunks, "wgrad_s") or [b / 2 for b in bwd]
        bgrad = [b - w for b, w in zip(bwd, wgrad)]
    else:
        wgrad, bgrad = [0.0] * chunks, bwd
    comm = _per_chunk(comm_s, chunks - 1, "comm_s") if chunks > 1 else []
    # a boundary inside one rank (p == 1) costs nothing
    comm = [0.0 if k % p == (k + 1) % p else c for k, c in enumerate(comm)]
    act = _per_chunk(act_bytes, chunks, "act_bytes") or [0.0] * chunks

    kind_code = {"F": 0, "B": 1, "W": 2}
    prog = [[(kind_code[o.kind], o.microbatch * chunks + o.chunk) for o in rank if o.kind in kind_code]
            for rank in ops]
    size = m * chunks
    ready = [[None] * size, [None] * size, [None] * size]  # [kind][mb*chunks+chunk] -> end time (+comm)
    done = [[None] * size, [None] * size, [None] * size]
    waiters: dict[tuple[int, int], list[int]] = {}
    ptr = [0] * p
    free = [0.0] * p
    starts: list[list[float]] = [[] for _ in range(p)]
    ends: list[list[float]] = [[] for _ in range(p)]
    last = chunks - 1
    dur = (fwd, bgrad, wgrad)

    work = list(range(p))
    while work:
        r = work.pop()
        plist = prog[r]
        while ptr[r] < len(plist):
            kind, idx = plist[ptr[r]]
            k = idx % chunks
            if kind == 0:
                dep = (0, idx - 1) if k > 0 else None
                t = ready[0][idx - 1] if k > 0 else 0.0
            elif kind == 1:
                if done[0][idx] is None:
                    dep, t = (0, idx), None
                elif k < last:
                    dep, t = (1, idx + 1), ready[1][idx + 1]
                    if t is not None:
                        t = max(t, done[0][idx])
                else:
                    dep, t = None, done[0][idx]
            else:
                dep, t = (1, idx), done[1][idx]
            if t is None:
                waiters.setdefault(dep, []).append(r)
                break
            start = free[r] if free[r] > t else t
            end = start + dur[kind][k]
            free[r] = end
            starts[r].append(start)
            ends[r].append(end)
            if done[kind][idx] is not None:
                raise ScheduleError(f"rank {r} runs {'FBW'[kind]}(mb={idx // chunks}, chunk={k}) twice")
            done[kind][idx] = end
            if kind == 0:
                ready[0][idx] = end + comm[k] if k < last else end
            elif kind == 1:
                ready[1][idx] = end + comm[k - 1] if k > 0 else end
            ptr[r] += 1
            woken = waiters.pop((kind, idx), None)
            if woken:
                work.extend(woken)
    stuck = [r for r in range(p) if ptr[r] < len(prog[r])]
    if stuck:
        raise ScheduleError(f"schedule cannot finish: ranks {stuck} wait on inputs that never come")
    return _summarise(name, p, m, v, prog, starts, ends, act, split, timeline)


def _summarise(name, p, m, v, prog, starts, ends, act, split, keep_timeline) -> SimResult:
    """Busy/idle, bubble and peak activations from the placed ops."""
    chunks = p * v
    kinds = "FBW"
    makespan = max((e[-1] for e in ends if e), default=0.0)
    timeline = []
    busy, peak_n, peak_b = [], [], []
    release = 2 if split else 1  # activation freed when W (zb-h1) or B ends
    for r in range(p):
        if keep_timeline:
            timeline.append(tuple(TimedOp(Op(kinds[kind], idx // chunks, idx % chunks), s, e)
                                  for (kind, idx), s, e in zip(prog[r], starts[r], ends[r])))
        busy.append(sum(ends[r]) - sum(starts[r]))
        n = best_n = 0
        held = best_b = 0.0
        for kind, idx in prog[r]:
            k = idx % chunks
            if kind == 0:
                n += 1
                held += act[k]
                best_n, best_b = max(best_n, n), max(best_b, held)
            elif kind == release:
                n -= 1
                held -= act[k]
        peak_n.append(best_n)
        peak_b.append(best_b)
    idle = [max(0.0, makespan - b) for b in busy]  # float sums can leave -1e-16
    total_busy = sum(busy)
    return SimResult(
        p=p, m=m, v=v, schedule=name, timeline=tuple(timeline), makespan_s=makespan,
        busy_s=tuple(busy), idle_s=tuple(idle),
        bubble_fraction=sum(idle) / (p * makespan) if makespan > 0 else 0.0,
        bubble_ratio=sum(idle) / total_busy if total_busy > 0 else 0.0,
        peak_inflight=tuple(peak_n), peak_activation_bytes=tuple(peak_b),
    )
