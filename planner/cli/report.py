"""`plan report`: a saved plan (plan.json, or `plan solve --json` output) as one self-contained
HTML page."""

from __future__ import annotations

from pathlib import Path

import typer

from planner import api
from planner.core.text import for_rich
from planner.cli.common import _flag, app, err, user_errors


@app.command()
def report(
    plan_file: Path = typer.Argument(...,
                                     help="plan.json (plan solve --export json) or plan solve "
                                          "--json output."),
    out_file: Path = typer.Option(..., "--out", "-o", help="HTML file to write."),
    force: bool = _flag(False, "--force", "Overwrite --out."),
):
    """Write the plans as one HTML page that opens offline: plans, memory, schedule, ranks.

    Examples:\n
      plan solve --gpus 16 --nodes 2 --export json --out run/\n
      plan report run/plan.json -o report.html\n
      plan solve --gpus 16 --nodes 2 --report report.html
    """
    with user_errors():
        api.report(plan_file, out=out_file, force=force)
        err.print(f"wrote {for_rich(str(out_file))}", highlight=False)
