"""Uneven interleaving in the default search (issue #30 item 1): interleaved layouts whose blocks do
not divide into pp x v chunks (Llama 3 405B's 126 blocks on PP 16 x v8) are searched without
--virtual-stages, bounded before they are screened (planner/search/space.py bounded_first)."""

from collections import Counter

import pytest

from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.load import load_model
from planner.search.costs import SearchCosts
from planner.search.request import Pins, Request
from planner.search.solver import capacity_bytes, search
from planner.search.space import bounded_first, enumerate_configs, space_size


def _request(**pins) -> Request:
    # llama3-8b (32 blocks) on 16 A100-40GB, batch 128: the best plan interleaves 12 chunks
    return Request(model=load_model("llama3-8b"),
                   cluster=make_cluster(load_hardware("a100-40gb"), 16, 2), global_batch=128,
                   pins=Pins(**pins), top=3)


def test_the_default_search_finds_an_uneven_interleaved_plan_and_proves_it():
    req = _request()
    result = search(req)
    best = result.plans[0].parallel
    assert best.virtual_stages > 1 and req.model.num_layers % best.num_chunks  # uneven
    assert bounded_first(req, best)
    assert any(n.startswith("plan 1 is proven") for n in result.notes)
    # the whole space is accounted for, none of it set aside as "uneven"
    assert result.accounted and result.considered == space_size(req)
    assert not any("uneven" in reason for reason in result.rejected)


def test_a_pinned_v_is_screened_as_before():
    """With --virtual-stages pinned the space is that v alone: nothing is bounded first."""
    req = _request(virtual_stages=3)
    assert not any(bounded_first(req, par) for par in enumerate_configs(req, Counter()))


def test_the_default_search_equals_refining_every_configuration():
    """By brute force over one shape (tp 2, pp 4, micro-batch 1: every schedule, v, recompute,
    ZeRO and SP, even and uneven), the default search's plan 1 is the fastest that fits."""
    req = _request(tp=2, pp=4, micro_batch=1)
    costs = SearchCosts(req)
    configs = list(enumerate_configs(req, Counter()))
    assert any(bounded_first(req, par) for par in configs)
    steps = []
    for par in configs:
        plan = costs.refined(par)
        if not isinstance(plan, str) and plan.metrics.peak_memory_bytes <= capacity_bytes(
                req.cluster):
            steps.append((plan.metrics.step_time_s, par))
    best_s, best_par = min(steps, key=lambda item: item[0])
    assert bounded_first(req, best_par)  # the brute force's best is uneven too
    assert search(req).plans[0].metrics.step_time_s == pytest.approx(best_s, rel=1e-12)
