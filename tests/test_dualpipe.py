"""DualPipe (planner/pipeline/dualpipe.py): its op order, its simulated bubble against the
DeepSeek-V3 report's Table 2, its activation peak and its dependencies."""

import re
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from planner.pipeline import dualpipe
from planner.pipeline.schedule import ScheduleError, build_schedule
from planner.pipeline.simulate import simulate

sizes = st.integers(1, 8).flatmap(
    lambda n: st.tuples(st.just(2 * n), st.integers(2 * n, 2 * n + 12).map(lambda h: 2 * h)))


@settings(max_examples=40, deadline=None)
@given(sizes)
def test_every_stage_runs_every_microbatch_once_on_its_rank(pm):
    """Each rank runs all M microbatches, half of them (even) on its forward-direction stage r,
    half (odd) on stage p - 1 - r; each (microbatch, stage) once as F then BW or F, B, W."""
    p, m = pm
    for r, row in enumerate(build_schedule("dualpipe", p, m)):
        seen: dict = {}
        for op in row:
            assert dualpipe.rank_of(p, op.microbatch, op.chunk) == r
            seen.setdefault((op.microbatch, op.chunk), []).append(op.kind)
        assert all(kinds in (["F", "BW"], ["F", "B", "W"]) for kinds in seen.values())
        assert Counter(mb % 2 for mb, _ in seen) == {0: m // 2, 1: m // 2}
        assert {k for _, k in seen} == {r, p - 1 - r}


@settings(max_examples=60, deadline=None)
@given(sizes, st.floats(0.2, 3.0), st.floats(0.0, 0.5))
def test_bubble_is_the_reports_formula(pm, x, share):
    """Report Table 2: DualPipe's bubble (PP/2-1)(F&B + B - 3W). With uniform stages, F equal to
    the input-gradient B and to W (the F = B = W convention under which ZB1P's (PP-1)(F+B-2W) is
    exact too) and a pair no shorter than a full backward, the most idle rank idles exactly that,
    whatever M. ``share``: the part of F and of B that is all-to-all, hidden by the pair."""
    p, m = pm
    fwd, bwd, wgrad = x, 2 * x, x
    hidden_f, hidden_b = share * fwd, share * fwd  # both at most F/2: the pair stays >= B
    run = simulate("dualpipe", p, m, fwd_s=fwd, bwd_s=bwd, wgrad_s=wgrad,
                   overlap_fwd_s=hidden_f, overlap_bwd_s=hidden_b)
    fb = dualpipe.pair_s(fwd, hidden_f, bwd, hidden_b, 0.0)
    assert bwd <= fb <= fwd + bwd
    expected = dualpipe.bubble_formula(p, fb, bwd, wgrad)
    assert max(run.idle_s) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_bubble_without_overlap_is_every_ranks_and_does_not_grow_with_m():
    """No all-to-all: F&B = F + B; every rank idles (p/2 - 1)(F + 2B - 3W) for any M (report:
    'neither the bubbles nor activation memory will increase as the number of micro-batches
    grows'), where 1F1B idles (p - 1)(F + B)."""
    p = 8
    for m in (16, 18, 40, 100):
        run = simulate("dualpipe", p, m, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0)
        assert run.idle_s == pytest.approx([dualpipe.bubble_formula(p, 3.0, 2.0, 1.0)] * p)
        assert run.busy_s == pytest.approx([3.0 * m] * p)


@settings(max_examples=30, deadline=None)
@given(sizes)
def test_activation_peak_is_pp_plus_one(pm):
    """Report Table 2: DualPipe holds PP + 1 microbatches' activations (1F1B: PP), on every
    rank, counting both of its chunks; a microbatch's are held from its F to its W (or BW)."""
    p, m = pm
    run = simulate("dualpipe", p, m, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0, act_bytes=1.0)
    assert run.peak_inflight == (p + 1,) * p
    assert run.peak_activation_bytes == pytest.approx([p + 1.0] * p)


@settings(max_examples=40, deadline=None)
@given(st.data(), sizes)
def test_dependencies_hold_for_random_times(data, pm):
    """Uneven stages, transfers and pair overlaps: on every rank one op at a time, in order; a
    microbatch's F after its F on the stage before (plus that link's transfer: in the reverse
    direction the link between ranks p-1-k and p-2-k), its B or BW after its own F and after
    the B of the stage after, its W after its B; a pair's F and BW share their interval."""
    p, m = pm
    times = st.lists(st.floats(0.1, 5.0), min_size=p, max_size=p)
    fwd, bwd = data.draw(times), data.draw(times)
    wgrad = [b * data.draw(st.floats(0.0, 1.0)) for b in bwd]
    comm = data.draw(st.lists(st.floats(0.0, 2.0), min_size=p - 1, max_size=p - 1))
    hide = data.draw(st.floats(0.0, 1.0))
    run = simulate("dualpipe", p, m, fwd_s=fwd, bwd_s=bwd, wgrad_s=wgrad, comm_s=comm,
                   overlap_fwd_s=[hide * f for f in fwd], overlap_bwd_s=[hide * b for b in bwd],
                   interference=0.15)
    when = {}
    for r, row in enumerate(run.timeline):
        prev_end, prev_key = 0.0, None
        for t in row:
            if t.op.paired:  # shares its interval with the F just before it
                paired_f = when[("F",) + prev_key]
                assert t.start_s == paired_f.start_s and t.end_s == paired_f.end_s
            else:
                assert t.start_s >= prev_end - 1e-9
            prev_end, prev_key = t.end_s, (t.op.microbatch, t.op.chunk)
            when[(t.op.kind,) + prev_key] = t

    def link(mb, k):  # transfer across boundary k (stage k to k + 1) for microbatch mb
        return comm[k] if mb % 2 == 0 else comm[p - 2 - k]

    for (kind, mb, k), t in when.items():
        if kind == "F" and k > 0:
            assert t.start_s >= when[("F", mb, k - 1)].end_s + link(mb, k - 1) - 1e-9
        if kind in ("B", "BW"):
            assert t.start_s >= when[("F", mb, k)].end_s - 1e-9
            if k < p - 1:
                after = when.get(("B", mb, k + 1)) or when[("BW", mb, k + 1)]
                assert t.start_s >= after.end_s + link(mb, k) - 1e-9
        if kind == "W":
            assert t.start_s >= when[("B", mb, k)].end_s - 1e-9
    assert run.makespan_s == pytest.approx(max(t.end_s for t in when.values()))
    assert sum(run.busy_s) + sum(run.idle_s) == pytest.approx(p * run.makespan_s)


def test_pair_hides_the_all_to_all_under_compute():
    """The pair's rule: compute of both, all-to-all beyond it exposed, the hidden part charged
    at the interference share."""
    assert dualpipe.pair_s(3.0, 1.0, 6.0, 2.0, 0.0) == pytest.approx(6.0)  # 6 compute, 3 hidden
    assert dualpipe.pair_s(3.0, 1.0, 6.0, 2.0, 0.1) == pytest.approx(6.3)
    assert dualpipe.pair_s(2.0, 1.5, 2.0, 1.5, 0.0) == pytest.approx(3.0)  # 1 compute, 3 comm
    assert dualpipe.pair_s(1.0, 0.0, 2.0, 0.0, 0.15) == pytest.approx(3.0)  # nothing to hide
    assert dualpipe.interference(132, 0.16) == pytest.approx(20 / 132)
    assert dualpipe.interference(None, 0.16) == 0.16


@pytest.mark.parametrize("p,m,msg", [
    (3, 6, "dualpipe needs an even pp"),
    (4, 9, "dualpipe needs an even microbatch count of at least 2 x pp = 8"),
    (4, 6, "dualpipe needs an even microbatch count of at least 2 x pp = 8"),
    (1, 2, "dualpipe needs an even pp"),
])
def test_bad_sizes_are_refused_in_one_line(p, m, msg):
    with pytest.raises(ScheduleError, match=re.escape(msg)) as err:
        simulate("dualpipe", p, m, fwd_s=1.0, bwd_s=2.0)
    assert "\n" not in str(err.value)


def test_a_dualpipe_plan_holds_two_stage_copies_and_megatron_refuses_it():
    """Report Table 2, 'Parameter 2x': rank r holds stage r and a copy of stage p - 1 - r, so
    its weights are the two stages' (1F1B: its own); the activations it holds are the
    simulator's (PP + 1 microbatches with equal stages). Megatron-LM has no DualPipe: its
    export refuses the plan in one line."""
    from dataclasses import replace

    from planner.core.parallel import Parallel
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.launchers import megatron
    from planner.model.presets import PRESETS
    from planner.predict.step import predict_plan

    model = PRESETS["llama2-7b"]
    cluster = make_cluster(load_hardware("a100-80gb"), 8, 1)
    one = Parallel(tp=1, pp=4, dp=2, micro_batch=1, num_microbatches=8)
    _, base = predict_plan(model, cluster, one, simulated=True)
    plan, dual = predict_plan(model, cluster, replace(one, schedule="dualpipe"), simulated=True)
    weights = base.memory_parts["weights"]
    assert dual.memory_parts["weights"] == pytest.approx(weights + weights[::-1])
    assert plan.metrics.step_time_s > 0
    problems = megatron.check(plan)
    assert any("has no DualPipe schedule" in line for line in problems)


def test_closed_form_share_matches_the_simulation():
    from planner.pipeline.simulate import closed_form_bubble
    for p, m in ((4, 8), (8, 20), (16, 40)):
        run = simulate("dualpipe", p, m, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0)
        assert run.bubble_fraction == pytest.approx(closed_form_bubble("dualpipe", p, m))


def test_the_search_tries_dualpipe_where_the_stack_runs_it_and_its_bound_holds():
    """A stack that runs DualPipe and exports nowhere (no built-in one does: Megatron-LM,
    DeepSpeed and torch.distributed.pipelining have no DualPipe): the screened DualPipe
    configurations of an MoE model refine on the partitioner's split of DualPipe's stages, or
    Megatron's even split where that simulates faster (their memory, both stage copies, is the
    prediction's: test above), and the search's lower bound stays below each refined step."""
    from collections import Counter

    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.load import load_model
    from planner.search.costs import SearchCosts
    from planner.search.request import Request
    from planner.search.solver import screen
    from planner.search.space import enumerate_configs
    from planner.stack import load_stack, with_overrides

    model = load_model("profiles/validation/configs/qwen3-30b-a3b.json").with_seq_length(4096)
    stack = with_overrides(load_stack("megatron-core"), schedules=["1f1b", "dualpipe"],
                           launcher=None)
    req = Request(model=model, cluster=make_cluster(load_hardware("h100-sxm-80gb"), 16, 2),
                  global_batch=64, options=stack)
    costs = SearchCosts(req)
    kept = [par for par in screen(req, costs, list(enumerate_configs(req, Counter())), Counter())
            if par.schedule == "dualpipe"]
    assert kept
    for par in kept[:8]:
        plan = costs.refined(par)
        assert plan.notes[-1].startswith(("stage split: ilp", "stage split: Megatron's even"))
        assert plan.metrics.peak_memory_bytes <= req.cluster.hardware.memory_bytes
        for with_memory in (False, True):
            bound = costs.bound(par, with_memory=with_memory)
            assert bound.value() <= plan.metrics.step_time_s * (1 + 1e-9)
