"""Context parallelism (cost/context.py): the causal load balancing counted pair by pair, the
sequence rule, and what a CP rank's layer costs against the same layer without CP."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from planner.cost import comm, context
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape, activation_bytes
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.stack import default_stack, with_overrides


def _brute_pairs(seq_len: int, cp: int, rank: int, balanced: bool) -> int:
    """Query-key pairs of the rank's tokens, counted one by one (key <= query)."""
    c = seq_len // (2 * cp)
    chunks = (rank, 2 * cp - 1 - rank) if balanced else (2 * rank, 2 * rank + 1)
    mine = [i for k in chunks for i in range(k * c, (k + 1) * c)]
    return sum(1 for i in mine for j in range(seq_len) if j <= i)


@settings(max_examples=40, deadline=None)
@given(cp=st.integers(1, 6), c=st.integers(1, 6))
def test_balanced_split_gives_every_rank_the_same_causal_work(cp, c):
    s = 2 * cp * c
    counts = [context.causal_pairs(s, cp, r) for r in range(cp)]
    assert counts == [_brute_pairs(s, cp, r, True) for r in range(cp)]
    assert len(set(counts)) == 1  # Megatron's 2-chunk split balances exactly
    assert sum(counts) == s * (s + 1) // 2


def test_contiguous_split_leaves_the_last_rank_most():
    s, cp = 64, 4
    counts = [context.causal_pairs(s, cp, r, balanced=False) for r in range(cp)]
    assert counts == [_brute_pairs(s, cp, r, False) for r in range(cp)]
    assert counts[-1] > 1.7 * (s * (s + 1) / 2 / cp)  # about (2cp - 1)/cp of the mean


def test_sequence_rule_is_megatrons_2cp():
    assert context.sequence_problem(131072, 16) is None
    assert "divisible by 2*cp = 32" in context.sequence_problem(8192 + 16, 16)
    assert context.sequence_problem(7, 1) is None


def test_heads_rule_only_for_all_to_all():
    assert context.heads_problem(128, 8, 8, 16, "p2p") is None
    assert "heads per TP rank (16)" in context.heads_problem(128, 8, 8, 32, "a2a")
    assert context.heads_problem(128, 8, 8, 16, "a2a") is None


def test_all_to_all_moves_n_minus_1_over_n():
    link = comm.Link(100e9, 0.0)
    assert comm.all_to_all_s(8e9, 8, link) == pytest.approx(7 / 8 * 8e9 / 100e9)
    assert comm.all_to_all_s(8e9, 1, link) == 0.0


@pytest.fixture
def block():
    model = PRESETS["llama3-405b"]
    return next(layer for layer in model.layers if layer.kind == "block")


def test_cp_rank_does_1_over_cp_of_the_work(block):
    """Matmuls, attention and activations of a CP rank: 1/cp of the unsplit layer's."""
    hw = load_hardware("h100")
    whole = Shape(tp=8, sp=True, micro_batch=1, seq_len=131072)
    part = Shape(tp=8, sp=True, micro_batch=1, seq_len=131072 // 16, cp=16)
    full, mine = layer_cost(block, whole, "none", hw), layer_cost(block, part, "none", hw)
    assert mine.model_flops == pytest.approx(full.model_flops / 16)
    assert mine.act_bytes == pytest.approx(full.act_bytes / 16)
    assert activation_bytes(block, part, "full", True) == pytest.approx(
        activation_bytes(block, whole, "full", True) / 16)
    # the ring's transfers hide behind 8K-token attention blocks on NVLink: only the SMs they
    # hold (overlap interference) shows, a few percent of the layer
    assert full.fwd_s / 16 < mine.fwd_s < 1.05 * full.fwd_s / 16


def test_ring_hides_what_fits_and_exposes_the_rest():
    """p2p: cp - 1 transfers, each beside one of the cp equal attention steps; what does not fit
    is exposed, what fits costs the interference share."""
    link = comm.Link(1e9, 0.0)
    kv = context.kv_bytes(1, 1000, 128)  # 512,000 bytes = 0.512 ms on this link
    fwd, bwd = context.attention_comm_s(4, "p2p", 1, 1000, 1024, 128, link, attn_fwd_s=4e-3,
                                        attn_bwd_s=4e-4, interference=0.1)
    assert fwd == pytest.approx(3 * 0.1 * kv / 1e9)  # 1 ms steps hide 0.512 ms sends
    step = 1e-4  # backward steps of 0.1 ms cannot hide 1.024 ms sends of K/V and dK/dV
    assert bwd == pytest.approx(3 * ((2 * kv / 1e9 - step) + 0.1 * step))


def test_ring_across_a_slow_network_costs_more(block):
    hw = replace(load_hardware("h100"), inter_node_gbps=0.5)
    shape = Shape(tp=8, sp=True, micro_batch=1, seq_len=2048, cp=4)
    near = layer_cost(block, shape, "none", hw)
    far = layer_cost(block, replace(shape, cp_cross=True), "none", hw)
    assert far.fwd_s > near.fwd_s and far.bwd_input_s > near.bwd_input_s


@pytest.mark.parametrize("kind", ["p2p", "a2a", "allgather"])
def test_every_comm_type_costs_more_than_none_and_stays_finite(block, kind):
    hw = load_hardware("h100")
    stack = with_overrides(default_stack(), cp_comm=kind)
    shape = Shape(tp=8, sp=True, micro_batch=1, seq_len=8192, cp=4)
    base = layer_cost(block, replace(shape, cp=1), "none", hw, stack)
    cost = layer_cost(block, shape, "none", hw, stack)
    assert cost.bwd_input_s > 0 and cost.fwd_s > 0
    # same matmuls as an unsplit layer of 8192 tokens; more attention (keys of 32K tokens)
    assert cost.fwd_s > base.fwd_s


# --- the Llama 3 405B long-context phase (Llama Team 2024, "The Llama 3 Herd of Models",
# arXiv:2407.21783, sec. 3.3.2, Table 4: 16,384 GPUs, TP 8, CP 16, PP 16, sequence 131,072,
# batch size per DP 16, 16M tokens per batch, 380 TFLOPs/GPU, 38% BF16 MFU; the table prints
# DP 4, but 16,384 / (8 x 16 x 16) = 8 and 16M tokens need DP 8) --------------------------------


def test_llama3_405b_128k_published_layout_against_its_tflops():
    """The paper gives TFLOPs/GPU (380), not a step time: the predicted model TFLOPs/GPU of the
    published layout (the runs file's case, interleaved as its schedule says).

    Issue #18 asks for 15%; met since the case runs the paper's own interleaving (issue #15): v=8,
    one layer per model chunk (sec. 3.3.2: the first chunk keeps only the embedding after giving
    up one layer), where the smallest interleaving v=2 was guessed before and read 303, -20%.
    Now 389, +2.4%. Recompute is still guessed full: the paper accumulates gradients in FP32 over
    the microbatches ("we use FP32 gradient accumulation during backward computation over
    multiple micro-batches", sec. 3.3.2, Numerical stability), so each rank holds its stage's
    whole fp32 gradients (megatron-core's once-per-step reduce-scatter) and recompute none does
    not fit. Pinned at today's value."""
    from planner.fidelity.cases import MODERN_FILE, load_cases
    from planner.fidelity.published import validate_case

    case = next(c for c in load_cases(MODERN_FILE) if c["config"].get("cp") == 16)
    row = validate_case(case)
    assert row.predicted_tflops is not None and not row.predicted_oom
    assert row.predicted_tflops / 380 - 1 == pytest.approx(0.024, abs=0.03)
    assert "cp16" in row.configuration and "full" in row.configuration


def test_llama3_405b_128k_search_chooses_context_parallelism():
    """plan solve --model llama3-405b --seq-len 131072 --gpus 16384 --nodes 2048 --gpu h100:
    with the default batch (32 sequences of 128K) a plan without CP has at most 32 pipelines'
    worth of sequences for 16,384 GPUs and idles in its pipeline bubble (--cp 1: ~157 s a
    step); splitting the sequence over CP ranks fills the GPUs instead (~5.7 s)."""
    from planner import solve

    result = solve(16384, 2048, "llama3-405b", gpu="h100", seq_len=131072, top=3)
    assert result.plans and all(p.parallel.cp > 1 for p in result.plans)
    flat = solve(16384, 2048, "llama3-405b", gpu="h100", seq_len=131072, top=1, cp=1)
    assert result.plans[0].metrics.step_time_s < flat.plans[0].metrics.step_time_s / 5
    assert all(p.metrics.peak_memory_bytes <= 80 * 1024**3 for p in result.plans)
    assert "sequence not divisible by 2*cp" not in result.rejected


# --- the search's CP dimension: counted, and cp does not change the work ------------------------


@pytest.mark.parametrize("stack, seq, reason", [
    ("megatron-core", 16386, "sequence not divisible by 2*cp"),  # 16386 = 2 x 8193
    ("deepspeed", 32768, "deepspeed runs no context parallelism"),
])
def test_cp_rejections_are_counted_in_whole_configurations(stack, seq, reason):
    from planner.search.request import Request
    from planner.search.solver import search
    from planner.search.space import _context_size, context_degrees, space_size
    from planner.stack import load_stack

    req = Request(model=replace(PRESETS["llama3-8b"], seq_length=seq),
                  cluster=make_cluster(load_hardware("h100"), 16, 2), global_batch=64,
                  options=load_stack(stack), top=2, refine=2)
    assert context_degrees(req) == (1, 2, 4, 8, 16)
    result = search(req)
    assert result.considered == space_size(req) and result.accounted
    assert result.rejected[reason] == sum(_context_size(req, cp) for cp in (2, 4, 8, 16))
    assert all(p.parallel.cp == 1 for p in result.plans)


def test_short_sequences_search_no_cp_unless_pinned():
    from planner.search.request import Request, Pins
    from planner.search.space import context_degrees

    cluster = make_cluster(load_hardware("h100"), 16, 2)
    req = Request(model=PRESETS["llama3-8b"], cluster=cluster)
    assert context_degrees(req) == (1,)
    assert context_degrees(replace(req, pins=Pins(cp=2))) == (2,)


@settings(max_examples=15, deadline=None)
@given(cp=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4]),
       zero=st.sampled_from([0, 1, 2]))
def test_cp_keeps_the_step_flops_and_shards_states_over_dp_x_cp(cp, tp, zero):
    """Splitting the sequence moves work between GPUs, it does not add any: the model FLOPs per
    sequence are the same for every cp; model states shard over dp x cp like over dp."""
    from planner.core.parallel import Parallel
    from planner.predict.memory import state_bytes
    from planner.predict.step import evaluate

    model = replace(PRESETS["llama3-8b"], seq_length=16384)
    cluster = make_cluster(load_hardware("h100"), 64, 8)
    dp = 64 // (tp * cp * 2)
    par = Parallel(tp=tp, pp=2, dp=dp, micro_batch=1, num_microbatches=4, cp=cp, zero=zero,
                   sequence_parallel=tp > 1)
    flat = replace(par, cp=1, dp=dp * cp)
    plan, ref = evaluate(model, cluster, par), evaluate(model, cluster, flat)
    # per sequence: cp ranks share a sequence where the flat plan gives each rank its own
    def flops_per_sequence(p):
        return p.metrics.mfu * p.metrics.step_time_s / p.parallel.global_batch

    assert flops_per_sequence(plan) == pytest.approx(flops_per_sequence(ref), rel=1e-9)
    stack = default_stack()
    assert state_bytes(1e9, par, stack) == pytest.approx(state_bytes(1e9, flat, stack))
