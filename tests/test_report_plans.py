"""The plans table: fits the terminal, never shows two rows with the same configuration, and says
what it left out; `--wide` shows every column."""

from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import cli
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.report.plans import COLUMNS, plans_view, table_width
from planner.search.request import Request
from planner.search.solver import search

runner = CliRunner()


@lru_cache(maxsize=None)
def _plans(model: str, gpus: int, nodes: int, batch: int | None = None):
    cluster = make_cluster(load_hardware("a100-80gb"), gpus, nodes)
    return search(Request(model=PRESETS[model], cluster=cluster, global_batch=batch,
                          top=10)).plans


def _knob_keys(view):
    knobs = [i for i, c in enumerate(view.columns) if c.knob and c.header != "#"]
    return [tuple(row[i] for i in knobs) for row in view.rows]


def test_issue_command_at_80_columns_shows_every_value_untruncated():
    """Done-when of issue #19: `COLUMNS=80 plan solve --gpus 16 --nodes 2`."""
    result = runner.invoke(cli.app, ["solve", "--gpus", "16", "--nodes", "2"],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines)
    assert "…" not in result.output
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    rows = [line.split() for line in lines[start + 2:] if "·" in line]
    assert len(rows) == 10
    header = lines[start].split()
    assert "tp·pp·dp" in header and "MFU" in header and "bubble" in header
    assert "not shown at 80 columns" in result.output and "--wide" in result.output


def test_wide_shows_every_column():
    result = runner.invoke(cli.app, ["solve", "--gpus", "16", "--nodes", "2", "--wide"],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    for column in COLUMNS:
        # batch: shown only when the plans' batches differ; tp·cp·pp·dp replaces tp·pp·dp only
        # when a plan splits the sequence
        if column.header not in ("batch", "tp·cp·pp·dp"):
            assert column.header in result.output
    assert "not shown at" not in result.output


@settings(max_examples=15, deadline=None)
@given(case=st.sampled_from([("llama3-8b", 16, 2, None), ("llama2-7b", 8, 1, 64),
                             ("megatron-1.7b", 32, 4, 512), ("llama3-70b", 64, 8, None)]),
       width=st.integers(40, 160))
def test_any_width_fits_or_folds_and_no_two_rows_show_one_configuration(case, width):
    plans = _plans(*case)
    view = plans_view(plans, width)
    keys = _knob_keys(view)
    assert len(set(keys)) == len(keys)  # no two visible rows show the same configuration
    assert len(view.rows) + view.folded == len(plans)
    if view.folded == 0 and len(view.columns) > 3:
        assert table_width(view.columns, view.rows) <= width or not view.hidden
    all_view = plans_view(plans, None)
    assert not all_view.hidden and all_view.folded == 0


def test_a_column_that_tells_rows_apart_stays():
    """Issue #19: rows that differ only in a dropped column looked identical."""
    plans = _plans("llama3-8b", 16, 2)
    full = plans_view(plans, None)
    narrow = plans_view(plans, 80)
    assert narrow.folded == 0
    assert len(set(_knob_keys(narrow))) == len(full.rows)


def test_the_funnel_adds_up_in_the_output():
    result = runner.invoke(cli.app, ["solve", "--gpus", "16", "--nodes", "2"],
                           env={"COLUMNS": "200"})
    line = next(line for line in result.output.splitlines() if "considered" in line)
    words = line.replace("=", " ").replace("+", " ").split()
    considered = int(words[0])
    parts = [int(words[i - 1]) for i, w in enumerate(words) if w in ("rejected", "feasible")]
    not_refined = int(words[words.index("not") - 1])
    assert considered == sum(parts) + not_refined
    rejected_line = next(line for line in result.output.splitlines()
                         if line.startswith("rejected:"))
    counts = [int(tok) for tok in rejected_line.replace(",", " ").split() if tok.isdigit()]
    assert sum(counts) == parts[0]


@pytest.mark.parametrize("columns", ["60", "80", "100"])
def test_explain_fits_too(columns):
    result = runner.invoke(cli.app, ["solve", "--gpus", "16", "--nodes", "2", "--tp", "2",
                                     "--pp", "2", "--micro-batch", "1", "--explain"],
                           env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    table_lines = result.output.split("fits")[0].splitlines()
    assert all(len(line.rstrip()) <= int(columns) for line in table_lines[1:])
