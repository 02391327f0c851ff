from dataclasses import replace

import pytest

from planner.cost import comm
from planner.cost.layer import block_forward_flops, layer_cost, model_flops_per_iteration
from planner.stack import default_stack, load_stack, with_overrides
from planner.hardware.profiles import load_hardware
from planner.cost.memory import Shape, activation_bytes, model_state_bytes, working_bytes
from planner.model.presets import PRESETS, megatron_gpt


def table1(published_runs):
    """(case, GPT spec, global batch, l, h, s, V) of each Megatron-LM 2021 Table 1 run."""
    for case in published_runs:
        if case["group"] == "megatron2021_table1":
            m = case["model"]
            spec = megatron_gpt(case["name"], m["layers"], m["hidden"], m["heads"], m["vocab"],
                        m["seq_len"])
            yield (case, spec, case["config"]["global_batch"], m["layers"], m["hidden"],
                   m["seq_len"], m["vocab"])


def test_flops_per_iteration_match_megatron_eq3(published_runs):
    """Narayanan et al. 2021 eq. 3 with the recompute forward removed (72 instead of 96):
    F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    for _, spec, B, l, h, s, V in table1(published_runs):
        megatron = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
        assert model_flops_per_iteration(spec, B, s) == pytest.approx(megatron, rel=0.01)


def test_published_tflops_imply_the_published_step_time(published_runs):
    """The validation file derives step time from eq. 3 (with recompute, 96): check ours agrees."""
    for case, spec, B, l, h, s, V in table1(published_runs):
        flops = model_flops_per_iteration(spec, B, s) * 96 / 72 * (
            1 + s / (6 * h) + V / (16 * l * h)) / (1 + s / (6 * h) + V / (12 * l * h))
        step = flops / (case["cluster"]["gpus"] * case["measured"]["tflops_per_gpu"] * 1e12)
        assert step == pytest.approx(case["measured"]["step_time_s"], rel=0.01)


GPT3 = PRESETS["gpt3-175b"].blocks[0]
S, B, H, A = 2048, 1, 12288, 96


@pytest.mark.parametrize("tp, sp, recompute, expected", [
    # Korthikanti et al. 2022, Table 2, per layer, 16-bit, unfused attention
    (1, False, "none", S * B * H * (34 + 5 * A * S / H)),
    (8, False, "none", S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8))),
    (8, True, "none", S * B * H * (34 + 5 * A * S / H) / 8),
    (8, True, "selective", S * B * H * 34 / 8),
    (8, False, "selective", S * B * H * (10 + 24 / 8)),
    (1, False, "full", 2 * S * B * H),
    (8, True, "full", 2 * S * B * H / 8),
])
def test_activation_bytes_match_korthikanti_table2(tp, sp, recompute, expected):
    shape = Shape(tp=tp, sp=sp, micro_batch=B, seq_len=S)
    assert activation_bytes(GPT3, shape, recompute, flash=False) == pytest.approx(expected)


def test_flash_attention_drops_the_score_term():
    shape = Shape(tp=8, sp=True, micro_batch=1, seq_len=S)
    assert activation_bytes(GPT3, shape, "none", flash=True) == pytest.approx(34 * S * H / 8)


def test_model_states_follow_zero_paper():
    """Rajbhandari et al. 2020 §3.1: 16 bytes/param with 16-bit grads (2 + 2 + 12), Megatron's
    fp32 grads make it 18; ZeRO stages divide optimizer, then grads, then weights by dp."""
    assert model_state_bytes(1, dp=1, zero=0, grad_bytes=2) == 16
    assert model_state_bytes(1, dp=1, zero=0) == 18
    assert model_state_bytes(1, dp=4, zero=1, grad_bytes=2) == 2 + 2 + 3
    assert model_state_bytes(1, dp=4, zero=2, grad_bytes=2) == 2 + 0.5 + 3
    assert model_state_bytes(1, dp=4, zero=3, grad_bytes=2) == 0.5 + 0.5 + 3
    # The paper's example: 7.5B parameters, Nd = 64: 120 GB -> 31.4 / 16.6 / 1.9 GB
    p = 7.5e9
    assert model_state_bytes(p, 64, 0, 2) / 1e9 == pytest.approx(120, rel=0.01)
    assert model_state_bytes(p, 64, 1, 2) / 1e9 == pytest.approx(31.4, rel=0.01)
    assert model_state_bytes(p, 64, 2, 2) / 1e9 == pytest.approx(16.6, rel=0.01)
    assert model_state_bytes(p, 64, 3, 2) / 1e9 == pytest.approx(1.9, rel=0.02)


def test_fsdp_keeps_no_16_bit_shard():
    """PyTorch FSDP's ZeRO-3 shard is the fp32 master itself: 4 + 4 + 8 = 16 bytes per parameter
    over dp with fp32 gradients, where DeepSpeed ZeRO-3 adds a 16-bit shard (18)."""
    fsdp = load_stack("torchtitan")
    assert fsdp.held_weight_bytes(3) == 0 and fsdp.held_weight_bytes(2) == 2
    assert default_stack().held_weight_bytes(3) == 2
    assert model_state_bytes(1, dp=8, zero=3, weight_bytes=fsdp.held_weight_bytes(3)) == 16 / 8
    assert model_state_bytes(1, dp=8, zero=3) == 18 / 8


def test_embedding_norm_keeps_its_input():
    """The embedding is never recomputed: a norm after it keeps its 16-bit input (2·sbh) beside
    the dropout mask (sbh)."""
    shape = Shape(tp=1, sp=False, micro_batch=B, seq_len=S)
    emb = PRESETS["bloom-176b"].layers[0]
    assert activation_bytes(emb, shape, "full", flash=False) == pytest.approx(3 * S * B * emb.hidden_size)
    plain = replace(GPT3, kind="embedding")
    assert activation_bytes(plain, shape, "full", flash=False) == pytest.approx(S * B * H)


def test_unfused_attention_backward_holds_two_score_gradients():
    """Without flash, the dropout and softmax backward each write a 16-bit s×s gradient; the MLP
    has freed its saved tensors by then. With many heads that moment outweighs the MLP's."""
    shape = Shape(tp=8, sp=False, micro_batch=1, seq_len=S)
    a, t = GPT3.num_attention_heads, 8
    rebuilt = activation_bytes(GPT3, shape, "none", flash=False)
    mlp_kept = 3 * S * H + 8 * S * 4 * H / t  # input + dropout mask, gelu + fc2 inputs
    attention = 2 * 2 * a * S * S / t - mlp_kept
    mlp = 2 * S * (2 * H + 2 * 4 * H / t)
    assert working_bytes(GPT3, shape, "full", flash=False) == pytest.approx(
        rebuilt + max(attention, mlp))
    assert working_bytes(GPT3, shape, "full", flash=True) == pytest.approx(
        activation_bytes(GPT3, shape, "none", flash=True) + mlp)


def test_ring_collectives():
    link = comm.Link(bytes_per_s=100e9, latency_s=0.0)
    assert comm.all_reduce_s(1e9, 8, link) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    assert comm.all_gather_s(1e9, 8, link) == pytest.approx(7 / 8 * 1e9 / 100e9)
    assert comm.all_reduce_s(1e9, 1, link) == 0.0


def test_backward_is_twice_forward_in_flops_and_split_in_halves():
    hw = load_hardware("a100-80gb")
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=2048)
    c = layer_cost(GPT3, shape, "none", hw, with_overrides(default_stack(), attention="unfused"))
    gemm, attn = block_forward_flops(GPT3, 2048, 2048)
    assert c.model_flops == pytest.approx(3 * (gemm + attn))
    # beyond its FLOPs, the weight-gradient pass accumulates into the fp32 gradient buffer:
    # read + write 4 bytes per parameter at the achieved HBM rate.
    accumulate_s = 2 * 4 * c.params / (hw.memory_bandwidth_gbps * 1e9 * 0.9)
    assert c.bwd_weight_s - accumulate_s < c.bwd_input_s  # input grad also carries attention
    assert c.bwd_s - accumulate_s == pytest.approx(2 * c.fwd_s, rel=0.1)


def test_recompute_costs_time_and_saves_memory():
    hw = load_hardware("a100-80gb")
    shape = Shape(tp=8, sp=True, micro_batch=1, seq_len=2048)
    none = layer_cost(GPT3, shape, "none", hw)
    full = layer_cost(GPT3, shape, "full", hw)
    assert full.act_bytes < none.act_bytes / 10
    assert full.total_s > none.total_s
    assert full.hardware_flops == pytest.approx(none.model_flops * 4 / 3)
