"""The decoder a plan.json describes, as a torch module whose submodule names are the plan's.

plan.json v2 names every layer's modules (``tok_embeddings``, ``layers.<i>``, ``norm`` +
``output``, the names torchtitan's Llama uses); :func:`build_decoder` makes a module with exactly
those names from the ``model`` block, and :func:`stage_module` keeps only the modules of one stage,
so a stage's forward takes token ids (first stage) or hidden states (any other) and returns hidden
states or logits (the loss stage). Dropout is not built: a reference run must be deterministic.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from planner.core.errors import PlanInputError

NORM_EPS = 1e-5
ROPE_BASE = 10000.0  # RoPE's theta (Su et al. 2021, RoFormer eq. 15); plan.json carries no other
INIT_STD = 0.02  # GPT-2's initialiser standard deviation; any small value gives a stable reference


def _norm(kind: str, hidden: int, bias: bool) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(hidden, eps=NORM_EPS)
    return nn.LayerNorm(hidden, eps=NORM_EPS, bias=bias)


def _rope_tables(seq: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta_i, theta_i = base^(-2i/d), each repeated for a pair."""
    inv = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + turned * sin.to(x.dtype)


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads (GQA when kv heads < heads)."""

    def __init__(self, arch: dict):
        super().__init__()
        h, bias = arch["hidden_size"], arch["bias"]
        self.heads, self.kv_heads = arch["num_attention_heads"], arch["num_kv_heads"]
        self.head_dim = h // self.heads
        self.wq = nn.Linear(h, self.heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(self.heads * self.head_dim, h, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope[0][:s], rope[1][:s]
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x), Shazeer 2020) or GeLU MLP (w2(gelu(w1 x)))."""

    def __init__(self, arch: dict):
        super().__init__()
        h, f, bias = arch["hidden_size"], arch["ffn_hidden_size"], arch["bias"]
        self.swiglu = arch["mlp"] == "swiglu"
        self.w1 = nn.Linear(h, f, bias=bias)
        self.w3 = nn.Linear(h, f, bias=bias) if self.swiglu else None
        self.w2 = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, arch: dict):
        super().__init__()
        self.attention_norm = _norm(arch["norm"], arch["hidden_size"], arch["bias"])
        self.attention = Attention(arch)
        self.ffn_norm = _norm(arch["norm"], arch["hidden_size"], arch["bias"])
        self.feed_forward = FeedForward(arch)

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    """Embedding, blocks ``layers.<i>``, final ``norm`` and ``output``; any may be pruned to None
    (a pipeline stage), and forward runs whatever is left in order."""

    def __init__(self, arch: dict, num_blocks: int):
        super().__init__()
        h = arch["hidden_size"]
        self.tok_embeddings = nn.Embedding(arch["vocab_size"], h)
        self.pos_embeddings = (nn.Embedding(arch["position_embeddings"], h)
                               if arch["position_embeddings"] else None)
        self.embedding_norm = (_norm(arch["norm"], h, arch["bias"])
                               if arch["embedding_norm"] else None)
        self.layers = nn.ModuleDict({str(i): Block(arch) for i in range(num_blocks)})
        self.norm = _norm(arch["norm"], h, arch["bias"])
        self.output = nn.Linear(h, arch["vocab_size"], bias=False)
        self.rope = (_rope_tables(arch["seq_length"], h // arch["num_attention_heads"])
                     if arch["position_embedding"] == "rope" else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            tokens = x
            x = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                x = x + self.pos_embeddings(torch.arange(tokens.shape[1]))
            if self.embedding_norm is not None:
                x = self.embedding_norm(x)
        for block in self.layers.values():
            x = block(x, self.rope)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x


def _arch(doc: dict) -> dict:
    if doc.get("schema") != "plan3d/plan/v2":
        raise PlanInputError(f"the engine reads plan3d/plan/v2 plan files, this one is "
                             f"{doc.get('schema')!r}; export it again with plan solve --export json")
    arch = doc["model"]
    kinds = [layer["kind"] for layer in doc["layers"]]
    if kinds[0] != "embedding" or kinds[-1] != "head" or set(kinds[1:-1]) - {"block"}:
        raise PlanInputError("the reference decoder builds embedding, blocks, head models only; "
                             f"this plan's layers are {sorted(set(kinds))}")
    if arch.get("mtp_layers"):
        raise PlanInputError("the reference decoder builds no multi-token prediction modules; "
                             "this plan's model has mtp_layers "
                             f"{arch['mtp_layers']}: plan it without them to run it here")
    if arch["tie_embeddings"]:
        raise PlanInputError("the reference decoder does not tie embeddings (a tied head on "
                             "another stage needs a gradient all-reduce the engine does not do)")
    return arch


def build_decoder(doc: dict, seed: int = 0, dtype: torch.dtype = torch.float64) -> Decoder:
    """The whole model of a plan.json v2 document, initialised from ``seed`` (same on every rank)."""
    arch = _arch(doc)
    torch.manual_seed(seed)
    model = Decoder(arch, sum(1 for layer in doc["layers"] if layer["kind"] == "block"))
    for name, param in model.named_parameters():
        if param.dim() == 2:  # embeddings and projections; norms keep weight 1, biases 0
            nn.init.normal_(param, std=INIT_STD)
    return model.to(dtype)


def stage_module(model: Decoder, modules: list[str]) -> Decoder:
    """A copy of ``model`` keeping only ``modules`` (the stage's names from plan.json)."""
    keep = set(modules)
    known = {"tok_embeddings", "pos_embeddings", "embedding_norm", "norm", "output",
             *(f"layers.{i}" for i in model.layers)}
    unknown = keep - known
    if unknown:
        raise PlanInputError(f"plan.json names modules the decoder does not have: "
                             f"{sorted(unknown)}")
    stage = copy.deepcopy(model)
    for name in ("tok_embeddings", "pos_embeddings", "embedding_norm", "norm", "output"):
        if name not in keep:
            setattr(stage, name, None)
    for i in list(stage.layers):
        if f"layers.{i}" not in keep:
            del stage.layers[i]
    return stage


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one microbatch."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
