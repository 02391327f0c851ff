"""Pipeline runs compiled once per schedule shape and timed for any stage times: the fast path of
planner/pipeline/simulate.py, whose op-by-op walk (planner/pipeline/op_by_op.py) is the reference.

The planner simulates many configurations of one shape (schedule, ranks, microbatches, chunks)
with different stage times.  A shape's run is compiled once into a dependency graph
(planner/pipeline/graph.py) with what the summary reads off it besides the times (`Run`);
`time_run` then times it for given durations with a few numpy operations per depth of the graph,
and gives the floats `op_by_op.time_ops` gives (tests/test_graph.py).

A long run is a short run plus repeated steady periods (planner/pipeline/periodic.py explains
why that is exact).  `periodic_parts` compiles what that needs from the short run's graph: the
period after the steady cut, timed from the state at the cut with every value a max-plus form
(the period map T), and the cool-down after it, timed from the state the periods reach, in
numbers; and where the state lies in each.  `extend` applies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.core.schedules import schedule_traits
from planner.pipeline import graph, periodic
from planner.pipeline.schedule import build_schedule


@dataclass(frozen=True, eq=False)
class Run:
    """A whole run of a schedule shape: its programs (`graph.program`), their graph, and per
    rank and program entry (a row per rank, a shorter program padded at its end) the value
    position (``grid``, padded with the zero source's), the activation change (``sign``: +1 an
    F stores its chunk's, -1 the op that frees it, 0 otherwise and in the padding) and the
    chunk; each program's length, the most activations each rank holds at once (``peak_n``),
    and the program entries that open an F&B pair (``pairs``)."""

    prog: list
    graph: graph.Graph
    grid: np.ndarray
    sign: np.ndarray
    chunk: np.ndarray
    lengths: tuple[int, ...]
    peak_n: tuple[int, ...]
    pairs: tuple[np.ndarray, ...]


@lru_cache(maxsize=32)  # a benchmark case asks for up to 21 shapes; a few MB each at p = 128
def compile_run(name: str, p: int, m: int, v: int) -> Run | None:
    """The compiled run of `build_schedule(name, p, m, v)`; None if it cannot be compiled (an
    op waits on one that never runs: the op-by-op simulator then says which)."""
    chunks = p * v
    prog = graph.program(build_schedule(name, p, m, v), chunks)
    g = graph.build(prog, chunks, schedule_traits(name).mirrored)
    if g is None:
        return None
    # activations are freed by W where the backward is split, else by B; always by a BW
    release = 2 if any(code == 2 for row in prog for code, _ in row) else 1
    width = max(len(row) for row in prog)
    grid = np.zeros((p, width), dtype=np.int64)
    sign = np.zeros((p, width))
    chunk = np.zeros((p, width), dtype=np.int64)
    for r, row in enumerate(prog):
        grid[r, :len(row)] = g.position[r]
        codes = np.array([code for code, _ in row], dtype=np.int64)
        chunk[r, :len(row)] = np.array([idx for _, idx in row], dtype=np.int64) % chunks
        sign[r, :len(row)] = np.where((codes == 0) | (codes == 5), 1,
                                      np.where((codes == release) | (codes == 3) | (codes == 4),
                                               -1, 0))
    held = np.cumsum(sign, axis=1)
    peak_n = tuple(int(max(0.0, held[r][sign[r] > 0].max(initial=0.0))) for r in range(p))
    pairs = tuple(np.flatnonzero(np.array([code == 5 for code, _ in row], dtype=bool))
                  for row in prog)
    return Run(prog, g, grid, sign, chunk, tuple(len(row) for row in prog), peak_n, pairs)


@dataclass(frozen=True, eq=False)
class Timed:
    """A timed run: the graph's values (every unit's end), and per rank each program entry's
    end and start in program order, busy time and most activation bytes held at once."""

    values: np.ndarray
    ends: list[list[float]]
    starts: list[list[float]]
    busy: list[float]
    peak_bytes: list[float]


def time_run(run: Run, table: np.ndarray, comm: np.ndarray, act: np.ndarray) -> Timed:
    """Time ``run`` with durations ``table`` (`graph.durations`), transfers ``comm``
    (`graph.comm_table`) and per-chunk activation bytes ``act``.  The sums are `_summarise`'s,
    term by term in the same order: busy is the sum of the ends less the sum of the starts
    (less an F&B pair's time, which both of its entries count), the bytes held a running sum
    of the entries' changes."""
    values, starts = graph.evaluate(run.graph, np.zeros(1), table, comm)
    ends, begins, busy = [], [], []
    # the padding reads the zero source (0.0 both as end and start): adding it changes no sum
    for e, s, n, pairs in zip(values[run.grid].tolist(), starts[run.grid].tolist(), run.lengths,
                              run.pairs):
        shared = 0.0
        for i in pairs.tolist():
            shared += e[i] - s[i]
        busy.append(sum(e) - sum(s) - shared)
        ends.append(e[:n])
        begins.append(s[:n])
    held = np.cumsum(run.sign * act[run.chunk], axis=1)
    peak = [max(0.0, float(row[sign > 0].max(initial=0.0))) for row, sign in zip(held, run.sign)]
    return Timed(values, ends, begins, busy, peak)


@dataclass(frozen=True, eq=False)
class Periodic:
    """What `extend` needs from a short run's graph: ``period`` (the units after the steady
    cut, up to the next) and ``cooldown`` (the units after that), each timed from the state at
    its start; ``state``: where the state after the period lies in the run's values, as
    (positions, transfers added); ``rows``: where it lies in the period's values (row i of the
    period map T); ``ends``: each rank's last end in the cool-down's values; ``work``: per
    rank, the period's duration indices in program order (an F&B pair once)."""

    period: graph.Graph
    cooldown: graph.Graph
    state: tuple[np.ndarray, np.ndarray]
    rows: tuple[np.ndarray, np.ndarray]
    ends: np.ndarray
    work: tuple[np.ndarray, ...]


def periodic_parts(run: Run, labels, cut: int, keys: tuple, p: int, v: int, group: int,
                   mirrored: bool) -> Periodic | None:
    """`Periodic` of a short run with a steady cut (periodic.steady_cuts: ``labels``, ``cut``
    and the state's components ``keys``); None when the period or the cool-down does not close
    (an input neither timed in it nor in the state)."""
    g, chunks = run.graph, p * v
    label = np.empty(len(g.duration), dtype=np.int64)  # per unit, the cut it lies after
    for at, lab in zip(g.position, labels):
        label[at - g.sources] = lab
    period = graph.part(g, label == cut, keys, cut * group, chunks)
    cooldown = graph.part(g, label > cut, keys, (cut + 1) * group, chunks)
    if period is None or cooldown is None:
        return None
    free = [keys.index(("free", r)) for r in range(p)]

    def last(part: graph.Graph, r: int) -> int:  # rank r's last position in a part, or free
        at = part.position[r][part.position[r] >= 0]
        return int(at[-1]) if len(at) else free[r]

    entries = np.array([e for row in run.prog for e in row], dtype=np.int64).reshape(-1, 2)
    code, op = entries[:, 0], entries[:, 1]
    slot = np.where((code == 0) | (code == 5), 0, 1)

    def ends_in(part: graph.Graph):  # (kind, microbatch, chunk) -> its end's position, or None
        at = np.concatenate(part.position)
        keep = (at >= 0) & (code != 2)
        where = np.full(2 * g.stride, -1, dtype=np.int64)
        where[slot[keep] * g.stride + op[keep]] = at[keep]

        def end(kind: str, mb: int, k: int) -> int | None:
            i = mb * chunks + k
            x = int(where[(kind != "F") * g.stride + i]) if 0 <= i < g.stride else -1
            return x if x >= 0 else None
        return end

    before = []  # per rank, its last end before the cut after the period (0: the zero)
    for at, lab in zip(g.position, labels):
        done = at[np.asarray(lab) <= cut]
        before.append(int(done[-1]) if len(done) else 0)
    state = periodic.state_positions(keys, cut + 1, group, p, before, ends_in(g),
                                     mirrored=mirrored)
    rows = periodic.state_positions(keys, cut + 1, group, p, [last(period, r) for r in range(p)],
                                    ends_in(period), {key: i for i, key in enumerate(keys)},
                                    mirrored)
    if state is None or rows is None:
        return None
    ends = np.array([last(cooldown, r) for r in range(p)], dtype=np.int64)
    work = []
    for at in period.position:
        units = at[at >= 0]
        units = units[np.r_[True, units[1:] != units[:-1]]] if len(units) else units
        work.append(period.duration[units - period.sources])
    return Periodic(period, cooldown, state, rows, ends, tuple(work))


def extend(parts: Periodic, table: np.ndarray, comm: np.ndarray, run_values: np.ndarray,
           k: int) -> tuple[list[float], list[float]]:
    """Each rank's last end after ``k`` more periods than the short run timed in
    ``run_values`` (the period map T read off the period's forms, T^k applied to the state
    after the cut's period, the cool-down timed from there), and each rank's work in one
    period (its durations summed in program order)."""
    n = len(parts.rows[0])
    unit = np.full((n, n), graph.NEG)
    np.fill_diagonal(unit, 0.0)
    forms, _ = graph.evaluate(parts.period, unit, table, comm)
    T = forms[parts.rows[0]] + comm[parts.rows[1]][:, None]
    state = periodic.power_apply(T, run_values[parts.state[0]] + comm[parts.state[1]], k)
    done, _ = graph.evaluate(parts.cooldown, state, table, comm)
    return done[parts.ends].tolist(), [sum(table[w].tolist()) for w in parts.work]
