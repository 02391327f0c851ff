"""calibrate: a measured hardware profile the planner's hardware loader accepts."""

import pytest

from planner.profiling.machine import calibrate
from planner.core.errors import PlanInputError
from planner.hardware.profiles import hardware_from_dict


def test_calibrate_cpu_gives_a_loadable_hardware_profile():
    steps = []
    data = calibrate("cpu", progress=lambda d, t, label: steps.append(d))
    hw = hardware_from_dict(data, "calibrated")
    assert hw.peak_tflops > 0 and hw.memory_bandwidth_gbps > 0 and hw.gpus_per_node == 1
    assert 0 < data["matmul_efficiency"] <= 1 and 0 < data["memory_efficiency"] <= 1
    assert "plan3d calibrate" in data["sources"]["measured"]
    assert steps[0] == 0 and steps == sorted(steps)


def test_calibrate_gpu_without_cupy(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(PlanInputError, match="CuPy is not installed"):
        calibrate("gpu")
