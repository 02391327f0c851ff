"""The report's charts as hand-written inline SVG: memory per rank as stacked bars, step time
against memory as a scatter, and the rank grid on nodes.

Why hand-written SVG and not a plotting library: the charts are a few boxes, lines and labels,
which SVG states directly; the page then needs no JavaScript and no network (nothing to fetch,
nothing to run, so nothing to fail in a browser or go stale), `pip install plan3d` stays free of
matplotlib (the ``plot`` extra stays optional, for `plan sweep --plot`), and the output is the
same bytes on every machine, so tests can read the numbers back out of it. report/gantt.py draws
the pipeline schedule the same way. Every label is text in the SVG, not only a colour: each bar
segment and cell carries its name or number where it fits and a <title> tooltip always.
"""

from __future__ import annotations

import math
from html import escape

from planner.report.layout import MAX_NODES, head_tail

GIB = 1024**3
CHAR_PX = 7  # one character of the 11 px sans-serif labels, rounded up
# one colour per memory part (predict/memory.py MEMORY_PARTS), a light one for the transient
PART_FILL = {"weights": "#4a78c2", "gradients": "#7fa7e0", "optimizer": "#2f9e8f",
             "activations": "#e08a3c", "logits": "#c4553a", "transient": "#c9b458",
             "fragmentation": "#9c8fb8", "reserved": "#b0b0b0"}
OTHER_FILL = "#d9d9d9"
MAX_COLUMNS = 16  # GPUs of a node drawn; beyond this, the first and last eight
STAGE_FILL = ("#cfe0f7", "#f7d9c4", "#d4efd6", "#f3e6b3", "#e3d4f0", "#f6cfd8", "#c9ece9",
              "#e6e6e6")


def _svg(width: float, height: float, title: str, body: list[str]) -> str:
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
                      f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
                      'font-family="sans-serif" font-size="11" role="img">',
                      f"<title>{escape(title)}</title>", *body, "</svg>"])


def _gib(x: float) -> str:
    return f"{x / GIB:.1f}"


def memory_bars(ranks, capacity_bytes: float | None, width: int = 900) -> str:
    """One horizontal bar per pipeline rank (``ranks``: RankMemory), its parts stacked left to
    right, each labelled with its GiB where it fits, the total at the bar's end; a dashed line at
    one GPU's memory when known."""
    label_px, pad, row_px, legend_px = 60, 10, 26, 22
    top = max((r.total_bytes for r in ranks), default=0.0)
    scale_to = max(top, capacity_bytes or 0.0) * 1.12 or 1.0
    plot_w = width - label_px - 2 * pad
    px = plot_w / scale_to
    height = pad + legend_px + row_px * len(ranks) + 24
    body, parts_seen = [], []
    for i, r in enumerate(ranks):
        y = pad + legend_px + i * row_px
        body.append(f'<text x="4" y="{y + 16}">rank {r.rank}</text>')
        x = label_px
        for part, size in r.parts:
            if part not in parts_seen:
                parts_seen.append(part)
            w = size * px
            if w <= 0:
                continue
            fill = PART_FILL.get(part, OTHER_FILL)
            body.append(f'<rect class="part" x="{x:.2f}" y="{y}" width="{w:.2f}" '
                        f'height="{row_px - 6}" fill="{fill}" stroke="white" stroke-width="0.5">'
                        f"<title>rank {r.rank} {escape(part)}: {_gib(size)} GiB</title></rect>")
            text = _gib(size)
            if w >= CHAR_PX * (len(text) + 1):
                body.append(f'<text x="{x + w / 2:.2f}" y="{y + 14}" text-anchor="middle">'
                            f"{text}</text>")
            x += w
        body.append(f'<text class="total" x="{x + 4:.2f}" y="{y + 14}">{_gib(r.total_bytes)} GiB'
                    "</text>")
    bottom = pad + legend_px + row_px * len(ranks)
    if capacity_bytes:  # first, so the bars and their labels are drawn over it
        cx = label_px + capacity_bytes * px
        body.insert(0, f'<line x1="{cx:.2f}" y1="{pad + legend_px - 4}" x2="{cx:.2f}" '
                    f'y2="{bottom}" stroke="#b00020" stroke-dasharray="4 3"/>'
                    f'<text x="{cx:.2f}" y="{bottom + 14}" text-anchor="middle" fill="#b00020">'
                    f"GPU memory {_gib(capacity_bytes)} GiB</text>")
    x = label_px
    for part in parts_seen:  # the legend: a swatch and the part's name, in the bars' order
        body.append(f'<rect x="{x}" y="{pad}" width="12" height="12" '
                    f'fill="{PART_FILL.get(part, OTHER_FILL)}"/>'
                    f'<text x="{x + 16}" y="{pad + 10}">{escape(part)}</text>')
        x += 28 + CHAR_PX * len(part)
    return _svg(width, height, "peak memory per pipeline rank, by part (GiB)", body)


def _ticks(low: float, high: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values spanning [low, high] (steps of 1, 2 or 5 x 10^k)."""
    span = (high - low) or abs(high) or 1.0
    raw = span / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    first = math.ceil(low / step) * step
    return [first + k * step for k in range(int((high - first) / step + 1e-9) + 1)]


def scatter(candidates, capacity_bytes: float | None, width: int = 900, height: int = 380) -> str:
    """Step time (x, seconds) against peak memory (y, GiB) of every candidate; the ranked plans
    drawn larger and numbered, plan 1 marked; a dashed line at one GPU's memory when known."""
    left, right, top, bottom = 64, 20, 16, 44
    xs = [c.step_time_s for c in candidates]
    ys = [c.peak_memory_bytes / GIB for c in candidates]
    cap = capacity_bytes / GIB if capacity_bytes else None
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys + ([cap] if cap else [])), max(ys + ([cap] if cap else []))
    xpad, ypad = (x1 - x0) * 0.06 or x0 * 0.05, (y1 - y0) * 0.08 or y0 * 0.05 or 1.0
    x0, x1, y0, y1 = x0 - xpad, x1 + xpad, max(0.0, y0 - ypad), y1 + ypad
    pw, ph = width - left - right, height - top - bottom

    def at(x: float, y: float) -> tuple[float, float]:
        return left + (x - x0) / (x1 - x0) * pw, top + ph - (y - y0) / (y1 - y0) * ph

    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for t in _ticks(x0, x1):
        px, _ = at(t, y0)
        body.append(f'<line x1="{px:.1f}" y1="{top + ph}" x2="{px:.1f}" y2="{top + ph + 4}" '
                    f'stroke="#888"/><text x="{px:.1f}" y="{top + ph + 16}" '
                    f'text-anchor="middle">{t:.4g}</text>')
    for t in _ticks(y0, y1):
        _, py = at(x0, t)
        body.append(f'<line x1="{left - 4}" y1="{py:.1f}" x2="{left + pw}" y2="{py:.1f}" '
                    f'stroke="#eee"/><text x="{left - 6}" y="{py + 4:.1f}" '
                    f'text-anchor="end">{t:.4g}</text>')
    body.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">step time (s)'
                f'</text><text x="14" y="{top + ph / 2}" text-anchor="middle" '
                f'transform="rotate(-90 14 {top + ph / 2})">peak memory per GPU (GiB)</text>')
    if cap:
        _, py = at(x0, cap)
        body.append(f'<line x1="{left}" y1="{py:.1f}" x2="{left + pw}" y2="{py:.1f}" '
                    f'stroke="#b00020" stroke-dasharray="4 3"/><text x="{left + pw - 4}" '
                    f'y="{py - 4:.1f}" text-anchor="end" fill="#b00020">GPU memory '
                    f"{cap:.1f} GiB</text>")
    # candidates first, the ranked plans over them (plan 1 last, on top)
    for c in sorted(candidates, key=lambda c: -(c.rank or 0) if c.rank else -10**9):
        px, py = at(c.step_time_s, c.peak_memory_bytes / GIB)
        tip = (f"{'plan ' + str(c.rank) + ': ' if c.rank else ''}{c.label}: "
               f"{c.step_time_s:.4g} s, {c.peak_memory_bytes / GIB:.1f} GiB")
        if c.rank is None:
            body.append(f'<circle class="candidate" cx="{px:.1f}" cy="{py:.1f}" r="3.5" '
                        f'fill="#9aa7b8"><title>{escape(tip)}</title></circle>')
            continue
        fill = "#d1495b" if c.rank == 1 else "#2f5d9e"
        body.append(f'<circle class="plan" cx="{px:.1f}" cy="{py:.1f}" '
                    f'r="{7 if c.rank == 1 else 5}" fill="{fill}"><title>{escape(tip)}</title></circle>'
                    f'<text x="{px + 8:.1f}" y="{py - 6:.1f}">{c.rank}</text>')
    return _svg(width, height, "step time against peak memory of the feasible candidates", body)


def rank_grid(ranks, gpus_per_node: int, width: int = 900) -> str:
    """Nodes as rows, GPUs as cells (``ranks``: the layout's rank entries): each cell names its
    rank and (tp, cp, pp, dp) coordinates, shaded by pipeline stage; big clusters show their
    first and last nodes and say how many are left out (report/layout.py's rule)."""
    nodes = sorted({r["node"] for r in ranks})
    shown, dropped = head_tail(nodes, MAX_NODES)
    by_node: dict[int, dict[int, dict]] = {}
    for r in ranks:
        by_node.setdefault(r["node"], {})[r["local_rank"]] = r
    columns, cut = head_tail(list(range(gpus_per_node)), MAX_COLUMNS)
    if cut:  # a gap column where the GPUs left out would be
        columns.insert(len(columns) // 2, None)
    label_px, pad = 64, 8
    cell_w = max(44.0, min(100.0, (width - label_px - pad) / len(columns)))
    cell_h = 40
    rows = len(shown) + (1 if dropped else 0)
    height = pad * 2 + rows * cell_h + 18
    width = max(width, label_px + pad + cell_w * len(columns))
    five_d = any("cp" in r for r in ranks)
    coords = ("tp", "cp", "pp", "dp") if five_d else ("tp", "pp", "dp")
    body, row = [], 0
    for i, node in enumerate(shown):
        if dropped and i == len(shown) // 2:
            y = pad + row * cell_h
            body.append(f'<text x="{label_px}" y="{y + 24}">… {dropped} nodes not shown …</text>')
            row += 1
        y = pad + row * cell_h
        body.append(f'<text x="4" y="{y + 24}">node {node}</text>')
        for column, local in enumerate(columns):
            x = label_px + column * cell_w
            if local is None:
                body.append(f'<text x="{x + cell_w / 2:.1f}" y="{y + 24}" '
                            f'text-anchor="middle">… {cut} …</text>')
                continue
            r = by_node.get(node, {}).get(local)
            if r is None:
                body.append(f'<rect x="{x:.1f}" y="{y}" width="{cell_w - 2:.1f}" '
                            f'height="{cell_h - 2}" fill="white" stroke="#ccc"/>')
                continue
            stage = r["pp"]
            tip = f"rank {r.get('rank')}: " + ", ".join(f"{k} {r.get(k, 0)}" for k in coords)
            body.append(f'<rect class="gpu" x="{x:.1f}" y="{y}" width="{cell_w - 2:.1f}" '
                        f'height="{cell_h - 2}" fill="{STAGE_FILL[stage % len(STAGE_FILL)]}" '
                        f'stroke="#777"><title>{escape(tip)}</title></rect>'
                        f'<text x="{x + cell_w / 2:.1f}" y="{y + 15}" text-anchor="middle">'
                        f"r{r.get('rank')}</text>"
                        f'<text x="{x + cell_w / 2:.1f}" y="{y + 30}" text-anchor="middle" '
                        f'font-size="9">({",".join(str(r.get(k, 0)) for k in coords)})</text>')
        row += 1
    body.append(f'<text x="4" y="{height - 6}">cell: rank and ({", ".join(coords)}); shade: '
                "pipeline stage</text>")
    return _svg(width, height, "ranks on nodes", body)
