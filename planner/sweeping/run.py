"""A sweep, run: the spec's points, those the cache holds reused, the rest solved on a backend, the
rows back in point order. ``solve`` is passed in (planner.api passes planner.solve itself), so
every point is exactly one `plan solve`, and this package sits below the API."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.core.errors import PlanInputError
from planner.hardware.profiles import load_hardware
from planner.sweeping.backends import run_points
from planner.sweeping.cache import PointCache
from planner.sweeping.evaluate import OK, evaluate
from planner.sweeping.output import PLOT_SUFFIXES, TABLE_SUFFIXES, check_output, write_frame
from planner.sweeping.points import expand
from planner.sweeping.rows import columns, row
from planner.sweeping.source import load_spec
from planner.sweeping.spec import DEFAULT_MAX_POINTS, SweepSpec


@dataclass(frozen=True)
class SweepResult:
    """The rows of a sweep, one per point in point order, and how they were obtained."""

    spec: SweepSpec
    rows: tuple[dict, ...]
    columns: tuple[str, ...]
    computed: int  # points solved by this run
    cached: int  # points the cache held (finished by an earlier, maybe interrupted, run)
    elapsed_s: float = field(default=0.0, compare=False)

    @property
    def feasible(self) -> int:
        return sum(1 for r in self.rows if r["status"] == OK)

    def to_frame(self):
        """One row per point (pandas): inputs, the best plan, economics, the reason if none."""
        import pandas as pd

        data = {}
        for name in self.columns:  # integer and flag columns keep their type where a row has
            values = [r[name] for r in self.rows]  # no plan (pandas' nullable Int64, boolean)
            present = [v for v in values if v is not None]
            if present and all(isinstance(v, bool) for v in present):
                data[name] = pd.array(values, dtype="boolean")
            elif present and all(isinstance(v, int) and not isinstance(v, bool)
                                 for v in present):
                data[name] = pd.array(values, dtype="Int64")
            else:
                data[name] = values
        frame = pd.DataFrame(data, columns=list(self.columns))
        return frame

    def write(self, path, force: bool = False):
        """The frame as CSV, or Parquet when ``path`` ends in .parquet (needs pyarrow)."""
        return write_frame(self.to_frame(), path, force)

    def plot(self, path, force: bool = False):
        """Scaling curves, cost or time to train, and the Pareto front, as SVG or HTML."""
        from planner.sweeping.plot import write_plot

        return write_plot(self.to_frame(), self.spec, path, force)

    def table(self):
        """A rich Table of the rows: the inputs that vary and the best plan of each point."""
        from planner.sweeping.table import sweep_table

        return sweep_table(self.to_frame(), self.spec)

    def reasons(self) -> list[str]:
        """Why the points without a plan have none: one line per reason, naming the points."""
        from planner.sweeping.table import reasons

        return reasons(self.to_frame())


def _prices(spec: SweepSpec, gpus: set[str]) -> dict:
    """The GPU-hour price of each GPU of the sweep (a mapping's keys may be aliases)."""
    if spec.gpu_hour_price is None:
        return {}
    if not isinstance(spec.gpu_hour_price, tuple):
        return {g: spec.gpu_hour_price for g in gpus}
    prices = {}
    for name, price in spec.gpu_hour_price:
        try:
            prices[load_hardware(name).name] = price
        except PlanInputError as e:
            raise PlanInputError(f"spec: gpu_hour_price: {e}") from None
    missing = sorted(gpus - set(prices))
    if missing:
        raise PlanInputError(f"spec: gpu_hour_price has no price for {', '.join(missing)}")
    return prices


def run_sweep(source, solve, *, backend: str = "local", workers: int | None = None,
              cache=None, max_points: int = DEFAULT_MAX_POINTS, out=None, plot=None,
              force: bool = False, progress=None) -> SweepResult:
    """Solve every point of ``source`` (a spec file, inline mapping, dict or SweepSpec) with
    ``solve``; ``cache`` a directory of finished points to reuse and fill (None: none);
    ``progress(done, total)`` over the points left to solve. ``out`` and ``plot`` are written
    after the sweep, but refused before it if they cannot be."""
    start = time.perf_counter()
    spec = load_spec(source, max_points)
    out = check_output(out, TABLE_SUFFIXES, "--out", force)
    plot = check_output(plot, PLOT_SUFFIXES, "--plot", force)
    if plot is not None:
        from planner.sweeping.plot import require_matplotlib

        require_matplotlib()
    points = expand(spec)
    prices = _prices(spec, {dict(p.inputs)["gpu"] for p in points})
    store = PointCache(cache)
    outcomes, todo = {}, {}
    for p in points:
        if p.digest in outcomes or p.digest in todo:
            continue
        found = store.get(p.digest)
        if found is not None:
            outcomes[p.digest] = found
        else:
            todo[p.digest] = p.solve_kwargs()
    cached = len(outcomes)
    if progress is not None:
        progress(0, len(todo))

    def done(digest, outcome):
        store.put(digest, todo[digest], outcome)
        outcomes[digest] = outcome
        if progress is not None:
            progress(len(outcomes) - cached, len(todo))

    run_points(evaluate, solve, todo.items(), backend, workers, done)
    rows = tuple(row(spec, p, outcomes[p.digest], prices.get(dict(p.inputs)["gpu"]))
                 for p in points)
    result = SweepResult(spec, rows, tuple(columns(spec)), computed=len(todo), cached=cached,
                         elapsed_s=time.perf_counter() - start)
    if out is not None:
        result.write(out, force)
    if plot is not None:
        result.plot(plot, force)
    return result
