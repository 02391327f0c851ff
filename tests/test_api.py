"""The Python API (planner/api/): typed results whose frames agree with what the CLI prints."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from planner.core.errors import NoFeasiblePlan, PlanInputError

ROOT = Path(__file__).resolve().parent.parent


def test_solve_frame_matches_the_plans_best_first():
    from planner.api import solve

    result = solve(gpus=16, nodes=2, top=5)
    frame = result.to_frame()
    assert isinstance(frame, pd.DataFrame) and len(frame) == len(result.plans) == 5
    assert list(frame.index) == [1, 2, 3, 4, 5] and frame.index.name == "rank"
    assert frame["step_time_s"].is_monotonic_increasing
    best = result.best
    row = frame.loc[1]
    assert (row.tp, row.pp, row.dp) == (best.parallel.tp, best.parallel.pp, best.parallel.dp)
    assert row.peak_memory_bytes == int(best.metrics.peak_memory_bytes)
    assert (frame["tp"] * frame["pp"] * frame["dp"] == 16).all()


def test_stage_breakdown_covers_every_layer_once():
    from planner.api import solve

    result = solve(gpus=16, nodes=2, tp=1, pp=2, top=1)
    stages = result.stages().to_frame()
    assert len(stages) == result.best.parallel.num_chunks
    assert stages["first_layer"].iloc[0] == 0
    assert stages["last_layer"].iloc[-1] == len(result.best.model.layers)
    assert (stages["first_layer"].iloc[1:].values == stages["last_layer"].iloc[:-1].values).all()
    with pytest.raises(PlanInputError):
        result.stages(2)


def test_explain_partition_and_errors():
    from planner.api import explain, partition

    exp = explain(gpus=16, nodes=2, tp=2, pp=2, micro_batch=1)
    assert exp.fits and len(exp.to_frame()) == 2
    part = partition("llama3-8b", pp=4)
    frame = part.to_frame()
    assert list(frame.index) == ["min-bottleneck", "even", "equal parameters"]
    assert frame.loc["min-bottleneck", "step_time_s"] <= frame.loc["even", "step_time_s"]
    assert len(part.stages().to_frame()) == 4
    with pytest.raises(PlanInputError, match="must be positive"):
        explain(gpus=16, nodes=2, tp=0)
    with pytest.raises(NoFeasiblePlan):
        from planner.api import solve
        solve(gpus=1, nodes=1, model="llama3-405b")


def test_model_and_hardware_objects_are_accepted():
    from planner.api import solve
    from planner.hardware.profiles import load_hardware
    from planner.model.load import load_model

    a = solve(gpus=8, nodes=1, model=load_model("llama2-7b"), hardware=load_hardware("h100"),
              top=1)
    b = solve(gpus=8, nodes=1, model="llama2-7b", gpu="h100", top=1)
    assert a.to_frame().equals(b.to_frame())


def test_validate_frame_has_one_row_per_case_with_the_errors():
    from planner.api import validate

    v = validate()
    frame = v.to_frame()
    assert len(frame) == v.summary.cases
    evaluated = frame["time_error"].notna().sum()
    assert evaluated == v.summary.evaluated
    assert frame["time_error"].abs().max() == pytest.approx(v.summary.max_abs_time_error)


def test_the_package_exports_the_api_lazily_and_the_cli_stays_light():
    """`import planner` must not load the search or pandas (plan --help stays fast); the names
    load on first use, and `from planner import partition` is the function, not the module."""
    code = ("import sys, planner; assert 'pandas' not in sys.modules; "
            "assert 'planner.search' not in sys.modules; "
            "from planner import solve, explain, partition, validate, profile; "
            "assert all(callable(f) for f in (solve, explain, partition, validate, profile)); "
            "assert partition.__module__ == 'planner.api.planning', partition")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    cli = "import sys, cli; assert 'pandas' not in sys.modules, 'the CLI imports pandas'"
    subprocess.run([sys.executable, "-c", cli], check=True, cwd=ROOT)


def test_readme_one_liner_prints_a_frame():
    code = "from planner import solve; print(solve(gpus=16, nodes=2).to_frame())"
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                         capture_output=True, text=True).stdout
    assert "rank" in out and "tp" in out and "[10 rows x 23 columns]" in out  # 20 + cp, ep, etp


def test_api_names_are_functions_whatever_was_imported_first():
    """No sub-package shares a name with an API function, so importing the planner's modules
    first cannot turn `from planner import partition` into a package."""
    import subprocess
    import sys

    code = ("import planner.partitioning.solve, planner.profiling.profiler, planner.search.solver\n"
            "from planner import partition, profile, solve\n"
            "assert all(callable(f) for f in (partition, profile, solve))")
    subprocess.run([sys.executable, "-c", code], check=True)
