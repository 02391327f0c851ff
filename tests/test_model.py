import json

import pytest

from planner.core.errors import PlanInputError
from planner.model.load import load_model, model_from_dict
from planner.model.presets import PRESETS


@pytest.mark.parametrize("name, published", [
    ("gpt3-175b", 175e9),      # Brown et al. 2020
    ("llama2-7b", 6.74e9),     # Touvron et al. 2023 / HF model card: 6,738,415,616
    ("llama3-8b", 8.03e9),     # Meta Llama 3 model card
    ("llama3-405b", 405e9),    # Llama 3 herd paper
    ("llama2-70b", 69.0e9),
    ("bloom-176b", 176e9),     # Le Scao et al. 2022
    ("mt-nlg-530b", 530e9),    # Smith et al. 2022
])
def test_preset_parameter_counts_match_published(name, published):
    assert PRESETS[name].params == pytest.approx(published, rel=0.01)


def test_bloom_counts_its_embedding_norm():
    """BLOOM's published 176,247,271,424 parameters (HF bigscience/bloom) include the LayerNorm
    after the word embedding: exact only with it."""
    assert PRESETS["bloom-176b"].params == 176_247_271_424


def test_megatron_2021_family_matches_table1(published_runs):
    for case in published_runs:
        if case["group"] != "megatron2021_table1":
            continue
        m = case["model"]
        match = [p for p in PRESETS.values()
                 if (p.num_layers, p.hidden_size) == (m["layers"], m["hidden"])]
        assert match, case["name"]
        l, h, v, s = m["layers"], m["hidden"], m["vocab"], m["seq_len"]
        # Narayanan et al. 2021 §5.1: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
        formula = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
        assert match[0].params == pytest.approx(formula, rel=0.001), case["name"]
        assert match[0].params == pytest.approx(m["params_b"] * 1e9, rel=0.03), case["name"]


def test_llama2_7b_exact_count():
    assert PRESETS["llama2-7b"].params == 6_738_415_616


def test_hf_llama_config(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "max_position_embeddings": 8192}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(path)
    assert spec.params == PRESETS["llama3-8b"].params
    assert spec.mlp == "swiglu" and not spec.tie_embeddings


def test_hf_llama_defaults_kv_heads_to_heads():
    spec = model_from_dict({"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "intermediate_size": 128,
                            "vocab_size": 100})
    assert spec.num_kv_heads == 4


def test_hf_gpt2_config():
    spec = model_from_dict({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                            "vocab_size": 50257, "n_positions": 1024})
    # GPT-2 small: 124M parameters (Radford et al. 2019, HF model card 124,439,808)
    assert spec.params == 124_439_808
    assert spec.tie_embeddings and spec.ffn_hidden_size == 3072


def test_hf_neox_and_falcon():
    neox = model_from_dict({"model_type": "gpt_neox", "hidden_size": 6144,
                            "num_hidden_layers": 44, "num_attention_heads": 64,
                            "intermediate_size": 24576, "vocab_size": 50432})
    assert neox.params == pytest.approx(20.55e9, rel=0.01)  # GPT-NeoX-20B
    falcon = model_from_dict({"model_type": "falcon", "hidden_size": 4544,
                              "num_hidden_layers": 32, "num_attention_heads": 71,
                              "multi_query": True, "vocab_size": 65024})
    assert falcon.num_kv_heads == 1
    assert falcon.params == pytest.approx(6.92e9, rel=0.02)  # Falcon-7B


def test_moe_of_a_family_we_do_not_import_is_refused():
    """Mixtral, Qwen-MoE and DeepSeek import (tests/test_moe_model.py); experts on any other
    family are refused, never planned as a dense model."""
    with pytest.raises(PlanInputError, match="mixture-of-experts"):
        model_from_dict({"model_type": "llama", "num_local_experts": 8, "hidden_size": 4096})
    with pytest.raises(PlanInputError, match="missing 'num_attention_heads'"):
        model_from_dict({"model_type": "mixtral", "num_local_experts": 8, "hidden_size": 4096})


def test_our_model_json_and_explicit_layers():
    spec = model_from_dict({"name": "tiny", "num_layers": 2, "hidden_size": 64,
                            "num_attention_heads": 4, "vocab_size": 100, "seq_length": 32})
    assert [l.kind for l in spec.layers] == ["embedding", "block", "block", "head"]
    custom = model_from_dict({"name": "custom", "hidden_size": 64, "num_attention_heads": 4,
                              "vocab_size": 100, "seq_length": 32,
                              "layers": [{"kind": "embedding"}, {"kind": "block", "repeat": 3},
                                         {"kind": "linear", "out_features": 10}]})
    assert [l.kind for l in custom.layers] == ["embedding", "block", "block", "block", "linear"]
    assert custom.num_layers == 3


@pytest.mark.parametrize("data, message", [
    ({"num_layers": 2}, "missing"),
    ({"name": "x", "num_layers": 0, "hidden_size": 64, "num_attention_heads": 4,
      "vocab_size": 10, "seq_length": 8}, "positive"),
    ({"name": "x", "num_layers": 2, "hidden_size": 65, "num_attention_heads": 4,
      "vocab_size": 10, "seq_length": 8}, "divisible"),
    ({"model_type": "t5"}, "not supported"),
    ({"name": "x", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10,
      "seq_length": 8, "layers": [{"kind": "conv"}]}, "kind"),
])
def test_bad_models_raise_one_clear_error(data, message):
    with pytest.raises(PlanInputError, match=message):
        model_from_dict(data)


def test_unknown_preset_and_bad_json(tmp_path):
    with pytest.raises(PlanInputError, match="plan models"):
        load_model("gpt-17")
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    with pytest.raises(PlanInputError, match="not valid JSON"):
        load_model(bad)
