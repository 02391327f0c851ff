"""Pictures of a simulated step: a terminal Gantt (rich) and a standalone SVG.

Both draw one row per pipeline rank, time left to right, F blue, B green, W yellow, idle blank,
each op labelled with its microbatch number where it fits.  `render_gantt` also prints the
simulated bubble (both definitions) beside the closed form and the peak in-flight activations.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.pipeline.simulate import SimResult, closed_form_bubble

STYLE = {"F": "white on blue", "B": "black on green", "W": "black on yellow"}
FILL = {"F": "#4a78c2", "B": "#4caf50", "W": "#e6c229"}


def gantt_rows(result: SimResult, width: int) -> list[Text]:
    """One rich Text per rank, `width` cells spanning [0, makespan]."""
    scale = width / result.makespan_s if result.makespan_s > 0 else 0.0
    rows = []
    for row in result.timeline:
        cells = [" "] * width
        styles: list[str | None] = [None] * width
        for t in row:
            a = min(int(round(t.start_s * scale)), width)
            b = min(int(round(t.end_s * scale)), width)
            if b <= a and t.end_s > t.start_s and a < width:
                b = a + 1  # never hide an op entirely
            label = str(t.op.microbatch)
            for i in range(a, b):
                styles[i] = STYLE[t.op.kind]
            if b - a >= len(label):
                offset = a + (b - a - len(label)) // 2
                cells[offset:offset + len(label)] = list(label)
        text = Text()
        for ch, style in zip(cells, styles):
            text.append(ch, style=style or "")
        rows.append(text)
    return rows


def _closed_form_note(result: SimResult) -> str:
    p, m, v = result.p, result.m, result.v
    if result.schedule == "interleaved":
        return f"(p-1)/(vM+p-1) = {closed_form_bubble('interleaved', p, m, v):.1%}"
    if result.schedule == "zb-h1":
        return (f"(p-1)/(3M+p-1) = {closed_form_bubble('zb-h1', p, m):.1%} when F = B = W: idle time "
                f"about a third of 1F1B's (1F1B: {closed_form_bubble('1f1b', p, m):.1%} of its step)")
    return f"(p-1)/(M+p-1) = {closed_form_bubble(result.schedule, p, m):.1%}"


def render_gantt(result: SimResult, console: Console, width: int | None = None) -> None:
    """Print the Gantt rows, a legend, the bubble against its closed form and peak in-flight."""
    label_w = len(f"rank {result.p - 1}") + 1
    width = width or max(10, console.width - label_w - 2)
    console.print(f"[bold]{result.schedule}[/bold]  p={result.p}  M={result.m}  v={result.v}  "
                  f"step {result.makespan_s:.4g} s")
    for r, text in enumerate(gantt_rows(result, width)):
        console.print(Text(f"rank {r}".ljust(label_w)) + text + Text("|"), no_wrap=True, overflow="crop")
    legend = Text("legend: ")
    for kind, name in (("F", "forward"), ("B", "backward"), ("W", "weight grad")):
        if kind != "W" or result.schedule == "zb-h1":
            legend.append(f" {kind} ", style=STYLE[kind]).append(f" {name}  ")
    console.print(legend)
    table = Table(show_header=True, header_style="bold")
    table.add_column("bubble")
    table.add_column("simulated", justify="right")
    table.add_column("closed form")
    table.add_row("idle share of step", f"{result.bubble_fraction:.1%}", _closed_form_note(result))
    ratio_form = (result.p - 1) / (result.v * result.m)
    table.add_row("idle / ideal compute", f"{result.bubble_ratio:.1%}",
                  f"(p-1)/(vM) = {ratio_form:.1%}" if result.schedule != "zb-h1"
                  else f"(p-1)/(3M) = {ratio_form / 3:.1%} when F = B = W")
    console.print(table)
    peak = Table(show_header=True, header_style="bold")
    peak.add_column("rank", justify="right")
    peak.add_column("peak in-flight (microbatch, chunk)", justify="right")
    if any(result.peak_activation_bytes):
        peak.add_column("peak activation bytes", justify="right")
    for r, n in enumerate(result.peak_inflight):
        cells = [str(r), str(n)]
        if any(result.peak_activation_bytes):
            cells.append(f"{result.peak_activation_bytes[r]:.4g}")
        peak.add_row(*cells)
    console.print(peak)


def to_svg(result: SimResult, width_px: int = 1000, row_px: int = 28) -> str:
    """A standalone SVG of the timeline: one <rect> with a <title> tooltip per compute op."""
    label_px, pad = 60, 10
    plot_w = width_px - label_px - pad
    height = pad * 2 + row_px * result.p + 20
    scale = plot_w / result.makespan_s if result.makespan_s > 0 else 0.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_px}" height="{height}" '
        f'viewBox="0 0 {width_px} {height}" font-family="monospace" font-size="11">',
        f"<title>{escape(result.schedule)} p={result.p} M={result.m} v={result.v}: step "
        f"{result.makespan_s:.4g} s, idle share {result.bubble_fraction:.1%}</title>",
        f'<rect x="0" y="0" width="{width_px}" height="{height}" fill="white" class="background"/>',
    ]
    for r, row in enumerate(result.timeline):
        y = pad + r * row_px
        out.append(f'<text x="4" y="{y + row_px * 0.65:.1f}">rank {r}</text>')
        for t in row:
            x = label_px + t.start_s * scale
            w = max((t.end_s - t.start_s) * scale, 0.5)
            tip = (f"rank {r} {t.op.kind} microbatch {t.op.microbatch} chunk {t.op.chunk}: "
                   f"{t.start_s:.6g}-{t.end_s:.6g} s")
            out.append(f'<rect class="op" x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row_px - 4}" '
                       f'fill="{FILL[t.op.kind]}" stroke="white" stroke-width="0.5">'
                       f"<title>{escape(tip)}</title></rect>")
            if w >= 8 * len(str(t.op.microbatch)):
                out.append(f'<text x="{x + w / 2:.2f}" y="{y + row_px * 0.65:.1f}" text-anchor="middle" '
                           f'fill="white">{t.op.microbatch}</text>')
    out.append(f'<text x="{label_px}" y="{height - 8}">0 s</text>')
    out.append(f'<text x="{width_px - pad}" y="{height - 8}" text-anchor="end">'
               f"{result.makespan_s:.4g} s</text>")
    out.append("</svg>")
    return "\n".join(out)
