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

"torchtitan_op" is not a Megatron module but torchtitan's op-level selective AC policy
(``[activation_checkpoint] mode = 'selective'``, ``selective_ac_option = 'op'``), priced alone.
torchtitan wraps each TransformerBlock in a selective-checkpoint context whose policy is
(torchtitan/parallelisms/parallelize_llama.py, _apply_ac_to_transformer_block, commit 004b314):

    _save_list = {torch.ops.aten.mm.default,
                  torch.ops.aten._scaled_dot_product_efficient_attention.default,
                  torch.ops.aten._scaled_dot_product_flash_attention.default,
                  torch.ops._c10d_functional.reduce_scatter_tensor.default}
    ...
    # Saves output of all compute ops, except every second mm
    to_save = func in _save_list and not (
        func == torch.ops.aten.mm.default and meta[mm_count_key] % 2 == 0)

with ``meta`` a fresh counter per block forward (``selective_checkpointing_context_fn``:
``meta = defaultdict(int)``). torchtitan's Llama block runs its mms in the order wq, wk, wv, wo
(Attention.forward) and w1, w3, w2 (FeedForward.forward: ``self.w2(F.silu(self.w1(x)) *
self.w3(x))``), so the 1st, 3rd, 5th and 7th are saved (wq, wv, w1, w2) and wk, wo and w3 run
again in the backward. A block therefore keeps its input (the checkpoint's argument), the saved
mms' outputs, the SDPA output (flash or efficient kernel) and, under sequence parallel, the two
reduce-scatter outputs; the backward re-runs every other op: the unsaved mms, all element-wise
ops (norms, RoPE, SiLU, products, residual adds: the block's whole memory-bound forward), and
the SP all-gathers (not in the save list; the reduce-scatters are). Without flash the
attention runs as unsaved bmm/softmax ops: recomputed, its scores never kept. The SDPA kernel's
fp32 log-sum-exp (4 bytes per head and token) is not counted, as the planner counts it nowhere.
Priced for dense blocks (torchtitan's Llama); MoE and MLA blocks, and FP8 linears (whose
``_scaled_mm`` is not ``aten.mm``) are refused: ``selective_refusal`` says why, the search
counts such configurations rejected under it and refuses a pinned --recompute selective.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.cost import elementwise, mla, moe
from planner.core.errors import PlanInputError

if TYPE_CHECKING:  # pragma: no cover
    from planner.model.spec import Layer, ModelSpec
    from planner.stack import Stack

ACT_BYTES = 2  # 16-bit activations
GELU_BYTES = 4.0  # a fused GeLU reads 2 and writes 2 bytes per element of f
OP_POLICY = "torchtitan_op"  # torchtitan's op-level selective AC (module docstring)


def drops_scores(shape) -> bool:
    """Whether this selective recompute drops the s x s scores (Korthikanti's selective)."""
    return "core_attn" in shape.recompute_modules


def selective_discards_nothing(model: ModelSpec, opts: Stack) -> bool:
    """Whether the stack's selective recompute changes nothing on this model, so a search need
    not try it: each of its modules is a no-op here (core_attn under flash attention, which
    stores no scores; moe_act without MoE blocks; mla_up_proj without MLA). layernorm and
    torchtitan_op always discard something. Cheap where the modules decide it alone (a search
    asks once per shape): only moe_act and mla_up_proj look at the model's layers."""
    for m in opts.recompute_modules:
        if m in ("layernorm", OP_POLICY) or (m == "core_attn" and not opts.flash_attention):
            return False
        if (m == "moe_act" and model.is_moe) or (m == "mla_up_proj" and _has_mla(model)):
            return False
    return True


def _has_mla(model: ModelSpec) -> bool:
    return any(layer.is_mla for layer in model.layers)


def selective_refusal(model: ModelSpec, opts: Stack) -> str | None:
    """Why the stack's selective recompute is not priced on this model (None where it is):
    torchtitan's op policy is priced for dense attention blocks with 16-bit linears only
    (module docstring; ``torchtitan_mms`` and cost/layer.py raise where it would be reached).
    Short: a search counts its rejections under it."""
    if OP_POLICY not in opts.recompute_modules:
        return None
    if model.is_moe or _has_mla(model):
        return "torchtitan_op selective AC not priced for MoE/MLA blocks"
    if opts.precision == "fp8":  # cost/precision.py uses_fp8: every block's linears
        return "torchtitan_op selective AC not priced for FP8 linears"
    return None


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


# --- torchtitan's op-level selective AC ('op' policy, module docstring) --------------------------


def op_policy(shape) -> bool:
    """Whether "selective" means torchtitan's op-level policy on this stack."""
    return OP_POLICY in shape.recompute_modules


def torchtitan_mms(layer: Layer, shape) -> tuple[tuple[float, float, float], ...]:
    """(m, k, n) of each ``aten.mm`` of one torchtitan Llama block on one GPU of its TP group, in
    the order the forward runs them: wq, wk, wv, wo, then w1, w3, w2 (SwiGLU) or w1, w2."""
    if layer.is_moe or layer.is_mla:
        raise PlanInputError("recompute_modules torchtitan_op is priced for dense attention "
                             "blocks only (torchtitan's Llama); use recompute full or none for "
                             "an MoE or MLA model")
    t, T, h, f = shape.tp, shape.tokens, layer.hidden_size, layer.ffn_hidden_size
    q, kv = layer.q_size, layer.num_kv_heads * layer.head_dim
    attention = ((T, h, q / t), (T, h, kv / t), (T, h, kv / t), (T, q / t, h))
    mlp = ((T, h, f / t), (T, h, f / t), (T, f / t, h)) if layer.mlp == "swiglu" else \
        ((T, h, f / t), (T, f / t, h))
    return attention + mlp


def op_recomputed_mms(layer: Layer, shape) -> tuple[tuple[float, float, float], ...]:
    """The mms the policy does not save (every second one: the 2nd, 4th, ...): run again."""
    return torchtitan_mms(layer, shape)[1::2]


def op_kept_bytes(layer: Layer, shape, flash: bool) -> float:
    """Bytes a block keeps under the op policy: its 16-bit input (SP-sharded under sequence
    parallel), the outputs of the saved mms (a row-parallel mm's output is the whole hidden,
    partial sums, before its reduce-scatter), the SDPA output with flash, and with sequence
    parallel the two reduce-scatter outputs (the attention's and the MLP's, SP shards)."""
    t, T, h = shape.tp, shape.tokens, layer.hidden_size
    rep = 1 / t if shape.sp else 1.0
    saved = torchtitan_mms(layer, shape)[0::2]
    out = ACT_BYTES * T * h * rep + ACT_BYTES * sum(m * n for m, _, n in saved)
    if flash:
        out += ACT_BYTES * T * layer.q_size / t
    if shape.sp and t > 1:
        out += 2 * ACT_BYTES * T * h / t
    return out


def op_rebuild_s(mm_s: float, mem_fwd_s: float, attn_fwd_s: float, tp_s: float,
                 flash: bool) -> float:
    """Seconds the backward spends re-running what the op policy did not save: the unsaved mms
    (``mm_s``, priced by the caller), the block's memory-bound forward (``mem_fwd_s``), the
    attention without flash, and the TP collectives it re-runs (``tp_s``, priced by the caller:
    the all-gathers under sequence parallel, whose reduce-scatters are saved; the all-reduces
    without it, which the save list does not name).

    ``mem_fwd_s`` is the stack's own forward (cost/layer.py): eager, every op is re-run as its
    own kernel (torch/utils/checkpoint.py _CachedTorchDispatchMode executes ``func(*args,
    **kwargs)`` for any op whose policy is not MUST_SAVE or PREFER_SAVE); compiled, the policy
    only tags the traced nodes ('fx_traceback.current_meta["recompute"] = policy') and the
    backward graph recomputes them, fused, but still writes what the backward's matmuls and
    flash kernel read (the norm outputs, rotated Q and K, the SwiGLU product): a fused forward
    pass, the RoPE eager where the stack's RoPE is complex (cost/elementwise.py)."""
    return mm_s + mem_fwd_s + (0.0 if flash else attn_fwd_s) + tp_s
