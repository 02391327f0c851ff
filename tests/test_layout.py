"""Rank layout: groups partition the ranks, Megatron's documented example, node-local TP."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.layout.ranks import (ORDERS, LayoutError, build_layout, check_layout,
                            dp_group_crosses_nodes, rank_of, require_node_local_tp,
                            stage_hop_crosses_nodes)

degrees = st.sampled_from([1, 2, 3, 4, 8])
gpn = st.sampled_from([1, 2, 4, 6, 8, 16])
orders = st.sampled_from(ORDERS)


def _partition(groups, world):
    flat = [r for g in groups for r in g]
    return sorted(flat) == list(range(world))


@settings(max_examples=80, deadline=None)
@given(degrees, degrees, degrees, gpn, orders)
def test_groups_partition_ranks(tp, pp, dp, g, order):
    lay = build_layout(tp, pp, dp, g, order)
    world = tp * pp * dp
    assert lay.world_size == world == len(lay.ranks)
    for groups, size in ((lay.tp_groups, tp), (lay.pp_groups, pp), (lay.dp_groups, dp)):
        assert _partition(groups, world)  # each rank in exactly one group of this dimension
        assert all(len(grp) == size for grp in groups)
        assert len(groups) * size == world
    for info in lay.ranks:
        assert info.node == info.rank // g and info.local_rank == info.rank % g
        assert rank_of(info.tp, info.pp, info.dp, tp, pp, dp, order) == info.rank
    # Every group varies exactly its own coordinate.
    by_rank = {r.rank: r for r in lay.ranks}
    for grp in lay.pp_groups:
        assert [by_rank[r].pp for r in grp] == list(range(pp))
        assert len({(by_rank[r].tp, by_rank[r].dp) for r in grp}) == 1
    for grp in lay.dp_groups:
        assert [by_rank[r].dp for r in grp] == list(range(dp))
        assert len({(by_rank[r].tp, by_rank[r].pp) for r in grp}) == 1
    json.dumps(lay.to_dict())


@settings(max_examples=80, deadline=None)
@given(degrees, degrees, degrees, gpn, orders)
def test_tp_node_local_iff_divides(tp, pp, dp, g, order):
    lay = build_layout(tp, pp, dp, g, order)
    if g % tp == 0:
        assert lay.tp_within_node
        require_node_local_tp(lay)
        assert all(len({r // g for r in grp}) == 1 for grp in lay.tp_groups)
    elif tp * pp * dp > 1 and any(len({r // g for r in grp}) > 1 for grp in lay.tp_groups):
        assert not lay.tp_within_node
        with pytest.raises(LayoutError, match="crosses nodes"):
            require_node_local_tp(lay)


@settings(max_examples=60, deadline=None)
@given(degrees, degrees, degrees, gpn, orders)
def test_cross_node_reports_match_groups(tp, pp, dp, g, order):
    lay = build_layout(tp, pp, dp, g, order)
    for i in range(pp - 1):
        crosses = any(grp[i] // g != grp[i + 1] // g for grp in lay.pp_groups)
        assert (i in lay.cross_node_pp_boundaries) == crosses
    assert lay.dp_crosses_nodes == any(len({r // g for r in grp}) > 1 for grp in lay.dp_groups)


def test_megatron_documented_example():
    # megatron.core.parallel_state.initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4.
    lay = build_layout(2, 4, 2, 8)
    assert [list(g) for g in lay.tp_groups] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9],
                                               [10, 11], [12, 13], [14, 15]]
    assert [list(g) for g in lay.pp_groups] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14],
                                               [3, 7, 11, 15]]
    assert [list(g) for g in lay.dp_groups] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10],
                                               [9, 11], [12, 14], [13, 15]]
    assert [list(g) for g in lay.embedding_groups] == [[0, 12], [1, 13], [2, 14], [3, 15]]
    # Stages 0,1 on node 0, stages 2,3 on node 1: only the 1 -> 2 hop crosses nodes.
    assert lay.cross_node_pp_boundaries == (1,)
    assert lay.dp_crosses_nodes is False
    assert lay.tp_within_node


def test_tp_pp_dp_order():
    lay = build_layout(2, 2, 2, 4, order="tp-pp-dp")
    assert [list(g) for g in lay.pp_groups] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert [list(g) for g in lay.dp_groups] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.cross_node_pp_boundaries == ()
    assert lay.dp_crosses_nodes


def test_embedding_group_single_rank_without_pipeline():
    lay = build_layout(2, 1, 4, 8)
    assert all(len(g) == 1 for g in lay.embedding_groups)


def test_tp_crossing_message():
    lay = build_layout(4, 1, 3, 6)  # TP group [4,5,6,7] spans nodes 0 and 1
    problems = check_layout(lay)
    assert problems and "TP group [4, 5, 6, 7] crosses nodes 0 and 1" in problems[0]
    assert "tp=4 must divide gpus per node (6)" in problems[0]
    with pytest.raises(LayoutError, match=r"tp=4 must divide gpus per node \(6\)"):
        require_node_local_tp(lay)


@pytest.mark.parametrize("args", [(0, 1, 1, 8), (1, 1, 1, 0), (2, 2, 2, 8, "pp-tp-dp")])
def test_bad_input(args):
    with pytest.raises(LayoutError):
        build_layout(*args)


def test_to_dict_shape():
    d = build_layout(2, 2, 1, 2).to_dict()
    assert d["order"] == "tp-cp-ep-dp-pp"
    assert d["ranks"][3] == {"rank": 3, "node": 1, "local_rank": 1, "tp": 1, "pp": 1, "dp": 0}
    assert d["cross_node"] == {"pp_boundaries": [0], "dp": False}


def test_large_layout_is_fast():
    lay = build_layout(8, 16, 128, 8)  # 16384 GPUs
    assert len(lay.ranks) == 16384 and lay.tp_within_node


def test_render_layout_small_and_huge():
    from rich.console import Console

    from planner.report.layout import render_layout

    console = Console(record=True, width=160)
    render_layout(build_layout(2, 4, 2, 8), console)
    text = console.export_text()
    assert "(1,3,1)" in text and "[0,4,8,12]" in text and "PP boundaries crossing nodes: [1]" in text
    console = Console(record=True, width=160)
    render_layout(build_layout(8, 16, 64, 8), console)
    text = console.export_text()
    assert "1016 nodes not shown" in text and "more" in text and len(text) < 20000


@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.integers(1, 8), dp=st.integers(1, 12),
       gpn=st.sampled_from([1, 2, 4, 6, 8, 16]))
@settings(max_examples=200, deadline=None)
def test_closed_form_node_crossings_match_the_layout(tp, pp, dp, gpn):
    layout = build_layout(tp, pp, dp, gpn)
    hops = tuple(i for i in range(pp - 1) if stage_hop_crosses_nodes(i, i + 1, tp, dp, gpn))
    assert hops == layout.cross_node_pp_boundaries
    assert dp_group_crosses_nodes(tp, dp, pp, gpn) == layout.dp_crosses_nodes
    wrap = any(layout.node_of(g[-1]) != layout.node_of(g[0]) for g in layout.pp_groups)
    assert stage_hop_crosses_nodes(pp - 1, 0, tp, dp, gpn) == (wrap and pp > 1)


def _reference_groups(sizes: dict, dims: tuple, order: str) -> set:
    """Slow reference: decode every rank into coordinates (mixed radix, innermost first) and group
    the ranks that agree on every dimension outside ``dims``."""
    names = order.split("-")
    world = 1
    for d in names:
        world *= sizes.get(d, 1)
    groups: dict = {}
    for rank in range(world):
        rest, coord = rank, {}
        for d in names:
            coord[d], rest = rest % sizes.get(d, 1), rest // sizes.get(d, 1)
        key = tuple(coord[d] for d in names if d not in dims)
        groups.setdefault(key, []).append(rank)
    return {tuple(g) for g in groups.values()}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]),
       orders)
def test_five_d_groups_match_reference(tp, cp, dp, pp, ep, etp, order):
    if (tp * cp * dp) % (etp * ep):
        with pytest.raises(LayoutError, match="must divide"):
            build_layout(tp, pp, dp, 8, order, cp=cp, ep=ep, etp=etp)
        return
    if order.endswith("pp-dp") and pp > 1 and etp * ep != tp * cp:
        with pytest.raises(LayoutError, match="span pipeline stages"):
            build_layout(tp, pp, dp, 8, order, cp=cp, ep=ep, etp=etp)
        return
    lay = build_layout(tp, pp, dp, 8, order, cp=cp, ep=ep, etp=etp)
    dense = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    expert = {"tp": etp, "ep": ep, "dp": tp * cp * dp // (etp * ep), "pp": pp}
    for groups, sizes, dims in ((lay.tp_groups, dense, ("tp",)), (lay.cp_groups, dense, ("cp",)),
                                (lay.dp_groups, dense, ("dp",)), (lay.pp_groups, dense, ("pp",)),
                                (lay.ep_groups, expert, ("ep",)),
                                (lay.expert_tp_groups, expert, ("tp",)),
                                (lay.expert_dp_groups, expert, ("dp",))):
        assert set(groups) == _reference_groups(sizes, dims, order), dims
        assert _partition(groups, tp * cp * pp * dp)
    # Expert groups never cross a pipeline stage: a stage's ranks are re-divided, not mixed.
    stage = {r.rank: r.pp for r in lay.ranks}
    assert all(len({stage[r] for r in g}) == 1 for g in lay.ep_groups + lay.expert_dp_groups)


def test_megatron_context_parallel_example():
    """Megatron-Core's order tp-cp-ep-dp-pp on 16 GPUs with tp = cp = dp = pp = 2: TP pairs are
    neighbours, CP pairs are 2 apart, DP pairs 4 apart and pipeline stages 8 apart."""
    lay = build_layout(2, 2, 2, 8, cp=2)
    assert lay.tp_groups[:2] == ((0, 1), (2, 3))
    assert lay.cp_groups[:2] == ((0, 2), (1, 3))
    assert lay.dp_groups[:2] == ((0, 4), (1, 5))
    assert lay.pp_groups[0] == (0, 8)
    assert build_layout(2, 2, 2, 8, "tp-dp-pp").order == "tp-cp-ep-dp-pp"  # the 3D alias


def test_nvlink_domain_holds_whole_nodes_or_is_one_node():
    """An NVL72-style domain spans nodes (trays) of 4 GPUs; a domain that does not hold whole
    nodes of the cluster falls back to one node."""
    from dataclasses import replace

    from planner.hardware.profiles import load_hardware, make_cluster

    hw = replace(load_hardware("h100"), nvlink_domain=72)
    assert make_cluster(hw, 144, 36).nvlink_domain == 72  # 4 GPUs per node, 18 nodes a domain
    assert make_cluster(hw, 80, 8).nvlink_domain == 10  # 72 is not a multiple of 10
    assert make_cluster(load_hardware("h100"), 16, 2).nvlink_domain == 8
