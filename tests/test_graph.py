"""The compiled runs (planner/pipeline/graph.py, compiled.py) against the op-by-op simulator:
the same floats, bit for bit, for every schedule, uneven stages, transfers, weight-gradient
shares and DualPipe's F&B pairs; and the symbolic parts against numeric timing."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.pipeline import chunk_times, compiled, graph, op_by_op, simulate as sim
from planner.pipeline.schedule import SCHEDULES, ScheduleError, build_schedule


def _shape(data, name):
    """p, m, v a schedule accepts, small enough for a quick op-by-op run."""
    v = data.draw(st.sampled_from((2, 3))) if name == "interleaved" else 1
    p = data.draw(st.integers(1, 6))
    if name == "dualpipe":
        p = max(2, p - p % 2)
        m = 2 * data.draw(st.integers(p, 3 * p))
    elif name == "interleaved":
        p = max(2, p)
        m = p * data.draw(st.integers(1, 6))
    else:
        m = data.draw(st.integers(1, 30))
    return p, m, v


def _args(data, name, n):
    """Random stage times (uneven or equal), transfers, weight-gradient shares, activations and,
    for DualPipe, the all-to-all its pairs hide."""
    def times(lo, hi, k):
        return data.draw(st.lists(st.floats(lo, hi), min_size=k, max_size=k))
    equal = data.draw(st.booleans())
    fwd = [1.0] * n if equal else times(0.1, 5.0, n)
    bwd = [2.0] * n if equal else times(0.1, 5.0, n)
    args = dict(fwd_s=fwd, bwd_s=bwd, wgrad_s=[b * data.draw(st.floats(0.0, 1.0)) for b in bwd],
                comm_s=times(0.0, 2.0, n - 1) if n > 1 else 0.0,
                act_bytes=times(1.0, 100.0, n))
    if name == "dualpipe":
        hide = data.draw(st.floats(0.0, 1.0))
        args.update(overlap_fwd_s=[hide * f for f in fwd], overlap_bwd_s=[hide * b for b in bwd],
                    interference=data.draw(st.floats(0.0, 0.3)))
    return args


def _timed(name, p, m, v, args):
    """The compiled whole run, summarised as `simulate` does on its fast path."""
    run = compiled.compile_run(name, p, m, v)
    assert run is not None
    overlap = (args.get("overlap_fwd_s", 0.0), args.get("overlap_bwd_s", 0.0),
               args.get("interference", 0.0))
    plain = {k: args[k] for k in ("fwd_s", "bwd_s", "wgrad_s", "comm_s", "act_bytes")}
    table = chunk_times.OpTimes(name, p * v, plain, overlap).table(run.graph)
    comm = graph.comm_table(chunk_times.boundary_comm(args["comm_s"], p, v), name == "dualpipe")
    return sim._timed(run, name, p, m, v, table, comm, args["act_bytes"], True)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), name=st.sampled_from(SCHEDULES))
def test_compiled_run_is_the_op_by_op_run_bit_for_bit(data, name):
    p, m, v = _shape(data, name)
    args = _args(data, name, p * v)
    _, fast = _timed(name, p, m, v, args)
    full = sim.simulate(name, p, m, v, method="full", **args)
    assert fast == full  # every field: step, busy, idle, bubble, peaks, span, starts, timeline


@settings(max_examples=40, deadline=None)
@given(data=st.data(), name=st.sampled_from(SCHEDULES))
def test_auto_takes_the_compiled_run_from_a_shapes_second_configuration(data, name):
    """`simulate`'s whole-run path compiles a shape asked for before: its answers then are the
    op-by-op ones, unchanged."""
    p, m, v = _shape(data, name)
    first, second = _args(data, name, p * v), _args(data, name, p * v)
    asked = []
    real = compiled.compile_run
    try:
        compiled.compile_run = lambda *a: asked.append(a) or real(*a)
        for args in (first, second):
            auto = sim.simulate(name, p, m, v, **args)
            assert auto == sim.simulate(name, p, m, v, method="full", **args)
    finally:
        compiled.compile_run = real
    assert (name, p, m, v) in asked


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(SCHEDULES))
def test_a_part_timed_with_forms_is_the_part_timed_in_numbers(data, name):
    """The period map's forms (a part timed from the identity) applied to a state give the
    part's ends timed in numbers from that state, up to float rounding (forms add the same
    durations in another order)."""
    p, m, v = _shape(data, name)
    group = sim._group(name, p)
    short = 2 * sim._first_short_run(name, p, v)
    found = sim._steady_cut(name, p, v, short, group)
    if found is None:
        return
    _, labels, cut, keys = found
    run = compiled.compile_run(name, p, short, v)
    g = run.graph
    label = np.empty(len(g.duration), dtype=np.int64)
    for at, lab in zip(g.position, labels):
        label[at - g.sources] = lab
    part = graph.part(g, label >= cut, keys, cut * group, p * v)
    assert part is not None
    args = _args(data, name, p * v)
    overlap = (args.get("overlap_fwd_s", 0.0), args.get("overlap_bwd_s", 0.0),
               args.get("interference", 0.0))
    plain = {k: args[k] for k in ("fwd_s", "bwd_s", "wgrad_s", "comm_s", "act_bytes")}
    table = chunk_times.OpTimes(name, p * v, plain, overlap).table(g)
    comm = graph.comm_table(chunk_times.boundary_comm(args["comm_s"], p, v), name == "dualpipe")
    n = len(keys)
    state = np.array(data.draw(st.lists(st.floats(0.0, 50.0), min_size=n, max_size=n)))
    unit = np.full((n, n), -np.inf)
    np.fill_diagonal(unit, 0.0)
    forms, _ = graph.evaluate(part, unit, table, comm)
    numbers, _ = graph.evaluate(part, state, table, comm)
    applied = (forms[:-1] + state[None, :]).max(axis=1)
    assert applied == pytest.approx(numbers[:-1], rel=1e-12, abs=1e-12)


def test_a_program_that_cannot_finish_is_not_compiled():
    """Two ranks each waiting on the other's later op: no graph, and the op-by-op simulator
    names the deadlock."""
    ops = build_schedule("1f1b", 2, 2)
    swapped = (ops[0], tuple(reversed(ops[1])))
    assert graph.build(graph.program(swapped, 2), 2, False) is None
    with pytest.raises(ScheduleError, match="cannot finish"):
        op_by_op.simulate_ops(swapped, "1f1b", 2, 2, fwd_s=1.0, bwd_s=2.0)


def test_an_op_run_twice_is_not_compiled():
    ops = build_schedule("1f1b", 2, 2)
    twice = (ops[0] + ops[0][:1], ops[1])
    assert graph.build(graph.program(twice, 2), 2, False) is None


def test_depths_of_a_pipeline_fill():
    """1F1B, 3 ranks, 1 microbatch: F down the ranks, B back up; each op one deeper."""
    g = graph.build(graph.program(build_schedule("1f1b", 3, 1), 3), 3, False)
    assert g.levels == tuple(range(7))
    assert [d for d in g.depth] == list(range(6))
