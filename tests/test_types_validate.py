"""Types that validate themselves (issue #31 item 4): a Hardware, ModelSpec, runs file or plan.json
that breaks its schema is refused where it is built, in one PlanInputError line naming the field."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.core.errors import PlanInputError
from planner.hardware.power import power_limited
from planner.hardware.profiles import Hardware, bundled_hardware, load_hardware, make_cluster

BASE = dict(name="x", peak_tflops=989, memory_gib=80, memory_bandwidth_gbps=3350,
            intra_node_gbps=450, inter_node_gbps=50)


@pytest.mark.parametrize("field,value,words", [
    ("peak_tflops", 0, "'peak_tflops' must be positive"),  # was ZeroDivisionError at prediction
    ("peak_tflops", -1, "'peak_tflops' must be positive"),
    ("peak_tflops", math.nan, "'peak_tflops' must be a finite number"),
    ("peak_tflops", math.inf, "'peak_tflops' must be a finite number"),
    ("peak_tflops", "989", "'peak_tflops' must be a number"),
    ("memory_gib", True, "'memory_gib' must be a number"),
    ("gpus_per_node", 8.0, "'gpus_per_node' must be a whole number"),
    ("rail_optimized", "no", "'rail_optimized' must be true or false"),
    ("matmul_efficiency", 5.0, "'matmul_efficiency' must be positive, at most 1"),
    ("name", "", "'name' must not be empty"),
    ("name", "h100\n\x1b[31m", "'name' contains the control"),
])
def test_hardware_refuses_a_bad_field_in_its_constructor(field, value, words):
    with pytest.raises(PlanInputError, match=f"^Hardware {words}"):
        Hardware(**{**BASE, field: value})


def test_hardware_nics_come_in_pairs():
    with pytest.raises(PlanInputError, match="give both or neither"):
        Hardware(**BASE, nics_per_node=4)


def test_every_bundled_profile_still_builds():
    profiles = bundled_hardware()
    assert len(profiles) >= 10
    assert all(isinstance(hw, Hardware) for hw in profiles.values())


def test_replace_is_checked_too():
    with pytest.raises(PlanInputError, match="'peak_tflops'"):
        replace(load_hardware("h100"), peak_tflops=0)


@pytest.mark.parametrize("limit", [math.nan, math.inf, -math.inf, 0, -5])
def test_power_limit_must_be_finite_and_positive(limit):
    """nan read as full power before: min(1.0, nan) is 1.0."""
    with pytest.raises(PlanInputError, match="power limit must be positive, finite watts"):
        power_limited(load_hardware("h100"), limit)


@pytest.mark.parametrize("gpus,nodes,words", [
    ("16", 2, "--gpus must be a whole number"), (True, 1, "--gpus must be a whole number"),
    (16, 2.0, "--nodes must be a whole number"), (4096, 1, "puts 4096 GPUs in one node"),
])
def test_cluster_counts_are_whole_numbers(gpus, nodes, words):
    with pytest.raises(PlanInputError, match=words):
        make_cluster(load_hardware("h100"), gpus, nodes)
