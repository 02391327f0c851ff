"""The steady period of a pipeline schedule, read off a short run, so any longer run follows exactly.

Why it is exact.  In the simulator (planner/pipeline/op_by_op.py) every op starts at the max of
earlier ends (plus transfers) and ends a constant later.  So every time after a point of a run is
a max-plus linear function of the *state* there: each rank's free time and the ready times of the
transfers produced before the point and consumed after it.  Cut every rank's program right after
its last backward of microbatch group j (a group is P microbatches: P = p for interleaved, whose
period is p microbatches, else 1); no op before a cut needs one after it (checked).  Past the
warm-up, running M + P microbatches instead of M inserts one more period after a cut and
renumbers the rest by P (checked on the two programs, not assumed).  Every rank is then in steady
state: each period applies the same max-plus map T to the state (one matrix, read off the short
run by timing one period with symbolic times: every value a max-plus form over the state), and
the cool-down is a fixed max-plus function g of the state it starts from.  So for M = M' + k·P:

    state after the inserted periods = T^k ⊗ state of the short run at that cut,
    step = max_i (state_i + g_i),

busy time grows by k times each rank's work in a period, and the activations held are unchanged
(a period stores and frees the same chunks, checked).  T^k ⊗ s is computed step by step until
the state shifts by one constant d in every component: T ⊗ (s + d) = T ⊗ s + d, so from there on
each period adds exactly d (this is the steady state of the pipeline; it comes once the slowest
cycle of dependencies paces every rank).  Near ties between cycles can delay it; after
``STEP_LIMIT`` steps the rest of the power is taken by repeated squaring, still exact.  Floating
point makes "one constant" equal to about 1e-14 of the times, so components may differ by
``REL_TOL`` of the largest.

This module finds the cuts and the state's components; planner/pipeline/compiled.py times the
short run, the period (symbolically) and the cool-down (from the state after the k periods, in
numbers) on the short run's compiled graph (planner/pipeline/graph.py), and `state_positions`
says where the state lies in each.

DualPipe (pipeline/dualpipe.py) fits the same frame with P = 2 (one microbatch of each direction
a period), its full backwards (BW) counted as backwards, an F&B pair timed as one op that waits
for both inputs, and ``mirrored`` transfers: an odd microbatch's boundary k is the link of
boundary p - 2 - k, indexed p - 1 + k in the transfer list comm + reversed(comm).

GPipe runs all forwards, then all backwards: each phase is a flow shop of identical jobs with a
closed-form longest path (`gpipe_makespan`), so it needs no period.
"""

from __future__ import annotations

import numpy as np

from planner.pipeline.schedule import Op

# Components of one step's shift may differ by this share of the largest time: float sums of a
# few hundred terms differ by ~1e-14 of their size; a real transient this small moves a
# 10**6-microbatch step by well under 1e-6 of itself (T is non-expansive in the max norm, so
# the drift is at most k times the spread).
REL_TOL = 1e-11
STEP_LIMIT = 2048  # steps of T ⊗ s before the rest of T^k is taken by repeated squaring
CYCLE_CHECK = 32  # steps between searches of the kept states for a repeat (power_apply)
NEG = -np.inf


def group_labels(ops: tuple[tuple[Op, ...], ...], group: int, v: int) -> list[list[int]]:
    """Per rank, for every op, how many microbatch groups had all their backwards run before it
    on that rank: the cut the op lies after."""
    out = []
    per_group = group * v  # backward ops of one group on one rank: v chunks per microbatch
    for rank in ops:
        counts: dict[int, int] = {}
        done, labels = 0, []
        for op in rank:
            labels.append(done)
            if op.kind in ("B", "BW"):
                g = op.microbatch // group
                counts[g] = counts.get(g, 0) + 1
                while counts.get(done, 0) == per_group:
                    done += 1
        out.append(labels)
    return out


def key_of(op: Op) -> tuple[str, int, int]:
    """(kind, microbatch, chunk) of an op's end, a BW's filed as its B (what consumers wait on)."""
    return ("B" if op.kind == "BW" else op.kind), op.microbatch, op.chunk


def boundary_index(kind: str, mb: int, k: int, p: int, mirrored: bool) -> int:
    """Index in the transfer list of the boundary that ``kind``'s output of chunk k crosses
    (module docstring: mirrored, an odd microbatch's sits at p - 1 + its boundary)."""
    boundary = k if kind == "F" else k - 1
    return boundary + p - 1 if mirrored and mb % 2 else boundary


def cross_inputs(op: Op, p: int, chunks: int,
                 mirrored: bool = False) -> list[tuple[str, int, int, int]]:
    """Inputs of a compute op made on another rank: (kind, microbatch, chunk, boundary index)
    of each producer.  Inputs from the same rank ended before the op's rank became free."""
    k = op.chunk
    if op.kind == "F" and k > 0 and (k - 1) % p != k % p:
        return [("F", op.microbatch, k - 1, boundary_index("F", op.microbatch, k - 1, p,
                                                            mirrored))]
    if op.kind in ("B", "BW") and k < chunks - 1 and (k + 1) % p != k % p:
        return [("B", op.microbatch, k + 1, boundary_index("B", op.microbatch, k + 1, p,
                                                            mirrored))]
    return []


def cut_keys(ops, labels, p: int, v: int, group: int) -> dict[int, tuple] | None:
    """The state's components at every cut: ("free", rank) for every rank, then every transfer
    made before the cut and used after it, its microbatch relative to the cut.  None when an op
    before a cut needs one after it (a cut would not separate past from future)."""
    chunks = p * v
    label_of = {key_of(op): x for rank, lab in zip(ops, labels) for op, x in zip(rank, lab)}
    last = max(max(lab) for lab in labels)
    crossing: dict[int, set] = {j: set() for j in range(last + 2)}
    for rank, lab in zip(ops, labels):
        for op, x in zip(rank, lab):
            for kind, mb, k, _ in cross_inputs(op, p, chunks):
                made = label_of[(kind, mb, k)]
                if made > x:
                    return None
                for j in range(made + 1, x + 1):
                    crossing[j].add((kind, mb - j * group, k))
    free = tuple(("free", r) for r in range(p))
    return {j: free + tuple(sorted(keys)) for j, keys in crossing.items()}


def steady_cuts(short, longer, labels, keys: dict[int, tuple], group: int,
                release: tuple[str, ...]) -> list[int]:
    """Cuts past every rank's warm-up, where the schedule is in its periodic part: the period
    after the cut (i) is what ``longer`` (one group more) inserts, everything after it
    renumbered by one group; (ii) leaves the state with the same components; (iii) frees on
    every rank the activations it stores (F stores, the ``release`` kinds free)."""
    ok = None
    for s_ops, l_ops, lab in zip(short, longer, labels):
        s = [(op.kind, op.microbatch, op.chunk) for op in s_ops]
        l = [(op.kind, op.microbatch, op.chunk) for op in l_ops]
        moved = [(kind, mb + group, chunk) for kind, mb, chunk in s]
        prefix = 0  # longest common prefix of l and s
        while prefix < min(len(s), len(l)) and s[prefix] == l[prefix]:
            prefix += 1
        suffix = 0  # longest common suffix of l and s renumbered
        while suffix < min(len(s), len(l)) and moved[-1 - suffix] == l[-1 - suffix]:
            suffix += 1
        start: dict[int, int] = {}
        balance: dict[int, dict[int, int]] = {}
        for i, ((kind, _, chunk), x) in enumerate(zip(s, lab)):
            start.setdefault(x, i)
            if kind == "F" or kind in release:
                held = balance.setdefault(x, {})
                held[chunk] = held.get(chunk, 0) + (1 if kind == "F" else -1)
        here = set()
        for j in start:
            a, b = start[j], start.get(j + 1)
            if (b is not None and b - a == len(l) - len(s) and b <= prefix
                    and len(s) - a <= suffix and not any(balance.get(j, {}).values())):
                here.add(j)
        ok = here if ok is None else ok & here
    return sorted(j for j in ok or () if keys.get(j) is not None and keys.get(j) == keys.get(j + 1))


def state_positions(keys: tuple, cut: int, group: int, p: int, free_at, end_at,
                    earlier: dict | None = None, mirrored: bool = False):
    """Where the state at cut ``cut`` (components in ``keys`` order) lies in a timed graph
    (planner/pipeline/graph.py): per component, a position in the graph's values and the
    transfer added to it (an index in `graph.comm_table`, 0 for none).  ``free_at[r]``: the
    position of rank r's free time at the cut; ``end_at(kind, microbatch, chunk)``: the
    position of that op's end, or None when the graph does not time it.  A transfer the graph
    does not time was made before it: with ``earlier`` (the keys' positions among the graph's
    sources, the state one cut before) it is that state's component one group further on.
    None when a component is in neither."""
    pos, comm = [], []
    for key in keys:
        if key[0] == "free":
            pos.append(free_at[key[1]])
            comm.append(0)
            continue
        kind, rel, k = key
        mb = rel + cut * group
        made = end_at(kind, mb, k)
        if made is not None:
            pos.append(made)
            comm.append(1 + boundary_index(kind, mb, k, p, mirrored))
        elif earlier is not None and (kind, rel + group, k) in earlier:
            pos.append(earlier[(kind, rel + group, k)])
            comm.append(0)
        else:
            return None
    return np.array(pos, dtype=np.int64), np.array(comm, dtype=np.int64)


def apply(T: np.ndarray, s: np.ndarray) -> np.ndarray:
    """T ⊗ s in the max-plus algebra: (T ⊗ s)_i = max_j T_ij + s_j."""
    return (T + s[None, :]).max(axis=1)


def sparse_form(T: np.ndarray) -> tuple:
    """T's finite entries by row, for `apply_sparse`: a period map is mostly -inf (a component
    depends on few others: a quarter of the entries are finite for 1F1B on 128 ranks)."""
    finite = np.isfinite(T)
    rows, cols = np.nonzero(finite)  # row by row
    nonempty = finite.any(axis=1)
    starts = np.searchsorted(rows, np.flatnonzero(nonempty))
    return cols, T[rows, cols], starts, nonempty


def apply_sparse(form: tuple, s: np.ndarray) -> np.ndarray:
    """`apply` from T's `sparse_form`: the same sums and maxima, so the same floats, over the
    finite entries only (an -inf entry never wins a max; a row of them gives -inf)."""
    cols, values, starts, nonempty = form
    if len(values) and len(starts) == len(nonempty):  # every row has a finite entry
        return np.maximum.reduceat(values + s[cols], starts)
    out = np.full(len(nonempty), NEG)
    if len(values):
        out[nonempty] = np.maximum.reduceat(values + s[cols], starts)
    return out


def _product(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return (A[:, :, None] + B[None, :, :]).max(axis=1)


def power_apply(T: np.ndarray, s: np.ndarray, k: int) -> np.ndarray:
    """T^k ⊗ s, exactly: step by step until the states repeat up to a uniform shift, by
    repeated squaring after ``STEP_LIMIT`` steps.  Once the state after step t is the state c
    steps earlier plus one constant d in every component, every later state is too (T^j ⊗ (x +
    d) = T^j ⊗ x + d), so the rest of the power follows from the last c states.  c = 1 is the
    common steady state; with uneven stages a wave can travel through the ranks and repeat only
    after c > 1 steps (c = 62 for 1F1B on 64 ranks, Llama-3-405B's split), so the states are kept
    and every ``CYCLE_CHECK`` steps the last ones are searched for a repeat."""
    states = [s]
    form = sparse_form(T) if k else None
    for done in range(min(k, STEP_LIMIT)):
        nxt = apply_sparse(form, states[-1])
        states.append(nxt)
        d = nxt - states[-2]
        tol = REL_TOL * max(float(np.abs(nxt).max()), 1e-300)
        if d.max() - d.min() <= tol:
            return nxt + (k - done - 1) * float(d.mean())
        if (done + 1) % CYCLE_CHECK == 0:
            past = np.array(states[:-1])
            diffs = nxt[None, :] - past
            repeats = np.flatnonzero(diffs.max(axis=1) - diffs.min(axis=1) <= tol)
            if len(repeats):
                c = len(states) - 1 - int(repeats[-1])  # the shortest cycle
                shift = float(diffs[repeats[-1]].mean())
                periods, rest = divmod(k - done - 1, c)
                return states[-1 - c + rest] + (periods + 1) * shift
    s = states[-1]
    left = k - min(k, STEP_LIMIT)
    power = T
    while left:
        if left & 1:
            s = apply(power, s)
        left >>= 1
        if left:
            power = _product(power, power)
    return s


def gpipe_makespan(fwd: list[float], bwd: list[float], comm: list[float], m: int) -> float:
    """GPipe's step, exactly: all forwards, then all backwards, each phase a flow shop of m
    identical jobs over the ranks (forwards down, backwards up).  A phase's longest path runs
    every stage once and spends the m - 1 repeated jobs on its slowest stage; the backward phase
    starts when the last rank ends its last forward, and every other rank is free by then (its
    forwards ended earlier).  So the step is
        sum(F) + sum(B) + 2·sum(transfers) + (m - 1)·(max F + max B).
    (A periodic state would not do here: a fast first rank runs ahead of the rest for ever.)"""
    return sum(fwd) + sum(bwd) + 2 * sum(comm) + (m - 1) * (max(fwd) + max(bwd))
