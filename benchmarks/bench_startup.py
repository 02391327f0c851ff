"""Start-up of `plan` (issue #32 item 4: `plan --help` and a pinned solve under 0.15 s): each row
is a cold `plan` process, run N times (after one untimed run that warms the file cache and the
bytecode), its median wall time from the benchmark's launch of the process.

- ``python -c pass``: the interpreter's own start (with site and the installed packages' .pth
  files), the floor under every other row.
- ``floor: ...``: what `plan` cannot do without, alone: importing numpy (which any solve plans
  with), a bare two-command typer app drawing its help, and the same app parsing one integer
  option (typer 0.2x coerces option values with pydantic, imported on the first one).
- ``plan --help``, ``plan solve --help``: the whole process.
- ``pinned solve, until its work``: from the launch until the search of
  ``plan solve --gpus 16 --nodes 2 --tp 2 --pp 2 --micro-batch 1 --schedule 1f1b`` begins (the
  model, hardware and stack already loaded and checked, every module the search needs imported:
  the mark is put at the call of planner.api.solving.search_plans).
- ``pinned solve, whole``: the same solve to its exit, for scale.

"cpu s" is the process's own CPU time (user + system, its threads' included: numpy's BLAS
threads can take it over the wall time; median), which other load on a shared machine inflates
less than the wall time. "modules" is how many modules the process had loaded at its exit (at the
mark for the "until its work" row), and "heavy" which of HEAVY (numpy, pandas, pulp, yaml, scipy,
matplotlib, ray and the planner's modelling packages) among them. "import s" is the sum of
``python -X importtime``'s top-level cumulative times (every import of the process, the lazy
ones inside the commands included; importtime's own bookkeeping inflates it a little), the median
of three more runs. The machine's 1-minute load (os.getloadavg) is printed before and after.

Run: python benchmarks/bench_startup.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.15  # issue #32 item 4
PINNED = ["solve", "--gpus", "16", "--nodes", "2", "--tp", "2", "--pp", "2", "--micro-batch", "1",
          "--schedule", "1f1b"]
HEAVY = ("numpy", "pandas", "pulp", "yaml", "scipy", "matplotlib", "ray", "planner.predict",
         "planner.search", "planner.fidelity", "planner.cost", "planner.partitioning")

# The child: what the installed `plan` script runs (planner.cli:main), and on exit (or at the
# mark) a line with the clock and the modules loaded. time.perf_counter is CLOCK_MONOTONIC on
# Linux, one clock for the benchmark and its children.
REPORT = ("def _report(tag):\n"
          "    import sys, time\n"
          "    heavy = [m for m in HEAVY if m in sys.modules]\n"
          "    sys.stderr.write(f'\\n@{tag} {time.perf_counter()} {len(sys.modules)} '\n"
          "                     f'{\",\".join(heavy) or \"-\"}\\n')\n")
CHILD = ("import atexit, sys\n"
         f"HEAVY = {HEAVY!r}\n" + REPORT +
         "atexit.register(_report, 'exit')\n"
         "from planner.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")
# The same, marking the moment the pinned solve's search is called (planner.api.solving is what
# `plan solve` imports to plan; importing it first changes the order of the imports, not which).
CHILD_UNTIL_WORK = ("import os, sys\n"
                    f"HEAVY = {HEAVY!r}\n" + REPORT +
                    "from planner.cli import main\n"
                    "from planner.api import solving\n"
                    "def _mark(*args, **kwargs):\n"
                    "    _report('work')\n"
                    "    sys.stderr.flush()\n"
                    "    os._exit(0)\n"
                    "solving.search_plans = _mark\n"
                    "sys.exit(main(sys.argv[1:]))\n")
# A bare typer app of two commands, for the floor the command line stands on: typer and rich
# drawing a help page, and typer parsing one integer option (its pydantic coercion).
BARE_TYPER = ("import typer\n"
              "app = typer.Typer(add_completion=False)\n"
              "@app.command()\n"
              "def solve(gpus: int = typer.Option(..., '--gpus', help='Total GPUs.')):\n"
              "    'Solve.'\n"
              "@app.command()\n"
              "def other():\n"
              "    'Other.'\n"
              "app()\n")
CASES = [  # (label, child program or None for `-c pass`, arguments, the tag timed to)
    ("python -c pass", None, [], None),
    ("floor: import numpy", "import numpy", [], None),
    ("floor: bare typer app --help", BARE_TYPER, ["--help"], None),
    ("floor: bare typer, --gpus 16", BARE_TYPER, ["solve", "--gpus", "16"], None),
    ("plan --help", CHILD, ["--help"], "exit"),
    ("plan solve --help", CHILD, ["solve", "--help"], "exit"),
    ("pinned solve, until its work", CHILD_UNTIL_WORK, PINNED, "work"),
    ("pinned solve, whole", CHILD, PINNED, "exit"),
]


def _env() -> dict:
    """The checkout's planner first on the path (as `PYTHONPATH=. python benchmarks/...`)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env


def _command(program: str | None, args: list[str], importtime: bool = False) -> list[str]:
    flags = ["-X", "importtime"] if importtime else []
    return [sys.executable, *flags, "-c", program or "pass", *args]


def _once(program: str | None, args: list[str], tag: str | None) -> tuple[float, float, str]:
    """Wall seconds from the launch to the tag (or the exit), CPU seconds of the process, and the
    modules line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(_command(program, args), capture_output=True, text=True, env=_env(),
                          cwd=ROOT)
    end = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if tag is None:
        return end - start, cpu, "-"
    marks = [line.split() for line in done.stderr.splitlines() if line.startswith(f"@{tag} ")]
    if done.returncode != 0 or not marks:
        raise SystemExit(f"{args}: exit {done.returncode}, no @{tag} mark:\n{done.stderr[-2000:]}")
    _, clock, modules, heavy = marks[-1]
    return float(clock) - start, cpu, f"{modules} {heavy}"


def _import_seconds(program: str | None, args: list[str]) -> float:
    """Every top-level import's cumulative time (`-X importtime`, microseconds) summed."""
    done = subprocess.run(_command(program, args, importtime=True), capture_output=True,
                          text=True, env=_env(), cwd=ROOT)
    total = 0
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit() and not name.startswith("  "):  # top level: " name"
                total += int(cumulative)
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    repeats = parser.parse_args().repeats
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}; {repeats} runs a row, "
          f"median; target {TARGET_S} s")
    print(f"{'case':30} {'median s':>8} {'min s':>6} {'cpu s':>6} {'import s':>8} {'ok':>3}  "
          f"modules heavy")
    for label, program, args, tag in CASES:
        _once(program, args, tag)  # warm: the file cache and the bytecode
        runs = [_once(program, args, tag) for _ in range(repeats)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        imports = statistics.median(_import_seconds(program, args) for _ in range(3))
        ok = "yes" if wall <= TARGET_S else "NO"
        print(f"{label:30} {wall:8.3f} {min(r[0] for r in runs):6.3f} {cpu:6.3f} "
              f"{imports:8.3f} {ok:>3}  {runs[-1][2]}", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
