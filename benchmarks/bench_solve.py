"""Planning time of `plan solve` on the issue's reference cases (ILP partition and op-by-op
simulation of the best 20 included): a table of medians.

Run: python benchmarks/bench_solve.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.spec import load_model
from planner.search.engine import Request, search

CASES = [  # (model, gpus, nodes, global batch, target seconds on a 2-core machine)
    ("llama3-8b", 16, 2, 512, 2.0),
    ("gpt3-175b", 1024, 128, 1536, 2.0),
    ("mt-nlg-530b", 5120, 640, 1920, 5.0),
    ("llama3-405b", 16384, 2048, 2048, 10.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    hw = load_hardware("a100-80gb")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print(f"{'case':<32}{'screened':>10}{'refined':>9}{'median s':>10}{'target s':>10}  ok")
    for name, gpus, nodes, batch, target in CASES:
        req = Request(model=load_model(name), cluster=make_cluster(hw, gpus, nodes),
                      global_batch=batch)
        times, result = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = search(req)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        label = f"{name} on {gpus} GPUs"
        print(f"{label:<32}{result.screened:>10}{req.refine:>9}{median:>10.2f}{target:>10.1f}  "
              f"{'yes' if median <= target else 'NO'}")


if __name__ == "__main__":
    main()
