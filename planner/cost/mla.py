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
    *q_b, kv_b = up_projection_shapes(layer, tokens, tp)  # q_b only with a query latent
    q = ((tokens, h, layer.q_lora_rank), *q_b) if layer.q_lora_rank else ((tokens, h, qk / tp),)
    return (*q, (tokens, h, layer.kv_lora_rank + layer.qk_rope_head_dim),
            kv_b, (tokens, layer.v_size / tp, h))


def up_projection_shapes(layer: Layer, tokens: float, tp: int) -> tuple:
    """(m, k, n) of the two up-projections from the latents, q_b (q_lora x heads(nope + rope))
    and kv_b (kv_lora x heads(nope + v)), sharded by TP; without q_lora only kv_b."""
    heads = layer.num_attention_heads
    qk = heads * (layer.qk_nope_head_dim + layer.qk_rope_head_dim)
    kv_b = (tokens, layer.kv_lora_rank, heads * (layer.qk_nope_head_dim + layer.v_head_dim) / tp)
    if not layer.q_lora_rank:
        return (kv_b,)
    return ((tokens, layer.q_lora_rank, qk / tp), kv_b)


def up_projection_output_bytes(layer: Layer, sb: float, tp: int) -> float:
    """What recomputing the up-projections discards (Megatron-Core's "mla_up_proj", DeepSeek-V3
    §3.2.3), of :func:`kept_bytes`: the up-projections' outputs after RoPE, Q and K (H·d_qk
    each) and V (H·d_v), sharded by TP, and the latents after their norms with the rotated RoPE
    key (q_lora + kv_lora + rope, replicated). Megatron-Core checkpoints
    ``qkv_up_proj_and_rope_apply(q_compressed, kv_compressed, k_pos_emb, rotary_pos_emb)`` and
    calls ``discard_output_and_register_recompute(core_attn_out)``
    (megatron/core/transformer/multi_latent_attention.py); its Transformer Engine spec fuses the
    latent norms into the up-projections (``linear_q_up_proj=(TELayerNormColumnParallelLinear if
    qk_layernorm ...)``, ``q_layernorm=IdentityOp``, ``kv_layernorm=IdentityOp``,
    gpt_layer_specs.py), so their outputs go too. Kept: the latents before their norms, the
    checkpoint's inputs."""
    heads = layer.num_attention_heads
    qk = heads * (layer.qk_nope_head_dim + layer.qk_rope_head_dim)
    latents = layer.q_lora_rank + layer.kv_lora_rank + layer.qk_rope_head_dim
    return ACT_BYTES * sb * (latents + (2 * qk + heads * layer.v_head_dim) / tp)


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
