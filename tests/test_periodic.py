"""The steady-period simulation (planner/pipeline/periodic.py) against the op-by-op reference."""

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.pipeline import periodic
from planner.pipeline.schedule import SCHEDULES, build_schedule
from planner.pipeline.simulate import FULL_UP_TO, simulate

REL = 1e-9


def _same(fast, full):
    scale = full.makespan_s
    assert fast.makespan_s == pytest.approx(full.makespan_s, rel=REL)
    assert fast.busy_s == pytest.approx(full.busy_s, rel=REL, abs=REL * scale)
    assert fast.idle_s == pytest.approx(full.idle_s, rel=REL, abs=REL * scale)
    assert fast.bubble_fraction == pytest.approx(full.bubble_fraction, rel=REL, abs=REL)
    assert fast.peak_inflight == full.peak_inflight
    assert fast.peak_activation_bytes == pytest.approx(full.peak_activation_bytes, rel=REL)


def _times(data, n, lo=0.1, hi=5.0):
    return data.draw(st.lists(st.floats(lo, hi), min_size=n, max_size=n))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), name=st.sampled_from(SCHEDULES), p=st.integers(1, 6),
       v=st.sampled_from((2, 3)), equal=st.booleans())
def test_steady_period_equals_full_simulation(data, name, p, v, equal):
    """Uneven or equal stages, random transfers and weight-gradient shares, M up to a few hundred,
    every schedule: the extrapolated step, busy/idle time and peaks equal the op-by-op run's.
    DualPipe (even p, even M) also with random all-to-all shares its F&B pairs hide."""
    v = v if name == "interleaved" else 1
    if name == "dualpipe":
        p = max(2, p - p % 2)
    n = p * v
    if name == "interleaved":
        low = max(13, FULL_UP_TO // p + 1)
        m = p * data.draw(st.integers(low, max(low, 300 // p)))
    else:
        m = data.draw(st.integers(max(4 * p + 9, FULL_UP_TO + 1), 300))
        m += m % 2 if name == "dualpipe" else 0
    fwd = [1.0] * n if equal else _times(data, n)
    bwd = [2.0] * n if equal else _times(data, n)
    wgrad = [b * data.draw(st.floats(0.0, 1.0)) for b in bwd]
    comm = _times(data, n - 1, 0.0, 2.0) if n > 1 else 0.0
    act = _times(data, n, 1.0, 100.0)
    args = dict(fwd_s=fwd, bwd_s=bwd, wgrad_s=wgrad, comm_s=comm, act_bytes=act)
    if name == "dualpipe":
        hide = data.draw(st.floats(0.0, 1.0))
        args.update(overlap_fwd_s=[hide * f for f in fwd], overlap_bwd_s=[hide * b for b in bwd],
                    interference=data.draw(st.floats(0.0, 0.3)))
    fast = simulate(name, p, m, v, **args)
    assert fast.timeline_m is not None and fast.timeline_m < m  # the short path ran
    _same(fast, simulate(name, p, m, v, method="full", **args))


@pytest.mark.parametrize("name,p,m,v", [("1f1b", 5, 200, 1), ("zb-h1", 4, 150, 1),
                                        ("zb-2p", 4, 150, 1), ("interleaved", 3, 120, 2)])
def test_repeated_squaring_is_exact(monkeypatch, name, p, m, v):
    """Near-tied slow stages delay the steady state; past STEP_LIMIT steps T^k is taken by
    repeated squaring, which must give the same step."""
    monkeypatch.setattr(periodic, "STEP_LIMIT", 0)
    products = []
    square = periodic._product
    monkeypatch.setattr(periodic, "_product", lambda a, b: products.append(1) or square(a, b))
    n = p * v
    fwd = [1.0 + 0.001 * ((7 * k) % n) for k in range(n)]
    args = dict(fwd_s=fwd, bwd_s=[2 * f for f in fwd], comm_s=[0.05 * (k % 3) for k in range(n - 1)])
    _same(simulate(name, p, m, v, **args), simulate(name, p, m, v, method="full", **args))
    assert products  # T^k was taken by squaring


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("zb-h1", 1), ("zb-2p", 1), ("interleaved", 2),
                                    ("gpipe", 1)])
def test_a_million_microbatches_on_16_ranks(name, v):
    """10**6 microbatches: the step is what two full simulations at smaller M give, extended by
    their per-microbatch slope (the steady period is reached well before M = 1,024)."""
    p, n = 16, 16 * v
    fwd = [0.9 + 0.2 * ((5 * k) % 7) / 7 for k in range(n)]
    args = dict(fwd_s=fwd, bwd_s=[2 * f for f in fwd], comm_s=0.01, act_bytes=1.0)
    big = simulate(name, p, 10**6, v, timeline=False, **args)
    a, b = (simulate(name, p, m, v, method="full", timeline=False, **args) for m in (1024, 2048))
    slope = (b.makespan_s - a.makespan_s) / 1024
    assert big.makespan_s == pytest.approx(b.makespan_s + slope * (10**6 - 2048), rel=1e-9)
    assert big.peak_inflight == (b.peak_inflight if name != "gpipe" else (10**6,) * p)


def test_long_run_keeps_a_short_timeline():
    r = simulate("1f1b", 4, 10**6, fwd_s=1.0, bwd_s=2.0)
    assert r.timeline_m is not None and sum(len(row) for row in r.timeline) == 2 * 4 * r.timeline_m
    assert r.m == 10**6 and r.makespan_s == pytest.approx(3 * 10**6 + 3 * 3)


def test_short_runs_use_the_full_simulation():
    assert simulate("1f1b", 4, FULL_UP_TO, fwd_s=1.0, bwd_s=2.0).timeline_m is None
    assert simulate("gpipe", 1, FULL_UP_TO, fwd_s=1.0, bwd_s=2.0).timeline_m is None


def test_gpipe_closed_form_by_hand():
    # p=3, M=4, F 1,2,1, B 1,2,1 (tests/test_simulate.py works this one out): 20
    assert periodic.gpipe_makespan([1, 2, 1], [1, 2, 1], [0.0, 0.0], 4) == 20.0


def test_steady_cuts_found_for_every_schedule():
    for name, p, v, m in (("1f1b", 4, 1, 12), ("zb-h1", 4, 1, 12), ("zb-2p", 4, 1, 24),
                          ("interleaved", 4, 2, 24), ("dualpipe", 4, 1, 24)):
        group = p if name == "interleaved" else 2 if name == "dualpipe" else 1
        ops = build_schedule(name, p, m, v)
        labels = periodic.group_labels(ops, group, v)
        keys = periodic.cut_keys(ops, labels, p, v, group)
        release = {"zb-h1": ("W",), "zb-2p": ("W",), "dualpipe": ("W", "BW")}.get(name, ("B",))
        cuts = periodic.steady_cuts(ops, build_schedule(name, p, m + group, v), labels, keys,
                                    group, release)
        assert cuts, name
        # a cut during the warm-up is not one: rank 0 still runs forwards only there
        assert 0 not in cuts


def test_gantt_of_a_long_run_is_compressed_and_says_so():
    from rich.console import Console

    from planner.report.gantt import render_gantt, to_svg

    r = simulate("1f1b", 4, 10**6, fwd_s=1.0, bwd_s=2.0)
    console = Console(width=100, record=True)
    render_gantt(r, console)
    text = console.export_text()
    assert f"drawn: {r.timeline_m:,} of 1,000,000 microbatches" in text
    svg = to_svg(r)
    assert svg.count('class="op"') == 2 * 4 * r.timeline_m


@pytest.mark.parametrize("p", [4, 8])
def test_a_wave_that_repeats_after_several_periods(monkeypatch, p):
    """A short first stage and a lighter last one (embedding, head): the state never shifts
    uniformly from one period to the next, a wave runs through the ranks and the states repeat
    only after several periods; found by the cycle search long before all periods are stepped,
    and the same step as the op-by-op run."""
    steps = []
    step = periodic.apply
    monkeypatch.setattr(periodic, "apply", lambda T, s: steps.append(1) or step(T, s))
    fwd = [0.5] + [1.0] * (p - 2) + [0.8]
    args = dict(fwd_s=fwd, bwd_s=[2 * f for f in fwd], comm_s=0.03, act_bytes=1.0)
    fast = simulate("1f1b", p, 400, timeline=False, **args)
    assert len(steps) < 200  # of the ~380 periods
    _same(fast, simulate("1f1b", p, 400, method="full", timeline=False, **args))


@pytest.mark.parametrize("p", [2, 3, 8, 16, 64])
def test_1f1b_first_short_run_has_a_steady_cut(p):
    """1F1B's first short run (p + 2 microbatches, simulate._first_short_run) already holds a
    steady cut, so a long 1F1B run times p + 2 microbatches op by op, not 2p + 4 or more; and
    the step it gives equals the op-by-op one (uneven stages and transfers)."""
    from planner.pipeline.simulate import _first_short_run, _steady_cut
    short = _first_short_run("1f1b", p, 1)
    assert short == p + 2 and _steady_cut("1f1b", p, 1, short, 1) is not None
    rng = random.Random(p)
    f = [rng.uniform(0.5, 2.0) for _ in range(p)]
    b = [2 * x * rng.uniform(0.8, 1.2) for x in f]
    comm = [rng.uniform(0.0, 0.3) for _ in range(p - 1)]
    m = max(FULL_UP_TO + 1, 2 * short + 3)
    fast = simulate("1f1b", p, m, fwd_s=f, bwd_s=b, comm_s=comm, timeline=False)
    full = simulate("1f1b", p, m, fwd_s=f, bwd_s=b, comm_s=comm, timeline=False, method="full")
    assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 12), finite=st.floats(0.0, 1.0))
def test_sparse_apply_is_the_dense_one_bit_for_bit(data, n, finite):
    """The period map applied from its finite entries (periodic.apply_sparse) gives the very
    floats the dense max-plus product gives, rows of -inf included."""
    rng = random.Random(data.draw(st.integers(0, 10**6)))
    T = np.array([[rng.uniform(-5, 5) if rng.random() < finite else -np.inf for _ in range(n)]
                  for _ in range(n)])
    s = np.array([rng.uniform(0, 100) for _ in range(n)])
    dense, sparse = periodic.apply(T, s), periodic.apply_sparse(periodic.sparse_form(T), s)
    assert np.array_equal(dense, sparse)
