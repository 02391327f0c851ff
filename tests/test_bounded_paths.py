"""Caps applied before any work (issue #31 item 2): a huge count is one line at once, not minutes
of drawing or searching. What each path costs at its caps is benchmarks/ work; these check only
that the cap is met first."""

from __future__ import annotations

import copy
import json

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


def _calibration_runs(family: str) -> list[dict]:
    from planner.fidelity.cases import DEFAULT_FILES, load_cases
    return [c for f in DEFAULT_FILES for c in load_cases(f) if c["group"] == family]


def test_calibrate_refuses_more_runs_than_its_cap_before_pricing_any(monkeypatch):
    import planner.fidelity.calibrate as cal
    one = _calibration_runs("megatron2021_table1")[0]
    runs = [{**one, "name": f"run-{i}"} for i in range(cal.MAX_CALIBRATION_RUNS + 1)]
    monkeypatch.setattr(cal, "case_setup", lambda case: pytest.fail("priced a run"))
    with pytest.raises(PlanInputError, match="at most 64 runs, got 65"):
        cal.calibrate_to_runs(runs, ("matmul",))


def test_the_linear_leave_one_out_matches_refitting(monkeypatch):
    # the Gauss-Newton step that stands for each refit past EXACT_LOO_RUNS, forced onto a family
    # small enough to refit: the ten Megatron-LM 2021 runs, one factor and all three
    import planner.fidelity.calibrate as cal
    runs = _calibration_runs("megatron2021_table1")
    for factors in (("matmul",), tuple(cal.FACTORS)):
        refit = cal.calibrate_to_runs(runs, factors)
        monkeypatch.setattr(cal, "EXACT_LOO_RUNS", 0)
        step = cal.calibrate_to_runs(runs, factors)
        monkeypatch.undo()
        assert step.loo_errors_after == pytest.approx(refit.loo_errors_after, abs=1e-3)
        assert step.loo_errors_after != refit.loo_errors_after  # the two paths both ran


def _runs_file(tmp_path, edit) -> str:
    """A runs file of one bundled Megatron-LM run (tp 8, pp 2, dp 32 on 512 GPUs) edited."""
    run = copy.deepcopy(_calibration_runs("megatron2021_table1")[4])
    assert run["config"]["pp"] == 2 and run["cluster"]["gpus"] == 512
    edit(run)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([run]))
    return str(path)


def _set(section, **values):
    return lambda run: run[section].update(values)


@pytest.mark.parametrize("edit, message", [
    (_set("config", virtual_stages=1e15), "'virtual_stages' must be a count (a whole number"),
    (_set("config", virtual_stages=10**15), "pp 2 x virtual_stages 1000000000000000 = "
                                            "2,000,000,000,000,000 pipeline chunks; at most 256"),
    (_set("config", virtual_stages=0), "'virtual_stages' must be at least 1"),
    (_set("config", global_batch=2**31), "67,108,864 microbatches of 1 per DP rank; at most "
                                         "1,000,000"),
    (_set("cluster", gpus=2**31), "'gpus' must be positive, at most 32768"),
    (_set("config", pp=4096), "'pp' must be positive, at most 256"),
])
def test_a_runs_file_past_a_cap_is_one_line(tmp_path, edit, message):
    for command in (["validate", _runs_file(tmp_path, edit)],
                    ["calibrate", "--runs", _runs_file(tmp_path, edit)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_virtual_stages_a_run_leaves_unpublished_are_capped_too(tmp_path):
    # pp 256 over 1,024 layers: the smallest interleaving of 4 layers a stage is v = 2, 512 chunks
    def deep(run):
        run["model"]["layers"] = 1024
        run["config"].update(pp=256, dp=1, virtual_stages=None, global_batch=1024)
        run["cluster"]["gpus"] = 8 * 256
    result = runner.invoke(app, ["validate", _runs_file(tmp_path, deep)])
    assert result.exit_code == 2
    assert "pp 256 x 2 virtual stages = 512 pipeline chunks; at most 256" in result.output


def test_a_runs_file_holds_at_most_max_cases(tmp_path):
    from planner.fidelity.runs_schema import MAX_CASES
    run = _calibration_runs("megatron2021_table1")[0]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([{**run, "name": f"r{i}"} for i in range(MAX_CASES + 1)]))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and f"at most {MAX_CASES}" in result.output
