"""The DeepSeek-V3 report's memory mechanisms, each against the tensors it names, by hand:
recompute of the MLA up-projections (Megatron-Core's "mla_up_proj", cost/recompute.py), the
attention-output projection's input kept in E5M6 and the MoE SwiGLU inputs kept in FP8 (report
sec. 3.3.3, cost/precision.py), and the report's row with every published mechanism: one
DeepSeek-V3 MoE block's kept bytes per token, and what is left over the H800's memory."""

import pytest

from planner.core.errors import PlanInputError
from planner.cost import constants, elementwise, gemm, mla, recompute
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape, activation_bytes, working_bytes
from planner.cost.precision import saved_activation_bytes
from planner.fidelity.cases import MOE_FILE, VALIDATION_DIR, case_setup, load_cases
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model
from planner.predict.step import predict_plan
from planner.stack import load_stack, with_overrides

H100 = load_hardware("h100")
V3 = load_model(VALIDATION_DIR / "configs" / "deepseek-v3-no-mtp.json").with_seq_length(4096)
MOE = next(layer for layer in V3.layers if layer.kind == "block" and layer.is_moe)
DENSE = next(layer for layer in V3.layers if layer.kind == "block")
T = 4096
# report sec. 4.2: "we set the number of attention heads n_h to 128 and the per-head dimension
# d_h to 128. The KV compression dimension d_c is set to 512, and the query compression
# dimension d_c' is set to 1536. For the decoupled queries and key, we set the per-head
# dimension d_h^R to 64."; "each MoE layer consists of 1 shared expert and 256 routed experts,
# where the intermediate hidden dimension of each expert is 2048. Among the routed experts, 8
# experts will be activated for each token"
HEADS, D_H, D_C, D_Q, D_R, H, F, E, K = 128, 128, 512, 1536, 64, 7168, 2048, 256, 8
ROW = "moe-deepseek-v3-report-h800-2048gpu"


def shape(**changes) -> Shape:
    # the report's layout: no TP, EP 64, micro-batch 1 (unpublished), sequence 4096
    base = dict(tp=1, sp=False, micro_batch=1, seq_len=T, ep=64, etp=1,
                moe_probs_in_activation=True)
    base.update(changes)
    return Shape(**base)


def test_the_config_is_the_reports_model():
    assert (MOE.num_attention_heads, MOE.v_head_dim, MOE.qk_nope_head_dim, MOE.kv_lora_rank,
            MOE.q_lora_rank, MOE.qk_rope_head_dim) == (HEADS, D_H, D_H, D_C, D_Q, D_R)
    assert (MOE.hidden_size, MOE.ffn_hidden_size, MOE.num_experts, MOE.moe_top_k,
            MOE.shared_ffn_hidden_size) == (H, F, E, K, F)


def test_mla_up_proj_discards_q_k_v_and_the_normed_latents():
    none = activation_bytes(MOE, shape(), "none", flash=True)
    up = activation_bytes(MOE, shape(recompute_modules=("mla_up_proj",)), "selective", True)
    qk = HEADS * (D_H + D_R)  # per head: nope + rope
    # Q, K (qk each) and V (heads x d_h) after RoPE, and the latents after their norms with
    # the rotated RoPE key (d_c' + d_c + d_h^R), 16-bit
    assert none - up == pytest.approx(2 * T * (2 * qk + HEADS * D_H + D_Q + D_C + D_R))
    # a block without MLA keeps what it kept
    llama = next(layer for layer in load_model("llama3-8b").layers if layer.kind == "block")
    s = shape(ep=1, recompute_modules=("mla_up_proj",))
    assert activation_bytes(llama, s, "selective", True) == activation_bytes(llama, s, "none",
                                                                              True)
    # the backward's transient holds what it rebuilds, one layer at a time
    sel = shape(recompute_modules=("mla_up_proj",))
    assert working_bytes(MOE, sel, "selective", True) - working_bytes(
        MOE, shape(), "none", True) == pytest.approx(none - up)


def test_mla_up_proj_rebuilds_the_two_up_projections_and_the_latent_norms():
    opts = load_stack("megatron-core")
    s = shape(recompute_modules=("mla_up_proj",))
    sel = layer_cost(MOE, s, "selective", H100, opts)
    none = layer_cost(MOE, s, "none", H100, opts)
    # the up-projections' forward FLOPs: q_b (d_c' x heads(nope + rope)), kv_b (d_c x
    # heads(nope + v)), 2 per weight per token; counted in hardware FLOPs only
    up_flops = 2 * T * (D_Q * HEADS * (D_H + D_R) + D_C * HEADS * (D_H + D_H))
    assert sel.hardware_flops - none.hardware_flops == pytest.approx(up_flops)
    assert sel.model_flops == none.model_flops
    rate = H100.peak_flops * (H100.matmul_efficiency or constants.MATMUL_EFFICIENCY)
    mem = H100.memory_bandwidth_gbps * 1e9 * (H100.memory_efficiency
                                               or constants.MEMORY_EFFICIENCY)
    shapes = ((T, D_Q, HEADS * (D_H + D_R)), (T, D_C, HEADS * 2 * D_H))
    traffic = sum(2 * (m * k + k * n) + 2 * m * n for m, k, n in shapes)  # 16-bit operands
    by_hand = (gemm.weight_matmul_seconds(shapes, rate)[0] + traffic / mem
               + elementwise.RMSNORM_FUSED * T * (D_Q + D_C) / mem)
    assert sel.recompute_s == pytest.approx(by_hand)
    # a block without MLA rebuilds nothing for this module
    llama = next(layer for layer in load_model("llama3-8b").layers if layer.kind == "block")
    assert recompute.rebuild_s(llama, s, True, 0.0, mem, up_proj_s=1.0) == 0.0
    assert mla.up_projection_shapes(MOE, T, 1) == shapes


def test_e5m6_attention_output_and_fp8_swiglu_inputs():
    fp8 = with_overrides(load_stack("megatron-core"), "t", precision="fp8")
    s = shape()
    base = saved_activation_bytes(MOE, s, "none", fp8)
    e5m6 = saved_activation_bytes(MOE, s, "none", with_overrides(fp8, "t", fp8_attn_out_bytes=1.5))
    # the projection input (heads x d_h values) saves 0.5 byte a value instead of 1
    assert base - e5m6 == pytest.approx(0.5 * T * HEADS * D_H)
    act = saved_activation_bytes(MOE, s, "none", with_overrides(fp8, "t", fp8_moe_act_input=True))
    # every routed copy's SwiGLU input (gate and up, 2f) one byte instead of two; T·k copies
    assert act - base == pytest.approx(T * K * 2 * F)
    # dense blocks have no routed experts; 16-bit stacks save nothing
    assert saved_activation_bytes(DENSE, s, "none", with_overrides(
        fp8, "t", fp8_moe_act_input=True)) == saved_activation_bytes(DENSE, s, "none", fp8)
    bf16 = with_overrides(load_stack("megatron-core"), "t", fp8_moe_act_input=True,
                          fp8_attn_out_bytes=1.5)
    assert saved_activation_bytes(MOE, s, "none", bf16) == 0.0


def test_the_bundled_stacks_keep_te_s_bytes_and_bad_values_are_refused():
    for name in ("megatron-core", "megatron-2021", "deepspeed", "torchtitan"):
        stack = load_stack(name)
        assert (stack.fp8_attn_out_bytes, stack.fp8_moe_act_input) == (1.0, False)
        sources = dict(stack.sources)
        assert sources["fp8_attn_out_bytes"] and sources["fp8_moe_act_input"]
    with pytest.raises(PlanInputError, match="fp8_attn_out_bytes.*\\[1.0, 2.0\\]"):
        with_overrides(load_stack("megatron-core"), "t", fp8_attn_out_bytes=0.5)
    with pytest.raises(PlanInputError, match="fp8_moe_act_input.*true or false"):
        with_overrides(load_stack("megatron-core"), "t", fp8_moe_act_input="yes")


def _row_setup():
    case = next(c for c in load_cases(MOE_FILE) if c["name"] == ROW)
    return case, case_setup(case)


def test_a_deepseek_v3_moe_block_keeps_what_the_report_leaves_per_token():
    # The row's stack: recompute of the RMSNorms, MLA up-projections and the SwiGLU (report
    # sec. 3.2.3, 3.3.3), FP8 GEMM inputs, E5M6 attention output, FP8 SwiGLU inputs. Per token
    # of one MoE block, what stays:
    #   the two norm inputs (residual stream, 16-bit)                4h
    #   the latents before their norms, with the RoPE key           2(d_c' + d_c + d_h^R)
    #   the attention output (E5M6)                                 1.5 heads·d_h
    #   the router's fp32 scores                                    4E
    #   per routed copy: FP8 input, FP8 SwiGLU input, fp32 weight   h + 2f + 4 (k copies)
    #   shared expert: 16-bit gate/up outputs and activation, the
    #   FP8 down-projection input                                   4f + f
    _, setup = _row_setup()
    opts = setup.options
    assert set(opts.recompute_modules) == {"layernorm", "mla_up_proj", "moe_act"}
    s = Shape(tp=1, sp=False, micro_batch=1, seq_len=T, ep=64, etp=1,
              recompute_modules=opts.recompute_modules,
              moe_probs_in_activation=opts.moe_probs_in_activation)
    cost = layer_cost(MOE, s, "selective", setup.cluster.hardware, opts)
    per_token = (4 * H + 2 * (D_Q + D_C + D_R) + 1.5 * HEADS * D_H + 4 * E
                 + K * (H + 2 * F + 4) + 5 * F)
    assert cost.act_bytes == pytest.approx(T * per_token)
    # 158,880 bytes a token and layer; 349,472 with the stack's defaults (core_attn, FP8 GEMM
    # inputs only), the row before these mechanisms


def test_the_reports_bf16_moments_cut_the_optimizer_state_to_two_thirds():
    case, setup = _row_setup()
    assert setup.options.optimizer_state_bytes == 8.0  # fp32 master 4 + BF16 m, v 2 + 2
    assert setup.options.grad_dtype == "fp32"  # "gradients ... still retained in FP32"
    twelve = with_overrides(setup.options, "t", optimizer_state_bytes=12)
    _, pred8 = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options)
    _, pred12 = predict_plan(setup.model, setup.cluster, setup.parallel, twelve)
    assert pred8.memory_parts["optimizer"] == pytest.approx(
        pred12.memory_parts["optimizer"] * 8 / 12)


def test_the_rows_stages_hold_four_moe_layers_as_deepseeks_training_profile():
    """deepseek-ai/profile-data (the released DualPipe training profile, 'The parallel
    configuration aligns with DeepSeek-V3 pretraining settings: EP64, TP1 with 4K sequence
    length'): 'Each chunk contains 4 MoE (Mixture of Experts) layers.' The row's split
    (config.stage_blocks 3, 4 x 14, 2): stages 1-14 hold 4 MoE blocks each, stage 0 the
    embedding and the 3 dense blocks, stage 15 the last 2 MoE blocks, the head and the MTP
    module; under DualPipe rank r holds stages r and 15 - r, so every middle rank holds 8 MoE
    blocks and ranks 0 and 15 the embedding, the 3 dense and 2 MoE blocks and the head."""
    _, setup = _row_setup()
    layers = setup.model.layers
    bounds = setup.bounds
    assert len(bounds) == 16 and bounds[0] == (0, 4) and bounds[-1] == (60, 63)
    assert [layer.kind for layer in layers[0:4]] == ["embedding", "block", "block", "block"]
    assert not any(layer.is_moe for layer in layers[1:4])
    for a, b in bounds[1:-1]:
        assert b - a == 4 and all(layer.kind == "block" and layer.is_moe
                                  for layer in layers[a:b])
    last = layers[bounds[-1][0]:bounds[-1][1]]
    assert [layer.kind for layer in last] == ["block", "block", "head"]
    assert last[-1].mtp_depth == 1
    assert sum(b - a for a, b in bounds) == len(layers)


def test_a_stage_split_that_does_not_fit_the_model_is_refused_in_one_line():
    case, _ = _row_setup()
    for bad in ([4] * 16, [3] + [4] * 14, [3, 0] + [4] * 13 + [6], "3-4-2", [3.0] + [4] * 14 + [2]):
        broken = {**case, "config": {**case["config"], "stage_blocks": bad}}
        with pytest.raises(PlanInputError, match="stage_blocks must list 16 block counts") as e:
            case_setup(broken)
        assert "\n" not in str(e.value) and ROW in str(e.value)


def test_the_rows_linear_weights_are_held_once_in_fp8_with_their_transpose():
    """Report sec. 3.3.1: the GEMMs 'accept FP8 tensors as inputs'; what it keeps in higher
    precision is 'the embedding module, the output head, MoE gating modules, normalization
    operators, and attention operators' and 'the master weights, weight gradients, and
    optimizer states' (the master 'stored by the optimizer', sec. 3.3.3): no 16-bit copy of
    the linear weights, which Figure 6 draws in FP8 (the case's provenance quotes the
    sources). So the row's stack holds FP8 primary weights (fp8_params) and no FP8 cache
    beside a BF16 weight. The FP8 weight's transpose for Dgrad (DeepGEMM's SM90 GEMMs take
    the NT layout only) is kept from the stand-in: unpublished. A middle rank's weights, by
    hand from the report's dimensions (sec. 4.2) for its 8 MoE blocks (4 of 256 routed
    experts on each of EP 64, 1 shared): every linear weight 1 byte and 1 byte for its
    transpose; RMSNorm weights, the router and its bias 16-bit."""
    _, setup = _row_setup()
    assert setup.options.fp8_params and not setup.options.fp8_weight_cache
    _, pred = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                           list(setup.bounds), simulated=True)
    attention = (H * D_Q + D_Q * HEADS * (D_H + D_R) + H * (D_C + D_R)
                 + D_C * HEADS * (D_H + D_H) + HEADS * D_H * H)  # q_a, q_b, kv_a, kv_b, o
    experts = 3 * H * F * (1 + E // 64)  # gate, up, down: the shared and 4 routed experts
    other = (2 * H + D_Q + D_C) + E * H + E  # norms (2 + the latents'), router, its bias
    blocks = 8
    assert pred.memory_parts["weights"][8] == pytest.approx(
        blocks * (2 * (attention + experts) + 2 * other))
    # the megatron-core stand-in's default, a BF16 weight and Transformer Engine's FP8 weight
    # and transpose cached beside it, holds the linear weights' 2 bytes twice
    cached = with_overrides(setup.options, "t", fp8_params=False, fp8_weight_cache=True)
    _, old = predict_plan(setup.model, setup.cluster, setup.parallel, cached,
                          list(setup.bounds), simulated=True)
    assert old.memory_parts["weights"][8] - pred.memory_parts["weights"][8] == pytest.approx(
        blocks * 2 * (attention + experts))


def test_the_report_row_with_every_published_mechanism_fits_the_h800():
    """Pinned: with the report's recompute, FP8/E5M6 activation storage, BF16 moments, its MTP
    module (depth 1, its embedding and head shared on ranks 0 and 15), DeepSeek's stage of
    4 MoE layers (deepseek-ai/profile-data; test above) and its linear weights held once in
    FP8 (test above) the middle ranks are predicted at 76.4 GiB, under the H800's 80; ranks
    0 and 15 (embedding, 3 dense and 2 MoE blocks, the output head and the MTP module, both
    DualPipe copies) at 75.2. A middle rank holds 8 MoE blocks, sourced, and: FP8 weights
    with their transposes 6.1, fp32 gradients 12.2 (report sec. 3.3.3, 'the master weights
    (stored by the optimizer) and gradients (used for batch size accumulation) are still
    retained in FP32'), ZeRO-1 optimizer 5.4 (fp32 master + BF16 moments, experts over their
    expert-data-parallel group of 128 / 64 = 2), activations of PP + 1 = 17
    stage-microbatches 41.2 (Table 2), transient 2.5, reserve 2; 67.3 GiB of tensors.
    Allocator fragmentation 7.0 GiB: the report's recompute discards outputs only (sec.
    3.2.3), 44.5% of the bytes full recompute would free and rebuild on an MoE block, so 9.5%
    of reserved memory (cost/fragmentation.py). Before the weights were read from the report
    the stand-in held a BF16 weight and Transformer Engine's FP8 cache beside it (12.2 GiB of
    weights) and a middle rank read 83.1 GiB, over the H800. The transposed FP8 copy (3.0
    GiB here) is the stand-in's, unpublished: without it (and its share of fragmentation) a
    middle rank would read about 73.0."""
    _, setup = _row_setup()
    assert setup.model.mtp_layers == 1
    _, pred = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                           list(setup.bounds), simulated=True)
    gib = 2 ** 30
    ranks = pred.rank_memory_bytes / gib
    assert ranks[1:15] == pytest.approx([76.4] * 14, abs=0.3)
    assert ranks[0] == ranks[15] == pytest.approx(75.2, abs=0.3)
    assert max(pred.rank_memory_bytes) < setup.cluster.hardware.memory_bytes
    parts = {k: v[8] / gib for k, v in pred.memory_parts.items()}
    assert parts["activations"] == pytest.approx(41.2, abs=0.3)
    assert parts["fragmentation"] == pytest.approx(7.0, abs=0.2)
    tensors = sum(parts[k] for k in ("weights", "gradients", "optimizer", "activations",
                                     "logits", "transient"))
    assert tensors == pytest.approx(67.3, abs=0.3)
    # FP8 weight and transpose, 2 bytes a linear weight: as the 16-bit copy they replace,
    # so the weights match half the fp32 gradients
    assert parts["weights"] == pytest.approx(parts["gradients"] / 2, abs=0.05)
