"""The stage partitioner's entry point: pick a solver, run it, label what produced the split."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Sequence

from planner.core.fileset import output_error
from planner.partitioning import lexicographic
from planner.partitioning.dp import infeasible_error, partition_dp
from planner.partitioning.baselines import split_at_ends, heuristic_upper_bound
from planner.partitioning.prepared import prepare, relative_gap
from planner.partitioning.problem import PartitionError, PartitionProblem
from planner.partitioning.split import Partition, fits, option_indices, score_split


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


def partition(
    problem: PartitionProblem,
    num_chunks: int,
    p: int,
    *,
    solver: str = "auto",
    node_limit: int = lexicographic.NODE_LIMIT,
    lp_path: str | os.PathLike | None = None,
    prefer: Sequence[int] | None = None,
    tie_break_steps: int = 3,
) -> Partition:
    """Optimal split of the layers into ``num_chunks`` chunks over ``p`` ranks, by the MILP.

    The MILP (:mod:`planner.partitioning.milp`, :mod:`planner.partitioning.options`) is built cold,
    bounded only by cheap heuristic splits (even, time-balanced), and proves the whole tie-break
    rule of :mod:`planner.partitioning.problem` itself (:mod:`planner.partitioning.lexicographic`): its
    answer is ``method='ilp-highs'`` / ``'ilp-cbc'``. ``solver``: 'auto' (HiGHS when
    ``highspy`` imports, else CBC), 'highs', 'cbc', or 'dp' (the exact reference; v > 1 by
    enumeration, tiny cases only).

    Each solve may explore ``node_limit`` branch-and-bound nodes and has no time limit, so the
    answer is the same on any machine; ``Partition.work`` counts the simplex iterations spent.
    When the solver fails (crash, no split within the node limit, a split that fails the
    exact memory check) the DP answers instead, labelled ``method='dp'`` with the reason in
    ``note`` (:attr:`Partition.label`: ``dp (solver failed: ...)``); for v > 1 beyond the DP's
    reach the best split found is returned with ``optimal=False`` and its ``gap`` (or a
    PartitionError when there is none). ``lp_path`` writes the bottleneck model in LP format.

    ``prefer``: chunk ends of a split to keep on a tie (each chunk its fastest mode that fits),
    e.g. the launcher's even split of interleaved chunks, whose step time the bottleneck does
    not rank among equal-bottleneck splits. When it fits and the MILP proves that no split has a
    smaller largest chunk (interleaved) or bottleneck, it is returned (``note`` says so). ``tie_break_steps`` < 3 stops after
    that step of the tie-break rule (``note`` says so): 1 once B is proven, 2 once the least
    compute time under it is.
    """
    prep = prepare(problem, num_chunks, p)
    name = _pick_solver(solver)
    if name == "dp":
        return partition_dp(problem, num_chunks, p)
    method = f"ilp-{name}"
    work = lexicographic.Work(node_limit)
    limit = f"{node_limit:,} nodes a solve"

    def fallback(reason: str, best: Partition | None = None) -> Partition:
        try:
            res = partition_dp(problem, num_chunks, p)
        except PartitionError:
            if prep.K == prep.p:  # the exact DP says nothing fits
                raise
            res = None  # v > 1 beyond exhaustive search
        if res is not None:
            return replace(res, note=f"{name} solver failed: {reason}", work=work.iterations)
        if best is not None:
            return best
        raise PartitionError(f"the {name} solver failed ({reason}) and no split is known; "
                             "try a higher node limit")

    heur = heuristic_upper_bound(prep)
    kept = None
    if prefer is not None:
        kept = split_at_ends(prep, [int(e) for e in prefer], None, "even")
        if not fits(kept):
            kept = None
        elif heur is None or kept.bottleneck_s < heur.bottleneck_s:
            heur = kept
    known_chunk = None if heur is None else max(c.time_s for c in heur.chunks)
    if prep.K > prep.p:  # the heuristic's bottleneck bounds B only, not B under the least C
        ub = None
    else:
        ub = heur.bottleneck_s if heur is not None else None
    try:
        model = lexicographic.build(prep, ub, known_chunk=known_chunk)
    except PartitionError as exc:
        return fallback(str(exc))
    if model is None:
        raise infeasible_error(prep)
    if lp_path is not None:
        try:
            model.prob.writeLP(os.fspath(lp_path))
        except OSError as e:  # the user's --lp path: one line (core/fileset.py), no fallback
            raise output_error(e, lp_path) from None
    keep = None if kept is None else (kept.boundaries, option_indices(problem, kept),
                                      kept.bottleneck_s, max(c.time_s for c in kept.chunks))
    try:
        out = lexicographic.solve_lexicographic(model, name, work, keep, tie_break_steps)
    except PartitionError:
        raise
    except Exception as exc:  # noqa: BLE001 - solver missing/crashed: never show its trace
        return fallback(f"{type(exc).__name__}")
    if out.status == "infeasible":
        if heur is not None:  # contradicts a known split: numerical trouble
            return fallback("reported a feasible instance infeasible")
        raise infeasible_error(prep)
    if out.status == "none":
        return fallback(f"no split within {limit}")
    if out.kept:
        return replace(kept, method=method, optimal=True, work=work.iterations,
                       note="even split kept: no split has a smaller "
                            + ("largest chunk or bottleneck" if prep.K > prep.p else "bottleneck"))
    res = replace(score_split(prep, out.ends, out.modes, method=method,
                              optimal=out.status == "optimal", note=out.note), work=work.iterations)
    if not fits(res):
        return fallback("its split failed the exact memory check")
    if out.status == "feasible":
        if prep.K == prep.p:
            return fallback(f"not proven optimal within {limit}")
        # v > 1: the exhaustive reference is out of reach at this size; say how far off it may be
        return replace(res, gap=relative_gap(res.bottleneck_s, out.bound_s),
                       note=f"not proven optimal within {limit}")
    return res


