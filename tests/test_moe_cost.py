"""Mixture-of-experts and MLA costs (planner/cost/moe.py, cost/mla.py) and expert parallelism in
the search: FLOPs by hand against the active parameters, expert sharding, the all-to-all's link
against the layout's own EP groups, expert optimizer sharding, the load knob, and the done-when
searches of issue #18 (Mixtral-8x7B on 64 H100s, a DeepSeek-V3 config on 2,048 GPUs)."""

import json
from dataclasses import replace

import pytest
from conftest import moe_config
from hypothesis import given, settings, strategies as st

from planner.core.parallel import Parallel
from planner.cost import moe
from planner.cost.layer import block_forward_flops, layer_cost, model_flops_per_iteration
from planner.cost.memory import Shape, sharded_params
from planner.hardware.profiles import load_hardware, make_cluster
from planner.layout.ranks import build_layout
from planner.model.load import model_from_dict
from planner.predict.memory import state_parts
from planner.predict.step import evaluate
from planner.search.request import Pins, Request
from planner.search.solver import search
from planner.stack import default_stack, with_overrides

H100 = load_hardware("h100")


MIXTRAL = model_from_dict(moe_config("mixtral-8x7b-v0.1", max_position_embeddings=4096), "mixtral")
DSV3 = model_from_dict(moe_config("deepseek-v3", num_nextn_predict_layers=0), "deepseek-v3")


def test_block_flops_are_twice_the_active_matmul_weights():
    """Forward FLOPs of a block's weight matmuls are 2 per active weight per token (norms and
    DeepSeek-V3's router bias are no matmul weights)."""
    for spec in (MIXTRAL, DSV3):
        for block in {b for b in spec.blocks}:
            gemm, _ = block_forward_flops(block, tokens=1000, seq_len=4096)
            weights = block.active_params - block.norm_params - (
                block.num_experts if block.router_bias else 0) - (
                block.q_lora_rank + block.kv_lora_rank)  # MLA's latent norms
            assert gemm == pytest.approx(2 * 1000 * weights, rel=1e-12)


def test_mla_attention_flops_by_hand():
    """Scores over heads of 128 + 64 and values over heads of 128, full s×s: 2·T·s·H·(192+128)."""
    block = DSV3.blocks[5]
    _, attn = block_forward_flops(block, tokens=4096, seq_len=4096)
    assert attn == 2 * 4096 * 4096 * 128 * (192 + 128)


def test_model_flops_count_active_parameters():
    """A step's model FLOPs: 6 per active matmul weight per token, plus attention; the routed
    experts a token skips cost nothing (the MFU numerator)."""
    s = 4096
    flops = model_flops_per_iteration(MIXTRAL, 1, s)
    embedding = MIXTRAL.vocab_size * MIXTRAL.hidden_size
    norms = sum(layer.norm_params for layer in MIXTRAL.blocks) + MIXTRAL.hidden_size
    matmul = MIXTRAL.active_params - embedding - norms
    attention = 3 * 4 * s * s * MIXTRAL.hidden_size * MIXTRAL.num_layers
    assert flops == pytest.approx(6 * s * matmul + attention, rel=1e-9)


@given(ep=st.sampled_from([1, 2, 4, 8]), etp=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2]))
def test_expert_weights_split_over_ep_times_etp(ep, etp, tp):
    block = MIXTRAL.blocks[0]
    dense = block.params - block.expert_params
    on_gpu = sharded_params(block, tp, ep, etp)
    assert on_gpu == pytest.approx((dense - block.norm_params) / tp + block.norm_params
                                   + block.expert_params / (ep * etp))
    shape = Shape(tp=tp, sp=tp > 1, micro_batch=1, seq_len=4096, ep=ep, etp=etp)
    assert moe.local_expert_params(block, shape) * ep * etp == block.expert_params


@pytest.mark.parametrize("tp, dp, ep, etp, per_node", [
    (1, 16, 8, 1, 8), (2, 8, 8, 1, 8), (2, 8, 4, 2, 4), (1, 32, 16, 1, 8), (4, 8, 8, 4, 2),
    (8, 4, 4, 8, 1),
])
def test_ep_members_per_domain_match_the_layout(tp, dp, ep, etp, per_node):
    """The all-to-all's NVLink share comes from ep_in_domain; Megatron's rank layout
    (layout/ranks.py, checked against a slow reference) puts that many EP members on a node."""
    layout = build_layout(tp, 1, dp, 8, ep=ep, etp=etp)
    for group in layout.ep_groups:
        nodes = [r // 8 for r in group]
        assert max(nodes.count(n) for n in nodes) == moe.ep_in_domain(etp, ep, 8) == per_node


def test_all_to_all_prices_the_link_it_crosses():
    block = MIXTRAL.blocks[0]
    inside = Shape(tp=1, sp=False, micro_batch=1, seq_len=4096, ep=8, etp=1, ep_in_domain=8)
    across = replace(inside, ep_in_domain=1)
    t_in, t_out = moe.dispatch_s(block, inside, H100), moe.dispatch_s(block, across, H100)
    nbytes = 2 * 4096 * 2 * 4096  # 16-bit, T tokens x top-2 x h
    from planner.cost import comm
    intra, inter = comm.links(H100)  # each derated by its measured efficiency
    assert t_in == pytest.approx(nbytes * 7 / 8 / intra.bytes_per_s + intra.latency_s)
    assert t_out == pytest.approx(nbytes * 7 / 8 / inter.bytes_per_s + inter.latency_s)
    assert moe.dispatch_s(MIXTRAL.blocks[0], replace(inside, ep=1), H100) == 0.0
    cost = layer_cost(block, inside, "none", H100)
    assert cost.a2a_s == pytest.approx(4 * t_in)  # dispatch + combine, forward and backward


def test_expert_optimizer_states_are_sharded_over_expert_dp():
    """Megatron's distributed optimizer shards expert parameters over the expert-DP group
    (tp·cp·dp / (etp·ep) ranks), dense ones over dp."""
    par = Parallel(tp=1, pp=1, dp=16, micro_batch=1, num_microbatches=1, zero=1, ep=8, etp=1)
    opts = default_stack()
    weights, grads, optim = state_parts(100.0, par, opts, expert_params=60.0)
    assert optim == pytest.approx(12 * 40 / 16 + 12 * 60 / 2)
    assert weights == pytest.approx(2 * 100)


def test_expert_load_slows_the_experts_but_not_model_flops():
    cluster = make_cluster(H100, 16, 2)
    par = Parallel(tp=1, pp=2, dp=8, micro_batch=1, num_microbatches=8, ep=8, etp=1)
    balanced = evaluate(MIXTRAL, cluster, par)
    skewed = evaluate(MIXTRAL, cluster, par, with_overrides(default_stack(), moe_expert_load=1.5))
    assert skewed.metrics.step_time_s > balanced.metrics.step_time_s
    assert skewed.metrics.mfu * skewed.metrics.step_time_s == pytest.approx(
        balanced.metrics.mfu * balanced.metrics.step_time_s)
    assert any("expert load 1.50x" in note for note in skewed.notes)


def test_a_plan_states_active_parameters_and_the_all_to_all():
    cluster = make_cluster(H100, 16, 2)
    par = Parallel(tp=1, pp=2, dp=8, micro_batch=1, num_microbatches=8, ep=8, etp=1)
    plan = evaluate(MIXTRAL, cluster, par)
    assert all(s.a2a_s > 0 for s in plan.stages)
    doc = plan.to_dict()
    assert doc["parallel"]["ep"] == 8 and doc["model"]["active_params"] == MIXTRAL.active_params
    assert any("12.9B of 46.7B parameters active" in note for note in plan.notes)


def test_mixtral_on_64_h100s_chooses_expert_parallelism():
    """Issue #18, done when: Mixtral-8x7B on 64 H100s in 8 nodes plans with ep > 1."""
    req = Request(model=MIXTRAL, cluster=make_cluster(H100, 64, 8), top=3, refine=8)
    result = search(req)
    assert result.plans and result.plans[0].parallel.ep > 1
    assert result.accounted
    assert result.rejected["ep does not divide the experts"] > 0
    assert all(p.model.num_experts % p.parallel.ep == 0 for p in result.plans)


def test_deepseek_v3_on_2048_h800s_chooses_expert_parallelism():
    """Issue #18, done when: a DeepSeek-V3 config (its main model: the multi-token-prediction
    layer is refused by name) on 2,048 H800s plans with ep > 1, the all-to-all in every stage
    holding MoE blocks."""
    req = Request(model=DSV3.with_seq_length(4096),
                  cluster=make_cluster(load_hardware("h800"), 2048, 256), global_batch=15360,
                  top=2, refine=6)
    result = search(req)
    best = result.plans[0]
    assert best.parallel.ep > 1 and result.accounted
    assert all(s.a2a_s > 0 for s in best.stages if any(
        layer.is_moe for layer in DSV3.layers[s.first:s.last]))


def test_pins_refuse_what_cannot_run(tmp_path):
    """--ep / --etp: one line, exit 2, for a dense model, an ep not dividing the experts and an
    etp not dividing the expert FFN; MoE with TP and without SP is a rule, as Megatron asserts."""
    from typer.testing import CliRunner
    from planner.cli import app
    from planner.search.explain import explain
    path = tmp_path / "config.json"
    path.write_text(json.dumps(moe_config("mixtral-8x7b-v0.1")))
    runner = CliRunner()
    for args, needle in ((["--ep", "2"], "dense model"),
                         (["--model", str(path), "--expert-load", "0.5"],
                          "'moe_expert_load' must be in [1.0, 64.0]"),
                         (["--model", str(path), "--ep", "3"], "does not divide the 8 experts"),
                         (["--model", str(path), "--etp", "5"], "expert FFN width")):
        result = runner.invoke(app, ["solve", "--gpus", "16", "--nodes", "2", *args])
        assert result.exit_code == 2, result.output
        assert needle in result.output and "Traceback" not in result.output
    req = Request(model=MIXTRAL, cluster=make_cluster(H100, 16, 2),
                  pins=Pins(tp=2, pp=1, ep=8, etp=1, sequence_parallel=False))
    assert explain(req).rule == "MoE with TP needs sequence parallel"


def test_moe_plan_json_validates_and_carries_the_experts(tmp_path):
    import jsonschema
    from planner.launchers import plan_json
    from typer.testing import CliRunner
    from planner.cli import app
    path = tmp_path / "config.json"
    path.write_text(json.dumps(moe_config("mixtral-8x7b-v0.1")))
    result = CliRunner().invoke(app, ["solve", "--gpus", "16", "--nodes", "2", "--gpu", "h100",
                                      "--model", str(path), "--seq-len", "4096", "--tp", "1",
                                      "--pp", "2", "--ep", "8", "--top", "1", "--export",
                                      "json,megatron", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "run" / "plan.json").read_text())
    jsonschema.Draft202012Validator(plan_json.schema()).validate(doc)
    assert doc["model"]["num_experts"] == 8 and doc["model"]["active_params"] < doc["model"][
        "params"]
    assert doc["parallel"]["ep"] == 8
    args = (tmp_path / "run" / "megatron_args.sh").read_text()
    assert "--num-experts 8" in args and "--moe-router-topk 2" in args
    assert "--expert-model-parallel-size 8" in args and "--expert-tensor-parallel-size 1" in args


TINY = model_from_dict(dict(name="tiny-moe", num_layers=4, hidden_size=512, num_attention_heads=8,
                            vocab_size=8000, seq_length=1024, mlp="swiglu", ffn_hidden_size=1024,
                            num_experts=8, moe_top_k=2, moe_ffn_hidden_size=512), "tiny")


@settings(max_examples=6, deadline=None)
@given(nodes=st.sampled_from([1, 2]), batch=st.sampled_from([16, 32]))
def test_search_accounts_for_every_expert_split(nodes, batch):
    """Every (ep, etp) the search considers is counted once: rejected, not refined or feasible,
    and the total is the space the pins allow."""
    from planner.search.space import space_size
    req = Request(model=TINY, cluster=make_cluster(H100, 8 * nodes, nodes), global_batch=batch,
                  top=3, refine=4)
    result = search(req)
    assert result.accounted and result.considered == space_size(req)


def test_the_search_finds_the_best_expert_split():
    """Exact on a small case: the unpinned search's best equals the best of the searches pinned
    to each ep (each exhaustive within its pin: refine covers all its feasible plans)."""
    cluster = make_cluster(H100, 8, 1)
    free = search(Request(model=TINY, cluster=cluster, global_batch=16, top=1, refine=10_000))
    pinned = [search(Request(model=TINY, cluster=cluster, global_batch=16, top=1, refine=10_000,
                             pins=Pins(ep=ep))).plans[0] for ep in (1, 2, 4, 8)]
    best = min(p.metrics.step_time_s for p in pinned)
    assert free.plans[0].metrics.step_time_s == pytest.approx(best, rel=1e-12)


def test_an_nvl72_domain_keeps_a_64_way_all_to_all_on_nvlink():
    """GB200 NVL72-like: 72 GPUs in one NVLink domain over 18 nodes of 4. EP 64 stays inside
    the domain (NVLink); the same EP on 8-GPU HGX nodes crosses the network."""
    nvl = replace(H100, nvlink_domain=72, gpus_per_node=4)
    hgx = replace(H100, nvlink_domain=8, gpus_per_node=8)
    par = Parallel(tp=1, pp=1, dp=72, micro_batch=1, num_microbatches=1, ep=8, etp=1)
    assert moe.shape_fields(replace(par, dp=64, ep=64), nvl, default_stack())["ep_in_domain"] \
        == 64
    assert moe.shape_fields(replace(par, dp=64, ep=64), hgx, default_stack())["ep_in_domain"] \
        == 8
    block = DSV3.blocks[5]  # 256 experts: ep 64 divides them
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=4096, ep=64, etp=1)
    inside = moe.dispatch_s(block, replace(shape, ep_in_domain=64), nvl)
    across = moe.dispatch_s(block, replace(shape, ep_in_domain=8), hgx)
    assert inside < across


@settings(max_examples=6, deadline=None)
@given(nodes=st.sampled_from([1, 2]), batch=st.sampled_from([16, 64]), seed=st.integers(0, 10**6))
def test_bound_is_below_every_refined_moe_step(nodes, batch, seed):
    """search/bound.py stays a lower bound with experts (their DP sync over the expert-DP group,
    possibly none): for screened MoE configurations the bound never exceeds the refined step."""
    import random
    from collections import Counter
    from planner.search.costs import SearchCosts
    from planner.search.solver import screen
    from planner.search.space import enumerate_configs
    req = Request(model=TINY, cluster=make_cluster(H100, 8 * nodes, nodes), global_batch=batch)
    costs = SearchCosts(req)
    kept = screen(req, costs, list(enumerate_configs(req, Counter())), Counter())
    random.Random(seed).shuffle(kept)
    for par in kept[:20]:
        plan = costs.refined(par)
        if isinstance(plan, str):
            continue
        for with_memory in (False, True):
            bound = costs.bound(par, with_memory=with_memory)
            assert bound.value() <= plan.metrics.step_time_s * (1 + 1e-9), par


def test_experts_sync_over_the_expert_dp_group_only():
    """With ep x etp covering a stage's ranks (expert DP of one) the experts' gradients are not
    reduced at all: the step pays what the dense parameters alone cost; with an expert DP of two
    the experts' reduction is added."""
    from planner.predict.data_parallel import dp_exposed_s
    from planner.predict.chunks import ChunkArrays
    import numpy as np
    cluster = make_cluster(H100, 8, 1)
    opts = with_overrides(default_stack(), overlap_grad_reduce=False, overlap_param_gather=False)
    z = np.zeros(1)

    def chunk(params, experts):
        return ChunkArrays(first=z, last=z, recompute=("none",), fwd_s=z, bwd_input_s=z,
                           bwd_weight_s=z, params=np.array([params]), act_bytes=z, work_bytes=z,
                           model_flops=z, hardware_flops=z, expert_params=np.array([experts]),
                           a2a_s=z)
    full = Parallel(tp=1, pp=1, dp=8, micro_batch=1, num_microbatches=1, zero=0, ep=8, etp=1)
    dense_only = dp_exposed_s(full, cluster, opts, chunk(10e6, 0.0))[0]
    assert dense_only > 0
    assert dp_exposed_s(full, cluster, opts, chunk(100e6, 90e6))[0] == pytest.approx(dense_only)
    half = replace(full, ep=4)  # expert DP of 2: the experts' all-reduce over pairs too
    assert dp_exposed_s(half, cluster, opts, chunk(100e6, 90e6))[0] > dense_only * 1.5


def test_profiling_refuses_moe_blocks():
    """The profiler builds dense blocks: an MoE model is refused, never measured as dense."""
    from planner.core.errors import PlanInputError
    from planner.profiling.profiler import profile_model
    with pytest.raises(PlanInputError, match="mixture-of-experts blocks are not measured"):
        profile_model(TINY)


def test_an_moe_block_has_no_dense_tp_pair_for_its_experts():
    """Megatron-Core's MoE layer runs on the sequence-parallel shard: a block's dense-TP
    collectives are the attention's pair and the shared experts' pair (cost/moe.py
    block_tp_pairs); the routed experts' only TP traffic is the expert-TP gather in dispatch_s,
    none at etp 1. So a block holds one pair without shared experts (Mixtral), two with them
    (DeepSeek-V3), where a dense block holds two."""
    from planner.cost.layer import _work

    shape = Shape(tp=4, sp=True, micro_batch=1, seq_len=4096, ep=8, etp=1, ep_in_domain=8)
    mixtral, dsv3 = MIXTRAL.blocks[0], next(b for b in DSV3.blocks if b.is_moe)
    assert not mixtral.shared_ffn_hidden_size and dsv3.shared_ffn_hidden_size
    for block, pairs in ((mixtral, 1), (dsv3, 2)):
        work = _work(block, shape, True)
        assert (work.collectives, work.collectives_bwd) == (pairs, pairs)
        assert moe.dispatch_s(block, shape, H100) == moe.all_to_all_s(
            moe.dispatch_bytes(block, shape), 8, 8, H100)  # no expert-TP gather at etp 1
    dense = next(b for b in DSV3.blocks if not b.is_moe)
    assert moe.block_tp_pairs(dense) == _work(dense, shape, True).collectives == 2
