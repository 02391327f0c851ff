"""A pipeline run as a dependency graph of its ops, timed depth by depth with numpy.

The op-by-op simulator (planner/pipeline/op_by_op.py `time_ops`) walks the ranks' programs
in Python, an op at a time.  Every op's time there follows one rule: it starts at the max of its
rank's previous end and its inputs' ends (plus their transfers) and ends its duration later.
Which ops an op waits on does not depend on the times, only on the schedule's shape, so a shape
is compiled once into a graph (`build`, memoised by the caller) and timed for any durations by
`evaluate`: the ops at one depth of the graph (the longest chain of waits before them) wait only
on shallower ones, so a whole depth is one numpy gather, add, max and add.  The floats are the
op-by-op simulator's, bit for bit: every start is the max of the same sums (max is exact, so
neither its order nor a repeated operand changes it) and every end that start plus the same
duration (tests/test_graph.py).

planner/pipeline/periodic.py times two parts of a run from a state instead of from zero (`part`):
a steady period, with every value a max-plus form over the state (``evaluate`` on a matrix of
forms), and the cool-down, in numbers.

A unit is what a rank runs at once: one op, or DualPipe's F&B pair (an F and the paired BW after
it, which start together once both inputs are in).  Programs (`program`) name each op by a code: 0 F,
1 B, 2 W, 3 BW, 4 a BW paired with the F before it, 5 an F that opens such a pair.  An op's end
is filed under a slot: 0 for F, 1 for B and BW (what the backward of the chunk before waits on),
2 for W (and BW, which is its own W).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.pipeline.schedule import ScheduleError

_PROGRAMS: dict[int, tuple] = {}  # id(ops) -> (ops, program): build_schedule's ops are memoised


# op codes of a program: F, B, W, BW (both gradients), BW paired with the F before it, and an
# F that opens such a pair
KIND_CODE = {"F": 0, "B": 1, "W": 2, "BW": 3}
CODE_KIND = ("F", "B", "W", "BW", "BW", "F")


def program(ops, chunks: int) -> list[list[tuple[int, int]]]:
    """Per rank, each compute op as (kind code, microbatch * chunks + chunk); kept for the last
    few op lists (the same memoised schedule is timed for many configurations)."""
    held = _PROGRAMS.get(id(ops))
    if held is not None and held[0] is ops:
        return held[1]
    prog = []
    for rank in ops:
        row = [(KIND_CODE[o.kind] + (1 if o.paired else 0), o.microbatch * chunks + o.chunk)
               for o in rank if o.kind in KIND_CODE]
        for i in range(1, len(row)):
            if row[i][0] == 4:
                if row[i - 1][0] != 0:
                    raise ScheduleError("a paired BW must follow an F on its rank")
                row[i - 1] = (5, row[i - 1][1])
        prog.append(row)
    if isinstance(ops, tuple):  # immutable: the same object is the same program
        if len(_PROGRAMS) >= 16:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[id(ops)] = (ops, prog)
    return prog


NEG = -np.inf
WIDTH = 4  # most waits of a unit: its rank, and an F&B pair's F input, BW's F and B inputs
_SLOT = np.array([0, 1, 2, 1, 1, 0])  # by program code


@dataclass(frozen=True, eq=False)
class Graph:
    """A compiled run or part of one.  The value vector holds ``sources`` given values (the
    state a part starts from, or one zero), then every unit's end in depth order, then one -inf
    (what an unused input slot reads).

    inputs / comm: per unit (depth order), the value positions it waits on and the transfer
    added to each (an index in `comm_table`, 0: none); duration: per unit, its index in the
    duration table (`durations`); levels: the first unit of every depth, and the unit count;
    position: per rank, the value position of each program entry (-1: not in this graph; a
    pair's two entries share one); pairs: the (F chunk, BW chunk) of the pair durations, in
    the table's order.  For `part`: depth, rank: per unit; waits: per input, the op waited on
    (slot x ``stride`` + op index, -1: none); cross: whether it was made on another rank."""

    sources: int
    inputs: np.ndarray
    comm: np.ndarray
    duration: np.ndarray
    levels: tuple[int, ...]
    position: tuple[np.ndarray, ...]
    pairs: tuple[tuple[int, int], ...]
    depth: np.ndarray
    rank: np.ndarray
    waits: np.ndarray
    cross: np.ndarray
    stride: int

    @property
    def size(self) -> int:
        return self.sources + len(self.duration) + 1


def build(prog, chunks: int, mirrored: bool) -> Graph | None:
    """Compile rank programs (`program`) into the `Graph` of the whole run from time
    zero: one source, 0.0, on which every rank's first op and chunk 0's forwards wait.  An op
    waits on what `op_by_op.time_ops` makes it wait on: an F on the F of the chunk before (plus the
    transfer), a B or BW on its own F and on the B of the chunk after (plus the transfer), a W
    on its B.  None when the programs cannot finish (an op waits on one no rank runs, or in a
    cycle, or an op runs twice): the op-by-op simulator then says which."""
    p = len(prog)
    lengths = [len(row) for row in prog]
    entries = np.array([e for row in prog for e in row], dtype=np.int64).reshape(-1, 2)
    code, idx = entries[:, 0], entries[:, 1]
    rank = np.repeat(np.arange(p), lengths)
    # a code-4 entry joins the unit of the code-5 entry just before it on its rank
    paired = code == 4
    before = np.flatnonzero(paired) - 1
    if len(before) and (before[0] < 0 or (code[before] != 5).any()
                        or (rank[before] != rank[before + 1]).any()):
        return None
    new = ~paired
    unit = np.cumsum(new) - 1
    n = int(new.sum())
    if n == 0:
        return None
    stride = int(idx.max()) + 2
    # who makes each (slot, op): an op filed twice cannot be timed
    filed = np.concatenate([_SLOT[code] * stride + idx, 2 * stride + idx[(code == 3) | paired]])
    if len(np.unique(filed)) < len(filed):
        return None
    made = np.full(3 * stride, -1, dtype=np.int64)
    made[filed] = np.concatenate([unit, unit[(code == 3) | paired]])
    # each entry's waits: "a" an F's input F(op - 1), a backward's own F, a W's B; "b" a
    # backward's B(op + 1); a pair's F fills column 1, its BW columns 2 and 3
    # transfer index: 1 + the boundary crossed (periodic.boundary_index: boundary k lies
    # between chunks k and k + 1; ``mirrored``, an odd microbatch's at p - 1 + k)
    k, mb = idx % chunks, idx // chunks
    forward = (code == 0) | (code == 5)
    backward = (code == 1) | (code == 3) | paired
    flip = (p - 1) * (mb % 2) if mirrored else 0
    a_valid = ~forward | (k > 0)
    a_wait = np.where(forward, idx - 1, np.where(code == 2, stride + idx, idx))
    a_comm = np.where(forward, 1 + (k - 1) + flip, 0)
    a_cross = forward & ((k - 1) % p != k % p)
    b_valid = backward & (k < chunks - 1)
    b_wait = stride + idx + 1
    b_comm = 1 + k + flip
    b_cross = (k + 1) % p != k % p
    waits = np.full((n, WIDTH), -1, dtype=np.int64)
    comm = np.zeros((n, WIDTH), dtype=np.int64)
    cross = np.zeros((n, WIDTH), dtype=bool)
    col_a, col_b = np.where(paired, 2, 1), np.where(paired, 3, 2)
    for valid, wait, cost, far, col in ((a_valid, a_wait, a_comm, a_cross, col_a),
                                        (b_valid, b_wait, b_comm, b_cross, col_b)):
        at = (unit[valid], col[valid])
        waits[at], comm[at], cross[at] = wait[valid], cost[valid], far[valid]
    inputs = np.where(waits >= 0, made[np.maximum(waits, 0)], -1)
    if (inputs[waits >= 0] < 0).any():
        return None  # waits on an op no rank runs
    own = np.arange(n)[:, None]
    inputs[inputs == own] = -1  # a pair's BW on the pair's own F: no wait
    unit_rank = rank[new]
    first = np.ones(n, dtype=bool)
    first[1:] = unit_rank[1:] != unit_rank[:-1]
    inputs[:, 0] = np.where(first, -1, np.arange(n) - 1)
    depth = _depths(inputs[:, 1:], first, unit_rank)
    if depth is None:
        return None
    order = np.argsort(depth, kind="stable")
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(1, n + 1)  # source 0 is the zero
    # the zero: every rank's first unit, chunk 0's forwards (their input is there at zero)
    zero = first.copy()
    zero_f = forward & ~paired & (k == 0)
    at_zero = np.full((n, WIDTH), n + 1, dtype=np.int64)  # n + 1: the -inf
    at_zero[:, 0] = np.where(zero, 0, n + 1)
    at_zero[unit[zero_f], 1] = 0
    values = np.where(inputs >= 0, pos[np.maximum(inputs, 0)], at_zero)
    duration, pairs = _durations(code, idx, new, paired, unit, chunks)
    depth_sorted = depth[order]
    return Graph(
        sources=1, inputs=values[order], comm=np.where(inputs >= 0, comm, 0)[order],
        duration=duration[order], levels=_levels(depth_sorted),
        position=tuple(np.split(pos[unit], np.cumsum(lengths)[:-1])), pairs=pairs,
        depth=depth_sorted, rank=unit_rank[order], waits=waits[order], cross=cross[order],
        stride=stride)


def _depths(inputs: np.ndarray, first: np.ndarray, unit_rank: np.ndarray) -> np.ndarray | None:
    """Each unit's depth: one more than the deepest unit it waits on (0 with none), its rank's
    previous unit included (``inputs``: the others, -1 for none).  Ranks are walked as the
    simulator walks them: a rank runs its units in order and parks on one whose input has no
    depth yet, woken when it gets one.  None if some rank never finishes (a cycle)."""
    n = len(inputs)
    columns = [col.tolist() for col in inputs.T]
    starts = np.flatnonzero(first).tolist()
    ptr = dict(zip(unit_rank[starts].tolist(), starts))
    stop = dict(zip(unit_rank[starts].tolist(), starts[1:] + [n]))
    begin = dict(ptr)
    depth = [-1] * n
    parked: dict[int, list[int]] = {}
    work = list(ptr)
    while work:
        r = work.pop()
        u, end = ptr[r], stop[r]
        best = -1 if u == begin[r] else depth[u - 1]
        while u < end:
            waits_on = -1
            for col in columns:
                x = col[u]
                if x >= 0:
                    d = depth[x]
                    if d < 0:
                        waits_on = x
                        break
                    if d > best:
                        best = d
            if waits_on >= 0:
                parked.setdefault(waits_on, []).append(r)
                break
            best += 1
            depth[u] = best
            if parked and u in parked:
                work.extend(parked.pop(u))
            u += 1
        ptr[r] = u
    if any(ptr[r] < stop[r] for r in ptr):
        return None
    return np.array(depth, dtype=np.int64)


def _levels(depth_sorted: np.ndarray) -> tuple[int, ...]:
    n = len(depth_sorted)
    change = np.flatnonzero(depth_sorted[1:] != depth_sorted[:-1]) + 1
    return tuple([0] * (n > 0) + change.tolist() + [n])


def _durations(code, idx, new, paired, unit, chunks: int):
    """Per unit its index in the duration table (kind x chunks + chunk: F 0, B 1, W 2, BW 3; a
    pair's past the four kinds), and the pairs' (F chunk, BW chunk) in table order."""
    k = idx % chunks
    duration = (np.array([0, 1, 2, 3, 3, 0])[code] * chunks + k)[new]
    pairs: dict[tuple[int, int], int] = {}
    f_chunks = k[np.flatnonzero(paired) - 1].tolist()
    for u, kf, kb in zip(unit[paired].tolist(), f_chunks, k[paired].tolist()):
        duration[u] = 4 * chunks + pairs.setdefault((kf, kb), len(pairs))
    return duration, tuple(pairs)


def part(g: Graph, inside: np.ndarray, keys: tuple, offset: int, chunks: int) -> Graph | None:
    """The units of ``g`` where ``inside`` (per unit, in ``g``'s order) holds, timed from a
    state instead of from zero: the components ``keys`` (periodic.cut_keys: ("free", r), and
    (kind, microbatch - ``offset``, chunk) for transfers made before the part).  A rank's first
    unit in the part waits on its ("free", r); an input made on another rank outside the part
    on its key (the transfer is in the state); one made on the same rank outside the part on
    nothing (that rank was free only after it).  The depths are ``g``'s, so its order holds.
    None when an input made outside is not in the state."""
    index = {key: i for i, key in enumerate(keys)}
    s = len(keys)
    kept = np.flatnonzero(inside)
    n = len(kept)
    new_pos = np.full(g.size, -1, dtype=np.int64)  # g's position -> the part's
    new_pos[g.sources + kept] = np.arange(s, s + n)
    pad = s + n
    inputs = new_pos[g.inputs[kept]]
    comm = np.where(inputs >= 0, g.comm[kept], 0)
    rank = g.rank[kept]
    # the rank's previous unit is outside (or none): its free time in the state
    free = [index[("free", r)] for r in range(int(g.rank.max()) + 1)] if len(g.rank) else []
    outside = inputs[:, 0] < 0
    inputs[outside, 0] = np.asarray(free, dtype=np.int64)[rank[outside]]
    # waits on ops outside: from another rank, the state's transfer; else none
    waits = g.waits[kept]
    for u, col in zip(*np.nonzero((inputs < 0) & (waits >= 0))):
        if not g.cross[kept[u], col]:
            continue
        slot, op = divmod(int(waits[u, col]), g.stride)
        key = ("F" if slot == 0 else "B", op // chunks - offset, op % chunks)
        if key not in index:
            return None
        inputs[u, col] = index[key]
    inputs[inputs < 0] = pad
    depth = g.depth[kept]
    position = tuple(np.where(at >= 0, new_pos[np.maximum(at, 0)], -1) for at in g.position)
    none = np.zeros((0, WIDTH), dtype=np.int64)  # a part is not cut again
    return Graph(sources=s, inputs=inputs, comm=comm, duration=g.duration[kept],
                 levels=_levels(depth), position=position, pairs=g.pairs, depth=depth,
                 rank=rank, waits=none, cross=none.astype(bool), stride=g.stride)


def durations(graph: Graph, fwd, bgrad, wgrad, full, pair_s=None) -> np.ndarray:
    """The duration table a graph's units index: per chunk F, B, W and BW times, then each of
    its pairs' ``pair_s(F chunk, BW chunk)``."""
    table = [fwd, bgrad, wgrad, full]
    if graph.pairs:
        table.append([pair_s(kf, kb) for kf, kb in graph.pairs])
    return np.concatenate([np.asarray(t, dtype=float) for t in table])


def comm_table(comm: list[float], mirrored: bool) -> np.ndarray:
    """The transfer table a graph's inputs index: 0.0 (no transfer), then every boundary's
    transfer (``comm[k]``: boundary k, between chunks k and k + 1), and, ``mirrored``, the
    reverse direction's (boundary k of an odd microbatch is the link of boundary p - 2 - k:
    periodic.boundary_index)."""
    return np.array([0.0] + list(comm) + (list(comm[::-1]) if mirrored else []), dtype=float)


def evaluate(graph: Graph, sources: np.ndarray, table: np.ndarray,
             comm: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Time every unit: (the value vector, each unit's start at its value's position, 0.0 at
    the sources').  ``sources`` is a vector of numbers, or a matrix of max-plus forms (one row
    per source, -inf where a form does not depend on a component): then every value is a form
    too and no starts come back."""
    symbolic = sources.ndim == 2
    s = graph.sources
    values = np.full((graph.size,) + sources.shape[1:], NEG)
    values[:s] = sources
    added = comm[graph.comm]
    took = table[graph.duration]
    starts = None if symbolic else np.zeros(graph.size)
    if symbolic:
        added, took = added[:, :, None], took[:, None]
    bounds = graph.levels
    for a, b in zip(bounds[:-1], bounds[1:]):
        ready = values[graph.inputs[a:b]]
        ready += added[a:b]
        start = ready.max(axis=1)
        if starts is not None:
            starts[s + a:s + b] = start
        start += took[a:b]
        values[s + a:s + b] = start
    return values, starts
