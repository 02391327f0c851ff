"""Benchmark the stage partitioner: the MILP (HiGHS, CBC), solved cold, against the exact DP.

One row per (case, method): median wall seconds over --repeats runs, the bottleneck, and what
was proven: "optimal" (the whole tie-break rule), the bottleneck only ("B optimal", interleaved
rows measure the proof of B: the chunk-order tie-break of 256 chunks is not part of the goal),
or the gap to the solver's bound. Interleaved rows prove the least largest chunk C first and B
under it (the tie-break rule's steps 0 and 1). The MILP never sees the DP's answer; a row whose split came
from the DP fallback says so.

    PYTHONPATH=. python benchmarks/bench_partition.py [--repeats 5] [--node-limit 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from planner.core.units import GIB
from planner.partitioning.dp import partition_dp
from planner.partitioning.baselines import even_split
from planner.partitioning.problem import PartitionProblem
from planner.partitioning.split import fits
from planner.partitioning.lexicographic import NODE_LIMIT
from planner.partitioning.solve import _highs_available, partition

GOAL_S = 2.0  # issue #17: v = 4, 512 layers proven optimal (or gap <= 1% printed) within 2 s


def gpt_like(blocks: int, K: int, p: int, microbatches: int = 32) -> PartitionProblem:
    """Embedding (big state, cheap), identical blocks, heavy head; memory binds without recompute."""
    L = blocks + 2
    modes = ("none", "selective", "full")
    t = np.tile([1.0e-3, 1.1e-3, 1.33e-3], (L, 1))  # recompute adds forward time
    act = np.tile([1.0, 0.35, 0.06], (L, 1)) * GIB
    state = np.full(L, 1.5 * GIB)
    t[0], act[0], state[0] = 0.2e-3, 0.05 * GIB, 6 * GIB  # embedding: large vocab
    t[-1], act[-1], state[-1] = 4.0e-3, 0.5 * GIB, 6 * GIB  # head + loss
    v = K // p
    # interleaved 1F1B: chunk k on rank k % p holds roughly p - rank (+ a bit per extra virtual stage)
    inflight = np.array([min(microbatches, p - (k % p) + (v - 1 - k // p) * p // max(v, 1)) for k in range(K)], float)
    blocks_per_rank = blocks / p
    cap = (blocks_per_rank * 1.5 + 6 + 0.35 * inflight.max() / v * blocks_per_rank) * GIB
    return PartitionProblem(t, state, act, inflight, cap, modes, boundary_s=0.05e-3)


def timed(fn, repeats: int):
    times, res = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), res


def _largest(r) -> float:
    """The largest chunk's seconds: what interleaved splits minimise first (problem.py, step 0)."""
    return max(c.time_s for c in r.chunks)


def _proven(r, v: int) -> str:
    if r.method == "dp" or not r.method.startswith("ilp"):
        return r.label
    if not r.optimal:
        return f"gap {r.gap:.2%} ({r.note})"
    return "C, B optimal (ties not broken)" if v > 1 else ("optimal" if not r.note else r.label)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--node-limit", type=int, default=NODE_LIMIT,
                    help="branch-and-bound nodes a solve may explore (the partitioner's default)")
    args = ap.parse_args()
    cases = [("128 layers / 16 stages", 126, 16, 16), ("512 layers / 64 stages", 510, 64, 64),
             ("512 layers / 256 chunks (v=4, 64 ranks)", 510, 256, 64)]
    solvers = (["highs"] if _highs_available() else []) + ["cbc"]
    print(f"HiGHS (highspy) {'available' if _highs_available() else 'missing: CBC only'}; "
          f"node limit {args.node_limit:,} a solve; medians of {args.repeats}")
    print(f"{'case':42} {'method':10} {'median s':>9} {'bottleneck ms':>14} {'largest chunk ms':>17}"
          f"  proven")
    for name, blocks, K, p in cases:
        prob = gpt_like(blocks, K, p)
        v = K // p
        steps = 3 if v == 1 else 1
        for s in solvers:
            sec, r = timed(lambda: partition(prob, K, p, solver=s, node_limit=args.node_limit,
                                             tie_break_steps=steps), args.repeats)
            goal = "" if v == 1 else ("  goal met" if sec <= GOAL_S and (r.optimal or r.gap <= 0.01)
                                      else "  GOAL MISSED")
            print(f"{name:42} {'ilp-' + s:10} {sec:9.3f} {r.bottleneck_s * 1e3:14.3f} "
                  f"{_largest(r) * 1e3:17.3f}  {_proven(r, v)}{goal}")
        if K == p:
            sec, r = timed(lambda: partition_dp(prob, K, p), args.repeats)
            print(f"{name:42} {'dp':10} {sec:9.3f} {r.bottleneck_s * 1e3:14.3f} "
                  f"{_largest(r) * 1e3:17.3f}  exact")
        ev = even_split(prob, K, p)
        print(f"{name:42} {'even':10} {'':9} {ev.bottleneck_s * 1e3:14.3f} "
              f"{_largest(ev) * 1e3:17.3f}  {'fits' if fits(ev) else 'exceeds memory'}")


if __name__ == "__main__":
    main()
