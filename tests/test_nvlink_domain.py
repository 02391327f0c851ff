"""The NVLink domain replaces the node where it is larger (GB200 NVL72: 72 GPUs over 18 trays of
4): TP, CP and EP groups may span trays inside it, and the links the cost model prices follow it.
Each fast rule is checked against the groups build_layout lists, member by member."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from planner.core.parallel import Parallel
from planner.hardware.profiles import load_hardware, make_cluster
from planner.layout.ranks import (blocks_cross, build_layout, dp_group_crosses_nodes,
                                  stage_hop_crosses_nodes)
from planner.model.presets import PRESETS
from planner.predict.layer_costs import cp_crosses
from planner.predict.step import evaluate
from planner.search.rules import tp_rule


def _slow_crosses(groups, domain: int) -> bool:
    """Reference: some group has members in two domains (rank // domain)."""
    return any(len({r // domain for r in g}) > 1 for g in groups)


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8, 16]), cp=st.sampled_from([1, 2, 3, 4, 8]),
       dp=st.integers(1, 4), pp=st.integers(1, 3),
       node_domain=st.sampled_from([(4, 72), (8, 8), (4, 4), (8, 16)]))
def test_fast_crossing_rules_match_the_layout(tp, cp, dp, pp, node_domain):
    node, domain = node_domain
    layout = build_layout(tp, pp, dp, node, cp=cp, nvlink_domain=domain)
    assert layout.domain == domain
    assert blocks_cross(tp * cp, dp * pp, domain) == _slow_crosses(layout.cp_groups, domain) or \
        cp == 1
    assert layout.tp_within_node == (not _slow_crosses(layout.tp_groups, domain))
    assert dp_group_crosses_nodes(tp, cp * dp, pp, domain) == _slow_crosses(
        [tuple(sorted(set(a) | set(b))) for a, b in _dp_cp_groups(layout)], domain) or \
        dp * cp == 1
    hops = [i for i in range(pp - 1) if stage_hop_crosses_nodes(i, i + 1, tp * cp, dp, domain)]
    assert tuple(hops) == layout.cross_node_pp_boundaries


def _dp_cp_groups(layout):
    """Megatron's data-parallel group with context parallelism: the DP and CP groups of the same
    (tp, pp) coordinate together (what gradients are reduced over)."""
    by_key = {}
    for r in layout.ranks:
        by_key.setdefault((r.tp, r.pp), []).append(r.rank)
    return [(tuple(v), ()) for v in by_key.values()]


def test_gb200_tp_and_cp_groups_span_trays_inside_the_rack():
    """TP 8 x CP 9 on two NVL72 racks of 18 trays: every TP group spans two 4-GPU trays and every
    TP x CP block of 72 stays in one rack, so no CP group leaves NVLink."""
    hw = load_hardware("gb200-nvl72")
    cluster = make_cluster(hw, 144, 36)
    assert (cluster.gpus_per_node, cluster.nvlink_domain) == (4, 72)
    model = PRESETS["llama3-70b"]
    assert tp_rule(model, cluster, 8) is None  # 8 > a tray of 4, inside the rack
    layout = build_layout(8, 1, 2, 4, cp=9, nvlink_domain=cluster.nvlink_domain)
    assert all(len({r // 4 for r in g}) == 2 for g in layout.tp_groups)  # two trays each
    assert layout.within_domain(layout.tp_groups) and layout.within_domain(layout.cp_groups)
    par = Parallel(tp=8, pp=1, dp=2, micro_batch=1, num_microbatches=4, cp=9)
    assert not cp_crosses(par, cluster.hardware)
    plan = evaluate(replace(model, seq_length=9 * 2 * 4096), cluster, par)
    assert plan.to_dict()["layout"]["tp_groups"][0] == list(range(8))


def test_h100_keeps_tp_inside_a_node():
    cluster = make_cluster(load_hardware("h100"), 16, 2)
    assert cluster.nvlink_domain == 8
    assert tp_rule(PRESETS["llama3-70b"], cluster, 16) == "TP across nodes"
    rack = make_cluster(load_hardware("gb200-nvl72"), 144, 36)
    assert tp_rule(PRESETS["llama3-70b"], rack, 8) is None
    # 16 does not divide the 72 GPUs of a rack: some TP group would straddle two racks
    assert tp_rule(PRESETS["llama3-70b"], rack, 16) == "TP across NVLink domains"


def test_cp_across_racks_is_priced_on_the_network():
    cluster = make_cluster(load_hardware("gb200-nvl72"), 144, 36)
    inside = Parallel(tp=8, pp=1, dp=2, micro_batch=1, num_microbatches=1, cp=9)
    across = Parallel(tp=8, pp=1, dp=1, micro_batch=1, num_microbatches=1, cp=18)
    assert not cp_crosses(inside, cluster.hardware)
    assert cp_crosses(across, cluster.hardware)


def test_gb200_tp_times_ep_groups_fill_one_rack():
    """Issue #18: on GB200 NVL72 (two racks of 18 trays of 4), TP 4 x EP 18 with expert TP 4
    places each expert group's 72 GPUs (an EP group and the expert-TP partners of its members)
    across all 18 trays of one rack and never across racks, so the dispatch all-to-all stays on
    NVLink; the cost model's count of EP members per domain agrees with the layout."""
    from planner.cost import moe

    cluster = make_cluster(load_hardware("gb200-nvl72"), 144, 36)
    layout = build_layout(4, 2, 18, 4, ep=18, etp=4, nvlink_domain=cluster.nvlink_domain)
    partners = {r: g for g in layout.expert_tp_groups for r in g}
    for group in layout.ep_groups:
        block = {r for member in group for r in partners[member]}
        assert len(block) == 72 and len({r // 72 for r in block}) == 1  # one rack
        assert len({r // 4 for r in block}) == 18  # all of its trays
    assert layout.within_domain(layout.ep_groups)
    assert moe.ep_in_domain(4, 18, cluster.nvlink_domain) == 18
