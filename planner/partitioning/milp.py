"""The stage-partition MILP (PuLP; HiGHS or CBC): what every formulation shares, and the
boundary formulation for any layer sequence.

:class:`BoundaryModel` places chunk boundaries among the layers of any sequential model; the usual
LLM (embedding, identical blocks, head) gets the far stronger formulations of
:mod:`planner.partitioning.options`. Every formulation carries the per-mode memory capacity (a rank is
held to the smallest capacity among the modes its chunks use) and any number of chunks per rank
(interleaved, v > 1, chunks of different sizes). :mod:`planner.partitioning.lexicographic` solves
them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from planner.partitioning.prepared import Prepared, simple_lower_bound
from planner.partitioning.problem import PartitionError

MAX_BINARIES = 20_000
"""Above this many binaries PuLP model building alone takes seconds."""

def windows(prep: Prepared, ub: float | None, chunk_cap: float | None = None
            ) -> tuple[list[int], list[int]]:
    """Range [lo_k, hi_k] of each chunk end, tightened with an upper bound on B and one on the
    largest chunk.

    Chunks 0..k touch min(k+1, p) ranks, each with at most ``ub`` seconds, so
    the fastest-mode time of layers [0, end_k) plus their boundaries is at
    most min(k+1, p) * ub; with every chunk within ``chunk_cap`` seconds also at most
    (k+1) * chunk_cap; symmetrically for the chunks after k.
    """
    L, K, p = prep.L, prep.K, prep.p
    lo = [k + 1 for k in range(K)]
    hi = [L - (K - 1 - k) for k in range(K)]
    if ub is not None or chunk_cap is not None:
        ub = math.inf if ub is None else ub * (1 + 1e-7)
        cap = math.inf if chunk_cap is None else chunk_cap * (1 + 1e-7)
        pref = np.concatenate([[0.0], np.cumsum(prep.problem.time_s.min(axis=1))])
        suf = pref[-1] - pref
        bcum = np.cumsum(prep.bnd)
        for k in range(K - 1):
            room_before = min(min(k + 1, p) * ub, (k + 1) * cap) - bcum[k]
            room_after = min(min(K - 1 - k, p) * ub, (K - 1 - k) * cap) - (bcum[-1] - bcum[k])
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
    same = bool((pr.time_s[mid] == pr.time_s[1]).all() and (pr.act_bytes[mid] == pr.act_bytes[1]).all()
                and (pr.state_bytes[mid] == pr.state_bytes[1]).all())
    # partial recompute counts the middle layers only (the embedding and head are no blocks)
    return same and (pr.partial is None or (bool(pr.blocks[mid].all())
                                            and not pr.blocks[0] and not pr.blocks[-1]))


def linear_expression(pairs):
    """A linear expression from (variable, coefficient) pairs, repeated variables summed."""
    import pulp

    acc: dict = {}
    for v, c in pairs:
        if c:
            acc[v] = acc.get(v, 0.0) + float(c)
    return pulp.LpAffineExpression(list(acc.items()))


class MilpModel:
    """What both formulations share: the PuLP problem, the bottleneck variable, scales, the
    chunk end and mode expressions, and the capacity rows."""

    prep: Prepared
    prob: object
    B: object
    C: object = None  # the largest chunk time (interleaved MILPs that choose it, step 0)
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

    def count(self, k: int):
        """Layers in chunk k."""
        return self.end(k) - self.end(k - 1) if k > 0 else self.end(0)

    def count_range(self, k: int) -> tuple[int, int]:
        before_lo, before_hi = (self.end_lo[k - 1], self.end_hi[k - 1]) if k > 0 else (0, 0)
        return max(1, self.end_lo[k] - before_hi), self.end_hi[k] - before_lo

    def key(self, k: int):
        """``R * layers_k + mode_k`` (R: the option count, partial recompute included): with the
        chunks before k fixed, the chunk's place in the tie-break order (a shorter chunk ends
        earlier), an integer in a narrow range."""
        return self.prep.n_options * self.count(k) + self.mode(k)

    def key_range(self, k: int) -> tuple[int, int]:
        R = self.prep.n_options
        lo, hi = self.count_range(k)
        return R * lo, R * hi + R - 1


class BoundaryModel(MilpModel):
    """Any layer sequence: binary ``x[k, j] = 1`` iff chunk k ends after layer j, only for j
    inside a window ``[lo_k, hi_k)`` derived from a heuristic upper bound (outside it x is a
    constant); ``x[k, j] >= x[k, j+1]`` (monotone) and ``x[k+1, j+1] >= x[k, j]`` (chunks
    non-empty, in order). Any per-layer quantity ``w`` summed over chunk k is
    ``sum_j w_j (x[k, j] - x[k-1, j])``. A one-hot ``z[k, r]`` picks the mode; chunk time
    ``t_k >= T_k^r(x) - M (1 - z[k, r])`` and activations likewise, with M the largest chunk the
    window allows. A rank's memory is held to the capacity of every mode one of its chunks uses
    (a big-M row per chunk and mode whose capacity is below the largest)."""

    def __init__(self, prep: Prepared, ub: float | None, chunk_cap: float | None = None,
                 known_chunk: float | None = None) -> None:
        """``known_chunk``: the largest chunk of a split known to fit (interleaved, step 0 still
        to run): the least largest chunk is no larger, so it bounds C and narrows the windows."""
        import pulp

        if prep.problem.partial is not None:  # its chunk costs are not linear in the ends
            raise PartitionError("the boundary MILP has no partial-recompute options")
        self.prep = prep
        K, p, R = prep.K, prep.p, prep.R
        if K == p or chunk_cap is not None:
            known_chunk = None
        lo, hi = self.lo, self.hi = windows(prep, ub, chunk_cap if chunk_cap is not None
                                            else known_chunk)
        self.end_lo, self.end_hi = lo, hi
        if any(lo[k] > hi[k] for k in range(K)):
            raise PartitionError("internal: empty window")  # ub came from a feasible split
        # time in units of the bound, memory in units of the capacity: O(1) coefficients
        self.tscale = ts = ub if ub else max(simple_lower_bound(prep), 1e-12)
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
        self.C = None
        if K > p:  # interleaved: the largest chunk (step 0 of the tie-break rule)
            self.C = prob.add_variable("C", lowBound=0)
            for k in range(K):
                prob += self.C >= tk[k] + float(bnd[k])
            if chunk_cap is not None:
                self.C.upBound = chunk_cap * (1 + 1e-7) / ts
            elif known_chunk is not None:  # a row, not a bound: step 0 still minimises C
                prob += self.C <= known_chunk * (1 + 1e-7) / ts
        for rho in range(p):
            ks = prep.chunks_of(rho)
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
        return linear_expression((self.z[k, r], r) for r in range(self.prep.R))

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
            ends.append(sum(int(round(float(solved_value(self.X(k, j))))) for j in range(self.prep.L)))
        modes = []
        for k in range(K):
            if R == 1:
                modes.append(0)
            else:
                modes.append(int(np.argmax([solved_value(self.z[k, r]) for r in range(R)])))
        return ends, modes


class NoChunkFits(Exception):
    """No option of some chunk fits: the instance has no split."""


def solved_value(v) -> float:
    return float(v) if isinstance(v, (int, float)) else float(v.varValue or 0.0)
