"""Prediction fidelity: the cost model against published training runs.

Every case of a published-runs file (profiles/validation/published_runs.json; its README describes
the fields) is rebuilt as a model, a cluster and the PUBLISHED parallel configuration, evaluated op
by op, and compared with what the source measured: step time, TFLOP/s per GPU in the source's own
definition, and per-GPU memory where it was published. The run options of each case are the
documented software stack of its source and year, never tuned per case: each case names its
bundled stack (``stack``, profiles/stacks/) and any ``stack_overrides``; ``plan validate --stack``
prices every case on one stack instead.

Pure functions over frozen dataclasses; planner/report/validation.py renders the result (a rich
table, or markdown for the README) from the rows' DataFrame.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.fidelity.runs_schema import check_runs_document
from planner.predict.step import evaluate
from planner.core.units import DATA_DIR, GIB
from planner.hardware.profiles import Cluster, Hardware, load_hardware
from planner.model.spec import ModelSpec, _gpt
from planner.core.parallel import Parallel
from planner.stack import Stack, load_stack, with_overrides

VALIDATION_DIR = DATA_DIR / "validation"
# The 2020-23 runs (unfused attention, Megatron-LM / Megatron-DeepSpeed) and the modern stacks
# (flash attention, FSDP / ZeRO-3, Megatron-Core, torchtitan); ``validate_file`` reads both.
DEFAULT_FILE = VALIDATION_DIR / "published_runs.json"
MODERN_FILE = VALIDATION_DIR / "modern_runs.json"
DEFAULT_FILES = (DEFAULT_FILE, MODERN_FILE)
# How each file is named in the summary's per-group lines.
DATASET_LABELS = {"published_runs": "old", "modern_runs": "modern"}

# Zero-bubble cases publish no vocabulary: GPT-2 BPE padded to 51,200 as in Megatron-LM's GPT
# runs (Narayanan et al. 2021, Table 1). It is 2-4% of the parameters of the 1.5B/14.6B models.
GPT2_PADDED_VOCAB = 51200

# Published memory is read as GiB (2^30 bytes): BLOOM's chronicles quote nvidia-smi, which reports
# MiB, and the zero-bubble Table 4 comes from PyTorch's allocator statistics, also binary units.
# Reading them as GiB is also the strict choice for "never under-estimated": a GiB is the larger
# unit, so an under-estimate in GiB is at least as large as one in 10^9 bytes.
MEMORY_UNIT_BYTES = GIB


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
    # torchtitan's selective AC: evaluated as the mean of no and full recompute (_recompute_mode)
    half_recompute: bool = False
    # unpublished recompute: none, unless none would not fit where the run did (validate_case)
    recompute_guessed: bool = False


@dataclass(frozen=True)
class ValidationRow:
    """One case: measured against predicted. Errors are signed fractions (predicted/measured-1)."""

    case: str
    group: str
    sweep: str
    configuration: str
    measured_step_s: float
    predicted_step_s: float | None
    measured_tokens_per_s: float
    predicted_tokens_per_s: float | None
    tflops_definition: str  # "hardware" (recompute counted) or "model"
    measured_tflops: float | None
    predicted_tflops: float | None
    measured_memory_gib: float | None
    predicted_memory_gib: float | None
    predicted_oom: bool
    note: str
    dataset: str = ""  # which file: "old" (published_runs.json) or "modern" (modern_runs.json)
    stack: str = ""  # the stack it was priced on, with its overrides (Stack.label)

    @property
    def supported(self) -> bool:
        return self.predicted_step_s is not None

    @property
    def time_error(self) -> float | None:
        if self.predicted_step_s is None:
            return None
        return self.predicted_step_s / self.measured_step_s - 1

    @property
    def memory_error(self) -> float | None:
        if self.predicted_memory_gib is None or self.measured_memory_gib is None:
            return None
        return self.predicted_memory_gib / self.measured_memory_gib - 1


@dataclass(frozen=True)
class ValidationSummary:
    """Fidelity over the evaluated cases; ``spearman`` maps each sweep to its rank correlation
    between predicted and measured speed (tokens/s), for sweeps of three or more cases."""

    cases: int
    evaluated: int
    skipped: tuple[str, ...]
    mean_abs_time_error: float
    max_abs_time_error: float
    worst_case: str
    memory_cases: int
    min_memory_error: float | None  # most negative = worst under-estimate
    max_memory_error: float | None
    spearman: tuple[tuple[str, float], ...]
    oom_mismatches: tuple[str, ...]  # published runs ran, so any predicted OOM is a miss
    # the same summary per dataset ("old", "modern"), when the rows come from more than one
    groups: tuple[tuple[str, ValidationSummary], ...] = ()
    skip_reasons: tuple[str, ...] = ()  # why each skipped case was skipped (same order)


# --- building the cases --------------------------------------------------------------------------


def load_cases(path: str | Path = DEFAULT_FILE) -> list[dict]:
    data = read_json(path, "validation file")
    check_runs_document(data, str(path))  # every case's keys, types, ranges: runs_schema.py
    return data


def base_profile(gpu: str) -> str:
    """The bundled profile of the case's GPU kind: its HBM bandwidth and measured efficiencies
    are the part's, whatever the source publishes about the cluster."""
    text = gpu.lower()
    if "h100" in text:
        return "h100-sxm-80gb"
    if "a100" in text and "40" in text:
        return "a100-40gb"
    return "a100-80gb"


def case_cluster(case: dict, hardware: Hardware | None = None) -> tuple[Cluster, tuple[str, ...]]:
    """The case's GPUs and links on the bundled profile of its GPU kind (HBM bandwidth and
    efficiencies), or on ``hardware`` (a calibrated profile) when given; an unpublished
    inter-node bandwidth falls back to that profile's (one NIC per GPU: 200 Gb/s HDR on A100,
    400 Gb/s NDR on H100) and says so."""
    cl = case["cluster"]
    profile = base_profile(str(cl.get("gpu", "")))
    base = hardware or load_hardware(profile)
    notes = []
    inter = cl.get("inter_node_GBps")
    per_node = int(cl["gpus_per_node"])
    gpus = int(cl["gpus"])
    if inter is None:
        inter = base.inter_node_gbps
        if gpus > per_node:
            notes.append(f"inter-node bandwidth unpublished: bundled {profile} {inter:g} GB/s")
    hw = replace(base, name=cl.get("gpu", base.name), peak_tflops=float(cl["peak_tflops_bf16"]),
                 memory_gib=float(cl.get("hbm_gb") or base.memory_gib),
                 intra_node_gbps=float(cl["intra_node_GBps"]), inter_node_gbps=float(inter),
                 gpus_per_node=per_node)
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


def _megatron_interleave(layers_per_stage: int) -> int:
    """Unreported virtual stages of the 2021 runs: the smallest interleaving the layer count
    allows (v = smallest divisor > 1 of the layers per stage), the least extra communication."""
    for v in range(2, layers_per_stage + 1):
        if layers_per_stage % v == 0:
            return v
    return 1


def case_stack(case: dict, stack: Stack | None = None) -> Stack:
    """The case's own stack (its bundled ``stack`` with its ``stack_overrides``), or ``stack``
    for every case when given."""
    if stack is not None:
        return stack
    name = case.get("name", "a case")
    if "stack" not in case:
        raise PlanInputError(f"{name}: no 'stack'; every case names the stack it ran on "
                             "(`plan stacks` lists them)")
    overrides = case.get("stack_overrides") or {}
    if not isinstance(overrides, dict):
        raise PlanInputError(f"{name}: 'stack_overrides' must be an object of stack fields")
    return with_overrides(load_stack(case["stack"]), f"{name}: stack_overrides", **overrides)


def case_setup(case: dict, hardware: Hardware | None = None,
               stack: Stack | None = None) -> CaseSetup:
    """Model, cluster, published configuration and the case's stack (or ``stack``) for one
    case (on ``hardware`` instead of the bundled profile of its GPU kind, when given)."""
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
        model = _gpt(name, m["layers"], m["hidden"], m["heads"], vocab=m["vocab"],
                     seq=m["seq_len"], ffn=m["ffn_hidden"])
        mb = int(cf["micro_batch"] or 1)
        if cf["micro_batch"] is None:
            notes.append("micro-batch unpublished: 1 (as the README GPT-3 run)")
        schedule, v = "1f1b", int(cf.get("virtual_stages") or 1)
        sched_text = str(cf["schedule"]).lower()
        if sched_text.startswith("interleaved") and cf.get("virtual_stages") is None and pp > 1:
            v = _megatron_interleave(m["layers"] // pp)
            schedule = "interleaved" if v > 1 else "1f1b"
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
                       schedule="1f1b", virtual_stages=1, recompute="full",
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
        schedule, v = {"1F1B": ("1f1b", 1), "ZB-1p": ("zb-h1", 1)}.get(sched, (None, 1))
        if sched == "1F1B-I":
            schedule, v = "interleaved", len(model.layers) // pp  # one layer per chunk
            notes.append(f"v={v}: one layer per chunk")
        if schedule is None:
            return CaseSetup(name, group, sweep, None, None, None, None, None, tuple(notes),
                             unsupported=f"{sched}: no equivalent schedule (ZB-2p's 2p "
                                         "activation limit is not modelled)")
        if sched == "ZB-1p":
            notes.append("ZB-1p as zb-h1")
        par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=gb // (mb * dp),
                       schedule=schedule, virtual_stages=v, recompute="none", zero=0,
                       sequence_parallel=False)
        bounds = _uniform_bounds(model, pp * v)
    elif _is_modern(group):
        return _modern_setup(case, cluster, notes, opts)
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
    return ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"],
                     num_attention_heads=m["heads"], num_kv_heads=m.get("kv_heads") or m["heads"],
                     ffn_hidden_size=m["ffn_hidden"], vocab_size=m["vocab"] or GPT2_PADDED_VOCAB,
                     seq_length=m["seq_len"], mlp=m.get("mlp", "swiglu"),
                     norm="rmsnorm" if m.get("mlp", "swiglu") == "swiglu" else "layernorm",
                     bias=False, tie_embeddings=False, dropout=False)


def _recompute_mode(text) -> tuple[str, bool]:
    """(planner recompute mode, half): torchtitan's selective AC recomputes about half a block's
    forward (layer policy: every other block checkpointed; op policy: every other matmul and the
    element-wise ops), so it is evaluated as the mean of no and full recompute (``half``)."""
    text = str(text or "none").lower()
    if text.startswith("full"):
        return "full", False
    if text.startswith("selective"):
        return "none", True
    return "none", False


def _modern_setup(case: dict, cluster: Cluster, notes: list[str], opts: Stack) -> CaseSetup:
    """Flash attention, FSDP/ZeRO and overlapped DP traffic, as each source documents them."""
    name, group = case["name"], case["group"]
    cf = case["config"]
    precision = str(cf.get("precision") or "").lower()
    techniques = str(cf.get("techniques") or "").lower()
    skip = ""
    if "fp8" in precision or "float8" in precision:
        skip = "FP8 not modelled"
    elif int(cf.get("cp") or 1) > 1:
        skip = f"context parallelism (cp={cf['cp']}) not modelled"
    elif "compile" in techniques:
        skip = "torch.compile (fused element-wise kernels) not modelled"
    if skip:
        return CaseSetup(name, group, "", None, None, None, None, None, tuple(notes),
                         unsupported=skip)
    model = _modern_model(case)
    tp, pp, dp = int(cf["tp"]), int(cf["pp"]), int(cf["dp"])
    gb = int(cf["global_batch"])
    mb = cf.get("micro_batch")
    if mb is None:
        mb = 1
        notes.append("micro-batch unpublished: 1")
    mb = int(mb)
    recompute, half = _recompute_mode(cf.get("recompute"))
    if cf.get("recompute") is None:
        notes.append("recompute unpublished: none")
    if half:
        notes.append("selective AC (about half the forward recomputed): mean of none and full")
    schedule, v = "1f1b", 1
    sched_text = str(cf.get("schedule") or "").lower()
    if pp > 1 and sched_text.startswith("interleaved"):
        v = int(cf.get("virtual_stages") or 0)
        if not v:
            v = _megatron_interleave(-(-model.num_layers // pp))
            notes.append(f"virtual stages unpublished: v={v} (smallest interleaving)")
        schedule = "interleaved" if v > 1 else "1f1b"
    zero = int(cf.get("zero") or 0)
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=max(1, gb // (mb * dp)),
                   schedule=schedule, virtual_stages=v, recompute=recompute, zero=zero,
                   sequence_parallel=bool(cf.get("sequence_parallel")) and tp > 1)
    return CaseSetup(name, group, "", model, cluster, par, opts, None, tuple(notes),
                     half_recompute=half, recompute_guessed=cf.get("recompute") is None)


# --- evaluating ----------------------------------------------------------------------------------


def _hardware_definition(case: dict) -> bool:
    """Whether the source's TFLOP/s count the recomputed forward (Megatron eq. 3 convention)."""
    text = str(case["measured"].get("tflops_definition") or "").lower()
    return any(k in text for k in ("eq.(3)", "eq.3", "eq. 3", "recompute-inclusive",
                                   "counts the recompute", "hardware"))


def _configuration(par: Parallel) -> str:
    text = f"tp{par.tp} pp{par.pp} dp{par.dp} mb{par.micro_batch} M{par.num_microbatches} " \
           f"{par.schedule}"
    if par.virtual_stages > 1:
        text += f" v{par.virtual_stages}"
    return text + f" {par.recompute} ZeRO-{par.zero}"


def _predicted(setup: CaseSetup, simulated: bool) -> tuple[float, float, float, float]:
    """(step s, tokens/s, MFU, HFU, peak bytes) of a case's configuration; a half recompute is
    the mean of the none and full evaluations."""
    modes = ("none", "full") if setup.half_recompute else (setup.parallel.recompute,)
    got = []
    for mode in modes:
        plan = evaluate(setup.model, setup.cluster, replace(setup.parallel, recompute=mode),
                        setup.options, bounds=list(setup.bounds) if setup.bounds else None,
                        simulated=simulated)
        mt = plan.metrics
        got.append((mt.step_time_s, mt.mfu * mt.step_time_s, mt.hfu * mt.step_time_s,
                    mt.peak_memory_bytes))
    step = sum(g[0] for g in got) / len(got)
    # MFU and HFU are FLOPs over time: average the FLOPs (x step), then divide by the mean step
    return (step, sum(g[1] for g in got) / len(got) / step,
            sum(g[2] for g in got) / len(got) / step, sum(g[3] for g in got) / len(got))


def validate_case(case: dict, simulated: bool = True, dataset: str = "",
                  hardware: Hardware | None = None, stack: Stack | None = None) -> ValidationRow:
    """Evaluate one published case on its stack (or ``stack``) and compare it with what was
    measured (on ``hardware``, a calibrated profile, instead of the bundled profile of its GPU
    kind, when given)."""
    setup = case_setup(case, hardware, stack)
    me = case["measured"]
    measured_s = float(me["step_time_s"])
    tokens = case["config"]["global_batch"] * case["model"]["seq_len"]
    mem = me.get("memory_gb_per_gpu")
    hardware_def = _hardware_definition(case)
    common = dict(case=setup.name, group=setup.group, sweep=setup.sweep, dataset=dataset,
                  stack=case_stack(case, stack).label(),
                  measured_step_s=measured_s, measured_tokens_per_s=tokens / measured_s,
                  tflops_definition="hardware" if hardware_def else "model",
                  measured_tflops=me.get("tflops_per_gpu"),
                  measured_memory_gib=_memory_gib(me))
    if setup.unsupported:
        return ValidationRow(configuration=str(case["config"].get("schedule")),
                             predicted_step_s=None, predicted_tokens_per_s=None,
                             predicted_tflops=None, predicted_memory_gib=None,
                             predicted_oom=False,
                             note="; ".join(("skipped: " + setup.unsupported,) + setup.notes),
                             **common)
    step, mfu, hfu, peak_bytes = _predicted(setup, simulated)
    if setup.recompute_guessed and peak_bytes > setup.cluster.hardware.memory_bytes:
        # the run fitted, so it recomputed: the guess moves to full recompute
        notes = tuple(n for n in setup.notes if not n.startswith("recompute unpublished"))
        setup = replace(setup, parallel=replace(setup.parallel, recompute="full"),
                        notes=notes + ("recompute unpublished: full (none would not fit)",))
        step, mfu, hfu, peak_bytes = _predicted(setup, simulated)
    peak = setup.cluster.hardware.peak_tflops
    predicted_mem = peak_bytes / MEMORY_UNIT_BYTES
    config = _configuration(setup.parallel)
    if setup.half_recompute:
        config = config.replace(" none ZeRO", " half ZeRO")
    return ValidationRow(
        configuration=config, predicted_step_s=step, predicted_tokens_per_s=tokens / step,
        predicted_tflops=(hfu if hardware_def else mfu) * peak,
        predicted_memory_gib=predicted_mem if mem is not None else None,
        predicted_oom=peak_bytes > setup.cluster.hardware.memory_bytes,
        note="; ".join(setup.notes), **common)


def _memory_gib(measured: dict) -> float | None:
    """Published memory in GiB: modern_runs.json keeps the source's GiB as
    ``memory_gib_per_gpu`` (torchtitan logs GiB); published_runs.json's ``memory_gb_per_gpu`` is
    read as GiB (MEMORY_UNIT_BYTES)."""
    if measured.get("memory_gib_per_gpu") is not None:
        return float(measured["memory_gib_per_gpu"])
    mem = measured.get("memory_gb_per_gpu")
    return float(mem) if mem is not None else None


def validate_cases(cases: list[dict], simulated: bool = True, dataset: str = "",
                   hardware: Hardware | None = None, stack: Stack | None = None,
                   progress=None) -> tuple[ValidationRow, ...]:
    """Every case predicted; ``progress(n)`` before each (the CLI's bar)."""
    rows = []
    for n, case in enumerate(cases):
        if progress:
            progress(n)
        try:
            rows.append(validate_case(case, simulated, dataset, hardware, stack))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, PlanInputError):
                raise
            name = case.get("name", f"case {n}") if isinstance(case, dict) else f"case {n}"
            raise PlanInputError(f"{name}: not a published-run record ({type(e).__name__}: {e}); "
                                 "see profiles/validation/published_runs.json for the format")
    return tuple(rows)


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the (tie-averaged) ranks."""
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else 0.0


def summarize(rows: tuple[ValidationRow, ...] | list[ValidationRow]) -> ValidationSummary:
    """Overall fidelity, and per dataset in ``groups`` when the rows come from several files."""
    labels = list(dict.fromkeys(r.dataset for r in rows))
    groups = tuple((label, _summarize([r for r in rows if r.dataset == label]))
                   for label in labels) if len(labels) > 1 else ()
    return replace(_summarize(rows), groups=groups)


def _summarize(rows) -> ValidationSummary:
    done = [r for r in rows if r.supported]
    errors = [abs(r.time_error) for r in done]
    worst = max(done, key=lambda r: abs(r.time_error)) if done else None
    mem = [r.memory_error for r in done if r.memory_error is not None]
    sweeps: dict[str, list[ValidationRow]] = {}
    for r in done:
        sweeps.setdefault(r.sweep, []).append(r)
    rho = tuple((k, spearman([r.predicted_tokens_per_s for r in v],
                             [r.measured_tokens_per_s for r in v]))
                for k, v in sorted(sweeps.items()) if k and len(v) >= 3)
    return ValidationSummary(
        cases=len(rows), evaluated=len(done),
        skipped=tuple(r.case for r in rows if not r.supported),
        mean_abs_time_error=sum(errors) / len(errors) if errors else 0.0,
        max_abs_time_error=max(errors, default=0.0),
        worst_case=worst.case if worst else "",
        memory_cases=len(mem), min_memory_error=min(mem, default=None),
        max_memory_error=max(mem, default=None), spearman=rho,
        oom_mismatches=tuple(r.case for r in done if r.predicted_oom),
        skip_reasons=tuple(r.note.split(";")[0].removeprefix("skipped: ")
                           for r in rows if not r.supported))


def validate_file(path=DEFAULT_FILES, simulated: bool = True, hardware: Hardware | None = None,
                  stack: Stack | None = None, progress=None
                  ) -> tuple[tuple[ValidationRow, ...], ValidationSummary]:
    """Rows and summary for every case of one published-runs file or several (default: the old
    and the modern file); each row's ``dataset`` names its file (DATASET_LABELS). ``hardware``
    (a calibrated profile) replaces the bundled profile of every case's GPU kind, ``stack``
    the stack every case names. ``progress(done, total)`` is called as the cases are predicted."""
    paths = [path] if isinstance(path, (str, Path)) else list(path or DEFAULT_FILES)
    files = [(Path(p), load_cases(p)) for p in paths]
    total = sum(len(cases) for _, cases in files)
    rows: tuple[ValidationRow, ...] = ()
    for p, cases in files:
        label = DATASET_LABELS.get(p.stem, p.stem)
        done = len(rows)
        report = (lambda n, done=done: progress(done + n, total)) if progress else None
        rows += validate_cases(cases, simulated, label, hardware, stack, report)
    if progress:
        progress(total, total)
    return rows, summarize(rows)
