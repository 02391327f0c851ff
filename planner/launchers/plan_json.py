"""``plan.json`` v2 (``plan3d/plan/v2``): a plan that describes itself to an engine.

On top of the plan (``Plan.to_dict``: cluster, parallel settings, metrics, layout, notes and any
other block the plan carries) it states the whole architecture (every model.json field), the
layer list with each layer's kind and module names, the stages as half-open ``[start, stop)``
ranges with their module names and split backward times, the precision the plan assumes, which
stage computes the loss, and per engine the names it takes verbatim (or the rule it breaks).
``planner/launchers/plan.schema.json`` is its JSON Schema. JSON has no comments, so this file
carries no header; ``schema`` names the format and ``plan_digest`` is the digest the other
exported files quote in their headers. ``memory`` (each pipeline rank's peak by part) is there
when the plan was predicted with its parts (every plan the search returns).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from planner.launchers.deepspeed import entry as deepspeed_entry
from planner.launchers.megatron import entry as megatron_entry
from planner.launchers.torch_pipelining import entry as torch_pipelining_entry
from planner.launchers.torchtitan import entry as torchtitan_entry
from planner.launchers.common import (Facts, is_standard_gpt_model, plan_digest,
                                      structure_problems)
from planner.model.spec import Layer, ModelSpec
from planner.predict.plan import Plan, round_6g

SCHEMA_V2 = "plan3d/plan/v2"
TARGET = f"plan3d plan JSON (schema {SCHEMA_V2})"
CONVENTIONS = {
    "stage_layers": "half-open [start, stop) indices into layers",
    "stage_to_rank": "stage s runs on pipeline rank s mod pp",
    "times": "seconds per microbatch on one GPU of the stage",
    "bwd": "a stage's full backward is bwd_input_s + bwd_weight_s; zero-bubble schedules run the "
           "two parts as separate actions",
}
# What the memory and cost models count (planner/cost/memory.py): 16-bit weights and
# activations in the stack's dtype (bf16 without a stack), fp32 logits in the loss, Adam with fp32
# master weights and moments; gradients in the stack's dtype.
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PRECISION = {"dtype": "bfloat16", "logits": "float32", "optimizer": "adam",
             "master_weights": "float32", "optimizer_state": "float32"}
# Layer fields a layer of each kind takes from the model unless it overrides them.
_KIND_FIELDS = {
    "embedding": ("hidden_size", "vocab_size", "position_embeddings", "embedding_norm", "norm",
                  "dropout"),
    "block": ("hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "mlp",
              "norm", "bias", "dropout"),
    "head": ("hidden_size", "vocab_size", "norm"),
    "linear": ("hidden_size", "bias"),
}


def position_embedding(model: ModelSpec) -> str:
    """"learned" with a position table, else "rope" (what the Megatron export passes too)."""
    return "learned" if model.position_embeddings else "rope"


def architecture(model: ModelSpec) -> dict:
    """Every field of model.json, plus the parameter count and the position encoding."""
    return {"name": model.name, "params": model.params, "num_layers": model.num_layers,
            "hidden_size": model.hidden_size, "num_attention_heads": model.num_attention_heads,
            "num_kv_heads": model.num_kv_heads, "ffn_hidden_size": model.ffn_hidden_size,
            "vocab_size": model.vocab_size, "seq_length": model.seq_length, "mlp": model.mlp,
            "norm": model.norm, "bias": model.bias, "tie_embeddings": model.tie_embeddings,
            "position_embeddings": model.position_embeddings,
            "position_embedding": position_embedding(model), "dropout": model.dropout,
            "embedding_norm": model.embedding_norm, **moe_architecture(model)}


MOE_FIELDS = ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "shared_ffn_hidden_size",
              "shared_expert_gate", "router_bias", "moe_groups", "moe_group_top_k",
              "dense_layers")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")


def moe_architecture(model: ModelSpec) -> dict:
    """A mixture of experts' fields (with its active parameters) and MLA's, where the model has
    them; nothing for a dense model with standard attention."""
    out = {}
    if model.is_moe:
        out["active_params"] = model.active_params
        out.update({k: getattr(model, k) for k in MOE_FIELDS})
        out["dense_layers"] = list(model.dense_layers)
    if model.kv_lora_rank:
        out.update({k: getattr(model, k) for k in MLA_FIELDS})
    if model.mtp_layers:  # multi-token prediction modules on the head's stage (cost/mtp.py)
        out["mtp_layers"] = model.mtp_layers
    return out


def layer_modules(model: ModelSpec) -> list[list[str]]:
    """Module names of each layer. The usual decoder uses torchtitan's Llama names
    (``tok_embeddings``, ``layers.<i>``, ``norm`` + ``output``); other layer lists number each
    kind on its own (``embedding.0``, ``block.3``, ``linear.1``, ...)."""
    if is_standard_gpt_model(model):
        first, *blocks, _ = model.layers
        emb = ["tok_embeddings"] + (["pos_embeddings"] if first.position_embeddings else []) \
            + (["embedding_norm"] if first.embedding_norm else [])
        mtp = [f"mtp.layers.{i}" for i in range(model.layers[-1].mtp_depth)]
        return [emb] + [[f"layers.{i}"] for i in range(len(blocks))] + [["norm", "output", *mtp]]
    seen: dict[str, int] = {}
    names = []
    for layer in model.layers:
        names.append([f"{layer.kind}.{seen.get(layer.kind, 0)}"])
        seen[layer.kind] = seen.get(layer.kind, 0) + 1
    return names


def _overrides(layer: Layer, model: ModelSpec) -> dict:
    out = {f: getattr(layer, f) for f in _KIND_FIELDS[layer.kind]
           if getattr(layer, f) != getattr(model, f)}
    if layer.kind == "head" and layer.tied != model.tie_embeddings:
        out["tied"] = layer.tied
    if layer.kind == "linear":
        out["out_features"] = layer.out_features
    return out


def layers(model: ModelSpec) -> list[dict]:
    out = []
    for i, (layer, modules) in enumerate(zip(model.layers, layer_modules(model))):
        item = {"index": i, "kind": layer.kind, "modules": modules, "params": layer.params}
        overrides = _overrides(layer, model)
        if overrides:
            item["overrides"] = overrides
        out.append(item)
    return out


def precision(plan: Plan) -> dict:
    if plan.stack is None:
        return dict(PRECISION)
    out = {**PRECISION, "dtype": DTYPE_NAMES[plan.stack.param_dtype],
           "gradients": DTYPE_NAMES[plan.stack.grad_dtype]}
    if plan.stack.precision == "fp8":  # the blocks' linear GEMMs (cost/precision.py)
        out.update(block_gemms="float8", fp8_recipe=plan.stack.fp8_recipe)
    return out


def stages(plan: Plan) -> list[dict]:
    names = layer_modules(plan.model)
    n = len(plan.model.layers)
    return [{"stage": s.stage, "rank": s.rank, "layers": {"start": s.first, "stop": s.last},
             "modules": [m for layer in names[s.first:s.last] for m in layer],
             "holds_loss": s.last == n, "recompute": s.recompute,
             **({"recompute_layers": s.recompute_layers} if s.recompute_layers is not None
                else {}),
             "fwd_s": round_6g(s.fwd_s), "bwd_input_s": round_6g(s.bwd_s - s.wgrad_s),
             "bwd_weight_s": round_6g(s.wgrad_s), "send_s": round_6g(s.send_s),
             "time_s": round_6g(s.time_s), "memory_bytes": int(s.memory_bytes)}
            for s in plan.stages]


def engines(plan: Plan) -> dict:
    return {"torch_pipelining": torch_pipelining_entry(plan), "torchtitan": torchtitan_entry(plan),
            "deepspeed": deepspeed_entry(plan), "megatron": megatron_entry(plan)}


def document(plan: Plan) -> dict:
    """The plan.json v2 document (key order: identity, model, plan, stages, engines, the rest)."""
    base = plan.to_dict()
    base.pop("schema", None)
    base.pop("model", None)
    base.pop("stages", None)
    loss = next(s.stage for s in plan.stages if s.last == len(plan.model.layers)) \
        if plan.stages else None
    doc = {"schema": SCHEMA_V2, "plan_digest": plan_digest(plan), "conventions": CONVENTIONS,
           "model": architecture(plan.model), "precision": precision(plan),
           "layers": layers(plan.model)}
    doc["cluster"] = base.pop("cluster")
    if plan.cluster.memory_headroom:  # what the plan was fitted under (not in the digest)
        doc["cluster"]["memory_headroom"] = plan.cluster.memory_headroom
    doc["parallel"] = base.pop("parallel")
    doc["stages"] = stages(plan)
    doc["loss_stage"] = loss
    doc["engines"] = engines(plan)
    doc.update(base)  # metrics, layout, notes and any block added later (e.g. the stack)
    if plan.error_band is not None:
        doc["error_band"] = plan.error_band
    if plan.memory_parts:
        doc["memory"] = memory(plan)
    return doc


def memory(plan: Plan) -> dict:
    """Each pipeline rank's peak bytes, in total and by part (predict/memory.py MEMORY_PARTS:
    the parts sum to the total); what `plan report` draws as the memory bar per rank."""
    return {"ranks": [{"rank": r, "total_bytes": int(total),
                       "parts": {part: int(per_rank[r]) for part, per_rank in plan.memory_parts}}
                      for r, total in enumerate(plan.rank_memory_bytes)]}


@lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON Schema of plan.json v2, shipped beside this module."""
    return json.loads(resources.files("planner.launchers").joinpath("plan.schema.json")
                      .read_text())


def check(plan: Plan) -> list[str]:
    return structure_problems(plan)


def parallel_rules(_facts: Facts) -> list[str]:
    return []


def render(plan: Plan) -> dict[str, str]:
    return {"plan.json": json.dumps(document(plan), indent=2) + "\n"}
