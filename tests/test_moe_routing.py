"""Where a token's experts are (planner/cost/routing.py): every count against brute-force
enumeration of the routing it states; DeepSeek-V3's node-limited routing read from its
HuggingFace config (n_group, topk_group), checked, exported to Megatron, and what it does to
DeepEP's network traffic on the report's layout (EP 64 over 8 nodes, at most 4 nodes a token)."""

from dataclasses import replace
from itertools import combinations
from math import comb

import pytest
from conftest import moe_config
from hypothesis import given, settings, strategies as st

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.cost import moe, routing
from planner.cost.memory import Shape
from planner.hardware.profiles import load_hardware, make_cluster
from planner.launchers.megatron import moe_flags
from planner.model.load import model_from_dict
from planner.predict.step import evaluate

H800 = load_hardware("h800")


DSV3 = model_from_dict(moe_config("deepseek-v3", num_nextn_predict_layers=0), "deepseek-v3")
BLOCK = next(layer for layer in DSV3.layers if layer.is_moe)


def _layer(e, k, groups=0, chosen=0):
    return replace(BLOCK, num_experts=e, moe_top_k=k, moe_groups=groups, moe_group_top_k=chosen)


def _enumerate_scores(e, k, parts, groups=0, chosen=0) -> float:
    """Brute force: every set of chosen groups equally likely, then every k-set of their experts
    equally likely; the mean number of parts touched."""
    per, total, count = e // parts, 0.0, 0
    group_sets = combinations(range(groups), chosen) if groups else [None]
    for gs in group_sets:
        pool = range(e) if gs is None else [x for g in gs for x in range(g * e // groups,
                                                                         (g + 1) * e // groups)]
        sets = list(combinations(pool, k))
        total += sum(len({x // per for x in s}) for s in sets) / len(sets)
        count += 1
    return total / count


@pytest.mark.parametrize("e,k,parts,groups,chosen", [
    (8, 2, 4, 0, 0),  # no groups
    (12, 3, 3, 0, 0),
    (16, 3, 8, 4, 2),  # each group spans two parts
    (16, 3, 4, 4, 2),  # one group a part (DeepSeek-V3's layout: one group a node)
    (16, 2, 2, 8, 3),  # each part holds four groups
    (12, 4, 3, 6, 2),
])
def test_scores_routing_against_enumeration(e, k, parts, groups, chosen):
    got = routing.parts_per_token(_layer(e, k, groups, chosen), parts, "scores")
    assert got == pytest.approx(_enumerate_scores(e, k, parts, groups, chosen))


@given(e_per=st.integers(1, 8), parts=st.sampled_from([1, 2, 4, 8]), k=st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_round_robin_against_enumeration(e_per, parts, k):
    """Automodel's FakeBalancedGate: token t to experts (t·k + i) mod E; one full cycle of
    tokens, the mean number of parts touched."""
    e = e_per * parts * 2
    k = min(k, e)
    cycle = e  # e tokens cover every start of t·k mod e equally often
    mean = sum(len({((t * k + i) % e) // (e // parts) for i in range(k)})
               for t in range(cycle)) / cycle
    assert routing.parts_per_token(_layer(e, k), parts, "round_robin") == pytest.approx(mean)


def test_groups_never_touch_more_than_uniform_routing():
    for parts in (2, 4, 8, 16, 32, 64):
        limited = routing.parts_per_token(BLOCK, parts, "scores")
        free = routing.parts_per_token(replace(BLOCK, moe_groups=0, moe_group_top_k=0), parts)
        assert limited <= free + 1e-12


def test_deepseek_v3_reads_its_routing_groups():
    """HuggingFace DeepseekV3Config: 'n_group: Number of groups for routed experts', 'topk_group:
    Number of selected groups for each token (for each token, ensuring the selected experts is
    only within `topk_group` groups)': 8 and 4 in DeepSeek-V3's config."""
    assert (DSV3.moe_groups, DSV3.moe_group_top_k) == (8, 4)
    assert all((b.moe_groups, b.moe_group_top_k) == (8, 4) for b in DSV3.layers if b.is_moe)
    # DeepSeek-V2's group_limited_greedy (its device-limited routing, M = 3); its "greedy"
    # takes the top-k of all experts: no limit
    v2 = model_from_dict(moe_config("deepseek-v2"), "deepseek-v2")
    assert (v2.moe_groups, v2.moe_group_top_k) == (8, 3)
    greedy = model_from_dict(moe_config("deepseek-v2", topk_method="greedy"), "v2")
    assert greedy.moe_groups == 0


@pytest.mark.parametrize("changes,match", [
    (dict(n_group=7), "n_group"),  # 256 experts in 7 groups
    (dict(topk_group=9), "topk_group"),
    (dict(n_group="8"), "n_group"),
])
def test_bad_routing_groups_are_refused(changes, match):
    with pytest.raises(PlanInputError, match=match):
        model_from_dict(moe_config("deepseek-v3", num_nextn_predict_layers=0, **changes), "x")


def test_a_model_file_with_too_small_groups_is_refused():
    data = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
            "seq_length": 64, "mlp": "swiglu", "num_experts": 16, "moe_top_k": 4,
            "moe_groups": 8, "moe_group_top_k": 1}
    with pytest.raises(PlanInputError, match="fewer experts than moe_top_k"):
        model_from_dict(data, "tiny")
    model_from_dict({**data, "moe_group_top_k": 2}, "tiny")


def test_megatron_export_carries_the_groups():
    cluster = make_cluster(load_hardware("h100"), 64, 8)
    par = Parallel(tp=1, pp=8, dp=8, micro_batch=1, num_microbatches=16, ep=8, etp=1)
    plan = evaluate(DSV3.with_seq_length(4096), cluster, par)
    text = " ".join(a if v is None else f"{a} {v}" for a, v in moe_flags(plan))
    assert "--moe-router-num-groups 8" in text and "--moe-router-group-topk 4" in text


def test_node_limited_routing_bounds_deepseek_v3s_network_traffic():
    """The report's layout: EP 64 over 8 nodes of 8, 256 experts (32 a node = one group a node),
    top-8 within 4 groups: a token reaches at most 4 nodes ('we ensure that each token will be
    sent to at most M nodes'), on average 4·(1 - C(96, 8)/C(128, 8)) = 3.6 of them, 7/8 of
    those others; routed freely it would reach 8·(1 - C(224, 8)/C(256, 8)) = 5.3 nodes."""
    limited = moe.remote_domains_per_token(BLOCK, ep=64, in_domain=8)
    assert limited == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)) * 7 / 8)
    free = moe.remote_domains_per_token(replace(BLOCK, moe_groups=0), ep=64, in_domain=8)
    assert free == pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)) * 7 / 8)
    assert limited < 4 and limited / free == pytest.approx(0.68, abs=0.01)
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=4096, ep=64, etp=1, ep_in_domain=8,
                  moe_dispatcher="deepep")
    assert moe.deepep_s(BLOCK, shape, H800) < moe.deepep_s(replace(BLOCK, moe_groups=0), shape,
                                                           H800)
