"""Rich tables for plans: what `plan solve` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from planner.core.text import for_rich
from planner.core.units import GIB
from planner.fidelity.band import ErrorBand, plan_band
from planner.fidelity.record import load_record, record_line
from planner.model.spec import ModelSpec
from planner.predict.plan import Plan
from planner.report.frames import blocks_per_stage, stage_recompute
from planner.report.listing import MEASURE
from planner.stack import default_stack




def si_count(x: float) -> str:
    """8.03B, 1.20M: a count in three significant figures."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def expert_label(par) -> str:
    """' ep8' (and ' etp1' where expert TP differs from tp) for an expert-parallel plan."""
    out = f" ep{par.ep}" if par.ep > 1 else ""
    return out + (f" etp{par.expert_tp}" if par.expert_tp != par.tp else "")


def recompute_label(plan: Plan) -> str:
    """The recompute mode, or the modes the stages mix (the partitioner picks one per stage)."""
    return stage_recompute(plan)


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Plan], str]
    left: bool = False
    knob: bool = True  # part of the configuration (False: a predicted number)


# Every column the plans table can show, most important first: at a narrow width the table drops
# columns from the end of this list (never one that tells two shown rows apart), and says which.
COLUMNS = (
    Column("#", lambda p: ""),  # filled with the rank
    Column("tp·pp·dp", lambda p: f"{p.parallel.tp}·{p.parallel.pp}·{p.parallel.dp}"
           + expert_label(p.parallel)),
    # shown instead of tp·pp·dp when a plan splits the sequence (context parallelism)
    Column("tp·cp·pp·dp", lambda p: f"{p.parallel.tp}·{p.parallel.cp}·{p.parallel.pp}·"
                                    f"{p.parallel.dp}" + expert_label(p.parallel)),
    Column("mb×M", lambda p: f"{p.parallel.micro_batch}×{p.parallel.num_microbatches}"),
    Column("batch", lambda p: str(p.parallel.global_batch)),
    Column("schedule", lambda p: p.parallel.schedule + (f" v{p.parallel.virtual_stages}"
                                                        if p.parallel.virtual_stages > 1 else ""),
           left=True),
    Column("step s", lambda p: f"{p.metrics.step_time_s:.3f}", knob=False),
    Column("MFU", lambda p: f"{p.metrics.mfu:.1%}", knob=False),
    Column("mem GiB", lambda p: f"{p.metrics.peak_memory_bytes / GIB:.1f}", knob=False),
    Column("bubble", lambda p: f"{p.metrics.bubble_fraction:.1%}", knob=False),
    Column("recomp", recompute_label, left=True),
    Column("ZeRO", lambda p: str(p.parallel.zero)),
    Column("SP", lambda p: "on" if p.parallel.sequence_parallel else "off"),
    Column("tokens/s", lambda p: si_count(p.metrics.tokens_per_s), knob=False),
    Column("blocks", lambda p: blocks_per_stage(p), left=True),
)
# The order the columns appear in, whichever are shown.
ORDER = ("#", "tp·pp·dp", "tp·cp·pp·dp", "mb×M", "batch", "schedule", "blocks", "recomp", "ZeRO",
         "SP", "step s", "step range", "tokens/s", "MFU", "MFU range", "mem GiB", "bubble")


def band_columns(band: ErrorBand) -> tuple[Column, ...]:
    """The step time and MFU a run may measure, by the held-out record (fidelity/band.py): the
    last columns to show, the first to go at a narrow width (the line under the table says the
    same of plan 1)."""
    def span(pair, fmt):
        return f"{format(pair[0], fmt)}..{format(pair[1], fmt)}"

    return (Column("step range", lambda p: span(band.step_range(p.metrics.step_time_s), ".2f"),
                   knob=False),
            Column("MFU range", lambda p: span(band.mfu_range(p.metrics.mfu), ".0%"), knob=False))


def _capacity(exp) -> str:
    """What a plan may use of each GPU, and the headroom kept when there is one."""
    cluster = exp.plan.cluster if exp.plan is not None else None
    text = f"{exp.capacity_bytes / GIB:.1f} GiB per GPU"
    if cluster is None or not cluster.memory_headroom:
        return text
    return (f"{text} ({cluster.hardware.memory_bytes / GIB:.1f} less "
            f"{cluster.memory_headroom:.1%} headroom)")


def headroom_line(cluster) -> str:
    """What each plan keeps free of a GPU's memory, and why."""
    return (f"memory headroom {cluster.memory_headroom:.1%}: every plan fits "
            f"{cluster.capacity_bytes / GIB:.1f} of {cluster.hardware.memory_bytes / GIB:.1f} GiB "
            "(by default the worst memory under-estimate of comparable published runs; "
            "--memory-headroom to change)")


def band_line(band: ErrorBand, plan: Plan) -> str:
    """One line: what plan 1 may measure, and what the range rests on."""
    lo, hi = band.step_range(plan.metrics.step_time_s)
    mlo, mhi = band.mfu_range(plan.metrics.mfu)
    memory = (f", peak up to {band.memory_high(plan.metrics.peak_memory_bytes) / GIB:.1f} GiB"
              if band.memory_under < 0 else "")
    return (f"error band of plan 1: step {lo:.2f}..{hi:.2f} s, MFU {mlo:.0%}..{mhi:.0%}{memory}; "
            f"{band.basis} (`plan validate`)")



@dataclass(frozen=True)
class PlansView:
    """What the plans table shows: its columns, the rows (cells per plan) and what it left out."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]
    hidden: tuple[str, ...]  # columns dropped for the width
    folded: int  # rows equal in every shown column to a row above, left out


def _cells(plans, columns) -> list[tuple[str, ...]]:
    return [tuple(str(i) if c.header == "#" else c.cell(plan) for c in columns)
            for i, plan in enumerate(plans, 1)]


def _distinct_rows(columns, rows) -> bool:
    """No two rows show the same configuration (the predicted numbers aside: rows that differ
    only there look like one configuration predicted twice)."""
    knobs = [i for i, c in enumerate(columns) if c.knob and c.header != "#"]
    return len({tuple(row[i] for i in knobs) for row in rows}) == len(rows)


def _table(columns, rows, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1, 0, 1), collapse_padding=True)
    for c in columns:
        table.add_column(c.header, justify="left" if c.left else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def table_width(columns, rows) -> int:
    """The characters a line of the table takes, measured by rich itself."""
    return Measurement.get(MEASURE, MEASURE.options, _table(columns, rows)).maximum


def plans_view(plans, width: int | None, band: ErrorBand | None = None) -> PlansView:
    """Choose the columns for ``width`` characters (None: all of them).

    Columns go from the least important up while the table is wider than ``width``, skipping any
    whose loss would make two rows show the same configuration (the batch column is shown only
    when the plans' batches differ: the title states a shared one). If the table is still too
    wide, the remaining columns go too, a row then showing the same configuration as one above is
    folded into it, and the caption says so."""
    batches = {p.parallel.global_batch for p in plans}
    degrees = "tp·cp·pp·dp" if any(p.parallel.cp > 1 for p in plans) else "tp·pp·dp"
    candidates = [c for c in COLUMNS if (c.header != "batch" or len(batches) > 1)
                  and c.header not in {"tp·pp·dp", "tp·cp·pp·dp"} - {degrees}]
    candidates += band_columns(band) if band is not None else ()
    shown = list(candidates)

    def layout(cols):
        ordered = sorted(cols, key=lambda c: ORDER.index(c.header))
        return ordered, _cells(plans, ordered)

    if width is not None:
        for forced in (False, True):
            for column in reversed(candidates[3:]):  # the rank, degrees and mb×M always stay
                if table_width(*layout(shown)) <= width:
                    break
                trial = [c for c in shown if c is not column]
                if forced or _distinct_rows(*layout(trial)):
                    shown = trial
    cols, rows = layout(shown)
    knobs = [i for i, c in enumerate(cols) if c.knob and c.header != "#"]
    kept, seen = [], set()
    for row in rows:
        key = tuple(row[i] for i in knobs)
        if key not in seen:
            seen.add(key)
            kept.append(row)
    hidden = tuple(c.header for c in candidates if c not in shown)
    return PlansView(tuple(cols), tuple(kept), hidden, len(rows) - len(kept))


def plans_table(plans: list[Plan] | tuple[Plan, ...], title: str | None = None,
                width: int | None = None) -> Table:
    """The ranked plans, their columns chosen for ``width`` (``plans_view``): degrees as
    tp·pp·dp, micro-batch × microbatches, interleaving in the schedule (v4); TFLOP/s per GPU is in
    the JSON and the frames (MFU says the same)."""
    view = plans_view(plans, width)
    return _table(view.columns, view.rows, title)


def _print_unsqueezed(console: Console, table: Table, width: int) -> None:
    """Print at the table's own width even where the console is narrower (``--wide``): rich
    would otherwise shrink the columns and cut their values with an ellipsis."""
    saved = console.width
    console.width = max(saved, width)
    try:
        console.print(table)
    finally:
        console.width = saved


def plans_caption(view: PlansView, width: int | None) -> str | None:
    """One line on what the table left out, or None."""
    parts = []
    if view.hidden:
        parts.append(f"not shown at {width} columns: {', '.join(view.hidden)}")
    if view.folded:
        parts.append(f"{view.folded} plan{'s' if view.folded > 1 else ''} showing the same "
                     "configuration as one above in these columns left out")
    return "; ".join(parts) + " (--wide shows all)" if parts else None


def rejected_line(rejected: dict[str, int]) -> str:
    if not rejected:
        return "rejected: none"
    items = sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))
    return "rejected: " + ", ".join(f"{reason} {count}" for reason, count in items)


def search_title(result, model: ModelSpec, cluster) -> str:
    nodes = f"{cluster.nodes} node" + ("s" if cluster.nodes > 1 else "")
    batches = {p.parallel.global_batch for p in result.plans}
    return (f"{for_rich(model.name)} ({si_count(model.params)} params, seq {model.seq_length}) on "
            f"{cluster.gpus} x {for_rich(cluster.hardware.name)} ({nodes})"
            + (f", global batch {batches.pop()}" if len(batches) == 1 else ""))


def funnel_lines(result) -> list[str]:
    """Where the configurations went, as sums that add up (SearchResult.accounted).  No
    elapsed time: the same search prints the same lines on any machine (issue #32)."""
    lines = [f"{result.considered} configurations considered = "
             f"{sum(result.rejected.values())} rejected + {result.not_refined} not refined "
             f"(proven slower by a lower bound, or past --refine) + {result.feasible} feasible"]
    if result.rejected:
        lines.append(rejected_line(result.rejected))
    if result.feasible > len(result.plans):
        lines.append(f"feasible = {len(result.plans)} shown + {result.folded} folded (equal to a "
                     "shown plan but for ZeRO stage or unused recompute) + "
                     f"{result.below_top} below --top")
    return lines


def print_search(console: Console, result, model: ModelSpec, cluster, wide: bool = False,
                 hint: str | None = None) -> None:
    """The plans table (columns chosen for the console's width unless ``wide``), where the
    configurations went, the batch hint and the plan's assumptions."""
    width = None if wide else console.width
    console.print(search_title(result, model, cluster), highlight=False)
    band = plan_band(result.plans[0])
    view = plans_view(result.plans, width, band)
    _print_unsqueezed(console, _table(view.columns, view.rows),
                      table_width(view.columns, view.rows))
    caption = plans_caption(view, width)
    if caption:
        console.print(f"[dim]{caption}[/dim]", highlight=False)
    for line in funnel_lines(result):  # rejection reasons may name a user's stack
        console.print(for_rich(line), highlight=False)
    for note in result.notes:
        console.print(f"[dim]{for_rich(note)}[/dim]", highlight=False)
    if hint:
        console.print(f"[yellow]hint:[/yellow] {for_rich(hint)}", highlight=False)
    for note in result.plans[0].notes:
        console.print(f"[dim]{for_rich(note)}[/dim]", highlight=False)
    best = result.plans[0]
    stack = best.stack.name if best.stack is not None else default_stack().name
    console.print(f"[dim]{for_rich(record_line(load_record(), stack, cluster.hardware.name))}"
                  "[/dim]", highlight=False)
    console.print(for_rich(band_line(band, best)), highlight=False)
    if cluster.memory_headroom > 0:
        console.print(for_rich(headroom_line(cluster)), highlight=False)



def explanation_dict(exp) -> dict:
    """``--explain --json``: the verdict, the plan, and each rank's memory by part."""
    plan = exp.plan
    doc = {"fits": exp.fits, "rule": exp.rule, "no_split": exp.no_split,
           "capacity_bytes": int(exp.capacity_bytes),
           "peak_memory_bytes": int(plan.metrics.peak_memory_bytes) if plan else None,
           "step_time_s": plan.metrics.step_time_s if plan else None,
           "memory_per_rank": _memory_rows(exp),
           "plan": plan.to_dict() if plan else None}
    return doc


def _memory_rows(exp) -> list[dict]:
    parts = exp.memory_parts or {}
    if not parts:
        return []
    ranks = len(next(iter(parts.values())))
    side = exp.side_stream_bytes if any(exp.side_stream_bytes) else None
    return [{"rank": r, **{k: int(round(v[r])) for k, v in parts.items()},
             "total": int(round(sum(v[r] for v in parts.values()))),
             **({"side_streams": int(round(side[r]))} if side else {})} for r in range(ranks)]


def explained_what(pinned: tuple[str, ...]) -> str:
    """Which configuration --explain priced (#30: with no pins it called the default one "the
    pinned configuration"); the table below it shows every value."""
    if not pinned:
        return ("nothing pinned: the default configuration (1F1B, micro-batch 1, no recompute, "
                "ZeRO-1, dp all GPUs; pin --tp, --pp, ... to explain another)")
    names = ", ".join("--" + name.replace("_", "-") for name in pinned)
    return f"the configuration pinned by {names} (the rest at --explain's defaults)"


def print_explanation(console: Console, exp, wide: bool = False) -> None:
    """Fits or not, and by how much; the stages and their memory when it was predicted."""
    if exp.plan is None:
        console.print(f"[bold red]not a valid configuration:[/bold red] {for_rich(exp.rule)}",
                      highlight=False)
        return
    m = exp.plan.metrics
    console.print(f"{explained_what(exp.pinned)}, global batch "
                  f"{exp.plan.parallel.global_batch}", highlight=False)
    view = plans_view([exp.plan], None if wide else console.width)
    _print_unsqueezed(console, _table(view.columns, view.rows),
                      table_width(view.columns, view.rows))
    caption = plans_caption(view, None if wide else console.width)
    if caption:
        console.print(f"[dim]{caption}[/dim]", highlight=False)
    spare = exp.capacity_bytes - m.peak_memory_bytes
    if exp.no_split is not None:
        console.print(f"[red]does not fit[/red]: {exp.no_split}; Megatron's even split below "
                      f"needs {m.peak_memory_bytes / GIB:.1f} GiB of "
                      f"{_capacity(exp)}", highlight=False)
    elif spare >= 0:
        console.print(f"[green]fits[/green]: {m.peak_memory_bytes / GIB:.1f} GiB of "
                      f"{_capacity(exp)} ({spare / GIB:.1f} GiB spare)")
    else:
        console.print(f"[red]does not fit[/red]: needs {m.peak_memory_bytes / GIB:.1f} GiB of "
                      f"{_capacity(exp)} ({-spare / GIB:.1f} GiB over); "
                      "try recompute, more pipeline stages or a higher ZeRO stage")
    moe = any(s.a2a_s for s in exp.plan.stages)
    table = Table(title="per pipeline rank" + (" (all-to-all: MoE token dispatch and combine, "
                                               "included in s/microbatch)" if moe else ""),
                  title_justify="left")
    for col in ("rank", "layers", "recompute", "s/microbatch", *(("all-to-all s",) if moe else ()),
                "GiB"):
        table.add_column(col, justify="right")
    for r, mem in enumerate(exp.plan.rank_memory_bytes):
        chunks = [s for s in exp.plan.stages if s.rank == r]
        layers = " ".join(f"[{s.first},{s.last})" for s in chunks)
        a2a = (f"{sum(s.a2a_s for s in chunks):.4f}",) if moe else ()
        table.add_row(str(r), layers, "/".join(dict.fromkeys(s.recompute_label for s in chunks)),
                      f"{sum(s.time_s for s in chunks):.4f}",
                      *a2a, f"{mem / GIB:.1f}")
    console.print(table)
    rows = _memory_rows(exp)
    if rows:
        side = "side_streams" in rows[0]
        parts = [k for k in rows[0] if k not in ("rank", "total", "side_streams")]
        title = "memory per rank, GiB (frag: allocator fragmentation)"
        if side:
            title += ("; +side: also reserved on ZeRO-3's side streams, freed when an allocation "
                      "fails, so not in what must fit")
        mem = Table(title=title, title_justify="left")
        for col in ["rank", *parts, "total", *(["+side"] if side else [])]:
            mem.add_column({"fragmentation": "frag"}.get(col, col), justify="right")
        for row in rows:
            mem.add_row(str(row["rank"]), *(f"{row[k] / GIB:.2f}" for k in parts),
                        f"{row['total'] / GIB:.1f}",
                        *([f"{row['side_streams'] / GIB:.2f}"] if side else []))
        console.print(mem)
    for note in exp.plan.notes:
        console.print(f"[dim]{note}[/dim]", highlight=False)
