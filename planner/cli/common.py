"""What every command shares: the app, the consoles, one-line errors (and JSON errors with
--json), progress bars, flag helpers and the stack flags."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional
import os
import sys

from rich.console import Console
from rich.progress import BarColumn
from rich.progress import Progress
from rich.progress import ProgressColumn
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn
from rich.text import Text
import typer

from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.core.text import for_rich
from planner import api
from planner.report.output import INPUT_ERROR, NOTHING_FITS, error_document, error_markup, json_text
from planner.cli.help_layout import HelpGroup


app = typer.Typer(cls=HelpGroup, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False,
                  help="Plan tensor x pipeline x data parallel training of large models.\n\n"
                       "Example: plan solve --gpus 16 --nodes 2")


def _console(stderr: bool = False) -> Console:
    """Full width on a terminal; wide (no truncated table cells) when piped or captured."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=int(os.environ.get("COLUMNS", "200")))


out = _console()


err = _console(stderr=True)


def print_json(doc) -> None:
    """Plain JSON on stdout (no colour, stable bytes, never NaN) for pipes and scripts."""
    sys.stdout.write(json_text(doc))


def _follow_columns() -> None:
    """Piped or captured, the width is $COLUMNS as it is now (tests and scripts set it per call),
    200 without it; a terminal's own width is left alone."""
    for console in (out, err):
        if not console.is_terminal:
            console.width = int(os.environ.get("COLUMNS", "200"))


@contextmanager
def user_errors(as_json: bool = False):
    """Bad input (a file, a flag, an output that cannot be written): one line and exit 2;
    nothing feasible: the reasons and exit 1. With --json the same as a JSON document on stdout."""
    _follow_columns()
    try:
        yield
    except PlanInputError as e:
        _fail("error", "input", str(e), INPUT_ERROR, as_json)
    except NoFeasiblePlan as e:
        _fail("no feasible plan", "infeasible", str(e), NOTHING_FITS, as_json, e.rejected)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _fail("error", "output", f"{where}{e.strerror or e}", INPUT_ERROR, as_json)


def _fail(label: str, kind: str, message: str, code: int, as_json: bool, rejected=None):
    err.print(error_markup(label, message), highlight=False, soft_wrap=True)
    if as_json:
        print_json(error_document(kind, message, code, rejected))
    raise typer.Exit(code)


def planned_model(model: Optional[str], seq_len: Optional[int]):
    """The model as planned at --seq-len; a note on stderr when that is not the context it
    declares (an imported config's capped default, or an override)."""
    spec = api.model(model).with_seq_length(seq_len)
    note = api.sequence_note(spec, seq_len)
    if note:
        err.print(f"note: {for_rich(note)}", highlight=False, soft_wrap=True)
    return spec


@contextmanager
def progress_bar(label: str):
    """A progress callback; a bar on an interactive terminal only (never in pipes or --json)."""
    if not err.is_terminal:
        yield None
        return
    with Progress(TextColumn(label), BarColumn(), _Count(), TimeElapsedColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task(label, total=None)  # a pulsing bar until the first (done, total)
        yield lambda done, total: bar.update(task, completed=done, total=total)


class _Count(ProgressColumn):
    """done/total once the total is known; nothing before (never "0/None")."""

    def render(self, task) -> Text:
        return Text("" if task.total is None else f"{task.completed:.0f}/{task.total:.0f}")


# Help panels of `plan solve --help`, so 30 options read as four groups. Other commands use the
# same names for the same things, and the short options mean one thing everywhere: -m --model,
# -M --microbatches, -o --out.
PLAN = "What to plan"


PINS = "Pins (fix a dimension; the search covers the rest)"


LIMITS = "Constraints"


OUTPUT = "Output"


def _flag(default: bool, decls: str, help: str, panel: str | None = None):
    """A boolean flag: no value placeholder in --help, its default named."""
    return typer.Option(default, decls, help=help, metavar="", rich_help_panel=panel)


def stack_options(panel: str | None = None) -> dict:
    """The direct flags that override one field of the stack (None: keep the stack's value)."""
    return {
        "flash": typer.Option(None, "--flash/--no-flash", metavar="", show_default="the stack's",
                              help="Flash attention (scores not stored) or unfused attention.",
                              rich_help_panel=panel),
        "overlap": typer.Option(None, "--overlap/--no-overlap", metavar="",
                                show_default="the stack's",
                                help="Overlap DP grad reduce and param gather with compute.",
                                rich_help_panel=panel),
        "tp_overlap": typer.Option(None, "--tp-overlap/--no-tp-overlap", metavar="",
                                   show_default="the stack's",
                                   help="Hide TP communication in the GEMMs.",
                                   rich_help_panel=panel),
        "grad_dtype": typer.Option(None, "--grad-dtype", show_default="the stack's",
                                   help="Gradient dtype: fp32, bf16 or fp16.",
                                   rich_help_panel=panel),
        "precision": typer.Option(None, "--precision", show_default="the stack's (bf16)",
                                  help="Block GEMMs in bf16 or fp8 (the stack's FP8 recipe; "
                                       "H100/H200).",
                                  rich_help_panel=panel),
    }


STACK_FLAGS = stack_options()


def parse_range(text: Optional[str]) -> Optional[tuple[int, int]]:
    if text is None:
        return None
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        raise PlanInputError(f"--global-batch-range takes MIN,MAX (two integers), got {text!r}")
    return low, high


def _three(progress):
    """Adapt the CLI's (done, total) progress callback to the profiler's (done, total, label)."""
    return None if progress is None else (lambda done, total, label: progress(done, total))
