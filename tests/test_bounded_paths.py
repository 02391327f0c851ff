"""Caps applied before any work (issue #31 item 2): a huge count is one line at once, not minutes
of drawing or searching. What each path costs at its caps is benchmarks/ work; these check only
that the cap is met first."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import planner
from cli import app
from planner.core.errors import PlanInputError
from planner.core.limits import MAX_GPUS_PER_NODE
from planner.layout.ranks import LayoutError, build_layout

runner = CliRunner()


@pytest.mark.parametrize("args, message", [
    (["layout", "--tp", "2", "--pp", "4", "--dp", "2", "--gpus-per-node", "1000000"],
     "a node holds at most 1,024 GPUs"),
    (["layout", "--tp", "2", "--pp", "4", "--dp", "2", "--gpus-per-node", str(2**62)],
     "a node holds at most 1,024 GPUs"),
    (["partition", "--tp", "99999999999999999999", "--pp", "2"], "plan3d plans at most 32,768"),
])
def test_a_huge_count_is_refused_before_the_work(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_caps_hold_below_the_cli_too():
    with pytest.raises(LayoutError, match="at most 1,024"):
        build_layout(2, 4, 2, MAX_GPUS_PER_NODE + 1)
    assert build_layout(2, 4, 2, MAX_GPUS_PER_NODE).num_nodes == 1
    with pytest.raises(PlanInputError, match="at most 32,768"):
        planner.partition("llama3-8b", pp=2, tp=2**40)
