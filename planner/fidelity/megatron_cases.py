"""The 2020-23 runs of published_runs.json as the planner sees them: Megatron-LM 2021
(Narayanan et al. 2021), BLOOM on Megatron-DeepSpeed (2022) and the zero-bubble fork of
Megatron-LM (Qi et al. 2023), each with the model, schedule, recompute and split its source
documents, and Megatron's conventions where the source leaves a detail unreported (the GPT-2
vocabulary, the smallest interleaving).
"""

from __future__ import annotations

from planner.core.parallel import Parallel
from planner.core.schedules import INTERLEAVED, ONE_F_ONE_B, ZB_2P, ZB_H1
from planner.fidelity.case_setup import CaseSetup
from planner.hardware.profiles import Cluster
from planner.model.presets import megatron_gpt
from planner.model.spec import ModelSpec
from planner.stack import Stack

# Zero-bubble cases publish no vocabulary: GPT-2 BPE padded to 51,200 as in Megatron-LM's GPT
# runs (Narayanan et al. 2021, Table 1). It is 2-4% of the parameters of the 1.5B/14.6B models.
GPT2_PADDED_VOCAB = 51200
# the groups of published_runs.json, each a Megatron-LM lineage
MEGATRON_GROUPS = ("megatron", "bloom", "zero_bubble")


def _uniform_bounds(model: ModelSpec, chunks: int) -> tuple[tuple[int, int], ...] | None:
    """Embedding and head counted as layers and all layers split evenly: DeepSpeed's
    'type:transformer|embedding' partition (BLOOM) and the zero-bubble runs' 'first and last
    stage have one fewer transformer layer'. None when the count does not divide."""
    n = len(model.layers)
    if n % chunks:
        return None
    size = n // chunks
    return tuple((k * size, (k + 1) * size) for k in range(chunks))


def megatron_interleave(layers_per_stage: int) -> int:
    """Unreported virtual stages of the 2021 runs: the smallest interleaving the layer count
    allows (v = smallest divisor > 1 of the layers per stage), the least extra communication."""
    for v in range(2, layers_per_stage + 1):
        if layers_per_stage % v == 0:
            return v
    return 1


def megatron_family_setup(case: dict, cluster: Cluster, notes: list[str],
                          opts: Stack) -> CaseSetup:
    """A run of one of the MEGATRON_GROUPS on ``cluster`` and its stack ``opts``, ``notes``
    carrying what the cluster and stack had to assume."""
    name, group = case["name"], case.get("group", "")
    m, cf = case["model"], case["config"]
    tp, pp, dp = int(cf["tp"]), int(cf["pp"]), int(cf["dp"])
    gb = int(cf["global_batch"])
    sweep = group if "sweep" in group else ""  # Table 1 and single runs are not sweeps
    bounds = None

    if group.startswith("megatron"):
        # Megatron-LM 2021 (Narayanan et al. 2021; README GPT-3 example): unfused softmax
        # attention, DDP all-reduce after the backward, fp32 main grads, no ZeRO, no SP, full
        # recompute (--checkpoint-activations).
        model = megatron_gpt(name, m["layers"], m["hidden"], m["heads"], vocab=m["vocab"],
                     seq=m["seq_len"], ffn=m["ffn_hidden"])
        mb = int(cf["micro_batch"] or 1)
        if cf["micro_batch"] is None:
            notes.append("micro-batch unpublished: 1 (as the README GPT-3 run)")
        schedule, v = ONE_F_ONE_B.name, int(cf.get("virtual_stages") or 1)
        sched_text = str(cf["schedule"]).lower()
        if (sched_text.startswith(INTERLEAVED.name) and cf.get("virtual_stages") is None
                and pp > 1):
            v = megatron_interleave(m["layers"] // pp)
            schedule = INTERLEAVED.name if v > 1 else ONE_F_ONE_B.name
            notes.append(f"virtual stages unpublished: v={v} (smallest interleaving)")
        par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=gb // (mb * dp),
                       schedule=schedule, virtual_stages=v, recompute="full", zero=0,
                       sequence_parallel=False)
    elif group.startswith("bloom"):
        # BLOOM (Megatron-DeepSpeed 2022, tr11 slurm script): ALiBi (no position table),
        # 250,880 vocabulary tied, --embed-layernorm, unfused attention, BF16_Optimizer = ZeRO-1 with an fp32
        # gradient accumulation buffer beside the kept bf16 grads, DeepSpeed's 1F1B TrainSchedule
        # keeping stage outputs until their backward, all-reduce after the backward (not
        # overlapped), full recompute keeping only layer inputs; its pipeline sends the whole
        # activation from every TP rank (no Megatron scatter/gather).
        model = ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"],
                          num_attention_heads=m["heads"], num_kv_heads=m["heads"],
                          ffn_hidden_size=m["ffn_hidden"], vocab_size=m["vocab"],
                          seq_length=m["seq_len"], mlp="gelu", norm="layernorm", bias=True,
                          tie_embeddings=True, embedding_norm=True)
        mb = int(cf["micro_batch"])
        par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=gb // (mb * dp),
                       schedule=ONE_F_ONE_B.name, virtual_stages=1, recompute="full",
                       zero=int(cf.get("zero") or 0), sequence_parallel=False)
        bounds = _uniform_bounds(model, pp)
        notes.append("embedding and head each take a layer slot (type:transformer|embedding)")
    elif group.startswith("zero_bubble"):
        # Zero-bubble fork of Megatron-LM (2023): Megatron's default unfused softmax attention
        # (flash is opt-in, --use-flash-attn; Table 4's memory, e.g. 30 GB for 1.5B/1F1B, is what
        # stored s x s scores need and twice what flash would), untied embeddings
        # (examples/pretrain_zero_bubble.sh), learned positions, fp32 main grads; pure PP, no
        # recompute.
        vocab = m.get("vocab") or GPT2_PADDED_VOCAB
        if m.get("vocab") is None:
            notes.append(f"vocabulary unpublished: GPT-2 padded {vocab}")
        model = ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"],
                          num_attention_heads=m["heads"], num_kv_heads=m["heads"],
                          ffn_hidden_size=m["ffn_hidden"], vocab_size=vocab,
                          seq_length=m["seq_len"], mlp="gelu", norm="layernorm", bias=True,
                          tie_embeddings=False, position_embeddings=m["seq_len"])
        sweep = f"{group}:{m['params_b']}B"
        mb = int(cf["micro_batch"])
        sched = str(cf["schedule"])
        # the paper's schedule names (Qi et al. 2023's ZB-1p is ZB-H1 run by its scheduler)
        schedule, v = {"1F1B": (ONE_F_ONE_B.name, 1), "ZB-1p": (ZB_H1.name, 1),
                       "ZB-2p": (ZB_2P.name, 1)}.get(sched, (None, 1))
        if sched == "1F1B-I":
            schedule, v = INTERLEAVED.name, len(model.layers) // pp  # one layer per chunk
            notes.append(f"v={v}: one layer per chunk")
        if schedule is None:
            return CaseSetup(name, group, sweep, None, None, None, None, None, tuple(notes),
                             unsupported=f"{sched}: no equivalent schedule")
        if sched == "ZB-1p":
            notes.append("ZB-1p as zb-h1")
        # The ZB rows' stack_overrides set optimizer_post_validation: the fork's
        # examples/pretrain_zero_bubble.sh passes --enable-optimizer-post-validation with every
        # 16-bit zero-bubble run (no sync before the optimizer step; steps overlap).
        if sched == "ZB-2p":  # the paper searched its order with profiled times
            notes.append("ZB-2p as zb-2p (its F = B = W order under the 2p activation limit)")
        par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=gb // (mb * dp),
                       schedule=schedule, virtual_stages=v, recompute="none", zero=0,
                       sequence_parallel=False)
        bounds = _uniform_bounds(model, pp * v)
    else:
        raise ValueError(f"{name}: group {group!r} is none of {MEGATRON_GROUPS}")
    return CaseSetup(name, group, sweep, model, cluster, par, opts, bounds, tuple(notes))
