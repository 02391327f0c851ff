"""torchtitan's two selective AC policies (cost/recompute.py, fidelity/modern_cases.py), by hand
from its policy (torchtitan/parallelisms/parallelize_llama.py _apply_ac_to_transformer_block):

- op: '# Saves output of all compute ops, except every second mm': of a Llama block's mms in
  forward order (wq, wk, wv, wo, w1, w3, w2) wq, wv, w1, w2 are saved, wk, wo, w3 re-run, and
  the SDPA output (and under SP the two reduce-scatter outputs) are saved beside the block input;
- layer 'N': every N-th block fully checkpointed (floor(L / N) of L), the others keep all.

No published memory reading compares op with full AC at the policy these rows ran (torchtitan
PR #97's llama 7B readings predate the every-second-mm rule): the rows' measured step times are
the check (the op/layer and op/none ratios)."""

import pytest

from planner.core.errors import PlanInputError
from planner.cost import recompute
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape, activation_bytes, working_bytes
from planner.fidelity.cases import MODERN_FILE, case_setup, load_cases
from planner.fidelity.modern_cases import recompute_mode
from planner.fidelity.published import validate_case
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model
from planner.stack import load_stack, with_overrides

LLAMA3_8B = load_model("llama3-8b").with_seq_length(8192)
BLOCK = next(layer for layer in LLAMA3_8B.layers if layer.kind == "block")
H, Q, KV, F = 4096, 4096, 1024, 14336  # Llama 3 8B: 32 query heads, 8 KV heads, FFN 14336
T = 8192  # one 8K sequence
OP = ("torchtitan_op",)


def test_the_block_is_llama3_8b():
    assert (BLOCK.hidden_size, BLOCK.q_size, BLOCK.num_kv_heads * BLOCK.head_dim,
            BLOCK.ffn_hidden_size, BLOCK.mlp) == (H, Q, KV, F, "swiglu")


def test_op_policy_saves_every_other_mm():
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=T, recompute_modules=OP)
    assert recompute.torchtitan_mms(BLOCK, shape) == (
        (T, H, Q), (T, H, KV), (T, H, KV), (T, Q, H), (T, H, F), (T, H, F), (T, F, H))
    assert recompute.op_recomputed_mms(BLOCK, shape) == ((T, H, KV), (T, Q, H), (T, H, F))
    # recomputed matmul FLOPs: wk + wo + w3 = 2T·4096·(1024 + 4096 + 14336), 36.5% of the
    # block's 2T·4096·(4096 + 2·1024 + 4096 + 3·14336)
    flops = sum(2.0 * m * k * n for m, k, n in recompute.op_recomputed_mms(BLOCK, shape))
    assert flops == 2 * T * 4096 * 19456
    assert flops / (2 * T * 4096 * 53248) == pytest.approx(0.3654, abs=1e-4)


def test_op_policy_kept_bytes_by_hand():
    # input 2h + wq 2q + wv 2kv + SDPA out 2q + w1 2f + w2 2h = 2·31744 bytes a token
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=T, recompute_modules=OP)
    assert recompute.op_kept_bytes(BLOCK, shape, flash=True) == 2 * T * 31744 == 520_093_696
    assert activation_bytes(BLOCK, shape, "selective", flash=True) == 520_093_696
    # between full recompute (the input, 2h a token) and none (Korthikanti's tensors for a
    # SwiGLU GQA block without dropout: 139264 bytes a token, cost/memory.py)
    none = activation_bytes(BLOCK, shape, "none", flash=True)
    assert none == T * 139264
    assert activation_bytes(BLOCK, shape, "full", flash=True) == 2 * T * H
    # the backward of a block rebuilds all it did not keep
    assert working_bytes(BLOCK, shape, "selective", True) - working_bytes(
        BLOCK, shape, "none", True) == pytest.approx(none - 520_093_696)


def test_op_policy_kept_bytes_under_tp_and_sp():
    # TP 2 + SP: input shard h/2, wq q/2, wv kv/2, SDPA q/2, w1 f/2, w2's partial sums whole h,
    # the two reduce-scatter outputs h/2 each
    shape = Shape(tp=2, sp=True, micro_batch=1, seq_len=T, recompute_modules=OP)
    per_token = 2 * (H / 2 + Q / 2 + KV / 2 + Q / 2 + F / 2 + H + 2 * H / 2)
    assert recompute.op_kept_bytes(BLOCK, shape, flash=True) == T * per_token


def test_op_policy_recompute_cost_lies_between_none_and_full():
    hw = load_hardware("a100")
    opts = with_overrides(load_stack("torchtitan"), "test", recompute_modules=list(OP))
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=T, recompute_modules=OP)
    op = layer_cost(BLOCK, shape, "selective", hw, opts)
    full = layer_cost(BLOCK, shape, "full", hw, opts)
    none = layer_cost(BLOCK, shape, "none", hw, opts)
    assert none.recompute_s == 0 < op.recompute_s < full.recompute_s
    assert op.hardware_flops - op.model_flops == 2 * T * 4096 * 19456  # flash: no attention
    # the element-wise forward is re-run whole: more than the matmul share of full's recompute
    assert op.recompute_s / full.recompute_s > 0.3654


def test_op_policy_stands_alone_and_refuses_moe():
    with pytest.raises(PlanInputError, match="stands alone"):
        with_overrides(load_stack("torchtitan"), "test",
                       recompute_modules=["torchtitan_op", "core_attn"])
    qwen = load_model(MODERN_FILE.parent / "configs" / "qwen3-235b-a22b.json")
    moe = next(layer for layer in qwen.layers if layer.kind == "block" and layer.is_moe)
    with pytest.raises(PlanInputError, match="dense attention blocks only"):
        recompute.torchtitan_mms(moe, Shape(tp=1, sp=False, micro_batch=1, seq_len=128,
                                            recompute_modules=OP))


def test_case_recompute_text_names_the_policy():
    assert recompute_mode("selective, torchtitan selective_ac_option 'op' (x)") == \
        ("selective", "op")
    assert recompute_mode("selective, torchtitan selective_ac_option '2' (x)") == \
        ("selective", "2")
    assert recompute_mode("full") == ("full", None)
    with pytest.raises(PlanInputError, match="must name torchtitan's policy"):
        recompute_mode("selective (op vs layer not stated)", "row")


@pytest.fixture(scope="module")
def rows():
    cases = {c["name"]: c for c in load_cases(MODERN_FILE)}
    return cases, {name: validate_case(case) for name, case in cases.items()
                   if name.startswith("torchtitan-llama3-8b-a100") or
                   name.startswith("torchtitan-llama2-13b-a100")}


def test_the_rows_set_their_policy(rows):
    cases, _ = rows
    layer = case_setup(cases["torchtitan-llama3-8b-a100-64gpu-fsdp2-lbs1-ac_selective-layer"])
    assert layer.parallel.recompute == "full" and layer.recompute_layers == 16  # 32 // 2
    op = case_setup(cases["torchtitan-llama3-8b-a100-64gpu-fsdp2-lbs1-ac_selective-op"])
    assert op.parallel.recompute == "selective" and op.options.recompute_modules == OP
    h100 = case_setup(cases["torchtitan-llama3.1-8b-8gpu-fsdp"])
    assert h100.options.recompute_modules == OP


def test_measured_ratios_between_the_policies(rows):
    """torchtitan's A100 table (docs/performance.md): Llama 3 8B 'selective layer' 2904 WPS,
    'selective op' 2973; Llama 2 13B 'no' 2162, 'selective op' 1904. When both selective modes
    were the mean of none and full they predicted equal times (ratio 1.0, measured 0.977) and
    13B's op overhead over none 15.5% (measured 13.6%); priced as torchtitan runs them both
    ratios come within 0.5%."""
    _, by = rows
    step = {name[11:]: r.predicted_step_s for name, r in by.items()}
    got = {name[11:]: r.measured_step_s for name, r in by.items()}
    for a, b in (("llama3-8b-a100-64gpu-fsdp2-lbs1-ac_selective-op",
                  "llama3-8b-a100-64gpu-fsdp2-lbs1-ac_selective-layer"),
                 ("llama2-13b-a100-64gpu-fsdp2-lbs2-ac_selective-op",
                  "llama2-13b-a100-64gpu-fsdp2-lbs2-ac_none")):
        assert step[a] / step[b] == pytest.approx(got[a] / got[b], rel=0.005)
