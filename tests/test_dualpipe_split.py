"""DualPipe's stages split by the partitioner (planner/partitioning/problem.py mirrored_ranks):
the pp stages in layer order, stage c on rank c for c < pp / 2 and on rank pp - 1 - c
otherwise, a rank's time and memory summing its two stages; the MILP against an exhaustive
enumeration of every split on small random cases."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.partitioning.dp import partition_dp
from planner.partitioning.prepared import prepare
from planner.partitioning.problem import PartitionError, PartitionProblem, mirrored_ranks
from planner.partitioning.split import score_split
from planner.partitioning.solve import partition


def brute_force(prob: PartitionProblem, ranks: tuple[int, ...], p: int):
    """Every split x modes, the tie-break rule of planner/partitioning/problem.py applied
    literally (largest chunk, busiest rank, total compute, then chunk ends and modes in order),
    each rank's time and memory summed over the chunks ``ranks`` puts on it."""
    L, R, K = prob.num_layers, prob.num_modes, len(ranks)
    bnd = np.append(np.asarray(prob.boundary_s, float) * np.ones(K - 1), 0.0)
    extra = np.zeros(p) if prob.extra_bytes is None else prob.extra_bytes
    cap = np.broadcast_to(np.asarray(prob.capacity_bytes, float), (R,))
    best = None
    for cuts in itertools.combinations(range(1, L), K - 1):
        ends = list(cuts) + [L]
        starts = [0] + ends[:-1]
        for modes in itertools.product(range(R), repeat=K):
            rt, rm, rc = [0.0] * p, list(extra), [float(cap.max())] * p
            times = [float(prob.time_s[i:e, r].sum()) for i, e, r in zip(starts, ends, modes)]
            for k, (i, e, r) in enumerate(zip(starts, ends, modes)):
                rho = ranks[k]
                rt[rho] += times[k] + bnd[k]
                rm[rho] += float(prob.state_bytes[i:e].sum()
                                 + prob.inflight[k] * prob.act_bytes[i:e, r].sum())
                rc[rho] = min(rc[rho], float(cap[r]))
            if any(m > c for m, c in zip(rm, rc)):
                continue
            largest = max(t + b for t, b in zip(times, bnd))
            key = (largest, max(rt), sum(times), [x for pair in zip(ends, modes) for x in pair])
            if best is None or key < best[0]:
                best = (key, tuple(ends), tuple(prob.modes[r] for r in modes))
    return best


def _layer(draw, R):
    t = [float(draw(st.integers(1, 9)))]
    for _ in range(R - 1):
        t.append(t[-1] + draw(st.integers(0, 3)))  # more recompute: more time ...
    a0 = float(draw(st.integers(0, 6)))
    return t, [np.floor(a0 / (1 + r)) for r in range(R)], float(draw(st.integers(0, 5)))


@st.composite
def dualpipe_instances(draw, uniform: bool):
    """pp in {2, 4} stages on pp / 2 ranks; an embedding, identical blocks and a head (the
    block-count MILP) or any layers (the boundary MILP)."""
    pp = draw(st.sampled_from([2, 4]))
    R = draw(st.integers(1, 2))
    if uniform:
        first, block, last = (_layer(draw, R) for _ in range(3))
        rows = [first] + [block] * draw(st.integers(pp - 2 if pp > 2 else 1, 6)) + [last]
    else:
        rows = [_layer(draw, R) for _ in range(draw(st.integers(pp, 7)))]
    time_s = np.array([r[0] for r in rows])
    act = np.array([r[1] for r in rows])  # ... and less memory
    state = np.array([r[2] for r in rows])
    inflight = np.array([draw(st.integers(1, 4)) for _ in range(pp)], float)
    total = state.sum() + inflight.max() * act[:, 0].sum()
    cap = float(draw(st.integers(0, int(total) + 2)))
    boundary = float(draw(st.sampled_from([0, 0, 1])))
    prob = PartitionProblem(time_s, state, act, inflight, cap, ("none", "full")[:R], boundary,
                            chunk_ranks=mirrored_ranks(pp))
    return prob, pp, pp // 2


def _check(case):
    prob, K, p = case
    bf = brute_force(prob, prob.chunk_ranks, p)
    try:
        ilp = partition(prob, K, p)
    except PartitionError:
        assert bf is None
        return
    assert bf is not None, ilp
    assert ilp.method.startswith("ilp") and ilp.optimal and ilp.note == "", ilp.label
    assert (ilp.bottleneck_s, ilp.boundaries, ilp.recompute) == (bf[0][1], bf[1], bf[2])
    assert partition_dp(prob, K, p).boundaries == ilp.boundaries  # the enumeration reference


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dualpipe_instances(uniform=True))
def test_block_count_milp_splits_dualpipe_as_brute_force(case):
    _check(case)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dualpipe_instances(uniform=False))
def test_boundary_milp_splits_dualpipe_as_brute_force(case):
    _check(case)


def test_mirrored_placement_puts_first_and_last_stage_on_rank_zero():
    assert mirrored_ranks(2) == (0, 0)
    assert mirrored_ranks(8) == (0, 1, 2, 3, 3, 2, 1, 0)
    with pytest.raises(PartitionError, match="even stage count"):
        mirrored_ranks(3)


def test_a_rank_holds_both_of_its_stages_time_and_memory():
    """Rank r's time and memory are those of stages r and pp - 1 - r together (and not those of
    the interleaved placement, stages r and r + pp / 2)."""
    L = 8
    prob = PartitionProblem(np.arange(1.0, L + 1)[:, None], np.full(L, 10.0),
                            np.ones((L, 1)), np.array([4.0, 3, 2, 1]), 1e9,
                            chunk_ranks=mirrored_ranks(4))
    part = score_split(prepare(prob, 4, 2), [2, 4, 6, 8], [0, 0, 0, 0], method="t")
    t = [c.time_s for c in part.chunks]
    m = [c.memory_bytes for c in part.chunks]
    assert part.rank_time_s == (t[0] + t[3], t[1] + t[2])
    assert part.rank_memory_bytes == (m[0] + m[3], m[1] + m[2])
    assert m[0] == 20 + 4 * 2 and m[3] == 20 + 1 * 2  # states, then in-flight x activations
    interleaved = score_split(prepare(replace(prob, chunk_ranks=None), 4, 2), [2, 4, 6, 8],
                              [0, 0, 0, 0], method="t")
    assert interleaved.rank_time_s == (t[0] + t[2], t[1] + t[3])


def test_a_rank_whose_two_stages_overflow_memory_is_refused():
    """Each stage fits alone; rank 0's two together do not unless the split moves layers off the
    embedding-and-head rank: the partitioner counts both stages against one capacity."""
    L = 6
    state = np.array([30.0, 1, 1, 1, 1, 30.0])  # a heavy embedding and head
    prob = PartitionProblem(np.ones((L, 1)), state, np.zeros((L, 1)), np.ones(4), 40.0,
                            chunk_ranks=mirrored_ranks(4))
    with pytest.raises(PartitionError, match="no split fits"):
        partition(prob, 4, 2)
    roomy = replace(prob, capacity_bytes=60.5)
    part = partition(roomy, 4, 2)
    assert part.boundaries == (1, 3, 5, 6)  # rank 0: only the embedding and the head
    assert part.rank_memory_bytes == (60.0, 4.0)


def _qwen3_dualpipe_pp4():
    """(model, stack, request, costs, configuration): Qwen3-30B-A3B at 4,096 tokens on 16 H100s,
    the screen's first DualPipe configuration at pp 4, on megatron-core listing DualPipe."""
    from collections import Counter

    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.load import load_model
    from planner.search.costs import SearchCosts
    from planner.search.request import Request
    from planner.search.solver import screen
    from planner.search.space import enumerate_configs
    from planner.stack import load_stack, with_overrides

    model = load_model("profiles/validation/configs/qwen3-30b-a3b.json").with_seq_length(4096)
    stack = with_overrides(load_stack("megatron-core"), schedules=["dualpipe"], launcher=None)
    req = Request(model=model, cluster=make_cluster(load_hardware("h100-sxm-80gb"), 16, 2),
                  global_batch=64, options=stack)
    costs = SearchCosts(req)
    par = next(par for par in screen(req, costs, list(enumerate_configs(req, Counter())),
                                     Counter()) if par.schedule == "dualpipe" and par.pp == 4)
    return model, stack, req, costs, par


def test_the_search_splits_dualpipe_unevenly_where_that_is_faster():
    """Qwen3-30B-A3B on 16 H100s, pp 4, DualPipe: the head (larger than the embedding) shares
    rank 0 with the first stage, so the partitioner gives the middle stages more layers than
    Megatron's even split; simulated, that step is faster, and the search keeps it."""
    from planner.predict.stages import best_split, megatron_split

    model, stack, req, costs, par = _qwen3_dualpipe_pp4()
    split = best_split(model, req.cluster, par, stack, costs.known(par))
    even = megatron_split(model, req.cluster, par, stack, costs.known(par))
    assert split.bounds != even.bounds
    assert split.partition.rank_memory_bytes[0] == pytest.approx(
        split.partition.chunks[0].memory_bytes + split.partition.chunks[3].memory_bytes)
    faster = costs._simulated(par, split, costs.known(par)).metrics.step_time_s
    slower = costs._simulated(par, even, costs.known(par)).metrics.step_time_s
    assert faster < slower
    plan = costs.refined(par)
    assert plan.notes[-1].startswith("stage split: ilp")
    assert tuple((s.first, s.last) for s in plan.stages) == split.bounds
    assert plan.metrics.step_time_s == pytest.approx(faster)


def test_dualpipe_falls_back_to_the_even_split_when_the_partitioner_fails(monkeypatch):
    """A solver that finds no split in its time limit (the boundary MILP on layers that differ)
    leaves DualPipe on Megatron's even split where that fits, labelled, not a false memory
    rejection."""
    from planner.search import costs as search_costs

    def fail(*args, **kwargs):
        raise PartitionError("the highs solver failed (no split within 2 s)")

    monkeypatch.setattr(search_costs, "best_split", fail)
    *_, costs, par = _qwen3_dualpipe_pp4()
    plan = costs.refined(par)
    assert plan.notes[-1] == ("stage split: even (the partitioner: the highs solver failed "
                              "(no split within 2 s))")


def test_plan_partition_shows_both_ranks_of_each_dualpipe_stage():
    """DualPipe holds stage c on ranks c and pp - 1 - c: `plan partition` names both, and the
    memory it shows is that rank's (both of its stages)."""
    import re

    from typer.testing import CliRunner

    from planner.cli import app

    out = CliRunner().invoke(app, ["partition", "--pp", "4", "--dp", "8", "--schedule",
                                   "dualpipe"], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    rows = re.findall(r"│\s+(\d)\s+│\s+([\d, ]+?)\s+│.*│\s+([\d.]+)\s+│\n", out.output)[:4]
    assert [(stage, ranks) for stage, ranks, _ in rows] == [
        ("0", "0, 3"), ("1", "1, 2"), ("2", "1, 2"), ("3", "0, 3")]
    assert rows[0][2] == rows[3][2] and rows[1][2] == rows[2][2]
