"""Training kernels of a transformer, written once against an array module (numpy or cupy).

Every kernel takes arrays and finds its module with :func:`array_module`, so the same code runs on
the CPU (numpy) and on an NVIDIA GPU (cupy). The profiler times these kernels to learn how fast a
device runs each layer; nothing here is used for real training.

Layouts are chosen so that the large matmuls go straight to ``xp.matmul`` with no copies: a weight is
stored ``(in_features, out_features)`` so the forward is ``x @ w``, the input gradient ``dy @ w.T``
and the weight gradient ``x.T @ dy`` (transposed *views*, which BLAS/cuBLAS take as a flag).

Each kernel has a ``cost_*`` twin that returns the :class:`KernelCost` (FLOPs and bytes moved) of
the work the kernel actually executes, from shapes alone, so the profiler can compute achieved
rates and estimate run times before running anything. Conventions:

* a multiply-add is 2 FLOPs; an elementwise op (add, mul, exp, tanh, compare...) is 1 FLOP per
  element per op, with the per-element op counts spelt out in the constants below;
* bytes are the ideal traffic: every operand read once and every result written once;
* causal attention computes the **full** s x s score matrix and masks it (numpy has no kernel that
  skips the masked half), so its FLOPs are counted for the full matrix: 4·s²·d per head forward.

Why one file of ~430 lines: each kernel stands beside its ``cost_*`` twin, so a reader checks a
FLOP or byte count against the very code it counts; split apart, the two drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Elementwise op counts per element (see the kernels for the exact sequence of ops).
SOFTMAX_FWD_OPS = 5  # mask add, row max, subtract, exp, normalise (sum folded into normalise)
SOFTMAX_BWD_OPS = 2  # subtract row term, multiply by P
LAYERNORM_FWD_OPS = 7  # mean, subtract, square, mean, scale by rstd, gamma, beta
LAYERNORM_BWD_INPUT_OPS = 8
RMSNORM_FWD_OPS = 4  # square, mean, scale by rstd, gamma
RMSNORM_BWD_INPUT_OPS = 6
NORM_BWD_WEIGHT_OPS = 2  # dy * xhat, accumulate
GELU_FWD_OPS = 8  # tanh approximation: x^3, fma, scale, tanh, 1+, *x, *0.5
GELU_BWD_OPS = 14
SWIGLU_FWD_OPS = 5  # sigmoid (neg, exp, add, div), * gate, * up
SWIGLU_BWD_OPS = 10
CROSS_ENTROPY_FWD_OPS = 5  # row max, subtract, exp, sum, normalise
CROSS_ENTROPY_BWD_OPS = 1  # scale by 1/T (the label entries are O(T))


@dataclass(frozen=True)
class KernelCost:
    """Work one kernel call executes: floating-point operations and bytes moved (ideal traffic)."""

    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: KernelCost) -> KernelCost:
        return KernelCost(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, factor: float) -> KernelCost:
        return KernelCost(self.flops * factor, self.bytes * factor)

    __rmul__ = __mul__


ZERO = KernelCost()


def total(costs) -> KernelCost:
    """Sum of an iterable of costs."""
    out = ZERO
    for cost in costs:
        out = out + cost
    return out


def array_module(x):
    """numpy, or cupy when ``x`` is a cupy array (imported only then)."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


# --- linear ---------------------------------------------------------------------------------------

def linear_fwd(x, w, b=None, out=None):
    """y = x @ w (+ b); x (..., k), w (k, n). The matmul runs on x's memory as it is."""
    xp = array_module(x)
    x2 = x.reshape(-1, x.shape[-1])
    y = xp.matmul(x2, w, out=out)
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], w.shape[1])


def linear_bwd_input(dy, w, out=None):
    """dx = dy @ w.T (w.T is a view; BLAS reads it transposed)."""
    xp = array_module(dy)
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx = xp.matmul(dy2, w.T, out=out)
    return dx.reshape(*dy.shape[:-1], w.shape[0])


def linear_bwd_weight(x, dy, bias=False, out=None):
    """(dw, db): dw = x.T @ dy over all tokens, db = sum of dy (None without a bias)."""
    xp = array_module(x)
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    dw = xp.matmul(x2.T, dy2, out=out)
    db = dy2.sum(axis=0) if bias else None
    return dw, db


def cost_linear_fwd(m: int, k: int, n: int, itemsize: int, bias: bool = False) -> KernelCost:
    flops = 2.0 * m * k * n + (m * n if bias else 0)
    return KernelCost(flops, itemsize * (m * k + k * n + m * n + (n if bias else 0)))


def cost_linear_bwd_input(m: int, k: int, n: int, itemsize: int) -> KernelCost:
    return KernelCost(2.0 * m * k * n, itemsize * (m * n + k * n + m * k))


def cost_linear_bwd_weight(m: int, k: int, n: int, itemsize: int, bias: bool = False) -> KernelCost:
    flops = 2.0 * m * k * n + (m * n if bias else 0)
    return KernelCost(flops, itemsize * (m * k + m * n + k * n + (n if bias else 0)))


# --- attention ------------------------------------------------------------------------------------

def causal_mask_bias(s: int, xp, dtype):
    """(s, s) additive mask: 0 on and below the diagonal, -inf above (future positions)."""
    mask = xp.triu(xp.ones((s, s), dtype=bool), k=1)
    return xp.where(mask, xp.asarray(-xp.inf, dtype=dtype), xp.asarray(0, dtype=dtype))


def _grouped(t, groups: int):
    """(b, s, heads, d) -> (b, groups, heads//groups, s, d) as a view (no copy)."""
    b, s, heads, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, groups, heads // groups, s, d)


def attention_fwd(q, k, v, mask_bias=None):
    """Multi-head attention with grouped KV heads: softmax(q k^T / sqrt(d) + mask) v.

    q (b, s, heads, d); k, v (b, s, kv_heads, d), usually views into the fused QKV projection.
    Query head i uses KV head i // (heads // kv_heads) (Llama-2/3 GQA). ``mask_bias`` is an (s, s)
    additive mask (:func:`causal_mask_bias`) or None. Computes the full s x s scores.
    Returns (out (b, s, heads·d) contiguous, cache for :func:`attention_bwd`).
    """
    xp = array_module(q)
    b, s, heads, d = q.shape
    groups = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    qs = _grouped(q, groups) * q.dtype.type(scale)  # (b, g, r, s, d): one small copy, scaled
    k5 = _grouped(k, groups)  # (b, g, 1, s, d) view
    v5 = _grouped(v, groups)
    p = xp.matmul(qs, k5.swapaxes(-1, -2))  # (b, g, r, s, s) scores
    if mask_bias is not None:
        p += mask_bias
    p -= p.max(axis=-1, keepdims=True)
    xp.exp(p, out=p)
    p *= 1.0 / p.sum(axis=-1, keepdims=True)  # p is now the attention probabilities
    o5 = xp.matmul(p, v5)  # (b, g, r, s, d)
    out = o5.reshape(b, heads, s, d).transpose(0, 2, 1, 3).reshape(b, s, heads * d)
    return out, (qs, k5, v5, p, out)


def attention_bwd(dout, cache, dqkv=None):
    """Input gradients of :func:`attention_fwd`: (dq, dk, dv) shaped like q, k, v.

    Uses the row term D_i = dO_i · O_i (= sum_j dP_ij P_ij) instead of another s x s pass. When
    ``dqkv`` (b, s, heads + 2·kv_heads, d) is given the gradients are written into it (the layout
    of the fused QKV projection) and views into it are returned.
    """
    xp = array_module(dout)
    qs, k5, v5, p, out = cache
    b, g, r, s, d = qs.shape
    heads = g * r
    scale = 1.0 / math.sqrt(d)
    do5 = _grouped(dout.reshape(b, s, heads, d), g)
    o5 = _grouped(out.reshape(b, s, heads, d), g)
    dv5 = xp.matmul(p.swapaxes(-1, -2), do5).sum(axis=2)  # (b, g, s, d)
    dp = xp.matmul(do5, v5.swapaxes(-1, -2))  # (b, g, r, s, s)
    dp -= (do5 * o5).sum(axis=-1, keepdims=True)
    dp *= p  # dS: gradient of the (scaled, masked) scores
    dq5 = xp.matmul(dp, k5)
    dq5 *= dq5.dtype.type(scale)
    dk5 = xp.matmul(dp.swapaxes(-1, -2), qs).sum(axis=2)  # qs already carries the scale
    if dqkv is None:
        dqkv = xp.empty((b, s, heads + 2 * g, d), dtype=dout.dtype)
    dqkv[:, :, :heads] = dq5.reshape(b, heads, s, d).transpose(0, 2, 1, 3)
    dqkv[:, :, heads:heads + g] = dk5.transpose(0, 2, 1, 3)
    dqkv[:, :, heads + g:] = dv5.transpose(0, 2, 1, 3)
    return dqkv[:, :, :heads], dqkv[:, :, heads:heads + g], dqkv[:, :, heads + g:]


def cost_attention_fwd(b: int, s: int, heads: int, kv_heads: int, d: int,
                       itemsize: int) -> KernelCost:
    """Full s x s scores: 2 matmuls of 2·s²·d per head, softmax over b·heads·s² elements."""
    ss = b * heads * s * s
    flops = 4.0 * ss * d + SOFTMAX_FWD_OPS * ss + b * s * heads * d
    qkv = b * s * (heads + 2 * kv_heads) * d
    nbytes = itemsize * (qkv + b * s * heads * d + 3 * ss)  # write scores, softmax r/w, read in PV
    return KernelCost(flops, nbytes)


def cost_attention_bwd(b: int, s: int, heads: int, kv_heads: int, d: int,
                       itemsize: int) -> KernelCost:
    """4 matmuls of 2·s²·d per head, dS over the s² elements, the D row term, scale of dq."""
    ss = b * heads * s * s
    tok = b * s * heads * d
    flops = 8.0 * ss * d + SOFTMAX_BWD_OPS * ss + 2.0 * tok + tok
    if heads != kv_heads:  # summing dk, dv over the query heads of each group
        flops += 2.0 * tok
    qkv = b * s * (heads + 2 * kv_heads) * d
    nbytes = itemsize * (2 * qkv + 2 * tok + 4 * ss)  # read P twice, write/read dS, read in 2 mm
    return KernelCost(flops, nbytes)


# --- norms ----------------------------------------------------------------------------------------

def layernorm_fwd(x, gamma, beta=None, eps: float = 1e-5):
    """LayerNorm over the last axis. Returns (y, cache=(xhat, rstd))."""
    xp = array_module(x)
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat = xc
    xhat *= rstd
    y = xhat * gamma
    if beta is not None:
        y += beta
    return y, (xhat, rstd)


def layernorm_bwd_input(dy, gamma, cache):
    xhat, rstd = cache
    g = dy * gamma
    dx = g - g.mean(axis=-1, keepdims=True)
    dx -= xhat * (g * xhat).mean(axis=-1, keepdims=True)
    dx *= rstd
    return dx


def rmsnorm_fwd(x, gamma, eps: float = 1e-6):
    """RMSNorm over the last axis (Zhang & Sennrich 2019). Returns (y, cache=(xhat, rstd))."""
    xp = array_module(x)
    rstd = 1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    return xhat * gamma, (xhat, rstd)


def rmsnorm_bwd_input(dy, gamma, cache):
    xhat, rstd = cache
    g = dy * gamma
    dx = g - xhat * (g * xhat).mean(axis=-1, keepdims=True)
    dx *= rstd
    return dx


def norm_bwd_weight(dy, cache, beta: bool = False):
    """(dgamma, dbeta or None) of either norm: sums over all tokens."""
    xhat, _ = cache
    h = dy.shape[-1]
    dgamma = (dy * xhat).reshape(-1, h).sum(axis=0)
    dbeta = dy.reshape(-1, h).sum(axis=0) if beta else None
    return dgamma, dbeta


def cost_norm(kind: str, phase: str, tokens: int, h: int, itemsize: int,
              beta: bool = False) -> KernelCost:
    """Cost of a layer norm or RMS norm phase ('fwd', 'bwd_input', 'bwd_weight') over tokens x h."""
    n = tokens * h
    if phase == "fwd":
        ops = LAYERNORM_FWD_OPS if kind == "layernorm" else RMSNORM_FWD_OPS
        return KernelCost(ops * n, itemsize * 3 * n)  # read x, write y and xhat
    if phase == "bwd_input":
        ops = LAYERNORM_BWD_INPUT_OPS if kind == "layernorm" else RMSNORM_BWD_INPUT_OPS
        return KernelCost(ops * n, itemsize * 3 * n)  # read dy, xhat, write dx
    return KernelCost(NORM_BWD_WEIGHT_OPS * n + (n if beta else 0), itemsize * 2 * n)


# --- activations ----------------------------------------------------------------------------------

_GELU_C = math.sqrt(2.0 / math.pi)


def gelu_fwd(u):
    """GELU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2/Megatron use."""
    xp = array_module(u)
    t = xp.tanh(_GELU_C * (u + 0.044715 * u * u * u))
    t += 1.0
    t *= u
    t *= 0.5
    return t


def gelu_bwd(da, u):
    xp = array_module(u)
    inner = _GELU_C * (u + 0.044715 * u * u * u)
    t = xp.tanh(inner)
    dinner = _GELU_C * (1.0 + 3 * 0.044715 * u * u)
    grad = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * dinner
    grad *= da
    return grad


def swiglu_fwd(gu):
    """SwiGLU (Shazeer 2020): gu (..., 2f) = [gate | up] from one fused matmul -> silu(gate) * up."""
    xp = array_module(gu)
    f = gu.shape[-1] // 2
    gate, up = gu[..., :f], gu[..., f:]
    sig = 1.0 / (1.0 + xp.exp(-gate))
    a = gate * sig
    a *= up
    return a


def swiglu_bwd(da, gu, out=None):
    """d(gu) of :func:`swiglu_fwd`, written into ``out`` (shape of gu) when given."""
    xp = array_module(gu)
    f = gu.shape[-1] // 2
    gate, up = gu[..., :f], gu[..., f:]
    sig = 1.0 / (1.0 + xp.exp(-gate))
    silu = gate * sig
    if out is None:
        out = xp.empty_like(gu)
    xp.multiply(da, silu, out=out[..., f:])
    dsilu = sig * (1.0 + gate * (1.0 - sig))
    dsilu *= up
    dsilu *= da
    out[..., :f] = dsilu
    return out


def cost_activation(kind: str, phase: str, tokens: int, f: int, itemsize: int) -> KernelCost:
    """GELU or SwiGLU over tokens x f outputs (SwiGLU reads 2f inputs)."""
    n = tokens * f
    if kind == "gelu":
        ops = GELU_FWD_OPS if phase == "fwd" else GELU_BWD_OPS
        return KernelCost(ops * n, itemsize * (2 * n if phase == "fwd" else 3 * n))
    ops = SWIGLU_FWD_OPS if phase == "fwd" else SWIGLU_BWD_OPS
    return KernelCost(ops * n, itemsize * (3 * n if phase == "fwd" else 5 * n))


# --- embedding ------------------------------------------------------------------------------------

def embedding_fwd(ids, weight, vocab_start: int = 0, positions=None):
    """Rows of ``weight`` for token ids (b, s) -> (b, s, h).

    With a vocabulary shard (Megatron's vocab-parallel embedding) ids outside
    [vocab_start, vocab_start + rows) give zeros; the all-reduce that sums shards is not included.
    ``positions`` (s, h) is a learned absolute position table added to every sequence.
    """
    xp = array_module(weight)
    rows = weight.shape[0]
    local = ids - vocab_start
    if vocab_start == 0 and rows > int(ids.max()):
        out = xp.take(weight, ids, axis=0)
    else:
        inside = (local >= 0) & (local < rows)
        out = xp.take(weight, xp.where(inside, local, 0), axis=0)
        out *= inside[..., None]
    if positions is not None:
        out += positions[: ids.shape[-1]]
    return out


def embedding_bwd_weight(dy, ids, grad_weight, vocab_start: int = 0, grad_positions=None):
    """Scatter-add dy (b, s, h) into the rows of ``grad_weight`` for the ids (accumulates, as a
    framework's gradient buffer does), and the position-table gradient when given."""
    xp = array_module(dy)
    rows, h = grad_weight.shape
    local = (ids - vocab_start).reshape(-1)
    dy2 = dy.reshape(-1, h)
    inside = (local >= 0) & (local < rows)
    if not bool(inside.all()):
        local, dy2 = local[inside], dy2[inside]
    if hasattr(xp, "add") and hasattr(xp.add, "at"):
        xp.add.at(grad_weight, local, dy2)
    else:  # older cupy
        import cupyx

        cupyx.scatter_add(grad_weight, local, dy2)
    if grad_positions is not None:
        s = ids.shape[-1]
        grad_positions[:s] += dy.reshape(-1, s, h).sum(axis=0)
    return grad_weight


def cost_embedding(phase: str, tokens: int, h: int, itemsize: int,
                   positions: bool = False) -> KernelCost:
    """An embedding moves rows: 1 'op' per copied (fwd) or accumulated (bwd_weight) element, so
    the profile has a FLOP count that scales with tokens like the time does. No input gradient."""
    n = tokens * h
    if phase == "bwd_input":
        return ZERO
    tables = 2 if positions else 1
    if phase == "fwd":
        return KernelCost(tables * n, itemsize * (tables + 1) * n)
    return KernelCost(tables * n, itemsize * 3 * tables * n)


# --- output head loss -----------------------------------------------------------------------------

def cross_entropy_fwd(logits, labels):
    """Mean softmax cross-entropy of logits (T, V) against labels (T,). Returns (loss, probs).

    On a vocabulary shard this is the local part of Megatron's vocab-parallel cross-entropy (its two
    all-reduces of T numbers are communication, not included)."""
    xp = array_module(logits)
    tokens = logits.shape[0]
    p = logits - logits.max(axis=-1, keepdims=True)
    xp.exp(p, out=p)
    p *= 1.0 / p.sum(axis=-1, keepdims=True)
    rows = xp.arange(tokens)
    loss = -xp.log(p[rows, labels]).mean()
    return loss, p


def cross_entropy_bwd(probs, labels, out=None):
    """d loss / d logits = (softmax - onehot) / T; the cached probs are left intact."""
    xp = array_module(probs)
    tokens = probs.shape[0]
    inv = probs.dtype.type(1.0 / tokens)
    out = xp.multiply(probs, inv, out=out)
    out[xp.arange(tokens), labels] -= inv
    return out


def cost_cross_entropy(phase: str, tokens: int, vocab: int, itemsize: int) -> KernelCost:
    n = tokens * vocab
    if phase == "fwd":
        return KernelCost(CROSS_ENTROPY_FWD_OPS * n, itemsize * 3 * n)
    if phase == "bwd_input":
        return KernelCost(CROSS_ENTROPY_BWD_OPS * n, itemsize * 2 * n)
    return ZERO
