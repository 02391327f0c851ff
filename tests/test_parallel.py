"""Parallel validates itself, and one rule owns which schedules run with which sizes."""

import pytest
from hypothesis import given, strategies as st

from planner.core.parallel import SCHEDULES, Parallel, ParallelError, schedule_problem
from planner.pipeline.schedule import ScheduleError, build_schedule


@pytest.mark.parametrize("field,value", [
    ("tp", 0), ("pp", -1), ("dp", 1.5), ("micro_batch", True), ("num_microbatches", 0),
    ("virtual_stages", 0), ("schedule", "pipedream"), ("recompute", "some"), ("zero", 4),
])
def test_impossible_configurations_are_refused_with_the_field(field, value):
    knobs = dict(tp=1, pp=1, dp=1, micro_batch=1, num_microbatches=1)
    knobs[field] = value
    with pytest.raises(ParallelError, match=field):
        Parallel(**knobs)


@given(tp=st.integers(1, 64), pp=st.integers(1, 64), dp=st.integers(1, 64),
       mb=st.integers(1, 16), m=st.integers(1, 256))
def test_degrees_and_batch_multiply(tp, pp, dp, mb, m):
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=m)
    assert par.gpus == tp * pp * dp
    assert par.global_batch == mb * m * dp


@given(schedule=st.sampled_from(SCHEDULES), p=st.integers(2, 8), m=st.integers(1, 32),
       v=st.integers(1, 3))
def test_simulator_refuses_exactly_what_the_rule_refuses(schedule, p, m, v):
    problem = schedule_problem(schedule, p, m, v)
    if problem is None:
        assert build_schedule(schedule, p, m, v)
    else:
        with pytest.raises(ScheduleError):
            build_schedule(schedule, p, m, v)


def test_five_degrees():
    """cp multiplies the GPU count; ep and etp re-divide a stage's tp·cp·dp ranks (Megatron-Core),
    so they do not, and the batch counts data-parallel replicas only."""
    par = Parallel(tp=2, pp=4, dp=8, micro_batch=1, num_microbatches=8, cp=2, ep=8, etp=1)
    assert par.gpus == 2 * 2 * 4 * 8
    assert par.global_batch == 1 * 8 * 8
    assert par.expert_tp == 1 and par.expert_dp == 2 * 2 * 8 // 8
    assert Parallel(tp=4, pp=1, dp=2, micro_batch=1, num_microbatches=1).expert_tp == 4


@pytest.mark.parametrize("kw, match", [
    (dict(cp=0), "cp must be a positive integer"),
    (dict(ep=3), r"etp x ep = 6 must divide tp x cp x dp = 8"),
    (dict(etp=0), "etp must be a positive integer"),
])
def test_five_degree_errors(kw, match):
    with pytest.raises(ParallelError, match=match):
        Parallel(tp=2, pp=1, dp=4, micro_batch=1, num_microbatches=1, **kw)
