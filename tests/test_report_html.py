"""`plan report` without a browser (#33 item 4): the page parses with balanced tags, holds every
section, shows the numbers plan.json holds (read back out of the page, to the precision printed),
fetches nothing (no external URL, no script), escapes every string from the input, draws the error
band only where a plan states one, and refuses a hand-edited file in one line."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

import cli
from planner import api
from planner.core.errors import PlanInputError
from planner.launchers import plan_document
from planner.report.html_report import SECTIONS, render_report
from planner.report.report_input import read_report_document, report_input
from planner.report.svg_charts import rank_grid

GIB = 1024**3
VOID = {"meta", "br", "img", "hr", "input", "link"}
# SVG elements the charts close themselves (<rect .../>) are not HTML void elements; the parser
# reports them through handle_startendtag, so only real open tags are pushed


class Page(HTMLParser):
    """Every element, the ids, the open-tag stack (balance), each table's cells and the text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.ids, self.problems = [], [], []
        self.tables: dict[str, list[list[str]]] = {}
        self.table = self.cell = None
        self.text, self.urls = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        for key in ("src", "href", "xlink:href", "action"):
            if key in attrs:
                self.urls.append(attrs[key])
        if tag == "table":
            self.table = self.tables.setdefault(attrs.get("id", f"t{len(self.tables)}"), [])
        elif tag == "tr" and self.table is not None:
            self.table.append([])
        elif tag in ("td", "th") and self.table is not None:
            self.cell = []
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag in ("td", "th") and self.table is not None and self.cell is not None:
            self.table[-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "table":
            self.table = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def parsed(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    assert not page.problems, page.problems[:5]
    assert not page.stack, f"unclosed: {page.stack}"
    return page


@pytest.fixture(scope="module")
def solution():
    return api.solve(gpus=16, nodes=2)


@pytest.fixture(scope="module")
def docs(solution):
    return [plan_document(p) for p in solution.plans]


def _number(cell: str) -> float:
    return float(re.match(r"[-+\d.,]+", cell).group(0).replace(",", ""))


def test_the_page_parses_and_holds_every_section(solution):
    page = parsed(api.report(solution))
    assert [i for i in page.ids if i in SECTIONS] == list(SECTIONS)
    assert {"plans-table", "memory-table"} <= set(page.tables)


def test_every_number_shown_is_the_plan_files(docs, tmp_path):
    """plan report on a `plan solve --json` file: each plans-table row and each memory cell read
    back out of the page equals the file's number to the precision the page prints."""
    path = tmp_path / "solve.json"
    path.write_text(json.dumps({"plans": docs, "search": {"feasible": 25}}))
    page = parsed(api.report(path))
    head, *rows = page.tables["plans-table"]
    assert len(rows) == len(docs)
    col = {h: i for i, h in enumerate(head)}
    for row, doc in zip(rows, docs):
        m, par = doc["metrics"], doc["parallel"]
        assert _number(row[col["#"]]) == docs.index(doc) + 1
        assert row[col["tp·cp·pp·dp"]].startswith(
            f"{par['tp']}·{par.get('cp', 1)}·{par['pp']}·{par['dp']}")
        assert row[col["mb×M"]] == f"{par['micro_batch']}×{par['num_microbatches']}"
        assert row[col["schedule"]].split()[0] == par["schedule"]
        assert _number(row[col["step s"]]) == pytest.approx(m["step_time_s"], rel=5e-4)
        assert _number(row[col["tokens/s"]]) == pytest.approx(m["tokens_per_s"], abs=0.5)
        assert _number(row[col["MFU"]]) / 100 == pytest.approx(m["mfu"], abs=5e-4)
        assert _number(row[col["peak mem GiB"]]) == pytest.approx(
            m["peak_memory_bytes"] / GIB, abs=0.05)
        assert _number(row[col["bubble"]]) / 100 == pytest.approx(m["bubble_fraction"], abs=5e-4)
    head, *rows = page.tables["memory-table"]
    ranks = docs[0]["memory"]["ranks"]
    assert len(rows) == len(ranks) == docs[0]["parallel"]["pp"]
    for row, rank in zip(rows, ranks):
        expected = [rank["rank"]] + [rank["parts"][p] / GIB for p in head[1:-1]] + \
                   [rank["total_bytes"] / GIB]
        assert [_number(c) for c in row] == pytest.approx(expected, abs=0.05)
    text = "".join(page.text)
    assert f"{len(docs)} of the search's 25 feasible configurations" in text


def test_every_feasible_candidate_is_plotted_and_the_ranked_ones_numbered(solution):
    html = api.report(solution)
    assert len(solution.candidates) > len(solution.plans)
    assert html.count('class="plan"') == len(solution.plans)
    assert html.count('class="candidate"') == len(solution.candidates) - len(solution.plans)
    assert f"all {len(solution.candidates)} feasible configurations" in html


def test_nothing_is_fetched(solution):
    """No script, stylesheet, image or font from anywhere: the only URL in the page is the SVG
    namespace, which names a vocabulary and is never fetched."""
    html = api.report(solution)
    page = parsed(html)
    assert page.urls == []
    assert "<script" not in html and "<link" not in html and "url(" not in html
    assert "@import" not in html
    urls = set(re.findall(r"(?:https?:)?//[^\s\"'<>)]+", html))
    assert urls == {"http://www.w3.org/2000/svg"}, urls
    assert all(m.group(0).startswith('xmlns="') for m in
               re.finditer(r'\S*="?http://www\.w3\.org/2000/svg', html))


HOSTILE = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'


def test_every_string_from_the_input_is_escaped(docs):
    doc = copy.deepcopy(docs[0])
    doc["model"]["name"] = HOSTILE
    doc["stack"]["name"] = HOSTILE
    doc["notes"] = [HOSTILE]
    doc["cluster"]["gpu"] = HOSTILE
    parts = doc["memory"]["ranks"][0]["parts"]
    parts[HOSTILE] = parts.pop("reserved")
    doc["error_band"] = {"step_time_s": [50.0, 70.0], "basis": HOSTILE, "calibrated": False}
    html = render_report(report_input([doc], HOSTILE), ())
    page = parsed(html)
    assert "<script" not in html and "<img" not in html
    text = "".join(page.text)
    assert text.count(HOSTILE) >= 6  # title, heading, origin, notes, memory part, band basis


def test_the_error_band_shows_where_a_plan_states_one(docs):
    band = {"step_time_s": [51.25, 77.75], "mfu": [0.625, 0.9375], "basis": "the test's basis",
            "calibrated": True}
    docs = [{k: v for k, v in d.items() if k != "error_band"} for d in docs]  # solve's own off
    with_band = [dict(docs[0], error_band=band)] + docs[1:]
    page = parsed(render_report(report_input(with_band, "test"), ()))
    head, first, second, *_ = page.tables["plans-table"]
    col = {h: i for i, h in enumerate(head)}
    assert first[col["step s"]].endswith("51.25–77.75")
    assert first[col["MFU"]].endswith("62.5%–93.8%")
    assert "–" not in second[col["step s"]]  # a plan without one shows none
    assert "the test's basis (calibrated)" in "".join(page.text)
    plain = "".join(parsed(render_report(report_input(docs, "test"), ())).text)
    assert "state no error band" in plain


def test_a_plan_file_without_a_memory_breakdown_says_so(docs):
    doc = {k: v for k, v in docs[0].items() if k != "memory"}
    text = "".join(parsed(render_report(read_report_document(doc, "old.json"), ())).text)
    assert "no memory breakdown per rank" in text
    assert "the 1 plan(s) this file holds" in text


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["metrics"].update(step_time_s="fast"), "'step_time_s' must be a number"),
    (lambda d: d["metrics"].update(mfu=float("inf")), "'mfu' must be"),
    (lambda d: d["memory"]["ranks"].pop(), "1 ranks, but the plan has pp = 2"),
    (lambda d: d["memory"]["ranks"][0]["parts"].update(weights=-1), "'weights' must be"),
    (lambda d: d["layout"]["ranks"][0].update(node="zero"), "'node' must be a whole number"),
    (lambda d: d.update(error_band={"step_time_s": [2, 1], "basis": "b"}), "low <= high"),
    (lambda d: d.pop("metrics"), "missing 'metrics'"),
])
def test_a_hand_edited_file_is_refused_in_one_line(docs, edit, message):
    doc = copy.deepcopy(docs[0])
    edit(doc)
    with pytest.raises(PlanInputError, match=re.escape(message)):
        report_input([doc], "edited.json")


def test_the_cli_writes_atomically_and_never_over_a_file_without_force(docs, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(docs[0]))
    out = tmp_path / "report.html"
    runner = CliRunner()
    done = runner.invoke(cli.app, ["report", str(plan), "-o", str(out)])
    assert done.exit_code == 0, done.output
    first = out.read_text()
    assert first.startswith("<!DOCTYPE html>") and [p.name for p in tmp_path.iterdir()
                                                     if p.name.startswith(".")] == []
    again = runner.invoke(cli.app, ["report", str(plan), "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    assert runner.invoke(cli.app, ["report", str(plan), "-o", str(out), "--force"]).exit_code == 0
    plan.write_text('{"schema": "plan3d/plan/v2"}')
    bad = runner.invoke(cli.app, ["report", str(plan), "-o", str(out), "--force"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1, bad.output
    assert out.read_text() == first  # a refused report leaves the old page whole


def test_solve_report_writes_the_page_and_refuses_an_existing_one_before_searching(tmp_path):
    out = tmp_path / "r.html"
    runner = CliRunner()
    done = runner.invoke(cli.app, ["solve", "--gpus", "8", "--nodes", "1", "--top", "3",
                                   "--report", str(out)])
    assert done.exit_code == 0, done.output
    assert out.read_text().count('class="plan"') == 3
    again = runner.invoke(cli.app, ["solve", "--gpus", "8", "--nodes", "1", "--report", str(out)])
    assert again.exit_code == 2 and "--force" in again.output and "considered" not in again.output


def test_a_big_cluster_grid_shows_its_first_and_last_nodes():
    layout = api.layout(8, 16, 64, 8, "tp-cp-ep-dp-pp").to_dict()
    from planner.report.report_input import RANK
    from planner.core.schema import check_object
    ranks = [check_object(r, RANK, "x", tolerant=True) for r in layout["ranks"]]
    svg = rank_grid(ranks, 8)
    assert "1016 nodes not shown" in svg
    assert svg.count('class="gpu"') == 8 * 8
