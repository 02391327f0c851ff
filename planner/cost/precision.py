"""FP8 training: what running a transformer block's linear layers in 8-bit floating point changes.

Which GEMMs: the block's four linear layers (QKV, attention output projection, MLP up/gate and
down), all three GEMMs of each (forward, input gradient, weight gradient). DeepSeek-V3 (report
§3.3.1): "all three GEMMs associated with the Linear operator, namely Fprop (forward pass), Dgrad
(activation backward pass), and Wgrad (weight backward pass), are executed in FP8", and "we
maintain the original precision (e.g., BF16 or FP32) for the following components: the embedding
module, the output head, MoE gating modules, normalization operators, and attention operators".
Transformer Engine under Megatron-Core does the same (the output layer is Megatron's own
ColumnParallelLinear, not a TE module); torchtitan's 405B config filters ``lm_head`` out of its
Float8 converter. So attention (flash, 16-bit), norms, embedding and head are priced as before.

What changes, per microbatch on one GPU:
- GEMM rate: the GPU's dense FP8 peak times its own FP8 efficiency (Hardware.peak_fp8_tflops,
  fp8_matmul_efficiency; a GPU without them has no FP8 tensor cores and FP8 is refused);
- GEMM operand traffic: 1-byte inputs, 16-bit output;
- scaling overhead: every 16-bit tensor fed to an FP8 GEMM is first cast, a memory-bound pass
  whose bytes depend on the stack's recipe (:func:`cast_bytes_per_value`);
- memory: the FP8 weight copy and its transpose where the stack caches them across microbatches
  (Transformer Engine), and GEMM inputs saved for the backward in FP8 where it does that.
Casts are priced as fused kernels (Transformer Engine's cast-transpose; torchao under
torch.compile, which torchtitan calls "required for competitive performance" with Float8):
eager per-op casts would cost more than this says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.errors import PlanInputError
from planner.cost import constants, mla, moe
from planner.cost.memory import ACT_BYTES, Shape
from planner.hardware.profiles import Hardware
from planner.model.spec import Layer
from planner.stack import Stack

FP8_BYTES = 1
PRECISIONS = ("bf16", "fp8")
# DeepSeek-V3 §3.3.2: "for activations, we group and scale elements on a 1x128 tile basis (i.e.,
# per token per 128 channels); and (2) for weights, we group and scale elements on a 128x128
# block basis": one fp32 scale per 128 values.
BLOCK = 128
SCALE_BYTES = 4


@dataclass(frozen=True)
class Gemm:
    """One GEMM (m x k) @ (k x n) as it runs on one GPU: m tokens, k inputs, n outputs."""

    m: float
    k: float
    n: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


def block_gemms(layer: Layer, shape: Shape) -> tuple[Gemm, ...]:
    """The weight GEMMs of one block's forward on one GPU of its TP group (Megatron's column-
    then row-parallel pairs): QKV, output projection, MLP up (with the gate for SwiGLU), down.
    MLA's projections replace QKV and the output projection (cost/mla.py); an MoE block's MLP is
    one up/down pair per local expert and the shared experts' pair (cost/moe.py; its router
    stays 16-bit and is priced apart)."""
    t, T, h, f = shape.tp, shape.tokens, layer.hidden_size, layer.ffn_hidden_size
    q, kv = layer.q_size, layer.num_kv_heads * layer.head_dim
    up = (2 if layer.mlp == "swiglu" else 1) * f
    attention = mla.projection_shapes(layer, T, t) if layer.is_mla else (
        (T, h, (q + 2 * kv) / t), (T, q / t, h))
    mlp = moe.mlp_gemm_shapes(layer, shape) if layer.is_moe else ((T, h, up / t), (T, f / t, h))
    return tuple(Gemm(m, k, n) for m, k, n in (*attention, *mlp))


def gemm_bytes(gemms, operand_bytes: float = ACT_BYTES) -> float:
    """HBM traffic of one pass over ``gemms``: read both operands (``operand_bytes`` each value),
    write the 16-bit result. The input- and weight-gradient GEMMs move the same three tensors."""
    return sum(operand_bytes * (g.m * g.k + g.k * g.n) + ACT_BYTES * g.m * g.n for g in gemms)


def uses_fp8(layer: Layer, opts: Stack) -> bool:
    return opts.precision == "fp8" and layer.kind == "block"


def check_fp8(hw: Hardware, opts: Stack) -> None:
    """One line when the stack runs FP8 on a GPU without FP8 tensor cores (no FP8 peak)."""
    if opts.precision == "fp8" and not hw.peak_fp8_tflops:
        raise _no_fp8(hw)


def _no_fp8(hw: Hardware) -> PlanInputError:
    return PlanInputError(f"--precision fp8: {hw.name} has no FP8 tensor cores (its profile "
                          "gives no peak_fp8_tflops); use --precision bf16 or an FP8 GPU "
                          "(H100, H200)")


def fp8_gemm_rate(hw: Hardware) -> float:
    """Achieved FP8 GEMM FLOP/s: the dense FP8 peak times the profile's FP8 efficiency (or the
    16-bit default efficiency when the profile has an FP8 peak but no measured efficiency)."""
    if not hw.peak_fp8_tflops:
        raise _no_fp8(hw)
    eff = hw.fp8_matmul_efficiency or hw.matmul_efficiency or constants.MATMUL_EFFICIENCY
    return hw.peak_fp8_tflops * 1e12 * eff


def cast_bytes_per_value(recipe: str, both_layouts: bool = True) -> float:
    """HBM bytes one 16-bit value costs to cast for FP8 GEMMs under ``recipe``:
    - read the 16-bit value (2) and write it in FP8 (1); Hopper's FP8 GEMMs take one layout
      only, so a tensor the backward reads the other way round is also written transposed (1),
      in the same pass (Transformer Engine's fused cast-transpose kernel);
    - "current" scaling needs the tensor's amax before any value is cast: one more read (2).
      torchao/float8/README.md: "Delayed scaling is theoretically faster than dynamic scaling
      because of reduced read/write traffic requirements." "delayed" takes the scale from an
      amax history and records this tensor's amax in the cast pass itself;
    - "rowwise"/"blockwise" scales are local to a row or a 1x128 / 128x128 block, computed in
      the cast pass; each written layout carries one fp32 scale per 128 values (a row's scale
      is at most that). The transposed layout needs its own scales along the other axis,
      which the same pass writes (the tile does not change)."""
    layouts = 2 if both_layouts else 1
    out = ACT_BYTES + layouts * FP8_BYTES
    if recipe == "current":
        out += ACT_BYTES
    elif recipe in ("rowwise", "blockwise"):
        out += layouts * SCALE_BYTES / BLOCK
    return out


@dataclass(frozen=True)
class Fp8Layer:
    """What FP8 makes of one block's GEMM work, for one microbatch on one GPU."""

    gemm_rate: float  # achieved FLOP/s of its GEMMs
    gemm_bytes: float  # operand traffic of one pass (forward, input grad or weight grad)
    cast_fwd_bytes: float  # memory-bound cast traffic added to the forward
    cast_bwd_bytes: float  # ... and to the backward
    saved_bytes: float  # activation bytes the FP8-saved GEMM inputs save (subtract)
    cache_bytes: float  # FP8 weight copies kept from the first microbatch to the step


def fp8_layer(layer: Layer, shape: Shape, recompute: str, hw: Hardware,
              opts: Stack) -> Fp8Layer | None:
    """FP8's terms for ``layer`` on the stack ``opts``; None when the layer runs 16-bit GEMMs."""
    if not uses_fp8(layer, opts):
        return None
    gemms = block_gemms(layer, shape)
    fwd, bwd, cache = fp8_cast_bytes(gemms, opts, shape.fp8_gathered)
    return Fp8Layer(gemm_rate=fp8_gemm_rate(hw), gemm_bytes=gemm_bytes(gemms, FP8_BYTES),
                    cast_fwd_bytes=fwd, cast_bwd_bytes=bwd,
                    saved_bytes=saved_activation_bytes(layer, shape, recompute, opts),
                    cache_bytes=cache)


def fp8_cast_bytes(gemms, opts: Stack, gathered: bool = False) -> tuple[float, float, float]:
    """(forward cast bytes, backward cast bytes, FP8 weight-cache bytes) of one microbatch
    through ``gemms`` under the stack's recipe, weight caching and activation saving; with
    ``gathered`` the weights arrive in FP8 from ZeRO-3's FP8 all-gather (cost/zero.py), cast
    on the shard before it, so the forward does not cast them."""
    x = sum(g.m * g.k for g in gemms)  # GEMM inputs (activations)
    w = sum(g.k * g.n for g in gemms)  # weights
    dy = sum(g.m * g.n for g in gemms)  # output gradients
    both = cast_bytes_per_value(opts.fp8_recipe)
    one = cast_bytes_per_value(opts.fp8_recipe, both_layouts=False)
    # Inputs: cast once with the transposed copy the weight-gradient GEMM reads, and that copy
    # saved (Transformer Engine); or saved 16-bit and cast again in the backward (torchao).
    if opts.fp8_saved_activations:
        fwd, bwd = x * both, 0.0
    else:
        fwd, bwd = x * one, x * one
    # Output gradients: cast once, both layouts (input-gradient and weight-gradient GEMMs).
    bwd += dy * both
    # Weights: cast once per step when cached or held as FP8 primary weights (charged by
    # step_cast_bytes), else in every forward and again in the backward.
    # Gathered in FP8, the forward GEMM reads the gathered weight as it is; the backward's
    # input-gradient GEMM reads it in the other layout, still charged as a cast (an upper
    # bound on re-laying out an FP8 weight: 2 bytes a value).
    if not opts.fp8_weights_held:
        fwd += 0.0 if gathered else w * one
        bwd += w * one
    return fwd, bwd, 2 * FP8_BYTES * w if opts.fp8_weights_held else 0.0


def saved_activation_bytes(layer: Layer, shape: Shape, recompute: str, opts: Stack) -> float:
    """Bytes the block keeps less when its GEMM inputs are saved in FP8 (1 byte) instead of
    16-bit: the four GEMM inputs of Korthikanti's count (cost/memory.py _block_kept): QKV and MLP
    inputs (sbh each, replicated across TP unless SP shards them), the projection input (sb·q/t)
    and the down projection's input (sb·f/t). DeepSeek-V3 §3.3.1: "the FP8 Wgrad GEMM allows
    activations to be stored in FP8 for use in the backward pass". Full recompute keeps only
    the block's 16-bit input: nothing saved.

    Two exceptions the stack names, DeepSeek-V3 §3.3.3 ("Low-Precision Activation"):
    - the projection input is kept in ``fp8_attn_out_bytes`` per value: "(1) Inputs of the
      Linear after the attention operator. These activations are also used in the backward
      pass of the attention operator, which makes it sensitive to precision. We adopt a
      customized E5M6 data format exclusively for these activations." E5M6 is 12 bits: 1.5
      bytes (a format with fewer mantissa bits than BF16 saves nothing unless packed);
    - with ``fp8_moe_act_input`` the routed experts' activation inputs (the FC1 outputs: gate and
      up for SwiGLU, 2f/etp per copy) are kept in FP8 too: "(2) Inputs of the SwiGLU operator in
      MoE. To further reduce the memory cost, we cache the inputs of the SwiGLU operator and
      recompute its output in the backward pass. These activations are also stored in FP8 with
      our fine-grained quantization method". The shared experts' are left 16-bit
      (conservative: "in MoE" does not say whether they are included)."""
    if not (uses_fp8(layer, opts) and opts.fp8_saved_activations) or recompute == "full":
        return 0.0
    sb, t, h = shape.seq_len * shape.micro_batch, shape.tp, layer.hidden_size
    rep = 1 / t if shape.sp else 1.0
    mlp = sb * h * rep + sb * layer.ffn_hidden_size / t
    if layer.is_moe:  # each routed copy's up and down inputs (cost/moe.py), and shared experts'
        sf = layer.shared_ffn_hidden_size
        mlp = moe.mean_routed_copies(layer, shape) * (h + layer.ffn_hidden_size /
                                                       moe.expert_tp(shape))
        mlp += (sb * h * rep + sb * sf / t) if sf else 0.0
    # MLA: the latent up-projections' inputs are not counted (left 16-bit: conservative)
    values = sb * h * rep + mlp
    if recompute == "selective":  # what Megatron's modules discard is not kept at all
        mods = shape.recompute_modules
        if "layernorm" in mods:  # the QKV and MLP inputs are the norm outputs
            values -= sb * h * rep + (sb * h * rep if not layer.is_moe or
                                      layer.shared_ffn_hidden_size else 0.0)
        if "moe_act" in mods and layer.is_moe:
            values -= moe.mean_routed_copies(layer, shape) * layer.ffn_hidden_size / \
                moe.expert_tp(shape)
    if layer.is_moe and opts.fp8_moe_act_input:
        values += moe.mean_routed_copies(layer, shape) * (
            2 if layer.mlp == "swiglu" else 1) * layer.ffn_hidden_size / moe.expert_tp(shape)
    attn_out = sb * layer.v_size / t  # the attention-output projection's input
    return (ACT_BYTES - FP8_BYTES) * values + (ACT_BYTES - opts.fp8_attn_out_bytes) * attn_out


def step_cast_bytes(cache_bytes: float, opts: Stack) -> float:
    """HBM traffic of refreshing cached FP8 weights once per step (after the optimizer, on the
    first microbatch): each cached weight is read in 16-bit and written in both layouts. FP8
    primary weights are written by the optimizer from its fp32 shard instead, and their
    transpose made after the gather: charged the same (an upper bound: the shard is 1/DP)."""
    if opts.precision != "fp8" or not opts.fp8_weights_held:
        return 0.0
    return cache_bytes / (2 * FP8_BYTES) * cast_bytes_per_value(opts.fp8_recipe)


def fp8_primary_weights(zero: int, opts: Stack) -> bool:
    """Whether the block weights are FP8 primary weights at this ZeRO stage: the stack's
    ``fp8_params`` under FP8, read at ZeRO 0-2 (ZeRO-3 gathers per layer: fp8_all_gather).

    Megatron-LM: '--fp8-param-gather' ... 'Keep the compute param in fp8 (do not use any other
    intermediate dtype) and perform the param all-gather in fp8.' (megatron/training/
    arguments.py). NeMo 1.x: 'fp8_params: true # performance param all-gather in fp8'
    (NeMo-Framework-Launcher launcher_scripts/conf/training/gpt3/175b_mlperf.yaml, commit
    0937882d), whose optimizer then keeps the fp32 master itself: 'if
    self.cfg.get('fp8_params', False): optim_kwargs['store_params'] = True' (NVIDIA/NeMo
    nemo/collections/nlp/models/language_modeling/megatron_base_model.py, commit 000316c8)."""
    return opts.precision == "fp8" and opts.fp8_params and zero < 3


def held_fp8_bytes(cache_bytes, zero: int, opts: Stack):
    """Bytes the FP8 weights add to the model states' 16-bit weights (scalar or array): the
    cached FP8 weight and its transpose (``cache_bytes``, 2 bytes per block weight); with FP8
    primary weights those are the weights themselves, and the 16-bit copy the model states
    count for them (``held_weight_bytes`` each) is not held."""
    if not fp8_primary_weights(zero, opts):
        return cache_bytes
    return cache_bytes * (1.0 - opts.held_weight_bytes(zero) / (2 * FP8_BYTES))


def gathered_bytes_per_param(params, cache_bytes, zero: int, opts: Stack):
    """Mean bytes per parameter the distributed optimizer's weight all-gather moves (scalar or
    array): 16-bit, less one byte for each block weight gathered in FP8 (FP8 primary weights:
    ``cache_bytes`` / 2 of them). The other parameters (embedding, head, norms) stay 16-bit."""
    params = np.asarray(params, dtype=float)
    if not fp8_primary_weights(zero, opts):
        return np.full_like(params, float(ACT_BYTES))
    fp8 = cache_bytes / (2 * FP8_BYTES)
    return np.where(params > 0, (ACT_BYTES * params - (ACT_BYTES - FP8_BYTES) * fp8)
                    / np.maximum(params, 1.0), float(ACT_BYTES))
