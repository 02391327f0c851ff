"""Exact reference partitioner (dynamic programming) and the shared tie-break.

For v = 1 (one chunk per rank) the problem decomposes per chunk, so

    f[k][j] = min_{i<j} max(f[k-1][i], c_k(i, j)),
    c_k(i, j) = min over modes r whose memory fits of time of layers [i, j),

is exact.  With partial recompute (``PartitionProblem.partial``) chunk k's one useful partial
option is the least number of recomputed blocks that fits (one chunk per rank: recomputing
more only costs time), so it joins the R modes as one more column, found by a binary search
over the prefix of the blocks' activation savings.  With prefix sums every c_k(i, j) is
O(R), and numpy evaluates a
whole (i, j) table at once, so the DP costs O(K * L^2 * R) arithmetic in
O(K) vectorised steps (512 layers x 64 stages: ~50 M operations).

For v > 1 a rank's time is a sum over v interleaved chunks and the recursion
above no longer holds; :func:`partition_dp` then enumerates every split and
mode assignment (exponential: tiny cases only, as a test oracle).

:func:`canonical` implements steps 2 and 3 of the tie-break rule documented in
:mod:`planner.partitioning.problem` for v = 1: given the cap ``B*`` it returns the
lexicographically first ``(end_0, mode_0, end_1, mode_1, ...)`` among the splits
of least compute time.  The MILP proves the same rule on its own; this module is
its test oracle and its labelled fallback, never its seed.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np

from planner.core.units import GIB
from planner.partitioning.baselines import heuristic_upper_bound
from planner.partitioning.prepared import Prepared, prepare
from planner.partitioning.problem import TIE_RTOL, PartitionError, PartitionProblem
from planner.partitioning.split import Partition, score_split

INF = math.inf
EXHAUSTIVE_LIMIT = 2_000_000
"""Largest number of (split, modes) candidates the v>1 exact search accepts."""


def _cap(x: float) -> float:
    """``x`` widened by the tie tolerance (for "<= x" comparisons)."""
    return x + TIE_RTOL * abs(x) + 1e-300


def _max_span(prep: Prepared, b_cap: float) -> int:
    """Longest chunk (in layers) whose fastest-mode time stays within ``b_cap``.

    Bounds the DP band: no optimal chunk is longer, so tables are (L+1, W, R)
    instead of (L+1, L+1, R).  W is small for real models (~ L / K).
    """
    L, K = prep.L, prep.K
    if not math.isfinite(b_cap):
        return L - K + 1
    pref = np.concatenate([[0.0], np.cumsum(prep.problem.time_s.min(axis=1))])
    last = np.searchsorted(pref, pref + b_cap, side="right") - 1  # furthest end from each start
    return int(max(1, min(L - K + 1, int((last - np.arange(L + 1)).max()))))


def _band(prep: Prepared, k: int, W: int, by_end: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time (boundary included) and fits-in-memory mask of chunk k over a band, and the
    recomputed block count of its partial column.

    Entry ``[a, w-1, r]`` is the chunk of w layers ending at a (``by_end``) or
    starting at a; out-of-range chunks are masked out. With partial recompute column R is the
    chunk's least partial option that fits (``Prepared.least_partial``; its count in the third
    array, 0 where there is none).
    """
    i, j, valid, d_time, d_state, d_act = _band_sums(prep, W, by_end)
    time = d_time + prep.bnd[k]
    mem = d_state[:, :, None] + prep.inflight[k] * d_act
    fits = (mem + prep.extra[prep.rank_of[k]] <= _cap(prep.cap)) & valid[:, :, None]
    count = prep.least_partial(k, i, j) * valid
    if prep.nb is not None:
        b = prep.problem.partial[0]
        q = prep.nb[i]
        t_part = prep.pt[j, b] - prep.pt[i, b] + prep.dt[q + count] - prep.dt[q] + prep.bnd[k]
        time = np.concatenate([time, t_part[:, :, None]], axis=2)
        fits = np.concatenate([fits, (count > 0)[:, :, None]], axis=2)
    return time, fits, count


@lru_cache(maxsize=4)
def _band_sums(prep: Prepared, W: int, by_end: bool) -> tuple[np.ndarray, ...]:
    """What :func:`_band` reads that no chunk changes: the band's starts i and ends j (clipped),
    its valid mask, and the time, state and activation sums of layers [i, j) (prefix-sum
    differences). Computed once per prepared problem (``Prepared`` hashes by identity) and band,
    not once per chunk; read-only."""
    L = prep.L
    a = np.arange(L + 1)[:, None]
    w = np.arange(1, W + 1)[None, :]
    i, j = (a - w, a) if by_end else (a, a + w)
    valid = (i >= 0) & (j <= L)
    i, j = np.clip(i, 0, L), np.clip(j, 0, L)
    out = (i, j, valid, prep.pt[j] - prep.pt[i], prep.ps[j] - prep.ps[i], prep.pa[j] - prep.pa[i])
    for array in out:
        array.setflags(write=False)
    return out


def _bottleneck_v1(prep: Prepared, ub: float = INF) -> float:
    """Phase A: the smallest achievable bottleneck (min-max DP), INF if none fits.

    ``ub`` is any upper bound on the answer (a feasible split's bottleneck); it
    only narrows the band.
    """
    L, K = prep.L, prep.K
    W = _max_span(prep, _cap(ub))
    starts = np.arange(L + 1)[:, None] - np.arange(1, W + 1)[None, :]
    ok_start = starts >= 0
    starts = np.clip(starts, 0, L)
    f = np.full(L + 1, INF)
    f[0] = 0.0
    for k in range(K):
        time, fits, _ = _band(prep, k, W, by_end=True)
        c = np.where(fits, time, INF).min(axis=2)  # (end, width)
        prev = np.where(ok_start, f[starts], INF)
        f = np.maximum(prev, c).min(axis=1)
        f[: k + 1] = INF  # chunks 0..k need at least k+1 layers
    return float(f[L])


def _suffix_v1(prep: Prepared, b_cap: float) -> tuple[np.ndarray, list, int]:
    """Phase B: S[k][i] = least compute time of layers [i, L) in chunks k..K-1, each <= b_cap.

    Also returns, per chunk, the (start, width, column) table of compute times with
    INF where the option does not fit or exceeds the cap, and the (start, width) partial
    counts, for phase C.
    """
    L, K = prep.L, prep.K
    W = _max_span(prep, b_cap)
    ends = np.arange(L + 1)[:, None] + np.arange(1, W + 1)[None, :]
    ok_end = ends <= L
    ends = np.clip(ends, 0, L)
    S = np.full((K + 1, L + 1), INF)
    S[K, L] = 0.0
    tables: list = [None] * K
    for k in range(K - 1, -1, -1):
        time, fits, count = _band(prep, k, W, by_end=False)
        g = np.where(fits & (time <= b_cap), time - prep.bnd[k], INF)
        tables[k] = (g, count)
        nxt = np.where(ok_end, S[k + 1][ends], INF)
        S[k] = (g.min(axis=2) + nxt).min(axis=1)
    return S, tables, W


def _canonical_v1(prep: Prepared, b_cap: float, t_cap: float | None) -> tuple[list[int], list[int]] | None:
    S, tables, W = _suffix_v1(prep, b_cap)
    if not math.isfinite(S[0, 0]):
        return None
    t_cap = _cap(S[0, 0]) if t_cap is None else min(t_cap, _cap(S[0, 0]))
    ends, modes = [], []
    i, spent = 0, 0.0
    cols = prep.R + (prep.nb is not None)
    for k in range(prep.K):
        g, count = tables[k][0][i], tables[k][1][i]
        nxt = S[k + 1]
        found = False
        for e in range(i + 1, min(i + W, prep.L) + 1):
            if not math.isfinite(nxt[e]):
                continue
            for r in range(cols):  # the modes by index, then the partial option (R + c - 1)
                c = g[e - i - 1, r]
                if spent + c + nxt[e] <= t_cap:
                    ends.append(e)
                    modes.append(r if r < prep.R else prep.R + int(count[e - i - 1]) - 1)
                    spent += c
                    i = e
                    found = True
                    break
            if found:
                break
        if not found:  # only possible if t_cap is below the optimum
            return None
    return ends, modes


def canonical(prep: Prepared, b_star: float, t_star: float | None = None) -> tuple[list[int], list[int]] | None:
    """v = 1: the lexicographically first split with bottleneck <= b_star and compute time <=
    t_star (None: the least compute time under b_star). Returns (ends, modes), or None when
    nothing meets the caps."""
    if prep.K != prep.p:
        raise ValueError("canonical() is the v = 1 recursion; v > 1 uses the exhaustive search")
    return _canonical_v1(prep, _cap(b_star), None if t_star is None else _cap(t_star))


# ---------------------------------------------------------------- memory bound for messages


def min_peak_memory(prep: Prepared) -> tuple[float, int, float]:
    """The split closest to fitting: (its peak bytes, the rank, that rank's capacity).

    Exact for v = 1: a min-max DP over each chunk's excess over its mode's capacity, every
    chunk at its least-excess mode (with one capacity: the smallest achievable peak). For
    v > 1 a lower bound (average over ranks of the lightest layout, the largest capacity).
    Partial recompute never lowers it: a partial option holds more activations than its
    recompute mode at that mode's capacity.
    """
    L, K, p = prep.L, prep.K, prep.p
    if K == p:
        f = np.full(L + 1, INF)
        f[0] = 0.0
        arg = []
        idx = np.arange(L + 1)
        for k in range(K):
            mem = (prep.ps[None, :] - prep.ps[:, None])[:, :, None] + prep.inflight[k] * (
                prep.pa[None, :, :] - prep.pa[:, None, :]
            )
            c = (mem + prep.extra[prep.rank_of[k]] - prep.cap).min(axis=2)  # excess of the best mode
            c = np.where(idx[None, :] > idx[:, None], c, INF)
            m = np.maximum(f[:, None], c)
            arg.append(m.argmin(axis=0))
            f = m.min(axis=0)
            f[: k + 1] = INF
        # walk back to find which chunk is the peak
        j, best = L, (-INF, 0.0, 0, 0.0)
        for k in range(K - 1, -1, -1):
            i = int(arg[k][j])
            mem = [prep.chunk_mem(k, i, j, r) + prep.extra[prep.rank_of[k]] for r in range(prep.R)]
            r = int(np.argmin([m - c for m, c in zip(mem, prep.cap)]))
            if mem[r] - prep.cap[r] >= best[0]:
                best = (mem[r] - prep.cap[r], mem[r], prep.rank_of[k], float(prep.cap[r]))
            j = i
        return best[1], best[2], best[3]
    light = prep.ps[L] + prep.inflight.min() * float(prep.problem.act_bytes.min(axis=1).sum())
    return float((light + prep.extra.sum()) / p), int(np.argmax(prep.extra)), prep.cap_max


# ---------------------------------------------------------------- the reference


def _exhaustive(prep: Prepared) -> tuple[list[int], list[int]] | None:
    """All splits x modes (v > 1 oracle); rule steps 0-3 applied literally."""
    L, K, p, R = prep.L, prep.K, prep.p, prep.R
    per_chunk = R + (max(L - K, 0) if prep.nb is not None else 0)  # modes + partial counts
    count = math.comb(L - 1, K - 1) * per_chunk**K
    if count > EXHAUSTIVE_LIMIT:
        raise PartitionError(
            f"exact search over {count} candidates is too large for v > 1: use the ILP (partition())"
        )
    cands = []
    for cuts in itertools.combinations(range(1, L), K - 1):
        ends = list(cuts) + [L]
        starts = [0] + ends[:-1]
        options = [list(range(R)) + list(prep.partial_options(i, e)) for i, e in zip(starts, ends)]
        for modes in itertools.product(*options):
            rank_t = [0.0] * p
            rank_m = [float(x) for x in prep.extra]
            rank_cap = [prep.cap_max] * p
            comp, i, largest = 0.0, 0, 0.0
            for k, (e, r) in enumerate(zip(ends, modes)):
                t = prep.chunk_time(k, i, e, r)
                largest = max(largest, t)
                rho = prep.rank_of[k]
                rank_t[rho] += t
                rank_m[rho] += prep.chunk_mem(k, i, e, r)
                rank_cap[rho] = min(rank_cap[rho], prep.option_cap(r))
                comp += t - prep.bnd[k]
                i = e
            if all(m <= _cap(c) for m, c in zip(rank_m, rank_cap)):
                key = [x for pair in zip(ends, modes) for x in pair]
                cands.append((max(rank_t), comp, key, ends, list(modes), largest))
    if not cands:
        return None
    c_star = min(c[5] for c in cands)  # step 0: the least largest chunk
    cands = [c for c in cands if c[5] <= _cap(c_star)]
    b = min(c[0] for c in cands)
    cands = [c for c in cands if c[0] <= _cap(b)]
    t = min(c[1] for c in cands)
    cands = [c for c in cands if c[1] <= _cap(t)]
    best = min(cands, key=lambda c: c[2])
    return best[3], best[4]


def partition_dp(problem: PartitionProblem, num_chunks: int, p: int) -> Partition:
    """Exact optimum under the documented tie-break rule.

    v = 1: the O(K L^2 R) DP.  v > 1: exhaustive enumeration (small cases;
    raises PartitionError when too large).
    """
    prep = prepare(problem, num_chunks, p)
    if prep.K == prep.p:
        heur = heuristic_upper_bound(prep)
        b = _bottleneck_v1(prep, INF if heur is None else heur.bottleneck_s)
        sol = None if not math.isfinite(b) else canonical(prep, b, None)
    else:
        sol = _exhaustive(prep)
    if sol is None:
        raise infeasible_error(prep)
    return score_split(prep, sol[0], sol[1], method="dp", optimal=True)


def infeasible_error(prep: Prepared) -> PartitionError:
    """The 'does not fit' message, with the smallest achievable peak memory and the capacity
    of the mode that peak uses."""
    peak, rank, cap = min_peak_memory(prep)
    exact = "" if prep.K == prep.p else "at least "  # v > 1: a lower bound only
    return PartitionError(
        f"no split fits in {cap / GIB:.1f} GiB per GPU: the smallest possible peak is "
        f"{exact}{peak / GIB:.1f} GiB on rank {rank}; add recompute, pipeline stages or ZeRO"
    )
