"""Rich tables for plans, models and hardware: what the CLI prints."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from planner.core.units import GIB
from planner.hardware.profiles import Hardware
from planner.model.spec import ModelSpec
from planner.predict.plan import Plan



def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def blocks_per_stage(plan: Plan) -> str:
    """Transformer blocks per chunk, compactly: "8x4" when even, "7|9x2|6" when only the edge
    stages differ (Megatron's first/last-stage flags), "5-9" otherwise."""
    layers = plan.model.layers
    counts = [sum(1 for layer in layers[s.first:s.last] if layer.kind == "block")
              for s in plan.stages]
    if len(set(counts)) == 1:
        return f"{counts[0]}x{len(counts)}"
    middle = counts[1:-1]
    if len(counts) > 2 and len(set(middle)) == 1:
        return f"{counts[0]}|{middle[0]}x{len(middle)}|{counts[-1]}"
    if len(counts) == 2:
        return f"{counts[0]}|{counts[1]}"
    return f"{min(counts)}-{max(counts)}"


def recompute_label(plan: Plan) -> str:
    """The recompute mode, or the modes the stages mix (the partitioner picks one per stage)."""
    modes = [m for m in ("none", "selective", "full") if any(s.recompute == m for s in plan.stages)]
    return "/".join(modes)


def plans_table(plans: list[Plan] | tuple[Plan, ...], title: str) -> Table:
    """The ranked plans, compact enough for a 100-column terminal: degrees as tp·pp·dp,
    micro-batch × microbatches, interleaving in the schedule (v4), the global batch in the
    title when every plan shares it; TFLOP/s per GPU is in the JSON (MFU says the same)."""
    batches = {p.parallel.global_batch for p in plans}
    if len(batches) == 1:
        title += f", global batch {batches.pop()}"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1, 0, 1), collapse_padding=True)
    columns = ["#", "tp·pp·dp", "mb×M", "schedule", "blocks", "recomp", "ZeRO", "SP", "step s",
               "tokens/s", "MFU", "mem GiB", "bubble"]
    if len({p.parallel.global_batch for p in plans}) > 1:
        columns.insert(3, "batch")
    for col in columns:
        table.add_column(col, justify="left" if col in ("schedule", "recomp", "blocks")
                         else "right")
    for i, plan in enumerate(plans, 1):
        p, m = plan.parallel, plan.metrics
        cells = {
            "#": str(i), "tp·pp·dp": f"{p.tp}·{p.pp}·{p.dp}",
            "mb×M": f"{p.micro_batch}×{p.num_microbatches}", "batch": str(p.global_batch),
            "schedule": p.schedule + (f" v{p.virtual_stages}" if p.virtual_stages > 1 else ""),
            "blocks": blocks_per_stage(plan), "recomp": recompute_label(plan),
            "ZeRO": str(p.zero), "SP": "on" if p.sequence_parallel else "off",
            "step s": f"{m.step_time_s:.3f}", "tokens/s": _si(m.tokens_per_s),
            "MFU": f"{m.mfu:.1%}", "mem GiB": f"{m.peak_memory_bytes / GIB:.1f}",
            "bubble": f"{m.bubble_fraction:.1%}"}
        table.add_row(*(cells[c] for c in columns))
    return table


def rejected_line(rejected: dict[str, int]) -> str:
    if not rejected:
        return "rejected: none"
    items = sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))
    return "rejected: " + ", ".join(f"{reason} {count}" for reason, count in items)


def models_table(models: dict[str, ModelSpec]) -> Table:
    table = Table(title="Model presets (plan solve --model NAME)", title_justify="left")
    for col in ("name", "params", "layers", "hidden", "heads", "kv", "ffn", "mlp", "vocab",
                "seq"):
        table.add_column(col, justify="left" if col in ("name", "mlp") else "right")
    for name, m in models.items():
        table.add_row(name, _si(m.params), str(m.num_layers), str(m.hidden_size),
                      str(m.num_attention_heads), str(m.num_kv_heads), str(m.ffn_hidden_size),
                      m.mlp, str(m.vocab_size), str(m.seq_length))
    return table


def hardware_table(gpus: dict[str, Hardware]) -> Table:
    table = Table(title="Bundled GPUs (plan solve --gpu NAME, or --hardware FILE)",
                  title_justify="left")
    for col in ("name", "bf16 TFLOP/s", "memory GiB", "HBM GB/s", "NVLink GB/s", "network GB/s",
                "GPUs/node"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for name, hw in gpus.items():
        table.add_row(name, f"{hw.peak_tflops:g}", f"{hw.memory_gib:g}",
                      f"{hw.memory_bandwidth_gbps:g}", f"{hw.intra_node_gbps:g}",
                      f"{hw.inter_node_gbps:g}", str(hw.gpus_per_node))
    return table


def print_search(console: Console, result, model: ModelSpec, cluster) -> None:
    nodes = f"{cluster.nodes} node" + ("s" if cluster.nodes > 1 else "")
    title = (f"{model.name} ({_si(model.params)} params, seq {model.seq_length}) on "
             f"{cluster.gpus} x {cluster.hardware.name} ({nodes})")
    console.print(plans_table(result.plans, title))
    console.print(f"{result.screened} configurations screened in {result.elapsed_s:.2f} s; "
                  + rejected_line(result.rejected))
    for note in result.notes:
        console.print(f"[dim]{note}[/dim]")
    for note in result.plans[0].notes:
        console.print(f"[dim]{note}[/dim]")
    console.print("[dim]how close such predictions come to real runs: `plan validate`[/dim]")


CSV_COLUMNS = ("tp", "pp", "dp", "micro_batch", "num_microbatches", "global_batch", "schedule",
               "virtual_stages", "recompute", "zero", "sequence_parallel", "step_time_s",
               "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes",
               "bubble_fraction")


def plans_csv(plans) -> str:
    """The ranked plans as CSV, one row per plan, the plan JSON's field names as header."""
    rows = [",".join(CSV_COLUMNS)]
    for plan in plans:
        d = plan.to_dict(with_layout=False)
        values = {**d["parallel"], **d["metrics"]}
        rows.append(",".join(str(values[c]).lower() if isinstance(values[c], bool)
                             else str(values[c]) for c in CSV_COLUMNS))
    return "\n".join(rows) + "\n"


def print_explanation(console: Console, exp) -> None:
    """Fits or not, and by how much; the stages and their memory when it was predicted."""
    if exp.plan is None:
        console.print(f"[bold red]not a valid configuration:[/bold red] {exp.rule}",
                      highlight=False)
        return
    m = exp.plan.metrics
    console.print(plans_table([exp.plan], "the pinned configuration"))
    spare = exp.capacity_bytes - m.peak_memory_bytes
    if spare >= 0:
        console.print(f"[green]fits[/green]: {m.peak_memory_bytes / GIB:.1f} GiB of "
                      f"{exp.capacity_bytes / GIB:.0f} GiB per GPU ({spare / GIB:.1f} GiB spare)")
    else:
        console.print(f"[red]does not fit[/red]: needs {m.peak_memory_bytes / GIB:.1f} GiB of "
                      f"{exp.capacity_bytes / GIB:.0f} GiB per GPU ({-spare / GIB:.1f} GiB over); "
                      "try recompute, more pipeline stages or a higher ZeRO stage")
    table = Table(title="per pipeline rank", title_justify="left")
    for col in ("rank", "layers", "recompute", "time/microbatch s", "memory GiB"):
        table.add_column(col, justify="right")
    for r, mem in enumerate(exp.plan.rank_memory_bytes):
        chunks = [s for s in exp.plan.stages if s.rank == r]
        layers = " ".join(f"[{s.first},{s.last})" for s in chunks)
        table.add_row(str(r), layers, chunks[0].recompute, f"{sum(s.time_s for s in chunks):.4f}",
                      f"{mem / GIB:.1f}")
    console.print(table)
