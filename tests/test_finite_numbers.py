"""Finite numbers end to end (issue #31 item 3): a number too large, too small or not finite, in a
flag or a file, is one line naming it and exit 2, never a traceback, an inf step time or NaN in a
chart; and flags that a saved plan fixes are refused beside --plan, not silently ignored.

Each case is a command that crashed or printed nonsense before (written beside it).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from planner.core.arguments import finite
from planner.core.errors import PlanInputError
from planner.core.limits import MAX_BUDGET_S, MAX_PASS_S, MIN_PASS_S
from planner.fidelity.calibrate import FACTORS, _with
from planner.hardware.profiles import load_hardware
from test_hostile import TINY, assert_clean_failure, invoke, write

GOLDEN_PLAN = Path(__file__).resolve().parent / "golden" / "plan.json"
RUNS = Path(__file__).resolve().parent.parent / "profiles" / "validation" / "published_runs.json"


def refused(args, *names: str, as_json: bool = False) -> str:
    """Exit 2, no traceback, one line that names each of ``names``."""
    line = assert_clean_failure(invoke(args), codes=(2,), as_json=as_json)
    for name in names:
        assert name in line, (name, line)
    return line


def simulate(*extra):
    return ["simulate", "--pp", "2", "--microbatches", "4", *extra]


# --- 1. plan simulate --stage-times 1e308,1e308: ZeroDivisionError in the Gantt, NaN in the SVG --

@pytest.mark.parametrize("times", ["1e308,1e308", "1,inf", "nan,1", "1,-1", "0,1", "5e-324,1",
                                   f"{MAX_PASS_S * 2:g},1"])
def test_stage_times_out_of_range_are_one_line(tmp_path, times):
    svg = tmp_path / "chart.svg"
    line = refused(simulate("--stage-times", times, "--svg", svg), "--stage-times")
    assert "value" in line and not svg.exists()


def test_stage_times_as_json_error_document():
    refused(simulate("--stage-times", "1e308,1e308", "--json"), "--stage-times", as_json=True)


# --- 2. plan simulate --comm-time 1e308: "step inf s" and an SVG with NaN coordinates ------------

@pytest.mark.parametrize("comm", ["1e308", "inf", "nan", "-1", f"{MAX_PASS_S * 2:g}"])
def test_comm_time_out_of_range_is_one_line(tmp_path, comm):
    svg = tmp_path / "chart.svg"
    refused(simulate("--comm-time", comm, "--svg", svg), "--comm-time")
    assert not svg.exists()


def test_times_at_the_caps_stay_finite_in_table_json_and_svg(tmp_path):
    for value in (MAX_PASS_S, MIN_PASS_S):
        times = ",".join([f"{value:g}"] * 2)
        svg = tmp_path / f"{value:g}.svg"
        args = simulate("--stage-times", times, "--comm-time", f"{value:g}", "--svg", svg)
        result = invoke([*args, "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
        assert math.isfinite(doc["makespan_s"]) and doc["makespan_s"] > 0
        text = svg.read_text().lower()
        assert "nan" not in text and "inf" not in text
        shown = invoke(simulate("--stage-times", times, "--comm-time", f"{value:g}"))
        assert shown.exit_code == 0 and "step inf" not in shown.stdout


# --- 3. plan profile --budget-s 1e308: OverflowError (the repeat count) -------------------------

@pytest.mark.parametrize("budget", ["1e308", "inf", "nan", "0", "-1", f"{MAX_BUDGET_S * 2:g}"])
def test_profile_budget_out_of_range_is_one_line(tmp_path, budget):
    model = write(tmp_path, "tiny.json", TINY)
    refused(["profile", model, "--budget-s", budget], "--budget-s")
    refused(["profile", "--calibrate", "--budget-s", budget], "--budget-s")


# --- 4. a profile whose block time is 1e308, fed to plan solve --profile: PartitionError ---------

def _profile(**block) -> dict:
    """A profile of TINY: embedding, four blocks sharing one timing, head."""
    def timing(kind, **values):
        return {"kind": kind, "fwd_s": 1e-4, "bwd_input_s": 1e-4, "bwd_weight_s": 1e-4,
                "fwd_flops": 1e7, "bwd_input_flops": 1e7, "bwd_weight_flops": 1e7, **values}

    return {"schema": "plan3d/profile/v1", "model_name": "tiny", "device": "cpu",
            "device_name": "cpu", "dtype": "float32", "tp": 1, "micro_batch": 1,
            "seq_len": 64, "timings": [timing("embedding"), timing("block", **block),
                                       timing("head")],
            "layer_timing": [0, 1, 1, 1, 1, 2], "environment": {}}


def _solve_profile(tmp_path, doc):
    model = write(tmp_path, "tiny.json", TINY)
    profile = write(tmp_path, "prof.json", doc)
    return ["solve", "--model", model, "--gpus", "4", "--nodes", "1", "--profile", profile]


def test_a_profile_at_its_caps_plans(tmp_path):
    at_cap = _profile(fwd_s=MAX_PASS_S, bwd_input_s=MAX_PASS_S, bwd_weight_s=MAX_PASS_S,
                      fwd_flops=1e20, bwd_input_flops=1e20, bwd_weight_flops=1e20)
    result = invoke([*_solve_profile(tmp_path, at_cap), "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


@pytest.mark.parametrize("block,field", [
    ({"fwd_s": 1e308}, "fwd_s"),
    ({"bwd_weight_s": MAX_PASS_S * 2}, "bwd_weight_s"),
    ({"fwd_flops": 1e308}, "fwd_flops"),
    ({"fwd_bytes": 1e308}, "fwd_bytes"),
    ({"fwd_flops": 1e-300, "fwd_s": 1.0}, "fwd_flops"),  # 1e-300 FLOP/s: scaled to inf seconds
])
def test_profile_timings_out_of_range_are_one_line(tmp_path, block, field):
    refused(_solve_profile(tmp_path, _profile(**block)), "prof.json", "timings[1]", field)


@pytest.mark.parametrize("peak", [1e-300, 1e308, "fast"])
def test_profile_peak_out_of_range_is_one_line(tmp_path, peak):
    doc = {**_profile(), "environment": {"peak": {"matmul_tflops": peak}}}
    refused(_solve_profile(tmp_path, doc), "prof.json", "matmul_tflops")


# --- 5. plan calibrate with a run's step time 1e-300: OverflowError in exp() ---------------------

def _runs(tmp_path, step_time_s: float, runs: int = 3) -> Path:
    cases = json.loads(RUNS.read_text())
    gpu = cases[0]["cluster"]["gpu"]
    same = [c for c in cases if c["cluster"].get("gpu") == gpu][:runs]
    same[0]["measured"]["step_time_s"] = step_time_s
    return write(tmp_path, "runs.json", same)


@pytest.mark.parametrize("step", [1e-300, 1e-5, 1e12])
def test_calibrate_step_time_out_of_range_is_one_line(tmp_path, step):
    refused(["calibrate", "--runs", _runs(tmp_path, step), "--factors", "matmul"],
            "runs.json", "step_time_s")


@pytest.mark.parametrize("step", [1e-4, 1e9])
def test_calibrate_run_far_off_its_prediction_is_named(tmp_path, step):
    # within the schema's range, but thousands of times off: a unit slip, not an efficiency
    cases = json.loads(RUNS.read_text())
    refused(["calibrate", "--runs", _runs(tmp_path, step), "--factors", "matmul"],
            f"run '{cases[0]['name']}'", "step_time_s", "apart")


def test_calibration_trial_steps_never_overflow():
    hw = load_hardware("a100-80gb")
    for x in (1e4, -1e4, 1e308):
        fitted = _with(hw, tuple(FACTORS), np.full(len(FACTORS), x))
        for field, _ in FACTORS.values():
            value = getattr(fitted, field)
            assert math.isfinite(value) and 0 < value <= 1


# --- 6. plan simulate --plan plan.json --pp 4 -M 8: the pins were silently ignored ---------------

@pytest.fixture
def saved_plan(tmp_path) -> Path:
    return Path(shutil.copy(GOLDEN_PLAN, tmp_path / "saved.json"))


def test_a_saved_plan_simulates_alone(saved_plan):
    result = invoke(["simulate", "--plan", saved_plan])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("flags,named", [
    (["--pp", "4", "-M", "8"], ["--pp", "--microbatches/-M"]),
    (["--schedule", "1f1b"], ["--schedule"]),
    (["--virtual-stages", "1"], ["--virtual-stages"]),
    (["--stage-times", "1,1,1,1"], ["--stage-times"]),
    (["--comm-time", "0"], ["--comm-time"]),
])
def test_flags_beside_a_saved_plan_are_refused(saved_plan, flags, named):
    line = refused(["simulate", "--plan", saved_plan, *flags], *named, "--plan")
    assert "drop" in line


# --- the guard behind the caps -----------------------------------------------------------------

@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_finite_names_the_number_and_what_to_do(value):
    with pytest.raises(PlanInputError, match="the step time came out as .*; lower the times"):
        finite("the step time", value, "lower the times")
    assert finite("the step time", 1.5, "lower the times") == 1.5


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["config"].update(tp=7), "tp 7 does not divide the model's 24 attention heads"),
    (lambda c: c["cluster"].update(gpus=33), "tp x cp x pp x dp = 32, but cluster.gpus is 33"),
    (lambda c: c["config"].update(virtual_stages=True), "'virtual_stages' must be a count"),
])
def test_a_runs_file_describing_no_run_is_one_line(edit, message):
    """#31: fields each valid alone, together no run (it was priced anyway: tp 7 read -73%)."""
    import copy

    from planner.fidelity.cases import DEFAULT_FILE, load_cases
    from planner.fidelity.runs_schema import check_runs_document
    case = copy.deepcopy(next(c for c in load_cases(DEFAULT_FILE)
                              if c["name"] == "megatron2021-table1-1.7B"))
    edit(case)
    with pytest.raises(PlanInputError, match=message.replace("(", r"\(")):
        check_runs_document([case], "runs.json")
