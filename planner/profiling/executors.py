"""One layer's forward, backward-input and backward-weight passes, built from planner.profiling.kernels.

A layer runs on one tensor-parallel rank of ``tp`` (Megatron-LM column/row parallel, Shoeybi et al.
2019): attention heads, KV heads, the FFN width and the vocabulary are divided by ``tp``; the
hidden size is not. Communication (the TP all-reduces, the vocab-parallel loss reductions) is not
run: the profile measures compute, the cost model adds communication.

The backward pass is split the way zero-bubble schedules split it (Qi et al. 2023):
``backward_input`` propagates the gradient to the layer input and keeps each matmul's output
gradient; ``backward_weight`` then turns those into weight gradients.

:func:`layer_costs` gives the FLOPs and bytes of each phase from shapes alone, split into the
``dense`` part (work proportional to tokens) and, for a block, the ``attention`` core (proportional
to tokens x seq_len), so the profiler can scale the two separately. The executors run exactly the
kernels these costs describe.

Why one file of ~420 lines: the costs and the executors of a layer kind must agree kernel for
kernel (tests/test_layer_exec.py checks it); keeping them together keeps that visible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.profiling import kernels as K
from planner.profiling import tiled as T
from planner.core.errors import PlanInputError
from planner.model.spec import Layer
from planner.profiling.clock import Clock

PHASES = ("fwd", "bwd_input", "bwd_weight")


@dataclass(frozen=True)
class Dims:
    """Per-rank sizes of a layer under tensor parallelism."""

    hidden: int
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0
    vocab: int = 0
    out_features: int = 0


def shard_dims(layer: Layer, tp: int) -> Dims:
    """Divide heads, KV heads, FFN and vocabulary by tp (KV heads are replicated when tp > kv)."""
    if tp < 1:
        raise PlanInputError(f"--tp must be at least 1, got {tp}")
    vocab = layer.padded_vocab(tp) // tp  # Megatron pads the vocab (0 stays 0)
    if layer.kind != "block":
        out = -(-layer.out_features // tp) if layer.out_features else 0
        return Dims(hidden=layer.hidden_size, vocab=vocab, out_features=out)
    heads, kv, ffn = layer.num_attention_heads, layer.num_kv_heads, layer.ffn_hidden_size
    if heads % tp or ffn % tp:
        raise PlanInputError(f"--tp {tp} must divide the attention heads ({heads}) and the FFN "
                             f"width ({ffn}); choose a divisor")
    if kv % tp and tp % kv:
        raise PlanInputError(f"--tp {tp} and the {kv} KV heads must divide one another")
    return Dims(hidden=layer.hidden_size, heads=heads // tp, kv_heads=max(1, kv // tp),
                head_dim=layer.head_dim, ffn=ffn // tp, vocab=vocab)


@dataclass(frozen=True)
class PhaseCosts:
    """KernelCost of each phase of one layer (or one part of it)."""

    fwd: K.KernelCost = K.ZERO
    bwd_input: K.KernelCost = K.ZERO
    bwd_weight: K.KernelCost = K.ZERO

    def __add__(self, other: PhaseCosts) -> PhaseCosts:
        return PhaseCosts(self.fwd + other.fwd, self.bwd_input + other.bwd_input,
                          self.bwd_weight + other.bwd_weight)

    def phase(self, name: str) -> K.KernelCost:
        return getattr(self, name)

    @property
    def flops(self) -> float:
        return self.fwd.flops + self.bwd_input.flops + self.bwd_weight.flops

    @property
    def bytes(self) -> float:
        return self.fwd.bytes + self.bwd_input.bytes + self.bwd_weight.bytes


def attention_costs(b: int, s: int, heads: int, kv_heads: int, d: int,
                    itemsize: int) -> PhaseCosts:
    return PhaseCosts(fwd=K.cost_attention_fwd(b, s, heads, kv_heads, d, itemsize),
                      bwd_input=K.cost_attention_bwd(b, s, heads, kv_heads, d, itemsize))


def _residual(tokens: int, h: int, itemsize: int) -> K.KernelCost:
    return K.KernelCost(tokens * h, 3 * itemsize * tokens * h)


def layer_costs(layer: Layer, micro_batch: int, seq_len: int, tp: int = 1,
                itemsize: int = 4) -> dict[str, PhaseCosts]:
    """FLOPs and bytes per phase: {"dense": ...} and, for a block, {"attention": ...} too."""
    dims = shard_dims(layer, tp)
    b, s, n = micro_batch, seq_len, itemsize
    t, h = b * s, dims.hidden
    if layer.kind == "embedding":
        pos = layer.position_embeddings > 0
        return {"dense": PhaseCosts(fwd=K.cost_embedding("fwd", t, h, n, pos),
                                    bwd_weight=K.cost_embedding("bwd_weight", t, h, n, pos))}
    if layer.kind == "linear":
        m = dims.out_features
        return {"dense": PhaseCosts(fwd=K.cost_linear_fwd(t, h, m, n, layer.bias),
                                    bwd_input=K.cost_linear_bwd_input(t, h, m, n),
                                    bwd_weight=K.cost_linear_bwd_weight(t, h, m, n, layer.bias))}
    beta = layer.norm == "layernorm"
    norm = {p: K.cost_norm(layer.norm, p, t, h, n, beta) for p in PHASES}
    if layer.kind == "head":
        v = dims.vocab
        return {"dense": PhaseCosts(
            fwd=norm["fwd"] + K.cost_linear_fwd(t, h, v, n) + K.cost_cross_entropy("fwd", t, v, n),
            bwd_input=(K.cost_cross_entropy("bwd_input", t, v, n)
                       + K.cost_linear_bwd_input(t, h, v, n) + norm["bwd_input"]),
            bwd_weight=K.cost_linear_bwd_weight(t, h, v, n) + norm["bwd_weight"])}
    d, bias = dims.head_dim, layer.bias
    qkv, ctx = (dims.heads + 2 * dims.kv_heads) * d, dims.heads * d
    f = dims.ffn
    f_in = 2 * f if layer.mlp == "swiglu" else f
    mats = ((h, qkv), (ctx, h), (h, f_in), (f, h))  # (in, out) of the four matmuls
    fwd = (2 * norm["fwd"] + 2 * _residual(t, h, n) + K.cost_activation(layer.mlp, "fwd", t, f, n)
           + K.total(K.cost_linear_fwd(t, i, o, n, bias) for i, o in mats))
    bwd_in = (2 * norm["bwd_input"] + 2 * _residual(t, h, n)
              + K.cost_activation(layer.mlp, "bwd", t, f, n)
              + K.total(K.cost_linear_bwd_input(t, i, o, n) for i, o in mats))
    bwd_w = (2 * norm["bwd_weight"]
             + K.total(K.cost_linear_bwd_weight(t, i, o, n, bias) for i, o in mats))
    return {"dense": PhaseCosts(fwd, bwd_in, bwd_w),
            "attention": attention_costs(b, s, dims.heads, dims.kv_heads, d, n)}


def working_set_bytes(layer: Layer, micro_batch: int, seq_len: int, tp: int = 1,
                      itemsize: int = 4, part: str = "dense", tiles: int = 1) -> float:
    """Rough peak memory of an executor (weights, gradients, kept activations, temporaries),
    its weights held as ``tiles`` column tiles (planner/profiling/tiled.py)."""
    dims = shard_dims(layer, tp)
    t, h, n = micro_batch * seq_len, dims.hidden, itemsize
    if part == "attention":
        ss = micro_batch * dims.heads * seq_len * seq_len
        return n * (3 * ss + 8 * t * (dims.heads + 2 * dims.kv_heads) * dims.head_dim)
    if layer.kind == "embedding":
        rows = T.tile_columns(dims.vocab, tiles)
        rows += max(layer.position_embeddings, seq_len) if layer.position_embeddings else 0
        return n * (2 * rows * h + 4 * t * h) + 8 * t  # int64 token ids
    if layer.kind == "linear":
        out = dims.out_features
        return n * (2 * h * T.tile_columns(out, tiles) + 3 * t * (h + out))
    if layer.kind == "head":
        return (n * (2 * h * T.tile_columns(dims.vocab, tiles) + 4 * t * dims.vocab + 6 * t * h)
                + 8 * t)  # int64 labels
    weights = (layer.params / tp) * 2 / tiles
    acts = t * (14 * h + 3 * (dims.heads + 2 * dims.kv_heads) * dims.head_dim + 8 * dims.ffn)
    ss = micro_batch * dims.heads * seq_len * seq_len
    return n * (weights + acts + 3 * ss + seq_len * seq_len) + seq_len * seq_len  # + the mask


# --- executors ------------------------------------------------------------------------------------

def _fill(xp, shape, dtype, seed: int, scale: float = 1.0):
    """A cheap pseudo-random array: a small random pattern tiled (generating gigabytes of true
    random numbers would take longer than the measurement; the values do not change the speed)."""
    size = int(np.prod(shape))
    base = np.random.default_rng(seed).standard_normal(min(size, 65521)).astype(np.float32)
    base = xp.asarray(base * scale, dtype=dtype)
    reps = -(-size // base.size)
    return xp.tile(base, reps)[:size].reshape(shape)


class Executor:
    """Buffers and the three passes of one layer on one rank; mutable by nature (it owns arrays).

    After ``forward``: ``out``. After ``backward_input``: ``dx``. After ``backward_weight``:
    ``grads`` (same keys as ``params``). ``dy`` is the fixed output gradient fed to the backward.
    ``clock`` times the attention core inside a block under the name "attention".
    """

    def __init__(self, xp, dtype, clock: Clock | None, tiles: int = 1):
        self.xp, self.dtype = xp, np.dtype(dtype)
        self.clock = clock or Clock(xp)
        self.tiles = tiles  # weight matrices held as one column tile of 1 / tiles (tiled.py)
        self.params: dict = {}
        self.grads: dict = {}
        self.widths: dict = {}  # a tiled weight's full column count
        self.out = self.dx = None

    def _param(self, name, shape, seed, scale=0.02, fill=None, tiled=False):
        xp = self.xp
        if tiled:
            self.widths[name] = shape[1]
            shape = (shape[0], T.tile_columns(shape[1], self.tiles))
        value = xp.full(shape, fill, dtype=self.dtype) if fill is not None else \
            _fill(xp, shape, self.dtype, seed, scale)
        self.params[name] = value
        self.grads[name] = xp.zeros(shape, dtype=self.dtype)
        return value

    def _fwd(self, name, x, b=None):
        return T.linear_fwd(x, self.params[name], self.widths[name], b)

    def _bwd_input(self, name, dy):
        return T.linear_bwd_input(dy, self.params[name])

    def _bwd_weight(self, name, x, dy, bias=False):
        return T.linear_bwd_weight(x, dy, self.grads[name], bias)

    def forward(self):
        raise NotImplementedError

    def backward_input(self):
        raise NotImplementedError

    def backward_weight(self):
        raise NotImplementedError


def _norm_fwd(kind, x, gamma, beta):
    return K.layernorm_fwd(x, gamma, beta) if kind == "layernorm" else K.rmsnorm_fwd(x, gamma)


def _norm_bwd_input(kind, dy, gamma, cache):
    if kind == "layernorm":
        return K.layernorm_bwd_input(dy, gamma, cache)
    return K.rmsnorm_bwd_input(dy, gamma, cache)


class BlockExecutor(Executor):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.)); fused QKV and, for
    SwiGLU, fused gate/up matmuls (as Megatron-LM does)."""

    def __init__(self, layer: Layer, b: int, s: int, tp: int, xp, dtype, clock=None, tiles=1):
        super().__init__(xp, dtype, clock, tiles)
        dims = shard_dims(layer, tp)
        self.layer, self.dims, self.b, self.s = layer, dims, b, s
        h, d = dims.hidden, dims.head_dim
        qkv, ctx = (dims.heads + 2 * dims.kv_heads) * d, dims.heads * d
        f_in = 2 * dims.ffn if layer.mlp == "swiglu" else dims.ffn
        self.layernorm = layer.norm == "layernorm"
        for i in (1, 2):
            self._param(f"norm{i}.gamma", (h,), 0, fill=1.0)
            if self.layernorm:
                self._param(f"norm{i}.beta", (h,), 0, fill=0.0)
        shapes = {"qkv": (h, qkv), "proj": (ctx, h), "fc1": (h, f_in), "fc2": (dims.ffn, h)}
        for seed, (name, shape) in enumerate(shapes.items(), start=1):
            self._param(f"{name}.w", shape, seed, tiled=True)
            if layer.bias:
                self._param(f"{name}.b", (shape[1],), seed, fill=0.0)
        self.x = _fill(xp, (b, s, h), self.dtype, 11)
        self.dy = _fill(xp, (b, s, h), self.dtype, 12)
        self.mask = K.causal_mask_bias(s, xp, self.dtype)
        self.dqkv = xp.empty((b, s, dims.heads + 2 * dims.kv_heads, d), dtype=self.dtype)

    def _p(self, name):
        return self.params.get(name)

    def forward(self):
        p, norm, dims = self._p, self.layer.norm, self.dims
        n1, self.c1 = _norm_fwd(norm, self.x, p("norm1.gamma"), p("norm1.beta"))
        qkv = self._fwd("qkv.w", n1, p("qkv.b"))
        q4 = qkv.reshape(self.b, self.s, dims.heads + 2 * dims.kv_heads, dims.head_dim)
        hq, g = dims.heads, dims.kv_heads
        self.clock.start("attention")
        ctx, self.ac = K.attention_fwd(q4[:, :, :hq], q4[:, :, hq:hq + g], q4[:, :, hq + g:],
                                       self.mask)
        self.clock.stop("attention")
        x1 = self.x + self._fwd("proj.w", ctx, p("proj.b"))
        n2, self.c2 = _norm_fwd(norm, x1, p("norm2.gamma"), p("norm2.beta"))
        self.u = self._fwd("fc1.w", n2, p("fc1.b"))
        self.a = K.swiglu_fwd(self.u) if self.layer.mlp == "swiglu" else K.gelu_fwd(self.u)
        x1 += self._fwd("fc2.w", self.a, p("fc2.b"))
        self.n1, self.ctx, self.n2, self.out = n1, ctx, n2, x1
        return x1

    def backward_input(self):
        p, norm = self._p, self.layer.norm
        da = self._bwd_input("fc2.w", self.dy)
        if self.layer.mlp == "swiglu":
            self.du = K.swiglu_bwd(da, self.u)
        else:
            self.du = K.gelu_bwd(da, self.u)
        self.dn2 = self._bwd_input("fc1.w", self.du)
        dx1 = _norm_bwd_input(norm, self.dn2, p("norm2.gamma"), self.c2)
        dx1 += self.dy
        dctx = self._bwd_input("proj.w", dx1)
        self.clock.start("attention")
        K.attention_bwd(dctx, self.ac, self.dqkv)
        self.clock.stop("attention")
        self.dn1 = self._bwd_input("qkv.w", self.dqkv.reshape(self.b, self.s, -1))
        dx = _norm_bwd_input(norm, self.dn1, p("norm1.gamma"), self.c1)
        dx += dx1
        self.dx1, self.dx = dx1, dx
        return dx

    def backward_weight(self):
        g, bias = self.grads, self.layer.bias
        pairs = (("qkv", self.n1, self.dqkv.reshape(self.b, self.s, -1)), ("proj", self.ctx, self.dx1),
                 ("fc1", self.n2, self.du), ("fc2", self.a, self.dy))
        for name, x, dy in pairs:
            _, db = self._bwd_weight(f"{name}.w", x, dy, bias)
            if bias:
                g[f"{name}.b"][...] = db
        for i, (dn, cache) in enumerate(((self.dn1, self.c1), (self.dn2, self.c2)), start=1):
            dgamma, dbeta = K.norm_bwd_weight(dn, cache, self.layernorm)
            g[f"norm{i}.gamma"][...] = dgamma
            if self.layernorm:
                g[f"norm{i}.beta"][...] = dbeta


class AttentionExecutor(Executor):
    """The attention core alone (scores, softmax, weighted sum) for given per-rank head counts."""

    def __init__(self, b: int, s: int, heads: int, kv_heads: int, head_dim: int, xp, dtype,
                 clock=None):
        super().__init__(xp, dtype, clock)
        self.heads, self.kv = heads, kv_heads
        self.qkv = _fill(xp, (b, s, heads + 2 * kv_heads, head_dim), self.dtype, 21)
        self.dy = _fill(xp, (b, s, heads * head_dim), self.dtype, 22)
        self.mask = K.causal_mask_bias(s, xp, self.dtype)
        self.dqkv = xp.empty_like(self.qkv)

    def forward(self):
        h, g = self.heads, self.kv
        self.out, self.cache = K.attention_fwd(self.qkv[:, :, :h], self.qkv[:, :, h:h + g],
                                               self.qkv[:, :, h + g:], self.mask)
        return self.out

    def backward_input(self):
        K.attention_bwd(self.dy, self.cache, self.dqkv)
        self.dx = self.dqkv
        return self.dx

    def backward_weight(self):
        return None


class EmbeddingExecutor(Executor):
    """Token (vocab-parallel shard) and optional learned position embedding."""

    def __init__(self, layer: Layer, b: int, s: int, tp: int, xp, dtype, clock=None, tiles=1):
        super().__init__(xp, dtype, clock, tiles)
        dims = shard_dims(layer, tp)
        # tiled: 1 / tiles of the rows and of the ids' range; the same gather and scatter work
        rows = T.tile_columns(dims.vocab, tiles)
        self._param("tokens", (rows, dims.hidden), 31)
        self.pos = None
        if layer.position_embeddings:
            self.pos = self._param("positions", (max(layer.position_embeddings, s), dims.hidden), 32)
        ids = np.random.default_rng(33).integers(0, -(-layer.vocab_size // tiles), size=(b, s))
        self.ids = xp.asarray(ids)
        self.dy = _fill(xp, (b, s, dims.hidden), self.dtype, 34)

    def forward(self):
        self.out = K.embedding_fwd(self.ids, self.params["tokens"], positions=self.pos)
        return self.out

    def backward_input(self):
        return None  # token ids have no gradient

    def backward_weight(self):
        K.embedding_bwd_weight(self.dy, self.ids, self.grads["tokens"],
                               grad_positions=self.grads.get("positions"))


class HeadExecutor(Executor):
    """Final norm, output projection to the (vocab-parallel) logits and softmax cross-entropy."""

    def __init__(self, layer: Layer, b: int, s: int, tp: int, xp, dtype, clock=None, tiles=1):
        super().__init__(xp, dtype, clock, tiles)
        dims = shard_dims(layer, tp)
        self.layer, self.t = layer, b * s
        self.layernorm = layer.norm == "layernorm"
        self._param("norm.gamma", (dims.hidden,), 0, fill=1.0)
        if self.layernorm:
            self._param("norm.beta", (dims.hidden,), 0, fill=0.0)
        self._param("out.w", (dims.hidden, dims.vocab), 41, tiled=True)
        self.x = _fill(xp, (b * s, dims.hidden), self.dtype, 42)
        self.labels = xp.asarray(np.random.default_rng(43).integers(0, dims.vocab, size=b * s))
        self.dlogits = xp.empty((b * s, dims.vocab), dtype=self.dtype)
        self.dy = None  # the loss is the output: its gradient is 1

    def forward(self):
        p = self.params
        self.n, self.c = _norm_fwd(self.layer.norm, self.x, p["norm.gamma"], p.get("norm.beta"))
        logits = self._fwd("out.w", self.n)
        self.out, self.probs = K.cross_entropy_fwd(logits, self.labels)
        return self.out

    def backward_input(self):
        p = self.params
        K.cross_entropy_bwd(self.probs, self.labels, out=self.dlogits)
        self.dn = self._bwd_input("out.w", self.dlogits)
        self.dx = _norm_bwd_input(self.layer.norm, self.dn, p["norm.gamma"], self.c)
        return self.dx

    def backward_weight(self):
        g = self.grads
        self._bwd_weight("out.w", self.n, self.dlogits)
        dgamma, dbeta = K.norm_bwd_weight(self.dn, self.c, self.layernorm)
        g["norm.gamma"][...] = dgamma
        if self.layernorm:
            g["norm.beta"][...] = dbeta


class LinearExecutor(Executor):
    """A plain linear layer hidden_size -> out_features (column-parallel under TP)."""

    def __init__(self, layer: Layer, b: int, s: int, tp: int, xp, dtype, clock=None, tiles=1):
        super().__init__(xp, dtype, clock, tiles)
        dims = shard_dims(layer, tp)
        self.bias = layer.bias
        self._param("w", (dims.hidden, dims.out_features), 51, tiled=True)
        if layer.bias:
            self._param("b", (dims.out_features,), 0, fill=0.0)
        self.x = _fill(xp, (b, s, dims.hidden), self.dtype, 52)
        self.dy = _fill(xp, (b, s, dims.out_features), self.dtype, 53)

    def forward(self):
        self.out = self._fwd("w", self.x, self.params.get("b"))
        return self.out

    def backward_input(self):
        self.dx = self._bwd_input("w", self.dy)
        return self.dx

    def backward_weight(self):
        _, db = self._bwd_weight("w", self.x, self.dy, self.bias)
        if self.bias:
            self.grads["b"][...] = db


_EXECUTORS = {"block": BlockExecutor, "embedding": EmbeddingExecutor, "head": HeadExecutor,
              "linear": LinearExecutor}


def build_executor(layer: Layer, micro_batch: int, seq_len: int, tp: int = 1, xp=np,
                   dtype="float32", clock: Clock | None = None, tiles: int = 1) -> Executor:
    """The executor of a layer at a (micro_batch, seq_len, tp) shape, buffers allocated, its
    weights held as ``tiles`` column tiles (planner/profiling/tiled.py)."""
    return _EXECUTORS[layer.kind](layer, micro_batch, seq_len, tp, xp, dtype, clock, tiles)
