"""A board power limit below the rated power lowers the tensor peak (hardware/power.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.fidelity.case_cluster import case_cluster
from planner.fidelity.cases import load_cases
from planner.hardware.power import POWER_EXPONENT, clock_fraction, power_limited
from planner.hardware.profiles import hardware_from_dict, load_hardware
from planner.core.units import DATA_DIR


def test_the_law_read_from_two_datasheet_points_is_the_dvfs_cube_root():
    # NVIDIA's H100 product page: SXM 989 dense BF16 at 700 W, NVL 835.5 at 400 W (same die).
    # Dynamic power P ~ f V^2 with V ~ f gives f ~ P^(1/3); the two points agree within 10%.
    assert POWER_EXPONENT == pytest.approx(0.3015, abs=0.0005)
    assert POWER_EXPONENT == pytest.approx(1 / 3, rel=0.10)


def test_torchtitan_500w_h100_lands_between_sxm_and_nvl():
    # torchtitan docs/performance.md: "We used the default 500W power limit"; "the actual peak
    # TFLOPs number is between SXM and NVL, and we don't know its exact value".
    capped = power_limited(load_hardware("h100"), 500)
    assert 835.5 < capped.peak_tflops < 989
    assert capped.peak_tflops == pytest.approx(894, abs=1)
    assert capped.peak_fp8_tflops == pytest.approx(1979 * capped.peak_tflops / 989)
    assert capped.memory_bandwidth_gbps == 3350  # HBM keeps its own clock
    assert "500 W" in capped.name


@given(st.floats(1, 2000), st.floats(1, 2000))
def test_a_lower_limit_never_raises_the_peak(a, b):
    low, high = sorted((a, b))
    assert clock_fraction(700, low) <= clock_fraction(700, high) <= 1.0


def test_at_or_above_the_rated_power_nothing_changes():
    h100 = load_hardware("h100")
    assert power_limited(h100, 700) is h100 and power_limited(h100, 900) is h100


def test_refusals_name_what_is_missing():
    with pytest.raises(PlanInputError, match="tdp_w"):
        power_limited(load_hardware("a100"), 300)
    with pytest.raises(PlanInputError, match="positive"):
        power_limited(load_hardware("h100"), 0)
    base = json.loads((DATA_DIR / "hardware" / "h100-sxm-80gb.json").read_text())
    with pytest.raises(PlanInputError, match="tdp_w"):
        hardware_from_dict({**base, "tdp_w": -700}, "h.json")


def test_the_grand_teton_rows_are_priced_at_their_power_limit():
    rows = [c for c in load_cases(DATA_DIR / "validation" / "modern_runs.json")
            if c["cluster"].get("power_limit_w")]
    assert len(rows) == 7
    cluster, notes = case_cluster(rows[0])
    assert cluster.hardware.peak_tflops == pytest.approx(894, abs=1)
    assert any("power limit 500 W" in n for n in notes)


def test_cli_power_limit():
    # tp 2: at tp 1 the 8B model needs more than the H100's 79.65 GiB less the default headroom
    run = CliRunner().invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--gpu", "h100",
                                   "--power-limit", "500", "--tp", "2", "--pp", "1", "--top", "1"])
    assert run.exit_code == 0, run.output
    assert "h100-sxm-80gb at 500 W" in run.output
    run = CliRunner().invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--power-limit", "300"])
    assert run.exit_code == 2 and "tdp_w" in run.output and "Traceback" not in run.output
