"""Render a calibration: each factor before and after, the runs' errors, leave-one-out summary."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from planner.fidelity.calibrate import Calibration


def calibration_table(cal: Calibration) -> Group:
    factors = Table(title=f"calibrated {escape(cal.profile.name)} on {len(cal.runs)} runs",
                    title_justify="left")
    for col in ("factor", "profile", "fitted", "note"):
        factors.add_column(col, justify="left" if col in ("factor", "note") else "right")
    for name in cal.factors:
        note = "no run depends on it: left as it was" if name in cal.not_identified else ""
        factors.add_row(name, f"{cal.value(cal.profile, name):.4g}",
                        f"{cal.value(cal.fitted, name):.4g}", note)
    runs = Table(show_edge=False)
    for col in ("run", "error before", "after (in-sample)", "after (left out)"):
        runs.add_column(col, justify="left" if col == "run" else "right")
    for name, b, a, o in zip(cal.runs, cal.errors_before, cal.errors_after, cal.loo_errors_after):
        runs.add_row(escape(name), f"{b:+.1%}", f"{a:+.1%}", f"{o:+.1%}")
    lines = [Text(f"leave-one-out mean |step-time error|: {cal.loo_before:.1%} before, "
                  f"{cal.loo_after:.1%} after")]
    if cal.loo_after >= cal.loo_before:
        lines.append(Text("the fit does not predict unseen runs better: fit fewer factors or "
                          "measure more runs", style="yellow"))
    lines += [Text(f"skipped {s}", style="dim") for s in cal.skipped]
    return Group(factors, runs, *lines)
