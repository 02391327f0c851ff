"""`plan sweep SPEC`: many solves at once (planner.api.sweep), the rows as a table, CSV/Parquet and
plots."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from planner import api
from planner.core.text import for_rich
from planner.cli.common import _flag, app, err, out, user_errors

DEFAULT_CACHE = Path(".plan3d-sweep")


@contextmanager
def _eta():
    """A progress callback with the time left; a bar on an interactive terminal only."""
    if not err.is_terminal:
        yield None
        return
    with Progress(TextColumn("solving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task("solving", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.command()
def sweep(
    spec: str = typer.Argument(..., metavar="SPEC",
                               help="A YAML, JSON or TOML file mapping solve inputs to a value, "
                                    "a list or a range ({from, to, step|times}), or the same "
                                    "inline: '{gpus: \\[8, 16], model: llama3-8b}'."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o",
                                            help="Write the rows: FILE.csv, or FILE.parquet "
                                                 "(needs pyarrow)."),
    plot: Optional[Path] = typer.Option(None, "--plot",
                                        help="Draw scaling, cost and Pareto plots: FILE.svg or "
                                             "FILE.html (needs plan3d\\[plot])."),
    backend: str = typer.Option("local", "--backend",
                                help="local (a process pool on this machine) | ray "
                                     "(plan3d\\[sweep]) | serial (one after another, here)."),
    workers: Optional[int] = typer.Option(None, "--workers", show_default="the machine's cores",
                                          help="Processes (local) or CPUs (a new Ray instance)."),
    cache: Path = typer.Option(DEFAULT_CACHE, "--cache",
                               help="Directory of finished points, one JSON each: a sweep "
                                    "stopped midway resumes from it, never solving a point twice."),
    no_cache: bool = _flag(False, "--no-cache", "Keep no finished points."),
    max_points: int = typer.Option(api.DEFAULT_MAX_POINTS, "--max-points",
                                   help="Refuse a spec of more points."),
    force: bool = _flag(False, "--force", "Overwrite the --out and --plot files."),
):
    """Solve every point of a spec (the product of its lists and ranges), one `plan solve` each.

    Prints the best plan of each point, with the time and cost to train where the
    spec gives train_tokens and gpu_hour_price.

    Examples:\n
      plan sweep capacity.yaml --out rows.csv --plot scaling.html\n
      plan sweep '{gpu: \\[h100, a100], gpus: {from: 8, to: 64, times: 2}}'\n
      plan sweep big.yaml --backend ray --max-points 50000
    """
    with user_errors():
        with _eta() as progress:
            result = api.sweep(spec, backend=backend, workers=workers,
                               cache=None if no_cache else cache, max_points=max_points,
                               out=out_file, plot=plot, force=force, progress=progress)
        out.print(result.table(), highlight=False)
        for line in result.reasons():
            out.print(for_rich(line), highlight=False, soft_wrap=True)
        n = len(result.rows)
        where = "" if no_cache else f" ({for_rich(str(cache))})"
        out.print(f"{n} point{'s' * (n != 1)}: {result.feasible} with a plan, "
                  f"{n - result.feasible} without; {result.computed} solved, {result.cached} "
                  f"from the cache{where} in {result.elapsed_s:.2f} s", highlight=False,
                  soft_wrap=True)
        written = [str(p) for p in (out_file, plot) if p is not None]
        if written:
            err.print("wrote " + for_rich(", ".join(written)), highlight=False)
