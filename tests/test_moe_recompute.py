"""Megatron's selective recompute of named modules (planner/cost/recompute.py) and the MoE
tensors kept per routed copy (cost/moe.py kept_bytes), by hand against the tensors Megatron-Core's
code saves; the stack field's validation; the Qwen3-235B 'norm, act' rows of the validation set
no longer predicted out of memory; DeepEP's dispatch (cost/moe.py deepep_s) by enumeration and
by hand."""

import json
from dataclasses import replace as dc_replace
from itertools import combinations
from math import comb
from pathlib import Path

import pytest

from planner.core.errors import PlanInputError
from planner.cost import comm, constants, moe, recompute
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape, activation_bytes, working_bytes
from planner.fidelity.cases import MOE_FILE, load_cases
from planner.fidelity.published import validate_case
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model, model_from_dict
from planner.stack import default_stack, load_stack, with_overrides

H100 = load_hardware("h100")
CONFIG = Path(__file__).parent.parent / "profiles" / "validation" / "configs" / "qwen3-235b-a22b.json"
QWEN = model_from_dict(json.loads(CONFIG.read_text()), "qwen3-235b").with_seq_length(4096)
BLOCK = next(layer for layer in QWEN.layers if layer.kind == "block" and layer.is_moe)
H, F, K = BLOCK.hidden_size, BLOCK.ffn_hidden_size, BLOCK.moe_top_k  # 4096, 1536, 8


def shape(**changes) -> Shape:
    # the model zoo's cross-node row: TP 2 with sequence parallel, EP 32, ETP 1, micro-batch 1
    base = dict(tp=2, sp=True, micro_batch=1, seq_len=4096, ep=32, etp=1)
    base.update(changes)
    return Shape(**base)


def test_the_qwen3_block_is_what_the_config_says():
    assert (H, F, K, BLOCK.num_experts) == (4096, 1536, 8, 128)


def test_megatron_keeps_no_expert_output_per_routed_copy():
    # Per routed copy, Megatron-Core's grouped experts save the FC1 input (2h), the FC1 output
    # (gate and up, 2·2f) and the FC2 input (2f), and the activation's fp32 routing weight (4);
    # the routing weights multiply inside the activation, so no FC2 output (2h) is kept for them.
    copies = 4096 * K / 2  # T·k·etp/tp on one GPU
    with_output = moe.kept_bytes(BLOCK, shape())
    in_activation = moe.kept_bytes(BLOCK, shape(moe_probs_in_activation=True))
    assert with_output - in_activation == pytest.approx(copies * (2 * H - 4))
    router = 4 * 4096 * 128 / 2  # fp32 scores, sharded by SP
    assert in_activation == pytest.approx(router + copies * (2 * H + 6 * F + 4))


def test_the_stacks_say_where_the_routing_weights_apply():
    assert load_stack("megatron-core").moe_probs_in_activation
    assert not load_stack("torchtitan").moe_probs_in_activation
    assert not load_stack("deepspeed").moe_probs_in_activation


def test_layernorm_and_moe_act_discard_the_norm_outputs_and_the_fc2_inputs():
    copies = 4096 * K / 2
    none = activation_bytes(BLOCK, shape(), "none", flash=True)
    norm = activation_bytes(BLOCK, shape(recompute_modules=("layernorm",)), "selective", True)
    act = activation_bytes(BLOCK, shape(recompute_modules=("moe_act",)), "selective", True)
    both = activation_bytes(BLOCK, shape(recompute_modules=("layernorm", "moe_act")),
                            "selective", True)
    assert none - norm == pytest.approx(2 * 2 * 4096 * H / 2)  # two 16-bit norm outputs, SP
    assert none - act == pytest.approx(2 * copies * F)  # the 16-bit FC2 input of every copy
    assert none - both == pytest.approx((none - norm) + (none - act))


def test_core_attn_selective_is_korthikantis():
    # Megatron's default module: the scores dropped without flash, nothing with flash
    s = shape(ep=1, recompute_modules=("core_attn",))
    dense = next(layer for layer in load_model("llama3-8b").layers if layer.kind == "block")
    assert activation_bytes(dense, s, "selective", True) == activation_bytes(dense, s, "none",
                                                                             True)
    a, sq = dense.num_attention_heads, 4096 ** 2
    assert activation_bytes(dense, s, "none", False) - activation_bytes(
        dense, s, "selective", False) == pytest.approx(2 * a * sq / 2)  # no dropout: softmax


def test_module_recompute_rebuilds_what_it_discarded_and_costs_its_passes():
    s = shape(recompute_modules=("layernorm", "moe_act"))
    # the backward's transient: what was discarded, for one layer at a time
    extra = working_bytes(BLOCK, s, "selective", True) - working_bytes(BLOCK, s, "none", True)
    assert extra == pytest.approx(recompute.discarded_bytes(BLOCK, s))
    opts = default_stack()
    sel = layer_cost(BLOCK, s, "selective", H100, opts)
    none = layer_cost(BLOCK, s, "none", H100, opts)
    rate = H100.memory_bandwidth_gbps * 1e9 * (H100.memory_efficiency
                                                 or constants.MEMORY_EFFICIENCY)
    copies = 4096 * K / 2
    by_hand = (2 * 4 * 4096 * H / 2 + 6 * copies * F) / rate  # two norms, one SwiGLU pass
    assert sel.recompute_s == pytest.approx(by_hand)
    assert sel.hardware_flops == none.hardware_flops  # memory-bound passes: no FLOPs counted
    assert sel.fwd_s == none.fwd_s and sel.bwd_s == none.bwd_s


def test_a_stack_naming_an_unpriced_module_is_refused():
    with pytest.raises(PlanInputError, match="recompute_modules.*not priced"):
        with_overrides(default_stack(), "test", recompute_modules=["moe"])
    with pytest.raises(PlanInputError, match="recompute_modules"):
        with_overrides(default_stack(), "test", recompute_modules=[])
    assert with_overrides(default_stack(), "t", recompute_modules=["layernorm", "moe_act"]
                          ).recompute_modules == ("layernorm", "moe_act")


@pytest.mark.parametrize("name", ["moe-qwen3-235b-h100-256gpu-tp2-ep32-pp8-vpp4",
                                  "moe-qwen3-235b-h100-256gpu-tp2-ep8-pp32-vpp3-a2a"])
def test_the_norm_act_rows_fit(name):
    # The model zoo's 'norm, act' rows ran on 80 GB H100s: priced as no recompute with the
    # experts' outputs kept they were predicted out of memory (87.5 and 87.9 GiB).
    case = next(c for c in load_cases(MOE_FILE) if c["name"] == name)
    row = validate_case(case)
    assert " selective " in row.configuration and not row.predicted_oom
    assert "layernorm, moe_act" in row.note


# --- DeepEP's dispatch (cost/moe.py deepep_s) ----------------------------------------------------

def test_remote_domains_per_token_by_enumeration():
    # 8 experts in 4 domains of 2, top-2: every pair of distinct experts equally likely; the
    # expected number of domains other than the sender's that a token reaches
    layer = dc_replace(BLOCK, num_experts=8, moe_top_k=2)
    pairs = list(combinations(range(8), 2))
    by_hand = sum(len({e // 2 for e in pair} - {0}) for pair in pairs) / len(pairs)
    assert moe.remote_domains_per_token(layer, ep=8, in_domain=2) == pytest.approx(by_hand)
    assert moe.remote_domains_per_token(layer, ep=8, in_domain=8) == 0.0


def test_qwen3_ep32_sends_each_token_to_fewer_nodes_than_experts():
    # 128 experts over 4 nodes of 32, top-8: a node misses a token with probability
    # C(96, 8) / C(128, 8); 3 other nodes
    expected = 3 * (1 - comb(96, 8) / comb(128, 8))
    assert moe.remote_domains_per_token(BLOCK, ep=32, in_domain=8) == pytest.approx(expected)
    assert 2.6 < expected < 2.8  # where the all-to-all sends 8 x 24/32 = 6 copies off the node


def test_deepep_prices_the_network_once_per_node():
    s = shape(ep_in_domain=8, moe_dispatcher="deepep")
    intra, inter = comm.links(H100)
    token = 2 * 4096 / 2 * H  # the GPU's T/tp tokens, 16-bit
    network = token * moe.remote_domains_per_token(BLOCK, 32, 8) / inter.bytes_per_s
    # NVLink: the token once per rank holding one of its experts (DeepEP's is_token_in_rank):
    # 32 ranks of 4 experts, each missed with probability C(124, 8) / C(128, 8)
    ranks = 32 * (1 - comb(124, 8) / comb(128, 8))
    assert moe.ranks_per_token(BLOCK, s) == pytest.approx(ranks)
    nvlink = token * ranks * 7 / 8 / intra.bytes_per_s
    assert moe.deepep_s(BLOCK, s, H100) == pytest.approx(max(network, nvlink) + inter.latency_s)
    a2a = moe.dispatch_s(BLOCK, shape(ep_in_domain=8), H100)
    assert moe.dispatch_s(BLOCK, s, H100) < 0.6 * a2a
    # inside one NVLink domain DeepEP is an all-to-all of the token once per rank (8 ranks of 16
    # experts), where the all-to-all dispatcher sends all k = 8 copies
    one = shape(ep=8, ep_in_domain=8)
    per_rank = 8 * (1 - comb(112, 8) / comb(128, 8))
    assert moe.dispatch_s(BLOCK, dc_replace(one, moe_dispatcher="deepep"), H100) == \
        pytest.approx(moe.all_to_all_s(token * per_rank, 8, 8, H100))
    assert moe.all_to_all_s(token * K, 8, 8, H100) == pytest.approx(
        moe.dispatch_s(BLOCK, one, H100))


def test_a_stack_naming_an_unknown_dispatcher_is_refused():
    with pytest.raises(PlanInputError, match="moe_dispatcher"):
        with_overrides(default_stack(), "test", moe_dispatcher="hybridep")
