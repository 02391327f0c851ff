"""The `plan` command line (floor: top, beside planner/__init__.py). Each command parses its
flags, calls the planner, renders the answer; no planning logic lives here. The top-level cli.py
is a thin entry kept for `python cli.py ...`; the installed `plan` script runs :func:`main`."""

from __future__ import annotations

import sys
from typing import Optional

import typer

# The parser's errors: typer >= 0.2x vendors click, and its errors derive from TyperException
# (a separately installed click, say from the engine extra, is not what typer raises); older typer
# raises click's own.
try:
    from typer.exceptions import TyperException as _UsageProblem
except ImportError:
    from click import ClickException as _UsageProblem

# the command modules register their commands on `app` when imported
from planner.cli import catalog, fidelity, measure, partition, report, solve, sweep  # noqa: F401
from planner.cli.common import _fail, app, err
from planner.report.output import INPUT_ERROR

__all__ = ["app", "main"]


def main(argv: Optional[list[str]] = None) -> int:
    """The `plan` command. A flag click cannot parse (``--gpus abc``, an unknown option) is bad
    input like any other: one line, exit 2, and with --json an error document on stdout."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = app(args=args, prog_name="plan", standalone_mode=False)
    except typer.Abort:  # Ctrl-C
        err.print("aborted", highlight=False)
        return 130
    except _UsageProblem as e:
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        if not message.strip():  # no arguments at all: the help was printed, nothing went wrong
            return getattr(e, "exit_code", INPUT_ERROR)
        try:
            _fail("error", "usage", f"{message} (plan COMMAND --help lists its options)",
                  getattr(e, "exit_code", INPUT_ERROR), "--json" in args)
        except typer.Exit as done:
            return done.exit_code
    return code if isinstance(code, int) else 0
