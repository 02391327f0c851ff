"""Benchmark the stage partitioner: ILP (HiGHS, CBC) against the exact DP.

Prints one row per (case, method): median wall seconds over --repeats runs,
the bottleneck, and whether the ILP proved its optimum (or fell back).

    PYTHONPATH=. python benchmarks/bench_partition.py [--repeats 3] [--time-limit 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from planner.core.units import GIB
from planner.partition.problem import PartitionProblem, even_split
from planner.partition.solve import _highs_available, partition
from planner.partition.dp import partition_dp


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10.0)
    args = ap.parse_args()
    cases = [("128 layers / 16 stages", 126, 16, 16), ("512 layers / 64 stages", 510, 64, 64),
             ("512 layers / 256 chunks (v=4, 64 ranks)", 510, 256, 64)]
    solvers = (["highs"] if _highs_available() else []) + ["cbc"]
    print(f"{'case':42} {'method':10} {'median s':>9} {'bottleneck ms':>14}  note")
    for name, blocks, K, p in cases:
        prob = gpt_like(blocks, K, p)
        for s in solvers:
            sec, r = timed(lambda: partition(prob, K, p, solver=s, time_limit_s=args.time_limit), args.repeats)
            note = "optimal" if r.optimal and not r.note else r.note or f"gap {r.gap:.3f}"
            print(f"{name:42} {'ilp-' + s:10} {sec:9.3f} {r.bottleneck_s * 1e3:14.3f}  {note}")
        if K == p:
            sec, r = timed(lambda: partition_dp(prob, K, p), args.repeats)
            print(f"{name:42} {'dp':10} {sec:9.3f} {r.bottleneck_s * 1e3:14.3f}  exact")
        ev = even_split(prob, K, p)
        fits = max(ev.rank_memory_bytes) <= prob.capacity_bytes
        print(f"{name:42} {'even':10} {'':9} {ev.bottleneck_s * 1e3:14.3f}  {'fits' if fits else 'exceeds memory'}")


if __name__ == "__main__":
    main()
