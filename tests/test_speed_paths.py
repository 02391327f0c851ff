"""The search's speed paths of issue #17 (bench_solve.py's 2 s cases) give exactly what the plain
code gives: each cached or rewritten function against the plain version it replaced, the
partitioner's shortcut that keeps the even split without a solve against the MILP on random
small cases, and an interleaved search whose plans must be identical with every path swapped back.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core.parallel import Parallel
from planner.cost import gemm, layer
from planner.cost.memory import Shape
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.load import load_model
from planner.partitioning import dp, lexicographic, options
from planner.partitioning.prepared import prepare
from planner.partitioning.problem import TIE_RTOL, PartitionError, PartitionProblem
from planner.partitioning.solve import partition
from planner.predict import chunks, layer_costs, pipeline_schedule, step
from planner.predict.chunks import CostTable
from planner.search.request import Pins, Request
from planner.search.solver import search
from planner.stack import default_stack

A100 = load_hardware("a100-80gb")


# --- the references: each function as written before it was made fast -------------------------

def chunk_options_reference(prep, ub, chunk_cap=None):
    K, p, R, L = prep.K, prep.p, prep.R, prep.L
    N = L - 2
    pr = prep.problem
    t, a, s = pr.time_s, pr.act_bytes, pr.state_bytes
    nmin = [0 if k in (0, K - 1) else 1 for k in range(K)]
    if K == 1:
        nmin = [N]
    edges = [([0] if k == 0 else []) + ([L - 1] if k == K - 1 else []) for k in range(K)]
    slow = math.inf if chunk_cap is None else chunk_cap * (1 + TIE_RTOL) + 1e-300

    def cost(k, n, r):
        e = edges[k]
        tm = float(sum(t[i, r] for i in e) + n * t[1, r] + prep.bnd[k])
        mem = float(sum(s[i] for i in e) + n * s[1]
                    + prep.inflight[k] * (sum(a[i, r] for i in e) + n * a[1, r]))
        return tm, mem

    def partial_cost(k, n, o):
        b, f = pr.partial
        c = o - R + 1
        tm, mem = cost(k, n, b)
        return (tm + c * float(t[1, f] - t[1, b]),
                mem + float(prep.inflight[k] * c * (a[1, f] - a[1, b])))

    least = [min(cost(k, nmin[k], r) for r in range(R)) for k in range(K)]
    least_mem = [min(cost(k, nmin[k], r)[1] for r in range(R)) for k in range(K)]
    out = {}
    for k in range(K):
        rho = k % p
        others = [j for j in range(rho, K, p) if j != k]
        t_rest = sum(least[j][0] for j in others)
        m_rest = sum(least_mem[j] for j in others) + prep.extra[rho]
        nmax = N - (sum(nmin) - nmin[k])
        for r in range(R):
            for n in range(nmin[k], nmax + 1):
                tm, mem = cost(k, n, r)
                if ub is not None and tm + t_rest > ub * (1 + 1e-7) or tm > slow:
                    break
                if mem + m_rest > prep.cap[r] * (1 + TIE_RTOL):
                    break
                out[k, n, r] = (tm, mem)
        if pr.partial is None:
            continue
        cap_f = prep.cap[pr.partial[1]] * (1 + TIE_RTOL)
        for n in range(max(nmin[k], 2), nmax + 1):
            if partial_cost(k, n, R)[0] > slow:
                break
            for c in range(1, n):
                o = R + c - 1
                tm, mem = partial_cost(k, n, o)
                if ub is not None and tm + t_rest > ub * (1 + 1e-7) or tm > slow:
                    break
                if mem + m_rest > cap_f:
                    continue
                out[k, n, o] = (tm, mem)
                if len(others) == 0:
                    break
    by_chunk = [[] for _ in range(K)]
    for key in out:
        by_chunk[key[0]].append(key)
    return out, by_chunk


def rank_tables_reference(prep, cost, by_chunk):
    K, p, N = prep.K, prep.p, prep.L - 2
    ms = prep.cap_max if prep.cap_max > 0 else 1.0
    tau, patterns = [], []
    for rho in range(p):
        ks = list(range(rho, K, p))
        best = np.full(N + 1, math.inf)
        how = {}
        for level in sorted(set(prep.cap.tolist())):
            ok = {o[2] for k in ks for o in by_chunk[k] if prep.option_cap(o[2]) >= level}
            cap = level / ms * (1 + TIE_RTOL)
            states = np.array([[0.0, 0.0, prep.extra[rho] / ms]])
            for k in ks:
                opts = np.array([(o[1], cost[o][0], cost[o][1] / ms, o[1], o[2])
                                 for o in by_chunk[k] if o[2] in ok]).reshape(-1, 5)
                S, O = len(states), len(opts)
                both = np.concatenate([
                    (states[:, None, :3] + opts[None, :, :3]).reshape(-1, 3),
                    np.repeat(states[:, 3:], O, axis=0),
                    np.tile(opts[:, 3:], (S, 1))], axis=1)
                states = options._pareto(both[(both[:, 2] <= cap) & (both[:, 0] <= N)])
                if not len(states):
                    break
            else:
                for row in states:
                    c = int(row[0])
                    if row[1] < best[c]:
                        best[c] = row[1]
                        how[c] = tuple((int(row[3 + 2 * i]), int(row[4 + 2 * i]))
                                       for i in range(len(ks)))
        tau.append(best)
        patterns.append(how)
    return np.array(tau), patterns


def split_stages_reference(tables, bounds, modes, counts=None, blocks=None):
    first = np.array([a for a, _ in bounds])
    last = np.array([b for _, b in bounds])
    counts = list(counts) if counts is not None else [None] * len(modes)
    segs = [chunks.partial_segments(blocks, a, b, m, n) if n is not None else [(m, a, b)]
            for (a, b), m, n in zip(bounds, modes, counts)]
    sums = {name: np.array([sum(tables[m].prefix[name][j] - tables[m].prefix[name][i]
                                for m, i, j in seg) for seg in segs])
            for name in chunks._SUMMED}
    work = np.array([max(tables[m].work_bytes[i:j].max() for m, i, j in seg if j > i)
                     for seg in segs])
    return chunks.ChunkArrays(first=first, last=last, recompute=tuple(modes), work_bytes=work,
                              **sums)


def band_reference(prep, k, W, by_end):
    L = prep.L
    a = np.arange(L + 1)[:, None]
    w = np.arange(1, W + 1)[None, :]
    i, j = (a - w, a) if by_end else (a, a + w)
    valid = (i >= 0) & (j <= L)
    i, j = np.clip(i, 0, L), np.clip(j, 0, L)
    time = prep.pt[j] - prep.pt[i] + prep.bnd[k]
    mem = (prep.ps[j] - prep.ps[i])[:, :, None] + prep.inflight[k] * (prep.pa[j] - prep.pa[i])
    fits = (mem + prep.extra[k % prep.p] <= dp._cap(prep.cap)) & valid[:, :, None]
    count = prep.least_partial(k, i, j) * valid
    if prep.nb is not None:
        b = prep.problem.partial[0]
        q = prep.nb[i]
        t_part = prep.pt[j, b] - prep.pt[i, b] + prep.dt[q + count] - prep.dt[q] + prep.bnd[k]
        time = np.concatenate([time, t_part[:, :, None]], axis=2)
        fits = np.concatenate([fits, (count > 0)[:, :, None]], axis=2)
    return time, fits, count


def uniform_problem(rng: np.random.Generator, partial: bool = False):
    """An embedding, n identical blocks and a head, with R modes and a random capacity; K, p."""
    n, p, v, R = (int(rng.integers(2, 13)), int(rng.integers(1, 4)), int(rng.integers(2, 4)),
                  int(rng.integers(1, 4)))
    if partial:
        R = max(R, 2)
    K = p * v

    def row():
        t = float(rng.integers(1, 10)) + np.cumsum(rng.integers(0, 4, R)) - 0.0  # slower recomputing
        a = np.floor(float(rng.integers(0, 7)) / (1 + np.arange(R)))
        return t, a, float(rng.integers(0, 6))

    rows = [row()] + [row()] * n + [row()]
    time_s, act = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    state = np.array([r[2] for r in rows])
    inflight = np.array([min(K - k, int(rng.integers(1, 5))) for k in range(K)], float)
    total = state.sum() + inflight.max() * act[:, 0].sum()
    cap = float(total * rng.uniform(0.2, 1.2) / p + 1)
    modes = ("none", "selective", "full")[:R]
    prob = PartitionProblem(time_s, state, act, inflight, cap, modes,
                            float(rng.choice([0.0, 1.0])),
                            partial=(0, R - 1) if partial else None)
    return prob, K, p


# --- each path against its reference ------------------------------------------------------------

@pytest.mark.parametrize("seed", range(40))
def test_chunk_options_and_rank_tables_match_the_plain_code(seed):
    rng = np.random.default_rng(seed)
    prob, K, p = uniform_problem(rng, partial=seed % 2 == 1)
    if K > prob.num_layers:
        return
    prep = prepare(prob, K, p)
    for ub, cap in ((None, None), (None, float(prob.time_s[1].max() * 3)), (40.0, None)):
        fast = options.chunk_options(prep, ub, cap)
        plain = chunk_options_reference(prep, ub, cap)
        assert fast == plain
        if any(not opts for opts in plain[1]):
            continue
        tau, how = options.rank_tables(prep, *fast)
        tau_ref, how_ref = rank_tables_reference(prep, *plain)
        assert np.array_equal(tau, tau_ref) and how == how_ref


@pytest.mark.parametrize("seed", range(20))
def test_dp_band_matches_the_plain_code(seed):
    rng = np.random.default_rng(500 + seed)
    prob, K, p = uniform_problem(rng, partial=seed % 2 == 1)
    if K > prob.num_layers:
        return
    prep = prepare(prob, K, p)
    for W in (1, 2, prep.L - prep.K + 1):
        for by_end in (True, False):
            for k in range(prep.K):
                for fast, plain in zip(dp._band(prep, k, W, by_end),
                                       band_reference(prep, k, W, by_end)):
                    assert np.array_equal(fast, plain)


@pytest.mark.parametrize("seed", range(100))
def test_keeping_the_even_split_without_a_solve_matches_the_milp(seed, monkeypatch):
    """The partitioner keeps Megatron's even split (``prefer``) without the master MILP where
    the rank bound proves it a tie (lexicographic._keep_proven); with that shortcut off the
    MILP decides, and every result must be the same."""
    rng = np.random.default_rng(1000 + seed)
    prob, K, p = uniform_problem(rng)
    if K > prob.num_layers - 1 or K == p:
        return
    q, rem = divmod(prob.num_layers, K)
    even = np.cumsum([q + (1 if k < rem else 0) for k in range(K)]).tolist()

    def run():
        try:
            res = partition(prob, K, p, prefer=even)
        except PartitionError as exc:
            return str(exc)
        return (res.boundaries, res.recompute, res.bottleneck_s, res.method, res.optimal,
                res.note)

    fired = []
    proven = lexicographic._keep_proven
    monkeypatch.setattr(lexicographic, "_keep_proven",
                        lambda *a: fired.append(proven(*a)) or fired[-1])
    fast = run()
    monkeypatch.setattr(lexicographic, "_keep_proven", lambda *a: False)
    assert fast == run()
    if any(fired):
        SHORTCUTS.append(seed)


SHORTCUTS: list[int] = []


def test_the_shortcut_was_taken_on_some_random_case():
    """Guards the comparison above against testing nothing (run after it, in file order)."""
    assert SHORTCUTS, "no random case kept the even split without a solve"


@pytest.mark.parametrize("seed", range(20))
def test_even_split_sums_match_the_segment_loop(seed):
    rng = np.random.default_rng(seed)
    model = load_model("llama3-8b")
    par = Parallel(tp=int(rng.choice([1, 2, 8])), pp=4, dp=1, micro_batch=int(rng.integers(1, 3)),
                   num_microbatches=8, recompute=str(rng.choice(["none", "full"])))
    table = CostTable(layer_costs.model_layer_costs(model, par, A100, default_stack(),
                                                    par.recompute))
    chunks_n = int(rng.integers(1, 9))
    bounds = chunks.even_block_bounds(model, chunks_n)
    fast = chunks.split_stages({par.recompute: table}, bounds, [par.recompute] * chunks_n)
    plain = split_stages_reference({par.recompute: table}, bounds, [par.recompute] * chunks_n)
    for name in (*chunks._SUMMED, "first", "last", "work_bytes"):
        assert np.array_equal(getattr(fast, name), getattr(plain, name)), name


def test_cached_pure_functions_answer_what_they_compute():
    shapes = [(4096.0, 4096.0, 1024.0), (37.5, 14336.0, 4096.0), (1.0, 1.0, 1.0)]
    for m, _, n in shapes:
        assert gemm.quantization_efficiency(m, n) == gemm.quantization_efficiency.__wrapped__(m, n)
    model = load_model("llama3-8b")
    shape = Shape(tp=2, sp=True, micro_batch=1, seq_len=model.seq_length)
    for lay in (model.layers[0], model.layers[1], model.layers[-1]):
        assert layer._work(lay, shape, True) == layer._work.__wrapped__(lay, shape, True)
    for args in (("1f1b", 4, 8, 1), ("interleaved", 4, 8, 3), ("gpipe", 2, 5, 1),
                 ("zb-h1", 4, 2, 1), ("zb-2p", 4, 64, 1), ("dualpipe", 4, 8, 1)):
        counts = pipeline_schedule.inflight_closed_form(*args)
        assert counts == list(pipeline_schedule.inflight_counts.__wrapped__(*args))
        counts.append(0)  # a caller changing its list does not change the remembered one
        assert pipeline_schedule.inflight_closed_form(*args) == counts[:-1]


# --- an interleaved search: identical plans with every path swapped back ------------------------

def _plans(result):
    return [(p.parallel, p.metrics, p.stages, p.rank_memory_bytes, p.notes) for p in result.plans]


def test_interleaved_search_gives_the_same_plans_as_the_plain_code(monkeypatch):
    req = Request(model=load_model("gpt3-175b"), cluster=make_cluster(A100, 64, 8),
                  global_batch=256, pins=Pins(schedule="interleaved", tp=8), top=5, refine=4)
    fast = search(req)
    monkeypatch.setattr(lexicographic, "_keep_proven", lambda *a: False)
    monkeypatch.setattr(options, "chunk_options", chunk_options_reference)
    monkeypatch.setattr(options, "rank_tables", rank_tables_reference)
    monkeypatch.setattr(chunks, "split_stages", split_stages_reference)
    monkeypatch.setattr("planner.search.costs.split_stages", split_stages_reference)
    monkeypatch.setattr(gemm, "quantization_efficiency", gemm.quantization_efficiency.__wrapped__)
    monkeypatch.setattr(layer, "_work", layer._work.__wrapped__)
    plain_counts = pipeline_schedule.inflight_counts.__wrapped__
    monkeypatch.setattr(pipeline_schedule, "inflight_counts", plain_counts)
    monkeypatch.setattr(step, "inflight_counts", plain_counts)
    monkeypatch.setattr(pipeline_schedule, "_rank_hops_s",
                        pipeline_schedule._rank_hops_s.__wrapped__)
    plain = search(req)
    assert fast.plans and (fast.screened, fast.refined) == (plain.screened, plain.refined)
    assert _plans(fast) == _plans(plain)
