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
