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
- Grouped KV heads: ``repeat_kv`` expands K and V to every query head (``expand`` then
  ``reshape`` copies: read the kv width, write the q width, for each of K and V). (Its
  attention output's ``.transpose(1, 2).contiguous()`` copy is left out: other eager stacks on
  this profile, llm-foundry's MPT, keep the flash layout.)
- Megatron's fused bias-GeLU and bias-dropout-add, unfused: a bias before GeLU is one more read
  and write over the FFN width; each of the two residual bias/dropout/adds writes and rereads its
  dropout output (2 passes) and any bias add (2 more).
"""

from __future__ import annotations

from planner.model.spec import Layer

BF16 = 2  # bytes of a 16-bit activation element

# Bytes per element an eager op chain moves beyond the fused kernel doing the same work (see the
# module docstring for each count).
EAGER_RMSNORM_EXTRA = 32.0  # 36 eager - 4 fused
EAGER_ROPE_EXTRA = 16.0  # 20 eager - 4 fused
FUSED_ROPE = 4.0  # one fused rotary kernel: read 2, write 2
EAGER_SWIGLU_EXTRA = 2 * BF16  # silu output written and read back: per element of f


def fused_rope_bytes(layer: Layer, tokens: int, tp: int) -> float:
    """Forward HBM bytes of the fused rotary embedding over this GPU's Q and K heads."""
    if not layer.rope:
        return 0.0
    return FUSED_ROPE * tokens * _qk_width(layer) / tp


def eager_extra_bytes(layer: Layer, tokens: int, tp: int, sp: bool) -> float:
    """Forward HBM bytes eager element-wise kernels move beyond the fused ones, for one block on
    one GPU of a TP group (norm widths sharded only under sequence parallelism)."""
    hidden = layer.hidden_size / tp if sp else layer.hidden_size
    ffn = layer.ffn_hidden_size / tp
    q = layer.q_size / tp
    kv = layer.num_kv_heads * layer.head_dim / tp
    extra = 0.0
    if layer.norm == "rmsnorm":
        extra += EAGER_RMSNORM_EXTRA * tokens * hidden * layer.block_norms
    if layer.rope:
        extra += EAGER_ROPE_EXTRA * tokens * (q + kv)
    if layer.mlp == "swiglu" or layer.bias:
        extra += EAGER_SWIGLU_EXTRA * tokens * ffn  # silu's output, or a bias before GeLU
    if kv and kv < q:
        extra += BF16 * tokens * 2 * (kv + q)  # repeat_kv copies of K and V
    per_residual = (2 if layer.dropout else 0) + (2 if layer.bias else 0)
    return extra + 2 * per_residual * BF16 * tokens * hidden


def eager_head_extra_bytes(layer: Layer, tokens: int, tp: int, sp: bool) -> float:
    """Forward bytes the eager final RMSNorm adds in the head (one norm of the hidden width)."""
    if layer.norm != "rmsnorm":
        return 0.0
    hidden = layer.hidden_size / tp if sp else layer.hidden_size
    return EAGER_RMSNORM_EXTRA * tokens * hidden


def _qk_width(layer: Layer) -> int:
    return layer.q_size + layer.num_kv_heads * layer.head_dim
