"""Model presets: the published shapes of the models people plan (`plan models` lists them)."""

from __future__ import annotations

from planner.model.spec import ModelSpec

DEFAULT_MODEL = "llama3-8b"  # what `plan solve` plans without --model



def megatron_gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048,
         ffn: int | None = None) -> ModelSpec:
    # GPT-style as trained by Megatron-LM: GeLU MLP 4h, LayerNorm with biases, learned positions,
    # tied input/output embeddings, vocabulary padded to 51,200 (Narayanan et al. 2021, Table 1).
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=heads, ffn_hidden_size=ffn or 4 * hidden, vocab_size=vocab,
                     seq_length=seq, mlp="gelu", norm="layernorm", bias=True, tie_embeddings=True,
                     position_embeddings=seq)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int) -> ModelSpec:
    # Llama family: SwiGLU, RMSNorm, no biases, RoPE, untied embeddings, no dropout (Touvron et
    # al. 2023; Meta Llama 3 model card / config.json: attention_dropout 0.0). RoPE base: 10,000
    # for Llama 2 and 500,000 for Llama 3 (their config.json "rope_theta").
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq,
                     mlp="swiglu", norm="rmsnorm", bias=False, tie_embeddings=False,
                     dropout=False, rope_theta=500000.0 if name.startswith("llama3") else 10000.0)


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        megatron_gpt("gpt3-175b", 96, 12288, 96),  # Brown et al. 2020, Table 2.1
        # BLOOM: ALiBi (no position table), 250,880-token vocabulary, tied, a LayerNorm after the
        # embedding (Le Scao et al. 2022, §3.2.3): 176,247,271,424 parameters.
        ModelSpec(name="bloom-176b", num_layers=70, hidden_size=14336, num_attention_heads=112,
                  num_kv_heads=112, ffn_hidden_size=4 * 14336, vocab_size=250880, seq_length=2048,
                  mlp="gelu", norm="layernorm", bias=True, tie_embeddings=True,
                  embedding_norm=True),
        megatron_gpt("mt-nlg-530b", 105, 20480, 128),  # Smith et al. 2022, §3
        # Megatron-LM 2021 GPT family (Narayanan et al. 2021, Table 1).
        megatron_gpt("megatron-1.7b", 24, 2304, 24),
        megatron_gpt("megatron-3.6b", 30, 3072, 32),
        megatron_gpt("megatron-7.5b", 36, 4096, 32),
        megatron_gpt("megatron-18.4b", 40, 6144, 48),
        megatron_gpt("megatron-39.1b", 48, 8192, 64),
        megatron_gpt("megatron-76.1b", 60, 10240, 80),
        megatron_gpt("megatron-145.6b", 80, 12288, 96),
        megatron_gpt("megatron-310.1b", 96, 16384, 128),
        megatron_gpt("megatron-529.6b", 105, 20480, 128),
        megatron_gpt("megatron-1t", 128, 25600, 160),
    )
}


ALIASES = {
    "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b", "gpt-3-175b": "gpt3-175b",
    "bloom": "bloom-176b", "mt-nlg": "mt-nlg-530b", "mtnlg-530b": "mt-nlg-530b",
    "megatron-1008b": "megatron-1t", "megatron-1008.0b": "megatron-1t",
    "llama-2-7b": "llama2-7b", "llama-2-13b": "llama2-13b", "llama-2-70b": "llama2-70b",
    "llama-3-8b": "llama3-8b", "llama-3-70b": "llama3-70b", "llama-3-405b": "llama3-405b",
    "llama3.1-405b": "llama3-405b", "llama-3.1-405b": "llama3-405b",
}
