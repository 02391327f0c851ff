"""Splits made without the optimiser: the baselines users make by hand (a given split, even
layer counts, equal parameter counts), each chunk with a given mode or its fastest that fits, and
the cheap heuristic splits that bound the MILP's search (never its answer)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.partitioning.prepared import Prepared, prepare
from planner.partitioning.problem import PartitionError, PartitionProblem
from planner.partitioning.split import Partition, fits, score_split


def _resolve_mode(problem: PartitionProblem, recompute: str | int | None) -> int | None:
    if recompute is None:
        return None
    if isinstance(recompute, int):
        return recompute
    if recompute not in problem.modes:
        raise PartitionError(f"unknown recompute mode {recompute!r}; known: {', '.join(problem.modes)}")
    return problem.modes.index(recompute)


def split_at_ends(prep: Prepared, ends: list[int], recompute: str | int | None, method: str) -> Partition:
    """Evaluate given ends; with recompute=None pick per chunk the fastest mode that fits."""
    mode = _resolve_mode(prep.problem, recompute)
    if mode is not None:
        return score_split(prep, ends, [mode] * prep.K, method=method)
    modes = []
    start = 0
    for k, e in enumerate(ends):
        # fastest option whose chunk alone fits next to the rank's extra bytes: the modes and
        # the least partial recompute that fits (the lower index first on equal time)
        options = list(range(prep.R))
        c = int(prep.least_partial(k, start, e)) if prep.nb is not None else 0  # 0: none
        if c:
            options.append(prep.R + c - 1)
        order = sorted(options, key=lambda r: (prep.chunk_time(k, start, e, r), r))
        pick = next(
            (r for r in order
             if prep.chunk_mem(k, start, e, r) + prep.extra[prep.rank_of[k]] <= prep.option_cap(r)),
            int(np.argsort(prep.pt[e] - prep.pt[start], kind="stable")[-1]),
        )
        modes.append(pick)
        start = e
    return score_split(prep, ends, modes, method=method)


def _balanced_ends(weights: np.ndarray, K: int) -> list[int]:
    """Contiguous cut of ``weights`` into K non-empty parts of ~equal sum."""
    L = len(weights)
    cum = np.concatenate([[0.0], np.cumsum(weights)])
    total = cum[-1]
    ends = []
    prev = 0
    for k in range(1, K):
        target = total * k / K
        e = int(np.searchsorted(cum, target))
        if e > 0 and abs(cum[e - 1] - target) <= abs(cum[min(e, L)] - target):
            e -= 1
        e = min(max(e, prev + 1), L - (K - k))
        ends.append(e)
        prev = e
    ends.append(L)
    return ends


def fixed_split(problem: PartitionProblem, ends: Sequence[int], p: int,
                recompute: str | int | None = None) -> Partition:
    """A given split (chunk ends), with ``recompute`` or, for None, each chunk's fastest mode
    that fits: the comparison point for splits users make by hand."""
    prep = prepare(problem, len(ends), p)
    return split_at_ends(prep, list(ends), recompute, "fixed")


def even_split(problem: PartitionProblem, num_chunks: int, p: int, recompute: str | int | None = None) -> Partition:
    """Equal number of layers per chunk (remainder spread over the first chunks).

    ``recompute`` names one mode for every chunk; ``None`` picks per chunk the
    fastest mode whose memory fits.  Memory is not enforced: the result is a
    comparison point and may exceed capacity (see ``rank_memory_bytes``).
    """
    prep = prepare(problem, num_chunks, p)
    q, rem = divmod(prep.L, prep.K)
    sizes = [q + (1 if k < rem else 0) for k in range(prep.K)]
    return split_at_ends(prep, np.cumsum(sizes).tolist(), recompute, "even")


def equal_param_split(
    problem: PartitionProblem,
    num_chunks: int,
    p: int,
    param_counts: Sequence[float],
    recompute: str | int | None = None,
) -> Partition:
    """Chunks with ~equal parameter counts (the common hand-made heuristic).

    Same ``recompute`` semantics as :func:`even_split`.
    """
    prep = prepare(problem, num_chunks, p)
    w = np.asarray(param_counts, dtype=float).reshape(-1)
    if w.shape[0] != prep.L:
        raise PartitionError(f"param_counts has {w.shape[0]} entries, model has {prep.L} layers")
    return split_at_ends(prep, _balanced_ends(w, prep.K), recompute, "equal-params")


def _heuristic_ends(prep: Prepared) -> list[list[int]]:
    """Cheap candidate splits used as the ILP's upper bound (time-balanced, even)."""
    q, rem = divmod(prep.L, prep.K)
    even = np.cumsum([q + (1 if k < rem else 0) for k in range(prep.K)]).tolist()
    tmin = prep.problem.time_s.min(axis=1)
    return [_balanced_ends(tmin, prep.K), [int(e) for e in even]]


def heuristic_upper_bound(prep: Prepared) -> Partition | None:
    """Best memory-feasible heuristic split (each chunk its fastest mode that fits, or every
    chunk its lightest mode), or None: only bounds the MILP's search, never its answer."""
    best = None
    lightest = int(np.argmin(prep.problem.act_bytes.sum(axis=0) - 1e-300 * np.arange(prep.R)))
    for ends in _heuristic_ends(prep):
        for mode in (None, lightest):
            cand = split_at_ends(prep, ends, mode, "heuristic")
            if fits(cand) and (best is None or cand.bottleneck_s < best.bottleneck_s):
                best = cand
    return best
