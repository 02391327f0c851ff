"""HuggingFace config.json import against published parameter counts.

The configs under tests/hf_configs/ are the models' published config.json files (the values the
planner reads, and the flags around them, as released on the HuggingFace Hub). Each count below
is the published figure with its source; "HF Hub" means the parameter count the Hub shows on the
model page from the safetensors weights (rounded as shown there).
"""

import json
from pathlib import Path

import pytest

from planner.core.errors import PlanInputError
from planner.cost.layer import block_forward_flops
from planner.cost.memory import sharded_params
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.spec import ModelSpec, sequence_note
from planner.model.load import load_model, model_from_dict
from planner.search.rules import tp_rule

CONFIGS = Path(__file__).parent / "hf_configs"


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def non_embedding(spec: ModelSpec) -> int:
    """Parameters outside the token embedding and the output projection (counted once if tied)."""
    tables = 1 if spec.tie_embeddings else 2
    return spec.params - tables * spec.vocab_size * spec.hidden_size


# (config, published count, what the count covers, source)
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, "total", "HF Hub meta-llama/Llama-3.1-8B: 8.03B params"),
    ("llama-3.1-70b", 70.6e9, "total", "HF Hub meta-llama/Llama-3.1-70B: 70.6B params"),
    ("llama-3.2-1b", 1.24e9, "total", "HF Hub meta-llama/Llama-3.2-1B: 1.24B params "
                                      "(model card table: 1.23B)"),
    ("llama-3.2-3b", 3.21e9, "total", "Llama 3.2 model card table: 3B (3.21B)"),
    ("llama-3.3-70b-instruct", 70.6e9, "total", "HF Hub meta-llama/Llama-3.3-70B-Instruct: "
                                                "70.6B params"),
    ("qwen2.5-7b", 7.61e9, "total", "Qwen2.5-7B model card: Number of Parameters: 7.61B"),
    ("qwen2.5-7b", 6.53e9, "non-embedding", "Qwen2.5-7B model card: Number of Paramaters "
                                            "(Non-Embedding): 6.53B"),
    # The card's total, 0.6B, is rounded too coarsely for 0.5% (596M rounds to it); its
    # non-embedding count has the digits, and the total is checked exactly below.
    ("qwen3-0.6b", 0.44e9, "non-embedding", "Qwen3-0.6B model card: Number of Paramaters "
                                            "(Non-Embedding): 0.44B"),
    ("qwen3-8b", 8.2e9, "total", "Qwen3-8B model card: Number of Parameters: 8.2B"),
    ("qwen3-8b", 6.95e9, "non-embedding", "Qwen3-8B model card: Number of Paramaters "
                                          "(Non-Embedding): 6.95B"),
    ("mistral-7b-v0.1", 7.24e9, "total", "HF Hub mistralai/Mistral-7B-v0.1: 7.24B params"),
    ("mistral-7b-v0.3", 7.25e9, "total", "HF Hub mistralai/Mistral-7B-v0.3: 7.25B params"),
    ("mistral-nemo-base-2407", 12.2e9, "total", "HF Hub mistralai/Mistral-Nemo-Base-2407: 12.2B "
                                                "params"),
    # Gemma 2 report (Gemma Team 2024), Table 2: 9B, embedding 917,962,752 and non-embedding
    # 8,324,201,984 parameters (the embedding there counts a 256,128-row table).
    ("gemma-2-9b", 8_324_201_984, "non-embedding", "Gemma 2 report, Table 2"),
    ("gemma-2-9b", 917_962_752 + 8_324_201_984, "total", "Gemma 2 report, Table 2"),
    # Gemma 3 technical report (Gemma Team 2025), Table 1: 1B, 0 vision encoder, 302M embedding,
    # 698M non-embedding parameters.
    ("gemma-3-1b-pt", 698e6, "non-embedding", "Gemma 3 report, Table 1"),
    ("gemma-3-1b-pt", 302e6 + 698e6, "total", "Gemma 3 report, Table 1"),
    ("phi-3-mini-4k-instruct", 3.82e9, "total", "HF Hub microsoft/Phi-3-mini-4k-instruct: "
                                                "3.82B params"),
    ("phi-4", 14.7e9, "total", "HF Hub microsoft/phi-4: 14.7B params"),
    ("olmo-2-1124-7b", 7.3e9, "total", "HF Hub allenai/OLMo-2-1124-7B: 7.3B params"),
]


@pytest.mark.parametrize("name, published, what, source", PUBLISHED,
                         ids=[f"{p[0]}-{p[2]}" for p in PUBLISHED])
def test_parameter_counts_match_published(name, published, what, source):
    spec = model_from_dict(config(name), name)
    count = spec.params if what == "total" else non_embedding(spec)
    assert count == pytest.approx(published, rel=0.005), source


def test_every_fixture_is_checked_against_a_published_count():
    assert {p.stem for p in CONFIGS.glob("*.json")} == {p[0] for p in PUBLISHED}
    assert len({p[0] for p in PUBLISHED}) >= 10


def test_qwen3_head_dim_exact():
    """Qwen3-0.6B: head_dim 128 with hidden 1024 and 16 heads (not 1024 / 16 = 64). By hand:
    per block Q 1024x2048, K and V 1024x1024 each, O 2048x1024 (6,291,456), SwiGLU 3x1024x3072
    (9,437,184), two RMSNorms (2,048) and the per-head Q/K norms (2x128): 15,730,944; x28 =
    440,466,432; tied 151,936x1,024 embedding (155,582,464) and the final norm (1,024)."""
    spec = model_from_dict(config("qwen3-0.6b"), "qwen3-0.6b")
    assert spec.head_dim == 128 and spec.blocks[0].head_dim == 128
    assert spec.params == 440_466_432 + 155_582_464 + 1_024 == 596_049_920
    assert spec.tie_embeddings


def test_mistral_nemo_head_dim():
    """Mistral-NeMo: head_dim 128 with hidden 5120 and 32 heads: 12.25B, not 12.77B."""
    spec = model_from_dict(config("mistral-nemo-base-2407"), "nemo")
    assert spec.params == pytest.approx(12.25e9, rel=0.001)


def test_gemma2_9b_non_embedding_exact():
    """Four norms per block, GeGLU, head_dim 256: Table 2's non-embedding count to the unit."""
    assert non_embedding(model_from_dict(config("gemma-2-9b"), "g")) == 8_324_201_984


def test_rope_and_context_are_carried():
    spec = model_from_dict(config("llama-3.1-8b"), "llama")
    assert spec.rope_theta == 500000.0
    assert spec.rope_scaling == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert spec.max_position_embeddings == 131072
    qwen = model_from_dict(config("qwen3-8b"), "qwen3")
    assert qwen.rope_theta == 1000000 and qwen.rope_scaling is None
    gpt2 = model_from_dict({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                            "vocab_size": 50257, "n_positions": 1024})
    assert gpt2.rope_theta is None and gpt2.seq_length == 1024  # learned positions, no RoPE


def test_planning_length_is_capped_with_a_note():
    """Llama 3.1 declares 131072 positions; the planning default stays at 8192 and says so."""
    spec = model_from_dict(config("llama-3.1-8b"), "llama")
    assert spec.seq_length == 8192
    note = sequence_note(spec, None)
    assert "131072" in note and "8192" in note and "--seq-len" in note
    # within the declared context and not overridden: nothing to say
    olmo = model_from_dict(config("olmo-2-1124-7b"), "olmo")
    assert olmo.seq_length == 4096 and sequence_note(olmo, None) is None
    # overridden: say what was declared
    assert "4096" in sequence_note(olmo.with_seq_length(2048), 2048)
    assert "beyond" in sequence_note(olmo.with_seq_length(8192), 8192)


def test_sliding_window_is_refused_only_where_it_acts():
    """A window shorter than the planned sequence would make plan3d count full attention where the
    model computes a band: refused, naming the feature and the way out."""
    mistral = model_from_dict(config("mistral-7b-v0.1"), "mistral")
    assert mistral.sliding_window == 4096
    with pytest.raises(PlanInputError, match="sliding-window attention.*--seq-len 4096"):
        mistral.with_seq_length(None)
    assert mistral.with_seq_length(4096).seq_length == 4096
    gemma = model_from_dict(config("gemma-2-9b"), "gemma2")
    with pytest.raises(PlanInputError, match="sliding-window"):
        gemma.with_seq_length(8192)
    phi = model_from_dict(config("phi-3-mini-4k-instruct"), "phi3")
    assert phi.sliding_window == 2047
    # Qwen2.5 declares a window but does not use it (use_sliding_window false)
    qwen = model_from_dict(config("qwen2.5-7b"), "qwen")
    assert qwen.sliding_window == 0
    assert qwen.with_seq_length(None).seq_length == 8192


def test_mistral_defaults_to_its_window_when_the_key_is_absent():
    """transformers' MistralConfig defaults sliding_window to 4096: a config without the key uses
    it."""
    data = {k: v for k, v in config("mistral-7b-v0.3").items() if k != "sliding_window"}
    assert model_from_dict(data, "m").sliding_window == 4096


def test_tied_embeddings_follow_the_family_default():
    gemma = config("gemma-2-9b")
    assert "tie_word_embeddings" not in gemma
    assert model_from_dict(gemma, "gemma").tie_embeddings  # Gemma2Config ties by default
    llama = {k: v for k, v in config("llama-3.1-8b").items() if k != "tie_word_embeddings"}
    assert not model_from_dict(llama, "llama").tie_embeddings  # LlamaConfig does not
    assert model_from_dict(config("llama-3.2-1b"), "l").tie_embeddings


def test_vocabulary_padding_as_megatron():
    """Megatron-LM pads to a multiple of make_vocab_size_divisible_by x TP (default 128)."""
    gpt2 = model_from_dict({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                            "vocab_size": 50257, "n_positions": 1024})
    assert gpt2.make_vocab_size_divisible_by == 128
    assert gpt2.padded_vocab_size(1) == 50304
    assert gpt2.padded_vocab_size(2) == 50432
    assert gpt2.padded_vocab_size(8) == 51200
    llama = model_from_dict(config("llama-3.1-8b"), "l")
    assert [llama.padded_vocab_size(t) for t in (1, 2, 4, 8)] == [128256, 128256, 128512, 129024]
    # the published count is the unpadded model's
    assert gpt2.params == 124_439_808


def test_unsupported_features_are_refused_by_name():
    gemma3 = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": config("gemma-3-1b-pt"), "vision_config": {"hidden_size": 1152}}
    with pytest.raises(PlanInputError, match="vision"):
        model_from_dict(gemma3)
    llama = dict(config("llama-3.1-8b"), attention_bias=True)
    with pytest.raises(PlanInputError, match="attention_bias"):
        model_from_dict(llama)


def test_load_model_reads_a_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config("qwen3-0.6b")))
    assert load_model(path).params == 596_049_920


@pytest.mark.parametrize("name", sorted({p[0] for p in PUBLISHED}))
def test_block_matmul_flops_follow_the_declared_head_dim(name):
    """The cost model's weight-matmul FLOPs are 2 x tokens x the block's matmul weights, with
    Q and the attention output heads x head_dim wide (not hidden_size) where head_dim is set."""
    block = model_from_dict(config(name), name).blocks[0]
    biases = block.q_size + 2 * block.num_kv_heads * block.head_dim if block.qkv_bias else 0
    weights = block.params - block.norm_params - biases
    gemm, attn = block_forward_flops(block, tokens=4096, seq_len=4096)
    assert gemm == 2 * 4096 * weights
    assert attn == 4 * 4096 * 4096 * block.q_size


def test_gpt2_vocabulary_no_longer_blocks_tensor_parallelism():
    """50,257 is odd: unpadded, no TP degree divides it; padded as Megatron pads it, any does."""
    gpt2 = model_from_dict({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                            "vocab_size": 50257, "n_positions": 1024})
    cluster = make_cluster(load_hardware("h100", None), 8, 1)
    assert all(tp_rule(gpt2, cluster, tp) is None for tp in (2, 4))
    head = gpt2.layers[-1]
    assert sharded_params(head, 4) == head.params - 50257 * 768 + 50688 * 768 / 4  # 99 x 512
