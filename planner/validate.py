"""Prediction fidelity: the cost model against published training runs.

Every case of a published-runs file (profiles/validation/published_runs.json; its README describes
the fields) is rebuilt as a model, a cluster and the PUBLISHED parallel configuration, evaluated op
by op, and compared with what the source measured: step time, TFLOP/s per GPU in the source's own
definition, and per-GPU memory where it was published. The run options of each case are the
documented software stack of its source and year, never tuned per case (``case_setup`` says which).

Pure functions over frozen dataclasses; ``validation_table`` (rich) and ``validation_markdown``
render the result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from planner.cost import RunOptions
from planner.errors import PlanInputError
from planner.evaluate import evaluate
from planner.hardware import GIB, Cluster, Hardware, load_hardware
from planner.model import ModelSpec, _gpt
from planner.plan import Parallel

DEFAULT_FILE = (Path(__file__).resolve().parent.parent / "profiles" / "validation"
                / "published_runs.json")

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
    options: RunOptions | None
    bounds: tuple[tuple[int, int], ...] | None
    notes: tuple[str, ...]
    unsupported: str = ""


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


# --- building the cases --------------------------------------------------------------------------


def load_cases(path: str | Path = DEFAULT_FILE) -> list[dict]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanInputError(f"validation file {path} not found")
    except json.JSONDecodeError as e:
        raise PlanInputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})")
    if not isinstance(data, list):
        raise PlanInputError(f"{path}: expected a JSON list of published runs")
    return data


def case_cluster(case: dict) -> tuple[Cluster, tuple[str, ...]]:
    """The case's GPUs and links; an unpublished inter-node bandwidth falls back to the bundled
    A100-80GB profile (one 200 Gb/s HDR rail per GPU) and says so."""
    base = load_hardware("a100-80gb")
    cl = case["cluster"]
    notes = []
    inter = cl.get("inter_node_GBps")
    if inter is None:
        inter = base.inter_node_gbps
        notes.append(f"inter-node bandwidth unpublished: bundled a100-80gb {inter:g} GB/s")
    per_node = int(cl["gpus_per_node"])
    hw = Hardware(name=cl.get("gpu", base.name), peak_tflops=float(cl["peak_tflops_bf16"]),
                  memory_gib=float(cl.get("hbm_gb") or base.memory_gib),
                  memory_bandwidth_gbps=base.memory_bandwidth_gbps,
                  intra_node_gbps=float(cl["intra_node_GBps"]), inter_node_gbps=float(inter),
                  gpus_per_node=per_node)
    gpus = int(cl["gpus"])
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


def case_setup(case: dict) -> CaseSetup:
    """Model, cluster, published configuration and the source's documented stack for one case."""
    name, group = case["name"], case.get("group", "")
    m, cf = case["model"], case["config"]
    cluster, notes = case_cluster(case)
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
        opts = RunOptions(flash_attention=False, overlap_dp=False, grad_bytes=4)
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
        # 250,880 vocabulary tied, unfused attention, BF16_Optimizer = ZeRO-1 with an fp32
        # gradient accumulation buffer beside the kept bf16 grads, DeepSpeed's 1F1B TrainSchedule
        # keeping stage outputs until their backward, all-reduce after the backward (not
        # overlapped), full recompute keeping only layer inputs; its pipeline sends the whole
        # activation from every TP rank (no Megatron scatter/gather).
        model = ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"],
                          num_attention_heads=m["heads"], num_kv_heads=m["heads"],
                          ffn_hidden_size=m["ffn_hidden"], vocab_size=m["vocab"],
                          seq_length=m["seq_len"], mlp="gelu", norm="layernorm", bias=True,
                          tie_embeddings=True)
        opts = RunOptions(flash_attention=False, overlap_dp=False, grad_bytes=4,
                          lowp_grad_copy=True, keep_stage_outputs=True, scatter_gather=False)
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
        opts = RunOptions(flash_attention=False, overlap_dp=False, grad_bytes=4)
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
    else:
        return CaseSetup(name, group, sweep, None, None, None, None, None, tuple(notes),
                         unsupported=f"unknown group {group!r}: no documented stack")
    return CaseSetup(name, group, sweep, model, cluster, par, opts, bounds, tuple(notes))


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


def validate_case(case: dict, simulated: bool = True) -> ValidationRow:
    """Evaluate one published case and compare it with what was measured."""
    setup = case_setup(case)
    me = case["measured"]
    measured_s = float(me["step_time_s"])
    tokens = case["config"]["global_batch"] * case["model"]["seq_len"]
    mem = me.get("memory_gb_per_gpu")
    hardware_def = _hardware_definition(case)
    common = dict(case=setup.name, group=setup.group, sweep=setup.sweep,
                  measured_step_s=measured_s, measured_tokens_per_s=tokens / measured_s,
                  tflops_definition="hardware" if hardware_def else "model",
                  measured_tflops=me.get("tflops_per_gpu"),
                  measured_memory_gib=float(mem) if mem is not None else None)
    if setup.unsupported:
        return ValidationRow(configuration=str(case["config"].get("schedule")),
                             predicted_step_s=None, predicted_tokens_per_s=None,
                             predicted_tflops=None, predicted_memory_gib=None,
                             predicted_oom=False,
                             note="; ".join(("skipped: " + setup.unsupported,) + setup.notes),
                             **common)
    plan = evaluate(setup.model, setup.cluster, setup.parallel, setup.options,
                    bounds=list(setup.bounds) if setup.bounds else None, simulated=simulated)
    mt = plan.metrics
    peak = setup.cluster.hardware.peak_tflops
    predicted_mem = mt.peak_memory_bytes / MEMORY_UNIT_BYTES
    return ValidationRow(
        configuration=_configuration(setup.parallel), predicted_step_s=mt.step_time_s,
        predicted_tokens_per_s=mt.tokens_per_s,
        predicted_tflops=(mt.hfu if hardware_def else mt.mfu) * peak,
        predicted_memory_gib=predicted_mem if mem is not None else None,
        predicted_oom=mt.peak_memory_bytes > setup.cluster.hardware.memory_bytes,
        note="; ".join(setup.notes), **common)


def validate_cases(cases: list[dict], simulated: bool = True) -> tuple[ValidationRow, ...]:
    return tuple(validate_case(c, simulated) for c in cases)


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
        oom_mismatches=tuple(r.case for r in done if r.predicted_oom))


def validate_file(path: str | Path = DEFAULT_FILE, simulated: bool = True
                  ) -> tuple[tuple[ValidationRow, ...], ValidationSummary]:
    """Rows and summary for every case of a published-runs file."""
    rows = validate_cases(load_cases(path), simulated)
    return rows, summarize(rows)


# --- rendering -----------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _cells(r: ValidationRow) -> list[str]:
    return [r.case, r.configuration, _num(r.measured_step_s, ".2f"),
            _num(r.predicted_step_s, ".2f"), _pct(r.time_error),
            f"{_num(r.measured_tflops, '.0f')} / {_num(r.predicted_tflops, '.0f')}"
            + (" (HFU)" if r.tflops_definition == "hardware" else " (MFU)"),
            f"{_num(r.measured_memory_gib, '.0f')} / {_num(r.predicted_memory_gib, '.1f')}",
            _pct(r.memory_error), r.note]


_HEADERS = ["case", "configuration", "measured s", "predicted s", "time err",
            "TFLOP/s meas / pred", "mem GiB meas / pred", "mem err", "note"]


def summary_lines(s: ValidationSummary) -> list[str]:
    lines = [f"{s.evaluated} of {s.cases} cases evaluated"
             + (f" ({len(s.skipped)} skipped: no equivalent schedule)" if s.skipped else ""),
             f"step time: mean |error| {s.mean_abs_time_error:.1%}, max {s.max_abs_time_error:.1%}"
             f" ({s.worst_case})"]
    if s.memory_cases:
        lines.append(f"memory ({s.memory_cases} cases): error {s.min_memory_error:+.1%} .. "
                     f"{s.max_memory_error:+.1%}")
    for sweep, rho in s.spearman:
        lines.append(f"Spearman speed ranking, {sweep}: {rho:.2f}")
    lines.append("predicted OOM on runs that ran: "
                 + (", ".join(s.oom_mismatches) if s.oom_mismatches else "none"))
    return lines


def validation_table(rows, summary: ValidationSummary):
    """A rich table of the rows, its caption the summary: what ``plan validate`` prints."""
    from rich.table import Table

    table = Table(title="Predictions against published runs", title_justify="left",
                  caption="\n".join(summary_lines(summary)), caption_justify="left")
    for h in _HEADERS:
        table.add_column(h, justify="left" if h in ("case", "configuration", "note") else "right")
    for r in rows:
        table.add_row(*_cells(r))
    return table


def validation_markdown(rows, summary: ValidationSummary) -> str:
    """The same table as GitHub markdown, summary first, for the README."""
    out = ["- " + line for line in summary_lines(summary)] + [""]
    out.append("| " + " | ".join(_HEADERS) + " |")
    out.append("|" + "|".join("---" for _ in _HEADERS) + "|")
    for r in rows:
        out.append("| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |")
    return "\n".join(out) + "\n"
