"""HuggingFace ``config.json`` -> the fields of a :class:`~planner.model.spec.ModelSpec`, faithful
to what the config declares.

Floor 1 (model/). spec.py's loader recognises a HuggingFace config, builds the spec from the fields
read here and checks it (spec.py imports this module, never the reverse). A config is read by its
``model_type``: the Llama-layout decoders (Llama, Mistral, Qwen2/3, Phi-3/4, OLMo 2, Gemma 1/2/3)
through one table of what each family adds, GPT-2, GPT-NeoX and Falcon by their own keys. What
changes the planned cost is carried (``head_dim``, Q/K norms, extra block norms, QKV biases, tied
embeddings); what an exporter needs is carried as declared (``rope_theta``, ``rope_scaling``,
``max_position_embeddings``); what the cost model cannot represent is refused in one line naming
the feature (vision towers, attention or MLP biases on a family planned without them; MoE
families: moe_import.py), and a sliding window is refused where it is shorter than the planned
sequence (``ModelSpec.with_seq_length``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import PlanInputError

# The sequence length planned when a config declares a longer context and --seq-len is not
# given. 8,192 is the sequence length Llama 3 was pre-trained on before its final long-context
# stage (Llama 3 herd paper, §3.4.1 and §3.4.2); it is a planning default chosen for usefulness
# (a 131,072- or 1,024,000-token sequence needs context parallelism, which plan3d does not plan),
# not a property of any model, and spec.sequence_note() prints it whenever it applies.
PLANNING_SEQ_CAP = 8192


@dataclass(frozen=True)
class _Family:
    """How one Llama-layout ``model_type`` differs from Llama (defaults as transformers' config
    class for that type sets them, where the config file omits the key)."""

    tie: bool = False  # tie_word_embeddings default
    qkv_bias: bool = False  # biases on Q, K and V only (Qwen2)
    qk_norm: str = ""  # "head": RMSNorm over head_dim (Qwen3, Gemma 3); "full": over Q and K
    block_norms: int = 2  # Gemma 2/3 norm before and after both sublayers: 4
    head_dim: int = 0  # default head_dim when the key is absent (Gemma: 256); 0: hidden / heads
    sliding_window: int = 0  # default window when the key is absent (MistralConfig: 4096)
    window_flag: str = ""  # a key that must be true for the window to apply (Qwen)


FAMILIES: dict[str, _Family] = {
    "llama": _Family(),
    "mistral": _Family(sliding_window=4096),
    "qwen2": _Family(qkv_bias=True, window_flag="use_sliding_window"),
    "qwen3": _Family(qk_norm="head", window_flag="use_sliding_window"),
    "phi3": _Family(),
    "olmo2": _Family(qk_norm="full"),  # norms after each sublayer instead of before: same count
    "gemma": _Family(tie=True, head_dim=256),
    "gemma2": _Family(tie=True, block_norms=4, head_dim=256, sliding_window=4096),
    "gemma3_text": _Family(tie=True, qk_norm="head", block_norms=4, head_dim=256,
                           sliding_window=4096),
}

# Mixture-of-experts families: model/moe_import.py reads them (on top of llama_layout) and
# model/load.py sends them there.
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")

_MULTIMODAL_KEYS = ("vision_config", "audio_config")


def require(data: dict, origin: str, *keys: str):
    """The first of ``keys`` the config sets, or one line naming the missing key."""
    for key in keys:
        if key in data and data[key] is not None:
            return data[key]
    raise PlanInputError(f"{origin}: missing '{keys[0]}'; add it to the model file")


def huggingface_fields(data: dict, origin: str) -> dict:
    """A parsed HuggingFace config.json -> the ModelSpec fields it declares, or one clear
    PlanInputError naming what cannot be planned."""
    kind = str(data.get("model_type", "")).lower()
    vision = [k for k in _MULTIMODAL_KEYS if k in data]
    if vision:
        raise PlanInputError(
            f"{origin}: a multimodal model ({vision[0]}: a vision or audio tower); plan3d plans the "
            "text decoder only: save its text_config as a config.json and plan that")
    if kind in FAMILIES:
        return llama_layout(data, origin, kind, FAMILIES[kind])
    if kind in _OTHERS:
        return _OTHERS[kind](data, origin)
    raise PlanInputError(
        f"{origin}: model_type '{kind}' is not supported; supported HuggingFace families: "
        f"{', '.join([*FAMILIES, *MOE_FAMILIES, *_OTHERS])} (or write a plan3d model.json)")


def _name(data: dict, origin: str, kind: str) -> str:
    """The config's own name, else a checkpoint folder's name for its config.json, else the file's
    (or the origin's) name."""
    path = Path(origin)
    if path.name == "config.json" and path.parent.name:
        fallback = path.parent.name
    else:
        fallback = path.stem if path.suffix == ".json" else path.name
    return str(data.get("_name_or_path") or data.get("name") or fallback or kind)


def _context(data: dict, fallback: int = 2048) -> tuple[int, int]:
    """(declared context, planning default): max_position_embeddings, and that capped at
    PLANNING_SEQ_CAP."""
    declared = data.get("max_position_embeddings") or data.get("n_positions") or 0
    if declared and not isinstance(declared, int):
        declared = 0  # not a usable count: plan the fallback, declare nothing
    return declared, min(declared or fallback, PLANNING_SEQ_CAP)


def _rope(data: dict) -> dict:
    scaling = data.get("rope_scaling")
    return dict(rope_theta=data.get("rope_theta", 10000.0),
                rope_scaling=dict(scaling) if isinstance(scaling, dict) else None)


def _refuse_flags(data: dict, origin: str, kind: str, *keys: str) -> None:
    for key in keys:
        if data.get(key):
            raise PlanInputError(
                f"{origin}: {key} = true on a {kind} model is not modelled (plan3d counts no "
                "biases on this family's attention and MLP); write a plan3d model.json with "
                "\"bias\": true to plan it with every bias")


def llama_layout(data: dict, origin: str, kind: str, fam: _Family) -> dict:
    """Pre-norm decoder blocks with RoPE, a gated MLP (SwiGLU; Gemma's GeGLU has its shapes) and
    RMSNorm, no biases unless the family has them; what each family adds comes from FAMILIES."""
    _refuse_flags(data, origin, kind, "attention_bias", "mlp_bias")
    heads = require(data, origin, "num_attention_heads")
    hidden = require(data, origin, "hidden_size")
    window = data.get("sliding_window", fam.sliding_window) or 0
    if fam.window_flag and not data.get(fam.window_flag):
        window = 0
    declared, seq = _context(data)
    return dict(
        name=_name(data, origin, kind), num_layers=require(data, origin, "num_hidden_layers"),
        hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=data.get("num_key_value_heads") or heads,
        head_dim=data.get("head_dim") or fam.head_dim,
        ffn_hidden_size=require(data, origin, "intermediate_size"),
        vocab_size=require(data, origin, "vocab_size"), seq_length=seq,
        max_position_embeddings=declared, mlp="swiglu", norm="rmsnorm", bias=False,
        qkv_bias=fam.qkv_bias, qk_norm=fam.qk_norm, block_norms=fam.block_norms,
        tie_embeddings=bool(data.get("tie_word_embeddings", fam.tie)),
        dropout=bool(data.get("attention_dropout", 0.0)), sliding_window=window, **_rope(data))


def _gpt2(data: dict, origin: str) -> dict:
    # GPT-2: learned positions, GeLU MLP 4h, LayerNorm, biases, tied (Radford et al. 2019).
    hidden = require(data, origin, "n_embd", "hidden_size")
    heads = require(data, origin, "n_head")
    declared, seq = _context(data, 1024)
    return dict(
        name=_name(data, origin, "gpt2"),
        num_layers=require(data, origin, "n_layer", "num_hidden_layers"), hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=heads,
        ffn_hidden_size=data.get("n_inner") or 4 * hidden,
        vocab_size=require(data, origin, "vocab_size"), seq_length=seq,
        max_position_embeddings=declared, mlp="gelu", norm="layernorm", bias=True,
        tie_embeddings=True, position_embeddings=declared or seq)


def _gpt_neox(data: dict, origin: str) -> dict:
    heads = require(data, origin, "num_attention_heads")
    declared, seq = _context(data)
    return dict(
        name=_name(data, origin, "gpt_neox"),
        num_layers=require(data, origin, "num_hidden_layers"),
        hidden_size=require(data, origin, "hidden_size"), num_attention_heads=heads,
        num_kv_heads=heads, ffn_hidden_size=require(data, origin, "intermediate_size"),
        vocab_size=require(data, origin, "vocab_size"), seq_length=seq,
        max_position_embeddings=declared, mlp="gelu", norm="layernorm", bias=True,
        tie_embeddings=bool(data.get("tie_word_embeddings", False)),
        rope_theta=data.get("rotary_emb_base", data.get("rope_theta", 10000.0)),
        rope_scaling=_rope(data)["rope_scaling"])


def _falcon(data: dict, origin: str) -> dict:
    hidden = require(data, origin, "hidden_size")
    heads = require(data, origin, "num_attention_heads", "n_head")
    if data.get("new_decoder_architecture"):
        kv = data.get("num_kv_heads") or data.get("n_head_kv") or heads
    else:
        kv = 1 if data.get("multi_query", True) else heads
    declared, seq = _context(data)
    return dict(
        name=_name(data, origin, "falcon"),
        num_layers=require(data, origin, "num_hidden_layers", "n_layer"), hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=kv,
        ffn_hidden_size=data.get("ffn_hidden_size") or 4 * hidden,
        vocab_size=require(data, origin, "vocab_size"), seq_length=seq,
        max_position_embeddings=declared, mlp="gelu", norm="layernorm",
        bias=bool(data.get("bias", False)),
        tie_embeddings=bool(data.get("tie_word_embeddings", True)),
        **(dict(rope_theta=None) if data.get("alibi") else _rope(data)))


_OTHERS = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, "falcon": _falcon, "refinedweb": _falcon,
           "refinedwebmodel": _falcon}
