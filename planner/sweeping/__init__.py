"""Capacity planning: many solves at once (`plan sweep SPEC`, planner.api.sweep). A spec gives
lists or ranges of solve inputs (spec.py, source.py); their product is the points (points.py),
each one planner.solve (evaluate.py) on a backend (backends.py: serial, a local process pool, Ray),
resumable from a cache of finished points (cache.py, digest.py); the rows (rows.py) make one tidy
frame, written as CSV or Parquet (output.py), drawn (plot.py) and shown (table.py).

Floor 8, above report/: it renders its own frames; the API (top) passes planner.solve in. The
package is not called ``sweep`` because planner.sweep is the API function (planner/__init__.py).
Nothing heavy at import: pandas, matplotlib and ray load where they are used.
"""

from planner.sweeping.run import SweepResult, run_sweep
from planner.sweeping.source import load_spec
from planner.sweeping.spec import DEFAULT_MAX_POINTS, SweepSpec

__all__ = ["DEFAULT_MAX_POINTS", "SweepResult", "SweepSpec", "load_spec", "run_sweep"]
