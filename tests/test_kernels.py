"""Kernels: forward against naive references, backward against central finite differences (float64)."""

import math

import numpy as np
import pytest

from planner.profiling import kernels as K
from gradcheck import close, numgrad, rand


def test_linear_forward_and_grads():
    x, w, b = rand(2, 3, 4), rand(4, 5), rand(5)
    r = rand(2, 3, 5)
    close(K.linear_fwd(x, w, b), np.einsum("bsk,kn->bsn", x, w) + b)
    loss = lambda: float((K.linear_fwd(x, w, b) * r).sum())
    close(K.linear_bwd_input(r, w), numgrad(loss, x))
    dw, db = K.linear_bwd_weight(x, r, bias=True)
    close(dw, numgrad(loss, w))
    close(db, numgrad(loss, b))


def test_linear_writes_into_out_buffer():
    x, w = rand(6, 4), rand(4, 3)
    out = np.empty((6, 3))
    y = K.linear_fwd(x, w, out=out)
    assert np.shares_memory(y, out)


# --- attention ------------------------------------------------------------------------------------

def naive_attention(q, k, v, causal):
    b, s, heads, d = q.shape
    groups = k.shape[2]
    out = np.zeros_like(q)
    for bi in range(b):
        for h in range(heads):
            kv = h // (heads // groups)
            scores = q[bi, :, h] @ k[bi, :, kv].T / math.sqrt(d)
            if causal:
                scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[bi, :, h] = p @ v[bi, :, kv]
    return out.reshape(b, s, heads * d)


@pytest.mark.parametrize("heads,groups,causal", [(4, 2, True), (2, 2, False), (3, 1, True)])
def test_attention_forward_and_grads(heads, groups, causal):
    b, s, d = 2, 5, 3
    qkv = rand(b, s, heads + 2 * groups, d)  # the fused projection's layout
    q, k, v = qkv[:, :, :heads], qkv[:, :, heads:heads + groups], qkv[:, :, heads + groups:]
    mask = K.causal_mask_bias(s, np, np.float64) if causal else None
    out, cache = K.attention_fwd(q, k, v, mask)
    close(out, naive_attention(q, k, v, causal))
    r = rand(*out.shape)
    loss = lambda: float((K.attention_fwd(q, k, v, mask)[0] * r).sum())
    dq, dk, dv = K.attention_bwd(r, cache)
    expected = numgrad(loss, qkv)
    close(dq, expected[:, :, :heads])
    close(dk, expected[:, :, heads:heads + groups])
    close(dv, expected[:, :, heads + groups:])


def test_causal_mask_blocks_the_future():
    b, s, heads, d = 1, 4, 2, 2
    q, k, v = rand(b, s, heads, d), rand(b, s, 1, d), rand(b, s, 1, d)
    mask = K.causal_mask_bias(s, np, np.float64)
    out1, _ = K.attention_fwd(q, k, v, mask)
    v2 = v.copy()
    v2[:, -1] += 10.0  # changing the last position must not change earlier outputs
    out2, _ = K.attention_fwd(q, k, v2, mask)
    close(out1[:, :-1], out2[:, :-1])


# --- norms ----------------------------------------------------------------------------------------

def test_layernorm():
    x, gamma, beta, r = rand(3, 6), rand(6), rand(6), rand(3, 6)
    y, cache = K.layernorm_fwd(x, gamma, beta)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * gamma + beta
    close(y, ref)
    loss = lambda: float((K.layernorm_fwd(x, gamma, beta)[0] * r).sum())
    close(K.layernorm_bwd_input(r, gamma, cache), numgrad(loss, x))
    dgamma, dbeta = K.norm_bwd_weight(r, cache, beta=True)
    close(dgamma, numgrad(loss, gamma))
    close(dbeta, numgrad(loss, beta))


def test_rmsnorm():
    x, gamma, r = rand(2, 3, 5), rand(5), rand(2, 3, 5)
    y, cache = K.rmsnorm_fwd(x, gamma)
    close(y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * gamma)
    loss = lambda: float((K.rmsnorm_fwd(x, gamma)[0] * r).sum())
    close(K.rmsnorm_bwd_input(r, gamma, cache), numgrad(loss, x))
    dgamma, dbeta = K.norm_bwd_weight(r, cache)
    assert dbeta is None
    close(dgamma, numgrad(loss, gamma))


# --- activations ----------------------------------------------------------------------------------

def test_gelu():
    u, r = rand(4, 7), rand(4, 7)
    ref = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
    close(K.gelu_fwd(u), ref)
    loss = lambda: float((K.gelu_fwd(u) * r).sum())
    close(K.gelu_bwd(r, u), numgrad(loss, u))


def test_swiglu():
    gu, r = rand(3, 8), rand(3, 4)
    gate, up = gu[:, :4], gu[:, 4:]
    close(K.swiglu_fwd(gu), gate / (1 + np.exp(-gate)) * up)
    loss = lambda: float((K.swiglu_fwd(gu) * r).sum())
    close(K.swiglu_bwd(r, gu), numgrad(loss, gu))


# --- embedding and loss ---------------------------------------------------------------------------

def test_embedding_and_scatter_add():
    weight, pos = rand(10, 4), rand(6, 4)
    ids = np.array([[1, 3, 3, 9], [0, 1, 2, 3]])
    out = K.embedding_fwd(ids, weight, positions=pos)
    close(out, weight[ids] + pos[:4])
    r = rand(2, 4, 4)
    loss = lambda: float((K.embedding_fwd(ids, weight, positions=pos) * r).sum())
    grad_w, grad_p = np.zeros_like(weight), np.zeros_like(pos)
    K.embedding_bwd_weight(r, ids, grad_w, grad_positions=grad_p)
    close(grad_w, numgrad(loss, weight))
    close(grad_p, numgrad(loss, pos))


def test_vocab_parallel_embedding_shard():
    weight = rand(10, 3)
    ids = np.array([[1, 5, 7, 9]])
    shard = weight[5:]
    out = K.embedding_fwd(ids, shard, vocab_start=5)
    close(out[0, 0], np.zeros(3))
    close(out[0, 1:], weight[[5, 7, 9]])
    grad = np.zeros_like(shard)
    K.embedding_bwd_weight(np.ones((1, 4, 3)), ids, grad, vocab_start=5)
    assert grad.sum() == 9.0  # three in-shard tokens, three columns


def test_cross_entropy():
    logits, labels = rand(5, 7), np.array([0, 6, 3, 3, 1])
    loss, probs = K.cross_entropy_fwd(logits.copy(), labels)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    close(loss, -np.log(p[np.arange(5), labels]).mean())
    f = lambda: float(K.cross_entropy_fwd(logits, labels)[0])
    before = probs.copy()
    close(K.cross_entropy_bwd(probs, labels), numgrad(f, logits))
    close(probs, before)  # the cache survives a backward, so backward can be timed repeatedly


def test_costs_count_matmul_flops():
    assert K.cost_linear_fwd(4, 5, 6, 4).flops == 2 * 4 * 5 * 6
    fwd = K.cost_attention_fwd(1, 8, 2, 1, 4, 4)
    bwd = K.cost_attention_bwd(1, 8, 2, 1, 4, 4)
    assert fwd.flops >= 4 * 2 * 64 * 4  # full s x s: 2 matmuls of 2·s²·d per head
    assert bwd.flops >= 2 * 4 * 2 * 64 * 4 - 1
    assert (K.KernelCost(1, 2) + K.KernelCost(3, 4)) * 2 == K.KernelCost(8, 12)
