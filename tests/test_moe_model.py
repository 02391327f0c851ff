"""Mixture-of-experts import: total and active parameter counts against the published figures,
MLA shapes by hand, and refusals of what is not modelled.

The configs under tests/hf_configs/moe/ were written for these tests from the published
config.json of each model on the HuggingFace Hub (the keys the planner reads and the MoE keys
around them). "Active" counts the parameters one token passes through, embedding and output head
included, as Mistral and Qwen count it; DeepSeek counts without the input embedding (its
DeepSeek-V3 weights README: "Activation parameters: 36.6B (including 0.9B for the output
Head)"), so its figures are checked that way.
"""

import json

import pytest
from conftest import MOE_CONFIGS, moe_config

from planner.core.errors import PlanInputError
from planner.model.load import model_from_dict
from planner.model.spec import ModelSpec



def spec_of(name: str) -> ModelSpec:
    changes = {"num_nextn_predict_layers": 0} if name == "deepseek-v3" else {}
    return model_from_dict(moe_config(name, **changes), name)


def embedding(spec: ModelSpec) -> int:
    return spec.vocab_size * spec.hidden_size


# (config, what, published, tolerance, source)
PUBLISHED = [
    ("mixtral-8x7b-v0.1", "total", 46.7e9, 0.01, "Mistral AI, 'Mixtral of experts' (2023-12-11): "
     "'Mixtral has 46.7B total parameters but only uses 12.9B parameters per token'"),
    ("mixtral-8x7b-v0.1", "active", 12.9e9, 0.01, "same"),
    ("mixtral-8x22b-v0.1", "total", 141e9, 0.01, "Mistral AI, 'Cheaper, Better, Faster, "
     "Stronger' (2024-04-17): 'uses only 39B active parameters out of 141B'"),
    ("mixtral-8x22b-v0.1", "active", 39e9, 0.01, "same"),
    ("qwen1.5-moe-a2.7b", "total", 14.3e9, 0.01, "Qwen blog, 'Qwen1.5-MoE: Matching 7B Model "
     "Performance with 1/3 Activated Parameters' (2024-03-28): 14.3B total, 2.7B activated"),
    ("qwen1.5-moe-a2.7b", "active", 2.7e9, 0.01, "same"),
    ("qwen3-30b-a3b", "total", 30.5e9, 0.01, "Qwen3-30B-A3B model card: 'Number of Parameters: "
     "30.5B in total and 3.3B activated'"),
    ("qwen3-30b-a3b", "active", 3.3e9, 0.02, "same (3.35B: 3.3B is rounded down)"),
    ("qwen3-30b-a3b", "non-embedding", 29.9e9, 0.01, "same card: 'Number of Paramaters "
     "(Non-Embedding): 29.9B'"),
    ("qwen3-235b-a22b", "total", 235e9, 0.01, "Qwen3-235B-A22B model card: 'Number of "
     "Parameters: 235B in total and 22B activated'"),
    ("qwen3-235b-a22b", "active", 22e9, 0.01, "same"),
    ("qwen3-235b-a22b", "non-embedding", 234e9, 0.01, "same card: Non-Embedding 234B"),
    ("deepseek-v2", "total", 236e9, 0.01, "DeepSeek-V2 report (arXiv 2405.04434), abstract: "
     "'236B total parameters, of which 21B are activated for each token'"),
    ("deepseek-v2", "active-deepseek", 21e9, 0.01, "same"),
    ("deepseek-v2-lite", "total", 15.7e9, 0.01, "DeepSeek-V2 report §5 / V2-Lite model card: "
     "'15.7B total parameters'"),
    # the card's '2.4B activated' is 2.1% under our 2.45B by DeepSeek's own convention: a
    # rounding we cannot reproduce, so the tolerance says so
    ("deepseek-v2-lite", "active-deepseek", 2.4e9, 0.025, "same: '2.4B activated'"),
    ("deepseek-v3", "total", 671e9, 0.01, "DeepSeek-V3 technical report (arXiv 2412.19437), "
     "abstract: '671B total parameters with 37B activated for each token'"),
    ("deepseek-v3", "active-deepseek", 36.6e9, 0.01, "DeepSeek-V3 README_WEIGHTS.md: "
     "'Activation parameters: 36.6B (including 0.9B for the output Head)'"),
]


@pytest.mark.parametrize("name, what, published, tol, source", PUBLISHED,
                         ids=[f"{p[0]}-{p[1]}" for p in PUBLISHED])
def test_parameter_counts_match_published(name, what, published, tol, source):
    spec = spec_of(name)
    count = {"total": spec.params, "active": spec.active_params,
             "non-embedding": spec.params - 2 * embedding(spec),
             "active-deepseek": spec.active_params - embedding(spec)}[what]
    assert count == pytest.approx(published, rel=tol), source


def test_every_moe_fixture_is_checked():
    assert {p.stem for p in MOE_CONFIGS.glob("*.json")} == {p[0] for p in PUBLISHED}


def test_mixtral_block_by_hand():
    """Mixtral-8x7B block: attention 4096 x (4096 + 2 x 1024) + 4096 x 4096 = 41,943,040; eight
    SwiGLU experts of 3 x 4096 x 14,336 = 176,160,768 each; router 4096 x 8; two RMSNorms."""
    block = spec_of("mixtral-8x7b-v0.1").blocks[0]
    assert block.is_moe and block.num_experts == 8 and block.moe_top_k == 2
    assert block.params == 41_943_040 + 8 * 176_160_768 + 32_768 + 8_192
    assert block.active_params == 41_943_040 + 2 * 176_160_768 + 32_768 + 8_192
    assert block.expert_params == 8 * 176_160_768


def test_deepseek_v3_mla_block_by_hand():
    """DeepSeek-V3 attention (MLA, report §2.1.1): q_a 7168 x 1536, q_b 1536 x 128 x 192, kv_a
    7168 x 576, kv_b 512 x 128 x 256, o 128 x 128 x 7168, latent norms 1536 + 512."""
    spec = spec_of("deepseek-v3")
    block = spec.blocks[10]
    attn = (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
            + 1536 + 512)
    assert block.is_mla and block.attention_params == attn == 187_107_328
    expert = 3 * 7168 * 2048
    assert block.params == attn + 257 * expert + 256 * 7168 + 256 + 2 * 7168
    # three dense blocks first (first_k_dense_replace), then 58 MoE blocks
    assert [b.is_moe for b in spec.blocks[:4]] == [False, False, False, True]
    assert spec.blocks[0].ffn_hidden_size == 18432 and block.ffn_hidden_size == 2048
    assert sum(b.is_moe for b in spec.blocks) == 58


def test_qwen2_moe_shared_expert_and_gate():
    block = spec_of("qwen1.5-moe-a2.7b").blocks[0]
    assert block.shared_ffn_hidden_size == 5632 and block.shared_expert_gate
    assert block.qkv_bias


def test_sparse_step_and_dense_layers():
    spec = model_from_dict(moe_config("qwen3-30b-a3b", decoder_sparse_step=2,
                                  mlp_only_layers=[1, 4]), "q")
    moe = [i for i, b in enumerate(spec.blocks) if b.is_moe]
    # Qwen3MoeDecoderLayer: sparse where (i + 1) % step == 0 and i not in mlp_only_layers
    assert moe[:3] == [3, 5, 7] and 1 not in moe
    deepseek = model_from_dict(moe_config("deepseek-v2", moe_layer_freq=2), "d")
    assert [b.is_moe for b in deepseek.blocks[:5]] == [False, False, True, False, True]


@pytest.mark.parametrize("changes, needle", [
    ({"topk_method": "sinkhorn"}, "topk_method = 'sinkhorn' is a router"),
    ({"scoring_func": "softplus"}, "scoring_func"),
    ({"moe_router_type": "expert_choice"}, "'moe_router_type' is a mixture-of-experts setting"),
    ({"num_nextn_predict_layers": -1}, "'num_nextn_predict_layers' must be >= 0"),
    ({"attention_bias": True}, "attention_bias"),
    ({"num_experts_per_tok": 300}, "exceeds the 256 experts"),
])
def test_deepseek_refusals_name_the_field(changes, needle):
    with pytest.raises(PlanInputError, match=needle.replace("(", r"\(")):
        model_from_dict(moe_config("deepseek-v3", **{"num_nextn_predict_layers": 0, **changes}), "d")


def test_published_v3_config_imports_its_mtp_module():
    # planned since issue #18's DeepSeek-V3 pass (tests/test_deepseek_v3_memory.py prices it)
    spec = model_from_dict(moe_config("deepseek-v3"), "d")
    assert spec.mtp_layers == 1 and spec.layers[-1].mtp_depth == 1
    assert spec.layers[-1].mtp_block.is_moe


def test_moe_keys_on_a_dense_family_are_refused():
    data = dict(json.loads((MOE_CONFIGS.parent / "llama-3.1-8b.json").read_text()), num_experts=8)
    with pytest.raises(PlanInputError, match="will not plan it as dense"):
        model_from_dict(data, "l")
    mixtral = moe_config("mixtral-8x7b-v0.1", router_type="hash")
    with pytest.raises(PlanInputError, match="'router_type'"):
        model_from_dict(mixtral, "m")


def test_model_json_moe_and_its_checks():
    base = dict(name="tiny-moe", num_layers=4, hidden_size=256, num_attention_heads=4,
                vocab_size=1000, seq_length=128, mlp="swiglu", ffn_hidden_size=512,
                num_experts=8, moe_top_k=2, moe_ffn_hidden_size=128, dense_layers=[0])
    spec = model_from_dict(base, "m.json")
    assert [b.is_moe for b in spec.blocks] == [False, True, True, True]
    assert spec.active_params < spec.params
    for bad, needle in (({"moe_top_k": 9}, "moe_top_k must be between 1"),
                        ({"moe_top_k": 0}, "moe_top_k must be between 1"),
                        ({"dense_layers": [4]}, "dense_layers names block 4"),
                        ({"dense_layers": ["a"]}, "list of block indices"),
                        ({"num_experts": 0}, "need num_experts > 0"),
                        ({"kv_lora_rank": 64}, "needs qk_nope_head_dim")):
        with pytest.raises(PlanInputError, match=needle):
            model_from_dict({**base, **bad}, "m.json")


def test_dense_models_are_unchanged():
    dense = model_from_dict(json.loads((MOE_CONFIGS.parent / "llama-3.1-8b.json").read_text()), "l")
    assert not dense.is_moe and dense.active_params == dense.params


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "deepseek-v3"])
def test_mla_projection_shapes_carry_its_flops(name):
    """One (m, k, n) per projection matmul, with or without a query latent (V2-Lite has none:
    one q_proj; it used to fail to unpack), and together exactly the projection FLOPs."""
    from planner.cost import mla

    layer = next(b for b in spec_of(name).blocks if b.kv_lora_rank)
    shapes = mla.projection_shapes(layer, 4096.0, 1)
    assert len(shapes) == (5 if layer.q_lora_rank else 4)
    assert sum(2.0 * m * k * n for m, k, n in shapes) == \
        pytest.approx(mla.projection_flops(layer, 4096.0))
