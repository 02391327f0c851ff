"""The published runs as the planner sees them: each case of a runs file rebuilt as a model, a
cluster, the PUBLISHED parallel configuration and the software stack its source documents.

Every case of a published-runs file (profiles/validation/published_runs.json; its README describes
the fields) names its bundled stack (``stack``, profiles/stacks/), the named components its source
ran over it (``components``, profiles/components/) and any ``stack_overrides`` (launch flags);
nothing is tuned per case. planner/fidelity/published.py evaluates the cases and compares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.core.parallel import Parallel
from planner.core.schedules import DUALPIPE, INTERLEAVED, ONE_F_ONE_B, ZB_2P, ZB_H1
from planner.core.units import DATA_DIR
from planner.fidelity.runs_schema import check_runs_document
from planner.hardware.power import power_limited
from planner.hardware.profiles import Cluster, Hardware, load_hardware
from planner.model.load import load_model
from planner.model.spec import ModelSpec
from planner.model.presets import megatron_gpt
from planner.stack import userbuffers
from planner.stack import Stack, load_stack, with_components, with_overrides

VALIDATION_DIR = DATA_DIR / "validation"
# The 2020-23 runs (unfused attention, Megatron-LM / Megatron-DeepSpeed) and the modern stacks
# (flash attention, FSDP / ZeRO-3, Megatron-Core, torchtitan); ``validate_file`` reads both.
DEFAULT_FILE = VALIDATION_DIR / "published_runs.json"
MODERN_FILE = VALIDATION_DIR / "modern_runs.json"
# Mixture-of-experts runs (Megatron-Core and PyTorch-native MoE); their models are HuggingFace
# configs under VALIDATION_DIR / "configs".
MOE_FILE = VALIDATION_DIR / "moe_runs.json"
DEFAULT_FILES = (DEFAULT_FILE, MODERN_FILE, MOE_FILE)
# Zero-bubble cases publish no vocabulary: GPT-2 BPE padded to 51,200 as in Megatron-LM's GPT
# runs (Narayanan et al. 2021, Table 1). It is 2-4% of the parameters of the 1.5B/14.6B models.
GPT2_PADDED_VOCAB = 51200


@dataclass(frozen=True)
class CaseSetup:
    """What one published case becomes in the planner: ``unsupported`` says why it is skipped."""

    name: str
    group: str
    sweep: str  # cases whose speeds are ranked against each other
    model: ModelSpec | None
    cluster: Cluster | None
    parallel: Parallel | None
    options: Stack | None
    bounds: tuple[tuple[int, int], ...] | None
    notes: tuple[str, ...]
    unsupported: str = ""
    # unpublished recompute: none, unless none would not fit where the run did (validate_case)
    recompute_guessed: bool = False
    # Megatron's --recompute-method block: the first N blocks of every chunk recompute (with
    # recompute "full"); None: every block (validate_case's guess sets it)
    recompute_layers: int | None = None
    # pipeline runs per optimizer step: a stack whose gradient accumulation loops over whole
    # pipeline schedules (each a fill and drain of ``parallel.num_microbatches``) runs several
    pipeline_passes: int = 1


# --- building the cases --------------------------------------------------------------------------


def load_cases(path: str | Path = DEFAULT_FILE) -> list[dict]:
    data = read_json(path, "validation file")
    check_runs_document(data, str(path))  # every case's keys, types, ranges: runs_schema.py
    return data


def base_profile(gpu: str) -> str:
    """The bundled profile of the case's GPU kind: its HBM bandwidth and measured efficiencies
    are the part's, whatever the source publishes about the cluster."""
    text = gpu.lower()
    if "h100" in text or "h800" in text:  # H800: the H100 die, its own NVLink figure per case
        return "h100-sxm-80gb"
    if "a100" in text and "40" in text:
        return "a100-40gb"
    return "a100-80gb"


def case_cluster(case: dict, hardware: Hardware | None = None) -> tuple[Cluster, tuple[str, ...]]:
    """The case's GPUs and links on the bundled profile of its GPU kind (HBM bandwidth and
    efficiencies), or on ``hardware`` (a calibrated profile) when given; an unpublished
    inter-node bandwidth falls back to that profile's (one NIC per GPU: 200 Gb/s HDR on A100,
    400 Gb/s NDR on H100) and says so. A source that names its part's HBM bandwidth
    (``hbm_GBps``: torchtitan's Grand Teton H100s carry 96 GB of HBM2e at 2.4 TB/s, not the
    SXM profile's HBM3 at 3.35) replaces the profile's; a source that names a board power limit
    below the part's rated power (``power_limit_w``: the same H100s ran at 500 W of 700) lowers
    its tensor peaks (hardware/power.py) and says so."""
    cl = case["cluster"]
    profile = base_profile(str(cl.get("gpu", "")))
    base = hardware or load_hardware(profile)
    notes = []
    inter = cl.get("inter_node_GBps")
    per_node = int(cl["gpus_per_node"])
    gpus = int(cl["gpus"])
    nics = {}
    if inter is None:
        inter = base.inter_node_gbps
        if gpus > per_node:
            notes.append(f"inter-node bandwidth unpublished: bundled {profile} {inter:g} GB/s")
    else:  # the source's per-GPU figure replaces the bundled profile's NICs
        nics = dict(nics_per_node=None, nic_gbps=None)
    hw = replace(base, name=cl.get("gpu", base.name), peak_tflops=float(cl["peak_tflops_bf16"]),
                 memory_gib=float(cl.get("hbm_gb") or base.memory_gib),
                 memory_bandwidth_gbps=float(cl.get("hbm_GBps") or base.memory_bandwidth_gbps),
                 intra_node_gbps=float(cl["intra_node_GBps"]), inter_node_gbps=float(inter),
                 gpus_per_node=per_node, **nics)
    if cl.get("power_limit_w") and hw.tdp_w is None:
        notes.append(f"power limit {cl['power_limit_w']:g} W not priced: {hw.name} states no tdp_w")
    elif cl.get("power_limit_w"):
        capped = power_limited(hw, float(cl["power_limit_w"]))
        notes.append(f"power limit {cl['power_limit_w']:g} W: tensor peak "
                     f"{capped.peak_tflops:.0f} of {hw.peak_tflops:g} TFLOP/s")
        hw = replace(capped, name=hw.name)
    return Cluster(hardware=hw, nodes=max(1, gpus // per_node), gpus_per_node=min(per_node, gpus)), \
        tuple(notes)


def _uniform_bounds(model: ModelSpec, chunks: int) -> tuple[tuple[int, int], ...] | None:
    """Embedding and head counted as layers and all layers split evenly: DeepSpeed's
    'type:transformer|embedding' partition (BLOOM) and the zero-bubble runs' 'first and last
    stage have one fewer transformer layer'. None when the count does not divide."""
    n = len(model.layers)
    if n % chunks:
        return None
    size = n // chunks
    return tuple((k * size, (k + 1) * size) for k in range(chunks))


def stage_bounds(model: ModelSpec, blocks, chunks: int, name: str) -> tuple[tuple[int, int], ...]:
    """The layer bounds of a case's published split ``blocks`` (transformer blocks per model
    chunk, in pipeline order: pp x virtual stages of them): the embedding joins the first chunk
    and the head the last, as Megatron places them. One line naming the run when the list does
    not fit the model."""
    total = sum(1 for layer in model.layers if layer.kind == "block")
    ok = (isinstance(blocks, list) and len(blocks) == chunks
          and all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks)
          and sum(blocks) == total and all(b > 0 for b in blocks[1:-1]))
    if not ok:
        raise PlanInputError(
            f"run '{name}': config.stage_blocks must list {chunks} block counts (one per "
            f"model chunk, none empty but the first and last) summing to the model's "
            f"{total} blocks; got {blocks!r}")
    bounds, start = [], 1
    for b in blocks:
        bounds.append((start, start + b))
        start += b
    bounds[0] = (0, bounds[0][1])
    bounds[-1] = (bounds[-1][0], len(model.layers))
    return tuple(bounds)


def _runs_text(counts: list[int]) -> str:
    """Block counts with repeats folded: [3, 4, 4, 4, 2] -> '3, 4 x 3, 2'."""
    out, k = [], 0
    while k < len(counts):
        j = k
        while j < len(counts) and counts[j] == counts[k]:
            j += 1
        out.append(str(counts[k]) if j - k == 1 else f"{counts[k]} x {j - k}")
        k = j
    return ", ".join(out)


def _megatron_interleave(layers_per_stage: int) -> int:
    """Unreported virtual stages of the 2021 runs: the smallest interleaving the layer count
    allows (v = smallest divisor > 1 of the layers per stage), the least extra communication."""
    for v in range(2, layers_per_stage + 1):
        if layers_per_stage % v == 0:
            return v
    return 1


def case_stack(case: dict, stack: Stack | None = None) -> Stack:
    """The case's own stack (its bundled ``stack`` running its ``components``, with its
    ``stack_overrides``: launch flags its source quotes), or ``stack`` for every case when
    given."""
    name = case.get("name", "a case")
    if stack is None:
        if "stack" not in case:
            raise PlanInputError(f"{name}: no 'stack'; every case names the stack it ran on "
                                 "(`plan stacks` lists them)")
        overrides = case.get("stack_overrides") or {}
        if not isinstance(overrides, dict):
            raise PlanInputError(f"{name}: 'stack_overrides' must be an object of stack fields")
        stack = with_components(load_stack(case["stack"]), case.get("components") or [],
                                f"{name}: components")
        stack = with_overrides(stack, f"{name}: stack_overrides", **overrides)
    return with_overrides(stack, f"{name}: config", **run_options(case))


def run_options(case: dict) -> dict:
    """Stack fields the run's own configuration sets, whatever stack it is priced on: FP8
    linears where its ``precision`` names fp8 or Float8 (Transformer Engine under NeMo, torchao
    Float8 under torchtitan), each priced with its stack's recipe (cost/precision.py); the
    routed load of its busiest GPU where it states one (``expert_load``: a property of the
    model's routing on its data, as `plan solve --expert-load`, not of the software)."""
    config = case.get("config") or {}
    precision = str(config.get("precision") or "").lower()
    options = {"precision": "fp8"} if "fp8" in precision or "float8" in precision else {}
    if config.get("expert_load") is not None:
        options["moe_expert_load"] = config["expert_load"]
    return options


def case_setup(case: dict, hardware: Hardware | None = None,
               stack: Stack | None = None) -> CaseSetup:
    """Model, cluster, published configuration and the case's stack (or ``stack``) for one
    case (on ``hardware`` instead of the bundled profile of its GPU kind, when given); the
    case's own stage split (``config.stage_blocks``) where it gives one."""
    setup = _group_setup(case, hardware, stack)
    blocks = case["config"].get("stage_blocks")
    if blocks is None or setup.unsupported:
        return setup
    bounds = stage_bounds(setup.model, blocks, setup.parallel.num_chunks, setup.name)
    return replace(setup, bounds=bounds,
                   notes=setup.notes + (f"stage split {_runs_text(blocks)} blocks (the case's)",))


def _group_setup(case: dict, hardware: Hardware | None, stack: Stack | None) -> CaseSetup:
    """:func:`case_setup` by the case's group, before any split the case gives."""
    name, group = case["name"], case.get("group", "")
    m, cf = case["model"], case["config"]
    cluster, notes = case_cluster(case, hardware)
    opts = case_stack(case, stack)
    notes = list(notes)
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
            v = _megatron_interleave(m["layers"] // pp)
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
    elif _is_modern(group):
        return _modern_setup(case, cluster, notes, opts)
    elif group.startswith("moe"):
        return _moe_setup(case, cluster, notes, opts)
    else:
        return CaseSetup(name, group, sweep, None, None, None, None, None, tuple(notes),
                         unsupported=f"unknown group {group!r}: no documented stack")
    return CaseSetup(name, group, sweep, model, cluster, par, opts, bounds, tuple(notes))


# Groups of modern_runs.json, by stack.
_MODERN_PREFIXES = ("llmfoundry", "torchtitan", "llama3_405b", "nemo")

# llm-foundry's MPT: tied embeddings, no biases, LayerNorm, GeLU MLP 4h, learned positions in the
# benchmark models (NumParams grows with the sequence), no dropout (attn_pdrop, resid_pdrop and
# emb_pdrop 0.0 in scripts/train/yamls/pretrain/mpt-*.yaml).
# torchtitan and Llama 3: the Llama family (SwiGLU, RMSNorm, no biases, RoPE, untied, no dropout).


def _is_modern(group: str) -> bool:
    return group.startswith(_MODERN_PREFIXES)


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


def _stack_notes(cf: dict, opts: Stack) -> list[str]:
    """What the case's stack does beyond the defaults that moves its prediction, said once."""
    zero3 = int(cf.get("zero") or 0) >= 3
    notes = []
    if opts.precision == "fp8":  # set by run_options
        notes.append(f"FP8 block GEMMs, {opts.fp8_recipe} scaling (the stack's recipe)")
        if opts.fp8_all_gather and zero3:
            notes.append("ZeRO-3 gathers FP8 weights")
        if opts.fp8_params and not zero3:
            notes.append("FP8 primary weights: no 16-bit copy, gathered in FP8")
    if opts.zero3_pipeline_hold and zero3 and int(cf["pp"]) > 1:
        notes.append("ZeRO-3 weights and gradients held unsharded through the step (PP)")
    if opts.tp_comm_overlap and int(cf["tp"]) > 1:
        notes.append("TP overlap: Transformer Engine userbuffers per GEMM (" + userbuffers.summary(
            opts.tp_overlap_ub) + ")" if opts.tp_overlap_ub is not None else
            f"TP overlap hides {opts.tp_overlap_hidden:.0%} of the TP collectives")
    return notes


def _moe_setup(case: dict, cluster: Cluster, notes: list[str], opts: Stack) -> CaseSetup:
    """An MoE run: the model from its HuggingFace config (profiles/validation/configs/), the
    published tp, pp, dp, ep, etp, virtual stages and batch; Megatron's even block split
    unless the case gives its own (case_setup)."""
    name, group, m, cf = case["name"], case["group"], case["model"], case["config"]
    # DeepSeek-V3 report sec. 3.2.1: bidirectional, each F&B pair's all-to-all hidden behind
    # its compute (planner/pipeline/dualpipe.py)
    dual = DUALPIPE.name in str(cf.get("techniques") or "").lower()
    if dual:
        notes.append("DualPipe: two stage copies per rank, all-to-all hidden in F&B pairs")
    if opts.precision == "fp8" and not cluster.hardware.peak_fp8_tflops:
        return CaseSetup(name, group, "", None, None, None, None, None, tuple(notes),
                         unsupported=f"FP8 run on {cluster.hardware.name}, a profile without "
                                     "an FP8 peak")
    notes += _stack_notes(cf, opts)
    model = load_model(VALIDATION_DIR / "configs" / m["hf_config"]).with_seq_length(
        int(m["seq_len"]))
    tp, pp, dp = int(cf["tp"]), int(cf["pp"]), int(cf["dp"])
    gb, mb = int(cf["global_batch"]), int(cf.get("micro_batch") or 1)
    v = int(cf.get("virtual_stages") or 1)
    text = str(cf.get("recompute") or "none").lower()
    # Megatron's selective recompute of named modules: the case's stack_overrides name them
    # (recompute_modules, cost/recompute.py) as its source's --recompute-modules does
    recompute = "full" if text.startswith("full") else "none" if text == "none" else "selective"
    if cf.get("recompute") is None:
        notes.append("recompute unpublished: none")
    elif recompute == "selective":
        notes.append(f"recompute '{cf['recompute']}': selective, modules "
                     f"{', '.join(opts.recompute_modules)}")
    etp = cf.get("etp")
    # A published local batch (samples per DP rank in one pipeline run) smaller than the step's
    # share: the stack accumulates gradients over several whole pipeline runs (GA of them),
    # each filling and draining the pipeline (cases.local_batch_passes)
    per_run, passes = local_batch_passes(cf, gb, dp, name) if pp > 1 else (gb // dp, 1)
    if passes > 1:
        notes.append(f"GA {passes}: {passes} pipeline runs of {per_run // mb} microbatches a step")
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=max(1, per_run // mb),
                   schedule=(DUALPIPE.name if dual else INTERLEAVED.name if v > 1
                             else ONE_F_ONE_B.name),
                   virtual_stages=v,
                   recompute=recompute, zero=int(cf.get("zero") or 0),
                   sequence_parallel=tp > 1, ep=int(cf.get("ep") or 1),
                   etp=None if etp in (None, tp) else int(etp))
    return CaseSetup(name, group, "", model, cluster, par, opts, None, tuple(notes),
                     recompute_guessed=cf.get("recompute") is None, pipeline_passes=passes)


def local_batch_passes(cf: dict, global_batch: int, dp: int,
                       name: str = "a case") -> tuple[int, int]:
    """(samples per DP rank in one pipeline run, pipeline runs per optimizer step) of a case
    whose config gives ``local_batch``; without it one run holds the rank's whole share.

    NeMo Automodel's benchmark recipe loops its gradient accumulation over local batches, each
    one call of the pipeline schedule: 'ga_steps = global_batch_size // (local_batch_size *
    dp_size)', then 'for ga_step_idx in range(ga_steps):' ... 'batch = next(dataloader_iter)' ...
    'self._forward_backward_step(ga_step_idx, batch, ...)' (nemo_automodel/recipes/llm/
    benchmark.py, run_benchmark), which under PP runs the batch through one schedule,
    'self.pp.info.schedule.step(input_ids, target=targets, losses=losses, **batch)'
    (recipes/llm/train_ft.py); its performance table states LBS and GA per row
    (docs/performance-summary.md: 'LBS: Local Batch Size - size of one step per GPU', 'GA:
    Gradient Accumulation - number of local-batches before optimizer step'). FSDP's gradient
    sync waits for the last of them ('The patch disables sync/resharding for all backwards
    except the last one before optimizer step', nemo_automodel/components/moe/fsdp_mixin.py),
    so only the pipeline repeats. Without a pipeline (pp 1) the runs are just microbatches in
    a row, which one run of them prices alike."""
    share = global_batch // dp
    local = cf.get("local_batch")
    local = share if local is None else int(local)
    if local < 1 or share % local:
        raise PlanInputError(f"{name}: config.local_batch {local} must divide the global "
                             f"batch's share of a DP rank ({global_batch} / dp {dp} = {share})")
    return local, share // local


def _recompute_mode(text, name: str = "a case") -> tuple[str, str | None]:
    """(planner recompute mode, torchtitan's selective_ac_option or None) of a case's recompute
    text. torchtitan's selective AC comes in two policies ([activation_checkpoint]
    selective_ac_option, torchtitan/parallelisms/parallelize_llama.py
    _apply_ac_to_transformer_block): 'op', its op-level policy (recompute "selective" with the
    stack's recompute_modules set to torchtitan_op, cost/recompute.py), or an integer N, "#
    Checkpoint every `ac_freq` of the modules passed to this function" (layer SAC: every N-th
    block fully recomputed, _modern_setup). A selective text must name which, as
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


def _modern_setup(case: dict, cluster: Cluster, notes: list[str], opts: Stack) -> CaseSetup:
    """Flash attention, FSDP/ZeRO and overlapped DP traffic, as each source documents them."""
    name, group = case["name"], case["group"]
    cf = case["config"]
    if opts.precision == "fp8" and not cluster.hardware.peak_fp8_tflops:
        return CaseSetup(name, group, "", None, None, None, None, None, tuple(notes),
                         unsupported=f"FP8 run on {cluster.hardware.name}, a profile without "
                                     "an FP8 peak")
    notes += _stack_notes(cf, opts)
    model = _modern_model(case)
    tp, pp, dp = int(cf["tp"]), int(cf["pp"]), int(cf["dp"])
    gb = int(cf["global_batch"])
    mb = cf.get("micro_batch")
    if mb is None:
        mb = 1
        notes.append("micro-batch unpublished: 1")
    mb = int(mb)
    recompute, sac = _recompute_mode(cf.get("recompute"), name)
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
            v = _megatron_interleave(-(-model.num_layers // pp))
            notes.append(f"virtual stages unpublished: v={v} (smallest interleaving)")
        schedule = INTERLEAVED.name if v > 1 else ONE_F_ONE_B.name
    zero = int(cf.get("zero") or 0)
    cp = int(cf.get("cp") or 1)  # context parallel (cost/context.py): the stack's cp_comm
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=max(1, gb // (mb * dp)),
                   schedule=schedule, virtual_stages=v, recompute=recompute, zero=zero,
                   sequence_parallel=bool(cf.get("sequence_parallel")) and tp > 1, cp=cp)
    return CaseSetup(name, group, "", model, cluster, par, opts, None, tuple(notes),
                     recompute_guessed=cf.get("recompute") is None, recompute_layers=layers)
