"""The stage-partition MILPs (PuLP; HiGHS or CBC) behind :func:`planner.partition.solve.partition`.

Two formulations of the same problem: :class:`BoundaryModel` places chunk boundaries among the
layers of any sequential model; :class:`CountModel` counts blocks per chunk when the model is an
embedding, identical blocks and a head, which is far smaller. Both minimise the bottleneck rank
time under each rank's memory, with one recompute mode per chunk.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Sequence

import numpy as np

from planner.partition.problem import PartitionError, Prepared, _lower_bound

MAX_BINARIES = 20_000
"""Above this many boundary binaries PuLP model building alone takes seconds."""


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


class BoundaryModel:
    """The boundary-position MILP (see :func:`partition` for the formulation)."""

    def __init__(self, prep: Prepared, ub: float | None) -> None:
        import pulp

        self.prep = prep
        K, p, R = prep.K, prep.p, prep.R
        lo, hi = self.lo, self.hi = windows(prep, ub)
        if any(lo[k] > hi[k] for k in range(K)):
            raise PartitionError("internal: empty window")  # ub came from a feasible split
        # time in units of the bound, memory in units of the capacity: O(1) coefficients
        self.tscale = ts = ub if ub else max(_lower_bound(prep), 1e-12)
        ms = prep.cap if prep.cap > 0 else 1.0
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
            if worst > prep.cap / ms:  # skip ranks that fit whatever happens
                prob += pulp.lpSum(mk[k] for k in ks) <= (prep.cap - prep.extra[rho]) / ms
        if ub is not None:
            self.B.upBound = ub * (1 + 1e-7) / ts
        prob += self.B
        self.prob = prob

    def warm_start(self, ends: Sequence[int], modes: Sequence[int]) -> None:
        """Give the solver a known feasible split (used by CBC)."""
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


def uniform_blocks(prep: Prepared) -> bool:
    """True when every layer but the first and the last is the same (embedding, N identical
    blocks, head: the usual LLM), so a split is fully described by blocks per chunk."""
    pr = prep.problem
    if prep.L < 3:
        return False
    mid = slice(1, prep.L - 1)
    return bool((pr.time_s[mid] == pr.time_s[1]).all() and (pr.act_bytes[mid] == pr.act_bytes[1]).all()
                and (pr.state_bytes[mid] == pr.state_bytes[1]).all())


class CountModel:
    """The same MILP for a uniform model, over block counts instead of boundary positions.

    Chunk k holds ``n[k]`` of the N identical blocks (the first chunk also the first layer, the
    last chunk also the last one; middle chunks at least one block), ``sum n = N``. Integer
    ``m[k, r]`` counts the blocks under mode r (``m <= N z``, ``sum_r m = n``), so every time
    and memory term is linear. A few integers per chunk instead of one binary per candidate
    boundary: 512 layers over 64 stages solves in well under a second, where the boundary
    formulation cannot prove optimality in minutes. Same interface as :class:`BoundaryModel`."""

    def __init__(self, prep: Prepared, ub: float | None) -> None:
        import pulp

        self.prep = prep
        K, p, R, L = prep.K, prep.p, prep.R, prep.L
        N = L - 2
        pr = prep.problem
        self.tscale = ts = ub if ub else max(_lower_bound(prep), 1e-12)
        ms = prep.cap if prep.cap > 0 else 1.0
        t, a, s = pr.time_s / ts, pr.act_bytes / ms, pr.state_bytes / ms
        prob = pulp.LpProblem("partition_counts", pulp.LpMinimize)
        self.n = [prob.add_variable(f"n_{k}", lowBound=0 if k in (0, K - 1) else 1, upBound=N,
                                    cat="Integer") for k in range(K)]
        prob += pulp.lpSum(self.n) == N
        self.z, self.m = {}, {}
        self.tk, mem = [], []
        for k in range(K):
            z = [prob.add_variable(f"z_{k}_{r}", cat="Binary") for r in range(R)]
            m = [prob.add_variable(f"m_{k}_{r}", lowBound=0, upBound=N, cat="Integer")
                 for r in range(R)]
            self.z.update({(k, r): z[r] for r in range(R)})
            self.m.update({(k, r): m[r] for r in range(R)})
            prob += pulp.lpSum(z) == 1
            prob += pulp.lpSum(m) == self.n[k]
            for r in range(R):
                prob += m[r] <= N * z[r]
            edges = ([0] if k == 0 else []) + ([L - 1] if k == K - 1 else [])
            time_k = pulp.lpSum(float(t[1, r]) * m[r] for r in range(R)) + pulp.lpSum(
                float(t[e, r]) * z[r] for e in edges for r in range(R))
            act_k = pulp.lpSum(float(a[1, r]) * m[r] for r in range(R)) + pulp.lpSum(
                float(a[e, r]) * z[r] for e in edges for r in range(R))
            self.tk.append(time_k)
            mem.append(float(s[1]) * self.n[k] + float(sum(s[e] for e in edges))
                       + float(prep.inflight[k]) * act_k)
        self.B = prob.add_variable("B", lowBound=0)
        bnd = prep.bnd / ts
        for rho in range(p):
            ks = range(rho, K, p)
            prob += self.B >= pulp.lpSum(self.tk[k] for k in ks) + float(sum(bnd[k] for k in ks))
            prob += pulp.lpSum(mem[k] for k in ks) <= (prep.cap - prep.extra[rho]) / ms
        if ub is not None:
            self.B.upBound = ub * (1 + 1e-7) / ts
        prob += self.B
        self.prob = prob

    def warm_start(self, ends: Sequence[int], modes: Sequence[int]) -> None:
        start = 1
        for k, end in enumerate(ends):
            blocks = (end - (1 if k == self.prep.K - 1 else 0)) - start
            start += blocks
            self.n[k].setInitialValue(blocks)
            for r in range(self.prep.R):
                self.z[k, r].setInitialValue(1 if modes[k] == r else 0)
                self.m[k, r].setInitialValue(blocks if modes[k] == r else 0)

    def solution(self) -> tuple[list[int], list[int]]:
        K, R, L = self.prep.K, self.prep.R, self.prep.L
        ends, end = [], 1
        for k in range(K):
            end += int(round(_val(self.n[k])))
            ends.append(L if k == K - 1 else end)
        modes = [int(np.argmax([_val(self.z[k, r]) for r in range(R)])) for k in range(K)]
        return ends, modes


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

    solver = _make_solver(name, time_limit_s)
    with _quiet_stdout():  # HiGHS prints a banner before msg=False takes effect
        model.prob.solve(solver)
    bound = None
    if name == "highs":
        try:
            bound = float(model.prob.solverModel.getInfo().mip_dual_bound)
        except Exception:  # noqa: BLE001 - the bound is informative only
            bound = None
    if model.prob.status == pulp.LpStatusInfeasible:
        return "infeasible", bound
    if model.prob.sol_status == pulp.LpSolutionOptimal and model.prob.status == pulp.LpStatusOptimal:
        return "optimal", bound
    if model.prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return "feasible", bound
    return "none", bound
