"""`plan sweep` on the local process pool against a plain sequential loop of planner.solve over the
same points: a table of points, seconds and speed-up, with the machine's load beside each run.

The spec is 512 small points (two 8-13B models, four GPU types, 16-128 GPUs, tp pinned to 1-8,
two micro-batches, two sequence lengths; pp, schedule, recompute and ZeRO searched): each a full
solve of a few hundred configurations, 0.1-0.5 s, so one to two minutes for the loop on one
core. The loop runs in this process, where the planner's caches of pure functions carry over
from point to point; each pool worker starts with its own, empty. The pool is timed from its start (workers start and import the planner
inside the timing) to the last row, without a cache; the rows of every run must be identical
(the sweep is deterministic whatever the workers). The speed-up can reach the core count only on
an idle machine: "load" is os.getloadavg()'s 1-minute figure before and after each run, other
processes' work included. The last rows measure the machine itself, not the pool: the same
loop over the first points run by one process, then by ``workers`` processes at once, each its
own copy (no pool, no sharing); their speed-up is the most a pool of that size could reach on
this machine for this work (cores that share caches, memory bandwidth and a clock that drops
when more of them are busy fall short of the core count).

Run: python benchmarks/bench_sweep.py [--workers 1,2] [--points-scale 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from planner import api
from planner.sweeping import load_spec
from planner.sweeping.backends import machine_workers
from planner.sweeping.points import expand

SPEC = {"model": ["llama3-8b", "llama2-13b"], "gpu": ["h100", "a100", "h200", "a100-40gb"],
        "gpus": {"from": 16, "to": 128, "times": 2}, "seq_len": [4096, 8192],
        "tp": [1, 2, 4, 8], "micro_batch": [1, 2]}


def _load() -> float:
    return os.getloadavg()[0]


def _timed(run):
    before, start = _load(), time.perf_counter()
    rows = run()
    return time.perf_counter() - start, before, _load(), rows


CEILING_POINTS = 32  # the machine rows' loop: long enough to time, short beside the sweep


def _loop(points) -> float:
    """Seconds for a sequential loop of planner.solve over ``points`` in this process."""
    from planner.sweeping.evaluate import evaluate

    start = time.perf_counter()
    for p in points:
        evaluate(api.solve, p.solve_kwargs())
    return time.perf_counter() - start


def _copies(points, copies: int) -> float:
    """Mean seconds of ``copies`` processes each running the same loop at once (forked after
    the planner is imported, so no import is timed)."""
    with ProcessPoolExecutor(copies, mp_context=get_context("fork")) as pool:
        return sum(pool.map(_loop, [points] * copies)) / copies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2",
                        help="pool sizes to time, comma-separated (default 1,2)")
    parser.add_argument("--small", action="store_true",
                        help="64 points instead of 512 (a quick look)")
    args = parser.parse_args()
    spec = dict(SPEC, **({"model": "llama3-8b", "gpu": ["h100", "a100"], "seq_len": 8192}
                         if args.small else {}))
    points = expand(load_spec(spec))
    print(f"{platform.processor() or platform.machine()}, {machine_workers()} cores for this "
          f"process, {os.cpu_count()} on the machine; {len(points)} points")

    def loop():
        from planner.sweeping.evaluate import evaluate

        return [evaluate(api.solve, p.solve_kwargs()) for p in points]

    seconds, before, after, reference = _timed(loop)
    print(f"\n{'run':<18} {'points':>6} {'seconds':>8} {'points/s':>9} {'speed-up':>9} "
          f"{'load before':>12} {'load after':>11}")
    print(f"{'sequential loop':<18} {len(points):>6} {seconds:>8.1f} {len(points) / seconds:>9.2f} "
          f"{1.0:>8.2f}x {before:>12.2f} {after:>11.2f}")
    base = seconds
    for workers in (int(w) for w in args.workers.split(",")):
        s, before, after, result = _timed(
            lambda: api.sweep(spec, backend="local", workers=workers))
        same = [{k: r[k] for k in reference[0]} for r in result.rows] == reference
        print(f"{f'pool, {workers} worker' + 's' * (workers > 1):<18} {len(points):>6} {s:>8.1f} "
              f"{len(points) / s:>9.2f} {base / s:>8.2f}x {before:>12.2f} {after:>11.2f}"
              + ("" if same else "  ROWS DIFFER"))
    few = points[:CEILING_POINTS]
    one = None
    for copies in sorted({1, *(int(w) for w in args.workers.split(","))}):
        before = _load()
        s = _copies(few, copies)
        one = one or s
        print(f"{f'machine, {copies} at once':<18} {len(few):>6} {s:>8.1f} "
              f"{copies * len(few) / s:>9.2f} {copies * one / s:>8.2f}x {before:>12.2f} "
              f"{_load():>11.2f}")


if __name__ == "__main__":
    main()
