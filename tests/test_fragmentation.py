"""Allocator fragmentation by recompute churn (cost/fragmentation.py): full recompute and none
keep the two constants as chosen; Megatron's output-discarding modules (DeepSeek-V3's recompute
of RMSNorm and MLA up-projections, report sec. 3.2.3) churn only what they discard; normal
checkpointing (core_attn, torchtitan's op policy) keeps the full surcharge; a rank takes the
largest churn of its chunks, in the evaluation and in the partitioner's capacity alike."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from planner.cost import constants
from planner.cost.fragmentation import churn_share, fragmentation, layer_churn
from planner.cost.memory import Shape, activation_bytes
from planner.fidelity.cases import MOE_FILE, VALIDATION_DIR, case_setup, load_cases
from planner.model.load import load_model
from planner.predict.chunks import split_stages
from planner.predict.memory import chunk_churn
from planner.predict.stages import cost_tables, partition_problem, usable_bytes
from planner.predict.step import predict_plan

V3 = load_model(VALIDATION_DIR / "configs" / "deepseek-v3-no-mtp.json").with_seq_length(4096)
MOE = next(layer for layer in V3.layers if layer.kind == "block" and layer.is_moe)
DENSE = next(layer for layer in V3.layers if layer.kind == "block")
# DeepSeek-V3 report sec. 4.2: 128 heads of 128, d_c 512, d_c' 1536, d_h^R 64, hidden 7168,
# expert width 2048, 8 routed experts a token
T, H, HEADS, D_H, D_C, D_Q, D_R, F, K = 4096, 7168, 128, 128, 512, 1536, 64, 2048, 8
REPORT = ("layernorm", "mla_up_proj", "moe_act")
DISCARDING = ("layernorm", "mla_up_proj", "moe_act")


def shape(modules=REPORT) -> Shape:
    # the report's layout: no TP, EP 64, micro-batch 1, sequence 4096
    return Shape(tp=1, sp=False, micro_batch=1, seq_len=T, ep=64, etp=1,
                 moe_probs_in_activation=True, recompute_modules=tuple(modules))


def test_none_and_full_keep_the_two_constants():
    """BLOOM's full-recompute readings chose RECOMPUTE_FRAGMENTATION: full recompute keeps it
    exactly, no recompute keeps FRAGMENTATION."""
    for layer in (MOE, DENSE):
        assert layer_churn(layer, shape(), "none", True) == 0.0
        assert layer_churn(layer, shape(), "full", True) == 1.0
    assert fragmentation(0.0) == constants.FRAGMENTATION
    assert fragmentation(1.0) == constants.RECOMPUTE_FRAGMENTATION
    assert fragmentation(True) == constants.RECOMPUTE_FRAGMENTATION


def test_the_reports_recompute_churns_what_it_discards_on_a_moe_block():
    """Per token of a DeepSeek-V3 MoE block, 16-bit: the two RMSNorm outputs (2 x 2h), the
    MLA up-projections' Q, K (heads x (d_h + d_h^R) each), V (heads x d_h) and the normed
    latents with the RoPE key (d_c' + d_c + d_h^R), and each of the k routed copies' SwiGLU
    output (2f). Full recompute frees and rebuilds all the block keeps but its input (2h)."""
    discarded = 2 * T * (2 * H + 2 * HEADS * (D_H + D_R) + HEADS * D_H + D_Q + D_C + D_R
                         + K * F)
    full = activation_bytes(MOE, shape(), "none", True) - 2 * T * H
    share = layer_churn(MOE, shape(), "selective", True)
    assert share == pytest.approx(discarded / full)
    assert share == pytest.approx(0.4455, abs=5e-4)
    # the steady share plus that part of the recompute surcharge: 9.5% of reserved memory
    assert fragmentation(share) == pytest.approx(0.05 + 0.10 * 0.4455, abs=1e-4)
    # embedding and head: no recompute covers them; a head with MTP modules recomputes their
    # block (report sec. 2.2: "The k-th MTP module consists of a shared embedding layer Emb(·),
    # a shared output head OutHead(·), a Transformer block TRM_k(·), and a projection matrix")
    assert layer_churn(V3.layers[0], shape(), "selective", True) == 0.0
    assert layer_churn(V3.layers[-1], shape(), "full", True) == 0.0
    mtp_head = load_model(VALIDATION_DIR / "configs" / "deepseek-v3.json").layers[-1]
    assert mtp_head.mtp_depth == 1
    assert mtp_head.mtp_block == MOE
    assert layer_churn(mtp_head, shape(), "selective", True) == share


def test_normal_checkpointing_keeps_the_full_surcharge():
    """Megatron's core_attn (and mlp, moe, shared_experts) and torchtitan's op policy re-run a
    checkpointed region: the whole surcharge, as full recompute."""
    for modules in (("core_attn",), ("layernorm", "core_attn"), ("torchtitan_op",),
                    ("moe_act", "shared_experts")):
        assert layer_churn(DENSE, shape(modules), "selective", True) == 1.0


@given(st.sets(st.sampled_from(DISCARDING)), st.sets(st.sampled_from(DISCARDING)))
def test_churn_is_a_share_and_grows_with_the_modules(a, b):
    small, large = tuple(sorted(a & b)), tuple(sorted(a | b))
    for layer in (MOE, DENSE):
        lo = layer_churn(layer, shape(small), "selective", True)
        hi = layer_churn(layer, shape(large), "selective", True)
        assert 0.0 <= lo <= hi <= 1.0
        assert constants.FRAGMENTATION <= fragmentation(lo) <= fragmentation(hi) \
            <= constants.RECOMPUTE_FRAGMENTATION
    assert churn_share([MOE, DENSE], shape(large), "selective", True) == max(
        layer_churn(x, shape(large), "selective", True) for x in (MOE, DENSE))


def _report_row():
    case = next(c for c in load_cases(MOE_FILE)
                if c["name"] == "moe-deepseek-v3-report-h800-2048gpu")
    return case_setup(case)


def test_a_dualpipe_rank_takes_the_largest_churn_of_its_two_stages():
    """Middle ranks hold 8 MoE blocks; ranks 0 and 15 also the 3 dense blocks, whose churn
    share is larger (the same norm and MLA outputs discarded, beside less kept than an MoE
    block's routed copies): each rank's fragmentation is its own largest, in --explain's
    part."""
    s = _report_row()
    _, pred = predict_plan(s.model, s.cluster, s.parallel, s.options, list(s.bounds))
    parts = pred.memory_parts
    held = sum(parts[k] for k in ("weights", "gradients", "optimizer", "activations", "logits",
                                  "transient"))
    moe, dense = (layer_churn(x, shape(), "selective", True) for x in (MOE, DENSE))
    assert dense > moe
    f = np.array([fragmentation(dense)] + [fragmentation(moe)] * 14 + [fragmentation(dense)])
    assert parts["fragmentation"] == pytest.approx(held * f / (1 - f))


def test_the_partitioner_sets_aside_the_same_fragmentation():
    """The partition problem's capacity under the selective mode is the GPU's usable bytes at
    the model's largest churn under it (a split's chunks are not known in advance) less the
    mode's largest transient: never more than any rank's evaluation allows."""
    s = _report_row()
    tables = cost_tables(s.model, s.parallel, s.cluster.hardware, s.options, exact=True)
    problem = partition_problem(s.model, s.cluster, s.parallel, s.options, tables)
    (mode,) = problem.modes
    assert mode == "selective"
    largest = churn_share(s.model.layers, shape(), "selective", True)
    assert largest == pytest.approx(layer_churn(DENSE, shape(), "selective", True))
    assert problem.capacity_bytes[0] == pytest.approx(
        usable_bytes(s.cluster, largest) - float(tables[mode].work_bytes.max()))
    # the evaluation's per-chunk churn never exceeds what the capacity assumed
    stages = split_stages(tables, list(s.bounds), ["selective"] * 16, [None] * 16,
                          [layer.kind == "block" for layer in s.model.layers])
    assert chunk_churn(s.model, s.parallel, s.options, stages).max() <= largest + 1e-12
