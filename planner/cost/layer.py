"""Per-layer cost: FLOPs, time, bytes and parameters of one layer for one microbatch on one GPU.

FLOPs (DESIGN.md §3; Narayanan et al. 2021 §5.1, Korthikanti et al. 2022 §6), tokens T = b·s,
head dim d, kv heads g: QKV 2T·h(h + 2gd), scores and values 4T·s·h, output projection 2T·h²,
MLP 4T·h·f (GeLU) or 6T·h·f (SwiGLU), logits 2T·h·V. Backward is twice the forward: one matmul for
the input gradient and one for the weight gradient. Model FLOPs count the full s×s attention, as the
published formulas do; a causal flash kernel executes half of it, which the time accounts for.

Time is a roofline per operation class: matmuls at the achieved matmul rate, memory-bound work
(norms, activations, residuals, softmax, loss) at the achieved HBM bandwidth, and TP collectives on
the TP group's ring as NCCL prices them (cost/tensor_parallel.py). A measured profile
(``plan profile``) replaces the compute rates with measured ones, scaled by FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.cost import attention_kernel, constants
from planner.cost import comm, context, loss, mla, moe, mtp
from planner.cost import elementwise
from planner.cost import fp8_backward
from planner.cost import gemm
from planner.cost import host
from planner.cost import precision
from planner.cost import recompute as recompute_modules
from planner.cost import tensor_parallel
from planner.cost import tp_overlap
from planner.hardware.profiles import Hardware
from planner.cost.memory import (ACT_BYTES, Shape, activation_bytes, sharded_params,
                            working_bytes)
from planner.core.arguments import finite
from planner.core.errors import PlanInputError
from planner.model.spec import Layer
from planner.stack import Stack, default_stack

# A flash backward recomputes QK^T and does four matmuls where the forward does two: 2.5x forward.
FLASH_BACKWARD_RATIO = 2.5


@dataclass(frozen=True)
class LayerCost:
    """One layer, one microbatch, one GPU. Times in seconds, FLOPs per GPU."""

    fwd_s: float
    bwd_input_s: float
    bwd_weight_s: float
    recompute_s: float  # extra forward work the recompute mode adds to the backward
    model_flops: float  # forward + backward, no recompute (MFU numerator)
    hardware_flops: float  # plus the recomputed forward (HFU numerator)
    params: float  # parameters stored on this GPU
    act_bytes: float  # kept per in-flight microbatch
    work_bytes: float  # transient while this layer runs its backward
    cache_bytes: float = 0.0  # FP8 weight copies kept across the step's microbatches
    expert_params: float = 0.0  # of params: routed-expert weights (sharded by ep x etp)
    a2a_s: float = 0.0  # of the times: MoE dispatch/combine all-to-all, forward + backward

    @property
    def bwd_s(self) -> float:
        return self.bwd_input_s + self.bwd_weight_s

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s


@dataclass(frozen=True)
class _Work:
    """Forward work of a layer on one GPU, by the unit that bounds it."""

    gemm_flops: float = 0.0  # weight matmuls (backward: 1x input grad + 1x weight grad)
    gemm_bytes: float = 0.0  # their operand and result traffic (read A, B; write C)
    attn_flops: float = 0.0  # scores and values, as executed
    attn_model_flops: float = 0.0  # scores and values, full s×s (model FLOPs convention)
    mem_bytes: float = 0.0  # HBM traffic of memory-bound ops
    attn_mem_bytes: float = 0.0  # HBM traffic of an unfused softmax over the scores
    collectives: int = 0  # TP all-reduces (or all-gather + reduce-scatter pairs) in the forward
    collectives_bwd: int = 0
    gemm_shapes: tuple[tuple[float, float, float], ...] = ()  # (m, k, n) of each weight matmul


def block_forward_flops(layer: Layer, tokens: int, seq_len: int) -> tuple[float, float]:
    """(weight-matmul FLOPs, attention FLOPs with full s×s) of one block's forward, whole model;
    an MoE block's MLP counts its active experts (cost/moe.py), MLA its own shapes (cost/mla.py)."""
    h, f = layer.hidden_size, layer.ffn_hidden_size
    q, kv = layer.q_size, layer.num_kv_heads * layer.head_dim  # q = h unless head_dim is set
    mlp = (6 if layer.mlp == "swiglu" else 4) * tokens * h * f
    if layer.is_moe:
        mlp = moe.mlp_flops(layer, tokens)
    if layer.is_mla:
        return (float(mla.projection_flops(layer, tokens) + mlp),
                float(mla.attention_flops(layer, tokens, seq_len)))
    gemm = 2 * tokens * h * (q + 2 * kv) + 2 * tokens * q * h + mlp
    attn = 4 * tokens * seq_len * q
    return float(gemm), float(attn)


def _gemm_bytes(*mkn: tuple[float, float, float]) -> float:
    """HBM traffic of 16-bit matmuls (m x k) @ (k x n): read both operands, write the result."""
    return precision.gemm_bytes(precision.Gemm(m, k, n) for m, k, n in mkn)


@lru_cache(maxsize=4096)
def _work(layer: Layer, shape: Shape, flash: bool, fused: bool = True,
          floor: float = 0.0, complex_rope: bool = False) -> _Work:
    """Forward work of ``layer``; ``floor``: the least bytes an eager kernel counts (its launch
    at the HBM rate, cost/elementwise.py); ``complex_rope``: a fused stack's RoPE stays eager
    (Stack.complex_rope). A pure function of frozen arguments, cached: every recompute mode of
    a shape asks for the same work."""
    t, s, T, h = shape.tp, shape.seq_len, shape.tokens, layer.hidden_size
    rep = 1 / t if shape.sp else 1.0
    if layer.kind == "embedding":
        # gather rows, add positions, dropout: read + write T·h, once each; a norm once more.
        passes = 4 if layer.embedding_norm else 3
        return _Work(mem_bytes=passes * ACT_BYTES * T * h * rep, collectives=1, collectives_bwd=0)
    if layer.kind == "linear":
        return _Work(gemm_flops=2.0 * T * h * layer.out_features / t,
                     gemm_bytes=_gemm_bytes((T, h, layer.out_features / t)),
                     gemm_shapes=((T, h, layer.out_features / t),),
                     mem_bytes=ACT_BYTES * T * (h + layer.out_features) / t)
    if layer.kind == "head":
        v = layer.padded_vocab(t)
        eager = 0.0 if fused else elementwise.eager_head_extra_bytes(layer, T, t, shape.sp, floor)
        # final norm (read + write) and the fp32 softmax cross-entropy: read 16-bit logits, write
        # fp32 probabilities, read them back for the loss and its gradient: ~12 bytes per logit.
        return _Work(gemm_flops=2.0 * T * h * v / t, gemm_bytes=_gemm_bytes((T, h, v / t)),
                     gemm_shapes=((T, h, v / t),),
                     mem_bytes=2 * ACT_BYTES * T * h * rep + 12.0 * T * v / t + eager,
                     collectives=1 if shape.sp else 0, collectives_bwd=1)
    gemm, attn_full = block_forward_flops(layer, T, shape.context)  # cp: all keys, own queries
    # The block's weight GEMMs: MLA's projections and an MoE block's per-expert and shared-expert
    # GEMMs included (precision.block_gemms); an MoE block's routed GEMMs carry the busiest GPU's
    # load (cost/moe.py routed_copies), its model FLOPs (gemm above) the balanced share.
    gemms = precision.block_gemms(layer, shape)
    gemm_bytes = precision.gemm_bytes(gemms)
    shapes = tuple((g.m, g.k, g.n) for g in gemms)
    # Memory-bound ops: two norms (read + write), two residual adds with dropout (read 2, write 1,
    # mask), on the replicated hidden (22·sbh bytes; 20 without dropout: no mask); the activation
    # function on the sharded FFN hidden (GeLU reads and writes f, SwiGLU reads 2f and writes f).
    act_fn = (3 if layer.mlp == "swiglu" else 2) * ACT_BYTES * T * layer.ffn_hidden_size / t
    if layer.is_moe:
        # The router's h x E matmul (16-bit: DeepSeek-V3 keeps "MoE gating modules" out of FP8),
        # the activation function over this GPU's routed copies and the shared experts, and the
        # token permutation (cost/moe.py).
        f, sf = layer.ffn_hidden_size, layer.shared_ffn_hidden_size
        shapes += ((T, h, layer.num_experts),)
        gemm_bytes += _gemm_bytes((T, h, layer.num_experts))
        act_fn = (3 if layer.mlp == "swiglu" else 2) * ACT_BYTES * (
            moe.routed_copies(layer, shape) * f / moe.expert_tp(shape) + T * sf / t) + \
            moe.permute_bytes(layer, shape)
    mem = (22.0 if layer.dropout else 20.0) * T * h * rep + act_fn \
        + elementwise.fused_rope_bytes(layer, T, t)
    pairs = moe.block_tp_pairs(layer)  # attention's and a dense MLP's TP collectives
    if not fused:  # eager kernels: fp32 RMSNorm, RoPE, SwiGLU in two (cost/elementwise.py)
        mem += elementwise.eager_extra_bytes(layer, T, t, shape.sp, floor)
    elif complex_rope:  # torch.compile leaves complex RoPE eager (cost/elementwise.py)
        mem += elementwise.eager_rope_extra_bytes(layer, T, t, floor)
    if flash:
        return _Work(gemm_flops=gemm / t, gemm_bytes=gemm_bytes, attn_flops=attn_full / 2 / t,
                     attn_model_flops=attn_full / t, mem_bytes=mem, collectives=pairs,
                     collectives_bwd=pairs, gemm_shapes=shapes)
    # Unfused attention: the scores are written by one bmm, scaled/masked/softmaxed (read, write),
    # dropout (read, write, mask) and read by the next bmm: ~13 bytes per score; 8 without dropout.
    scores = layer.num_attention_heads * s * shape.context * shape.micro_batch / t
    per_score = 13.0 if layer.dropout else 8.0
    return _Work(gemm_flops=gemm / t, gemm_bytes=gemm_bytes, attn_flops=attn_full / t,
                 attn_model_flops=attn_full / t,
                 mem_bytes=mem, attn_mem_bytes=per_score * scores, collectives=pairs,
                 collectives_bwd=pairs, gemm_shapes=shapes)


def layer_cost(layer: Layer, shape: Shape, recompute: str, hw: Hardware,
               opts: Stack | None = None, measured=None) -> LayerCost:
    """Cost of ``layer`` for one microbatch on one GPU of a TP group, on the stack ``opts``
    (default: the default stack).

    ``measured`` (a profile's LayerTiming for this layer) replaces the analytical compute times:
    its achieved FLOP rate per phase is applied to this shape's FLOPs.
    """
    opts = opts or default_stack()
    flash = opts.flash_attention
    peak = hw.peak_flops
    gemm_rate = peak * (hw.matmul_efficiency or constants.MATMUL_EFFICIENCY)
    mem_rate = hw.memory_bandwidth_gbps * 1e9 * (hw.memory_efficiency
                                                  or constants.MEMORY_EFFICIENCY)
    if layer.kind == "head" and layer.mtp_depth:  # the head and its MTP modules (cost/mtp.py)
        if measured is not None:
            raise PlanInputError("--profile measures a plain output head; the multi-token "
                                 "prediction modules it carries are priced analytically only: "
                                 "drop --profile for this model")
        return mtp.head_cost(layer, shape,
                             lambda part: layer_cost(part, shape, recompute, hw, opts),
                             sharded_params(layer, shape.tp, shape.ep, shape.etp), mem_rate)
    w = _work(layer, shape, flash, opts.fused_elementwise,
              floor=constants.EAGER_KERNEL_MIN_S * mem_rate, complex_rope=opts.complex_rope)
    attn_rate = peak * (hw.attention_efficiency or constants.ATTENTION_EFFICIENCY) if flash \
        else gemm_rate
    bwd_attn_ratio = FLASH_BACKWARD_RATIO if flash else 2.0
    # the stack's flash kernel against FlashAttention-2, whose rate attn_rate is
    # (cost/attention_kernel.py); unfused attention runs GEMMs at the matmul rate
    kernel = attention_kernel.kernel_time(opts.attention_kernel) if flash \
        else attention_kernel.FLASH2
    fp8 = precision.fp8_layer(layer, shape, recompute, hw, opts)  # None: 16-bit GEMMs
    if fp8 is not None and measured is not None:
        raise PlanInputError("--profile measured 16-bit layers; FP8 is priced analytically "
                             "only: drop --profile or use --precision bf16")

    # Matmul time: compute at the achieved rate plus operand traffic, additive (a roofline that
    # does not assume perfect overlap); this is what makes small TP-sharded matmuls slower.
    # Each weight matmul at the rate its shape allows (cost/gemm.py: tile quantization), forward
    # and both backward matmuls with their own output shapes.
    rate, traffic = (fp8.gemm_rate, fp8.gemm_bytes) if fp8 is not None else (gemm_rate,
                                                                             w.gemm_bytes)
    gemm_fwd, gemm_bin, gemm_bw = gemm.weight_matmul_seconds(w.gemm_shapes, rate)
    traffic_s = traffic / mem_rate
    gemm_s = gemm_fwd + traffic_s
    attn_fwd_s = kernel.forward * w.attn_flops / attn_rate + w.attn_mem_bytes / mem_rate
    attn_bwd_s = kernel.backward * bwd_attn_ratio * w.attn_flops / attn_rate
    mem_fwd_s = w.mem_bytes / mem_rate
    cast_fwd_s = fp8.cast_fwd_bytes / mem_rate if fp8 else 0.0
    cast_bwd_s = fp8.cast_bwd_bytes / mem_rate if fp8 else 0.0
    fwd_s = gemm_s + attn_fwd_s + mem_fwd_s + cast_fwd_s
    bwd_weight_s = gemm_bw + traffic_s
    bwd_input_s = gemm_bin + traffic_s + (attn_bwd_s + 2 * w.attn_mem_bytes / mem_rate) \
        + 2 * mem_fwd_s + cast_bwd_s

    # Every microbatch's weight gradients are accumulated into the step's gradient buffer: read
    # and write the stack's accumulation bytes per parameter (Megatron's fp32 main_grad, filled
    # by the wgrad GEMM with beta=1 under --gradient-accumulation-fusion or by a separate add;
    # DeepSpeed's BF16_Optimizer fp32 accumulation buffer; 16-bit gradients otherwise). Memory-bound, and it scales with parameters, not
    # tokens: what makes small micro-batches of wide layers slower than their FLOPs.
    params = sharded_params(layer, shape.tp, shape.ep, shape.etp)
    accumulation = shape.accumulation_bytes
    if accumulation is None:
        accumulation = opts.accumulation_bytes(1)
    bwd_weight_s += 2 * accumulation * params / mem_rate

    fwd_flops = w.gemm_flops + w.attn_model_flops
    model_flops = 3 * fwd_flops
    if layer.kind == "embedding":
        model_flops = 0.0  # a lookup: no FLOPs in any published convention

    if measured is not None:
        fwd_s, bwd_input_s, bwd_weight_s = _scaled_by_profile(measured, w, fwd_flops)

    if recompute == "full" and layer.kind == "block":
        recompute_s, recompute_flops = fwd_s, fwd_flops  # before TP comm is added below
    elif recompute == "selective" and layer.kind == "block" and \
            recompute_modules.op_policy(shape):
        # torchtitan's op-level selective AC (cost/recompute.py): the unsaved mms (16-bit: FP8
        # refused) and every memory-bound op run again; TP collectives added below
        if fp8 is not None:
            raise PlanInputError("recompute_modules torchtitan_op with FP8 linears is not "
                                 "priced (their _scaled_mm is not the policy's aten.mm); use "
                                 "recompute full or --precision bf16")
        mms = recompute_modules.op_recomputed_mms(layer, shape)
        recompute_flops = sum(2.0 * m * k * n for m, k, n in mms)
        recompute_s = recompute_modules.op_rebuild_s(
            gemm.weight_matmul_seconds(mms, rate)[0] + _gemm_bytes(*mms) / mem_rate,
            mem_fwd_s, attn_fwd_s, 0.0, flash)
        if not flash:
            recompute_flops += w.attn_model_flops
    elif recompute == "selective" and layer.kind == "block":
        # the stack's --recompute-modules (cost/recompute.py); FLOPs for core_attn's attention
        # and mla_up_proj's up-projection GEMMs (at this layer's GEMM rate and operand bytes)
        up_s, up_flops = 0.0, 0.0
        if "mla_up_proj" in shape.recompute_modules and layer.is_mla:
            up = mla.up_projection_shapes(layer, shape.tokens, shape.tp)
            up_flops = sum(2.0 * m * k * n for m, k, n in up)
            up_s = gemm.weight_matmul_seconds(up, rate)[0] + precision.gemm_bytes(
                (precision.Gemm(*g) for g in up),
                precision.FP8_BYTES if fp8 is not None else ACT_BYTES) / mem_rate
        recompute_s = recompute_modules.rebuild_s(layer, shape, flash, attn_fwd_s, mem_rate,
                                                  up_s)
        recompute_flops = up_flops + (w.attn_model_flops if (
            recompute_modules.drops_scores(shape) and not flash) else 0.0)
    else:
        recompute_s, recompute_flops = 0.0, 0.0

    if shape.cp > 1 and layer.kind == "block":
        cp_fwd, cp_bwd = _context_comm_s(layer, shape, hw, opts, attn_fwd_s, attn_bwd_s)
        fwd_s += cp_fwd
        bwd_input_s += cp_bwd
        if recompute == "full":
            recompute_s += cp_fwd

    tp_f, tp_b, tp_r = _tp_comm_s(layer, shape, recompute, hw, opts, w, rate, mem_rate)
    fwd_s, bwd_input_s, recompute_s = fwd_s + tp_f, bwd_input_s + tp_b, recompute_s + tp_r

    # MoE token dispatch and combine (cost/moe.py): forward both, backward their transposes,
    # full recompute the forward pair again.
    a2a = 2 * moe.dispatch_s(layer, shape, hw)
    fwd_s += a2a
    bwd_input_s += a2a
    if recompute == "full" and layer.kind == "block":
        recompute_s += a2a

    if layer.kind == "block" and opts.host_s_per_block:  # synchronous launches (cost/host.py)
        host_f, host_b, host_r = host.block_host_s(opts.host_s_per_block, recompute == "full")
        fwd_s, bwd_input_s, recompute_s = fwd_s + host_f, bwd_input_s + host_b, \
            recompute_s + host_r

    return LayerCost(
        fwd_s=fwd_s, bwd_input_s=bwd_input_s, bwd_weight_s=bwd_weight_s, recompute_s=recompute_s,
        model_flops=model_flops,
        hardware_flops=model_flops + recompute_flops,
        params=params,
        act_bytes=activation_bytes(layer, shape, recompute, flash) - (
            fp8.saved_bytes if fp8 else 0.0),
        work_bytes=working_bytes(layer, shape, recompute, flash) + loss.loss_work_bytes(
            layer, shape, opts) + fp8_backward.backward_copy_bytes(layer, shape, opts) + (
            context.transient_bytes(shape.cp, opts.cp_comm, shape.micro_batch, shape.seq_len,
                                    layer.q_size / shape.tp,
                                    layer.num_kv_heads * layer.head_dim / shape.tp)
            if layer.kind == "block" else 0.0),
        cache_bytes=fp8.cache_bytes if fp8 else 0.0,
        expert_params=moe.local_expert_params(layer, shape),
        a2a_s=2 * a2a + (a2a if recompute == "full" and layer.kind == "block" else 0.0),
    )


def _context_comm_s(layer: Layer, shape: Shape, hw: Hardware, opts: Stack, attn_fwd_s: float,
                    attn_bwd_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of a block's context-parallel K/V exchange (cost/context.py)
    on NVLink, or on the network when the CP group leaves the NVLink domain."""
    intra, inter = comm.links(hw)
    return context.attention_comm_s(
        shape.cp, opts.cp_comm, shape.micro_batch, shape.seq_len, layer.q_size / shape.tp,
        layer.num_kv_heads * layer.head_dim / shape.tp, inter if shape.cp_cross else intra,
        attn_fwd_s, attn_bwd_s, comm.overlap_interference(hw))


def _scaled_by_profile(measured, w: _Work, fwd_flops: float) -> tuple[float, float, float]:
    """Measured seconds scaled to this shape by FLOPs: the achieved rate is kept per phase."""
    def scale(seconds: float, flops_then: float, flops_now: float) -> float:
        scaled = seconds * flops_now / flops_then if flops_then > 0 else seconds
        # the profile's caps (core/limits.py) keep this finite; the guard names it if not
        return finite("a profiled pass scaled to the planned shape", scaled,
                      "re-create the profile with `plan profile` at a shape nearer this plan's")

    bwd_w_now = w.gemm_flops
    bwd_in_now = max(2 * fwd_flops - bwd_w_now, 0.0)
    return (scale(measured.fwd_s, measured.fwd_flops, fwd_flops),
            scale(measured.bwd_input_s, measured.bwd_input_flops, bwd_in_now),
            scale(measured.bwd_weight_s, measured.bwd_weight_flops, bwd_w_now))


def model_flops_per_iteration(model, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one training step (forward + backward, no recompute), whole model."""
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=seq_len)
    per_sample = 0.0
    for layer in model.layers:
        w = _work(layer, shape, flash=False)
        if layer.kind != "embedding":
            per_sample += 3 * (w.gemm_flops + w.attn_model_flops)
    return per_sample * global_batch


def _tp_comm_s(layer: Layer, shape: Shape, recompute: str, hw: Hardware, opts: Stack,
               w, rate: float, mem_rate: float) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds a layer's TP collectives add: NCCL's ring on the
    TP group (cost/tensor_parallel.py), less what the stack's overlap hides. Transformer
    Engine's userbuffers (Stack.tp_overlap_ub) overlap a block's sequence-parallel collectives
    GEMM by GEMM (cost/tp_overlap.py); Megatron refuses --tp-comm-overlap without sequence
    parallelism, and its embedding and output layer are not userbuffer modules, so their
    collectives stay exposed. Otherwise the stack hides a share (tp_overlap_hidden), which
    still holds SMs the GEMMs it hides behind cannot use (comm.overlap_interference, as the
    overlapped DP collectives pay in predict/data_parallel.py)."""
    if shape.tp == 1:
        return 0.0, 0.0, 0.0
    nbytes = ACT_BYTES * shape.tokens * layer.hidden_size
    block = layer.kind == "block"
    op_policy = recompute == "selective" and block and recompute_modules.op_policy(shape)
    ub = opts.tp_overlap_ub if opts.tp_comm_overlap else None
    if ub is not None and shape.sp and block:
        fwd_ag, fwd_rs, bwd = tp_overlap.block_s(
            tp_overlap.block_pairs(layer, shape), ub,
            tensor_parallel.all_gather_s(nbytes, shape.tp, hw),
            tensor_parallel.reduce_scatter_s(nbytes, shape.tp, hw), shape.tp, rate,
            hw.sm_count, (shape.tp + 1) * nbytes / shape.tp / mem_rate)
        again = fwd_ag + fwd_rs if recompute == "full" else fwd_ag if op_policy else 0.0
        return fwd_ag + fwd_rs, bwd, again  # the op policy saves the reduce-scatters
    exposed = 1.0 - opts.tp_overlap_hidden if opts.tp_comm_overlap and ub is None else 1.0
    exposed += (1.0 - exposed) * comm.overlap_interference(hw)
    one = exposed * tensor_parallel.collective_s(nbytes, shape.tp, shape.sp, hw)
    if recompute == "full" and block:
        again = w.collectives * one
    elif op_policy:  # the op policy saves the reduce-scatters, not the all-gathers (all-reduces)
        again = w.collectives * (exposed * tensor_parallel.all_gather_s(nbytes, shape.tp, hw)
                                 if shape.sp else one)
    else:
        again = 0.0
    return w.collectives * one, w.collectives_bwd * one, again
