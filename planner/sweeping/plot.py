"""`plan sweep --plot`: four panels drawn from the frame with matplotlib (the plot extra) as SVG, or
that SVG inlined in a self-contained HTML page beside the rows (no script, no CDN, no network).

* tokens/s and MFU against the GPU count, one curve per series (GPU type, and every other input
  the spec varies but the GPU and node counts);
* cost (where the spec prices GPU-hours), else time to train (where it gives train_tokens), else
  step time, against the GPU count;
* the Pareto front: step time against memory, or time to train against cost where priced; the
  points no other point beats on both.

Every curve carries an SVG id ``PANEL:SERIES`` (``tokens_per_s:h100-sxm-80gb``), so the files can
be checked, and read, by what they contain rather than by pixels. The output is deterministic
(fixed id salt, no date).
"""

from __future__ import annotations

import html
import importlib.util
import io
import re

from planner.core.errors import PlanInputError
from planner.core.files import write_text
from planner.sweeping.evaluate import OK
from planner.sweeping.output import PLOT_SUFFIXES, check_output
from planner.sweeping.spec import SweepSpec
from planner.sweeping.table import input_keys

GIB = 2**30
SECONDS_PER_DAY = 86400.0


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise PlanInputError("--plot needs matplotlib: pip install 'plan3d[plot]'")


def series_keys(spec: SweepSpec) -> list[str]:
    """The inputs a curve is one value of: the GPU, and whatever else varies but the GPU count."""
    keys = [k for k in input_keys(spec) if k != "gpus"]
    return keys if "gpu" in keys else ["gpu", *keys]


def _label(row: dict, keys: list[str]) -> str:
    return " ".join(str(row[k]) if k == "gpu" else f"{k}={row[k]}" for k in keys)


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both (lower x, lower y), by x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_y = [], float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def _third(frame):
    if "cost" in frame:
        return "cost", "cost ($)", 1.0
    if "time_to_train_s" in frame:
        return "time_to_train_s", "time to train (days)", 1 / SECONDS_PER_DAY
    return "step_time_s", "step time (s)", 1.0


def _front_axes(frame):
    if "cost" in frame:
        return ("cost", "cost ($)", 1.0), ("time_to_train_s", "time to train (days)",
                                           1 / SECONDS_PER_DAY)
    return ("peak_memory_bytes", "peak memory (GiB)", 1 / GIB), ("step_time_s", "step time (s)",
                                                                 1.0)


# Columns inverse to the step time (a slower run makes fewer tokens a second at a lower MFU);
# the others (step time, time to train, cost) grow with it.
_INVERSE = ("tokens_per_s", "mfu")


def _band(rows, column: str, scale: float):
    """(low, high) of ``column`` over ``rows`` from each plan's step-time band (the sweep's
    step_time_low_s / step_time_high_s), or None where a row has none."""
    if any(r.get("step_time_low_s") is None for r in rows):
        return None
    ratios = [(r["step_time_low_s"] / r["step_time_s"], r["step_time_high_s"] / r["step_time_s"])
              for r in rows]
    if column in _INVERSE:
        return ([r[column] * scale / hi for r, (_, hi) in zip(rows, ratios)],
                [r[column] * scale / lo for r, (lo, _) in zip(rows, ratios)])
    return ([r[column] * scale * lo for r, (lo, _) in zip(rows, ratios)],
            [r[column] * scale * hi for r, (_, hi) in zip(rows, ratios)])


def figure_svg(frame, spec: SweepSpec) -> str:
    """The four panels as SVG text."""
    import matplotlib
    from matplotlib.figure import Figure

    ok = [r for r in frame.to_dict("records") if r["status"] == OK]
    keys = series_keys(spec)
    series: dict[str, list[dict]] = {}
    for r in ok:
        series.setdefault(_label(r, keys), []).append(r)
    third, third_label, third_scale = _third(frame)
    panels = [("tokens_per_s", "tokens/s", 1.0), ("mfu", "MFU (%)", 100.0),
              (third, third_label, third_scale)]
    with matplotlib.rc_context({"svg.hashsalt": "plan3d", "svg.fonttype": "none",
                                "font.size": 9}):
        fig = Figure(figsize=(11, 8), layout="constrained")
        axes = fig.subplots(2, 2).flatten()
        for ax, (column, title, scale) in zip(axes, panels):
            for label, rows in series.items():
                rows = sorted(rows, key=lambda r: r["gpus"])
                (line,) = ax.plot([r["gpus"] for r in rows], [r[column] * scale for r in rows],
                                  marker="o", label=label)
                line.set_gid(f"{column}:{label}")
                band = _band(rows, column, scale)
                if band:
                    shade = ax.fill_between([r["gpus"] for r in rows], *band,
                                            color=line.get_color(), alpha=0.15, linewidth=0)
                    shade.set_gid(f"band:{column}:{label}")
            ax.set_xscale("log", base=2)
            ticks = sorted({r["gpus"] for r in ok})
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("GPUs")
            ax.set_ylabel(title)
            ax.set_title(f"{title} vs GPUs")
            ax.grid(True, alpha=0.3)
        (xc, xl, xs), (yc, yl, ys) = _front_axes(frame)
        ax = axes[3]
        xy = [(r[xc] * xs, r[yc] * ys) for r in ok]
        if xy:
            dots = ax.scatter([p[0] for p in xy], [p[1] for p in xy], s=12, alpha=0.4,
                              label="every point")
            dots.set_gid("pareto:points")
            front = [xy[i] for i in pareto(xy)]
            (line,) = ax.plot([p[0] for p in front], [p[1] for p in front], drawstyle="steps-post",
                              marker="o", color="C3", label="Pareto front")
            line.set_gid("pareto:front")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(f"Pareto front: {yl.split(' (')[0]} vs {xl.split(' (')[0]}")
        ax.grid(True, alpha=0.3)
        for ax in axes:
            if ax.lines or ax.collections:
                ax.legend(fontsize=7)
        fig.suptitle(f"plan sweep: {len(frame)} points, {len(ok)} with a plan")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def html_page(svg: str, frame, spec: SweepSpec) -> str:
    """The SVG inlined in one HTML file with the rows as a table: opens anywhere, offline."""
    body = re.sub(r"^.*?(?=<svg)", "", svg, flags=re.S)  # drop the XML prolog and DOCTYPE
    title = f"plan sweep: {len(frame)} points"
    shown = frame.astype(object).where(frame.notna(), "")  # no plan: empty cells, not None
    rows = shown.to_html(index=False, border=0, classes="rows")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>\n"
            "body { font-family: sans-serif; margin: 1.5em; }\n"
            "table.rows { border-collapse: collapse; font-size: 11px; }\n"
            "table.rows td, table.rows th { border: 1px solid #ccc; padding: 1px 5px; }\n"
            "</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{body}\n<h2>Rows</h2>\n{rows}\n</body>\n</html>\n")


def write_plot(frame, spec: SweepSpec, path, force: bool = False):
    require_matplotlib()
    path = check_output(path, PLOT_SUFFIXES, "--plot", force)
    svg = figure_svg(frame, spec)
    text = svg if path.suffix.lower() == ".svg" else html_page(svg, frame, spec)
    return write_text(path, text, force=force)
