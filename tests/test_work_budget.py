"""The work budget of a runs file (planner/fidelity/work.py, issue #31): the ops its pipeline
simulations walk, counted before any run is priced. The counts must match what the simulator and
the time-step table build, or the budget bounds nothing."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.core.schedules import SCHEDULES, schedule_traits
from planner.fidelity import published
from planner.fidelity.cases import DEFAULT_FILES, case_setup, load_cases
from planner.fidelity.work import MAX_PIPELINE_OPS, case_work
from planner.pipeline import simulate as sim
from planner.pipeline.schedule import build_schedule
from planner.pipeline import timestep
from planner.pipeline.timestep import interleaved_slots, interleaved_steps

runner = CliRunner()


def _built(name: str, p: int, m: int, v: int) -> int:
    return sum(len(ops) for ops in build_schedule(name, p, m, v))


def _shapes():
    for name in SCHEDULES:
        for p in (2, 4, 6):
            for v in ((2, 3) if schedule_traits(name).takes_virtual_stages else (1,)):
                for m in (2 * p, 4 * p, 5 * p):
                    yield name, p, m, v


@pytest.mark.parametrize("name, p, m, v", list(_shapes()))
def test_the_ops_counted_are_the_ops_a_short_simulation_builds(name, p, m, v):
    # runs of at most FULL_UP_TO microbatches are built whole; DualPipe's F&B pairs fuse two
    # ops into one, so its count is a bound, every other schedule's the very number
    built, counted = _built(name, p, m, v), sim.simulated_ops(name, p, m, v)
    if schedule_traits(name).mirrored:
        assert built <= counted <= 2 * built
    else:
        assert counted == built


@pytest.mark.parametrize("name", [s for s in SCHEDULES if schedule_traits(s).periodic])
@pytest.mark.parametrize("p", [2, 3, 4, 8, 12, 16, 24])
def test_every_first_short_run_holds_its_cut(name, p):
    # what simulated_ops assumes: a long run builds its first short run and one period more,
    # not a doubled one (ZB-2p's default 2p + 4 had none, and was doubled every time)
    traits = schedule_traits(name)
    if traits.mirrored and p % 2:
        return
    v = 2 if traits.takes_virtual_stages else 1
    short, group = sim._first_short_run(name, p, v), sim._group(name, p)
    assert sim._steady_cut(name, p, v, short, group) is not None
    m = max(sim.FULL_UP_TO + 1, 2 * short + 1)
    if traits.mirrored:
        m += m % 2
    assert sim.simulated_ops(name, p, m, v) == (_built(name, p, short, v)
                                                + _built(name, p, short + group, v)) \
        or traits.mirrored


def test_gpipe_past_its_drawn_run_builds_nothing():
    assert sim.simulated_ops("gpipe", 4, 10**6) == 0


@pytest.mark.parametrize("p, m, v", [(1, 1, 1), (2, 4, 2), (4, 8, 3), (3, 9, 4), (4, 5, 2),
                                     (8, 16, 2), (5, 7, 1), (6, 30, 3), (4, 400, 2),
                                     (8, 1024, 2), (3, 300, 4)])
def test_the_time_step_slots_counted_bound_the_walk(p, m, v):
    # the walk steps every rank at every column it walks; a short run, with no steady period to
    # skip, walks every column of the table, a longer one fewer, and never more than counted
    chunks = p * v
    fwd = [1.0 + 0.1 * (k % 3) for k in range(chunks)]
    bwd = [2.0 + 0.05 * k for k in range(chunks)]
    work = timestep._walk(p, m, v, fwd, bwd, [0.01] * (chunks - 1), 0.001)[1]
    whole = p * max(len(row) for row in interleaved_steps(p, m, v))
    assert work <= interleaved_slots(p, m, v) <= whole
    first, stop, period, _ = timestep._window(p, m, v)
    if stop - first < 2 * period:  # no two steady periods to compare
        assert work == interleaved_slots(p, m, v) == whole
    else:
        assert work < whole
    if m >= 100 * p:
        assert interleaved_slots(p, m, v) < whole / 2


def _bundled() -> list[dict]:
    return [case for f in DEFAULT_FILES for case in load_cases(f)]


def test_the_bundled_runs_fit_the_budget_several_times_over():
    # the bench's 256-run file repeats them: 256 / 82 of their work must fit too
    work = sum(case_work(case_setup(case)) for case in _bundled())
    assert 0 < work * 256 / len(_bundled()) <= MAX_PIPELINE_OPS


def _deep(runs: int, schedule: str = "ZB-2p", pp: int = 256) -> list[dict]:
    zb = next(c for c in _bundled() if c["name"] == "zerobubble-1.5B-ZB-2p-m24")
    out = []
    for i in range(runs):
        run = copy.deepcopy(zb)
        run["name"] = f"deep-{i}"
        run["model"]["layers"] = 1024
        run["config"].update(pp=pp, schedule=schedule, micro_batch=1, global_batch=10**6)
        run["cluster"]["gpus"] = pp
        out.append(run)
    return out


def test_a_file_over_the_budget_is_refused_before_any_run_is_priced(tmp_path, monkeypatch):
    runs = _deep(2)
    assert case_work(case_setup(runs[0])) <= MAX_PIPELINE_OPS < 2 * case_work(case_setup(runs[0]))
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    monkeypatch.setattr(published, "predict_plan", lambda *a, **k: pytest.fail("priced a run"))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "3,171,840 ops; at most 1,600,000" in result.output
    assert "'deep-0' (zb-2p pp 256 v 1, M 1,000,000)" in result.output
    assert "split the file" in result.output


def test_one_run_over_the_budget_is_told_to_shrink_not_to_split():
    # the largest interleaved run the schema allows (pp 128 x v 2, M 999,936: its simulation
    # alone fits) on torch 2.6's lockstep time steps: the walk's 128-rank periods and its
    # fallback's 128 x 128 max-plus products, counted element by element, do not
    run = next(c for c in _bundled() if c["name"] == "megatron2021-table1-39.1B")
    run = copy.deepcopy(run)
    run["model"]["layers"] = 1024
    run["config"].update(pp=128, dp=1, virtual_stages=None, global_batch=999_936)
    run["cluster"]["gpus"] = 128 * run["config"]["tp"]
    plain = copy.deepcopy(run)
    run["stack_overrides"] = {"pipeline_timesteps": True}
    assert case_work(case_setup(plain)) <= MAX_PIPELINE_OPS < case_work(case_setup(run))
    with pytest.raises(PlanInputError, match="give it fewer pipeline chunks") as e:
        published.validate_cases([run])
    assert "split" not in str(e.value)


def test_the_budget_spans_every_file_given(monkeypatch):
    # two files each within the budget are one validation beyond it
    import planner.fidelity.work as work
    files = list(DEFAULT_FILES)
    each = [sum(case_work(case_setup(case)) for case in load_cases(f)) for f in files]
    monkeypatch.setattr(work, "MAX_PIPELINE_OPS", max(each))
    for f in files:
        work.check_work(published.case_setups(load_cases(f)), str(f))
    with pytest.raises(PlanInputError, match=f"the {len(files)} runs files: its runs' pipelines"):
        published.validate_file(files)


def test_calibrate_counts_its_many_pricings_and_refuses_before_any(monkeypatch):
    # calibrate prices without the simulation (no simulated ops), but walks a time-step table
    # at each of up to CALIBRATION_PRICINGS pricings of a run
    import planner.fidelity.calibrate as cal
    from planner.fidelity.work import CALIBRATION_PRICINGS
    run = copy.deepcopy(next(c for c in _bundled() if c["name"] == "megatron2021-table1-39.1B"))
    run["model"]["layers"] = 64
    run["config"].update(pp=8, dp=1, virtual_stages=None, global_batch=8 * 64)
    run["cluster"]["gpus"] = 8 * run["config"]["tp"]
    plain = copy.deepcopy(run)
    run["stack_overrides"] = {"pipeline_timesteps": True}
    assert case_work(case_setup(plain), simulated=False) == 0
    slots = case_work(case_setup(run), simulated=False)
    assert slots == interleaved_slots(8, 8 * 64, 2)
    assert slots <= MAX_PIPELINE_OPS < slots * CALIBRATION_PRICINGS
    monkeypatch.setattr(cal, "validate_case", lambda *a, **k: pytest.fail("priced a run"))
    runs = [{**plain, "name": "a"}, {**run, "name": "b"}]
    with pytest.raises(PlanInputError, match=f"each priced up to {CALIBRATION_PRICINGS} times.*"
                                             "The heaviest, 'b'"):
        cal.calibrate_to_runs(runs, ("matmul",))
