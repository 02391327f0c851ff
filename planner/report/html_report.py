"""`plan report`: one self-contained HTML page of a search's plans, readable offline and shareable.

Sections: the ranked plans (with the error band where a plan states one), plan 1's memory per
pipeline rank by part, its pipeline schedule, its ranks on nodes with the process groups, step
time against memory for the feasible candidates the input holds, the validation record of its
stack and GPU, and its notes. Every chart is inline SVG written by plan3d itself
(report/svg_charts.py, report/gantt.py; the reasons are in svg_charts' docstring): no script, no
stylesheet or font fetched, no external URL at all, so the file opens the same from a mail
attachment, a CI artifact or a machine without network. Every string from the input (model and
stack names, notes, part names) is HTML-escaped; each number is formatted once, by the helpers
below, so the page and its tests agree on what it shows.
"""

from __future__ import annotations

from html import escape

from planner.core.units import GIB
from planner.core.version import __version__
from planner.fidelity.record import Family, record_line
from planner.pipeline.job import job_of_document, run_simulation
from planner.report.gantt import compressed_note, to_svg
from planner.report.layout import group_line
from planner.report.report_input import PlanView, ReportInput
from planner.report.svg_charts import memory_bars, rank_grid, scatter

SECTIONS = ("plans", "memory", "schedule", "layout", "candidates", "validation", "notes")

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1000px;padding:12px 20px 40px;color:#1d1d1f;background:#fff;line-height:1.4}
h1{font-size:1.45em;margin:.4em 0 .1em}h2{font-size:1.15em;margin:1.6em 0 .4em;
border-bottom:1px solid #ddd;padding-bottom:.2em}.sub{color:#555;margin:0 0 .8em}
table{border-collapse:collapse;font-size:.86em;margin:.4em 0}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f4f5f7;font-weight:600}td.l,th.l{text-align:left;white-space:normal}
tr.best td{background:#fff4e5}.band{color:#555;font-size:.85em;display:block}
svg{max-width:100%;height:auto;display:block;margin:.4em 0}.note{color:#555;font-size:.9em}
ul.groups{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.8em;padding-left:1.2em}
footer{margin-top:2em;color:#777;font-size:.8em}
"""


def seconds(x: float) -> str:
    """A step time as the page prints it: four significant digits."""
    return f"{x:.4g}"


def percent(x: float) -> str:
    return f"{x:.1%}"


def gib(x: float) -> str:
    return f"{x / GIB:.1f}"


def tokens(x: float) -> str:
    return f"{x:,.0f}"


def _e(text) -> str:
    return escape(str(text), quote=True)


def _dims(parallel: dict) -> str:
    dims = [parallel["tp"], parallel.get("cp", 1), parallel["pp"], parallel["dp"]]
    text = "·".join(str(d) for d in dims)
    ep, etp = parallel.get("ep", 1), parallel.get("etp", parallel["tp"])
    return text + (f" ep{ep}" if ep > 1 else "") + (f" etp{etp}" if etp != parallel["tp"] else "")


def _schedule(parallel: dict) -> str:
    v = parallel["virtual_stages"]
    return parallel["schedule"] + (f" v{v}" if v > 1 else "")


def _band_cell(value: str, band: tuple[float, float] | None, fmt) -> str:
    if band is None:
        return _e(value)
    return f'{_e(value)}<span class="band"> {_e(fmt(band[0]))}–{_e(fmt(band[1]))}</span>'


def plans_table(report: ReportInput) -> str:
    """The ranked plans, best first; an error band under the step time and MFU it bounds."""
    head = ("#", "tp·cp·pp·dp", "mb×M", "schedule", "recompute", "ZeRO", "SP", "step s",
            "tokens/s", "MFU", "peak mem GiB", "bubble")
    rows = []
    for v in report.plans:
        par, met, band = v.parallel, v.metrics, v.error_band
        cells = [str(v.rank), _dims(par),
                 f"{par.get('micro_batch', '?')}×{par['num_microbatches']}", _schedule(par),
                 str(par.get("recompute", "?")), str(par.get("zero", "?")),
                 "on" if par.get("sequence_parallel") else "off"]
        row = "".join(f"<td>{_e(c)}</td>" for c in cells)
        step = _band_cell(seconds(met["step_time_s"]), band and band.step_time_s, seconds)
        mfu = _band_cell(percent(met["mfu"]), band and band.mfu, percent)
        row += (f"<td>{step}</td><td>{_e(tokens(met['tokens_per_s']))}</td><td>{mfu}</td>"
                f"<td>{_e(gib(met['peak_memory_bytes']))}</td>"
                f"<td>{_e(percent(met['bubble_fraction']))}</td>")
        rows.append(f'<tr class="best">{row}</tr>' if v.rank == 1 else f"<tr>{row}</tr>")
    bands = [v for v in report.plans if v.error_band is not None]
    if bands:
        basis = {(b.error_band.basis, b.error_band.calibrated) for b in bands}
        note = "; ".join(f"{_e(text)}" + ("" if cal is None else
                                          (" (calibrated)" if cal else " (not calibrated)"))
                         for text, cal in sorted(basis, key=str))
        note = f"Error band (the range under a step time or MFU): {note}."
    else:
        note = "These plans state no error band; the numbers are the model's point predictions."
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    return (f"<table id=\"plans-table\"><tr>{header}</tr>{''.join(rows)}</table>"
            f'<p class="note">{note}</p>')


def memory_section(report: ReportInput) -> str:
    best = report.best
    if not best.memory:
        return ('<p class="note">This plan file has no memory breakdown per rank (written before '
                "plan.json carried one); export the plan again with plan solve --export json, "
                f"or solve with --report. Peak per GPU: {gib(best.metrics['peak_memory_bytes'])} "
                "GiB.</p>")
    parts = [p for p, _ in best.memory[0].parts]
    head = "".join(f"<th>{_e(p)}</th>" for p in parts)
    rows = "".join(f"<tr><td>{r.rank}</td>" + "".join(f"<td>{gib(b)}</td>" for _, b in r.parts)
                   + f"<td>{gib(r.total_bytes)}</td></tr>" for r in best.memory)
    cap = (f" One GPU holds {gib(report.capacity_bytes)} GiB (dashed line)."
           if report.capacity_bytes else "")
    return (f"<p class=\"sub\">Plan 1's peak per pipeline rank, GiB, by part.{cap}</p>"
            + memory_bars(best.memory, report.capacity_bytes)
            + f'<table id="memory-table"><tr><th>rank</th>{head}<th>total</th></tr>{rows}</table>')


def schedule_section(best: PlanView) -> str:
    result = run_simulation(job_of_document(best.doc, f"plan {best.rank}"))
    note = compressed_note(result)
    svg = to_svg(result, compress=True)
    if 'text-anchor="middle">⋯</text>' in svg:
        note = ("; ".join(x for x in (note, "the steady state in the middle repeats and is cut "
                                      "out at ⋯ so every op stays wide enough to label") if x))
    return (f"<p class=\"sub\">Plan 1's {_e(_schedule(best.parallel))} schedule on "
            f"{result.p} pipeline rank(s), {result.m} microbatches, simulated op by op: "
            f"pipeline {seconds(result.makespan_s)} s, idle share "
            f"{percent(result.bubble_fraction)} (the step adds what the pipeline cannot hide: "
            "data-parallel sync, optimizer).</p>" + svg
            + (f'<p class="note">{_e(note)}</p>' if note else ""))


def layout_section(best: PlanView) -> str:
    lay = best.layout
    if lay is None or not lay.ranks:
        return '<p class="note">This plan file has no rank layout.</p>'
    groups = "".join(f"<li><b>{_e(name.upper() if len(name) <= 3 else name)}</b> "
                     f"({len(g)}): {_e(group_line(g))}</li>" for name, g in lay.groups)
    return (f"<p class=\"sub\">Rank order {_e(lay.order)}: {len(lay.ranks)} GPUs on "
            f"{best.cluster['nodes']} node(s) of {best.cluster['gpus_per_node']}.</p>"
            + rank_grid(lay.ranks, best.cluster["gpus_per_node"])
            + f'<ul class="groups">{groups}</ul>')


def candidates_section(report: ReportInput) -> str:
    n = len(report.candidates)
    if report.feasible and report.feasible > n:
        held = (f"{n} of the search's {report.feasible} feasible configurations (the file holds "
                "the ranked plans only; plan solve --report plots them all)")
    elif report.feasible:
        held = f"all {n} feasible configurations of the search"
    else:
        held = (f"the {n} plan(s) this file holds; plan solve --report plots every feasible "
                "configuration of the search")
    return (f"<p class=\"sub\">Step time against peak memory per GPU: {held}. Numbered: the "
            "ranked plans (1 in red).</p>" + scatter(report.candidates, report.capacity_bytes))


def validation_section(best: PlanView, families: tuple[Family, ...]) -> str:
    gpu = best.cluster["gpu"]
    if best.stack is None:
        return '<p class="note">This plan names no stack, so no validation record applies.</p>'
    mine = [f for f in families if f.stack == best.stack and f.hardware == gpu]
    line = f'<p class="sub">{_e(record_line(families, best.stack, gpu))}.</p>'
    if not mine:
        return line
    rows = "".join(f"<tr><td class=\"l\">{_e(f.group)}</td><td>{f.runs}</td>"
                   f"<td>{f.min_error:+.1%}</td><td>{f.max_error:+.1%}</td>"
                   f"<td>{f.mean_abs_error:.1%}</td></tr>" for f in mine)
    return (line + '<table id="validation-table"><tr><th class="l">published runs (source)</th>'
            "<th>runs</th><th>lowest error</th><th>highest error</th><th>mean |error|</th></tr>"
            f"{rows}</table><p class=\"note\">error: predicted / measured step time - 1.</p>")


def _title(report: ReportInput) -> str:
    best = report.best
    cl = best.cluster
    return (f"{best.model} on {cl['gpus']} × {cl['gpu']} ({cl['nodes']} node"
            f"{'s' if cl['nodes'] != 1 else ''}), global batch "
            f"{best.parallel.get('global_batch', '?')}")


def render_report(report: ReportInput, families: tuple[Family, ...]) -> str:
    """The whole page: every section, inline CSS and SVG, nothing fetched."""
    best = report.best
    stack = f"stack {best.stack_label}" if best.stack_label else "no stack recorded"
    notes = "".join(f"<li>{_e(n)}</li>" for n in best.notes) or "<li>none</li>"
    body = {
        "plans": plans_table(report),
        "memory": memory_section(report),
        "schedule": schedule_section(best),
        "layout": layout_section(best),
        "candidates": candidates_section(report),
        "validation": validation_section(best, families),
        "notes": f"<ul>{notes}</ul>",
    }
    titles = {"plans": "Ranked plans", "memory": "Memory per rank (plan 1)",
              "schedule": "Pipeline schedule (plan 1)", "layout": "Ranks on nodes (plan 1)",
              "candidates": "Step time against memory",
              "validation": "Validation record of this stack and GPU", "notes": "Notes (plan 1)"}
    sections = "".join(f'<section id="{key}"><h2>{_e(titles[key])}</h2>{body[key]}</section>'
                       for key in SECTIONS)
    title = _title(report)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>plan3d report: {_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=\"sub\">{_e(stack)}; from {_e(report.origin)}</p>"
            f"{sections}<footer>Written by plan3d {_e(__version__)} (plan report). Predictions "
            "of a model, not measurements: the validation record says how far they have been "
            "off.</footer></body></html>\n")
