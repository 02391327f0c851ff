"""HuggingFace ``config.json`` -> the fields of a :class:`~planner.model.spec.ModelSpec`.

Floor 1 (model/). The loader in spec.py recognises a HuggingFace config and builds the spec from
the fields this module reads, so the import depends on nothing but the config (and spec.py on this
module, not the reverse).
"""

from __future__ import annotations

from pathlib import Path

from planner.core.errors import PlanInputError


def require(data: dict, origin: str, *keys: str):
    """The first of ``keys`` the config sets, or one line naming the missing key."""
    for key in keys:
        if key in data and data[key] is not None:
            return data[key]
    raise PlanInputError(f"{origin}: missing '{keys[0]}'; add it to the model file")


def huggingface_fields(data: dict, origin: str) -> dict:
    """A parsed HuggingFace config.json -> the ModelSpec fields it declares (the caller builds
    and checks the spec), or one clear PlanInputError."""
    kind = str(data.get("model_type", "")).lower()
    seq = data.get("max_position_embeddings") or data.get("n_positions") or 2048
    name = str(data.get("_name_or_path") or data.get("name") or Path(origin).parent.name or kind)
    if kind in ("llama", "mistral", "qwen2", "qwen3"):
        heads = require(data, origin, "num_attention_heads")
        return dict(
            name=name, num_layers=require(data, origin, "num_hidden_layers"),
            hidden_size=require(data, origin, "hidden_size"), num_attention_heads=heads,
            num_kv_heads=data.get("num_key_value_heads") or heads,
            ffn_hidden_size=require(data, origin, "intermediate_size"),
            vocab_size=require(data, origin, "vocab_size"), seq_length=min(seq, 8192),
            mlp="swiglu", norm="rmsnorm", bias=False,
            tie_embeddings=bool(data.get("tie_word_embeddings", False)),
            dropout=bool(data.get("attention_dropout", 0.0)))
    if kind == "gpt2":
        hidden = require(data, origin, "n_embd", "hidden_size")
        return dict(
            name=name, num_layers=require(data, origin, "n_layer", "num_hidden_layers"),
            hidden_size=hidden, num_attention_heads=require(data, origin, "n_head"),
            num_kv_heads=require(data, origin, "n_head"),
            ffn_hidden_size=data.get("n_inner") or 4 * hidden,
            vocab_size=require(data, origin, "vocab_size"), seq_length=seq, mlp="gelu",
            norm="layernorm", bias=True, tie_embeddings=True, position_embeddings=seq)
    if kind == "gpt_neox":
        heads = require(data, origin, "num_attention_heads")
        return dict(
            name=name, num_layers=require(data, origin, "num_hidden_layers"),
            hidden_size=require(data, origin, "hidden_size"), num_attention_heads=heads,
            num_kv_heads=heads, ffn_hidden_size=require(data, origin, "intermediate_size"),
            vocab_size=require(data, origin, "vocab_size"), seq_length=seq, mlp="gelu",
            norm="layernorm", bias=True,
            tie_embeddings=bool(data.get("tie_word_embeddings", False)))
    if kind in ("falcon", "refinedweb", "refinedwebmodel"):
        hidden = require(data, origin, "hidden_size")
        heads = require(data, origin, "num_attention_heads", "n_head")
        if data.get("new_decoder_architecture"):
            kv = data.get("num_kv_heads") or data.get("n_head_kv") or heads
        else:
            kv = 1 if data.get("multi_query", True) else heads
        return dict(
            name=name, num_layers=require(data, origin, "num_hidden_layers", "n_layer"),
            hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv,
            ffn_hidden_size=data.get("ffn_hidden_size") or 4 * hidden,
            vocab_size=require(data, origin, "vocab_size"), seq_length=seq, mlp="gelu",
            norm="layernorm", bias=bool(data.get("bias", False)),
            tie_embeddings=bool(data.get("tie_word_embeddings", True)))
    else:
        raise PlanInputError(
            f"{origin}: model_type '{kind}' is not supported; supported HuggingFace families: "
            "llama, mistral, qwen2, gpt2, gpt_neox, falcon (or write a plan3d model.json)")
