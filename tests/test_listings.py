"""The catalog listings at 80 and 120 columns (issue #33): the name a user types is never cut,
columns go whole and the caption names them (planner/report/listing.py, report/catalog.py)."""

from __future__ import annotations

import pytest
from rich.console import Console

from planner.hardware.profiles import bundled_hardware
from planner.model.presets import PRESETS
from planner.report.catalog import components_table, hardware_table, models_table, stacks_table
from planner.report.listing import Listing, fitted
from planner.stack import bundled_components, bundled_stacks

CATALOGS = {"models": (models_table, PRESETS), "hardware": (hardware_table, bundled_hardware()),
            "stacks": (stacks_table, bundled_stacks()),
            "components": (components_table, bundled_components())}


def _render(table, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("catalog", sorted(CATALOGS))
def test_every_name_is_whole_and_nothing_is_cut(catalog, width):
    make, items = CATALOGS[catalog]
    text = _render(make(items, width), width)
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines())
    names = [line.split()[0] for line in text.splitlines() if line.startswith(" ")
             and line.split() and line.split()[0] in items]
    assert sorted(names) == sorted(items)


def test_a_narrow_table_names_the_columns_it_left_out():
    text = _render(hardware_table(bundled_hardware(), 80), 80)
    assert "not shown at 80 columns: NVL domain" in " ".join(text.split())
    wide = _render(hardware_table(bundled_hardware(), None), 200)
    assert "NVL domain" in wide and "not shown" not in wide


def test_a_listing_checks_its_own_shape():
    with pytest.raises(ValueError, match="one cell per header"):
        Listing("t", ("name", "x"), (("a",),))
    with pytest.raises(ValueError, match="drop_order names"):
        Listing("t", ("name", "x"), (("a", "1"),), drop_order=("name",))
    table = fitted(Listing("t", ("name", "x"), (("a", "1"),), drop_order=("x",)), 80)
    assert [c.header for c in table.columns] == ["name", "x"]


def test_plan_validate_leads_with_groups_and_lists_cases_on_request():
    """At 80 columns: one row per group with its errors, then the summary, in well under a
    screenful of lines per group (it printed 1,160 lines, every name cut); --cases gives every
    case with its name whole."""
    from typer.testing import CliRunner

    from cli import app
    from planner.fidelity.cases import DEFAULT_FILES, load_cases
    cases = [c for path in DEFAULT_FILES for c in load_cases(path)]
    runner = CliRunner()
    grouped = runner.invoke(app, ["validate"], env={"COLUMNS": "80"})
    assert grouped.exit_code == 0, grouped.output
    assert "…" not in grouped.output and len(grouped.output.splitlines()) < 80
    assert {c["group"] for c in cases} <= {line.split()[0] for line in
                                           grouped.output.splitlines() if line.split()}
    assert "mean |error|" in grouped.output
    listed = runner.invoke(app, ["validate", "--cases"], env={"COLUMNS": "80"})
    names = {line.split()[0] for line in listed.output.splitlines() if line.split()}
    assert {c["name"] for c in cases} <= names and "…" not in listed.output
