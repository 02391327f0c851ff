"""Element-wise HBM traffic of a transformer block beyond its matmuls and attention kernel: what
fused kernels move, and what eager PyTorch (one kernel per operation) adds.

Every element-wise kernel is memory-bound: it reads its inputs from HBM and writes its output
once, so its time is bytes / achieved bandwidth (cost/layer.py prices these bytes at the
profile's HBM rate, the backward at twice the forward: each op's backward reads the saved input
and the incoming gradient and writes a gradient). Counting bytes per element of each width:

Fused stacks (Megatron-Core's TE RMSNorm/LayerNorm, fused bias-SwiGLU, fused RoPE; torch.compile,
which generates one Triton kernel per chain of point-wise ops): each chain reads its input and
writes its output once. cost/layer.py already counts the norms, residuals and activation; this
module adds the fused rotary embedding: one kernel over Q and K, read 2 bytes and write 2.

Eager PyTorch (torchtitan without ``[compile] enable``; its model code, torchtitan/models/
llama/model.py and models/norms.py, late 2024, is what these counts follow):

- RMSNorm: ``output = self._norm(x.float()).type_as(x); return output * self.weight`` with
  ``_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)``: x.float() (read
  2, write 4), pow (4, 4), mean (4, -), x * rsqrt (4, 4), type_as (4, 2), * weight (2, 2):
  36 bytes per element where a fused norm moves 4, so 32 more (the rsqrt and eps add act on one
  value per token). A LayerNorm is ``F.layer_norm``, one native kernel in eager too: nothing more.
- RoPE: ``torch.view_as_complex(xq.float().reshape(...))``, ``xq_ * freqs_cis``,
  ``torch.view_as_real(...).flatten(3)``, ``.type_as(xq)``: float (2, 4), complex multiply (4, 4;
  the frequencies broadcast over batch and heads), type_as (4, 2): 20 bytes per element of Q and
  K where the fused kernel moves 4, so 16 more.
- SwiGLU: ``self.w2(F.silu(self.w1(x)) * self.w3(x))``: silu (read 2, write 2) then a product
  (read 4, write 2), 10 bytes per element of the FFN width f where Megatron's bias-SwiGLU kernel
  moves 6 (reads both halves, writes one): 4 more.
- RoPE under torch.compile: torchtitan's RoPE is complex arithmetic (above), and inductor has no
  code generation for complex operators (torch/_inductor/lowering.py: "Torchinductor does not
  support code generation for complex operators. Performance may be worse than eager.";
  torchtitan docs/torch_compile_asks/repros/ask08_complex_ops.py: "Complex ops have no Inductor
  codegen: a compiled complex RoPE keeps eager fallbacks." and measures the compiled complex
  rotation as slow as eager, 7 kernels each). A fused stack whose model does so
  (Stack.complex_rope) pays the eager RoPE chain on top of its fused kernels: the same 16 more
  bytes per element of Q and K, forward, backward and recompute alike.
- Grouped KV heads: ``repeat_kv`` expands K and V to every query head (``expand`` then
  ``reshape`` copies: read the kv width, write the q width, for each of K and V). (Its
  attention output's ``.transpose(1, 2).contiguous()`` copy is left out: other eager stacks on
  this profile, llm-foundry's MPT, keep the flash layout.)
- Launch: an eager kernel shorter than its launch still costs the launch (the host issues one
  op after another; the GPU waits when an op is shorter than the next one's dispatch). Each
  eager kernel is charged at least constants.EAGER_KERNEL_MIN_S, as bytes at the HBM rate.
- Megatron's fused bias-GeLU and bias-dropout-add, unfused: a bias before GeLU is one more read
  and write over the FFN width; each of the two residual bias/dropout/adds writes and rereads its
  dropout output (2 passes) and any bias add (2 more).
"""

from __future__ import annotations

from planner.model.spec import Layer

BF16 = 2  # bytes of a 16-bit activation element

# Bytes per element of each kernel of an eager chain, and of the fused kernel it replaces (see the
# module docstring for each count; the eps add and rsqrt of a norm act on one value per token).
RMSNORM_EAGER = (6.0, 8.0, 4.0, 8.0, 6.0, 4.0)  # float, pow, mean, x * rsqrt, type_as, * weight
RMSNORM_FUSED = 4.0
ROPE_EAGER = (6.0, 8.0, 6.0)  # float, complex multiply, type_as: once for Q, once for K
ROPE_FUSED = 4.0  # one fused rotary kernel: read 2, write 2
SWIGLU_EAGER = (4.0, 6.0)  # silu, then the product; per element of the FFN width
SWIGLU_FUSED = 6.0
EAGER_RMSNORM_EXTRA = sum(RMSNORM_EAGER) - RMSNORM_FUSED  # 32
EAGER_ROPE_EXTRA = sum(ROPE_EAGER) - ROPE_FUSED  # 16
EAGER_SWIGLU_EXTRA = sum(SWIGLU_EAGER) - SWIGLU_FUSED  # 4


def _chain(per_element: tuple[float, ...], elements: float, floor: float) -> float:
    """Bytes of an eager chain over ``elements``: each kernel at least ``floor`` bytes (the
    launch floor, constants.EAGER_KERNEL_MIN_S, as bytes at the HBM rate; 0 for none)."""
    return sum(max(b * elements, floor) for b in per_element)


def fused_rope_bytes(layer: Layer, tokens: int, tp: int) -> float:
    """Forward HBM bytes of the fused rotary embedding over this GPU's Q and K heads."""
    if not layer.rope:
        return 0.0
    return ROPE_FUSED * tokens * _qk_width(layer) / tp


def eager_extra_bytes(layer: Layer, tokens: int, tp: int, sp: bool, floor: float = 0.0) -> float:
    """Forward HBM bytes eager element-wise kernels move beyond the fused ones, for one block on
    one GPU of a TP group (norm widths sharded only under sequence parallelism); each eager kernel
    counts at least ``floor`` bytes (its launch, see _chain)."""
    hidden = layer.hidden_size / tp if sp else layer.hidden_size
    ffn = layer.ffn_hidden_size / tp
    q = layer.q_size / tp
    kv = layer.num_kv_heads * layer.head_dim / tp
    extra = 0.0
    if layer.norm == "rmsnorm":
        extra += layer.block_norms * (_chain(RMSNORM_EAGER, tokens * hidden, floor)
                                      - RMSNORM_FUSED * tokens * hidden)
    extra += eager_rope_extra_bytes(layer, tokens, tp, floor)
    if layer.mlp == "swiglu":
        extra += _chain(SWIGLU_EAGER, tokens * ffn, floor) - SWIGLU_FUSED * tokens * ffn
    elif layer.bias:
        extra += 2 * BF16 * tokens * ffn  # a bias before GeLU: one more read and write
    if kv and kv < q:  # repeat_kv: one copy kernel each for K and V
        extra += 2 * max(BF16 * tokens * (kv + q), floor)
    per_residual = (2 if layer.dropout else 0) + (2 if layer.bias else 0)
    return extra + 2 * per_residual * BF16 * tokens * hidden


def eager_rope_extra_bytes(layer: Layer, tokens: int, tp: int, floor: float = 0.0) -> float:
    """Forward bytes the eager (complex) RoPE chain moves beyond the fused rotary kernel, over
    this GPU's Q and K heads: part of eager_extra_bytes, and all an otherwise fused stack adds
    where its model's RoPE is complex (module docstring: inductor cannot fuse it)."""
    if not layer.rope:
        return 0.0
    return sum(_chain(ROPE_EAGER, tokens * width, floor) - ROPE_FUSED * tokens * width
               for width in (layer.q_size / tp, layer.num_kv_heads * layer.head_dim / tp))


def eager_head_extra_bytes(layer: Layer, tokens: int, tp: int, sp: bool,
                           floor: float = 0.0) -> float:
    """Forward bytes the eager final RMSNorm adds in the head (one norm of the hidden width)."""
    if layer.norm != "rmsnorm":
        return 0.0
    hidden = layer.hidden_size / tp if sp else layer.hidden_size
    return _chain(RMSNORM_EAGER, tokens * hidden, floor) - RMSNORM_FUSED * tokens * hidden


def _qk_width(layer: Layer) -> int:
    return layer.q_size + layer.num_kv_heads * layer.head_dim
