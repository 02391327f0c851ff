"""The MILP formulations for the usual LLM: an embedding, N identical blocks and a head.

:class:`OptionModel`: one binary per (chunk, block count, recompute mode) option, so every chunk's
time and memory are exact in the LP relaxation and a chunk that cannot fit is never a variable.
:class:`RankModel`: for interleaved schedules, a master over the ranks (ranks interact only
through the block total), each rank's least time per block count from a Pareto recursion over
its chunks (:meth:`OptionModel._rank_bound`, a decomposition).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from planner.partitioning.milp import NoChunkFits, linear_expression, MilpModel, solved_value
from planner.partitioning.prepared import Prepared, simple_lower_bound
from planner.partitioning.problem import TIE_RTOL

RANK_BOUND_RTOL = 1e-9
"""Relative margin of ``OptionModel.rank_bound_s`` (seconds) below the least time the rank
decomposition finds: the conservative bound the tie checks and the reported bound read
(lexicographic._keep_proven: a kept split within it is proven a tie)."""
SOLVER_BOUND_RTOL = 1e-12
"""Relative margin of the lower bound on B handed to the solver below that least time: far above
the rounding of a rank's summed option times (a few ulps a term), far below HiGHS's trouble
window. HiGHS 1.16's presolve calls the model infeasible when a column bound sits below the value
its rows force by 0.2 to 1.4 times mip_feasibility_tolerance (measured on the falsifying example
in tests/test_partition.py: RANK_BOUND_RTOL's 1e-9 put B's bound 7.8e-10 below B* = 7/9 at the
tolerance 1e-9, lexicographic.HIGHS_MIP_FEASIBILITY_TOLERANCE; exact or 1e-12 below solves, CBC
solves either way). The bound must also stay within the solver's absolute gap (1e-9 on B <= ~1)
so that a root incumbent at the bound closes the solve, as it did with 1e-9."""

def chunk_options(prep: Prepared, ub: float | None, chunk_cap: float | None = None
                  ) -> tuple[dict[tuple[int, int, int], tuple[float, float]],
                             list[list[tuple[int, int, int]]]]:
    """Every (chunk, blocks, option) worth a variable, with its (seconds, bytes): an option that
    overruns the bound ``ub`` on B, or its mode's capacity, even with the rank's other chunks at
    their smallest is left out, and so is one slower than ``chunk_cap`` (the largest chunk time
    allowed: step 0 of the tie-break rule). Returns (cost, options by chunk)."""
    K, R, L = prep.K, prep.R, prep.L
    N = L - 2
    pr = prep.problem
    t, a, s = pr.time_s, pr.act_bytes, pr.state_bytes
    nmin = [0 if k in (0, K - 1) else 1 for k in range(K)]
    if K == 1:
        nmin = [N]
    edges = [([0] if k == 0 else []) + ([L - 1] if k == K - 1 else []) for k in range(K)]
    slow = math.inf if chunk_cap is None else chunk_cap * (1 + TIE_RTOL) + 1e-300
    # the terms of a chunk's cost as Python floats, read once (cost() is called for every
    # option: tens of thousands of times on gpt3-175b's interleaved splits); the sums run in the
    # order they always did, so every option's numbers are unchanged
    edge_t = [[float(sum(t[i, r] for i in e)) for r in range(R)] for e in edges]
    edge_s = [float(sum(s[i] for i in e)) for e in edges]
    edge_a = [[float(sum(a[i, r] for i in e)) for r in range(R)] for e in edges]
    block_t, block_a, block_s = t[1].tolist(), a[1].tolist(), float(s[1])
    bnd, inflight = prep.bnd.tolist(), prep.inflight.tolist()

    def cost(k: int, n: int, r: int) -> tuple[float, float]:
        tm = edge_t[k][r] + n * block_t[r] + bnd[k]
        mem = edge_s[k] + n * block_s + inflight[k] * (edge_a[k][r] + n * block_a[r])
        return tm, mem

    def partial_cost(k: int, n: int, o: int) -> tuple[float, float]:
        """Option o >= R: the first c = o - R + 1 of the n blocks recomputed (the problem's
        partial modes), the others and the edges in the base mode."""
        b, f = pr.partial
        c = o - R + 1
        tm, mem = cost(k, n, b)
        return (tm + c * float(t[1, f] - t[1, b]),
                mem + float(prep.inflight[k] * c * (a[1, f] - a[1, b])))

    least = [min(cost(k, nmin[k], r) for r in range(R)) for k in range(K)]
    least_mem = [min(cost(k, nmin[k], r)[1] for r in range(R)) for k in range(K)]
    options: dict[tuple[int, int, int], tuple[float, float]] = {}
    for k in range(K):
        rho = prep.rank_of[k]
        others = [j for j in prep.chunks_of(rho) if j != k]
        t_rest = sum(least[j][0] for j in others)
        m_rest = sum(least_mem[j] for j in others) + prep.extra[rho]
        nmax = N - (sum(nmin) - nmin[k])
        for r in range(R):
            for n in range(nmin[k], nmax + 1):
                tm, mem = cost(k, n, r)
                if ub is not None and tm + t_rest > ub * (1 + 1e-7) or tm > slow:
                    break
                if mem + m_rest > prep.cap[r] * (1 + TIE_RTOL):
                    break
                options[k, n, r] = (tm, mem)
        if pr.partial is None:
            continue
        cap_f = prep.cap[pr.partial[1]] * (1 + TIE_RTOL)
        for n in range(max(nmin[k], 2), nmax + 1):
            # recomputing more blocks only costs time: with one chunk per rank only the
            # least count that fits is worth an option; with several, every count that fits
            # alone (the rank's memory row then picks among them)
            if partial_cost(k, n, R)[0] > slow:
                break  # one block recomputed is already too slow, and more blocks are slower
            for c in range(1, n):
                o = R + c - 1
                tm, mem = partial_cost(k, n, o)
                if ub is not None and tm + t_rest > ub * (1 + 1e-7) or tm > slow:
                    break
                if mem + m_rest > cap_f:
                    continue
                options[k, n, o] = (tm, mem)
                if len(others) == 0:
                    break
    by_chunk: list[list[tuple[int, int, int]]] = [[] for _ in range(K)]
    for key in options:
        by_chunk[key[0]].append(key)
    return options, by_chunk


@lru_cache(maxsize=8)
def rank_options(prep: Prepared, ub: float | None, chunk_cap: float | None
                 ) -> tuple[dict, list, np.ndarray | None, list[dict] | None]:
    """(cost, by_chunk) of :func:`chunk_options` and (tau, patterns) of :func:`rank_tables`
    (None when some chunk has no option). Cached per prepared problem (``Prepared`` hashes by
    identity): the least-largest-chunk bisection (planner/partitioning/largest_chunk.py) ends on
    the very cap the option model is then built with, so the model reuses its tables. Callers
    only read what it returns."""
    cost, by_chunk = chunk_options(prep, ub, chunk_cap)
    if any(not opts for opts in by_chunk):
        return cost, by_chunk, None, None
    tau, patterns = rank_tables(prep, cost, by_chunk)
    tau.setflags(write=False)
    return cost, by_chunk, tau, patterns


def rank_tables(prep: Prepared, cost: dict, by_chunk: list) -> tuple[np.ndarray, list[dict]]:
    """tau (p, N+1): each rank's least time holding c blocks in its chunks within its memory
    (inf where it cannot), and the chunk arrangement (n_k, option_k) that achieves it: the Pareto
    recursion of :meth:`OptionModel._rank_bound` over the options ``cost`` / ``by_chunk``."""
    p, N = prep.p, prep.L - 2
    ms = prep.cap_max if prep.cap_max > 0 else 1.0
    tau, patterns = [], []
    # ranks whose chunks have the same options (blocks, mode, time, memory) and the same extra
    # bytes get the same recursion: done once (interleaved ranks often share their in-flight
    # counts and transfers: 4 distinct of 8 ranks on gpt3-175b, pp 8, v 6)
    done: dict = {}
    option_cap = {r: prep.option_cap(r) for r in {o[2] for opts in by_chunk for o in opts}}
    levels = sorted(set(prep.cap.tolist()))
    for rho in range(p):
        ks = list(prep.chunks_of(rho))
        same = (prep.extra[rho], tuple(tuple((o[1], o[2]) + cost[o] for o in by_chunk[k])
                                       for k in ks))
        if same in done:
            tau.append(tau[done[same]])
            patterns.append(patterns[done[same]])
            continue
        done[same] = rho
        best = np.full(N + 1, math.inf)
        how: dict[int, tuple] = {}  # c -> ((n_k, r_k) per chunk of the rank)
        # each chunk's options as rows (blocks, seconds, memory, n, r), and each option's
        # capacity, built once for every level
        rows = {k: np.array([(o[1], cost[o][0], cost[o][1] / ms, o[1], o[2])
                             for o in by_chunk[k]]).reshape(-1, 5) for k in ks}
        caps = {k: np.array([option_cap[o[2]] for o in by_chunk[k]]) for k in ks}
        for level in levels:
            cap = level / ms * (1 + TIE_RTOL)
            # columns: blocks, seconds, memory, then (n, r) of each chunk so far
            states = np.array([[0.0, 0.0, prep.extra[rho] / ms]])
            for k in ks:
                opts = rows[k][caps[k] >= level]
                S, O = len(states), len(opts)
                both = np.concatenate([
                    (states[:, None, :3] + opts[None, :, :3]).reshape(-1, 3),
                    np.repeat(states[:, 3:], O, axis=0),
                    np.tile(opts[:, 3:], (S, 1))], axis=1)
                states = _pareto(both[(both[:, 2] <= cap) & (both[:, 0] <= N)])
                if not len(states):
                    break
            else:
                for row in states:
                    c = int(row[0])
                    if row[1] < best[c]:
                        best[c] = row[1]
                        how[c] = tuple((int(row[3 + 2 * i]), int(row[4 + 2 * i]))
                                       for i in range(len(ks)))
        tau.append(best)
        patterns.append(how)
    return np.array(tau), patterns


class OptionModel(MilpModel):
    """Embedding + N identical blocks + head: binary ``y[k, n, r]`` = chunk k holds n blocks
    under option r (chunk 0 also the embedding, chunk K-1 also the head; middle chunks at least
    one block; an option is a mode, or with partial recompute r = R + c - 1: the first c of the
    n blocks recomputed). ``sum_{n,r} y[k, n, r] = 1``, ``sum n y = N``; a rank's time and memory are
    linear in y, and an option that overruns the bound B or its mode's capacity even with the
    rank's other chunks at their smallest is not created. The LP relaxation of each chunk is the
    convex hull of its options, which is what makes it far stronger than counting blocks with
    big-M mode switches."""

    def __init__(self, prep: Prepared, ub: float | None, chunk_cap: float | None = None) -> None:
        import pulp

        self.prep = prep
        K, p, L = prep.K, prep.p, prep.L
        N = L - 2
        self.tscale = ts = ub if ub else max(simple_lower_bound(prep), 1e-12)
        ms = prep.cap_max if prep.cap_max > 0 else 1.0
        prob = pulp.LpProblem("partition_options", pulp.LpMinimize)
        self.B = prob.add_variable("B", lowBound=0)
        self.cost, self.by_chunk, self.tau, self.patterns = rank_options(prep, ub, chunk_cap)
        self.y = {o: prob.add_variable(f"y_{o[0]}_{o[1]}_{o[2]}", cat="Binary") for o in self.cost}
        if self.tau is None:  # a chunk with no option
            raise NoChunkFits
        for k in range(K):
            prob += pulp.lpSum(self.y[o] for o in self.by_chunk[k]) == 1
        prob += linear_expression((self.y[o], o[1]) for o in self.y) == N
        for rho in range(p):
            ks = prep.chunks_of(rho)
            opts = [o for k in ks for o in self.by_chunk[k]]
            prob += linear_expression([(self.y[o], self.cost[o][0] / ts) for o in opts] + [(self.B, -1.0)]) <= 0
            if len(ks) == 1:
                continue  # one chunk: its options already fit its mode's capacity
            mem = [(self.y[o], self.cost[o][1] / ms) for o in opts]
            room = (prep.cap_max - prep.extra[rho]) / ms
            worst = sum(max(self.cost[o][1] for o in self.by_chunk[k]) for k in ks)
            if worst + prep.extra[rho] > prep.cap.min():
                prob += linear_expression(mem) <= room
                for k in ks:
                    for level in sorted({prep.option_cap(o[2]) for o in self.by_chunk[k]}):
                        short = (prep.cap_max - level) / ms
                        if short > 0:  # an option of this capacity lowers the rank's
                            prob += linear_expression(mem + [(self.y[o], short) for o in self.by_chunk[k]
                                                if prep.option_cap(o[2]) == level]) <= room
        if ub is not None:
            self.B.upBound = ub * (1 + 1e-7) / ts
        least = self._rank_bound()
        self.rank_bound_s = least * (1 - RANK_BOUND_RTOL)
        self.solver_bound_s = least * (1 - SOLVER_BOUND_RTOL)  # SOLVER_BOUND_RTOL: why not 1e-9
        self.B.lowBound = self.solver_bound_s / ts
        prob += self.B
        self.prob = prob
        # chunk ends reachable: prefix sums of the smallest / largest block counts
        cnt_lo = [min(o[1] for o in self.by_chunk[k]) for k in range(K)]
        cnt_hi = [max(o[1] for o in self.by_chunk[k]) for k in range(K)]
        self.end_lo = [min(1 + sum(cnt_lo[: k + 1]), L) for k in range(K)]
        self.end_hi = [min(1 + sum(cnt_hi[: k + 1]), L - (K - 1 - k)) for k in range(K)]
        self.end_lo[-1] = self.end_hi[-1] = L

    def _rank_bound(self) -> float:
        """The least B the ranks allow one at a time, as computed (no margin): a lower bound on
        B from the ranks one at a time (a decomposition). Blocks are
        identical, so ranks interact only through the total N: rank rho can take c blocks within
        time b exactly when tau_rho(c) <= b, where tau_rho(c) is the least time of its chunks
        holding c blocks within its memory (per capacity level: the modes whose capacity is at
        least that level, memory within it). Moving a block out of a chunk only saves time and
        memory, so the c a rank can take at b form an interval, and the least b with
        sum_rho max{c : tau_rho(c) <= b} >= N bounds B* from below (and meets it when the
        block-count minimums leave room). The LP relaxation alone is off by up to a block per
        rank, which with several chunks per rank (interleaved) costs the solver long branching.
        tau_rho comes from a Pareto recursion over the rank's chunks on (blocks, time, memory)."""
        N = self.prep.L - 2
        tau = self.tau  # rank_tables', from rank_options
        cand = np.unique(tau[np.isfinite(tau)])

        def enough(b: float) -> bool:
            ok = tau <= b
            most = np.where(ok.any(axis=1), (N - np.argmax(ok[:, ::-1], axis=1)), -1)
            return bool((most >= 0).all() and most.sum() >= N)

        lo, hi = 0, len(cand) - 1
        if hi < 0 or not enough(cand[hi]):
            return 0.0
        while lo < hi:
            mid = (lo + hi) // 2
            if enough(cand[mid]):
                hi = mid
            else:
                lo = mid + 1
        return float(cand[lo])

    def compute_time(self):
        ts = self.tscale
        return linear_expression((v, (self.cost[o][0] - self.prep.bnd[o[0]]) / ts) for o, v in self.y.items())

    def end(self, k: int):
        if k == self.prep.K - 1:
            return linear_expression([]) + self.prep.L
        return linear_expression((self.y[o], o[1]) for j in range(k + 1) for o in self.by_chunk[j]) + 1

    def mode(self, k: int):
        return linear_expression((self.y[o], o[2]) for o in self.by_chunk[k])

    def _edges(self, k: int) -> int:
        return int(k == 0) + int(k == self.prep.K - 1)

    def count(self, k: int):
        return linear_expression((self.y[o], o[1]) for o in self.by_chunk[k]) + self._edges(k)

    def count_range(self, k: int) -> tuple[int, int]:
        ns = [o[1] for o in self.by_chunk[k]]
        return min(ns) + self._edges(k), max(ns) + self._edges(k)

    def binaries(self) -> int:
        return len(self.y)

    def solution(self) -> tuple[list[int], list[int]]:
        K, L = self.prep.K, self.prep.L
        ends, modes, end = [], [], 1
        for k in range(K):
            o = max(self.by_chunk[k], key=lambda o: solved_value(self.y[o]))
            end += o[1]
            ends.append(L if k == K - 1 else end)
            modes.append(o[2])
        return ends, modes

    def warm_start(self, ends: Sequence[int], modes: Sequence[int]) -> None:
        start = 1
        for k, (e, r) in enumerate(zip(ends, modes)):
            n = (e - (1 if k == self.prep.K - 1 else 0)) - start
            start += n
            for o in self.by_chunk[k]:
                self.y[o].setInitialValue(1 if o == (k, n, r) else 0)


def _pareto(states: np.ndarray) -> np.ndarray:
    """Rows (blocks, time, memory) that no row with the same blocks beats in both time and
    memory."""
    if not len(states):
        return states
    order = np.lexsort((states[:, 2], states[:, 1], states[:, 0]))
    s = states[order]
    span = float(s[:, 2].max() - s[:, 2].min()) + 1.0
    shifted = s[:, 2] - s[:, 0] * 2 * span  # later block counts sort below: the running
    prior = np.minimum.accumulate(shifted)  # minimum restarts at every block count
    keep = np.ones(len(s), dtype=bool)
    keep[1:] = shifted[1:] < prior[:-1]
    return s[keep]


class RankModel(MilpModel):
    """The interleaved master over the decomposition of :meth:`OptionModel._rank_bound`: binary
    ``u[rho, c]`` = rank rho holds c blocks, at its least time tau_rho(c) (its chunks arranged
    as the Pareto recursion found, within the rank's memory). ``sum_c u[rho, c] = 1``,
    ``sum c u = N``, ``B >= sum_c tau_rho(c) u[rho, c]``. Ranks interact only through N, so
    this is exact for steps 1 and 2 of the tie-break (least B, then least total time: for a
    given c the least-time arrangement is best for both); step 3 needs every arrangement and
    runs on the option model. Its LP relaxation is nearly integral where the option model's
    leaves the solver to branch over many ranks' fractional blocks."""

    def __init__(self, om: OptionModel) -> None:
        import pulp

        self.prep = prep = om.prep
        self.om = om
        p, N = prep.p, prep.L - 2
        ub = om.B.upBound * om.tscale if om.B.upBound is not None else math.inf
        self.tscale = ts = om.tscale
        prob = pulp.LpProblem("partition_ranks", pulp.LpMinimize)
        self.B = prob.add_variable("B", lowBound=om.solver_bound_s / ts,
                                   upBound=None if om.B.upBound is None else om.B.upBound)
        self.u = {}
        bnd = [float(sum(prep.bnd[k] for k in prep.chunks_of(rho))) for rho in range(p)]
        for rho in range(p):
            for c in np.flatnonzero(np.isfinite(om.tau[rho])):
                if om.tau[rho, c] <= ub * (1 + 1e-7):
                    self.u[rho, int(c)] = prob.add_variable(f"u_{rho}_{c}", cat="Binary")
        for rho in range(p):
            mine = [(v, c) for (r, c), v in self.u.items() if r == rho]
            if not mine:
                raise NoChunkFits
            prob += pulp.lpSum(v for v, _ in mine) == 1
            prob += linear_expression([(v, om.tau[rho, c] / ts) for v, c in mine] + [(self.B, -1.0)]) <= 0
        prob += linear_expression((v, c) for (_, c), v in self.u.items()) == N
        self._compute = linear_expression((v, (om.tau[rho, c] - bnd[rho]) / ts) for (rho, c), v in self.u.items())
        prob += self.B
        self.prob = prob
        self.end_lo, self.end_hi = om.end_lo, om.end_hi

    def compute_time(self):
        return self._compute

    def solution(self) -> tuple[list[int], list[int]]:
        prep = self.prep
        K, L = prep.K, prep.L
        n, modes = [0] * K, [0] * K  # chunk k holds n[k] blocks
        for (rho, c), v in self.u.items():
            if solved_value(v) > 0.5:
                for k, (nk, rk) in zip(prep.chunks_of(rho), self.om.patterns[rho][c]):
                    n[k], modes[k] = nk, rk
        ends, end = [], 1
        for k in range(K):
            end += n[k]
            ends.append(L if k == K - 1 else end)
        return ends, modes

    def warm_start(self, ends: Sequence[int], modes: Sequence[int]) -> None:
        pass  # the master is solved from scratch: its LP relaxation is nearly integral
