"""Start-up (issue #32 item 4): what a `plan` process imports, checked by name, never timed (the
times are benchmarks/bench_startup.py's, in docs/speed.md). `plan --help` and `plan solve --help`
load the command line alone: no numerical library, none of the planner's modelling packages and
no pydantic (typer's coercion of option values, which a help page has none of); a pinned solve
loads what it plans with, but no published runs' loaders, no sweeping, HTML report, engine
harness or help renderer, and no pandas, PuLP or YAML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# what the child reports: each of these that is in sys.modules (a package counts with any of its
# modules) when the process ends
WATCHED = ("numpy", "pandas", "pulp", "highspy", "scipy", "matplotlib", "ray", "yaml", "pydantic",
           "typer.rich_utils", "planner.predict", "planner.search", "planner.fidelity",
           "planner.fidelity.cases", "planner.fidelity.published", "planner.fidelity.calibrate",
           "planner.cost", "planner.partitioning", "planner.pipeline", "planner.launchers",
           "planner.model", "planner.hardware", "planner.stack", "planner.sweeping",
           "planner.engine", "planner.profiling", "planner.layout", "planner.report.html_report",
           "planner.api.solving", "planner.api.fidelity")

CHILD = """
import atexit, json, sys
WATCHED = {watched!r}
def _report():
    loaded = [w for w in WATCHED if any(m == w or m.startswith(w + ".") for m in sys.modules)]
    sys.__stderr__.write("@loaded " + json.dumps(loaded) + "\\n")
atexit.register(_report)
from planner.cli import main
{run}
"""

# the command line's own packages only: every modelling package and numerical library stays out
NOT_FOR_HELP = set(WATCHED) - {"typer.rich_utils"}
# a pinned solve plans (numpy, the model, the search, the error band's record), and no more
NOT_FOR_A_SOLVE = {"pandas", "pulp", "highspy", "scipy", "matplotlib", "ray", "yaml",
                   "typer.rich_utils", "planner.fidelity.cases", "planner.fidelity.published",
                   "planner.fidelity.calibrate", "planner.sweeping", "planner.engine",
                   "planner.report.html_report", "planner.api.fidelity"}
PINNED = ["solve", "--gpus", "16", "--nodes", "2", "--tp", "2", "--pp", "2", "--micro-batch", "1",
          "--schedule", "1f1b"]


def _loaded(args: list[str] | None) -> set[str]:
    """The watched modules a `plan ARGS` process (None: `import planner.cli` alone) loaded."""
    run = "" if args is None else f"sys.exit(main({args!r}))"
    done = subprocess.run([sys.executable, "-c", CHILD.format(watched=WATCHED, run=run)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stderr.splitlines() if x.startswith("@loaded ")][-1]
    return set(json.loads(line.split(" ", 1)[1]))


def test_importing_the_cli_loads_no_planning():
    assert _loaded(None) & NOT_FOR_HELP == set()


@pytest.mark.parametrize("args", [["--help"], ["solve", "--help"], ["sweep", "--help"]])
def test_help_loads_no_planning(args):
    loaded = _loaded(args)
    assert loaded & NOT_FOR_HELP == set()
    assert "typer.rich_utils" in loaded  # the help was drawn, by typer's renderer


def test_a_pinned_solve_loads_only_what_it_plans_with():
    loaded = _loaded(PINNED)
    assert {"numpy", "planner.search", "planner.api.solving"} <= loaded  # it did plan
    assert loaded & NOT_FOR_A_SOLVE == set()
