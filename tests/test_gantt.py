"""Terminal Gantt and SVG rendering."""

import re
import xml.etree.ElementTree as ET

from hypothesis import assume, given, settings, strategies as st
from rich.console import Console

from planner.core.schedules import SCHEDULES
from planner.report.gantt import CUT, JOINT, MARK, gantt_rows, layout, render_gantt, to_svg, units
from planner.pipeline.simulate import simulate

SVG = "{http://www.w3.org/2000/svg}"


def test_terminal_gantt_rows_labels_and_bubble():
    r = simulate("1f1b", 4, 8, fwd_s=1.0, bwd_s=2.0)
    console = Console(record=True, width=120, color_system="truecolor")
    render_gantt(r, console)
    text = console.export_text(clear=False)
    lines = text.splitlines()
    rank_lines = [line for line in lines if line.startswith("rank ")]
    assert len(rank_lines) == 4
    assert all("0" in line and "7" in line for line in rank_lines)  # microbatch labels fit
    assert "idle share of step" in text and "idle / ideal compute" in text
    assert "27.3%" in text and "(p-1)/(M+p-1)" in text
    assert "peak in-flight" in text
    html = console.export_html()
    assert "background-color: #000080" in html and "background-color: #008000" in html  # F, B
    styles = {str(span.style) for span in gantt_rows(r, 60)[0].spans}
    assert {"white on blue", "black on green"} <= styles


def test_rows_are_blank_where_idle_and_span_width():
    r = simulate("gpipe", 2, 2, fwd_s=1.0, bwd_s=1.0)  # makespan 6; rank 1 idle [0,1) and [5,6)
    rows = gantt_rows(r, 12)
    assert all(len(t.plain) == 12 for t in rows)
    assert rows[1].plain[:2] == "  " and rows[1].plain[-2:] == "  "


def test_zb_note_in_gantt():
    r = simulate("zb-h1", 4, 8, fwd_s=1.0, bwd_s=2.0)
    console = Console(record=True, width=200)
    render_gantt(r, console)
    text = console.export_text()
    assert "a third of 1F1B" in text and "weight grad" in text


def test_svg_parses_with_one_rect_per_compute_op():
    r = simulate("interleaved", 2, 4, 2, fwd_s=0.5, bwd_s=1.0)
    root = ET.fromstring(to_svg(r))
    assert root.tag == SVG + "svg"
    ops = [e for e in root.iter(SVG + "rect") if e.get("class") == "op"]
    assert len(ops) == sum(len(row) for row in r.timeline) == 2 * 2 * 4 * 2
    assert all(e.find(SVG + "title") is not None for e in ops)
    assert {e.get("fill") for e in ops} == {"#4a78c2", "#4caf50"}


def _plain_rows(result, width):
    return [t.plain for t in gantt_rows(result, width)]


def test_without_colour_kinds_stay_distinct_and_only_idle_is_blank():
    """Issue #19: piped, F/B/W were indistinguishable. Every op now starts with its kind and fills
    its span with its own mark; the blank cells are the idle time (up to rounding per op)."""
    r = simulate("zb-h1", 4, 8, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0)  # F = B = W
    width = 300
    rows = _plain_rows(r, width)
    for rank, line in enumerate(rows):
        assert {"F", "B", "W"} <= set(line) and {"-", "=", "~"} <= set(line)
        busy = sum(t.end_s - t.start_s for t in r.timeline[rank]) / r.makespan_s
        ops = len(r.timeline[rank])
        assert abs(sum(c != " " for c in line) / width - busy) <= ops / width
    text = "\n".join(rows)
    assert "F7" in text and "B7" in text and "W7" in text


def test_long_schedules_are_compressed_not_blank():
    """Issue #19: past ~64 microbatches the piped chart went blank. A long schedule now keeps the
    start and the end readable, cuts the middle, and says so."""
    r = simulate("1f1b", 4, 64, fwd_s=1.0, bwd_s=2.0)  # simulated op by op (M <= 64)
    console = Console(record=True, width=100, color_system=None)
    render_gantt(r, console)
    text = console.export_text()
    assert "compressed:" in text and "⋯" in text
    rank_lines = [line for line in text.splitlines() if line.startswith("rank ")]
    for line in rank_lines:
        assert "F0" in line and "B63" in line  # the first and the last microbatch drawn
    left = [line.split("⋯")[0] for line in rank_lines]
    assert all(line.rstrip().endswith(("-", "=")) or line.rstrip()[-1].isdigit() for line in left)


def test_a_long_run_draws_its_short_run_and_says_so():
    """Past M = 64 the simulator extrapolates the steady state and keeps a short run's ops."""
    r = simulate("1f1b", 4, 200, fwd_s=1.0, bwd_s=2.0)
    console = Console(record=True, width=100, color_system=None)
    render_gantt(r, console)
    text = console.export_text()
    assert "of 200 microbatches" in text
    assert all("F0" in line for line in text.splitlines() if line.startswith("rank "))


def test_a_short_schedule_is_not_compressed():
    r = simulate("1f1b", 4, 8, fwd_s=1.0, bwd_s=2.0)
    assert all("⋯" not in line for line in _plain_rows(r, 120))


def _labels(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [e.text for e in root.iter(SVG + "text") if e.text]


def test_svg_ops_say_their_kind_and_microbatch_not_only_their_colour():
    """#33 item 4: each op wide enough reads F3 / B3 / W3 in the SVG too, and the legend names
    the kinds in words."""
    r = simulate("zb-h1", 4, 8, fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0)
    labels = _labels(to_svg(r))
    ops = [t for row in r.timeline for t in row]
    assert sorted(x for x in labels if x[0] in "FBW" and x[1:].isdigit()) == \
        sorted(f"{t.op.kind}{t.op.microbatch}" for t in ops)
    assert {"forward", "backward", "weight grad"} <= set(labels)


def test_a_long_step_compressed_keeps_its_ops_labelled():
    """Uncompressed, 1F1B over 64 microbatches gives each op a few pixels: no label fits.
    Compressed, the start and end are drawn at a readable scale with the steady state cut at ⋯,
    every box drawn whole says what it is, and the axis names the seconds each part shows."""
    r = simulate("1f1b", 4, 64, fwd_s=1.0, bwd_s=2.0)
    assert r.timeline_m is None  # every op in the timeline
    plain = [x for x in _labels(to_svg(r)) if x[0] in "FB" and x[1:].isdigit()]
    assert plain == []
    svg = to_svg(r, compress=True)
    labels = _labels(svg)
    assert labels.count("⋯") == r.p
    numbered = [x for x in labels if x[0] in "FB" and x[1:].isdigit()]
    assert "F0" in numbered and "B63" in numbered
    assert f"{r.makespan_s:.4g} s" in labels and "0 s" in labels
    root = ET.fromstring(svg)
    widths = [float(e.get("width")) for e in root.iter(SVG + "rect") if e.get("class") == "op"]
    assert sorted(widths)[len(widths) // 2] >= 7 * 2 + 4  # the median box fits "F1"


def test_interleaved_chunks_read_apart_without_colour():
    """Issue #33: interleaved chunks looked identical without colour. Each rank's chunks are
    lettered in pipeline order, so microbatch 0's two forwards on rank 0 read F0a and F0b."""
    rank0 = gantt_rows(simulate("interleaved", 2, 4, v=2, fwd_s=1.0, bwd_s=2.0), 200)[0].plain
    words = set(rank0.replace("-", " ").replace("=", " ").replace(JOINT, " ").split())
    assert {"F0a", "F0b", "B0a", "B0b"} <= words
    one_chunk = gantt_rows(simulate("1f1b", 2, 4, fwd_s=1.0, bwd_s=2.0), 200)[0].plain
    assert "F0a" not in one_chunk and "F0" in one_chunk  # one chunk a rank: no letter


OP = re.compile(r"(&?BW|[FBW])(\d+)([a-z]?)([-=~#]*)")  # a labelled op and the mark that fills it


def test_equal_ops_draw_equal_cells_in_1f1b():
    """Issue #33: cutting each op at its rounded start and end gave 1F1B's backwards 4 or 5 cells
    by where they fell (rank 0 at 67 cells drew ``B0==`` and ``B2===``). Every B is now as wide
    as every other, every F too; the cell rounding leaves in busy time is a joint, not blank."""
    r = simulate("1f1b", 4, 8, fwd_s=1.0, bwd_s=2.0)  # 33 s over 67 cells: B = 4.06 cells
    rank0 = gantt_rows(r, 67)[0].plain
    drawn = {kind + mb: kind + mb + fill for kind, mb, _, fill in OP.findall(rank0)}
    assert drawn["B0"] == "B0==" and drawn["B2"] == "B2=="
    assert {len(v) for k, v in drawn.items() if k[0] == "B"} == {4}
    assert {len(v) for k, v in drawn.items() if k[0] == "F"} == {2}
    assert "B2==" + JOINT + "F6" in rank0  # B2 ends at 16.06 cells of true time: a joint
    assert len(rank0) == 67


@st.composite
def drawn_schedules(draw):
    """A simulated schedule with random stage, weight-gradient and transfer times, and a width."""
    name = draw(st.sampled_from(SCHEDULES))
    p = 2 * draw(st.integers(1, 3)) if name == "dualpipe" else draw(st.integers(1, 5))
    v = draw(st.sampled_from((1, 2, 3))) if name == "interleaved" else 1
    if name == "interleaved":
        m = p * draw(st.integers(1, 3))
    elif name == "dualpipe":
        m = 2 * p * draw(st.integers(1, 2))
    else:
        m = draw(st.integers(1, 16))
    n = p if name == "dualpipe" else p * v
    times = st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n)
    fwd, bwd = draw(times), draw(times)
    wgrad = [b * draw(st.floats(0.05, 0.95)) for b in bwd]
    comm = draw(st.sampled_from((0.0, 0.05, 0.7)))
    r = simulate(name, p, m, v, fwd_s=fwd, bwd_s=bwd, wgrad_s=wgrad, comm_s=comm)
    return r, draw(st.integers(20, 200))


@settings(max_examples=80, deadline=None)
@given(drawn_schedules())
def test_cells_are_equal_per_duration_every_op_shows_and_rows_are_exact(case):
    """Over simulated schedules at any width: each row is exactly ``width`` cells; every unit (an
    op, or DualPipe's F with the BW over it) a window draws shows its label or mark at its first
    cell, within a cell of where it truly starts, over no other; ops of equal duration take equal
    cells across the chart; an uncompressed chart draws every op. (Ops shorter than a cell still
    take one, so a run of them may push their row's next ops further: the bound is asserted on
    rows without them.)"""
    r, width = case
    windows, placed = layout(r, width)
    assume(all(len(line) <= w.cells for by_w in placed for line, w in zip(by_w, windows)))
    rows = [t.plain for t in gantt_rows(r, width)]
    assert all(len(row) == width for row in rows)
    cells_of: dict[float, set[int]] = {}
    for rank, (row, by_window) in enumerate(zip(rows, placed)):
        offset = 0
        for w, line in zip(windows, by_window):
            near = all(q.exact_end - q.exact >= 1 for q in line)
            for i, q in enumerate(line):
                assert q.end > q.first and (abs(q.first - q.exact) <= 1 + 1e-9 or not near)
                assert i == 0 or q.first >= line[i - 1].end
                first = row[offset + q.first]
                op = q.unit[-1].op
                assert first == (("&" if op.paired else "") + op.kind)[0] \
                    if q.unit[0].start_s >= w.start_s else first == MARK[op.kind]
                if q.key is not None:
                    cells_of.setdefault(q.key, set()).add(q.end - q.first)
            offset += w.cells + len(CUT)
        if len(windows) == 1:
            assert len(by_window[0]) == sum(1 for u in units(r.timeline[rank])
                                            if u[-1].end_s > u[0].start_s)
    assert all(len(widths) == 1 for widths in cells_of.values()), cells_of
