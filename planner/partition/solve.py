"""The stage partitioner's entry point: pick a solver, run it, label what produced the split."""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace

import numpy as np
import pulp

from planner.partition.dp import _bottleneck_v1, canonical, infeasible_error, partition_dp
from planner.partition import milp
from planner.partition.problem import (TIE_RTOL, Partition, PartitionError, PartitionProblem, Prepared,
                                       _gap, _lower_bound, _replace, score_split,
                                       prepare, total_compute_s, _upper_bound)


def _highs_available() -> bool:
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


def _pick_solver(solver: str) -> str:
    """'auto' -> 'highs' when highspy imports (faster in bench_partition.py), else 'cbc'."""
    if solver not in ("auto", "highs", "cbc", "dp"):
        raise PartitionError(f"unknown solver {solver!r}: use auto, highs, cbc or dp")
    if solver == "auto":
        return "highs" if _highs_available() else "cbc"
    return solver


def _seed(prep: Prepared) -> Partition | None:
    """A strong feasible split to bound and warm-start the MILP.

    v = 1: the exact banded DP (so the MILP only has to confirm it).  v > 1:
    the same DP over K "ranks" of one chunk each, every chunk limited to a
    1/v share of its rank's free memory; summing v such chunks per rank
    keeps memory feasible and the bottleneck within v times the chunk max.
    Falls back to the cheap heuristics when that finds nothing.
    """
    best = _upper_bound(prep)
    v = prep.K // prep.p
    if v == 1:
        sub = prep
    else:
        rank_extra = prep.extra[np.arange(prep.K) % prep.p]
        sub = replace(prep, p=prep.K, extra=rank_extra + (prep.cap - rank_extra) * (v - 1) / v)
    b = _bottleneck_v1(sub, best.bottleneck_s if (best is not None and v == 1) else math.inf)
    sol = canonical(sub, b, None) if math.isfinite(b) else None
    if sol is not None:
        cand = score_split(prep, sol[0], sol[1], method="seed")
        if max(cand.rank_memory_bytes) <= prep.cap * (1 + TIE_RTOL) and (
            best is None or cand.bottleneck_s < best.bottleneck_s
        ):
            best = cand
    return best


def partition(
    problem: PartitionProblem,
    num_chunks: int,
    p: int,
    *,
    solver: str = "auto",
    time_limit_s: float = 2.0,
    lp_path: str | os.PathLike | None = None,
    warm_start: bool = True,
) -> Partition:
    """Optimal split of the layers into ``num_chunks`` chunks over ``p`` ranks (MILP).

    Formulation (boundary positions over prefix sums): binary ``x[k, j] = 1``
    iff chunk k ends after layer j (``end_k > j``), only for j inside a window
    ``[lo_k, hi_k)`` derived from a heuristic upper bound (outside it x is a
    constant).  ``x[k, j] >= x[k, j+1]`` (monotone) and ``x[k+1, j+1] >=
    x[k, j]`` (chunks non-empty, in order).  Any per-layer quantity ``w``
    summed over chunk k is ``sum_j w_j (x[k, j] - x[k-1, j])``: O(window)
    non-zeros, no (layer, chunk) assignment variables.  A one-hot ``z[k, r]``
    picks the mode; chunk time ``t_k >= T_k^r(x) - M_k^r (1 - z[k, r])`` and
    activations likewise, with ``M`` the largest chunk the window allows.
    ``B >= sum_{k on rank} (t_k + boundary_k)`` and per-rank memory
    ``sum (state_k + a_k) + extra <= capacity``.  Minimise ``B``; for v > 1
    a second solve fixes ``B <= B*`` and minimises ``sum t_k``; for v = 1
    that step and the final lexicographic tie-break are done exactly by
    :func:`planner.partition.dp.canonical` (v > 1: the tie-break only).

    ``solver``: 'auto' (HiGHS when ``highspy`` imports, else CBC), 'highs',
    'cbc', or 'dp' (the exact reference, v = 1).  On a solver failure or a
    timeout without a proven optimum, v = 1 falls back to the DP (said in
    ``note``); v > 1 returns the best split found with its ``gap``.
    ``lp_path`` writes the bottleneck model in LP format.

    ``warm_start`` (default) bounds and seeds the MILP with :func:`_seed` (for
    v = 1 the exact DP, so the MILP confirms it; for v > 1 a per-chunk DP);
    ``False`` uses only the even / time-balanced splits, which keeps the MILP
    an independent check (tests) but is far slower on large models.
    """
    prep = prepare(problem, num_chunks, p)
    name = _pick_solver(solver)
    if name == "dp":
        return partition_dp(problem, num_chunks, p)
    method = f"ilp-{name}"
    deadline = time.monotonic() + float(time_limit_s)
    v1 = prep.K == prep.p

    def fallback(reason: str) -> Partition:
        if v1:
            res = partition_dp(problem, num_chunks, p)
            return _replace(res, note=f"{reason}, used DP fallback")
        if heur is not None:
            lb = _lower_bound(prep)
            return _replace(heur, optimal=False, gap=_gap(heur.bottleneck_s, lb), note=f"{reason}, used heuristic split")
        raise PartitionError(f"{reason} and no heuristic split fits; try a longer time limit")

    heur = _seed(prep) if warm_start else _upper_bound(prep)
    counts = milp.uniform_blocks(prep)
    if not counts:
        lo, hi = milp.windows(prep, heur.bottleneck_s if heur is not None else None)
        n_binaries = sum(h - l for l, h in zip(lo, hi))
        if n_binaries > milp.MAX_BINARIES:  # building it alone would blow the time limit
            return fallback(f"MILP too large ({n_binaries} binaries > {milp.MAX_BINARIES})")
    try:
        build = milp.CountModel if counts else milp.BoundaryModel
        model = build(prep, heur.bottleneck_s if heur is not None else None)
        if heur is not None:
            model.warm_start(heur.boundaries, [prep.problem.modes.index(m) for m in heur.recompute])
        if lp_path is not None:
            model.prob.writeLP(os.fspath(lp_path))
        status, bound = milp.solve(model, name, deadline - time.monotonic())
    except PartitionError:
        raise
    except Exception as exc:  # noqa: BLE001 - solver missing/crashed: never show its trace
        return fallback(f"{name} solver failed ({type(exc).__name__})")
    if status == "infeasible":
        if heur is not None:  # contradicts a known split: numerical trouble
            return fallback("solver reported a feasible instance infeasible")
        raise infeasible_error(prep)
    if status == "none":
        return fallback(f"solver found no solution within {time_limit_s:g} s")
    ends, modes = model.solution()
    first = score_split(prep, ends, modes, method=method)
    if status == "feasible":
        if v1:
            return fallback(f"solver timed out after {time_limit_s:g} s without proving optimality")
        lb = max(_lower_bound(prep), (bound or 0.0) * model.tscale)
        return _replace(first, optimal=False, gap=_gap(first.bottleneck_s, lb), note="solver timed out; best split found")
    b_star = first.bottleneck_s
    if v1:
        sol = canonical(prep, b_star, None)
        if sol is None:  # solver tolerance let a hair-infeasible split through
            return fallback("ILP split failed the exact check")
        return score_split(prep, sol[0], sol[1], method=method, optimal=True)
    # v > 1: least compute time at this bottleneck, then the lexicographic tie-break
    model.B.upBound = b_star * (1 + TIE_RTOL) / model.tscale
    model.prob.setObjective(pulp.lpSum(model.tk))
    status2, _ = milp.solve(model, name, max(deadline - time.monotonic(), 0.05))
    if status2 in ("optimal", "feasible"):
        e2, m2 = model.solution()
        second = score_split(prep, e2, m2, method=method)
        if second.bottleneck_s <= b_star * (1 + TIE_RTOL) and max(
            r - c for r, c in zip(second.rank_memory_bytes, [prep.cap] * prep.p)
        ) <= prep.cap * TIE_RTOL:
            ends, modes = e2, m2
    t_star = total_compute_s(prep, ends, modes)
    sol = canonical(prep, b_star, t_star, deadline=max(deadline, time.monotonic() + 0.2))
    note = "" if status2 == "optimal" else "least-recompute step timed out"
    if sol is None:
        note = (note + "; " if note else "") + "tie-break search gave up, ties may differ from the DP"
        sol = (ends, modes)
    return score_split(prep, sol[0], sol[1], method=method, optimal=True, note=note)
