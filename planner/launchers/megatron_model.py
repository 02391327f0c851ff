"""The model as Megatron-LM core_r0.13 builds it: architecture flags and refusals, RoPE (Llama 3
scaling; YaRN in multi-latent attention), mixture of experts and its load-balancing loss.

Flag names and defaults from Megatron-LM ``megatron/training/arguments.py`` (the stored NVIDIA
revision 000c4ac; ``_add_network_size_args``, ``_add_moe_args``, ``_add_mla_args`` and
``core_transformer_config_from_args``) and megatron-core 0.13.1's own config fields
(``megatron/core/transformer/transformer_config.py``), which ``core_transformer_config_from_args``
fills from the arguments of the same name (``for f in dataclasses.fields(config_class): if
hasattr(args, f.name): kw_args[f.name] = getattr(args, f.name)``).
"""

from __future__ import annotations

NAME = "Megatron-LM"

# MLATransformerConfig (transformer_config.py) defaults for the YaRN parameters Megatron-LM has no
# flag for: "beta_fast: float = 32", "beta_slow: float = 1". Its "max_position_embeddings: int =
# 4096 / Maximum position embeddings for the original model, used by yarn" is filled from
# --max-position-embeddings (same name), which validate_args also holds to "assert
# args.max_position_embeddings >= args.seq_length".
YARN_FIXED = {"beta_fast": 32.0, "beta_slow": 1.0}
YARN_KEYS = {"type", "rope_type", "factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow",
             "original_max_position_embeddings"}


def rope_kind(m) -> str | None:
    scaling = m.rope_scaling or {}
    return scaling.get("rope_type") or scaling.get("type") if scaling else None


def is_mla(m) -> bool:
    return any(layer.is_mla for layer in m.layers)


def architecture_problems(m) -> list[str]:
    """Parts of the model that Megatron's GPT builder has no flag for: exporting them anyway
    would train a different model than the one planned."""
    out = []
    if m.qk_norm == "full":
        out.append(f"{NAME}: --qk-layernorm normalises each head; this model normalises the whole "
                   "Q and K projections (OLMo 2 style)")
    if m.block_norms != 2:
        out.append(f"{NAME}: blocks with {m.block_norms} norms (Gemma 2/3 style) have no "
                   "Megatron GPT flag")
    if any(layer.shared_expert_gate for layer in m.layers):
        out.append(f"{NAME}: a gated shared expert (Qwen2-MoE) is not written by plan3d's "
                   "export (its flag is unchecked here)")
    if m.is_moe and m.mlp != "swiglu":
        out.append(f"{NAME}: plan3d writes MoE experts as SwiGLU MLPs only")
    return out + rope_problems(m)


def rope_problems(m) -> list[str]:
    """Llama 3 scaling (--use-rope-scaling) anywhere; YaRN only in multi-latent attention
    (core_transformer_config_from_args: "Common attention only support rope_type=\"rope\"") and
    only with what core_r0.13 has flags for; every other kind or key is refused by name."""
    kind = rope_kind(m)
    if not m.rope_scaling or kind == "llama3":
        return []
    if kind != "yarn":
        return [f"{NAME}: RoPE scaling '{kind}' has no core_r0.13 flag (--use-rope-scaling is "
                "Llama 3's, --rope-type yarn is multi-latent attention's)"]
    if not is_mla(m):
        return [f"{NAME}: core_r0.13 runs YaRN RoPE only in multi-latent attention (--rope-type "
                "yarn); this model's attention is not MLA"]
    scaling = m.rope_scaling
    extra = sorted(set(scaling) - YARN_KEYS)
    if extra:
        return [f"{NAME}: YaRN key '{extra[0]}' has no core_r0.13 flag"]
    for key, fixed in YARN_FIXED.items():
        if float(scaling.get(key, fixed)) != fixed:
            return [f"{NAME}: YaRN {key} {scaling[key]} has no core_r0.13 flag (MLA runs its "
                    f"default {fixed:g})"]
    original = yarn_original_positions(m)
    if m.seq_length > original:
        return [f"{NAME}: --max-position-embeddings is YaRN's original context ({original}) under "
                f"MLA, and validate_args needs it >= --seq-length ({m.seq_length}); plan with "
                f"--seq-len {original} or less"]
    return []


def yarn_original_positions(m) -> int:
    return int((m.rope_scaling or {}).get("original_max_position_embeddings", 4096))


def max_positions(m) -> int:
    """--max-position-embeddings: under MLA with YaRN it is the original context YaRN scales
    (MLATransformerConfig.max_position_embeddings), else at least the sequence."""
    if is_mla(m) and rope_kind(m) == "yarn":
        return yarn_original_positions(m)
    return max(m.seq_length, m.position_embeddings)


def rope_flags(m) -> list[tuple[str, str | None]]:
    """RoPE as trained. Megatron-LM: '--rope-type' "Type of rope to use. Note that MLA takes yarn
    by default, and common attention takes rope by default", so an MLA model without YaRN says
    rope; '--rotary-scaling-factor' (default 1.0), '--mscale' (1.0), '--mscale-all-dim' (0.0)
    override MLATransformerConfig's 40 / 0.707 / 0.707 by name, so all are written."""
    out: list[tuple[str, str | None]] = []
    if m.position_embeddings == 0:
        out.append(("--position-embedding-type", "rope"))
    if m.rope_theta is not None:  # Megatron's default base is 10000 ('--rotary-base', type=int)
        out.append(("--rotary-base", f"{m.rope_theta:.0f}"))
    kind, scaling = rope_kind(m), m.rope_scaling or {}
    if kind == "llama3":  # '--use-rope-scaling': "Apply rope scaling as used in llama3.x"
        out += [("--use-rope-scaling", None),
                ("--rope-scaling-factor", f"{float(scaling['factor']):g}")]
    elif is_mla(m) and kind == "yarn":
        out += [("--rope-type", "yarn"),
                ("--rotary-scaling-factor", f"{float(scaling['factor']):g}"),
                ("--mscale", f"{float(scaling.get('mscale', 1.0)):g}"),
                ("--mscale-all-dim", f"{float(scaling.get('mscale_all_dim', 0.0)):g}")]
    elif is_mla(m):
        out.append(("--rope-type", "rope"))
    return out


def moe_flags(plan) -> list[tuple[str, str | None]]:
    """Mixture-of-experts and multi-head latent attention, as Megatron-Core names them
    (megatron/training/arguments.py _add_moe_args, _add_mla_args): experts, top-k, expert FFN,
    shared experts, which blocks are MoE (--moe-layer-freq takes a Python list expression, 1 for
    an MoE block), the expert split, grouped GEMMs and the all-to-all dispatcher the plan priced;
    DeepSeek-V3's sigmoid router with its expert bias; the load-balancing loss as trained; MLA's
    ranks and head widths."""
    par, m = plan.parallel, plan.model
    out: list[tuple[str, str | None]] = []
    if m.mtp_layers:  # '--mtp-num-layers': 'Number of Multi-Token Prediction (MTP) Layers.'
        out.append(("--mtp-num-layers", str(m.mtp_layers)))
    if is_mla(m):
        first = next(layer for layer in m.layers if layer.is_mla)
        out.append(("--multi-latent-attention", None))
        if first.q_lora_rank:
            out.append(("--q-lora-rank", str(first.q_lora_rank)))
        out += [("--kv-lora-rank", str(first.kv_lora_rank)),
                ("--qk-head-dim", str(first.qk_nope_head_dim)),
                ("--qk-pos-emb-head-dim", str(first.qk_rope_head_dim)),
                ("--v-head-dim", str(first.v_head_dim))]
    if not m.is_moe:
        return out
    blocks = [layer for layer in m.layers if layer.kind == "block"]
    expert = next(layer for layer in blocks if layer.is_moe)
    out += [("--num-experts", str(m.num_experts)), ("--moe-router-topk", str(m.moe_top_k)),
            ("--moe-ffn-hidden-size", str(expert.ffn_hidden_size))]
    if expert.shared_ffn_hidden_size:
        out.append(("--moe-shared-expert-intermediate-size",
                    str(expert.shared_ffn_hidden_size)))
    if not all(layer.is_moe for layer in blocks):
        out.append(("--moe-layer-freq", run_length([int(b.is_moe) for b in blocks])))
    if m.router_bias:  # DeepSeek-V3: sigmoid scores, auxiliary-loss-free expert bias
        out += [("--moe-router-score-function", "sigmoid"),
                ("--moe-router-enable-expert-bias", None)]
    if expert.moe_groups:  # group-limited routing (DeepSeek-V3's node-limited routing)
        out += [("--moe-router-num-groups", str(expert.moe_groups)),
                ("--moe-router-group-topk", str(expert.moe_group_top_k))]
    out += balancing_flags(m)
    out += [("--expert-model-parallel-size", str(par.ep)),
            ("--expert-tensor-parallel-size", str(par.expert_tp)),
            ("--moe-grouped-gemm", None), ("--moe-token-dispatcher-type", "alltoall")]
    return out


def balancing_flags(m) -> list[tuple[str, str | None]]:
    """The router's load-balancing loss as the model trained. megatron-core 0.13.1
    TransformerConfig: moe_router_load_balancing_type "aux_loss" corresponds to the load balancing
    loss used in GShard and SwitchTransformer; "seq_aux_loss" corresponds to the load balancing
    loss used in DeepSeekV2 and DeepSeekV3, which computes the loss for each individual sample;
    ... "none" implies no load balancing', and "moe_aux_loss_coeff: float = 0"; so the weight is
    always written, and a model trained without one says none."""
    if not m.router_aux_loss:
        return [("--moe-router-load-balancing-type", "none")]
    kind = "seq_aux_loss" if m.router_aux_loss_per_sequence else "aux_loss"
    return [("--moe-router-load-balancing-type", kind),
            ("--moe-aux-loss-coeff", f"{m.router_aux_loss:g}")]


def run_length(flags: list[int]) -> str:
    """[0, 0, 0, 1, 1] -> '([0]*3+[1]*2)', the form Megatron's --moe-layer-freq evaluates."""
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"
