"""The engine's per-action costs (planner/engine/costs.py, Stack.pipeline_action_overhead_s and
split_backward_overhead): the measurement recovers a known cost, plan.json carries the costs of
its stack to `plan simulate --plan`, and a hostile value there is one line, not a traceback."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.engine.costs import implied_action_overhead
from planner.launchers import plan_json
from planner.pipeline.job import on_stack, run_simulation, simulation_job
from planner.stack import load_stack
from test_export import make_plan


@pytest.mark.parametrize("schedule,v,pp,m", [("gpipe", 1, 2, 8), ("1f1b", 1, 4, 8),
                                             ("interleaved", 2, 2, 8), ("zb-h1", 1, 2, 6),
                                             ("zb-2p", 1, 4, 12)])
@pytest.mark.parametrize("cost", [0.0, 0.0004, 0.0031])
def test_the_measurement_recovers_a_known_per_action_cost(schedule, v, pp, m, cost):
    """A 'measured' step made by the simulator with a known per-action cost gives that cost back
    (bisection on the simulator, to well under a microsecond)."""
    chunks = pp * v
    job = simulation_job(pp, m, schedule, v, ",".join(["0.02"] * chunks), 0.0005, None)
    measured = run_simulation(replace(job, action_s=cost)).makespan_s
    assert implied_action_overhead(job, measured) == pytest.approx(cost, abs=1e-7)
    # a run faster than the compute alone implies no cost at all
    assert implied_action_overhead(job, run_simulation(job).makespan_s * 0.9) == 0.0


def _plan_file(tmp_path, stack):
    base = make_plan()
    plan = replace(base, stack=stack,
                   stages=tuple(replace(s, fwd_s=0.01, bwd_s=0.03, wgrad_s=0.01, send_s=0.0)
                                for s in base.stages))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_json.document(plan)))
    return path


def test_simulate_plan_charges_the_costs_of_the_plans_stack(tmp_path):
    titan = load_stack("torchtitan")
    path = _plan_file(tmp_path, titan)
    job = simulation_job(None, None, None, None, None, None, path)
    assert (job.action_s, job.split_backward) == (titan.pipeline_action_overhead_s,
                                                  titan.split_backward_overhead)
    plain = run_simulation(replace(job, action_s=0.0, split_backward=0.0)).makespan_s
    pp, m = job.p, job.m
    # 1F1B with equal stages: 2 (m + pp - 1) actions on the critical path, each charged once
    assert run_simulation(job).makespan_s == pytest.approx(
        plain + 2 * (m + pp - 1) * titan.pipeline_action_overhead_s)
    # --stack replaces the plan's stack's costs
    assert on_stack(job, load_stack("megatron-core")).action_s == 0.0


@pytest.mark.parametrize("value", ['"fast"', "-1", "1e9", "true"])
def test_a_hostile_stack_value_in_plan_json_is_one_line(tmp_path, value):
    path = _plan_file(tmp_path, load_stack("torchtitan"))
    doc = json.loads(path.read_text())
    text = json.dumps(doc).replace('"pipeline_action_overhead_s": 0.0019',
                                   f'"pipeline_action_overhead_s": {value}')
    assert text != json.dumps(doc)
    path.write_text(text)
    with pytest.raises(PlanInputError, match="pipeline_action_overhead_s"):
        simulation_job(None, None, None, None, None, None, path)
    result = CliRunner().invoke(app, ["simulate", "--plan", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_split_backward_measurement_runs_on_torch():
    pytest.importorskip("torch")
    from planner.engine.costs import split_backward_times
    fused, inputs, weights = split_backward_times(32, 1, 1, 8, repeats=3)
    assert 0 < fused < 1 and 0 < inputs < 1 and 0 < weights < 1
