"""The interleaved chunks' bound (planner/search/chunk_bound.py) is below the simulated step of
every split it covers: by brute force over every split of small random cases, and against the
refinement's plans of real ones."""

import itertools
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.pipeline.simulate import simulate
from planner.search.chunk_bound import family_rows, interleaved_bound
from planner.search.costs import SearchCosts
from planner.search.request import Request
from planner.search.solver import screen, search
from planner.search.space import enumerate_configs


def _splits(layers: int, chunks: int):
    for cuts in itertools.combinations(range(1, layers), chunks - 1):
        ends = (0,) + cuts + (layers,)
        yield [(ends[k], ends[k + 1]) for k in range(chunks)]


@settings(max_examples=30, deadline=None)
@given(data=st.data(), p=st.integers(2, 3), v=st.integers(1, 3), groups=st.integers(1, 3),
       modes=st.integers(1, 2), extra_layers=st.integers(0, 3), tight=st.booleans())
def test_below_the_best_split_by_brute_force(data, p, v, groups, modes, extra_layers, tight):
    """Random layer times (a mode may be slower), memory and transfers: the bound, linear and
    mixed-integer, is at most the least simulated pipeline time (interleaved, or 1F1B for
    v = 1) of every split into p·v chunks with a mode per chunk whose ranks fit (inf only when
    none fits)."""
    K, m = p * v, p * groups
    L = K + extra_layers
    floats = lambda lo, hi, n: np.array(data.draw(st.lists(st.floats(lo, hi), min_size=n,
                                                           max_size=n)))
    fwd = floats(0.1, 2.0, L)[:, None] * np.array([1.0, 1.3][:modes])[None, :]
    bwd = floats(0.1, 4.0, L)[:, None] * np.array([1.0, 1.5][:modes])[None, :]
    act = floats(1.0, 10.0, L)[:, None] * np.array([1.0, 0.2][:modes])[None, :]
    state = floats(0.0, 10.0, L)
    inflight = np.array(data.draw(st.lists(st.integers(1, 2 * p), min_size=K, max_size=K)),
                        dtype=float)
    comm = floats(0.0, 0.5, K - 1)
    capacity = float((state.sum() + act.sum()) / (p if tight else 0.5))
    best = float("inf")
    for split in _splits(L, K):
        for chosen in itertools.product(range(modes), repeat=K):
            used = np.zeros(p)
            for k, ((a, b), mu) in enumerate(zip(split, chosen)):
                used[k % p] += state[a:b].sum() + inflight[k] * act[a:b, mu].sum()
            if (used > capacity).any():
                continue
            f = [fwd[a:b, mu].sum() for (a, b), mu in zip(split, chosen)]
            bw = [bwd[a:b, mu].sum() for (a, b), mu in zip(split, chosen)]
            if sum(m * (x + y) for x, y in zip(f, bw)) / p >= best:
                continue  # cannot beat the best (the busiest rank runs at least this)
            best = min(best, simulate("interleaved" if v > 1 else "1f1b", p, m, v, fwd_s=f,
                                      bwd_s=bw, comm_s=comm, method="full",
                                      timeline=False).makespan_s)
    for integer in (False, True):
        got = interleaved_bound(p, v, m, fwd, bwd, act, state, inflight, capacity, None, comm,
                                integer=integer)
        assert got <= best * (1 + 1e-9), (integer, got, best)
    if best < float("inf") and best > 0:  # the cut-off answers on the right side of it
        assert interleaved_bound(p, v, m, fwd, bwd, act, state, inflight, capacity, None, comm,
                                 cutoff=best * (1 - 1e-3)) <= best * (1 + 1e-9)


def test_family_rows_by_hand():
    """p = 2, v = 2, m = 2, no transfers: rank 1's rows include its first-round term
    f_0 + b_0 + m·T_1 and, with j = j' = 1, f_0 + f_2 - f_1 + m·T_1 + b_0 + b_2 - b_1."""
    rows, consts = family_rows(2, 2, 2, np.zeros(3))
    f0, f1, f2, f3 = np.eye(4)
    first = np.concatenate((f0 + 2 * (f1 + f3), f0 + 2 * (f1 + f3)))
    later = np.concatenate((f0 + f2 - f1 + 2 * (f1 + f3), f0 + f2 - f1 + 2 * (f1 + f3)))
    assert any(np.allclose(r, first) for r in rows)
    assert any(np.allclose(r, later) for r in rows)
    assert not consts.any()


def _request(model, nodes, per_node, batch, gpu):
    spec = PRESETS[model].with_seq_length(2048)
    return Request(model=spec, cluster=make_cluster(load_hardware(gpu), nodes * per_node, nodes),
                   global_batch=batch)


@settings(max_examples=6, deadline=None)
@given(model=st.sampled_from(["megatron-1.7b", "llama2-7b"]), per_node=st.sampled_from([4, 8]),
       batch=st.sampled_from([32, 128]), gpu=st.sampled_from(["a100-80gb", "a100-40gb"]),
       seed=st.integers(0, 10**6))
def test_below_every_refined_interleaved_step(model, per_node, batch, gpu, seed):
    """Interleaved and 1F1B configurations of random cases: the refined plan's step is never
    proven slower than itself, by the linear or the mixed-integer bound."""
    req = _request(model, 2, per_node, batch, gpu)
    costs = SearchCosts(req)
    kept = [par for par in screen(req, costs, list(enumerate_configs(req, Counter())), Counter())
            if par.schedule in ("interleaved", "1f1b")]
    random.Random(seed).shuffle(kept)
    for par in kept[:5]:
        plan = costs.refined(par)
        if isinstance(plan, str):
            continue
        step = plan.metrics.step_time_s * (1 + 1e-9)
        assert not costs.chunks_exceed(par, step), par


def test_the_default_solve_is_proven():
    """`plan solve --gpus 16 --nodes 2`: the configurations the cap leaves below plan 1 are
    interleaved or 1F1B, and their chunks' bound rules every one out."""
    req = Request(model=PRESETS["llama3-8b"], cluster=make_cluster(load_hardware("a100-80gb"),
                                                                   16, 2), global_batch=512)
    notes = search(req).notes
    assert any(n.startswith("plan 1 is proven the fastest") for n in notes), notes


def test_the_partitioner_still_solves_after_the_bound():
    """HiGHS sizes one task scheduler per process at its first run: the chunk bound runs it
    with the partitioner's one thread, so a stage split solved after it is still the MILP's (a
    fresh process, since an earlier test may have run the partitioner first)."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from planner.search.chunk_bound import interleaved_bound\n"
        "from planner.partitioning.problem import PartitionProblem\n"
        "from planner.partitioning.solve import partition\n"
        "one = np.ones((6, 1))\n"
        "interleaved_bound(2, 2, 4, one, one, one, np.ones(6), np.ones(4), 100.0, None,"
        " np.zeros(3))\n"
        "t = np.arange(1.0, 9.0)[:, None]\n"
        "prob = PartitionProblem(time_s=t, state_bytes=np.zeros(8), act_bytes=np.zeros((8, 1)),"
        " inflight=np.ones(4), capacity_bytes=1.0)\n"
        "print(partition(prob, 4, 2).method)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "ilp-highs", out
