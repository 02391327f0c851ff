"""`plan validate` and `plan calibrate`: predictions against measured runs, and efficiency
factors fitted to the user's own."""

from __future__ import annotations

from pathlib import Path
from typing import Optional
import json
import sys

from rich.markup import escape
import typer

from planner import api
from planner.core.errors import PlanInputError
from planner.core.files import refuse_overwrite, write_text
from planner.cli.common import _flag, app, out, progress_bar, user_errors


@app.command()
def validate(
    file: Optional[Path] = typer.Argument(None, help="Published runs JSON.",
                                          show_default="the bundled runs"),
    runs: Optional[Path] = typer.Option(None, "--runs",
                                        help="Your own runs file (same format as the bundled "
                                             "profiles/validation/*.json)."),
    hardware: Optional[Path] = typer.Option(None, "--hardware",
                                            help="A GPU profile (e.g. from plan calibrate) used "
                                                 "for every run instead of the bundled one."),
    markdown: bool = typer.Option(False, "--markdown", metavar="",
                                  help="Print a markdown table (docs/validation.md's)."),
    stack: Optional[str] = typer.Option(None, "--stack",
                                        help="Price every case on this stack NAME or FILE "
                                             "instead of the stack each case names."),
    cases: bool = _flag(False, "--cases", "Every case, one row each (default: each group's "
                                          "errors, then the summary)."),
    settings: bool = _flag(False, "--settings", "The stack settings only one source's runs "
                                                "set, with their error with and without."),
):
    """Predict published training runs and compare: step time, TFLOP/s, memory, ranking.

    Examples:\n
      plan validate\n
      plan validate --cases\n
      plan validate --settings\n
      plan validate --runs my_runs.json --hardware h100-mine.json
    """
    # lazy on purpose (here, not at the top): `plan --help` loads no published runs
    from planner.report.validation import (cases_table, groups_table, settings_table,
                                           summary_lines, validation_markdown)

    with user_errors():
        if file is not None and runs is not None:
            raise PlanInputError("give the runs file once: as the argument or as --runs")
        if settings and (file or runs or hardware or stack or cases or markdown):
            raise PlanInputError("--settings prices the bundled runs on their own stacks: give "
                                 "it alone")
        if settings:
            with progress_bar("pricing each setting away") as progress:
                out.print(settings_table(api.single_source_settings(progress=progress),
                                         out.width))
            return
        hw = api.hardware(file=hardware) if hardware else None
        with progress_bar("validating") as progress:
            checked = api.validate_runs(file or runs, hardware=hw,
                                        stack=api.stack(stack) if stack else None,
                                        progress=progress)
        rows, summary = checked.rows, checked.summary
        if markdown:
            sys.stdout.write(validation_markdown(rows, summary))
        else:
            out.print(cases_table(rows, out.width) if cases else
                      groups_table(rows, out.width, checked.held_out or None))
            for line in summary_lines(summary):
                out.print(escape(line), highlight=False)


@app.command("calibrate")
def calibrate_cmd(
    runs: Path = typer.Option(..., "--runs", help="Your measured runs (the format of "
                                                  "profiles/validation/*.json), one GPU kind."),
    factors: str = typer.Option("matmul,attention,network", "--factors",
                                help="Efficiency factors to fit (comma list, at most these three)."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the calibrated GPU "
                                                                      "profile here (for "
                                                                      "--hardware)."),
    force: bool = _flag(False, "--force", "Overwrite --out."),
):
    """Fit the GPU profile's efficiency factors to your own measured runs.

    Least squares on log step-time error; prints the leave-one-out error before
    and after, so you see what the calibration buys on a run it has not seen.

    Example:\n
      plan calibrate --runs my_runs.json --factors matmul --out h100-mine.json
    """
    from planner.report.calibration import calibration_table  # lazy on purpose: not for --help

    with user_errors():
        names = api.parse_factors(factors)
        if out_file is not None:
            refuse_overwrite([out_file], force)
        with progress_bar("calibrating") as progress:
            cal = api.calibrate(runs, names, progress)
        out.print(calibration_table(cal))
        if out_file is not None:
            doc = api.calibrated_hardware(cal, runs.name)
            write_text(out_file, json.dumps(doc, indent=2) + "\n", force=force)
            out.print(f"wrote {escape(str(out_file))}; use it with --hardware")
