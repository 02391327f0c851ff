"""Megatron's selective recompute of named modules (--recompute-granularity selective
--recompute-modules ...): what each module discards from a block's kept activations and what the
backward spends rebuilding it. The stack's ``recompute_modules`` names them; a plan whose recompute
mode is "selective" uses them.

Megatron-Core TransformerConfig.recompute_modules (megatron/core/transformer/transformer_config.py):
  "core_attn": recompute the core attention part of the transformer layer.
  "moe_act": recompute the MoE MLP activation function.
  "layernorm": recompute the input_layernorm and pre_mlp_layernorm.
  "moe_act", "layernorm", and "mla_up_proj" use output-discarding checkpointing, "core_attn",
  "mlp", "moe", and "shared_experts" use normal checkpointing.

Output-discarding checkpointing keeps the module's input (already kept by its producer) and frees
its output once the next module has used it; the backward runs the module again. So:

- core_attn: the s x s scores, softmax and dropout (Korthikanti et al. 2022 §5, 5·a·s²·b/t);
  with flash attention they are never stored, so nothing is discarded (cost/memory.py). Rebuilt:
  the attention forward.
- layernorm: the two norm outputs, the QKV input and the MLP (router, dispatcher, shared experts)
  input, 2·s·b·h bytes each, replicated across TP unless sequence parallel shards them (as
  Korthikanti counts them). Rebuilt: two norm forwards, memory-bound: read the 16-bit input,
  write the output (cost/elementwise.py RMSNORM_FUSED, 4 bytes per element).
- moe_act: each routed copy's activation output, the FC2 input (2·f/etp bytes; Megatron's
  grouped experts run ``activation_checkpoint.checkpoint(self.activation_func_with_probs,
  fc1_output, ...)`` then ``discard_output_and_register_recompute(fc2_output)``,
  megatron/core/transformer/moe/experts.py). Dense MLPs are untouched. Rebuilt: the activation,
  memory-bound (SwiGLU reads 2f, writes f: cost/elementwise.py SWIGLU_FUSED, 6 bytes per element
  of f; GeLU reads and writes f: 4).

- mla_up_proj ('"mla_up_proj": recompute the MLA up projection and RoPE applying parts'):
  Q, K and V as the up-projections and RoPE leave them, and the latents after their norms
  (cost/mla.py up_projection_output_bytes). Rebuilt: the latent norms (memory-bound, as
  layernorm's) and the two up-projection GEMMs, forward, whose FLOPs count as hardware FLOPs.
  DeepSeek-V3's report, sec. 3.2.3, "Recomputation of RMSNorm and MLA Up-Projection": "We
  recompute all RMSNorm operations and MLA up-projections during back-propagation, thereby
  eliminating the need to persistently store their output activations."

None of the others add model or hardware FLOPs beyond core_attn's attention (norms and
activations are not counted in either convention).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.cost import elementwise, mla, moe

if TYPE_CHECKING:  # pragma: no cover
    from planner.model.spec import Layer

ACT_BYTES = 2  # 16-bit activations
GELU_BYTES = 4.0  # a fused GeLU reads 2 and writes 2 bytes per element of f


def drops_scores(shape) -> bool:
    """Whether this selective recompute drops the s x s scores (Korthikanti's selective)."""
    return "core_attn" in shape.recompute_modules


def norm_output_bytes(layer: Layer, shape) -> float:
    """The two norm outputs of a block (QKV input and MLP input), 16-bit."""
    rep = 1 / shape.tp if shape.sp else 1.0
    return 2 * ACT_BYTES * shape.tokens * layer.hidden_size * rep


def moe_act_output_bytes(layer: Layer, shape) -> float:
    """The routed copies' activation outputs (the FC2 inputs) on this GPU, 16-bit, at the mean
    load as what the block keeps is (cost/moe.py mean_routed_copies)."""
    if not layer.is_moe:
        return 0.0
    return ACT_BYTES * moe.mean_routed_copies(layer, shape) * layer.ffn_hidden_size / \
        moe.expert_tp(shape)


def discarded_bytes(layer: Layer, shape) -> float:
    """Bytes a block keeps less under selective recompute of the shape's modules, beyond the
    scores (cost/memory.py drops those for core_attn)."""
    if layer.kind != "block":
        return 0.0
    out = 0.0
    if "layernorm" in shape.recompute_modules:
        out += norm_output_bytes(layer, shape)
    if "moe_act" in shape.recompute_modules:
        out += moe_act_output_bytes(layer, shape)
    if "mla_up_proj" in shape.recompute_modules and layer.is_mla:
        out += mla.up_projection_output_bytes(layer, shape.tokens, shape.tp)
    return out


def rebuild_s(layer: Layer, shape, flash: bool, attn_fwd_s: float,
              mem_rate: float, up_proj_s: float = 0.0) -> float:
    """Seconds the backward spends rebuilding what the shape's modules discarded: the attention
    forward for core_attn (unless flash, which stores no scores), the norms and the experts'
    activation as memory-bound passes at ``mem_rate`` bytes/s, and for mla_up_proj the
    up-projections' forward GEMMs (``up_proj_s``, priced by the caller at the layer's GEMM rate)
    and the two latent norms."""
    if layer.kind != "block":
        return 0.0
    mods = shape.recompute_modules
    out = attn_fwd_s if "core_attn" in mods and not flash else 0.0
    if "mla_up_proj" in mods and layer.is_mla:
        latents = layer.q_lora_rank + layer.kv_lora_rank
        out += up_proj_s + elementwise.RMSNORM_FUSED * shape.tokens * latents / mem_rate
    if "layernorm" in mods:
        rep = 1 / shape.tp if shape.sp else 1.0
        out += 2 * elementwise.RMSNORM_FUSED * shape.tokens * layer.hidden_size * rep / mem_rate
    if "moe_act" in mods and layer.is_moe:
        per = elementwise.SWIGLU_FUSED if layer.mlp == "swiglu" else GELU_BYTES
        out += per * moe.routed_copies(layer, shape) * layer.ffn_hidden_size / \
            moe.expert_tp(shape) / mem_rate
    return out
