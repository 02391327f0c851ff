"""The interleaved step's two bounds in chunk times, and the least largest chunk.

Narayanan et al. 2021 (Megatron-LM, SC'21) §2.2.2, interleaved schedule: "If each device has v
stages (or model chunks), then the forward and backward time for a microbatch for each stage or
chunk will now be t_f/v and t_b/v. The pipeline bubble time thus reduces to
t^int_pb = (p-1)·(t_f + t_b)/v". With equal chunks of c = (t_f + t_b)/v seconds the step of M
microbatches is M·v·c + (p-1)·c = (M·v + p - 1)·c. For chunks of different times
(forward f_k, backward b_k, chunk k on rank k mod p, S_r the sum of rank r's chunk times):

* lower bound, any order: rank r's first op waits for microbatch 0's forwards through chunks
  0..r-1 (every op of rank r needs some microbatch's output of chunk r-1), and its last op, a
  backward of chunk r (it follows that microbatch's backward of every later chunk of the rank),
  is followed by the backwards of chunks r-1..0, so

      step >= max_r [ M·S_r + sum_{k<r} (f_k + b_k) ]                            (fill_lower_bound)

* upper bound, the interleaved 1F1B order of :func:`planner.pipeline.schedule.interleaved_order`:
  the simulated step is a longest path through ops of fixed durations (max-plus), so it never
  shrinks when an op lengthens; raising every forward to max f and every backward to max b
  gives equal chunks, whose step is the formula above:

      step <= (M·v + p - 1)·(max_k f_k + max_k b_k)                              (chunk_upper_bound)

  (= (M·v + p - 1)·max_k (f_k + b_k) when every chunk splits forward and backward in the same
  ratio).

Both are exact for equal chunks (tests/test_largest_chunk.py checks both against the op-by-op
simulator on random chunk times). The rank bottleneck max_r S_r alone drives only the lower
one: chunks of very different times on balanced ranks stall the steady state (a rank waits for a
long chunk of its neighbour every round: ``plan partition --model llama3-70b --pp 8
--virtual-stages 5 --tp 4 --schedule interleaved --microbatches 64`` simulated 60.0 s for the
least rank bottleneck against 38.0 s for Megatron's even split). So for v > 1 the partitioner
minimises the largest chunk first, the upper bound's only variable, and the rank bottleneck
second (:mod:`planner.partitioning.problem`'s tie-break rule); with v = 1 a chunk is a rank and
the largest chunk is the bottleneck.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.partitioning.prepared import Prepared


def fill_lower_bound(fwd_s: Sequence[float], bwd_s: Sequence[float], p: int, m: int) -> float:
    """max_r [m·S_r + sum_{k<r} (f_k + b_k)]: no schedule of these chunks runs faster."""
    t = np.asarray(fwd_s, float) + np.asarray(bwd_s, float)
    return float(max(m * t[r::p].sum() + t[:r].sum() for r in range(p)))


def chunk_upper_bound(fwd_s: Sequence[float], bwd_s: Sequence[float], p: int, m: int) -> float:
    """(m·v + p - 1)·(max f + max b): the interleaved 1F1B step never exceeds it."""
    v = len(fwd_s) // p
    return float((m * v + p - 1) * (max(fwd_s) + max(bwd_s)))


def _reaches(tau: np.ndarray, n: int) -> bool:
    """Whether one finite entry per row of tau (a block count per rank) sums to n."""
    reach = np.zeros(n + 1, dtype=bool)
    reach[0] = True
    for row in tau:
        counts = np.flatnonzero(np.isfinite(row[: n + 1]))
        if not len(counts):
            return False
        nxt = np.zeros(n + 1, dtype=bool)
        for c in counts:
            nxt[c:] |= reach[: n + 1 - c]
        reach = nxt
    return bool(reach[n])


def feasible_with_cap(prep: Prepared, cap_s: float) -> bool:
    """Some split of an embedding + identical blocks + head model fits memory with every chunk
    within ``cap_s`` seconds (each rank's chunks from the exact Pareto recursion of
    :func:`planner.partitioning.options.rank_tables`)."""
    from planner.partitioning.options import rank_options

    tau = rank_options(prep, None, cap_s)[2]
    return tau is not None and _reaches(tau, prep.L - 2)


def candidate_times(prep: Prepared) -> np.ndarray:
    """Every time a chunk can take (sorted, a superset of the option times): chunk k holding n
    blocks under mode r, or with c of them recomputed (partial option), edges and boundary
    included. The least largest chunk is one of them."""
    pr, K, L = prep.problem, prep.K, prep.L
    N = L - 2
    t = pr.time_s
    n = np.arange(N + 1, dtype=float)
    bases = {(float(prep.bnd[k]), k == 0, k == K - 1) for k in range(K)}
    out = []
    for bnd, first, last in bases:
        for r in range(prep.R):
            edge = (t[0, r] if first else 0.0) + (t[L - 1, r] if last else 0.0)
            out.append(edge + bnd + n * t[1, r])
        if pr.partial is not None:
            b, f = pr.partial
            edge = (t[0, b] if first else 0.0) + (t[L - 1, b] if last else 0.0)
            c = n[:, None]
            grid = edge + bnd + n[None, :] * t[1, b] + c * (t[1, f] - t[1, b])
            out.append(grid[np.triu_indices(N + 1, 1)])  # c < n
    return np.unique(np.concatenate(out))


def least_largest_chunk(prep: Prepared, known_s: float | None = None) -> float | None:
    """The least largest chunk time of a fitting split (uniform blocks model), by bisection over
    :func:`candidate_times` (feasibility grows with the cap); None when nothing fits.
    ``known_s``: the largest chunk of a split known to fit (a heuristic), which bounds the
    search from above; no chunk is below the average chunk either."""
    cand = candidate_times(prep)
    tmin = prep.problem.time_s.min(axis=1)
    floor = (float(tmin.sum()) + float(prep.bnd.sum())) / prep.K
    cand = cand[cand >= floor * (1 - 1e-9)]
    if known_s is not None:
        cand = cand[cand <= known_s * (1 + 1e-9)]
    if not len(cand) or not feasible_with_cap(prep, float(cand[-1])):
        if known_s is None:
            return None
        return least_largest_chunk(prep)  # known_s was not a candidate: search them all
    lo, hi = 0, len(cand) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible_with_cap(prep, float(cand[mid])):
            hi = mid
        else:
            lo = mid + 1
    return float(cand[lo])

