"""Leave one source out (planner/fidelity/holdout.py, sources.py) and the error band every plan
carries (planner/fidelity/band.py)."""

import json
import jsonschema
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.fidelity.band import MIN_RUNS, ErrorBand, error_band, generation
from planner.fidelity.case_stack import case_stack
from planner.fidelity.holdout import (all_cases, held_out_case, held_out_rows,
                                      setting_effects, single_source_settings)
from planner.fidelity.published import validate_case, validate_file
from planner.fidelity.record import Family, families
from planner.fidelity.sources import ROW_CHOSEN, SOURCES, source_of
from planner.launchers import plan_json
from planner.stack import load_component, load_stack, with_overrides

runner = CliRunner()


@pytest.fixture(scope="module")
def priced():
    cases = all_cases()
    rows = validate_file()[0]
    return cases, rows, held_out_rows(cases, rows)


def test_every_bundled_group_belongs_to_a_listed_source():
    groups = {c["group"] for c in all_cases()}
    listed = {g for s in SOURCES for g in s.groups}
    assert groups == listed
    assert source_of("my_own_runs") == "my_own_runs"  # a user's group is its own source


def test_each_row_chosen_value_is_what_the_bundled_files_set():
    """The registry cannot drift from the files: each value is read back where it is set."""
    for chosen in ROW_CHOSEN:
        if chosen.origin == "component":
            assert dict(load_component(chosen.name).fields)[chosen.field] == chosen.value
        elif chosen.origin == "stack":
            assert getattr(load_stack(chosen.name), chosen.field) == chosen.value
        else:
            runs = [c for c in all_cases() if source_of(c["group"]) == chosen.source]
            assert {c["config"].get(chosen.name) for c in runs} == {chosen.value}


def test_held_out_pricing_is_the_case_priced_without_the_chosen_value(priced):
    """Two routes to one number: the held-out row, and the case priced on its own stack with
    the field set by hand."""
    cases, rows, held = priced
    case = next(c for c in cases if c["group"] == "bloom_sweep_0228")
    by_hand = with_overrides(case_stack(case), "test", host_s_per_block=0.0)
    expected = validate_case(case, dataset="old", stack=by_hand)
    got = next(h for h in held if h.case == case["name"])
    assert got.predicted_step_s == pytest.approx(expected.predicted_step_s, rel=1e-12)
    assert got.time_error < next(r for r in rows if r.case == case["name"]).time_error


def test_sources_that_chose_nothing_keep_their_in_sample_rows(priced):
    cases, rows, held = priced
    chose = {c.source for c in ROW_CHOSEN}
    for case, row, out in zip(cases, rows, held):
        if source_of(case["group"]) not in chose:
            assert held_out_case(case) is None and out is row


def test_validate_prints_held_out_beside_in_sample():
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 0, result.output
    assert "held out" in result.output and "in-sample" in result.output
    assert "each source held out: mean |error|" in result.output


def test_single_source_settings_are_set_by_one_source_only(priced):
    cases, rows, _ = priced
    found = single_source_settings(cases)
    fields = {(s.field, repr(s.value)) for s, _ in found}
    assert ("host_s_per_block", "0.0045") in fields
    # fused element-wise kernels: torchtitan's launch flag and Automodel's component both set it
    assert ("fused_elementwise", "True") not in fields
    for setting, runs in found:
        assert {source_of(c["group"]) for c in runs} == {setting.source}


def test_a_setting_priced_away_matches_the_held_out_value(priced):
    """BLOOM's host time priced away (--settings) is the held-out figure of the same runs."""
    cases, rows, held = priced
    bloom = [c for c in cases if source_of(c["group"]) == "bigscience"]
    effect = next(e for e in setting_effects(cases, rows) if e.setting.field == "host_s_per_block")
    assert set(effect.cases) == {c["name"] for c in bloom}
    by_case = {h.case: h.time_error for h in held}
    assert list(effect.without_errors) == pytest.approx([by_case[c] for c in effect.cases])


def test_settings_flag_refuses_other_flags_in_one_line():
    result = runner.invoke(app, ["validate", "--settings", "--cases"])
    assert result.exit_code != 0 and "give it alone" in result.output
    assert "Traceback" not in result.output


# --- the band ----------------------------------------------------------------------------------

def _family(stack="torchtitan", hardware="h100-sxm-80gb", kind="dense", runs=3, lo=-0.2,
            hi=-0.1, gpus=64, memory=None) -> Family:
    return Family(group="g", stack=stack, hardware=hardware, runs=runs, min_error=lo,
                  max_error=hi, mean_abs_error=0.15, kind=kind, min_gpus=gpus, max_gpus=gpus,
                  held_out_min_error=lo, held_out_max_error=hi, held_out_mean_abs_error=0.15,
                  memory_runs=1 if memory is not None else 0, min_memory_error=memory)


def test_band_from_comparable_runs_and_uncalibrated_elsewhere():
    record = (_family(), _family(stack="megatron-core", hardware="a100-80gb", lo=-0.05, hi=0.08,
                                 memory=-0.03))
    near = error_band(record, "torchtitan", "h100-mine", moe=False, gpus=64)
    assert near.calibrated and (near.low, near.high) == (-0.2, -0.1)
    far = error_band(record, "torchtitan", "b200", moe=False, gpus=64)
    assert not far.calibrated and "uncalibrated" in far.basis
    assert (far.low, far.high) == (-0.2, 0.08) and far.memory_under == -0.03


def test_published_run_lies_in_the_band_of_its_own_prediction(priced):
    """torchtitan's Llama 3.1 8B on 8 H100 (docs/performance.md: measured step time in the
    case) lies inside the band of the planner's prediction of that configuration."""
    _, rows, held = priced
    row = next(r for r in rows if r.case == "torchtitan-llama3.1-8b-8gpu-fsdp")
    band = error_band(families(rows, held), row.stack_name, row.hardware, False, row.gpus)
    lo, hi = band.step_range(row.predicted_step_s)
    assert band.calibrated and lo <= row.measured_step_s <= hi


@settings(max_examples=60, deadline=None)
@given(lo=st.floats(-0.9, 2.0), width=st.floats(0, 1.0), step=st.floats(1e-3, 1e4),
       mfu=st.floats(0.01, 1.0))
def test_band_ranges_are_ordered_and_consistent(lo, width, step, mfu):
    band = ErrorBand(low=lo, high=lo + width, runs=3, calibrated=True, basis="b",
                     memory_under=0.0)
    s_lo, s_hi = band.step_range(step)
    m_lo, m_hi = band.mfu_range(mfu)
    assert s_lo <= s_hi and m_lo <= m_hi
    # MFU is inverse to step time: the fastest step goes with the highest MFU
    assert s_lo * m_hi == pytest.approx(step * mfu) and s_hi * m_lo == pytest.approx(step * mfu)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["torchtitan", "megatron-core"]),
                          st.sampled_from(["a100-80gb", "h100-sxm-80gb", "b200"]),
                          st.integers(1, 12), st.floats(-0.5, 0.0), st.floats(0.0, 0.5)),
                min_size=1, max_size=6),
       st.sampled_from(["torchtitan", "megatron-core"]), st.sampled_from(["a100", "h100", "b200"]))
def test_uncalibrated_bands_are_never_narrower_than_calibrated_ones(fams, stack, gpu):
    record = tuple(_family(s, h, runs=n, lo=lo, hi=hi) for s, h, n, lo, hi in fams)
    band = error_band(record, stack, gpu, moe=False, gpus=64)
    widest = error_band(record, "no-such-stack", gpu, moe=False, gpus=64)
    assert not widest.calibrated
    assert widest.low <= band.low and band.high <= widest.high
    assert not band.calibrated or band.runs >= MIN_RUNS


def test_generation_by_profile_name():
    assert generation("h100-sxm-80gb") == generation("h800") == "Hopper"
    assert generation("a100-40gb") == "Ampere" and generation("mystery-gpu") == ""


def test_solve_json_carries_a_band_per_plan_that_the_schema_admits():
    result = runner.invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--model", "llama3-8b",
                                 "--gpu", "h100", "--stack", "torchtitan", "--json",
                                 "--top", "2"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)["plans"]
    validator = jsonschema.Draft202012Validator(plan_json.schema())
    for plan in plans:
        validator.validate(plan)
        band = plan["error_band"]
        assert band["calibrated"] and band["runs"] >= MIN_RUNS
        lo, hi = band["step_time_s"]
        step = plan["metrics"]["step_time_s"]
        low_err, high_err = band["errors"]
        assert lo == pytest.approx(step / (1 + high_err), rel=1e-5)
        assert hi == pytest.approx(step / (1 + low_err), rel=1e-5)


def test_solve_prints_the_band_line():
    result = runner.invoke(app, ["solve", "--gpus", "16", "--nodes", "2"])
    assert result.exit_code == 0, result.output
    assert "error band of plan 1" in result.output and "uncalibrated" in result.output


def test_the_python_api_frame_carries_the_held_out_error():
    from planner import api

    frame = api.validate().to_frame()
    row = frame.loc["bloom-176B-production"]
    assert row.held_out_time_error < row.time_error < 0  # its host time was fitted on BLOOM
    untouched = frame.loc["megatron2021-table1-1.7B"]
    assert untouched.held_out_time_error == untouched.time_error
