"""Time schedule generation, simulation and the deadlock check on large pipelines; print a table.

Run: PYTHONPATH=. python benchmarks/bench_schedule.py
Targets (2-core machine): 1f1b p=64 M=1024 and interleaved p=16 M=256 v=8 simulate in < 2 s each.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from planner.pipeline.schedule import build_schedule, find_deadlock, with_communication
from planner.pipeline.simulate import simulate

CASES = [
    ("1f1b", 64, 1024, 1),
    ("interleaved", 16, 256, 8),
    ("gpipe", 32, 512, 1),
    ("zb-h1", 32, 512, 1),
]


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    table = Table(title="plan3d schedule benchmark")
    for col in ("schedule", "p", "M", "v", "compute ops", "simulate s", "ops/s",
                "p2p insert s", "deadlock check s", "bubble"):
        table.add_column(col, justify="right")
    for name, p, m, v in CASES:
        res, sim_s = _timed(lambda: simulate(name, p, m, v, fwd_s=1.0 / v, bwd_s=2.0 / v, comm_s=0.01))
        n_ops = sum(len(row) for row in res.timeline)
        full, comm_s = _timed(lambda: with_communication(build_schedule(name, p, m, v)))
        dead, check_s = _timed(lambda: find_deadlock(full))
        assert dead is None
        table.add_row(name, str(p), str(m), str(v), f"{n_ops:,}", f"{sim_s:.3f}", f"{n_ops / sim_s:,.0f}",
                      f"{comm_s:.3f}", f"{check_s:.3f}", f"{res.bubble_fraction:.2%}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
