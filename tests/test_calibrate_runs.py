"""plan calibrate --runs: efficiency factors fitted to measured runs, honest about what it buys."""

import copy
import json

import pytest
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.fidelity.calibrate import FACTORS, _with, calibrate_to_runs
from planner.fidelity.cases import DEFAULT_FILES, load_cases
from planner.fidelity.published import validate_case
from planner.hardware.profiles import load_hardware, load_hardware_file

import numpy as np

CASES = [c for f in DEFAULT_FILES for c in load_cases(f)]


def group(name):
    return [c for c in CASES if c["group"] == name]


def synthetic(cases, profile, truth):
    """The same runs, 'measured' on hardware whose factors are the profile's times ``truth``:
    the model's own predictions, so an exact fit exists."""
    names = tuple(truth)
    hw = _with(load_hardware(profile), names, np.log([truth[n] for n in names]))
    out = []
    for c in cases:
        c = copy.deepcopy(c)
        c["measured"]["step_time_s"] = validate_case(c, simulated=False, hardware=hw).predicted_step_s
        out.append(c)
    return out, hw


def test_recovers_known_factors_from_synthetic_runs_within_two_percent():
    # flash-attention FSDP runs on 64 A100s depend on all three: matmuls, attention, the network
    truth = {"matmul": 0.9, "attention": 0.8, "network": 0.7}
    runs, hw = synthetic(group("torchtitan_a100_fsdp2"), "a100-80gb", truth)
    cal = calibrate_to_runs(runs, tuple(truth))
    assert cal.not_identified == ()
    for name in truth:
        assert cal.value(cal.fitted, name) == pytest.approx(cal.value(hw, name), rel=0.02)
    assert max(abs(e) for e in cal.errors_after) < 0.005
    assert cal.loo_after < 0.01


def test_cuts_leave_one_out_error_on_a_real_family():
    # llm-foundry's six MPT runs on H100 are predicted 23% fast on average with the bundled
    # profile; one matmul factor fitted on five of them predicts the sixth far better
    cal = calibrate_to_runs(group("llmfoundry_mpt_h100_80gb"), ("matmul",))
    assert cal.loo_before > 0.15
    assert cal.loo_after < cal.loo_before / 2


def test_a_factor_no_run_depends_on_is_left_alone():
    # the 2021 Megatron runs use unfused attention: the flash-attention factor prices nothing
    runs = group("megatron2021_table1")[:4]
    cal = calibrate_to_runs(runs, ("matmul", "attention"))
    assert cal.not_identified == ("attention",)
    assert cal.value(cal.fitted, "attention") == cal.value(cal.profile, "attention")


def test_refuses_fewer_runs_than_factors():
    with pytest.raises(PlanInputError, match="needs at least 3 runs.*got 2"):
        calibrate_to_runs(group("torchtitan_a100_fsdp2")[:2], tuple(FACTORS))


def test_refuses_runs_on_several_gpu_kinds():
    runs = group("llmfoundry_mpt_h100_80gb")[:2] + group("llmfoundry_mpt_a100_80gb")[:2]
    with pytest.raises(PlanInputError, match="several GPU kinds"):
        calibrate_to_runs(runs, ("matmul",))


def test_cli_writes_a_profile_that_validate_and_solve_accept(tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(group("llmfoundry_mpt_h100_80gb")))
    out = tmp_path / "h100-mine.json"
    cli = CliRunner()
    res = cli.invoke(app, ["calibrate", "--runs", str(runs), "--factors", "matmul",
                           "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "leave-one-out" in res.output
    hw = load_hardware_file(out)
    assert "plan calibrate on 6 runs" in json.loads(out.read_text())["sources"]["matmul_efficiency"]
    assert hw.matmul_efficiency < load_hardware("h100-sxm-80gb").matmul_efficiency
    again = cli.invoke(app, ["calibrate", "--runs", str(runs), "--factors", "matmul",
                             "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    val = cli.invoke(app, ["validate", "--runs", str(runs), "--hardware", str(out)])
    assert val.exit_code == 0, val.output
    solve = cli.invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--hardware", str(out)])
    assert solve.exit_code == 0, solve.output


def test_cli_refuses_unknown_factor_in_one_line(tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(group("llmfoundry_mpt_h100_80gb")))
    res = CliRunner().invoke(app, ["calibrate", "--runs", str(runs), "--factors", "matmul,tflops"])
    assert res.exit_code == 2 and "--factors" in res.output and "Traceback" not in res.output
