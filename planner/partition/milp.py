"""The stage-partition MILP (PuLP; HiGHS or CBC): two formulations and the lexicographic solve.

:class:`OptionModel` is for the usual LLM, an embedding, N identical blocks and a head: one binary
per (chunk, block count, recompute mode) option, so every chunk's time and memory are exact in
the LP relaxation and a chunk that cannot fit on its own is never a variable. :class:`BoundaryModel`
places chunk boundaries among the layers of any sequential model. Both carry the per-mode memory
capacity (a rank is held to the smallest capacity among the modes its chunks use) and any number
of chunks per rank (interleaved, v > 1, chunks of different sizes).

:func:`solve_lexicographic` runs the tie-break rule of :mod:`planner.partition.problem` on the MILP
alone: minimise the bottleneck B; then, with B <= B*, the total compute time T; then, with
T <= T* too, the chunk keys ``R * end_k + mode_k`` in chunk order, several chunks per solve (a
mixed-radix weighted sum over their key ranges is minimal exactly at the lexicographic minimum).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.partition.problem import (TIE_RTOL, PartitionError, Prepared, _lower_bound, score_split,
                                       total_compute_s)

MAX_BINARIES = 20_000
"""Above this many binaries PuLP model building alone takes seconds."""

LEX_RADIX_LIMIT = 1 << 20
"""Largest objective range of one tie-break solve: keeps the weighted keys exact integers well
inside the solvers' tolerances (double precision, absolute gap below one unit)."""

CAP_SLACK = 1e-7
"""Relative slack on the B and T caps handed to the solver (its feasibility tolerance is ~1e-6 on
O(1) rows); every split it returns is re-checked exactly with ``TIE_RTOL``."""


def windows(prep: Prepared, ub: float | None) -> tuple[list[int], list[int]]:
    """Range [lo_k, hi_k] of each chunk end, tightened with an upper bound on B.

    Chunks 0..k touch min(k+1, p) ranks, each with at most ``ub`` seconds, so
    the fastest-mode time of layers [0, end_k) plus their boundaries is at
    most min(k+1, p) * ub; symmetrically for the chunks after k.
    """
    L, K, p = prep.L, prep.K, prep.p
    lo = [k + 1 for k in range(K)]
    hi = [L - (K - 1 - k) for k in range(K)]
    if ub is not None:
        ub = ub * (1 + 1e-7)
        pref = np.concatenate([[0.0], np.cumsum(prep.problem.time_s.min(axis=1))])
        suf = pref[-1] - pref
        bcum = np.cumsum(prep.bnd)
        for k in range(K - 1):
            room_before = min(k + 1, p) * ub - bcum[k]
            room_after = min(K - 1 - k, p) * ub - (bcum[-1] - bcum[k])
            hi[k] = min(hi[k], int(np.searchsorted(pref, room_before, side="right")) - 1)
            lo[k] = max(lo[k], int(np.searchsorted(-suf, -room_after, side="left")))
    for k in range(1, K):
        lo[k] = max(lo[k], lo[k - 1] + 1)
    for k in range(K - 2, -1, -1):
        hi[k] = min(hi[k], hi[k + 1] - 1)
    lo[K - 1] = hi[K - 1] = L
    return lo, hi


def uniform_blocks(prep: Prepared) -> bool:
    """True when every layer but the first and the last is the same (embedding, N identical
    blocks, head: the usual LLM), so a split is fully described by blocks per chunk."""
    pr = prep.problem
    if prep.L < 3:
        return False
    mid = slice(1, prep.L - 1)
    return bool((pr.time_s[mid] == pr.time_s[1]).all() and (pr.act_bytes[mid] == pr.act_bytes[1]).all()
                and (pr.state_bytes[mid] == pr.state_bytes[1]).all())


def _lin(pairs):
    """A linear expression from (variable, coefficient) pairs, repeated variables summed."""
    import pulp

    acc: dict = {}
    for v, c in pairs:
        if c:
            acc[v] = acc.get(v, 0.0) + float(c)
    return pulp.LpAffineExpression(list(acc.items()))


class _Model:
    """What both formulations share: the PuLP problem, the bottleneck variable, scales, the
    chunk end and mode expressions, and the capacity rows."""

    prep: Prepared
    prob: object
    B: object
    tscale: float
    end_lo: list[int]
    end_hi: list[int]

    def compute_time(self):
        """Total compute time (boundaries excluded), in units of ``tscale``."""
        raise NotImplementedError

    def end(self, k: int):
        raise NotImplementedError

    def mode(self, k: int):
        raise NotImplementedError

    def solution(self) -> tuple[list[int], list[int]]:
        raise NotImplementedError

    def warm_start(self, ends: Sequence[int], modes: Sequence[int]) -> None:
        raise NotImplementedError

    def key(self, k: int):
        """``R * end_k + mode_k``: the chunk's place in the tie-break order, an integer."""
        return self.prep.R * self.end(k) + self.mode(k)

    def key_range(self, k: int) -> tuple[int, int]:
        R = self.prep.R
        return R * self.end_lo[k], R * self.end_hi[k] + R - 1


class OptionModel(_Model):
    """Embedding + N identical blocks + head: binary ``y[k, n, r]`` = chunk k holds n blocks
    under mode r (chunk 0 also the embedding, chunk K-1 also the head; middle chunks at least
    one block). ``sum_{n,r} y[k, n, r] = 1``, ``sum n y = N``; a rank's time and memory are
    linear in y, and an option that overruns the bound B or its mode's capacity even with the
    rank's other chunks at their smallest is not created. The LP relaxation of each chunk is the
    convex hull of its options, which is what makes it far stronger than counting blocks with
    big-M mode switches."""

    def __init__(self, prep: Prepared, ub: float | None) -> None:
        import pulp

        self.prep = prep
        K, p, R, L = prep.K, prep.p, prep.R, prep.L
        N = L - 2
        pr = prep.problem
        self.tscale = ts = ub if ub else max(_lower_bound(prep), 1e-12)
        ms = prep.cap_max if prep.cap_max > 0 else 1.0
        t, a, s = pr.time_s, pr.act_bytes, pr.state_bytes
        nmin = [0 if k in (0, K - 1) else 1 for k in range(K)]
        if K == 1:
            nmin = [N]
        edges = [([0] if k == 0 else []) + ([L - 1] if k == K - 1 else []) for k in range(K)]

        def cost(k: int, n: int, r: int) -> tuple[float, float]:
            e = edges[k]
            tm = float(sum(t[i, r] for i in e) + n * t[1, r] + prep.bnd[k])
            mem = float(sum(s[i] for i in e) + n * s[1]
                        + prep.inflight[k] * (sum(a[i, r] for i in e) + n * a[1, r]))
            return tm, mem

        least = [min(cost(k, nmin[k], r) for r in range(R)) for k in range(K)]
        least_mem = [min(cost(k, nmin[k], r)[1] for r in range(R)) for k in range(K)]
        prob = pulp.LpProblem("partition_options", pulp.LpMinimize)
        self.B = prob.add_variable("B", lowBound=0)
        self.y: dict[tuple[int, int, int], object] = {}
        self.cost: dict[tuple[int, int, int], tuple[float, float]] = {}
        for k in range(K):
            rho = k % p
            others = [j for j in range(rho, K, p) if j != k]
            t_rest = sum(least[j][0] for j in others)
            m_rest = sum(least_mem[j] for j in others) + prep.extra[rho]
            nmax = N - (sum(nmin) - nmin[k])
            for r in range(R):
                for n in range(nmin[k], nmax + 1):
                    tm, mem = cost(k, n, r)
                    if ub is not None and tm + t_rest > ub * (1 + 1e-7):
                        break
                    if mem + m_rest > prep.cap[r] * (1 + TIE_RTOL):
                        break
                    self.y[k, n, r] = prob.add_variable(f"y_{k}_{n}_{r}", cat="Binary")
                    self.cost[k, n, r] = (tm, mem)
        self.by_chunk: list[list[tuple[int, int, int]]] = [[] for _ in range(K)]
        for key in self.y:
            self.by_chunk[key[0]].append(key)
        if any(not opts for opts in self.by_chunk):
            raise _Infeasible
        for k in range(K):
            prob += pulp.lpSum(self.y[o] for o in self.by_chunk[k]) == 1
        prob += _lin((self.y[o], o[1]) for o in self.y) == N
        for rho in range(p):
            ks = range(rho, K, p)
            opts = [o for k in ks for o in self.by_chunk[k]]
            prob += _lin([(self.y[o], self.cost[o][0] / ts) for o in opts] + [(self.B, -1.0)]) <= 0
            if len(ks) == 1:
                continue  # one chunk: its options already fit its mode's capacity
            mem = [(self.y[o], self.cost[o][1] / ms) for o in opts]
            room = (prep.cap_max - prep.extra[rho]) / ms
            worst = sum(max(self.cost[o][1] for o in self.by_chunk[k]) for k in ks)
            if worst + prep.extra[rho] > prep.cap.min():
                prob += _lin(mem) <= room
                for k in ks:
                    for r in range(R):
                        short = (prep.cap_max - prep.cap[r]) / ms
                        if short > 0:  # using mode r on this rank lowers its capacity
                            prob += _lin(mem + [(self.y[o], short) for o in self.by_chunk[k]
                                                if o[2] == r]) <= room
        if ub is not None:
            self.B.upBound = ub * (1 + 1e-7) / ts
        self.rank_bound_s = self._rank_bound()
        self.B.lowBound = self.rank_bound_s / ts
        prob += self.B
        self.prob = prob
        # chunk ends reachable: prefix sums of the smallest / largest block counts
        cnt_lo = [min(o[1] for o in self.by_chunk[k]) for k in range(K)]
        cnt_hi = [max(o[1] for o in self.by_chunk[k]) for k in range(K)]
        self.end_lo = [min(1 + sum(cnt_lo[: k + 1]), L) for k in range(K)]
        self.end_hi = [min(1 + sum(cnt_hi[: k + 1]), L - (K - 1 - k)) for k in range(K)]
        self.end_lo[-1] = self.end_hi[-1] = L

    def _rank_bound(self) -> float:
        """A lower bound on B from the ranks one at a time (a decomposition). Blocks are
        identical, so ranks interact only through the total N: rank rho can take c blocks within
        time b exactly when tau_rho(c) <= b, where tau_rho(c) is the least time of its chunks
        holding c blocks within its memory (per capacity level: the modes whose capacity is at
        least that level, memory within it). Moving a block out of a chunk only saves time and
        memory, so the c a rank can take at b form an interval, and the least b with
        sum_rho max{c : tau_rho(c) <= b} >= N bounds B* from below (and meets it when the
        block-count minimums leave room). The LP relaxation alone is off by up to a block per
        rank, which with several chunks per rank (interleaved) costs the solver long branching.
        tau_rho comes from a Pareto recursion over the rank's chunks on (blocks, time, memory)."""
        prep = self.prep
        K, p, N = prep.K, prep.p, prep.L - 2
        ms = prep.cap_max if prep.cap_max > 0 else 1.0
        tau, self.patterns = [], []
        for rho in range(p):
            ks = list(range(rho, K, p))
            best = np.full(N + 1, math.inf)
            how: dict[int, tuple] = {}  # c -> ((n_k, r_k) per chunk of the rank)
            for level in sorted(set(prep.cap.tolist())):
                ok = [r for r in range(prep.R) if prep.cap[r] >= level]
                cap = level / ms * (1 + TIE_RTOL)
                # columns: blocks, seconds, memory, then (n, r) of each chunk so far
                states = np.array([[0.0, 0.0, prep.extra[rho] / ms]])
                for k in ks:
                    opts = np.array([(o[1], self.cost[o][0], self.cost[o][1] / ms, o[1], o[2])
                                     for o in self.by_chunk[k] if o[2] in ok]).reshape(-1, 5)
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
            self.patterns.append(how)
        tau = self.tau = np.array(tau)  # (p, N+1)
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
        return float(cand[lo]) * (1 - 1e-9)

    def compute_time(self):
        ts = self.tscale
        return _lin((v, (self.cost[o][0] - self.prep.bnd[o[0]]) / ts) for o, v in self.y.items())

    def end(self, k: int):
        if k == self.prep.K - 1:
            return _lin([]) + self.prep.L
        return _lin((self.y[o], o[1]) for j in range(k + 1) for o in self.by_chunk[j]) + 1

    def mode(self, k: int):
        return _lin((self.y[o], o[2]) for o in self.by_chunk[k])

    def binaries(self) -> int:
        return len(self.y)

    def solution(self) -> tuple[list[int], list[int]]:
        K, L = self.prep.K, self.prep.L
        ends, modes, end = [], [], 1
        for k in range(K):
            o = max(self.by_chunk[k], key=lambda o: _val(self.y[o]))
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


class BoundaryModel(_Model):
    """Any layer sequence: binary ``x[k, j] = 1`` iff chunk k ends after layer j, only for j
    inside a window ``[lo_k, hi_k)`` derived from a heuristic upper bound (outside it x is a
    constant); ``x[k, j] >= x[k, j+1]`` (monotone) and ``x[k+1, j+1] >= x[k, j]`` (chunks
    non-empty, in order). Any per-layer quantity ``w`` summed over chunk k is
    ``sum_j w_j (x[k, j] - x[k-1, j])``. A one-hot ``z[k, r]`` picks the mode; chunk time
    ``t_k >= T_k^r(x) - M (1 - z[k, r])`` and activations likewise, with M the largest chunk the
    window allows. A rank's memory is held to the capacity of every mode one of its chunks uses
    (a big-M row per chunk and mode whose capacity is below the largest)."""

    def __init__(self, prep: Prepared, ub: float | None) -> None:
        import pulp

        self.prep = prep
        K, p, R = prep.K, prep.p, prep.R
        lo, hi = self.lo, self.hi = windows(prep, ub)
        self.end_lo, self.end_hi = lo, hi
        if any(lo[k] > hi[k] for k in range(K)):
            raise PartitionError("internal: empty window")  # ub came from a feasible split
        # time in units of the bound, memory in units of the capacity: O(1) coefficients
        self.tscale = ts = ub if ub else max(_lower_bound(prep), 1e-12)
        ms = prep.cap_max if prep.cap_max > 0 else 1.0
        prob = pulp.LpProblem("partition", pulp.LpMinimize)
        x = {}
        for k in range(K - 1):
            for j in range(lo[k], hi[k]):
                x[k, j] = prob.add_variable(f"x_{k}_{j}", cat="Binary")
        self.x = x

        def X(k: int, j: int):
            if k < 0:
                return 0
            if k == K - 1 or j < lo[k]:
                return 1
            if j >= hi[k]:
                return 0
            return x[k, j]

        self.X = X
        for (k, j), var in x.items():
            if (k, j + 1) in x:
                prob += var >= x[k, j + 1]  # end_k > j+1  =>  end_k > j
            nxt = X(k + 1, j + 1)  # end_k > j  =>  end_{k+1} > j+1
            if not isinstance(nxt, int):
                prob += nxt >= var
            elif nxt == 0:
                prob += var == 0

        def prefix(k: int, w: np.ndarray):
            """sum_{j < end_k} w[j] as a linear expression."""
            if k < 0:
                return 0.0
            if k == K - 1:
                return float(w.sum())
            return float(w[: lo[k]].sum()) + pulp.lpSum(float(w[j]) * x[k, j] for j in range(lo[k], hi[k]) if w[j])

        t = prep.problem.time_s / ts
        a = prep.problem.act_bytes / ms
        s = prep.problem.state_bytes / ms
        start = lambda k: lo[k - 1] if k > 0 else 0  # noqa: E731
        self.z = {}
        tk, mk = [], []
        for k in range(K):
            i_lo, e_hi = start(k), hi[k]
            span_t = [prefix(k, t[:, r]) - prefix(k - 1, t[:, r]) for r in range(R)]
            span_a = [prefix(k, a[:, r]) - prefix(k - 1, a[:, r]) for r in range(R)]
            span_s = prefix(k, s) - prefix(k - 1, s)
            if R == 1:
                tk.append(span_t[0])
                mk.append(span_s + float(prep.inflight[k]) * span_a[0])
                continue
            z = [prob.add_variable(f"z_{k}_{r}", cat="Binary") for r in range(R)]
            self.z.update({(k, r): z[r] for r in range(R)})
            prob += pulp.lpSum(z) == 1
            tv = prob.add_variable(f"t_{k}", lowBound=0)
            av = prob.add_variable(f"a_{k}", lowBound=0)
            # valid cuts: a chunk costs at least its fastest / lightest mode
            prob += tv >= prefix(k, t.min(axis=1)) - prefix(k - 1, t.min(axis=1))
            amin = a.min(axis=1)
            if amin.any():
                prob += av >= float(prep.inflight[k]) * (prefix(k, amin) - prefix(k - 1, amin))
            for r in range(R):
                big_t = float(t[i_lo:e_hi, r].sum())
                big_a = float(prep.inflight[k] * a[i_lo:e_hi, r].sum())
                prob += tv >= span_t[r] - big_t * (1 - z[r])
                if big_a > 0:
                    prob += av >= float(prep.inflight[k]) * span_a[r] - big_a * (1 - z[r])
            tk.append(tv)
            mk.append(span_s + av)
        self.tk = tk
        self.B = prob.add_variable("B", lowBound=0)
        bnd = prep.bnd / ts
        for rho in range(p):
            ks = range(rho, K, p)
            prob += self.B >= pulp.lpSum(tk[k] for k in ks) + float(sum(bnd[k] for k in ks))
            worst = sum(
                float(s[start(k) : hi[k]].sum() + prep.inflight[k] * a[start(k) : hi[k]].max(axis=1).sum())
                for k in ks
            ) + prep.extra[rho] / ms
            if worst <= prep.cap.min() / ms:  # skip ranks that fit whatever happens
                continue
            room = (prep.cap_max - prep.extra[rho]) / ms
            mem = pulp.lpSum(mk[k] for k in ks)
            prob += mem <= room
            for k in ks:
                for r in range(R):
                    short = (prep.cap_max - prep.cap[r]) / ms
                    if short > 0:  # a chunk in mode r holds its rank to mode r's capacity
                        prob += mem + short * self.z[k, r] <= room
        if ub is not None:
            self.B.upBound = ub * (1 + 1e-7) / ts
        prob += self.B
        self.prob = prob

    def compute_time(self):
        import pulp

        return pulp.lpSum(self.tk)

    def end(self, k: int):
        import pulp

        if k == self.prep.K - 1:
            return pulp.LpAffineExpression() + self.prep.L
        return pulp.lpSum(self.x[k, j] for j in range(self.lo[k], self.hi[k])) + self.lo[k]

    def mode(self, k: int):
        import pulp

        if self.prep.R == 1:
            return pulp.LpAffineExpression()
        return _lin((self.z[k, r], r) for r in range(self.prep.R))

    def binaries(self) -> int:
        return len(self.x) + len(self.z)

    def warm_start(self, ends: Sequence[int], modes: Sequence[int]) -> None:
        for (k, j), var in self.x.items():
            var.setInitialValue(1 if ends[k] > j else 0)
        for (k, r), var in self.z.items():
            var.setInitialValue(1 if modes[k] == r else 0)

    def solution(self) -> tuple[list[int], list[int]]:
        K, R = self.prep.K, self.prep.R
        ends = []
        for k in range(K):
            ends.append(sum(int(round(float(_val(self.X(k, j))))) for j in range(self.prep.L)))
        modes = []
        for k in range(K):
            if R == 1:
                modes.append(0)
            else:
                modes.append(int(np.argmax([_val(self.z[k, r]) for r in range(R)])))
        return ends, modes


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


class RankModel(_Model):
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
        K, p, N = prep.K, prep.p, prep.L - 2
        ub = om.B.upBound * om.tscale if om.B.upBound is not None else math.inf
        self.tscale = ts = om.tscale
        prob = pulp.LpProblem("partition_ranks", pulp.LpMinimize)
        self.B = prob.add_variable("B", lowBound=om.rank_bound_s / ts,
                                   upBound=None if om.B.upBound is None else om.B.upBound)
        self.u = {}
        bnd = [float(sum(prep.bnd[k] for k in range(rho, K, p))) for rho in range(p)]
        for rho in range(p):
            for c in np.flatnonzero(np.isfinite(om.tau[rho])):
                if om.tau[rho, c] <= ub * (1 + 1e-7):
                    self.u[rho, int(c)] = prob.add_variable(f"u_{rho}_{c}", cat="Binary")
        for rho in range(p):
            mine = [(v, c) for (r, c), v in self.u.items() if r == rho]
            if not mine:
                raise _Infeasible
            prob += pulp.lpSum(v for v, _ in mine) == 1
            prob += _lin([(v, om.tau[rho, c] / ts) for v, c in mine] + [(self.B, -1.0)]) <= 0
        prob += _lin((v, c) for (_, c), v in self.u.items()) == N
        self._compute = _lin((v, (om.tau[rho, c] - bnd[rho]) / ts) for (rho, c), v in self.u.items())
        prob += self.B
        self.prob = prob
        self.end_lo, self.end_hi = om.end_lo, om.end_hi

    def compute_time(self):
        return self._compute

    def solution(self) -> tuple[list[int], list[int]]:
        prep = self.prep
        K, p, L = prep.K, prep.p, prep.L
        n, modes = [0] * K, [0] * K  # chunk k holds n[k] blocks
        for (rho, c), v in self.u.items():
            if _val(v) > 0.5:
                for i, (nk, rk) in enumerate(self.om.patterns[rho][c]):
                    n[rho + i * p], modes[rho + i * p] = nk, rk
        ends, end = [], 1
        for k in range(K):
            end += n[k]
            ends.append(L if k == K - 1 else end)
        return ends, modes

    def warm_start(self, ends: Sequence[int], modes: Sequence[int]) -> None:
        pass  # the master is solved from scratch: its LP relaxation is nearly integral


class _Infeasible(Exception):
    """No option of some chunk fits: the instance has no split."""


def build(prep: Prepared, ub: float | None) -> _Model | None:
    """The formulation for this instance, or None when no split can fit (a chunk has no option
    that fits its mode's capacity). Raises PartitionError when the boundary model would be too
    large to build within a time limit."""
    try:
        if uniform_blocks(prep):
            return OptionModel(prep, ub)
    except _Infeasible:
        return None
    lo, hi = windows(prep, ub)
    n_binaries = sum(h - l for l, h in zip(lo, hi)) + prep.K * prep.R
    if n_binaries > MAX_BINARIES:
        raise PartitionError(f"MILP too large ({n_binaries} binaries > {MAX_BINARIES})")
    return BoundaryModel(prep, ub)


# ---------------------------------------------------------------- solving


@dataclass(frozen=True)
class Outcome:
    """What :func:`solve_lexicographic` reached.

    ``status``: 'optimal' (all three tie-break steps proven), 'feasible' (a split, B not proven
    optimal: ``bound_s`` is the solver's lower bound), 'infeasible', or 'none' (no split within
    the time). ``note`` says which tie-break step, if any, ran out of time."""

    status: str
    ends: tuple[int, ...] = ()
    modes: tuple[int, ...] = ()
    bound_s: float = 0.0
    note: str = ""
    kept: bool = False


def solve_lexicographic(model: _Model, name: str, deadline: float,
                        keep: tuple[Sequence[int], Sequence[int], float] | None = None,
                        steps: int = 3) -> Outcome:
    """The three steps of the tie-break rule, each proven by the solver (see module docstring).

    ``keep`` = (ends, modes, bottleneck) of a fitting split the caller prefers on a tie: when
    step 1 proves no split has a smaller bottleneck, it is returned (``kept``) instead of
    running steps 2 and 3. ``steps`` < 3 stops after that step (said in ``note``)."""
    import pulp

    prep = model.prep
    if isinstance(model, OptionModel) and prep.K > prep.p:
        try:  # interleaved: steps 1 and 2 on the per-rank master (same optimum, exact)
            model = RankModel(model)
        except _Infeasible:
            return Outcome("infeasible")
    status, bound = solve(model, name, deadline - time.monotonic())
    if status in ("infeasible", "none"):
        return Outcome(status)
    ends, modes = model.solution()
    b_star = score_split(prep, ends, modes, method="ilp").bottleneck_s
    if status == "feasible":
        lb = max(_lower_bound(prep), (bound or 0.0) * model.tscale,
                 getattr(model, "rank_bound_s", 0.0))
        return Outcome("feasible", tuple(ends), tuple(modes), min(lb, b_star))
    if keep is not None and keep[2] <= b_star * (1 + TIE_RTOL):
        return Outcome("optimal", tuple(keep[0]), tuple(keep[1]), b_star, kept=True)
    if steps <= 1:
        return Outcome("optimal", tuple(ends), tuple(modes), b_star, "ties not broken")
    # step 2 (least compute time; with one mode T is a constant) on the master for v > 1, on
    # the model rebuilt with B* as its bound (far fewer options / a narrower window) otherwise;
    # step 3 on that rebuilt model
    master = model if isinstance(model, RankModel) else None
    fallback_model = model.om if master is not None else model
    if master is None:
        model = build(prep, b_star) or model
    t_star = None
    step2 = master or model
    step2.B.upBound = b_star * (1 + CAP_SLACK) / step2.tscale
    if prep.R > 1:
        step2.warm_start(ends, modes)
        step2.prob.setObjective(step2.compute_time())
        status, _ = solve(step2, name, deadline - time.monotonic())
        if status != "optimal":
            return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                           "least-recompute step timed out; ties may differ from the DP")
        ends, modes = step2.solution()
        t_star = total_compute_s(prep, ends, modes)
    if steps == 2:
        return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                       "ties broken by least recompute only" if prep.R > 1 else "ties not broken")
    if master is not None:
        model = build(prep, b_star) or fallback_model
        model.B.upBound = b_star * (1 + CAP_SLACK) / model.tscale
    if t_star is not None:
        model.prob += model.compute_time() <= (t_star * (1 + CAP_SLACK) + 1e-300) / model.tscale
    if prep.K == prep.p and prep.R == 1:
        # One chunk per rank, one mode: a chunk inside a feasible chunk is feasible, so the
        # chunk-wise smallest ends of two feasible splits are feasible, and the least element
        # (the lexicographic minimum) is the one unique minimiser of the sum of the ends.
        if prep.K > 1:
            model.warm_start(ends, modes)
            model.prob.setObjective(pulp.lpSum(model.end(k) for k in range(prep.K - 1)))
            status, _ = solve(model, name, deadline - time.monotonic())
            if status != "optimal":
                return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                               "tie-break step timed out; ties may differ from the DP")
            ends, modes = model.solution()
        return Outcome("optimal", tuple(ends), tuple(modes), b_star)
    return _lexicographic_keys(model, name, deadline, ends, modes, b_star)


def _lexicographic_keys(model: _Model, name: str, deadline: float, ends: list[int],
                        modes: list[int], b_star: float) -> Outcome:
    """Step 3: fix the chunk keys in order, each window of chunks by one solve of a mixed-radix
    objective; a chunk whose key in the incumbent is already the smallest possible after the
    fixed prefix is fixed without a solve."""
    prep = model.prep
    K, R = prep.K, prep.R
    k = 0
    prev_end = 0
    while k < K:
        floor = R * max(prev_end + 1, model.end_lo[k])
        if R * ends[k] + modes[k] == floor or model.key_range(k)[1] == floor:
            model.prob += model.key(k) == R * ends[k] + modes[k]
            prev_end = ends[k]
            k += 1
            continue
        window, radix = [k], model.key_range(k)[1] - floor + 1
        while window[-1] + 1 < K:
            lo, hi = model.key_range(window[-1] + 1)
            if radix * (hi - lo + 1) > LEX_RADIX_LIMIT:
                break
            window.append(window[-1] + 1)
            radix *= hi - lo + 1
        weights, w = [], 1
        for j in reversed(window):
            weights.append(w)
            lo, hi = model.key_range(j)
            w *= hi - lo + 1
        weights.reverse()
        model.warm_start(ends, modes)
        model.prob.setObjective(sum((wt * model.key(j) for wt, j in zip(weights, window)), 0))
        status, _ = solve(model, name, deadline - time.monotonic())
        if status != "optimal":
            return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                           f"tie-break stopped at chunk {k} (time limit); ties may differ from the DP")
        ends, modes = model.solution()
        for j in window:
            model.prob += model.key(j) == R * ends[j] + modes[j]
        prev_end = ends[window[-1]]
        k = window[-1] + 1
    return Outcome("optimal", tuple(ends), tuple(modes), b_star)


@contextlib.contextmanager
def _quiet_stdout():
    """Silence C-level stdout (solver banners) for the duration of the block."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # captured / not a real file
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _val(v) -> float:
    return float(v) if isinstance(v, (int, float)) else float(v.varValue or 0.0)


def _make_solver(name: str, time_limit_s: float):
    import pulp

    tl = max(float(time_limit_s), 0.01)
    if name == "highs":
        return pulp.HiGHS(msg=False, timeLimit=tl, gapRel=0.0, gapAbs=1e-9, threads=1)
    with warnings.catch_warnings():  # bundled CBC: deprecated name, still the one that ships
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=tl, gapRel=0.0, gapAbs=1e-9, threads=1, warmStart=True)


def solve(model, name: str, time_limit_s: float) -> tuple[str, float | None]:
    """Run the solver; returns ('optimal'|'feasible'|'infeasible'|'none', dual bound in scaled units)."""
    import pulp

    if time_limit_s <= 0:
        return "none", None
    solver = _make_solver(name, time_limit_s)
    with _quiet_stdout():  # HiGHS prints a banner before msg=False takes effect
        model.prob.solve(solver)
    bound = None
    if name == "highs":
        try:
            bound = float(model.prob.solverModel.getInfo().mip_dual_bound)
        except Exception:  # noqa: BLE001 - the bound is informative only
            bound = None
        if bound is not None and not math.isfinite(bound):
            bound = None
    if model.prob.status == pulp.LpStatusInfeasible:
        return "infeasible", bound
    if model.prob.sol_status == pulp.LpSolutionOptimal and model.prob.status == pulp.LpStatusOptimal:
        return "optimal", bound
    if model.prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return "feasible", bound
    return "none", bound
