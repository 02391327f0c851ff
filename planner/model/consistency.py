"""What no one field of a model says alone: the checks ModelSpec (model/spec.py) runs on itself as
it is built, once every field has passed its own rule (model/schema.py), whoever builds it: a
model file's loader (model/load.py) or a caller of the Python API."""

from __future__ import annotations

from planner.core.errors import PlanInputError

# The spec and its layers come in untyped here: model/spec.py imports this module, and no import
# goes back (tests/test_architecture.py: no cycles).


def _positive(origin: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PlanInputError(f"{origin}: '{name}' must be a positive integer, got {value!r}")


def check_consistent(spec, origin: str) -> None:
    """What no one field says, which ModelSpec checks as it is built (after each field, by
    model/schema.py's rules): heads that split the width and the KV heads, dense layers among the
    blocks, MoE settings only with experts, each block's own MoE and MLA settings."""
    if not spec.head_dim and spec.hidden_size % spec.num_attention_heads:
        raise PlanInputError(f"{origin}: hidden_size {spec.hidden_size} is not divisible by "
                             f"num_attention_heads {spec.num_attention_heads}")
    if spec.num_attention_heads % spec.num_kv_heads:
        raise PlanInputError(f"{origin}: num_attention_heads {spec.num_attention_heads} is not a "
                             f"multiple of num_kv_heads {spec.num_kv_heads}")
    # model.json's rule admits 0 norms a block; no block trains without one
    _positive(origin, block_norms=spec.block_norms)
    if spec.dense_layers and max(spec.dense_layers) >= max(spec.num_layers, 1):
        raise PlanInputError(f"{origin}: dense_layers names block {max(spec.dense_layers)}; "
                             f"the model has {spec.num_layers} blocks (0 to {spec.num_layers - 1})")
    if not spec.num_experts and (spec.moe_top_k or spec.moe_ffn_hidden_size or spec.dense_layers
                                 or spec.shared_ffn_hidden_size or spec.router_bias
                                 or spec.shared_expert_gate or spec.moe_groups
                                 or spec.moe_group_top_k):
        raise PlanInputError(f"{origin}: moe_top_k, moe_ffn_hidden_size, dense_layers, shared "
                             "experts and router_bias need num_experts > 0")
    for layer in dict.fromkeys(spec.layers):
        check_moe(layer, origin)


def check_moe(layer, where: str) -> None:
    """One line for an MoE or MLA block that cannot exist."""
    if layer.kind != "block":
        return
    if layer.num_experts and not 1 <= layer.moe_top_k <= layer.num_experts:
        raise PlanInputError(f"{where}: moe_top_k must be between 1 and num_experts "
                             f"({layer.num_experts}), got {layer.moe_top_k}")
    if not layer.num_experts and (layer.moe_top_k or layer.shared_ffn_hidden_size
                                  or layer.shared_expert_gate or layer.router_bias
                                  or layer.moe_groups or layer.moe_group_top_k):
        raise PlanInputError(f"{where}: moe_top_k, shared experts, router_bias and routing "
                             "groups need num_experts > 0")
    check_groups(layer, where)
    if layer.kv_lora_rank and not (layer.qk_nope_head_dim and layer.qk_rope_head_dim
                                   and layer.v_head_dim):
        raise PlanInputError(f"{where}: multi-head latent attention (kv_lora_rank) needs "
                             "qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    if not layer.kv_lora_rank and (layer.q_lora_rank or layer.qk_nope_head_dim
                                   or layer.qk_rope_head_dim or layer.v_head_dim):
        raise PlanInputError(f"{where}: q_lora_rank and the MLA head dims need kv_lora_rank > 0")


def check_groups(layer, where: str) -> None:
    """One line for group-limited routing that cannot exist: groups that do not split the
    experts evenly, more chosen groups than groups, or too few experts in them for top-k."""
    groups, chosen = layer.moe_groups, layer.moe_group_top_k
    if not (groups or chosen):
        return
    if groups < 1 or not 1 <= chosen <= groups or layer.num_experts % groups:
        raise PlanInputError(f"{where}: moe_groups ({groups}) must divide num_experts "
                             f"({layer.num_experts}) and moe_group_top_k ({chosen}) be between "
                             "1 and moe_groups")
    if chosen * layer.num_experts // groups < layer.moe_top_k:
        raise PlanInputError(f"{where}: {chosen} of {groups} groups hold fewer experts than "
                             f"moe_top_k ({layer.moe_top_k})")
