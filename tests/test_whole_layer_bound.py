"""The whole-layer bound on interleaved configurations (planner/search/bound.py
`whole_layer_bound`) is below the simulated step of every split it covers: by brute force over
every split of small random cases, and against the refinement's plans of real ones; and it
sees what the chunks' linear relaxation does not (whole layers)."""

import itertools
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.pipeline.simulate import simulate
from planner.search.bound import whole_layer_bound
from planner.search.chunk_bound import interleaved_bound
from planner.search.costs import SearchCosts
from planner.search.request import Request
from planner.search.solver import screen
from planner.search.space import enumerate_configs


def _splits(layers: int, chunks: int):
    for cuts in itertools.combinations(range(1, layers), chunks - 1):
        ends = (0,) + cuts + (layers,)
        yield [(ends[k], ends[k + 1]) for k in range(chunks)]


# One test per pipeline shape, 15 examples each (60 in all, as when it was one test): each
# prints its own progress, where one test of all four ran for over a minute without a word.
@pytest.mark.parametrize("p, v", [(2, 2), (2, 3), (3, 2), (3, 3)])
@settings(max_examples=15, deadline=None)
@given(data=st.data(), groups=st.integers(1, 3), modes=st.integers(1, 2),
       extra_layers=st.integers(0, 3), uniform=st.booleans(), forced=st.floats(0.0, 1.0))
def test_below_the_best_split_by_brute_force(p, v, data, groups, modes, extra_layers, uniform,
                                             forced):
    """Random layer times (uniform middle layers, as in most models, or not; a second, slower
    mode), transfers and a floor W on the total work (what memory forces: the bound is given
    W and each layer's fastest time): the bound is at most the least simulated interleaved
    step of every split into p·v chunks, with a mode per chunk, whose total work is >= W."""
    K, m = p * v, p * groups
    L = K + extra_layers
    floats = lambda lo, hi, n: np.array(data.draw(st.lists(st.floats(lo, hi), min_size=n,
                                                           max_size=n)))
    fwd, bwd = floats(0.1, 2.0, L), floats(0.1, 4.0, L)
    if uniform:  # embedding and head apart, every layer alike
        fwd[1:-1], bwd[1:-1] = fwd[1], bwd[1]
    slower = np.array([1.0, 1.4][:modes])
    comm = floats(0.0, 0.5, K - 1)
    fastest = fwd + bwd
    floor = float(fastest.sum()) * (1 + forced * (slower[-1] - 1))
    best = float("inf")
    for split in _splits(L, K):
        for chosen in itertools.product(range(modes), repeat=K):
            f = [fwd[a:b].sum() * slower[mu] for (a, b), mu in zip(split, chosen)]
            bw = [bwd[a:b].sum() * slower[mu] for (a, b), mu in zip(split, chosen)]
            if sum(f) + sum(bw) < floor * (1 - 1e-12):
                continue  # the floor rules this one out
            best = min(best, simulate("interleaved", p, m, v, fwd_s=f, bwd_s=bw, comm_s=comm,
                                      method="full", timeline=False).makespan_s)
    got = whole_layer_bound(p, v, m, fastest, floor, comm)
    assert got <= best * (1 + 1e-9), (got, best)


def test_whole_layers_beat_the_linear_relaxation():
    """Uniform blocks, one per chunk (GPT-3's 96 on 16 ranks x 6 chunks, small here: 12 on
    4 x 3): a rank cannot hand a fraction of a block to another to make up for its fill, so the
    bound is above the chunks' linear relaxation, and within the simulated even split."""
    p, v, m = 4, 3, 16
    t = np.array([0.2] + [1.0] * 12 + [0.5])
    fwd, bwd = t / 3, 2 * t / 3
    got = whole_layer_bound(p, v, m, t)
    linear = interleaved_bound(p, v, m, fwd[:, None], bwd[:, None], np.zeros((len(t), 1)),
                               np.zeros(len(t)), np.ones(p * v), 1.0, None,
                               np.zeros(p * v - 1), integer=False)
    ends = [0, 2] + list(range(3, 13)) + [14]
    f = [fwd[a:b].sum() for a, b in zip(ends, ends[1:])]
    b = [bwd[a:b].sum() for a, b in zip(ends, ends[1:])]
    step = simulate("interleaved", p, m, v, fwd_s=f, bwd_s=b, method="full",
                    timeline=False).makespan_s
    assert linear < got <= step
    # the busiest rank holds 3 blocks and the head: m·3.5 = 56, plus rank 3's fill of 2.2
    assert got >= (56 + 2.2) * (1 - 1e-6)


def _request(model, nodes, per_node, batch, gpu):
    spec = PRESETS[model].with_seq_length(2048)
    return Request(model=spec, cluster=make_cluster(load_hardware(gpu), nodes * per_node, nodes),
                   global_batch=batch)


@settings(max_examples=8, deadline=None)
@given(model=st.sampled_from(["megatron-1.7b", "llama2-7b", "megatron-7.5b"]),
       per_node=st.sampled_from([4, 8]), batch=st.sampled_from([32, 128]),
       gpu=st.sampled_from(["a100-80gb", "a100-40gb"]), seed=st.integers(0, 10**6))
def test_below_every_refined_interleaved_step(model, per_node, batch, gpu, seed):
    """Interleaved configurations of random cases (tight and loose memory): the search's bound,
    with and without memory, never exceeds the refined plan's step."""
    req = _request(model, 2, per_node, batch, gpu)
    costs = SearchCosts(req)
    kept = [par for par in screen(req, costs, list(enumerate_configs(req, Counter())), Counter())
            if par.schedule == "interleaved"]
    random.Random(seed).shuffle(kept)
    for par in kept[:8]:
        plan = costs.refined(par)
        if isinstance(plan, str):
            continue
        step = plan.metrics.step_time_s
        for with_memory in (False, True):
            assert costs.bound(par, with_memory=with_memory).value() <= step * (1 + 1e-9), par
