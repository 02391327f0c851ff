"""Catalog listings (`plan models`, `plan hardware`, `plan stacks`) that fit the terminal.

Rich shrinks a table wider than the console by cutting cells with an ellipsis, the name first;
but the name is what the user has to type (`--model llama3-70b`). So no cell is ever cut: the
table drops whole columns, least important first, until it fits, and its caption says which
(the same rule as the plans table, planner/report/plans.py plans_view). The first column, the
name, always stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

# a console wide enough that rich measures a table's natural width instead of fitting it
MEASURE = Console(width=10_000, color_system=None)


@dataclass(frozen=True)
class Listing:
    """A catalog table before it is fitted: ``headers`` in display order, ``right`` which of them
    are numbers (right-aligned), ``wrap`` the free-text ones that may wrap onto more lines (a
    list of fields), ``drop_order`` the headers to leave out first at a narrow width, and a
    ``caption`` (where the full data is)."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: tuple[str, ...] = ()
    wrap: tuple[str, ...] = ()
    drop_order: tuple[str, ...] = ()
    caption: str | None = None

    def __post_init__(self):
        if any(len(row) != len(self.headers) for row in self.rows):
            raise ValueError(f"{self.title}: every row needs one cell per header")
        unknown = set(self.drop_order) - set(self.headers[1:])
        if unknown:
            raise ValueError(f"{self.title}: drop_order names {sorted(unknown)}, not a column "
                             "after the first")


def _table(listing: Listing, shown: list[str], caption: str | None) -> Table:
    table = Table(title=listing.title, title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, padding=(0, 1, 0, 1), collapse_padding=True,
                  caption=caption, caption_justify="left")
    keep = [listing.headers.index(h) for h in shown]
    for h in shown:
        table.add_column(h, justify="right" if h in listing.right else "left",
                         no_wrap=h not in listing.wrap)
    for row in listing.rows:
        table.add_row(*(row[i] for i in keep))
    return table


def _width(listing: Listing, shown: list[str]) -> int:
    """The table's width with its wrapping columns at their narrowest (rich wraps them to fit)."""
    measured = Measurement.get(MEASURE, MEASURE.options, _table(listing, shown, None))
    return measured.minimum if listing.wrap else measured.maximum


def fitted(listing: Listing, width: int | None) -> Table:
    """The table at ``width`` characters (None: every column): whole cells, whole columns
    dropped in ``drop_order`` while it is wider, and the caption naming what was dropped."""
    shown = list(listing.headers)
    hidden = []
    if width is not None:
        for header in listing.drop_order:
            if _width(listing, shown) <= width:
                break
            shown.remove(header)
            hidden.append(header)
    notes = ([f"not shown at {width} columns: {', '.join(hidden)}"] if hidden else [])
    notes += [listing.caption] if listing.caption else []
    return _table(listing, shown, "; ".join(notes) or None)
