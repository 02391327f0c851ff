"""The same search gives the same output on any machine at any load (issue #32): its budgets count
work (refinements, simplex iterations, branch-and-bound nodes), never seconds.

Two `plan solve --json` runs in fresh processes, one of them slowed: every Python clock
(time.time, monotonic, perf_counter, process_time and their _ns forms) runs 10,000 times fast,
so any limit in seconds is reached at once (the 5 s budget this replaced after 0.5 ms, the
partitioner's 2 s after 0.2 ms), and a thread burns CPU beside the search.  The search's work
budget is cut to a few refinements through the module's seam so that it, not the proof, stops
the search: the output then carries the note of a stopped search (how far plan 1 is from the
best, how many configurations are unproven), which a budget in seconds made differ from run to
run.  The outputs must match byte for byte; --json carries no elapsed time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOLVE = ["solve", "--model", "llama3-8b", "--gpus", "8", "--nodes", "1", "--gpu", "a100-80gb",
         "--global-batch", "64", "--schedule", "interleaved", "--micro-batch", "2", "--top", "3",
         "--json"]

SLOWDOWN = """
import threading, time
for name in ("time", "monotonic", "perf_counter", "process_time"):
    for suffix, scale in (("", 1e4), ("_ns", 10**4)):
        real = getattr(time, name + suffix)
        setattr(time, name + suffix, lambda real=real, scale=scale: real() * scale)
def burn():
    while True:
        sum(range(10_000))
threading.Thread(target=burn, daemon=True).start()
"""

RUN = """
import sys
import planner.search.refinement as refinement
refinement.AUTO_FIRST = 3
refinement.AUTO_WORK = 4
from planner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _solve(slowed: bool) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    code = (SLOWDOWN if slowed else "") + RUN
    done = subprocess.run([sys.executable, "-c", code, *SOLVE], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_slowed_search_prints_the_same_json_byte_for_byte():
    plain, slowed = _solve(slowed=False), _solve(slowed=True)
    notes = json.loads(plain)["search"]["notes"]
    # the budget, not the proof, stopped it: the case exercises what a clock used to decide
    assert any(n.startswith("refinement stopped at its work budget") and "plan 1 is within" in n
               for n in notes), notes
    assert "elapsed" not in plain
    assert slowed == plain
