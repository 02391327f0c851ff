"""Memory that holds in practice (#30 item 2): the usable capacity the driver reports, and the
headroom a plan keeps (planner/hardware/profiles.py Cluster.capacity_bytes, fidelity/band.py)."""

import json

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.core.units import GIB
from planner.fidelity.band import default_headroom
from planner.hardware.profiles import Cluster, load_hardware

runner = CliRunner()


def test_h100_capacity_is_what_the_driver_reports():
    """nvidia-smi's total for an 'NVIDIA H100 80GB HBM3' is 81559MiB (public nvidia-smi logs),
    not the datasheet's 80 GB."""
    for name in ("h100-sxm-80gb", "h800"):
        assert load_hardware(name).memory_gib == pytest.approx(81559 / 1024, abs=0.005)


def test_cluster_checks_its_headroom():
    hw = load_hardware("a100-80gb")
    assert Cluster(hw, 1, 8, memory_headroom=0.1).capacity_bytes == pytest.approx(72 * GIB)
    for bad in (-0.1, 0.9, True, "0.1", float("nan")):
        with pytest.raises(PlanInputError, match="memory-headroom"):
            Cluster(hw, 1, 8, memory_headroom=bad)


def test_default_headroom_is_the_worst_memory_under_estimate_of_comparable_runs():
    """Megatron-Core on A100 is uncalibrated: the band spans every dense run, whose worst
    memory reading the model under-estimated by 2.9% (`plan validate`)."""
    cluster = Cluster(load_hardware("a100-80gb"), 2, 8)
    assert default_headroom("megatron-core", cluster, moe=False) == pytest.approx(0.029)
    solution = api.solve(16, 2, top=3)
    assert solution.plans[0].cluster.memory_headroom == pytest.approx(0.029)


@settings(max_examples=6, deadline=None)
@given(st.floats(0.0, 0.3))
def test_no_plan_exceeds_capacity_less_headroom(headroom):
    solution = api.solve(8, 1, "llama3-8b", gpu="h100", memory_headroom=headroom, top=5)
    capacity = load_hardware("h100").memory_bytes * (1 - headroom)
    assert all(p.metrics.peak_memory_bytes <= capacity for p in solution.plans)


def test_a_plan_that_fits_only_without_headroom_is_not_recommended():
    best = api.solve(8, 1, "llama3-8b", gpu="h100", memory_headroom=0.0, top=1).best.parallel
    pins = dict(tp=best.tp, pp=best.pp, dp=best.dp, micro_batch=best.micro_batch,
                zero=best.zero, recompute=best.recompute, schedule=best.schedule,
                virtual_stages=best.virtual_stages, sequence_parallel=best.sequence_parallel)
    plan = api.solve(8, 1, "llama3-8b", gpu="h100", memory_headroom=0.0, top=1, **pins).best
    free = 1 - plan.metrics.peak_memory_bytes / load_hardware("h100").memory_bytes
    assert 0 < free < 0.45
    tight = free + 0.005  # a little less room than plan 1 of no headroom needs
    try:
        other = api.solve(8, 1, "llama3-8b", gpu="h100", memory_headroom=tight, top=1,
                          **pins).best
    except NoFeasiblePlan:
        return
    room = load_hardware("h100").memory_bytes * (1 - tight)
    assert other.metrics.peak_memory_bytes <= room < plan.metrics.peak_memory_bytes


def test_cli_names_the_headroom_and_refuses_a_bad_one():
    done = runner.invoke(app, ["solve", "--gpus", "16", "--nodes", "2"])
    assert "memory headroom 2.9%: every plan fits 77.7 of 80.0 GiB" in done.output
    bad = runner.invoke(app, ["solve", "--gpus", "16", "--nodes", "2", "--memory-headroom", "2"])
    assert bad.exit_code != 0 and "--memory-headroom must be at most 0.5" in bad.output
    doc = json.loads(runner.invoke(app, ["solve", "--gpus", "16", "--nodes", "2", "--json",
                                         "--memory-headroom", "0.1"]).output)
    assert doc["plans"][0]["cluster"]["memory_headroom"] == 0.1
    assert all(p["metrics"]["peak_memory_bytes"] <= 0.9 * 80 * GIB for p in doc["plans"])
