"""The modern runs of modern_runs.json as the planner sees them: llm-foundry's MPT, torchtitan,
Llama 3 405B and NeMo, on flash attention with FSDP / ZeRO and overlapped data-parallel traffic,
each with the model, recompute (torchtitan's selective AC policies included), schedule and
parallel configuration its source documents.
"""

from __future__ import annotations

import re

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.core.schedules import INTERLEAVED, ONE_F_ONE_B
from planner.fidelity.case_setup import CaseSetup
from planner.fidelity.case_stack import stack_notes
from planner.fidelity.megatron_cases import GPT2_PADDED_VOCAB, megatron_interleave
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.stack import Stack, with_overrides

# Groups of modern_runs.json, by stack.
MODERN_GROUPS = ("llmfoundry", "torchtitan", "llama3_405b", "nemo")

# llm-foundry's MPT: tied embeddings, no biases, LayerNorm, GeLU MLP 4h, learned positions in the
# benchmark models (NumParams grows with the sequence), no dropout (attn_pdrop, resid_pdrop and
# emb_pdrop 0.0 in scripts/train/yamls/pretrain/mpt-*.yaml).
# torchtitan and Llama 3: the Llama family (SwiGLU, RMSNorm, no biases, RoPE, untied, no dropout).


def _modern_model(case: dict) -> ModelSpec:
    m, name = case["model"], case["name"]
    if case["group"].startswith("llmfoundry"):
        return ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"],
                         num_attention_heads=m["heads"], num_kv_heads=m.get("kv_heads") or m["heads"],
                         ffn_hidden_size=m["ffn_hidden"], vocab_size=m["vocab"],
                         seq_length=m["seq_len"], mlp="gelu", norm="layernorm", bias=False,
                         tie_embeddings=True, position_embeddings=m["seq_len"], dropout=False,
                         make_vocab_size_divisible_by=1)  # llm-foundry trains the vocab unpadded
    # Llama's rotary positions: theta 500,000 for Llama 3, 10,000 for Llama 2 (config.json
    # "rope_theta"); the value is for exporters, that the blocks are rotary prices their RoPE.
    # GPT-3 under NeMo keeps learned absolute positions (no rope_theta).
    theta = 500000.0 if "llama3" in name else 10000.0 if "llama" in name else None
    return ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"],
                     num_attention_heads=m["heads"], num_kv_heads=m.get("kv_heads") or m["heads"],
                     ffn_hidden_size=m["ffn_hidden"], vocab_size=m["vocab"] or GPT2_PADDED_VOCAB,
                     seq_length=m["seq_len"], mlp=m.get("mlp", "swiglu"),
                     norm="rmsnorm" if m.get("mlp", "swiglu") == "swiglu" else "layernorm",
                     bias=False, tie_embeddings=False, dropout=False,
                     rope_theta=theta)



def recompute_mode(text, name: str = "a case") -> tuple[str, str | None]:
    """(planner recompute mode, torchtitan's selective_ac_option or None) of a case's recompute
    text. torchtitan's selective AC comes in two policies ([activation_checkpoint]
    selective_ac_option, torchtitan/parallelisms/parallelize_llama.py
    _apply_ac_to_transformer_block): 'op', its op-level policy (recompute "selective" with the
    stack's recompute_modules set to torchtitan_op, cost/recompute.py), or an integer N, "#
    Checkpoint every `ac_freq` of the modules passed to this function" (layer SAC: every N-th
    block fully recomputed, modern_setup). A selective text must name which, as
    ``selective_ac_option 'op'`` or ``selective_ac_option '2'``."""
    text = str(text or "none").lower()
    if text.startswith("full"):
        return "full", None
    if text.startswith("selective"):
        found = re.search(r"selective_ac_option '(op|\d+)'", text)
        if not found:
            raise PlanInputError(f"{name}: config.recompute {text!r} must name torchtitan's "
                                 "policy, selective_ac_option 'op' or an integer as "
                                 "selective_ac_option '2'")
        return "selective", found.group(1)
    return "none", None


def modern_setup(case: dict, cluster: Cluster, notes: list[str], opts: Stack) -> CaseSetup:
    """Flash attention, FSDP/ZeRO and overlapped DP traffic, as each source documents them."""
    name, group = case["name"], case["group"]
    cf = case["config"]
    if opts.precision == "fp8" and not cluster.hardware.peak_fp8_tflops:
        return CaseSetup(name, group, "", None, None, None, None, None, tuple(notes),
                         unsupported=f"FP8 run on {cluster.hardware.name}, a profile without "
                                     "an FP8 peak")
    notes += stack_notes(cf, opts)
    model = _modern_model(case)
    tp, pp, dp = int(cf["tp"]), int(cf["pp"]), int(cf["dp"])
    gb = int(cf["global_batch"])
    mb = cf.get("micro_batch")
    if mb is None:
        mb = 1
        notes.append("micro-batch unpublished: 1")
    mb = int(mb)
    recompute, sac = recompute_mode(cf.get("recompute"), name)
    if cf.get("recompute") is None:
        notes.append("recompute unpublished: none")
    layers = None  # torchtitan's layer SAC: every N-th block recomputes, the others keep all
    if sac == "op":
        opts = with_overrides(opts, f"{name}: config.recompute", recompute_modules=["torchtitan_op"])
        notes.append("op SAC: every second mm and the element-wise ops recomputed")
    elif sac is not None:
        # 'ptd_checkpoint_wrapper._count += 1' then 'if not ac_freq or
        # ptd_checkpoint_wrapper._count % ac_freq == 0': checkpointed (fully recomputed), once a
        # process over its blocks; with pp 1 that is floor(L / N) of the L blocks. Priced as
        # Megatron's block method with that count (the same blocks' worth of memory and time).
        freq = int(sac)
        if int(cf["pp"]) > 1:
            raise PlanInputError(f"{name}: torchtitan's layer SAC is priced for pp 1 only "
                                 "(its block counter runs over a rank's chunks)")
        count = model.num_layers // freq if freq else model.num_layers
        recompute = "full" if count else "none"
        layers = count if 0 < count < model.num_layers else None
        notes.append(f"layer SAC {freq}: {count} of {model.num_layers} blocks recompute")
    schedule, v = ONE_F_ONE_B.name, 1
    sched_text = str(cf.get("schedule") or "").lower()
    if pp > 1 and sched_text.startswith(INTERLEAVED.name):
        v = int(cf.get("virtual_stages") or 0)
        if not v:
            v = megatron_interleave(-(-model.num_layers // pp))
            notes.append(f"virtual stages unpublished: v={v} (smallest interleaving)")
        schedule = INTERLEAVED.name if v > 1 else ONE_F_ONE_B.name
    zero = int(cf.get("zero") or 0)
    cp = int(cf.get("cp") or 1)  # context parallel (cost/context.py): the stack's cp_comm
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=max(1, gb // (mb * dp)),
                   schedule=schedule, virtual_stages=v, recompute=recompute, zero=zero,
                   sequence_parallel=bool(cf.get("sequence_parallel")) and tp > 1, cp=cp)
    return CaseSetup(name, group, "", model, cluster, par, opts, None, tuple(notes),
                     recompute_guessed=cf.get("recompute") is None, recompute_layers=layers)
