"""The op-by-op pipeline simulator, the reference timing of a schedule: every op of every rank
placed in time in one pass.

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
``simulate(..., method="full")`` (planner/pipeline/simulate.py) are the reference, which the
compiled runs (planner/pipeline/compiled.py) match bit for bit (tests/test_graph.py).
"""

from __future__ import annotations

from planner.core.schedules import schedule_traits
from planner.pipeline import dualpipe, graph
from planner.pipeline.chunk_times import PerChunk, boundary_comm, charge_actions, op_times, per_chunk
from planner.pipeline.ops import Op
from planner.pipeline.schedule import ScheduleError
from planner.pipeline.sim_result import SimResult, TimedOp, step_result


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
    """Time given per-rank compute op lists (SEND/RECV are skipped); see `simulate`
    (planner/pipeline/simulate.py)."""
    split = any(op.kind == "W" for rank in ops for op in rank)
    fwd_s, bwd_s, wgrad_s = charge_actions(split, p * v, fwd_s, bwd_s, wgrad_s, action_s,
                                           split_backward)
    return time_ops(ops, name, p, m, v, fwd_s=fwd_s, bwd_s=bwd_s, wgrad_s=wgrad_s,
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


def time_ops(ops, name, p, m, v, *, fwd_s, bwd_s, wgrad_s, comm_s, act_bytes, timeline,
             overlap=(0.0, 0.0, 0.0)):
    """`simulate_ops` on times with the engine's charges already in (`charge_actions`), and the
    end of every op: ``ends[kind][microbatch * chunks + chunk]`` with kind 0, 1, 2 for F, B, W
    (a BW's end is its B's and its W's)."""
    chunks = p * v
    split = any(op.kind == "W" for rank in ops for op in rank)
    fwd, bgrad, wgrad = op_times(split, chunks, fwd_s, bwd_s, wgrad_s)
    full = per_chunk(bwd_s, chunks, "bwd_s")
    comm = boundary_comm(comm_s, p, v)
    act = per_chunk(act_bytes, chunks, "act_bytes") or [0.0] * chunks
    cf, cb = _comm_by_op(comm, chunks, m, schedule_traits(name).mirrored)
    o_fwd = per_chunk(overlap[0], chunks, "overlap_fwd_s")
    o_bwd = per_chunk(overlap[1], chunks, "overlap_bwd_s")

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
    return step_result(name, p, m, v, timeline, makespan, busy, peak_n, peak_b, span=span,
                       rank_start=first)
