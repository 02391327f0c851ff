"""model.json, written down: the fields the loader reads, what each means, and any model as a file.

Floor 1 (model/). FIELDS is the one description of the format: ``plan models show`` prints it
beside a model's values, docs/model-files.md's table is ``fields_markdown()`` (a test keeps
the two equal), and a test checks it names every ModelSpec field. ``model_template`` writes a spec
(a preset, an imported HuggingFace config) as a model.json that loads back to the same spec.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from planner.model.spec import ModelSpec


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    default: str  # as the loader fills it in when the key is absent; "required" when it must be set
    meaning: str


FIELDS: tuple[Field, ...] = (
    Field("name", "string", "the file name", "Shown in tables, plans and exports."),
    Field("num_layers", "integer", "required", "Transformer blocks (omit with `layers`)."),
    Field("hidden_size", "integer", "required", "Model width h."),
    Field("num_attention_heads", "integer", "required", "Query heads."),
    Field("num_kv_heads", "integer", "num_attention_heads",
          "Key/value heads: fewer for grouped-query attention, 1 for multi-query."),
    Field("head_dim", "integer", "0",
          "Width of one head; 0 means hidden_size / num_attention_heads (Qwen3, Gemma and "
          "Mistral-NeMo set their own)."),
    Field("ffn_hidden_size", "integer", "4 x hidden_size", "MLP width (of each gate branch for "
          "swiglu)."),
    Field("vocab_size", "integer", "required", "Vocabulary as the tokenizer has it (unpadded)."),
    Field("make_vocab_size_divisible_by", "integer", "128",
          "The vocabulary is trained padded to a multiple of this x TP, as Megatron-LM pads it "
          "(its --make-vocab-size-divisible-by); 1 for no padding."),
    Field("seq_length", "integer", "required", "Tokens per sequence as planned (--seq-len "
          "overrides)."),
    Field("max_position_embeddings", "integer", "0",
          "The context the model declares; 0 if none. A note is printed when the planned length "
          "differs."),
    Field("mlp", "gelu / swiglu", "gelu",
          "gelu: two matmuls; swiglu: any gated MLP, three matmuls (SwiGLU, GeGLU)."),
    Field("norm", "layernorm / rmsnorm", "rmsnorm for swiglu, else layernorm",
          "Normalisation (LayerNorm has a bias, RMSNorm not)."),
    Field("bias", "bool", "false for swiglu, else true", "Biases on every linear layer."),
    Field("qkv_bias", "bool", "false", "Biases on the Q, K and V projections only (Qwen2)."),
    Field("qk_norm", "\"\" / head / full", "\"\"",
          "A norm on queries and keys: per head over head_dim (Qwen3, Gemma 3) or over the whole "
          "projection (OLMo 2)."),
    Field("block_norms", "integer", "2", "Norms per block (Gemma 2 and 3: 4)."),
    Field("tie_embeddings", "bool", "false", "The output projection shares the embedding "
          "weight."),
    Field("position_embeddings", "integer", "0",
          "Learned absolute positions (GPT-2/3); 0 for RoPE or ALiBi."),
    Field("rope_theta", "number / null", "null",
          "RoPE base frequency, carried to exports; set, the blocks are rotary and their RoPE "
          "kernels are priced."),
    Field("rope_scaling", "object / null", "null",
          "RoPE scaling as HuggingFace writes it (e.g. rope_type llama3), carried to exports."),
    Field("sliding_window", "integer", "0",
          "The shortest attention window of any block; 0 for full attention. Planning is refused "
          "where it is shorter than the sequence."),
    Field("dropout", "bool", "true", "Dropout masks and kernels (GPT, BLOOM); false as Llama "
          "trains."),
    Field("embedding_norm", "bool", "false", "A norm after the embedding (BLOOM)."),
    Field("num_experts", "integer", "0",
          "Routed experts per MoE block (Mixtral 8, DeepSeek-V3 256); 0 for a dense model."),
    Field("moe_top_k", "integer", "0", "Experts each token is routed to (with num_experts)."),
    Field("moe_ffn_hidden_size", "integer", "0",
          "Width of one expert's MLP; 0 means ffn_hidden_size (which dense blocks keep)."),
    Field("shared_ffn_hidden_size", "integer", "0",
          "Total width of the always-active shared experts (DeepSeek: n_shared_experts x the "
          "expert width; Qwen2-MoE: its one shared expert)."),
    Field("shared_expert_gate", "bool", "false",
          "A sigmoid gate (an h x 1 weight) on the shared expert (Qwen2-MoE)."),
    Field("router_bias", "bool", "false",
          "A per-expert routing bias (DeepSeek-V3's auxiliary-loss-free balancing)."),
    Field("router_aux_loss", "number", "0",
          "The router's load-balancing loss weight as trained (HF router_aux_loss_coef; "
          "DeepSeek aux_loss_alpha); exported, not priced."),
    Field("router_aux_loss_per_sequence", "bool", "false",
          "That loss balances each sequence (DeepSeek's seq_aux) rather than the batch."),
    Field("moe_groups", "integer", "0",
          "Routing groups of consecutive experts (HuggingFace n_group; DeepSeek-V3 8); 0: none."),
    Field("moe_group_top_k", "integer", "0",
          "Groups a token's experts may come from (topk_group; DeepSeek-V3 4, one group a node)."),
    Field("dense_layers", "list", "[]",
          "Block indices (from 0) that keep a dense MLP of ffn_hidden_size (DeepSeek's first "
          "first_k_dense_replace blocks)."),
    Field("kv_lora_rank", "integer", "0",
          "Multi-head latent attention (DeepSeek-V2/V3): the compressed KV latent; 0: not MLA."),
    Field("q_lora_rank", "integer", "0", "MLA: the query bottleneck; 0: a direct projection."),
    Field("qk_nope_head_dim", "integer", "0", "MLA: per-head Q/K width without RoPE."),
    Field("qk_rope_head_dim", "integer", "0", "MLA: per-head Q/K width with RoPE (the shared "
          "RoPE key has this width)."),
    Field("v_head_dim", "integer", "0", "MLA: per-head value width."),
    Field("mtp_layers", "integer", "0",
          "Multi-token prediction modules (DeepSeek-V3; HuggingFace num_nextn_predict_layers): "
          "each a projection, one block and the shared output head, on the head's stage."),
    Field("layers", "list", "none",
          "An explicit layer sequence instead of num_layers blocks: objects with a kind "
          "(embedding, block, head, linear), an optional repeat and any layer field to override."),
)


def model_template(spec: ModelSpec) -> dict:
    """The spec as a model.json document, every field in FIELDS order (layers only when they are
    not the standard embedding, blocks and head)."""
    doc = {f.name: getattr(spec, f.name) for f in FIELDS if f.name != "layers"}
    standard = ModelSpec(**{f.name: getattr(spec, f.name) for f in fields(ModelSpec)
                            if f.name != "layers"})
    if spec.layers != standard.layers:
        # MTP modules ride on the standard head only (mtp_layers): not a layer entry's field
        doc["layers"] = [{f.name: getattr(layer, f.name) for f in fields(layer)
                          if f.name not in ("mtp_depth", "mtp_block")} for layer in spec.layers]
        doc.pop("num_layers")
    return doc


def fields_markdown() -> str:
    """FIELDS as docs/model-files.md's markdown table."""
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.type} | {f.default} | {f.meaning} |" for f in FIELDS]
    return "\n".join(rows) + "\n"
