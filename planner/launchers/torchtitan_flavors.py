"""The dense model flavors torchtitan 0.2.2 ships, as plan3d's ModelSpec expresses them, and the
match of a model to one (planner/launchers/torchtitan.py exports only an exact match: torchtitan
builds its own model from ``[model] name, flavor``, so any other shape would train a different
model than the one planned).

MoE flavors are not listed: Qwen3's debugmodel_moe, 30B-A3B and 235B-A22B
('moe_enabled=True' in torchtitan/models/qwen3/__init__.py) and DeepSeek-V3 (MLA + MoE) need
expert-parallel settings this exporter does not write and CI does not run; they are refused
(torchtitan.model_rules).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.model.spec import ModelSpec


@dataclass(frozen=True)
class Flavor:
    """One flavor: torchtitan's model name (``[model] name``), flavor, and the shape (blocks,
    hidden, heads, kv heads, FFN, vocabulary), with Qwen3's per-head width, tying, RoPE base and
    context; ``pipelining``: whether the model's TrainSpec has a pipelining_fn."""

    module: str
    flavor: str
    shape: tuple[int, int, int, int, int, int]
    head_dim: int = 0  # 0: hidden / heads (Llama 3)
    tied: bool = False
    rope_theta: float | None = None  # None: not compared (the Llama 3 path never has)
    max_seq_len: int = 0  # 0: no limit checked
    pipelining: bool = True


# torchtitan/models/llama3/__init__.py (0.2.2) llama3_args: dim, n_layers, n_heads, n_kv_heads
# (None: n_heads), vocab_size (default 128256), FFN = FeedForward's 'hidden_dim = int(2 *
# hidden_dim / 3)', times ffn_dim_multiplier, rounded up to multiple_of (default 256) from 4 *
# dim: debugmodel ('dim=256, n_layers=6, n_heads=16, vocab_size=2048') 682 -> 768, 8B 1024/1.3 ->
# 14336, 70B 4096/1.3 -> 28672, 405B 4096/1.2 -> 53248. All SwiGLU, RMSNorm, RoPE, no biases,
# untied. (debugmodel_flex_attn / _varlen_attn share debugmodel's shape with other attention:
# not exported.)
LLAMA3 = (
    Flavor("llama3", "debugmodel", (6, 256, 16, 16, 768, 2048)),
    Flavor("llama3", "8B", (32, 4096, 32, 8, 14336, 128256)),
    Flavor("llama3", "70B", (80, 8192, 64, 8, 28672, 128256)),
    Flavor("llama3", "405B", (126, 16384, 128, 8, 53248, 128256)),
)

# torchtitan/models/qwen3/__init__.py (0.2.2) qwen3_args, each 'Qwen3ModelArgs(vocab_size=...,
# max_seq_len=4096, head_dim=128, dim=..., n_layers=..., n_heads=..., n_kv_heads=8,
# qk_norm=True, hidden_dim=..., rope_theta=1000000[, enable_weight_tying=True])'; the FFN is
# hidden_dim as given (model.py FeedForward 'self.w1 = nn.Linear(dim, hidden_dim, bias=False)',
# SwiGLU 'self.w2(F.silu(self.w1(x)) * self.w3(x))'); the QK norm is per head ('self.q_norm =
# nn.RMSNorm(self.head_dim, ...)': plan3d's qk_norm "head"); norms are 'nn.RMSNorm(model_args.dim'
# twice per block, no biases; tying is 'self.output.weight = self.tok_embeddings.weight'.
# 'get_train_spec() ... pipelining_fn=None': train.py 'if not self.train_spec.pipelining_fn:
# raise RuntimeError(f"Pipeline Parallel is enabled but {job_config.model.name} does not support
# pipelining")'. Tying as in the HF Qwen3 configs (tie_word_embeddings true on 0.6B, 1.7B, 4B).
_Q = dict(head_dim=128, rope_theta=1_000_000.0, max_seq_len=4096, pipelining=False)
QWEN3 = (
    Flavor("qwen3", "debugmodel", (8, 256, 16, 8, 3072, 2048), tied=True, **_Q),
    Flavor("qwen3", "0.6B", (28, 1024, 16, 8, 3072, 151936), tied=True, **_Q),
    Flavor("qwen3", "1.7B", (28, 2048, 16, 8, 6144, 151936), tied=True, **_Q),
    Flavor("qwen3", "4B", (36, 2560, 32, 8, 9728, 151936), tied=True, **_Q),
    Flavor("qwen3", "8B", (36, 4096, 32, 8, 12288, 151936), **_Q),
    Flavor("qwen3", "14B", (40, 5120, 40, 8, 17408, 151936), **_Q),
    Flavor("qwen3", "32B", (64, 5120, 64, 8, 25600, 151936), **_Q),
)
FLAVORS = LLAMA3 + QWEN3


def flavor(model: ModelSpec) -> Flavor | None:
    """The torchtitan flavor with exactly this model's shape, if any."""
    if (model.mlp, model.norm, model.bias, model.position_embeddings, model.qkv_bias,
            model.block_norms, model.sliding_window) != ("swiglu", "rmsnorm", False, 0, False, 2, 0):
        return None
    shape = (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
             model.ffn_hidden_size, model.vocab_size)
    for f in FLAVORS:
        if f.shape != shape:
            continue
        if f.module == "llama3" and (model.qk_norm, model.tie_embeddings) == ("", False) \
                and model.kv_channels * model.num_attention_heads == model.hidden_size:
            return f
        # Qwen3: no dropout in its blocks, RoPE without scaling ('precompute_rope_cache(dim,
        # max_seq_len, base)' in qwen3/model/model.py)
        if f.module == "qwen3" and (model.qk_norm, model.tie_embeddings, model.kv_channels,
                                    model.rope_theta, model.rope_scaling, model.dropout) == \
                ("head", f.tied, f.head_dim, f.rope_theta, None, False):
            return f
    return None


def by_facts(shape: tuple) -> Flavor | None:
    """The flavor whose (blocks, heads, kv heads, FFN, vocabulary) these are: what the search's
    Facts know of a model (no two flavors share them; the export matches the whole shape)."""
    return next((f for f in FLAVORS if (f.shape[0], *f.shape[2:]) == shape), None)
