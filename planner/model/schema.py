"""The schemas of a model file: our model.json (and each entry of its ``layers``), and the keys of a
HuggingFace config.json that plan3d reads.

model.json is strict: an unknown key is refused with a suggestion (``num_kv_head`` would
otherwise silently plan full multi-head attention). A HuggingFace config carries dozens of keys we
do not use, so only the ones we read are checked. Sizes are capped where a larger value is no
model but a typo or an attack: more than MAX_LAYERS layers, or a dimension beyond the caps below,
would make the search and the partitioner work for minutes on nothing real.
"""

from __future__ import annotations

from planner.core.schema import (Bool, Free, Int, Name, Num, OneOf, Text, check_list,
                                 check_object, check_value)
from planner.core.limits import MAX_LAYERS
from planner.core.errors import PlanInputError

MAX_HIDDEN = 2**20  # 1,048,576; the widest published model (Megatron 1T) has 25,600
MAX_HEADS = 2**14
MAX_FFN = 2**22
MAX_VOCAB = 2**24  # 16.7M; the largest vocabularies in use are ~256k
MAX_SEQ = 2**24  # 16.7M tokens per sequence
MAX_EXPERTS = 2**14  # the most routed experts in a published model are 384 (Kimi K2)

# The words a model's string fields take, here once: model/spec.py's ModelSpec and Layer check
# themselves by these schemas too
LAYER_KINDS = ("embedding", "block", "head", "linear")
MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
QK_NORM_KINDS = ("", "head", "full")

MODEL_JSON = {
    "name": Name(),
    "num_layers": Int(1, MAX_LAYERS),
    "hidden_size": Int(1, MAX_HIDDEN, required=True),
    "num_attention_heads": Int(1, MAX_HEADS, required=True),
    "num_kv_heads": Int(1, MAX_HEADS),
    "ffn_hidden_size": Int(1, MAX_FFN),
    "vocab_size": Int(1, MAX_VOCAB, required=True),
    "seq_length": Int(1, MAX_SEQ, required=True),
    "mlp": OneOf(*MLP_KINDS),
    "norm": OneOf(*NORM_KINDS),
    "bias": Bool(),
    "tie_embeddings": Bool(),
    "position_embeddings": Int(0, MAX_SEQ),
    "dropout": Bool(),
    "embedding_norm": Bool(),
    "head_dim": Int(0, MAX_HIDDEN),
    "qkv_bias": Bool(),
    "qk_norm": OneOf(*QK_NORM_KINDS),
    "block_norms": Int(0, 16),
    "rope_theta": Num(0, 1e12, low_open=True, nullable=True),
    "rope_scaling": Free(),  # HuggingFace's own object, carried to exports as it is
    "max_position_embeddings": Int(0, MAX_SEQ),
    "sliding_window": Int(0, MAX_SEQ),
    "make_vocab_size_divisible_by": Int(1, 2**16),
    # mixture of experts and multi-head latent attention (model/spec.py ModelSpec)
    "num_experts": Int(0, MAX_EXPERTS),
    "moe_top_k": Int(0, MAX_EXPERTS),
    "moe_ffn_hidden_size": Int(0, MAX_FFN),
    "shared_ffn_hidden_size": Int(0, MAX_FFN),
    "shared_expert_gate": Bool(),
    "router_bias": Bool(),
    "router_aux_loss": Num(0, 1),  # spec.py refuses 1 itself: [0, 1)
    "router_aux_loss_per_sequence": Bool(),
    "moe_groups": Int(0, MAX_EXPERTS),
    "moe_group_top_k": Int(0, MAX_EXPERTS),
    "dense_layers": Free(),  # a list of block indices, checked by model/load.py
    "q_lora_rank": Int(0, MAX_HIDDEN),
    "kv_lora_rank": Int(0, MAX_HIDDEN),
    "qk_rope_head_dim": Int(0, MAX_HIDDEN),
    "qk_nope_head_dim": Int(0, MAX_HIDDEN),
    "v_head_dim": Int(0, MAX_HIDDEN),
    "mtp_layers": Int(0, MAX_LAYERS),  # multi-token prediction modules (DeepSeek-V3)
    "layers": Free(),
}

LAYER_ENTRY = {
    "kind": OneOf(*LAYER_KINDS, required=True),
    "repeat": Int(1, MAX_LAYERS),
    "hidden_size": Int(1, MAX_HIDDEN),
    "num_attention_heads": Int(0, MAX_HEADS),
    "num_kv_heads": Int(0, MAX_HEADS),
    "ffn_hidden_size": Int(0, MAX_FFN),
    "mlp": OneOf(*MLP_KINDS),
    "vocab_size": Int(0, MAX_VOCAB),
    "norm": OneOf(*NORM_KINDS),
    "bias": Bool(),
    "position_embeddings": Int(0, MAX_SEQ),
    "tied": Bool(),
    "out_features": Int(0, MAX_HIDDEN),
    "dropout": Bool(),
    "embedding_norm": Bool(),
    "head_dim": Int(0, MAX_HIDDEN),
    "qkv_bias": Bool(),
    "qk_norm": OneOf(*QK_NORM_KINDS),
    "block_norms": Int(0, 16),
    "rope": Bool(),
    "make_vocab_size_divisible_by": Int(1, 2**16),
    "num_experts": Int(0, MAX_EXPERTS),
    "moe_top_k": Int(0, MAX_EXPERTS),
    "shared_ffn_hidden_size": Int(0, MAX_FFN),
    "shared_expert_gate": Bool(),
    "router_bias": Bool(),
    "moe_groups": Int(0, MAX_EXPERTS),
    "moe_group_top_k": Int(0, MAX_EXPERTS),
    "q_lora_rank": Int(0, MAX_HIDDEN),
    "kv_lora_rank": Int(0, MAX_HIDDEN),
    "qk_rope_head_dim": Int(0, MAX_HIDDEN),
    "qk_nope_head_dim": Int(0, MAX_HIDDEN),
    "v_head_dim": Int(0, MAX_HIDDEN),
}

# The HuggingFace keys plan3d reads (model/spec.py _from_huggingface); null means "not set".
# RoPE scaling as HuggingFace writes it: other keys are kept as they are, these are read (the
# Megatron export writes the factor of Llama 3's scaling)
ROPE_SCALING = {
    "rope_type": Text(nullable=True),
    "type": Text(nullable=True),
    "factor": Num(0, 1e6, low_open=True, nullable=True),
    "low_freq_factor": Num(0, 1e6, low_open=True, nullable=True),
    "high_freq_factor": Num(0, 1e6, low_open=True, nullable=True),
    "original_max_position_embeddings": Int(1, MAX_SEQ, nullable=True),
}

HF_CONFIG = {
    "model_type": Text(nullable=True),
    "architectures": Free(),
    "_name_or_path": Name(nullable=True),
    "name": Name(nullable=True),
    "num_hidden_layers": Int(1, MAX_LAYERS, nullable=True),
    "n_layer": Int(1, MAX_LAYERS, nullable=True),
    "hidden_size": Int(1, MAX_HIDDEN, nullable=True),
    "n_embd": Int(1, MAX_HIDDEN, nullable=True),
    "num_attention_heads": Int(1, MAX_HEADS, nullable=True),
    "n_head": Int(1, MAX_HEADS, nullable=True),
    "num_key_value_heads": Int(1, MAX_HEADS, nullable=True),
    "num_kv_heads": Int(1, MAX_HEADS, nullable=True),
    "n_head_kv": Int(1, MAX_HEADS, nullable=True),
    "intermediate_size": Int(1, MAX_FFN, nullable=True),
    "n_inner": Int(1, MAX_FFN, nullable=True),
    "ffn_hidden_size": Int(1, MAX_FFN, nullable=True),
    "vocab_size": Int(1, MAX_VOCAB, nullable=True),
    "max_position_embeddings": Int(1, MAX_SEQ, nullable=True),
    "n_positions": Int(1, MAX_SEQ, nullable=True),
    "tie_word_embeddings": Bool(nullable=True),
    "attention_dropout": Num(0, 1, nullable=True),
    "multi_query": Bool(nullable=True),
    "new_decoder_architecture": Bool(nullable=True),
    "bias": Bool(nullable=True),
    "alibi": Bool(nullable=True),
    "head_dim": Int(1, MAX_HIDDEN, nullable=True),
    "rope_theta": Num(0, 1e12, low_open=True, nullable=True),
    "rotary_emb_base": Num(0, 1e12, low_open=True, nullable=True),
    "rope_scaling": Free(),
    "sliding_window": Int(0, 2**31, nullable=True),  # checked against the planned sequence
    # mixture of experts (model/moe_import.py reads them by family)
    "num_local_experts": Int(0, MAX_EXPERTS, nullable=True),
    "num_experts": Int(0, MAX_EXPERTS, nullable=True),
    "n_routed_experts": Int(0, MAX_EXPERTS, nullable=True),
    "n_shared_experts": Int(0, MAX_EXPERTS, nullable=True),
    "num_experts_per_tok": Int(0, MAX_EXPERTS, nullable=True),
    "moe_intermediate_size": Int(1, MAX_FFN, nullable=True),
    "shared_expert_intermediate_size": Int(0, MAX_FFN, nullable=True),
    "first_k_dense_replace": Int(0, MAX_LAYERS, nullable=True),
    "moe_layer_freq": Int(1, MAX_LAYERS, nullable=True),
    "decoder_sparse_step": Int(1, MAX_LAYERS, nullable=True),
    "mlp_only_layers": Free(),
    "topk_method": Text(nullable=True),
    "scoring_func": Text(nullable=True),
    "num_nextn_predict_layers": Int(0, MAX_LAYERS, nullable=True),
    "q_lora_rank": Int(0, MAX_HIDDEN, nullable=True),
    "kv_lora_rank": Int(0, MAX_HIDDEN, nullable=True),
    "qk_rope_head_dim": Int(0, MAX_HIDDEN, nullable=True),
    "qk_nope_head_dim": Int(0, MAX_HIDDEN, nullable=True),
    "v_head_dim": Int(0, MAX_HIDDEN, nullable=True),
}


# Layer's own fields beyond a layers entry's (model/spec.py): multi-token prediction modules
LAYER_FIELDS = {**{k: f for k, f in LAYER_ENTRY.items() if k != "repeat"},
                "mtp_depth": Int(0, MAX_LAYERS), "mtp_block": Free()}


def check_fields(values: dict, schema: dict, where: str) -> None:
    """A dataclass's field values (ModelSpec's, Layer's) by the rules of the file keys they
    mirror (MODEL_JSON, LAYER_FIELDS): a real int in range where a count belongs, a real bool,
    a word from its set; one PlanInputError naming the first field that breaks its rule. Free
    fields are the caller's to check."""
    for key, f in schema.items():
        value = values[key]
        if f.kind != "free" and not (value is None and f.nullable):
            check_value(value, f, f"{where}: '{key}'")


def is_huggingface(data: dict) -> bool:
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)


def check_model_document(data, origin: str) -> None:
    """Refuse a model file (ours or HuggingFace's) that breaks its schema: one line, exit 2."""
    if not isinstance(data, dict):
        raise PlanInputError(f"{origin}: expected a JSON object describing the model")
    if is_huggingface(data):
        check_object(data, HF_CONFIG, origin, "HuggingFace config", tolerant=True)
        check_rope_scaling(data.get("rope_scaling"), origin)
        return
    values = check_object(data, MODEL_JSON, origin, "model file")
    check_rope_scaling(data.get("rope_scaling"), origin)
    if "layers" in data:
        check_layer_entries(data["layers"], origin)
        if "num_layers" in values:
            raise PlanInputError(f"{origin}: give 'num_layers' or 'layers', not both (the "
                                 "blocks in 'layers' are the layer count)")
    elif "num_layers" not in values:
        raise PlanInputError(f"{origin}: missing 'num_layers'; add it to the model file")


def check_rope_scaling(value, origin: str) -> None:
    """null, or an object whose keys we read are well typed; Llama 3's kind needs its factor."""
    if value is None:
        return
    values = check_object(value, ROPE_SCALING, f"{origin}: 'rope_scaling'", "RoPE scaling",
                          tolerant=True)
    kind = values.get("rope_type") or values.get("type")
    if kind == "llama3" and "factor" not in values:
        raise PlanInputError(f"{origin}: 'rope_scaling' of type llama3 needs its 'factor'")


def check_layer_entries(entries, origin: str) -> None:
    """Each entry of ``layers`` against LAYER_ENTRY, and at most MAX_LAYERS layers in all."""
    check_list(entries, f"{origin}: 'layers'", "layer objects", MAX_LAYERS)
    total = 0
    for n, entry in enumerate(entries):
        where = f"{origin}: layers[{n}]"
        values = check_object(entry, LAYER_ENTRY, where, "layer entry")
        total += values.get("repeat", 1)
        if total > MAX_LAYERS:
            raise PlanInputError(f"{origin}: 'layers' adds up to more than {MAX_LAYERS} layers; "
                                 f"plan3d plans at most {MAX_LAYERS}")
        if values["kind"] == "block":
            for key in ("num_attention_heads", "num_kv_heads", "ffn_hidden_size"):
                if values.get(key) == 0:
                    raise PlanInputError(f"{where}: '{key}' must be positive for a block")
