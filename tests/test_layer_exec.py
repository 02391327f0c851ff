"""Whole-layer executors: their backward passes are the gradients of their forward (float64)."""

import pytest

from planner.core.errors import PlanInputError
from planner.profiling.executors import build_executor, layer_costs, shard_dims
from planner.model.spec import Layer
from gradcheck import close, numgrad

BLOCKS = [
    Layer(kind="block", hidden_size=4, num_attention_heads=2, num_kv_heads=1, ffn_hidden_size=6,
          mlp="swiglu", norm="rmsnorm", bias=False),
    Layer(kind="block", hidden_size=4, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=5,
          mlp="gelu", norm="layernorm", bias=True),
]


def check_grads(ex, names):
    ex.forward()
    ex.backward_input()
    ex.backward_weight()
    if ex.dy is None:
        loss = lambda: float(ex.forward())
    else:
        loss = lambda: float((ex.forward() * ex.dy).sum())
    if getattr(ex, "x", None) is not None and ex.dx is not None:
        close(ex.dx, numgrad(loss, ex.x), 1e-5)
    for name in names:
        close(ex.grads[name], numgrad(loss, ex.params[name]), 1e-5)


@pytest.mark.parametrize("layer", BLOCKS)
def test_block_gradients(layer):
    ex = build_executor(layer, 2, 3, dtype="float64")
    check_grads(ex, sorted(ex.params))


def test_head_and_linear_gradients():
    head = Layer(kind="head", hidden_size=4, vocab_size=7, norm="layernorm")
    check_grads(build_executor(head, 1, 3, dtype="float64"), ["out.w", "norm.gamma", "norm.beta"])
    lin = Layer(kind="linear", hidden_size=3, out_features=2, bias=True)
    check_grads(build_executor(lin, 1, 2, dtype="float64"), ["w", "b"])


def test_embedding_gradients():
    emb = Layer(kind="embedding", hidden_size=3, vocab_size=9, position_embeddings=4)
    ex = build_executor(emb, 2, 4, dtype="float64")
    ex.forward()
    ex.backward_weight()
    loss = lambda: float((ex.forward() * ex.dy).sum())
    close(ex.grads["tokens"], numgrad(loss, ex.params["tokens"]), 1e-5)


def test_tp_divides_heads_ffn_vocab():
    block = Layer(kind="block", hidden_size=64, num_attention_heads=8, num_kv_heads=2,
                  ffn_hidden_size=96, vocab_size=100)
    d = shard_dims(block, 4)
    assert (d.heads, d.kv_heads, d.ffn, d.hidden) == (2, 1, 24, 64)
    assert shard_dims(block, 8).kv_heads == 1  # KV heads replicated
    with pytest.raises(PlanInputError):
        shard_dims(block, 3)
    full = layer_costs(block, 1, 16, tp=1)
    half = layer_costs(block, 1, 16, tp=2)
    assert half["attention"].fwd.flops == pytest.approx(full["attention"].fwd.flops / 2)
    assert half["dense"].bwd_weight.flops < full["dense"].bwd_weight.flops


def test_costs_scale_linearly_in_tokens():
    block = BLOCKS[0]
    a, b = layer_costs(block, 1, 8), layer_costs(block, 2, 8)
    assert b["dense"].fwd.flops == pytest.approx(2 * a["dense"].fwd.flops)
    long = layer_costs(block, 1, 16)
    assert long["attention"].fwd.flops > 3.5 * a["attention"].fwd.flops  # ~ s²
