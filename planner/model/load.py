"""Reading a model: a preset name, our model.json (uniform or with explicit `layers`), or a
HuggingFace config.json; every field checked, one line on error."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from planner.model.presets import ALIASES, DEFAULT_MODEL, PRESETS
from planner.model.spec import Layer, ModelSpec
from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.core.schema import suggestion
from planner.core.text import check_name
from planner.core.units import DATA_DIR
from planner.model.huggingface import MOE_FAMILIES, huggingface_fields
from planner.model.moe_import import moe_fields
from planner.model.schema import LAYER_KINDS, check_model_document


_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
             "num_experts_per_tok", "moe_intermediate_size")


# The mixture-of-experts presets: HuggingFace config.json files as released (profiles/models/),
# read as a user's config would be. mixtral-8x7b.json is transformers' MixtralConfig defaults,
# which its docstring ties to "mistralai/Mixtral-8x7B-v0.1" (huggingface/transformers
# src/transformers/models/mixtral/configuration_mixtral.py, commit 008e5743); mixtral-8x22b.json
# is the released mistral-community/Mixtral-8x22B-v0.1 config.json as we read it (56 blocks of
# 6,144 wide, 48 heads over 8 KV heads, eight 16,384-wide SwiGLU experts, top 2, a 32,000 vocabulary,
# 64K positions), whose count tests/test_moe_presets.py checks against Mistral's "39B active
# parameters out of 141B" (mistral.ai/news/mixtral-8x22b); the Qwen3 and
# DeepSeek-V3 files are the ones the MoE validation cases use (profiles/validation/configs/).
MOE_PRESETS_DIR = DATA_DIR / "models"


def moe_preset_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in MOE_PRESETS_DIR.glob("*.json")))


@lru_cache(maxsize=None)
def _moe_preset(name: str) -> ModelSpec:
    path = MOE_PRESETS_DIR / f"{name}.json"
    return replace(model_from_dict(read_json(path, "model file"), origin=str(path)), name=name)


def presets() -> dict[str, ModelSpec]:
    """Every preset, dense then mixture-of-experts, by name (`plan models`)."""
    return {**PRESETS, **{name: _moe_preset(name) for name in moe_preset_names()}}


def load_model(source: str | Path | None) -> ModelSpec:
    """A preset name, our model.json, or a HuggingFace config.json -> ModelSpec."""
    if source is None:
        return PRESETS[DEFAULT_MODEL]
    text = str(source)
    key = text.lower().strip()
    if key in PRESETS or key in ALIASES:
        return PRESETS[ALIASES.get(key, key)]
    if key in moe_preset_names():
        return _moe_preset(key)
    path = Path(text)
    if not path.exists():
        known = [*PRESETS, *ALIASES, *moe_preset_names()]
        raise PlanInputError(f"unknown model '{text}'{suggestion(key, known)}: "
                             "not a file and not a preset; `plan models` lists the presets")
    data = read_json(path, "model file")
    spec = model_from_dict(data, origin=str(path))
    check_name(spec.name, f"{path}: the model name (its 'name', or the file name)")
    return spec


def model_from_dict(data: dict, origin: str = "model") -> ModelSpec:
    """Recognise our model.json or a HuggingFace config.json and build the spec."""
    check_model_document(data, origin)  # types, ranges, unknown keys: model/schema.py
    if "model_type" in data or "architectures" in data:
        moe = [k for k in _MOE_KEYS if data.get(k) not in (None, 0, 1)]
        kind = str(data.get("model_type", "")).lower()
        if moe and kind not in MOE_FAMILIES:
            raise PlanInputError(
                f"{origin}: a mixture-of-experts model ({moe[0]}={data[moe[0]]}) of model_type "
                f"'{kind}'; plan3d imports MoE configs of {', '.join(MOE_FAMILIES)} only and will "
                "not plan it as dense (or write a plan3d model.json with num_experts)")
        if kind in MOE_FAMILIES:
            return _built(ModelSpec, origin, **moe_fields(data, origin, kind))
        return _built(ModelSpec, origin, **huggingface_fields(data, origin))
    return _from_ours(data, origin)


def _require(data: dict, origin: str, *keys: str):
    for key in keys:
        if key in data and data[key] is not None:
            return data[key]
    raise PlanInputError(f"{origin}: missing '{keys[0]}'; add it to the model file")


def _positive(origin: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PlanInputError(f"{origin}: '{name}' must be a positive integer, got {value!r}")


def _built(cls, origin: str, **values):
    """``cls(**values)`` (a ModelSpec or a Layer, which check their own fields), its refusal
    naming the file."""
    try:
        return cls(**values)
    except PlanInputError as e:
        raise PlanInputError(f"{origin}: {e}") from None


def _from_ours(data: dict, origin: str) -> ModelSpec:
    heads = _require(data, origin, "num_attention_heads")
    hidden = _require(data, origin, "hidden_size")
    mlp = data.get("mlp", "gelu")
    seq = _require(data, origin, "seq_length")
    base = dict(
        name=str(data.get("name", Path(origin).stem)),
        num_layers=0 if "layers" in data else _require(data, origin, "num_layers"),
        hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=data.get("num_kv_heads", heads),
        ffn_hidden_size=data.get("ffn_hidden_size", 4 * hidden if isinstance(hidden, int) else 0),
        vocab_size=_require(data, origin, "vocab_size"), seq_length=seq, mlp=mlp,
        norm=data.get("norm", "rmsnorm" if mlp == "swiglu" else "layernorm"),
        bias=bool(data.get("bias", mlp != "swiglu")),
        tie_embeddings=bool(data.get("tie_embeddings", False)),
        position_embeddings=int(data.get("position_embeddings", 0)),
        # unless the file says otherwise dropout is on: the conservative choice (its masks cost
        # memory)
        dropout=bool(data.get("dropout", True)),
        embedding_norm=bool(data.get("embedding_norm", False)),
        head_dim=data.get("head_dim", 0), qkv_bias=bool(data.get("qkv_bias", False)),
        qk_norm=data.get("qk_norm", ""), block_norms=data.get("block_norms", 2),
        rope_theta=data.get("rope_theta"), rope_scaling=data.get("rope_scaling"),
        max_position_embeddings=data.get("max_position_embeddings", 0),
        sliding_window=data.get("sliding_window", 0),
        make_vocab_size_divisible_by=data.get("make_vocab_size_divisible_by", 128),
        **{k: data.get(k, 0) for k in _MOE_INTS}, dense_layers=_dense_layers(data, origin),
        shared_expert_gate=bool(data.get("shared_expert_gate", False)),
        router_bias=bool(data.get("router_bias", False)),
        router_aux_loss=data.get("router_aux_loss", 0.0),
        router_aux_loss_per_sequence=bool(data.get("router_aux_loss_per_sequence", False)),
        mtp_layers=data.get("mtp_layers", 0),
    )
    if "layers" in data and base["mtp_layers"]:
        raise PlanInputError(f"{origin}: mtp_layers adds modules to the standard embedding, "
                             "blocks, head sequence; an explicit 'layers' list cannot take it")
    if "layers" not in data:
        return _built(ModelSpec, origin, **base)
    layers = _explicit_layers(data["layers"], base, origin)
    base["num_layers"] = sum(1 for layer in layers if layer.kind == "block")
    return _built(ModelSpec, origin, **base, layers=layers)


_MOE_INTS = ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "shared_ffn_hidden_size",
              "moe_groups", "moe_group_top_k", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _dense_layers(data: dict, origin: str) -> tuple[int, ...]:
    value = data.get("dense_layers", [])
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise PlanInputError(f"{origin}: 'dense_layers' must be a list of block indices (from 0)")
    return tuple(sorted(set(value)))


def _explicit_layers(entries, base: dict, origin: str) -> tuple[Layer, ...]:
    """An explicit sequential model: [{"kind": "block", "repeat": 24, ...overrides}, ...]."""
    if not isinstance(entries, list) or not entries:
        raise PlanInputError(f"{origin}: 'layers' must be a non-empty list of layer objects")
    defaults = dict(hidden_size=base["hidden_size"], num_attention_heads=base["num_attention_heads"],
                    num_kv_heads=base["num_kv_heads"], ffn_hidden_size=base["ffn_hidden_size"],
                    mlp=base["mlp"], vocab_size=base["vocab_size"], norm=base["norm"],
                    bias=base["bias"], dropout=base["dropout"], head_dim=base["head_dim"],
                    qkv_bias=base["qkv_bias"], qk_norm=base["qk_norm"],
                    block_norms=base["block_norms"], rope=base.get("rope_theta") is not None,
                    make_vocab_size_divisible_by=base["make_vocab_size_divisible_by"])
    known = (set(Layer.__dataclass_fields__) - {"mtp_depth", "mtp_block"}) | {"repeat"}
    layers: list[Layer] = []
    for n, entry in enumerate(entries):
        where = f"{origin}: layers[{n}]"
        if not isinstance(entry, dict) or entry.get("kind") not in LAYER_KINDS:
            raise PlanInputError(f"{where}: needs 'kind', one of {', '.join(LAYER_KINDS)}")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise PlanInputError(f"{where}: unknown field '{unknown[0]}'")
        repeat = entry.get("repeat", 1)
        _positive(where, repeat=repeat)
        fields = {**defaults, **{k: v for k, v in entry.items() if k != "repeat"}}
        if fields["kind"] == "linear":
            _positive(where, out_features=fields.get("out_features"))
        layers.extend([_built(Layer, where, **fields)] * repeat)
    return tuple(layers)
