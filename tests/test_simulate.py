"""Timing simulator: bubbles against closed forms, hand-checked makespans, dependencies."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from planner.pipeline.schedule import SCHEDULES, ScheduleError

# schedules with chunk k on rank k mod p (dualpipe's two directions: tests/test_dualpipe.py)
ONE_DIRECTION = tuple(s for s in SCHEDULES if s != "dualpipe")
from planner.pipeline.simulate import closed_form_bubble, simulate


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m,expected", [(4, 8, 0.273), (4, 64, 0.045)])
def test_gpipe_1f1b_bubble_closed_form(name, p, m, expected):
    r = simulate(name, p, m, fwd_s=1.0, bwd_s=2.0)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert round(r.bubble_fraction, 3) == expected
    assert r.bubble_ratio == pytest.approx((p - 1) / m, abs=1e-12)


def test_gpipe_p4_m4_unit_times_takes_14():
    r = simulate("gpipe", 4, 4, fwd_s=1.0, bwd_s=1.0)
    assert r.makespan_s == 14.0
    for row in r.timeline:
        assert [f"{t.op.kind}{t.op.microbatch}" for t in row] == ["F0", "F1", "F2", "F3", "B3", "B2", "B1", "B0"]


def test_peak_inflight_gpipe_and_1f1b():
    assert simulate("gpipe", 4, 6, fwd_s=1, bwd_s=2).peak_inflight == (6, 6, 6, 6)
    assert simulate("1f1b", 4, 8, fwd_s=1, bwd_s=2).peak_inflight == (4, 3, 2, 1)
    assert simulate("1f1b", 4, 2, fwd_s=1, bwd_s=2).peak_inflight == (2, 2, 2, 1)
    r = simulate("1f1b", 2, 4, fwd_s=1, bwd_s=2, act_bytes=[10.0, 30.0])
    assert r.peak_activation_bytes == (20.0, 30.0)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 8, 4), (2, 6, 3), (4, 4, 2), (8, 16, 2)])
def test_interleaved_bubble_closed_form(p, m, v):
    r = simulate("interleaved", p, m, v, fwd_s=1.0 / v, bwd_s=2.0 / v)
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert r.bubble_fraction == pytest.approx(closed_form_bubble("interleaved", p, m, v), abs=1e-12)


def test_interleaved_first_rank_holds_korthikanti_factor():
    p, m, v = 4, 8, 2
    r = simulate("interleaved", p, m, v, fwd_s=0.5, bwd_s=1.0)
    # chunk activations are 1/v of a stage's; 1F1B's rank 0 holds p stage activations
    assert r.peak_inflight[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_zb_h1_idle_is_a_third_of_1f1b(p, m):
    one = simulate("1f1b", p, m, fwd_s=1.0, bwd_s=2.0)
    zb = simulate("zb-h1", p, m, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0)  # F = B = W = 1
    assert sum(zb.idle_s) * 3 == pytest.approx(sum(one.idle_s))  # exact: (p-1) vs 3(p-1) per rank
    assert zb.bubble_ratio * 3 == pytest.approx(one.bubble_ratio)  # (p-1)/3m vs (p-1)/m
    assert zb.bubble_fraction == pytest.approx(closed_form_bubble("zb-h1", p, m))  # not one third
    assert zb.makespan_s == 3 * m + p - 1


def test_zb_h1_peak_counted_until_w_matches_1f1b_worst_rank():
    one = simulate("1f1b", 4, 8, fwd_s=1, bwd_s=2)
    zb = simulate("zb-h1", 4, 8, fwd_s=1, bwd_s=2)
    assert max(zb.peak_inflight) == max(one.peak_inflight) == 4
    assert zb.peak_inflight == (4, 4, 4, 4)  # later ranks hold more than their 1F1B (p - i)


def test_slow_stage_gates_the_step_gpipe():
    # p=3, M=4, stage 1 twice as slow (F: 1,2,1; B: 1,2,1).  Forward: stage 1 runs F0..F3 back to
    # back on [1, 9); stage 2 ends F3 at 10.  Backward B3..B0: stage 2 [10, 14), stage 1 B3 at
    # 11, each 2 long -> ends 19, stage 0's B0 follows on [19, 20).
    r = simulate("gpipe", 3, 4, fwd_s=[1, 2, 1], bwd_s=[1, 2, 1])
    assert r.makespan_s == 20.0
    assert r.busy_s[1] == 16.0


def test_slow_stage_gates_the_step_1f1b():
    # p=3, M=4, F: 1,2,1; B: 2,4,2.  Stage 1: F0 [1,3), F1 [3,5), waits for B0 from stage 2
    # (F0 [3,4), B0 [4,6)), then B0 [6,10) F2 [10,12) B1 [12,16) F3 [16,18) B2 [18,22)
    # B3 [22,26); stage 0's B3 then runs [26, 28).
    r = simulate("1f1b", 3, 4, fwd_s=[1, 2, 1], bwd_s=[2, 4, 2])
    assert r.makespan_s == 28.0
    starts = [(t.op.kind, t.op.microbatch, t.start_s) for t in r.timeline[1]]
    assert starts[2] == ("B", 0, 6.0) and starts[-1] == ("B", 3, 22.0)


def test_comm_is_latency_on_the_dependency():
    r = simulate("1f1b", 2, 2, fwd_s=1.0, bwd_s=1.0, comm_s=0.5)
    row1 = {(t.op.kind, t.op.microbatch): t.start_s for t in r.timeline[1]}
    assert row1[("F", 0)] == 1.5  # F0 ends at 1 on rank 0, + 0.5 transfer
    row0 = {(t.op.kind, t.op.microbatch): t.start_s for t in r.timeline[0]}
    assert row0[("B", 0)] == 4.0  # B0 ends 3.5 on rank 1, + 0.5 transfer
    assert r.makespan_s == 7.0


def test_bad_lengths_raise():
    with pytest.raises(ScheduleError, match="fwd_s has 2 entries; expected 4"):
        simulate("1f1b", 4, 4, fwd_s=[1, 2], bwd_s=1)


def _check_dependencies(r, fwd, bwd, wgrad, comm):
    chunks = r.p * r.v
    when = {}
    for rank, row in enumerate(r.timeline):
        prev_end = 0.0
        for t in row:
            assert t.op.chunk % r.p == rank
            assert t.start_s >= prev_end - 1e-9  # one op at a time, in order
            prev_end = t.end_s
            when[(t.op.kind, t.op.microbatch, t.op.chunk)] = t
    for (kind, mb, k), t in when.items():
        if kind == "F" and k > 0:
            assert t.start_s >= when[("F", mb, k - 1)].end_s + comm[k - 1] - 1e-9
        if kind == "B":
            assert t.start_s >= when[("F", mb, k)].end_s - 1e-9
            if k < chunks - 1:
                assert t.start_s >= when[("B", mb, k + 1)].end_s + comm[k] - 1e-9
        if kind == "W":
            assert t.start_s >= when[("B", mb, k)].end_s - 1e-9
            assert t.end_s - t.start_s == pytest.approx(wgrad[k])
    assert r.makespan_s == pytest.approx(max(t.end_s for t in when.values()))
    assert sum(r.busy_s) + sum(r.idle_s) == pytest.approx(r.p * r.makespan_s)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(ONE_DIRECTION), p=st.integers(1, 6),
       mult=st.integers(1, 3), v=st.sampled_from((1, 2, 3)))
def test_dependencies_hold_for_random_times(data, name, p, mult, v):
    v = v if name == "interleaved" else 1
    m = p * mult if name == "interleaved" else data.draw(st.integers(1, 12))
    n = p * v
    times = st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n)
    fwd, bwd = data.draw(times), data.draw(times)
    wgrad = [b * data.draw(st.floats(0.0, 1.0)) for b in bwd]
    comm = data.draw(st.lists(st.floats(0.0, 2.0), min_size=max(n - 1, 0), max_size=max(n - 1, 0)))
    r = simulate(name, p, m, v, fwd_s=fwd, bwd_s=bwd, wgrad_s=wgrad, comm_s=comm if n > 1 else 0.0)
    eff_comm = [0.0 if k % p == (k + 1) % p else c for k, c in enumerate(comm)]
    _check_dependencies(r, fwd, bwd, wgrad, eff_comm)



@pytest.mark.parametrize("name,v,actions", [("gpipe", 1, 2), ("1f1b", 1, 2), ("interleaved", 2, 2),
                                            ("zb-h1", 1, 3)])
def test_engine_costs_are_charged_once_per_action(name, v, actions):
    """One rank has no bubble: its step is its compute plus one charge per action it runs (F, B
    and, split, W), and a split backward costs split_backward x the backward more."""
    m, a, x = 6, 0.25, 0.5
    plain = simulate(name, 1, m, v, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0).makespan_s
    charged = simulate(name, 1, m, v, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0, action_s=a,
                       split_backward=x).makespan_s
    extra_backward = x * 2.0 * m if name == "zb-h1" else 0.0
    assert charged == pytest.approx(plain + actions * m * v * a + extra_backward)


@pytest.mark.parametrize("name,p,v", [("gpipe", 4, 1), ("1f1b", 4, 1), ("interleaved", 4, 2),
                                      ("zb-h1", 4, 1)])
def test_engine_costs_agree_between_full_and_periodic_runs(name, p, v):
    """The steady-period extrapolation (periodic.py) charges the same costs as op-by-op."""
    times = dict(fwd_s=[1.0 + 0.1 * k for k in range(p * v)], bwd_s=2.0, wgrad_s=0.8,
                 comm_s=0.05, action_s=0.03, split_backward=0.2)
    full = simulate(name, p, 200, v, method="full", **times)
    fast = simulate(name, p, 200, v, **times)
    assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-9)
    assert fast.busy_s == pytest.approx(full.busy_s, rel=1e-9)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [9, 24, 64])
def test_zb_2p_reaches_the_start_offset_bound_when_f_b_w_are_equal(p, m):
    """With F = B = W and free transfers no schedule beats 3m + p - 1 (the last rank starts
    after p - 1 forwards and runs 3m actions): zb-2p reaches it, as zb-h1 does."""
    r = simulate("zb-2p", p, m, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0)
    assert r.makespan_s == pytest.approx(3 * m + p - 1)
    assert r.bubble_fraction == pytest.approx(closed_form_bubble("zb-2p", p, m))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.integers(0, 3), st.floats(0.3, 2.0), st.floats(0.3, 2.0),
       st.floats(0.0, 0.5))
def test_zb_2p_never_slower_than_zb_h1_from_2p_microbatches(p, extra, b, w, comm):
    """The memory zb-2p spends (2p microbatches instead of p) buys time: with m >= 2p it is
    never slower than zb-h1 whatever B, W and the transfers cost (F = 1)."""
    m = 2 * p + extra
    times = dict(fwd_s=1.0, bwd_s=b + w, wgrad_s=w, comm_s=comm)
    two = simulate("zb-2p", p, m, **times).makespan_s
    assert two <= simulate("zb-h1", p, m, **times).makespan_s + 1e-9


def test_zb_2p_beats_zb_h1_when_transfers_cost_time():
    times = dict(fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0, comm_s=0.2)
    assert simulate("zb-2p", 8, 24, **times).makespan_s < \
        simulate("zb-h1", 8, 24, **times).makespan_s * 0.96


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1),
                                    ("zb-2p", 1)])
def test_rank_span_is_the_step_except_where_ranks_finish_in_turn(name, v):
    """A step that overlaps the next one costs the longest rank span. Where rank 0 starts first
    and ends last (GPipe, 1F1B, interleaved, ZB-H1) that is the makespan; zb-2p's parallelogram
    ends rank by rank, so its spans are shorter. The steady-period run gives the same span."""
    times = dict(fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0, comm_s=0.05)
    full = simulate(name, 4, 200, v, method="full", **times)
    fast = simulate(name, 4, 200, v, **times)
    assert fast.span_s == pytest.approx(full.span_s, rel=1e-9)
    spans = [rank[-1].end_s - rank[0].start_s for rank in full.timeline]
    assert full.span_s == pytest.approx(max(spans))
    if name == "zb-2p":
        assert full.span_s < full.makespan_s - 1.0
    else:
        assert full.span_s == pytest.approx(full.makespan_s)


def test_simulating_a_plan_says_what_its_step_adds_to_the_pipeline(tmp_path):
    """plan.json's step is the pipeline plus the exposed DP sync and the optimizer step
    (predict/step.py): the simulated pipeline is shorter, and the output says by how much."""
    from typer.testing import CliRunner

    from planner import api
    from planner.cli import app

    out = tmp_path / "run"
    runner = CliRunner()
    assert runner.invoke(app, ["solve", "--gpus", "16", "--nodes", "2", "--export", "json",
                               "--out", str(out)]).exit_code == 0
    job, _ = api.simulation(None, None, None, None, None, None, out / "plan.json")
    plan_step = json.loads((out / "plan.json").read_text())["metrics"]["step_time_s"]
    assert job.priced_step_s == plan_step
    pipeline = api.simulate(job).makespan_s
    assert 0 < plan_step - pipeline < 0.05 * plan_step
    shown = runner.invoke(app, ["simulate", "--plan", str(out / "plan.json")])
    assert f"the plan prices the step at {plan_step:.4g} s" in shown.output
