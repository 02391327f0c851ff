"""Pictures of a simulated step: a terminal Gantt (rich) and a standalone SVG.

Both draw one row per pipeline rank, time left to right, F blue, B green, W yellow, idle blank.
Without colour (piped, NO_COLOR) the terminal rows still read: every op starts with its kind and
microbatch where they fit ("F12") and fills the rest of its span with its own mark (F -, B =,
W ~), so only idle time is blank.

Cells (:func:`layout`): ops of equal duration draw equally wide anywhere in the chart, each
within a cell of its true start, none over another and none hidden. Cutting each op at its
rounded start and end did not (1F1B's 5.5-cell B took 5 or 6 cells by where it fell: ``B0===``
beside ``B2====``). So each duration gets round(duration x scale) cells wherever it occurs, and
each op sits at its rounded start, or right after the op before it where that one still draws
(an idle gap absorbs the push). Back-to-back ops that all round up would drift right cell by
cell; on a row where some op would land more than a cell off, the duration drawn widest against
its true length is drawn a cell narrower (never under one) and the chart laid out again. A busy
cell that the narrowing leaves between two ops is a joint ``·`` in the colour of the op running
there, so that blank still means idle. A paired BW (DualPipe's F&B) shares its F's cells, drawn
over it as "&". Only where ops shorter than a cell crowd (each still takes one) may the ops
after them sit further off, and only where a row has fewer cells than ops does one draw over
another.

A schedule too long for the width (most ops under ``MIN_CELLS`` cells) is drawn compressed: the
start and the end at one readable scale, the middle (the steady state, which repeats) cut out and
marked ``⋯``, and the header says how much. `render_gantt` also prints the simulated bubble
(both definitions) beside the closed form and the peak in-flight activations.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from xml.sax.saxutils import escape

from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.core.arguments import finite
from planner.core.limits import MIN_PASS_S
from planner.core.schedules import ONE_F_ONE_B, schedule_traits
from planner.pipeline.sim_result import SimResult
from planner.pipeline.simulate import closed_form_bubble

# BW: a backward of both gradients (DualPipe); a paired one shares its F's span and is drawn
# over it, labelled "&"
STYLE = {"F": "white on blue", "B": "black on green", "W": "black on yellow",
         "BW": "black on cyan"}
FILL = {"F": "#4a78c2", "B": "#4caf50", "W": "#e6c229", "BW": "#26a69a"}
INK = {"F": "white", "B": "black", "W": "black", "BW": "black"}  # a label readable on its fill
CELL_PX = 10  # one cell of a compressed SVG chart: MIN_CELLS of them label an op ("F12")
SVG_CHAR_PX = 7  # width of one character of the SVG's 11 px monospace font, rounded up
MARK = {"F": "-", "B": "=", "W": "~", "BW": "#"}  # fills an op's span: readable without colour
MIN_CELLS = 3  # cells the median op needs to show its kind and a microbatch number
CUT = " ⋯ "  # where a compressed chart leaves out the middle of the step
JOINT = "·"  # a busy cell that rounding left between two ops (blank is idle only)


@dataclass(frozen=True)
class Window:
    """The part of the step one stretch of the chart draws: [start_s, end_s) over ``cells``."""

    start_s: float
    end_s: float
    cells: int


def drawn_windows(result: SimResult, width: int) -> tuple[Window, ...]:
    """The whole step over ``width`` cells, or, when the median op would get fewer than
    MIN_CELLS cells, its first and last stretches at that scale with the middle cut out. A long
    run's timeline is its short run (``drawn_span_s``). Both stretches draw at one scale, so an op
    gets the same cells in either."""
    span = drawn_span_s(result)
    durations = [t.end_s - t.start_s for row in result.timeline for t in row if t.end_s > t.start_s]
    if span <= 0 or not durations:
        return (Window(0.0, span, width),)
    scale = MIN_CELLS / statistics.median(durations)  # cells per second for a readable chart
    if span * scale <= width or width < 2 * MIN_CELLS + len(CUT):
        return (Window(0.0, span, width),)
    half = (width - len(CUT)) // 2
    rest = width - len(CUT) - half
    return (Window(0.0, half / scale, half), Window(span - rest / scale, span, rest))


def chunk_letters(row) -> dict[int, str]:
    """The rank's model chunks as letters in pipeline order (a, b, ...) where it holds more than
    one (interleaved, DualPipe), so that chunks read apart without colour; {} for one chunk."""
    chunks = sorted({t.op.chunk for t in row if t.op.kind in MARK})
    return {c: chr(ord("a") + i) for i, c in enumerate(chunks)} if len(chunks) > 1 else {}


def units(row) -> list[tuple]:
    """A rank's ops as it runs them: one op, or an F with the BW paired with it (DualPipe's F&B
    chunk: the BW shares the F's span and is drawn over it, marked "&")."""
    out: list[list] = []
    for t in row:
        if t.op.paired and out:
            out[-1].append(t)
        else:
            out.append([t])
    return [tuple(u) for u in out]


def _span(unit) -> tuple[float, float]:
    return unit[0].start_s, max(t.end_s for t in unit)


def _key(seconds: float) -> float:
    return float(f"{seconds:.9g}")  # equal durations, up to float noise, share one width


@dataclass(frozen=True)
class Placed:
    """One unit drawn in one window: cells [first, end); [exact, exact_end) is where it truly runs
    inside the window, in cells; ``key``: its duration's, where it lies wholly inside the window
    (so its width is that duration's), else None."""

    unit: tuple
    first: int
    end: int
    exact: float
    exact_end: float
    key: float | None


def _cells(x: float) -> int:
    return int(x + 0.5)  # the nearest cell, halves up (x >= 0)


def _place(row: list[tuple], window: Window, scale: float, widths: dict) -> list[Placed]:
    """One rank's units in one window: each at its rounded start, or right after the unit before
    it where that one still draws; then, if the last overruns the window, pulled back from the
    end. A unit cut by an edge draws the part inside (one cut by the right edge runs to it)."""
    items = []  # (unit, exact start, exact end, width, key, cut by the right edge)
    for u in row:
        s, e = _span(u)
        if e <= s or e <= window.start_s or s >= window.end_s:
            continue
        x0 = (max(s, window.start_s) - window.start_s) * scale
        x1 = (min(e, window.end_s) - window.start_s) * scale
        key = _key(e - s) if window.start_s <= s and e <= window.end_s else None
        w = widths[key] if key is not None else max(1, _cells(x1) - _cells(x0))
        items.append((u, x0, x1, 1 if e > window.end_s else w, key, e > window.end_s))
    firsts, end = [], 0
    for _, x0, _, w, _, _ in items:
        firsts.append(max(_cells(x0), end))
        end = firsts[-1] + w
    limit = window.cells
    for i in reversed(range(len(items))):
        firsts[i] = max(min(firsts[i], limit - items[i][3]), 0)
        limit = firsts[i]
    out = []
    for i, (u, x0, x1, w, key, cut_right) in enumerate(items):
        end = window.cells if cut_right else min(firsts[i] + w, window.cells)
        if i + 1 < len(items):  # more units than cells: the later one draws over
            end = min(end, max(firsts[i + 1], firsts[i] + 1))
        out.append(Placed(u, firsts[i], end, x0, x1, key))
    return out


def _fits(line: list[Placed], widths: dict) -> bool:
    """Each unit within a cell of its true start, at its duration's width, none over another."""
    return all(abs(p.first - p.exact) <= 1 + 1e-9
               and (p.key is None or p.end - p.first == widths[p.key])
               and (i == 0 or p.first >= line[i - 1].end) for i, p in enumerate(line))


def layout(result: SimResult, width: int) -> tuple[tuple[Window, ...], list[list[list[Placed]]]]:
    """Where each rank's units fall, window by window ([rank][window] -> placed units), by the
    rule in the module's docstring. The rows that break it (a unit more than a cell off its true
    start, at another width than its duration's, or over its neighbour) each narrow by a cell the
    duration drawn widest against its true width; each pass takes a cell off some duration and
    none goes under one, so this ends."""
    windows = drawn_windows(result, width)
    w0 = windows[0]
    scale = w0.cells / (w0.end_s - w0.start_s) if w0.end_s > w0.start_s else 0.0
    rows = [units(row) for row in result.timeline]
    exact: dict[float, float] = {}
    for row in rows:
        for u in row:
            s, e = _span(u)
            if e > s:
                exact.setdefault(_key(e - s), (e - s) * scale)
    widths = {k: max(1, _cells(x)) for k, x in exact.items()}
    while True:
        placed = [[_place(row, w, scale, widths) for w in windows] for row in rows]
        lower = set()
        for line in (line for by_window in placed for line in by_window):
            if not _fits(line, widths):
                up = [k for k in {p.key for p in line if p.key is not None} if widths[k] > 1]
                if up:
                    lower.add(max(up, key=lambda k: (widths[k] - exact[k], k)))
        if not lower:
            return windows, placed
        for k in lower:
            widths[k] -= 1


def _draw(line: list[Placed], window: Window, letters: dict[int, str]) -> Text:
    """One rank's placed units inside one window, as ``window.cells`` characters with styles."""
    cells = [" "] * window.cells
    styles: list[str | None] = [None] * window.cells
    for p in line:
        t = p.unit[-1]  # a paired BW is drawn over its F
        kind = t.op.kind
        name = "&" + kind if t.op.paired else kind
        starts_here = p.unit[0].start_s >= window.start_s
        label = f"{name}{t.op.microbatch}{letters.get(t.op.chunk, '')}" if starts_here \
            else MARK[kind]
        if len(label) > p.end - p.first:
            label = name if starts_here else MARK[kind]
        text = (label + MARK[kind] * (p.end - p.first))[:p.end - p.first]
        for i, ch in zip(range(p.first, p.end), text):
            cells[i], styles[i] = ch, STYLE[kind]
    for p in line:  # busy where rounding drew no op: a joint, so that blank stays idle only
        for i in range(max(int(p.exact), 0), min(math.ceil(p.exact_end), window.cells)):
            if cells[i] == " " and p.exact <= i + 0.5 < p.exact_end:
                cells[i], styles[i] = JOINT, STYLE[p.unit[-1].op.kind]
    out = Text()
    for ch, style in zip(cells, styles):
        out.append(ch, style=style or "")
    return out


def drawn_span_s(result: SimResult) -> float:
    """The time the timeline spans: the step, or the short run's step when the timeline is a
    compressed picture of a long run (``timeline_m``)."""
    if result.timeline_m is None:
        return result.makespan_s
    return max((row[-1].end_s for row in result.timeline if row), default=0.0)


def compressed_note(result: SimResult) -> str:
    """One line saying what a compressed timeline leaves out ('' when it draws every op)."""
    if result.timeline_m is None:
        return ""
    return (f"drawn: {result.timeline_m:,} of {result.m:,} microbatches; in the step the steady "
            f"period repeats in between ({drawn_span_s(result):.4g} s drawn of "
            f"{result.makespan_s:.4g} s)")


def gantt_rows(result: SimResult, width: int) -> list[Text]:
    """One rich Text per rank, ``width`` cells: the whole step, or (``drawn_windows``) its start and
    its end joined by the cut mark; where each op falls is :func:`layout`'s."""
    windows, placed = layout(result, width)
    rows = []
    for row, by_window in zip(result.timeline, placed):
        text, letters = Text(), chunk_letters(row)
        for k, (window, line) in enumerate(zip(windows, by_window)):
            if k:
                text.append(CUT)
            text.append_text(_draw(line, window, letters))
        rows.append(text)
    return rows


def _closed_form_note(result: SimResult) -> str:
    p, m, v = result.p, result.m, result.v
    traits = schedule_traits(result.schedule)
    if traits.takes_virtual_stages:
        return f"(p-1)/(vM+p-1) = {closed_form_bubble(result.schedule, p, m, v):.1%}"
    if traits.mirrored:
        return (f"(p-2)/(3M+p-2) = {closed_form_bubble(result.schedule, p, m):.1%} when F = B = W "
                "without overlap (report: (PP/2-1)(F&B+B-3W) idle per rank)")
    if traits.split_backward:
        one_f_one_b = closed_form_bubble(ONE_F_ONE_B.name, p, m)
        return (f"(p-1)/(3M+p-1) = {closed_form_bubble(result.schedule, p, m):.1%} when F = B = W: "
                f"idle time about a third of 1F1B's (1F1B: {one_f_one_b:.1%} of its step)")
    return f"(p-1)/(M+p-1) = {closed_form_bubble(result.schedule, p, m):.1%}"


def priced_line(priced_step_s: float, result: SimResult) -> str:
    """Why a plan's step and its simulated pipeline differ: what the plan adds past the
    schedule."""
    rest = priced_step_s - result.makespan_s
    return (f"the plan prices the step at {priced_step_s:.4g} s: this pipeline "
            f"({result.makespan_s:.4g} s) and {rest:+.3g} s outside it (the data-parallel sync "
            "the last backward does not hide, and the optimizer step)")


def render_gantt(result: SimResult, console: Console, width: int | None = None) -> None:
    """Print the Gantt rows, a legend, the bubble against its closed form and peak in-flight."""
    label_w = len(f"rank {result.p - 1}") + 1
    width = width or max(10, console.width - label_w - 2)
    parts = drawn_windows(result, width)
    console.print(f"[bold]{result.schedule}[/bold]  p={result.p}  M={result.m}  v={result.v}  "
                  f"step {result.makespan_s:.4g} s")
    if result.timeline_m is not None:
        console.print(compressed_note(result))
    if len(parts) > 1:
        left, right = parts
        console.print(f"compressed: 0-{left.end_s:.4g} s and {right.start_s:.4g}-"
                      f"{right.end_s:.4g} s drawn; the {right.start_s - left.end_s:.4g} s "
                      f"between (steady state) cut at {CUT.strip()}", highlight=False)
    rows = gantt_rows(result, width)
    for r, text in enumerate(rows):
        console.print(Text(f"rank {r}".ljust(label_w)) + text + Text("|"), no_wrap=True,
                      overflow="crop")
    legend = Text("legend: ")
    traits = schedule_traits(result.schedule)
    for kind, name in (("F", "forward"), ("B", "backward"), ("W", "weight grad"),
                       ("BW", "both grads (&: overlapped with the F before it)")):
        if (kind != "W" or traits.weight_grad_ops) and (kind != "BW" or traits.mirrored):
            legend.append(f"{kind}3{MARK[kind] * 2}", style=STYLE[kind]).append(f" {name}  ")
    legend.append("(of microbatch 3); blank: idle")
    if any(JOINT in text.plain for text in rows):
        legend.append(f", {JOINT}: busy")  # a cell rounding left between two ops (module doc)
    if any(chunk_letters(row) for row in result.timeline):
        legend.append("; F3b: on the rank's second model chunk (a, b, ... in pipeline order)")
    console.print(legend)
    table = Table(show_header=True, header_style="bold")
    table.add_column("bubble")
    table.add_column("simulated", justify="right")
    table.add_column("closed form")
    table.add_row("idle share of step", f"{result.bubble_fraction:.1%}", _closed_form_note(result))
    ratio_form = (result.p - 1) / (result.v * result.m)
    if traits.mirrored:
        ratio_note = f"(p-2)/(3M) = {(result.p - 2) / (3 * result.m):.1%} when F = B = W"
    elif traits.split_backward:
        ratio_note = f"(p-1)/(3M) = {ratio_form / 3:.1%} when F = B = W"
    else:
        ratio_note = f"(p-1)/(vM) = {ratio_form:.1%}"
    table.add_row("idle / ideal compute", f"{result.bubble_ratio:.1%}", ratio_note)
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


def to_svg(result: SimResult, width_px: int = 1000, row_px: int = 28,
           compress: bool = False) -> str:
    """A standalone SVG of the timeline: one <rect> with a <title> tooltip per compute op, labelled
    with its kind and microbatch where it fits (:func:`svg_label`), and a legend in words. With
    ``compress``, a step too long to label is drawn as the terminal chart draws it
    (:func:`drawn_windows`): its start and end at a readable scale, the steady state between cut
    out at a ⋯ column, and the axis says which seconds are drawn."""
    label_px, pad = 60, 10
    plot_w = width_px - label_px - pad
    height = pad * 2 + row_px * result.p + 38
    span = drawn_span_s(result)
    scale = plot_w / span if span > 0 else 0.0
    finite("the SVG's scale (pixels per second)", scale,  # a denormal step: plot_w / span = inf
           f"the step ({span:.3g} s) is too short to draw; give stage times of at least "
           f"{MIN_PASS_S:g} s")
    windows = drawn_windows(result, plot_w // CELL_PX) if compress else (Window(0, span, 0),)
    if len(windows) == 1:  # the whole step over the whole width
        placed = [(0.0, span, float(label_px), float(plot_w))]
    else:
        (a, b), gap = windows, len(CUT) * CELL_PX
        placed = [(a.start_s, a.end_s, float(label_px), a.cells * CELL_PX),
                  (b.start_s, b.end_s, label_px + a.cells * CELL_PX + gap, b.cells * CELL_PX)]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_px}" height="{height}" '
        f'viewBox="0 0 {width_px} {height}" font-family="monospace" font-size="11">',
        f"<title>{escape(result.schedule)} p={result.p} M={result.m} v={result.v}: step "
        f"{result.makespan_s:.4g} s, idle share {result.bubble_fraction:.1%}"
        f"{escape('; ' + compressed_note(result)) if result.timeline_m else ''}</title>",
        f'<rect x="0" y="0" width="{width_px}" height="{height}" fill="white" class="background"/>',
    ]
    for r, row in enumerate(result.timeline):
        y = pad + r * row_px
        out.append(f'<text x="4" y="{y + row_px * 0.65:.1f}">rank {r}</text>')
        if len(placed) > 1:
            gap_x = placed[0][2] + placed[0][3] + len(CUT) * CELL_PX / 2
            out.append(f'<text x="{gap_x:.1f}" y="{y + row_px * 0.65:.1f}" '
                       f'text-anchor="middle">{CUT.strip()}</text>')
        for t in row:
            tip = (f"rank {r} {t.op.kind} microbatch {t.op.microbatch} chunk {t.op.chunk}: "
                   f"{t.start_s:.6g}-{t.end_s:.6g} s")
            for w_start, w_end, x0, w_px in placed:
                inside = min(t.end_s, w_end) - max(t.start_s, w_start)
                if not (inside > 0 or t.start_s == t.end_s and w_start <= t.start_s <= w_end):
                    continue
                px = w_px / (w_end - w_start) if w_end > w_start else 0.0
                x = x0 + (max(t.start_s, w_start) - w_start) * px
                w = max((min(t.end_s, w_end) - max(t.start_s, w_start)) * px, 0.5)
                out.append(f'<rect class="op" x="{x:.2f}" y="{y + 2}" width="{w:.2f}" '
                           f'height="{row_px - 4}" fill="{FILL[t.op.kind]}" stroke="white" '
                           f'stroke-width="0.5"><title>{escape(tip)}</title></rect>')
                label = svg_label(t.op.kind, t.op.microbatch, t.op.paired, w) \
                    if t.start_s >= w_start else ""
                if label:
                    out.append(f'<text x="{x + w / 2:.2f}" y="{y + row_px * 0.65:.1f}" '
                               f'text-anchor="middle" fill="{INK[t.op.kind]}">{label}</text>')
    axis_y = height - 26
    for w_start, w_end, x0, w_px in placed:
        out.append(f'<text x="{x0:.1f}" y="{axis_y}">{w_start:.4g} s</text>'
                   f'<text x="{x0 + w_px:.1f}" y="{axis_y}" text-anchor="end">{w_end:.4g} s</text>')
    out += _svg_legend(result, label_px, height - 8)
    out.append("</svg>")
    return "\n".join(out)


def svg_label(kind: str, microbatch: int, paired: bool, width_px: float) -> str:
    """What an op's box says, so the chart reads without colour: its kind and microbatch
    ("F12", "&BW3") where they fit at 7 px a character (11 px monospace) and 4 px of margin,
    else its kind alone, else nothing (its <title> tooltip still says it all)."""
    name = ("&" if paired else "") + kind
    for label in (f"{name}{microbatch}", name):
        if width_px >= SVG_CHAR_PX * len(label) + 4:
            return label
    return ""


def _svg_legend(result: SimResult, x: float, y: float) -> list[str]:
    """One boxed sample per kind the schedule runs, labelled in words, on the axis line."""
    traits = schedule_traits(result.schedule)
    out = []
    for kind, name in (("F", "forward"), ("B", "backward"), ("W", "weight grad"),
                       ("BW", "both grads")):
        if (kind == "W" and not traits.weight_grad_ops) or (kind == "BW" and not traits.mirrored):
            continue
        out.append(f'<rect x="{x:.1f}" y="{y - 10}" width="22" height="13" fill="{FILL[kind]}"/>'
                   f'<text x="{x + 11:.1f}" y="{y}" text-anchor="middle" fill="{INK[kind]}">'
                   f'{kind}</text><text x="{x + 26:.1f}" y="{y}">{name}</text>')
        x += 30 + SVG_CHAR_PX * len(name)
    return out + [f'<text x="{x:.1f}" y="{y}">(F3: forward of microbatch 3; blank: idle)</text>']
