"""DeepSeek-V3's multi-token prediction modules (report sec. 2.2; cost/mtp.py): imported from the
released config, parameters against the published totals, one module's cost as the layers it
is made of, the embedding copy Megatron stores on the head's stage and DualPipe shares, and the
exports that can or cannot carry it."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.cost import constants, elementwise
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape, sharded_params
from planner.cost.mtp import module_layers
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.load import model_from_dict
from planner.model.template import model_template
from planner.predict.step import evaluate, predict_plan
from planner.stack import load_stack

CONFIG = Path(__file__).parent / "hf_configs" / "moe" / "deepseek-v3.json"
V3 = model_from_dict(json.loads(CONFIG.read_text()), "deepseek-v3").with_seq_length(4096)
MAIN = model_from_dict({**json.loads(CONFIG.read_text()), "num_nextn_predict_layers": 0},
                       "deepseek-v3-main").with_seq_length(4096)
HEAD = V3.layers[-1]
H, V = 7168, 129280
H100 = load_hardware("h100")


def test_the_released_config_has_one_mtp_module_with_an_moe_block():
    # report sec. 4.2: "The multi-token prediction depth D is set to 1"; the HF config's
    # num_nextn_predict_layers 1. Its block is layer 61, past first_k_dense_replace (3): MoE.
    assert V3.mtp_layers == 1 and HEAD.mtp_depth == 1
    assert HEAD.mtp_block == next(b for b in V3.blocks if b.is_moe)
    assert V3.layers[:-1] == MAIN.layers[:-1]


def test_parameters_match_the_published_totals():
    # HuggingFace DeepSeek-V3 README: "The total size of DeepSeek-V3 models on HuggingFace is
    # 685B, which includes 671B of the Main Model weights and 14B of the Multi-Token Prediction
    # (MTP) Module weights." The checkpoint stores the MTP layer's embed_tokens and
    # shared_head.head again (V x h each); plan3d counts shared weights once.
    assert MAIN.params == pytest.approx(671e9, rel=0.001)
    module = V3.params - MAIN.params
    assert module == HEAD.mtp_module_params  # block + 2h x h projection + three norms
    assert module == HEAD.mtp_block.params + 2 * H * H + 3 * H
    released = V3.params + 2 * V * H
    assert released == pytest.approx(685e9, rel=0.002)
    # "14B" is 685 - 671, both rounded: 13.46B here
    assert module + 2 * V * H == pytest.approx(14e9, rel=0.05)
    # active: one module's 8 of 256 routed experts and the rest of it
    idle = HEAD.mtp_block.params - HEAD.mtp_block.active_params
    assert V3.active_params - MAIN.active_params == module - idle


def test_a_gpu_stores_the_head_the_modules_and_an_embedding_copy():
    tp, ep = 2, 8
    plain = replace(HEAD, mtp_depth=0, mtp_block=None)
    padded = HEAD.padded_vocab(tp) * H / tp
    by_hand = (sharded_params(plain, tp, ep, 1) + padded  # the embedding copy
               + sharded_params(HEAD.mtp_block, tp, ep, 1) + 2 * H * H / tp + 3 * H)
    assert sharded_params(HEAD, tp, ep, 1) == pytest.approx(by_hand)
    assert HEAD.params - HEAD.unique_params == V * H  # the copy is not the model's


def test_one_module_costs_its_norms_projection_block_and_shared_head():
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=4096, ep=64, etp=1,
                  moe_probs_in_activation=True)
    opts = load_stack("megatron-core")
    got = layer_cost(HEAD, shape, "none", H100, opts)
    projection, block, shared = module_layers(HEAD)
    assert (projection.kind, projection.hidden_size, projection.out_features) == ("linear",
                                                                                  2 * H, H)
    main, p, b = (layer_cost(x, shape, "none", H100, opts) for x in (shared, projection, block))
    mem = H100.memory_bandwidth_gbps * 1e9 * (H100.memory_efficiency
                                               or constants.MEMORY_EFFICIENCY)
    norms = 2 * elementwise.RMSNORM_FUSED * 4096 * H / mem  # eq. 21's two RMSNorms
    assert got.fwd_s == pytest.approx(2 * main.fwd_s + p.fwd_s + b.fwd_s + norms)
    assert got.bwd_input_s == pytest.approx(2 * main.bwd_input_s + p.bwd_input_s
                                            + b.bwd_input_s + 2 * norms)
    assert got.model_flops == pytest.approx(2 * main.model_flops + p.model_flops + b.model_flops)
    # kept: both heads' log-probabilities, the projection's 2h input, the block's tensors and
    # the norms' two 16-bit inputs
    assert got.act_bytes == pytest.approx(2 * main.act_bytes + p.act_bytes + b.act_bytes
                                          + 2 * 2 * 4096 * H)
    assert got.a2a_s == b.a2a_s > 0 and got.expert_params == b.expert_params
    assert got.params == sharded_params(HEAD, 1, 64, 1)
    with pytest.raises(PlanInputError, match="multi-token prediction"):
        layer_cost(HEAD, shape, "none", H100, opts, measured=object())


def _state(model, schedule):
    cluster = make_cluster(load_hardware("h100"), 128, 16)
    par = Parallel(tp=1, pp=4, dp=32, micro_batch=1, num_microbatches=16, schedule=schedule,
                   zero=1, ep=32)
    _, pred = predict_plan(model, cluster, par, load_stack("megatron-core"))
    return pred.memory_parts, par


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipe"])
def test_the_embedding_copy_is_shared_where_the_rank_holds_the_embedding(schedule):
    # Megatron-Core builds the embedding on the MTP stage too ("if self.pre_process or
    # self.mtp_process: self.embedding = LanguageModelEmbedding("); DualPipe's rank 0 and p - 1
    # hold both ends, where the report shares it (sec. 3.2.3).
    with_mtp, _ = _state(V3, schedule)
    without, _ = _state(MAIN, schedule)
    extra = with_mtp["weights"] - without["weights"]  # 16-bit weights (a BF16 stack)
    # the head's stage stores the module and the V x h copy (tp 1: 129,280 rows need no padding)
    module = sharded_params(HEAD, 1, 32, 1) - sharded_params(MAIN.layers[-1], 1, 32, 1)
    if schedule == "dualpipe":  # ranks 0 and 3 hold stage 0 and stage 3: the copy is shared
        assert extra[0] == extra[3] == pytest.approx(2 * (module - V * H))
        assert extra[1] == extra[2] == 0
    else:  # the last rank stores the copy too
        assert extra[3] == pytest.approx(2 * module)
        assert extra[0] == extra[1] == extra[2] == 0


def test_exports_carry_or_refuse_the_mtp_modules():
    from planner.launchers.megatron import moe_flags
    cluster = make_cluster(load_hardware("h100"), 256, 8)
    par = Parallel(tp=1, pp=8, dp=32, micro_batch=1, num_microbatches=64, zero=1, ep=32)
    plan = evaluate(V3, cluster, par, load_stack("megatron-core"))
    assert ("--mtp-num-layers", "1") in moe_flags(plan)
    assert ("--mtp-num-layers", "1") not in moe_flags(evaluate(MAIN, cluster, par,
                                                               load_stack("megatron-core")))
    from planner.launchers.plan_json import architecture, layer_modules
    assert architecture(V3)["mtp_layers"] == 1 and "mtp_layers" not in architecture(MAIN)
    assert layer_modules(V3)[-1] == ["norm", "output", "mtp.layers.0"]


def test_the_reference_engine_refuses_mtp():
    pytest.importorskip("torch")
    from planner.engine.torch_model import _arch
    from planner.launchers.plan_json import architecture
    doc = {"schema": "plan3d/plan/v2", "model": architecture(V3),
           "layers": [{"kind": layer.kind} for layer in V3.layers]}
    with pytest.raises(PlanInputError, match="multi-token prediction"):
        _arch(doc)


def test_model_json_takes_mtp_layers_on_the_standard_layers_only():
    doc = json.loads(json.dumps(model_template(V3)))
    assert doc["mtp_layers"] == 1 and "layers" not in doc
    again = model_from_dict(doc, "again")
    assert again.layers == V3.layers and again.params == V3.params
    explicit = {"name": "x", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
                "seq_length": 32, "mtp_layers": 1,
                "layers": [{"kind": "embedding"}, {"kind": "block"}, {"kind": "head"}]}
    with pytest.raises(PlanInputError, match="mtp_layers"):
        model_from_dict(explicit, "x")
    with pytest.raises(PlanInputError, match="mtp_depth"):
        model_from_dict({**explicit, "mtp_layers": 0,
                         "layers": [{"kind": "head", "mtp_depth": 1}]}, "x")
