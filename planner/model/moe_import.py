"""HuggingFace mixture-of-experts configs -> ModelSpec fields: Mixtral, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V2 and DeepSeek-V3 (multi-head latent attention included).

Floor 1 (model/). Each family is read by the keys its transformers config class declares; which
blocks are MoE follows that family's modelling code (quoted below). Every MoE-looking key a
family's config carries is either read here, known not to change the cost (a loss weight, a
routing rule that picks the same number of experts with the same h x E router), or refused in one
line naming it: a config is never planned as a dense model, nor with a router we do not price.
"""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.model.huggingface import FAMILIES, MOE_FAMILIES, llama_layout, require

# Keys that do not change what a step computes or stores beyond what is priced: loss weights (the
# load-balancing weight is still carried to exports, _aux_loss) and the routing rule among the
# top-k (the router is one h x E matmul and a top-k in every case).
_COST_FREE = {
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "norm_topk_prob",
    "aux_loss_alpha", "seq_aux", "routed_scaling_factor",
    "ep_size",  # DeepSeek-V2's inference-time expert sharding; the plan chooses ep itself
}
# (key, values priced): router variants whose cost is the same h x E matmul plus a top-k
_ROUTERS = {
    "topk_method": ("greedy", "group_limited_greedy", "noaux_tc"),
    "scoring_func": ("softmax", "sigmoid"),
}
# Keys each family reads below.
_READ = {
    "mixtral": {"num_local_experts", "num_experts_per_tok"},
    "qwen2_moe": {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers"},
    "qwen3_moe": {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "decoder_sparse_step", "mlp_only_layers"},
    "deepseek_v2": {"n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                    "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
                    "topk_method", "scoring_func", "num_nextn_predict_layers", "n_group",
                    "topk_group"},
}
_READ["deepseek_v3"] = _READ["deepseek_v2"]
assert tuple(_READ) == MOE_FAMILIES
_MOE_WORDS = ("expert", "moe", "router", "topk", "routed", "sparse", "nextn")


def moe_fields(data: dict, origin: str, kind: str) -> dict:
    """The ModelSpec fields of one MoE config, or one PlanInputError naming what is not modelled."""
    _refuse_unknown(data, origin, kind)
    if kind.startswith("deepseek"):
        return _deepseek(data, origin, kind)
    base_kind = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}[kind]
    fields = llama_layout(data, origin, kind, FAMILIES[base_kind])
    layers = fields["num_layers"]
    if kind == "mixtral":
        # MixtralDecoderLayer: every block's MLP is a MixtralSparseMoeBlock.
        experts = _positive(data, origin, "num_local_experts")
        return {**fields, "num_experts": experts, "moe_top_k": _top_k(data, origin, experts),
                **_aux_loss(data, origin, "router_aux_loss_coef")}
    # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: "if (layer_idx not in
    # config.mlp_only_layers) and (config.num_experts > 0 and (layer_idx + 1) %
    # config.decoder_sparse_step == 0)" the MLP is sparse, else a dense MLP of intermediate_size.
    experts = _positive(data, origin, "num_experts")
    step = data.get("decoder_sparse_step", 1) or 1
    only = data.get("mlp_only_layers") or []
    if not isinstance(step, int) or step < 1:
        raise PlanInputError(f"{origin}: 'decoder_sparse_step' must be a positive integer, "
                             f"got {step!r}")
    if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
        raise PlanInputError(f"{origin}: 'mlp_only_layers' must be a list of layer indices")
    dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    shared = data.get("shared_expert_intermediate_size") or 0 if kind == "qwen2_moe" else 0
    return {**fields, "num_experts": experts, "moe_top_k": _top_k(data, origin, experts),
            "moe_ffn_hidden_size": _positive(data, origin, "moe_intermediate_size"),
            "shared_ffn_hidden_size": shared, "shared_expert_gate": bool(shared),
            "dense_layers": dense, **_aux_loss(data, origin, "router_aux_loss_coef")}


def _deepseek(data: dict, origin: str, kind: str) -> dict:
    """DeepSeek-V2/V3: MLA attention, dense MLP blocks before first_k_dense_replace, then routed
    plus shared experts. DeepseekV2DecoderLayer: "if (config.n_routed_experts is not None and
    layer_idx >= config.first_k_dense_replace and layer_idx % config.moe_layer_freq == 0)" the
    MLP is DeepseekV2MoE, else a dense MLP of intermediate_size."""
    if data.get("attention_bias"):
        raise PlanInputError(f"{origin}: attention_bias = true on a {kind} model is not modelled "
                             "(plan3d counts no attention biases on DeepSeek's MLA)")
    # DeepSeek-V3's multi-token prediction modules (report sec. 2.2), planned on the output
    # head's stage (model/spec.py Layer.mtp_depth, cost/mtp.py)
    mtp = data.get("num_nextn_predict_layers") or 0
    if isinstance(mtp, bool) or not isinstance(mtp, int) or mtp < 0:
        raise PlanInputError(f"{origin}: 'num_nextn_predict_layers' must be a non-negative "
                             f"integer, got {mtp!r}")
    heads = require(data, origin, "num_attention_heads")
    layers = require(data, origin, "num_hidden_layers")
    experts = _positive(data, origin, "n_routed_experts")
    first, freq = data.get("first_k_dense_replace", 0) or 0, data.get("moe_layer_freq", 1) or 1
    for key, value in (("first_k_dense_replace", first), ("moe_layer_freq", freq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanInputError(f"{origin}: '{key}' must be a non-negative integer, got {value!r}")
    if freq < 1:
        raise PlanInputError(f"{origin}: 'moe_layer_freq' must be at least 1, got {freq}")
    expert_ffn = _positive(data, origin, "moe_intermediate_size")
    shared = data.get("n_shared_experts") or 0
    mla = {k: _positive(data, origin, k) for k in ("kv_lora_rank", "qk_rope_head_dim",
                                                    "qk_nope_head_dim", "v_head_dim")}
    q_lora = data.get("q_lora_rank") or 0  # null: DeepSeek-V2-Lite projects queries directly
    fields = llama_layout({**data, "num_key_value_heads": heads, "head_dim": None}, origin,
                           kind, FAMILIES["llama"])
    fields.pop("head_dim")
    return {**fields, **mla, "q_lora_rank": q_lora,
            "num_experts": experts, "moe_top_k": _top_k(data, origin, experts),
            "moe_ffn_hidden_size": expert_ffn, "shared_ffn_hidden_size": shared * expert_ffn,
            # DeepSeek-V3's noaux_tc router adds a per-expert e_score_correction_bias
            "router_bias": data.get("topk_method") == "noaux_tc",
            **_groups(data, origin, kind, experts),
            **_aux_loss(data, origin, "aux_loss_alpha"),
            "dense_layers": tuple(i for i in range(layers) if i < first or i % freq),
            "mtp_layers": mtp}


def _aux_loss(data: dict, origin: str, key: str) -> dict:
    """The router's load-balancing loss weight as trained: Mixtral / Qwen-MoE's
    ``router_aux_loss_coef`` (MixtralConfig: "The aux loss factor for the total loss"), or
    DeepSeek's ``aux_loss_alpha`` with ``seq_aux`` ("Whether to compute the auxiliary loss for
    each individual sample", DeepseekV2Config): a per-sequence loss. Absent: none."""
    value = data.get(key) or 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise PlanInputError(f"{origin}: '{key}' must be a number in [0, 1), got {value!r}")
    per_seq = bool(data.get("seq_aux")) if key == "aux_loss_alpha" else False
    return {"router_aux_loss": float(value), "router_aux_loss_per_sequence": per_seq and
            bool(value)}


def _groups(data: dict, origin: str, kind: str, experts: int) -> dict:
    """Group-limited routing: HuggingFace's DeepseekV3Config, "n_group: Number of groups for
    routed experts" and "topk_group: Number of selected groups for each token (for each token,
    ensuring the selected experts is only within `topk_group` groups)". DeepSeek-V3's router
    always limits (its gate picks topk_group groups by their experts' top scores, then the top-k
    inside them: the report's node-limited routing, sec. 2.1.2, "we ensure that each token will
    be sent to at most M nodes"); DeepSeek-V2's only with topk_method group_limited_greedy (its
    "greedy" takes the top-k of all experts). One group is no limit."""
    limited = kind == "deepseek_v3" or data.get("topk_method") == "group_limited_greedy"
    groups = data.get("n_group") or 1
    if not limited or groups == 1:
        return {}
    chosen = data.get("topk_group") or groups
    for key, value in (("n_group", groups), ("topk_group", chosen)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanInputError(f"{origin}: '{key}' must be a positive integer, got {value!r}")
    if experts % groups or chosen > groups:
        raise PlanInputError(f"{origin}: n_group ({groups}) must divide n_routed_experts "
                             f"({experts}) and topk_group ({chosen}) be at most n_group")
    return {"moe_groups": groups, "moe_group_top_k": chosen}


def _refuse_unknown(data: dict, origin: str, kind: str) -> None:
    """One line for an MoE key this family's import neither reads nor knows to be cost-free, and
    for a router variant we do not price."""
    for key, allowed in _ROUTERS.items():
        value = data.get(key)
        if value is not None and value not in allowed:
            raise PlanInputError(
                f"{origin}: {key} = {value!r} is a router plan3d does not model (it prices "
                f"{', '.join(allowed)}); it will not plan this model")
    known = _READ[kind] | _COST_FREE | set(_ROUTERS)
    for key in data:
        if key not in known and any(word in key.lower() for word in _MOE_WORDS):
            raise PlanInputError(
                f"{origin}: '{key}' is a mixture-of-experts setting plan3d does not model for "
                f"{kind}; it will not plan this model with it ignored")


def _positive(data: dict, origin: str, key: str) -> int:
    value = require(data, origin, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInputError(f"{origin}: '{key}' must be a positive integer, got {value!r}")
    return value


def _top_k(data: dict, origin: str, experts: int) -> int:
    k = _positive(data, origin, "num_experts_per_tok")
    if k > experts:
        raise PlanInputError(f"{origin}: num_experts_per_tok ({k}) exceeds the {experts} experts")
    return k
