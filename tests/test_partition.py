"""Tests for the stage partitioner: ILP vs exact DP vs brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.partitioning.problem import TIE_RTOL, PartitionError, PartitionProblem
from planner.partitioning.split import fits
from planner.partitioning.baselines import equal_param_split, even_split
from planner.partitioning.dp import partition_dp
from planner.partitioning.solve import _highs_available, partition

SOLVERS = ["cbc"] + (["highs"] if _highs_available() else [])
# Property tests check the ILP's answers, not its speed: the solver's limit counts nodes, not
# seconds, so a loaded machine cannot turn a slow solve into a DP fallback
# (benchmarks/bench_partition.py measures speed).


def brute_force(prob: PartitionProblem, K: int, p: int):
    """Independent oracle: every split x modes, rule (C, B, T, lex) applied literally: the
    largest chunk C first (with one chunk per rank C = B, so v = 1 ranks by B as before)."""
    L, R = prob.num_layers, prob.num_modes
    bnd = np.broadcast_to(np.append(np.asarray(prob.boundary_s, float) * np.ones(K - 1), 0.0), (K,))
    extra = np.zeros(p) if prob.extra_bytes is None else prob.extra_bytes
    cap = np.broadcast_to(np.asarray(prob.capacity_bytes, float), (R,))
    best = None
    for cuts in itertools.combinations(range(1, L), K - 1):
        ends = list(cuts) + [L]
        for modes in itertools.product(range(R), repeat=K):
            rt, rm, tot, i = [0.0] * p, list(extra), 0.0, 0
            rc = [float(cap.max())] * p  # a rank's capacity: the smallest of its chunks' modes
            for k, (e, r) in enumerate(zip(ends, modes)):
                t = float(prob.time_s[i:e, r].sum())
                rt[k % p] += t + bnd[k]
                rm[k % p] += float(prob.state_bytes[i:e].sum() + prob.inflight[k] * prob.act_bytes[i:e, r].sum())
                rc[k % p] = min(rc[k % p], float(cap[r]))
                tot += t
                i = e
            if any(m > c for m, c in zip(rm, rc)):
                continue
            largest = max(float(prob.time_s[a:e, r].sum()) + bnd[k] for k, (a, e, r) in
                          enumerate(zip([0] + ends[:-1], ends, modes)))
            key = (largest, max(rt), tot, [x for pair in zip(ends, modes) for x in pair])
            if best is None or key < best[0]:
                best = (key, tuple(ends), tuple(prob.modes[r] for r in modes))
    return best


@st.composite
def instances(draw, max_layers=12, max_p=4, max_v=1):
    L = draw(st.integers(1, max_layers))
    p = draw(st.integers(1, max_p))
    v = draw(st.integers(1, max_v))
    K = p * v
    R = draw(st.integers(1, 3))
    ints = lambda lo, hi, n: np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), float)  # noqa: E731
    base = ints(1, 9, L)
    extra_t = ints(0, 3, L * R).reshape(L, R)
    extra_t[:, 0] = 0
    time_s = base[:, None] + np.cumsum(extra_t, axis=1)  # more recompute => more time
    act0 = ints(0, 6, L)
    act = np.stack([np.floor(act0 / (1 + r)) for r in range(R)], axis=1)  # ... and less memory
    state = ints(0, 5, L)
    inflight = np.array([min(K - k, draw(st.integers(1, 4))) for k in range(K)], float)
    total = state.sum() + inflight.max() * act0.sum()
    cap = _capacity(draw, total, R)
    boundary = float(draw(st.sampled_from([0, 0, 1])))
    modes = ("none", "selective", "full")[:R]
    prob = PartitionProblem(time_s, state, act, inflight, cap, modes, boundary)
    return prob, K, p


def _capacity(draw, total: float, R: int):
    """One capacity, or one per mode that shrinks with more recompute (as a larger transient and
    more fragmentation make it): the MILP and the DP must both hold a rank to its modes' least."""
    cap = float(draw(st.integers(0, int(total) + 2)))
    if R == 1 or draw(st.booleans()):
        return cap
    cuts = np.cumsum([0] + draw(st.lists(st.integers(0, 3), min_size=R - 1, max_size=R - 1)))
    return tuple(float(max(cap - c, 0)) for c in cuts)


@st.composite
def uniform_instances(draw, max_blocks=10, max_p=4, max_v=1):
    """Embedding, N identical blocks, head: the shape the block-count MILP solves."""
    n = draw(st.integers(1, max_blocks))
    p = draw(st.integers(1, max_p))
    v = draw(st.integers(1, max_v))
    K = p * v
    R = draw(st.integers(1, 3))
    ints = lambda lo, hi: float(draw(st.integers(lo, hi)))  # noqa: E731

    def layer():
        t = [ints(1, 9)]
        for _ in range(R - 1):
            t.append(t[-1] + ints(0, 3))
        a0 = ints(0, 6)
        return t, [np.floor(a0 / (1 + r)) for r in range(R)], ints(0, 5)

    first, block, last = layer(), layer(), layer()
    rows = [first] + [block] * n + [last]
    time_s = np.array([r[0] for r in rows])
    act = np.array([r[1] for r in rows])
    state = np.array([r[2] for r in rows])
    inflight = np.array([min(K - k, draw(st.integers(1, 4))) for k in range(K)], float)
    total = state.sum() + inflight.max() * act[:, 0].sum()
    cap = _capacity(draw, total, R)
    boundary = float(draw(st.sampled_from([0, 0, 1])))
    prob = PartitionProblem(time_s, state, act, inflight, cap, ("none", "selective", "full")[:R],
                            boundary)
    return prob, K, p


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uniform_instances())
def test_block_count_milp_matches_dp_on_uniform_models(case):
    """Uniform models take the block-count formulation: same optimum, split and modes as the DP,
    solved by the MILP itself (no fallback), and infeasible exactly when the DP says so."""
    prob, K, p = case
    if K > prob.num_layers:
        return
    dp = _outcome(lambda: partition_dp(prob, K, p))
    ilp = _outcome(lambda: partition(prob, K, p))
    _same(ilp, dp)
    if not isinstance(dp, PartitionError):
        assert ilp.method.startswith("ilp") and ilp.optimal and ilp.note == "", ilp.label


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uniform_instances(max_blocks=6, max_p=2, max_v=3))
def test_block_count_milp_with_virtual_stages_matches_brute_force(case):
    prob, K, p = case
    if K > prob.num_layers:
        return
    bf = brute_force(prob, K, p)
    ilp = _outcome(lambda: partition(prob, K, p))
    if bf is None:
        assert isinstance(ilp, PartitionError)
    else:
        assert not isinstance(ilp, PartitionError), ilp
        assert ilp.method.startswith("ilp") and ilp.optimal and ilp.note == "", ilp.label
        assert (ilp.bottleneck_s, ilp.boundaries, ilp.recompute) == (bf[0][1], bf[1], bf[2])


def _outcome(fn):
    try:
        return fn()
    except PartitionError as exc:
        return exc


def _same(a, b):
    assert isinstance(a, PartitionError) == isinstance(b, PartitionError), (a, b)
    if isinstance(a, PartitionError):
        return
    assert abs(a.bottleneck_s - b.bottleneck_s) <= TIE_RTOL * max(1.0, b.bottleneck_s)
    assert a.boundaries == b.boundaries and a.recompute == b.recompute


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_ilp_matches_dp_v1(case):
    prob, K, p = case
    dp = _outcome(lambda: partition_dp(prob, K, p))
    ilp = _outcome(lambda: partition(prob, K, p))
    _same(ilp, dp)
    if not isinstance(dp, PartitionError):
        assert dp.optimal and ilp.optimal and ilp.gap == 0.0
        assert fits(dp) and fits(ilp)
        # the answer must be the ILP's own, not the DP fallback (which would hide ILP bugs)
        assert ilp.method.startswith("ilp") and ilp.note == "", ilp.label


@settings(max_examples=40, deadline=None)
@given(instances(max_layers=8))
def test_cbc_matches_dp_v1(case):
    prob, K, p = case
    ilp = _outcome(lambda: partition(prob, K, p, solver="cbc"))
    _same(ilp, _outcome(lambda: partition_dp(prob, K, p)))
    if not isinstance(ilp, PartitionError):
        assert ilp.method == "ilp-cbc" and ilp.note == "", ilp.label


@settings(max_examples=80, deadline=None)
@given(instances(max_layers=7, max_p=3))
def test_dp_matches_brute_force(case):
    prob, K, p = case
    dp = _outcome(lambda: partition_dp(prob, K, p))
    bf = brute_force(prob, K, p) if K <= prob.num_layers else None
    if bf is None:
        assert isinstance(dp, PartitionError)
    else:
        assert not isinstance(dp, PartitionError), dp
        assert (dp.bottleneck_s, dp.boundaries, dp.recompute) == (bf[0][1], bf[1], bf[2])


@settings(max_examples=40, deadline=None)
@given(instances(max_layers=7, max_p=2, max_v=3))
def test_virtual_stages_match_exhaustive(case):
    prob, K, p = case
    bf = brute_force(prob, K, p) if K <= prob.num_layers else None
    ilp = _outcome(lambda: partition(prob, K, p))
    if bf is None:
        assert isinstance(ilp, PartitionError)
        return
    assert not isinstance(ilp, PartitionError), ilp
    assert ilp.method.startswith("ilp") and ilp.optimal and ilp.note == "", ilp.label
    assert (ilp.bottleneck_s, ilp.boundaries, ilp.recompute) == (bf[0][1], bf[1], bf[2])
    _same(partition_dp(prob, K, p), ilp)


def _vocab_model(blocks=30, K=4):
    """Embedding with huge state but cheap compute, 30 blocks, an expensive head."""
    L = blocks + 2
    t = np.ones((L, 1))
    t[0], t[-1] = 0.1, 6.0
    state = np.full(L, 1.0)
    state[0] = 8.0
    act = np.full((L, 1), 0.1)
    inflight = np.array([K - k for k in range(K)], float)
    return PartitionProblem(t, state, act, inflight, capacity_bytes=100.0, boundary_s=0.05)


@pytest.mark.parametrize("solver", SOLVERS)
def test_large_vocab_edges_get_fewer_blocks(solver):
    prob = _vocab_model()
    res = partition(prob, 4, 4, solver=solver)
    sizes = [c.last_exclusive - c.first for c in res.chunks]
    blocks = [sizes[0] - 1, sizes[1], sizes[2], sizes[3] - 1]  # drop embedding / head
    assert blocks[3] < min(blocks[1], blocks[2])
    assert blocks[0] <= min(blocks[1], blocks[2])
    even = even_split(prob, 4, 4)
    params = equal_param_split(prob, 4, 4, prob.state_bytes)
    assert res.bottleneck_s < even.bottleneck_s and res.bottleneck_s < params.bottleneck_s
    assert res.bottleneck_s == pytest.approx(partition_dp(prob, 4, 4).bottleneck_s)
    print(f"\noptimal {res.bottleneck_s:.2f}s {sizes}  even {even.bottleneck_s:.2f}s  params {params.bottleneck_s:.2f}s")


def test_too_many_stages_message():
    prob = _vocab_model(blocks=1)
    with pytest.raises(PartitionError, match=r"^cannot split 3 layers into 4 stages: use pp <= 3$"):
        partition(PartitionProblem(prob.time_s, prob.state_bytes, prob.act_bytes, [1, 1, 1, 1], 100.0), 4, 4)


@pytest.mark.parametrize("solver", SOLVERS + ["dp"])
def test_memory_too_small_message(solver):
    g = float(1 << 30)
    L = 8
    prob = PartitionProblem(
        np.ones((L, 2)) * [1.0, 1.3],
        np.full(L, 10 * g),
        np.ones((L, 2)) * [2 * g, 1 * g],
        [2.0, 1.0],
        capacity_bytes=30 * g,
        modes=("none", "full"),
    )
    with pytest.raises(PartitionError) as err:
        partition(prob, 2, 2, solver=solver)
    msg = str(err.value)
    assert msg.startswith("no split fits in 30.0 GiB per GPU: the smallest possible peak is 48.0 GiB on rank 0")
    assert msg.endswith("add recompute, pipeline stages or ZeRO")
    assert "\n" not in msg


def test_bad_inputs_are_partition_errors():
    prob = _vocab_model()
    with pytest.raises(PartitionError, match="inflight has 4 entries"):
        partition(prob, 8, 8)
    with pytest.raises(PartitionError, match="multiple of pp"):
        partition(prob, 5, 4)
    with pytest.raises(PartitionError, match="unknown solver"):
        partition(prob, 4, 4, solver="gurobi")


def test_deterministic_and_lp_file(tmp_path):
    prob = _vocab_model(blocks=60)
    a = partition(prob, 4, 4, lp_path=tmp_path / "m.lp")
    b = partition(prob, 4, 4)
    assert a == b
    assert (tmp_path / "m.lp").read_text().startswith("\\*")


def test_node_limit_falls_back_to_dp(monkeypatch):
    import planner.partitioning.lexicographic as mod

    monkeypatch.setattr(mod, "run_milp", lambda *a, **k: ("none", None))
    prob = _vocab_model()
    res = partition(prob, 4, 4, solver="cbc", node_limit=7)
    assert res.method == "dp"
    assert res.label == "dp (cbc solver failed: no split within 7 nodes a solve)"
    assert res.boundaries == partition_dp(prob, 4, 4).boundaries


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_solve_the_node_limit_stops_reads_as_feasible(solver):
    """A knapsack whose proof takes HiGHS some 30 nodes: stopped at 1 node the solve has an
    incumbent, not a proof (HiGHS says kSolutionLimit, which pulp alone cannot read), and the
    simplex iterations it took are counted; with room it is proven optimal."""
    import random

    import pulp

    from planner.partitioning import lexicographic

    rng = random.Random(1)
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize)
    x = [prob.add_variable(f"x{i}", cat="Binary") for i in range(40)]
    rows = [[rng.randint(20, 100) for _ in x] for _ in range(6)]
    prob += pulp.lpSum(rng.randint(20, 100) * xi for xi in x)
    for weights in rows:
        prob += pulp.lpSum(w * xi for w, xi in zip(weights, x)) <= sum(weights) // 2
    model = type("Model", (), {"prob": prob})()
    stopped = lexicographic.Work(node_limit=1)
    assert lexicographic.run_milp(model, solver, stopped)[0] == "feasible"
    roomy = lexicographic.Work()
    assert lexicographic.run_milp(model, solver, roomy)[0] == "optimal"
    if solver == "highs":
        assert 0 < stopped.iterations < roomy.iterations


def test_solver_crash_is_not_shown(monkeypatch):
    import planner.partitioning.lexicographic as mod

    def boom(*a, **k):
        raise RuntimeError("solver trace")

    monkeypatch.setattr(mod, "run_milp", boom)
    res = partition(_vocab_model(), 4, 4, solver="cbc")
    assert res.label == "dp (cbc solver failed: RuntimeError)"


def test_ilp_solves_a_real_memory_bound_instance_itself():
    """Llama-3-8B over 4 A100 stages, recompute none|full: memory binds on the first stages.
    A wrong worst-case bound once skipped their memory rows and the ILP's split was rejected."""
    from planner.stack import default_stack
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.load import load_model
    from planner.core.parallel import Parallel
    from planner.predict.stages import cost_tables, partition_problem

    spec, hw = load_model("llama3-8b"), load_hardware("a100-80gb")
    par = Parallel(tp=1, pp=4, dp=1, micro_batch=1, num_microbatches=16, recompute="full")
    tables = cost_tables(spec, par, hw, default_stack())
    prob = partition_problem(spec, make_cluster(hw, 4, 1), par, default_stack(), tables)
    ilp, dp = partition(prob, 4, 4), partition_dp(prob, 4, 4)
    assert ilp.method.startswith("ilp") and ilp.note == ""
    assert (ilp.boundaries, ilp.recompute) == (dp.boundaries, dp.recompute)


@pytest.mark.parametrize("name, pp, micro_batch, seq", [
    ("llama3-8b", 2, 1, 2048), ("llama3-8b", 4, 8, 8192), ("llama2-13b", 4, 2, 8192)])
def test_splits_that_recompute_are_checked_with_the_recompute_fragmentation(name, pp,
                                                                             micro_batch, seq):
    """Each case here fits only by recomputing, and recomputing costs its stage the larger
    fragmentation share and transient (0.5-8 GiB more than the light share would promise): the
    per-mode capacity must refuse every split rather than promise memory the rank lacks."""
    from planner.stack import default_stack
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.load import load_model
    from planner.core.parallel import Parallel
    from planner.predict.stages import best_split, cost_tables

    spec, hw = load_model(name).with_seq_length(seq), load_hardware("a100-80gb")
    par = Parallel(tp=1, pp=pp, dp=1, micro_batch=micro_batch, num_microbatches=4 * pp,
                   recompute="full")
    tables = cost_tables(spec, par, hw, default_stack())
    with pytest.raises(PartitionError, match="no split fits"):
        best_split(spec, make_cluster(hw, pp, 1), par, default_stack(), tables, "dp")


def _llama(pp, v=1, recompute="none", schedule=None, micro_batch=1):
    from planner.core.parallel import Parallel
    from planner.stack import default_stack
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.load import load_model
    from planner.predict.stages import cost_tables

    spec, hw = load_model("llama3-8b"), load_hardware("a100-80gb")
    par = Parallel(tp=1, pp=pp, dp=1, micro_batch=micro_batch, num_microbatches=4 * pp,
                   schedule=schedule or ("interleaved" if v > 1 else "1f1b"), virtual_stages=v,
                   recompute=recompute)
    stack = default_stack()
    return spec, make_cluster(hw, pp, 1), par, stack, cost_tables(spec, par, hw, stack)


def test_capacity_is_per_mode_and_a_rank_gets_the_least_of_its_modes():
    """Recompute leaves less room (larger transient, more fragmentation): the problem carries
    one capacity per mode, ordered so, and the split's ranks are held to their own modes'."""
    from planner.predict.stages import partition_problem

    spec, cluster, par, opts, tables = _llama(4, recompute="full", micro_batch=2)
    prob = partition_problem(spec, cluster, par, opts, tables)
    cap = dict(zip(prob.modes, prob.mode_capacity))
    assert cap["none"] > cap["full"] > 0
    res = partition(prob, 4, 4)
    assert fits(res) and res.method.startswith("ilp") and res.note == "", res.label
    assert set(res.recompute) == {"none", "full"}  # the first stages recompute, the last do not
    for c, rank_cap in zip(res.chunks, res.rank_capacity_bytes):
        assert rank_cap == cap[c.recompute]
    assert (res.boundaries, res.recompute) == (lambda d: (d.boundaries, d.recompute))(
        partition_dp(prob, 4, 4))


def test_the_milp_alone_reproduces_the_product_answers(monkeypatch):
    """The default (auto) splits chains with the DP; with the DP disabled and the MILP forced,
    `plan partition` and `plan solve` give the same splits and plans, and say the MILP made them."""
    import json

    from typer.testing import CliRunner

    import planner.partitioning.solve as solve_mod
    import planner.predict.stages as stages_mod
    from cli import app

    runner = CliRunner()
    before = runner.invoke(app, ["partition", "--model", "llama3-8b", "--pp", "4", "--json"])
    plans = runner.invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--json", "--top", "3"])
    assert before.exit_code == 0 and plans.exit_code == 0, before.output + plans.output

    def no_dp(*a, **k):
        raise AssertionError("the DP was called")

    monkeypatch.setattr(solve_mod, "partition_dp", no_dp)
    monkeypatch.setattr(stages_mod, "partition_dp", no_dp)
    after = runner.invoke(app, ["partition", "--model", "llama3-8b", "--pp", "4", "--json",
                                "--solver", "ilp"])
    assert after.exit_code == 0, after.output
    a, b = json.loads(after.output), json.loads(before.output)
    assert a["method"] in ("ilp-highs", "ilp-cbc") and b["method"] == "dp"
    assert a["optimal"]["stages"] == b["optimal"]["stages"]
    stages = [s["layers"][0] for s in a["optimal"]["stages"]]
    # the README's split; since partial recompute (Megatron's block method) stage 0 recomputes
    # 2 of its 8 blocks and takes one more block than the whole-chunk modes allowed
    assert stages == [0, 9, 18, 27]
    again = runner.invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--json", "--top", "3",
                                "--partition", "ilp"])

    def without_notes(doc):  # the digest names the plan with its notes
        return [{k: v for k, v in p.items() if k not in ("notes", "plan_digest")}
                for p in doc["plans"]]

    assert without_notes(json.loads(again.output)) == without_notes(json.loads(plans.output))
    for p in json.loads(again.output)["plans"]:
        assert any(n.startswith("stage split: ilp-") for n in p["notes"]), p["notes"]


def test_a_failed_solver_is_named_in_the_output_and_the_plan(monkeypatch):
    import json

    from typer.testing import CliRunner

    import planner.partitioning.lexicographic as mod
    from cli import app

    def boom(*a, **k):
        raise RuntimeError("solver trace")

    monkeypatch.setattr(mod, "run_milp", boom)
    runner = CliRunner()
    out = runner.invoke(app, ["partition", "--model", "llama3-8b", "--pp", "4", "--solver", "ilp"])
    assert out.exit_code == 0 and "solver failed: RuntimeError" in out.output, out.output
    assert "min-bottleneck split (dp (" in out.output and "trace" not in out.output
    res = runner.invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--pp", "2", "--json",
                              "--top", "2", "--partition", "ilp"])
    notes = [n for p in json.loads(res.output)["plans"] for n in p["notes"]
             if n.startswith("stage split:")]
    assert notes and all(n.startswith("stage split: dp (") and "solver failed: RuntimeError" in n
                         for n in notes), notes


def test_interleaved_chunks_are_split_unevenly_and_megatron_reads_them_back():
    """v = 2 with up to full recompute: early chunks hold more microbatches in flight, the head
    is costly, so the best split is far from even (with a mode per chunk); Megatron gets it as
    --pipeline-model-parallel-layout and it parses back to the same block counts."""
    from planner.launchers import megatron, parse_megatron_args
    from planner.partitioning.prepared import prepare
    from planner.partitioning.split import score_split
    from planner.predict.stages import best_split, partition_problem
    from planner.predict.chunks import even_block_bounds
    from planner.predict.step import evaluate

    spec, cluster, par, opts, tables = _llama(4, v=2, recompute="full")
    split = best_split(spec, cluster, par, opts, tables, "ilp")
    prob = partition_problem(spec, cluster, par, opts, tables)
    even = [b for _, b in even_block_bounds(spec, par.num_chunks)]
    even_b = min(score_split(prepare(prob, 8, 4), even, [r] * 8, method="even").bottleneck_s
                 for r in range(prob.num_modes))  # even, any one mode, memory ignored
    assert split.partition.method in ("ilp-highs", "ilp-cbc") and split.partition.optimal
    assert split.how.endswith("(ties broken by least recompute only)")
    assert split.partition.bottleneck_s < even_b * (1 - 1e-6)
    plan = evaluate(spec, cluster, par, opts, bounds=list(split.bounds),
                    recompute_per_chunk=list(split.recompute), tables=tables)
    blocks = megatron.block_counts(plan)
    assert len(set(blocks[1:-1])) > 1 or blocks[0] != blocks[-1]  # really uneven
    text = megatron.render(plan)["megatron_args.sh"]
    assert "--pipeline-model-parallel-layout" in text
    parsed = parse_megatron_args(text)
    assert parsed["stage_blocks"] == blocks and parsed["virtual_stages"] == 2


def test_interleaved_keeps_the_even_split_on_a_tie():
    """When no split beats the even one's largest chunk and bottleneck the MILP proves it and
    the even split stays (the interleaved schedule's step time still depends on where the slack
    sits). Without it the rule's step 0 (least largest chunk) finds the same split: under the
    rank bottleneck alone the lexicographic tie-break picked (1, 2, 5, 8), chunks of 1, 1, 3 and
    3 layers, whose interleaved step is longer."""
    prob = PartitionProblem(np.ones((8, 1)), np.zeros(8), np.zeros((8, 1)), np.ones(4), 1.0)
    res = partition(prob, 4, 2, prefer=[2, 4, 6, 8])
    assert res.boundaries == (2, 4, 6, 8) and res.optimal
    assert res.label.endswith("(even split kept: no split has a smaller largest chunk or "
                              "bottleneck)")
    plain = partition(prob, 4, 2)
    assert plain.bottleneck_s == res.bottleneck_s and plain.boundaries == (2, 4, 6, 8)


def test_highs_interleaved_tie_break_matches_the_exact_reference():
    """Found by a random draw of test_block_count_milp_with_virtual_stages_matches_brute_force:
    both splits have bottleneck 9 and compute 12; the tie-break rule (problem.py) picks ends
    (1, 2, 3, 5), which CBC and the DP return. HiGHS 1.16 at its default MIP feasibility
    tolerance proved (1, 2, 4, 5) optimal in step 3 (HIGHS_MIP_FEASIBILITY_TOLERANCE)."""
    prob = PartitionProblem(np.array([[1., 1, 1], [3, 4, 5], [3, 4, 5], [3, 4, 5], [2, 3, 3]]),
                            np.array([0., 3, 3, 3, 2]),
                            np.array([[1., 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [3, 1, 1]]),
                            np.array([1., 2, 2, 1]), np.array([16., 16, 14]),
                            ("none", "selective", "full"), 1.0)
    assert brute_force(prob, 4, 2)[1] == (1, 2, 3, 5)
    assert partition(prob, 4, 2, solver="highs").boundaries == (1, 2, 3, 5)


def test_milp_lower_bound_clear_of_the_highs_presolve_window():
    """The falsifying example of test_block_count_milp_with_virtual_stages_matches_brute_force
    (hypothesis, Dec 2026): rank 0 takes the embedding and 3 blocks recomputed (7 s, 0 bytes),
    rank 1 a block and the head without (6 s, exactly the capacity of 1 byte). The rank bound on B
    is B* itself; handed to HiGHS a relative 1e-9 below it (scaled: 7.8e-10, inside 0.2-1.4 x its MIP
    feasibility tolerance of 1e-9), HiGHS 1.16's presolve called the model infeasible and the DP
    answered (options.SOLVER_BOUND_RTOL)."""
    prob = PartitionProblem(
        np.array([[1., 1], [1, 2], [1, 2], [1, 2], [1, 2], [5, 6]]), np.zeros(6),
        np.array([[0., 0], [1, 0], [1, 0], [1, 0], [1, 0], [0, 0]]), np.ones(2), 1.0,
        ("none", "selective"))
    bf = brute_force(prob, 2, 2)
    assert (bf[0][1], bf[1], bf[2]) == (7.0, (4, 6), ("selective", "none"))
    for solver in SOLVERS:
        res = partition(prob, 2, 2, solver=solver)
        assert res.method == f"ilp-{solver}" and res.optimal and res.note == "", res.label
        assert (res.bottleneck_s, res.boundaries, res.recompute) == (7.0, (4, 6), ("selective", "none"))


def test_milp_bound_in_the_highs_window_no_longer_hides_the_optimum():
    """Same window, worse outcome (a random sweep of uniform instances, Dec 2026): with B's bound
    a relative 1e-9 below B* = 9 s (scaled by 12 s: 7.5e-10 below), HiGHS 1.16 proved the split
    (2, 7) of 10 s optimal, the DP's (3, 7) of 9 s fits (rank 0: 6 + 2 x 17 = 40 of 46 bytes)."""
    T = [[3., 3, 3]] + [[1., 3, 4]] * 5 + [[6., 6, 6]]
    A = [[5., 2, 1]] + [[6., 3, 2]] * 5 + [[4., 2, 1]]
    prob = PartitionProblem(np.array(T), np.array([2., 2, 2, 2, 2, 2, 0]), np.array(A),
                            np.array([2., 1]), 46.0, ("none", "selective", "full"))
    dp = partition_dp(prob, 2, 2)
    assert (dp.bottleneck_s, dp.boundaries) == (9.0, (3, 7))
    for solver in SOLVERS:
        res = partition(prob, 2, 2, solver=solver)
        assert res.method == f"ilp-{solver}" and res.optimal and res.note == "", res.label
        _same(res, dp)


def test_solver_bound_margin_stays_below_the_highs_window():
    """B is scaled to at most ~1 (milp.MilpModel.tscale: the heuristic's bottleneck), so the
    bound's margin is at most SOLVER_BOUND_RTOL in the solver's units: it must stay well under
    the 0.2 x mip_feasibility_tolerance where HiGHS's presolve trouble starts."""
    from planner.partitioning.lexicographic import HIGHS_MIP_FEASIBILITY_TOLERANCE
    from planner.partitioning.options import SOLVER_BOUND_RTOL

    assert SOLVER_BOUND_RTOL <= 0.01 * HIGHS_MIP_FEASIBILITY_TOLERANCE
