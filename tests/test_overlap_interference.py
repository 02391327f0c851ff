"""Overlapped DP/ZeRO communication is not free: the collective holds SMs the compute beside it
cannot use (planner/cost/comm.py overlap_interference, planner/predict/data_parallel.py
dp_exposed_s)."""

from dataclasses import replace

import numpy as np
import pytest

from planner.cost import constants
from planner.cost import comm
from planner.stack import default_stack, with_overrides
from planner.core.errors import PlanInputError
from planner.predict.data_parallel import overlapped_cost_s
from planner.predict.step import evaluate
from planner.hardware.profiles import hardware_from_dict, load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.core.parallel import Parallel

NO_OVERLAP = with_overrides(default_stack(), overlap_grad_reduce=False,
                            overlap_param_gather=False)


def test_interference_is_the_share_of_sms_nccl_holds():
    assert comm.overlap_interference(load_hardware("a100-80gb")) == pytest.approx(16 / 108)
    assert comm.overlap_interference(load_hardware("a100-40gb")) == pytest.approx(16 / 108)
    assert comm.overlap_interference(load_hardware("h100")) == pytest.approx(16 / 132)
    assert comm.overlap_interference(load_hardware("h200")) == pytest.approx(16 / 132)


def test_profile_without_sm_count_gets_the_measured_mean():
    hw = replace(load_hardware("a100-80gb"), sm_count=None)
    assert comm.overlap_interference(hw) == constants.OVERLAP_INTERFERENCE
    # Lee et al. 2025: overlapped compute 18.9% slower on average -> 1 - 1/1.189 of the GPU lost
    assert constants.OVERLAP_INTERFERENCE == pytest.approx(1 - 1 / 1.189, abs=0.005)


def test_sm_count_must_be_a_whole_number():
    base = {"name": "x", "peak_tflops": 1, "memory_gib": 1, "memory_bandwidth_gbps": 1,
            "intra_node_gbps": 1, "inter_node_gbps": 1}
    assert hardware_from_dict({**base, "sm_count": 108}, "t").sm_count == 108
    with pytest.raises(PlanInputError):
        hardware_from_dict({**base, "sm_count": 107.5}, "t")


def test_hidden_part_costs_its_interference_share_and_the_rest_is_exposed():
    f = 0.25
    # fits in the window: only the slowed compute is paid
    assert overlapped_cost_s(np.array([2.0]), np.array([10.0]), f)[0] == pytest.approx(0.5)
    # does not fit: 4 s exposed, the 10 s that overlap slow the compute by f
    assert overlapped_cost_s(np.array([14.0]), np.array([10.0]), f)[0] == pytest.approx(6.5)
    assert overlapped_cost_s(np.array([3.0]), np.array([10.0]), 0.0)[0] == 0.0


def test_fsdp_step_pays_interference_only_when_overlapped():
    model = PRESETS["llama2-7b"]
    cluster = make_cluster(load_hardware("a100-80gb"), 16, 2)
    par = Parallel(tp=1, pp=1, dp=16, micro_batch=2, num_microbatches=2, zero=3)
    on = evaluate(model, cluster, par, default_stack()).metrics.step_time_s
    # the most SMs a hardware profile may state (its schema): the collectives' SMs a vanishing share
    no_sms = make_cluster(replace(load_hardware("a100-80gb"), sm_count=65536), 16, 2)
    free = evaluate(model, no_sms, par, default_stack()).metrics.step_time_s
    off = evaluate(model, cluster, par, NO_OVERLAP).metrics.step_time_s
    assert free < on < off  # overlap still pays off, but is no longer free
    # the interference never touches runs that do not overlap
    assert evaluate(model, no_sms, par, NO_OVERLAP).metrics.step_time_s == \
        pytest.approx(off)
