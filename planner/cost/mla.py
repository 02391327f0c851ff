"""Multi-head latent attention (DeepSeek-V2 §2.1, DeepSeek-V3 §2.1.1): FLOPs and kept activations
of one block's attention, as trained (no weight absorption: K and V are materialised per head).

Per token, forward: every projection matrix is one matmul, 2 FLOPs per weight (q_a, q_b or one
q_proj, kv_a, kv_b, o_proj: Layer.mla_matrix_params); scores Q K^T over heads of qk_nope +
qk_rope and values over heads of v_head_dim: 2·s·H·(d_qk + d_v), the full s×s as the published
formulas count it (cost/layer.py halves what a causal flash kernel executes). Matrices are
sharded by TP as Megatron-Core shards the up-projections and heads; its down-projections
(q_down, kv_down) run duplicated on every TP rank, which this module counts as sharded: exact at
tp = 1 (DeepSeek-V3 trained without TP, report §3.2), a few percent of the attention low above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.stack.spec import ACTIVATION_BYTES as ACT_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from planner.model.spec import Layer


def projection_flops(layer: Layer, tokens: float) -> float:
    """Forward FLOPs of MLA's projection matrices, whole layer."""
    return 2.0 * tokens * layer.mla_matrix_params


def attention_flops(layer: Layer, tokens: float, seq_len: int) -> float:
    """Forward FLOPs of scores and values over the full s×s, whole layer."""
    qk = layer.qk_nope_head_dim + layer.qk_rope_head_dim
    return 2.0 * tokens * seq_len * layer.num_attention_heads * (qk + layer.v_head_dim)


def projection_shapes(layer: Layer, tokens: float, tp: int) -> tuple:
    """(m, k, n) of each projection matmul on one GPU, for the operand-traffic term."""
    h, heads = layer.hidden_size, layer.num_attention_heads
    qk = heads * (layer.qk_nope_head_dim + layer.qk_rope_head_dim)
    kv_up = heads * (layer.qk_nope_head_dim + layer.v_head_dim)
    q = ((tokens, h, layer.q_lora_rank), (tokens, layer.q_lora_rank, qk / tp)) \
        if layer.q_lora_rank else ((tokens, h, qk / tp),)
    return (*q, (tokens, h, layer.kv_lora_rank + layer.qk_rope_head_dim),
            (tokens, layer.kv_lora_rank, kv_up / tp), (tokens, layer.v_size / tp, h))


def kept_bytes(layer: Layer, sb: float, tp: int) -> float:
    """Attention tensors kept for the backward, per Korthikanti's accounting (16-bit each): the
    latents after their norms and the norm inputs (q_lora, kv_lora + the RoPE key; replicated
    across TP), Q and K (H·d_qk each), V (H·d_v) and the output projection's input (H·d_v),
    sharded by TP."""
    heads = layer.num_attention_heads
    qk = heads * (layer.qk_nope_head_dim + layer.qk_rope_head_dim)
    v = heads * layer.v_head_dim
    latents = 2 * (layer.q_lora_rank + layer.kv_lora_rank + layer.qk_rope_head_dim)
    return ACT_BYTES * sb * (latents + (2 * qk + 2 * v) / tp)
