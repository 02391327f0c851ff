"""The search's lower bound (planner/search/bound.py) is below every refined step time, and the
branch and bound it drives finds the plan refining everything finds."""

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.search.bound import relaxed_bound, split_bound, split_fits
from planner.search.costs import SearchCosts
from planner.search.request import Request
from planner.search.solver import capacity_bytes, screen, search
from planner.search.space import enumerate_configs
from planner.predict.step import predict

MODELS = ["megatron-1.7b", "llama2-7b", "megatron-7.5b"]


def _screened(req):
    """Every configuration the screen keeps, with its screen estimate."""
    costs = SearchCosts(req)
    kept = screen(req, costs, list(enumerate_configs(req, Counter())), Counter())
    return costs, [(par, predict(req.model, req.cluster, par, req.options,
                                 costs.even_stages(par)).step_s) for par in kept]


def _request(model, nodes, per_node, batch, gpu):
    spec = PRESETS[model].with_seq_length(2048)
    return Request(model=spec, cluster=make_cluster(load_hardware(gpu), nodes * per_node, nodes),
                   global_batch=batch)


@settings(max_examples=12, deadline=None)
@given(model=st.sampled_from(MODELS), nodes=st.sampled_from([1, 2]),
       per_node=st.sampled_from([4, 8]), batch=st.sampled_from([32, 64, 256]),
       gpu=st.sampled_from(["a100-80gb", "a100-40gb", "h100"]), seed=st.integers(0, 10**6))
def test_bound_is_below_every_refined_step(model, nodes, per_node, batch, gpu, seed):
    """For screened configurations of random cases (all schedules, tight and loose memory), the
    bound with and without the memory terms never exceeds the refined step time."""
    req = _request(model, nodes, per_node, batch, gpu)
    costs, screened = _screened(req)
    random.Random(seed).shuffle(screened)
    for par, _ in screened[:25]:
        plan = costs.refined(par)
        if isinstance(plan, str):
            continue
        step = plan.metrics.step_time_s
        for with_memory in (False, True):
            b = costs.bound(par, with_memory=with_memory)
            assert b.value() <= step * (1 + 1e-9), (par, b.value(), step)
            assert not b.exceeds(step * (1 + 1e-9)), par


@pytest.mark.parametrize("post_validation", [False, True])
@settings(max_examples=3, deadline=None)
@given(model=st.sampled_from(MODELS), batch=st.sampled_from([32, 64]),
       seed=st.integers(0, 10**6))
def test_bound_holds_for_zero_bubble_schedules_and_overlapping_steps(post_validation, model,
                                                                     batch, seed):
    """A stack that runs every schedule (zb-h1 and zb-2p too), with and without optimizer
    post-validation (a step costs the longest rank span): the bound stays below the step."""
    from planner.pipeline.schedule import SCHEDULES
    from planner.stack import load_stack, with_overrides
    stack = with_overrides(load_stack("torchtitan"), schedules=list(SCHEDULES),
                           optimizer_post_validation=post_validation)
    req = _request(model, 1, 8, batch, "a100-80gb")
    req = Request(model=req.model, cluster=req.cluster, global_batch=batch, options=stack)
    costs, screened = _screened(req)
    random.Random(seed).shuffle(screened)
    for par, _ in screened[:15]:
        plan = costs.refined(par)
        if isinstance(plan, str):
            continue
        b = costs.bound(par, with_memory=True)
        assert b.value() <= plan.metrics.step_time_s * (1 + 1e-9), (par, b.value())


def test_the_screen_is_not_a_lower_bound():
    """Why the stop rule needs its own bound: the screen charges every stage the
    configuration's recompute and Megatron's even split, so the refinement beats it."""
    req = _request("llama2-7b", 1, 8, 64, "a100-80gb")
    costs, screened = _screened(req)
    over = 0
    for par, screen in screened[:60]:
        plan = costs.refined(par)
        if not isinstance(plan, str) and screen > plan.metrics.step_time_s * (1 + 1e-6):
            over += 1
    assert over > 0


@pytest.mark.parametrize("case", [("megatron-1.7b", 1, 8, 64, "a100-40gb"),
                                  ("llama2-7b", 2, 4, 256, "a100-80gb")])
def test_branch_and_bound_finds_the_best_of_all(case):
    """Refining every screened configuration gives the same best step as the search."""
    req = _request(*case)
    costs, screened = _screened(req)
    steps = []
    for par, _ in screened:
        plan = costs.refined(par)
        if not isinstance(plan, str) and plan.metrics.peak_memory_bytes <= capacity_bytes(
                req.cluster):
            steps.append(plan.metrics.step_time_s)
    best = search(Request(model=req.model, cluster=req.cluster, global_batch=req.global_batch,
                          top=1, refine=10**6)).plans[0]
    assert best.metrics.step_time_s == pytest.approx(min(steps), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), p=st.integers(1, 6), m=st.integers(1, 40), n=st.integers(1, 12))
def test_split_bound_against_every_split(data, p, m, n):
    """By brute force over all contiguous splits of n layers into p ranks (empty allowed):
    split_bound is the smallest max term, and the continuous relaxation is below it."""
    t = np.array(data.draw(st.lists(st.floats(0.01, 3.0), min_size=n, max_size=n)))
    fam = [(t, np.tile(m * t, (p, 1)))]
    best = float("inf")

    def walk(start, r, before, worst):
        nonlocal best
        if r == p - 1:
            best = min(best, max(worst, before + m * t[start:].sum()))
            return
        for end in range(start, n + 1):
            walk(end, r + 1, before + t[start:end].sum(),
                 max(worst, before + m * t[start:end].sum()))

    walk(0, 0, 0.0, 0.0)
    got = split_bound(fam)
    assert got <= best * (1 + 1e-9) and got >= best * (1 - 1e-5)
    assert not split_fits(best * (1 - 1e-5), fam)
    assert relaxed_bound(1.0, p, m, float(t.sum())) <= best * (1 + 1e-9)
